// Caller text as error messages echo it (docs/reliability.md, "Clear errors").
//
// Thread-safe (a pure function).
#ifndef KVTIER_SRC_ECHO_H_
#define KVTIER_SRC_ECHO_H_

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvtier {

// `text` in single quotes: its first 64 bytes, non-printable bytes (NUL included) escaped, and
// the full length when it was cut.
inline std::string Echo(absl::string_view text) {
  constexpr size_t kMaxEcho = 64;
  if (text.size() <= kMaxEcho) return absl::StrCat("'", absl::CHexEscape(text), "'");
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, kMaxEcho)), "...' (", text.size(),
                      " bytes)");
}

}  // namespace kvtier

#endif  // KVTIER_SRC_ECHO_H_
