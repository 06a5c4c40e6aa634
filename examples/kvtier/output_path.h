// The files and folders the tool's commands write their results to, checked before the long
// work they report on, so that a bad path costs a message, not the run.
#ifndef KVTIER_EXAMPLES_KVTIER_OUTPUT_PATH_H_
#define KVTIER_EXAMPLES_KVTIER_OUTPUT_PATH_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvtier::tool {

// OK when a file can be written at `path`: its folder exists and is writable, and the file, if
// there, is writable and not a folder (/dev/stdout is a file here). Creates and changes nothing.
// InvalidArgument naming the path and the reason otherwise.
absl::Status CheckOutputFile(const std::string& path);

// Creates folder `dir` and its missing parents (nothing when it exists); InvalidArgument naming
// it and the reason when it cannot be made or written to.
absl::Status MakeOutputDir(const std::string& dir);

// Writes `text` to `path` whole. A regular file (or a new one) is written beside it and renamed
// over it, so that a failed write (a full disk) leaves what was there before; the file keeps its
// permissions, and one reached through symbolic links is replaced where they lead (the links
// stay). Anything else (/dev/stdout, a pipe) is written in place. InvalidArgument naming the
// path and the reason when it cannot be written, with no partial file left.
absl::Status WriteOutputFile(const std::string& path, std::string_view text);

// `text` as a JSON string literal, quotes included, for any bytes (control characters,
// quotes and backslashes escaped; other bytes as they are).
std::string JsonString(const std::string& text);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_OUTPUT_PATH_H_
