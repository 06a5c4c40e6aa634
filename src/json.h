// A small JSON reader for configuration files (policies), strict to RFC 8259's grammar: numbers
// of JSON's grammar (whatever the locale), read as doubles, and refused outside a double's range
// (RFC 8259 lets a reader limit it), also where they would round to zero (1e-400); strings are
// UTF-8 with every escape (\u surrogate pairs included, as UTF-8) and no raw control character;
// a member name appears once per object.
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
// REQUIRES: IsUtf8(text).
std::string JsonQuote(absl::string_view text);

// True when `text` is well-formed UTF-8 (no overlong form, surrogate or code point past U+10FFFF).
bool IsUtf8(absl::string_view text);

// `x` as the shortest JSON number that reads back as the same double. REQUIRES: x is finite.
std::string JsonNumber(double x);

}  // namespace kvtier

#endif  // KVTIER_SRC_JSON_H_
