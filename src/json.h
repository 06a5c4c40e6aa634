// A small JSON reader for configuration files (policies). Numbers are finite doubles; strings
// support the standard escapes except \u beyond Latin-1; a member name appears once per object.
//
// Thread-safe (pure functions).
#ifndef KVTIER_SRC_JSON_H_
#define KVTIER_SRC_JSON_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier {

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> items;                              // kArray
  std::vector<std::pair<std::string, JsonValue>> members;   // kObject, in file order

  // The member named `key` of an object, or nullptr.
  const JsonValue* Find(absl::string_view key) const;
};

// InvalidArgument with the byte offset of the first error.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// `text` as a JSON string literal, quotes included, that ParseJson reads back byte for byte.
std::string JsonQuote(absl::string_view text);

}  // namespace kvtier

#endif  // KVTIER_SRC_JSON_H_
