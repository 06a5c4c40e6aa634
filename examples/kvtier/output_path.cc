#include "examples/kvtier/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvtier::tool {
namespace {

absl::Status Refused(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("cannot write ", path, ": ", why));
}

// Where a write of `path` lands: a regular file reached through symbolic links is the file they
// lead to (its link stays a link); any other path is itself.
std::filesystem::path Destination(const std::string& path) {
  std::error_code e;
  if (!std::filesystem::is_regular_file(path, e)) return path;
  const std::filesystem::path target = std::filesystem::canonical(path, e);
  return e ? std::filesystem::path(path) : target;
}

}  // namespace

absl::Status CheckOutputFile(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code e;
  const fs::path p(path);
  if (path.empty() || p.filename().empty()) return Refused(path, "not a file name");
  const fs::file_status file = fs::status(p, e);
  if (fs::exists(file)) {
    if (fs::is_directory(file)) return Refused(path, "it is a folder");
    if (access(path.c_str(), W_OK) != 0) return Refused(path, "the file is not writable");
    if (!fs::is_regular_file(file)) return absl::OkStatus();  // a device: written in place
    // A regular file is replaced by one written beside it: its folder must take that file.
    if (access(Destination(path).parent_path().c_str(), W_OK | X_OK) != 0) {
      return Refused(path, "its folder is not writable (the file is replaced whole)");
    }
    return absl::OkStatus();
  }
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, e)) return Refused(path, "its folder does not exist");
  if (access(parent.c_str(), W_OK) != 0) return Refused(path, "its folder is not writable");
  return absl::OkStatus();
}

absl::Status MakeOutputDir(const std::string& dir) {
  std::error_code e;
  std::filesystem::create_directories(dir, e);
  if (e) return Refused(dir, e.message());
  if (!std::filesystem::is_directory(dir, e)) return Refused(dir, "not a folder");
  if (access(dir.c_str(), W_OK) != 0) return Refused(dir, "the folder is not writable");
  return absl::OkStatus();
}

absl::Status WriteOutputFile(const std::string& path, std::string_view text) {
  namespace fs = std::filesystem;
  std::error_code e;
  const fs::file_status file = fs::status(path, e);
  const bool in_place = fs::exists(file) && !fs::is_regular_file(file);
  const std::string target = Destination(path).string();
  const std::string written = in_place ? path : absl::StrCat(target, ".", getpid(), ".tmp");
  std::ofstream f(written, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();  // the bytes reach the file here: a full disk fails now
  if (!f) {
    if (!in_place) std::remove(written.c_str());
    return Refused(path, in_place ? "the write failed" : "the write failed (the file is as it was)");
  }
  if (fs::is_regular_file(file)) fs::permissions(written, file.permissions(), e);  // kept
  if (!in_place && std::rename(written.c_str(), target.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(written.c_str());
    return Refused(path, why);
  }
  return absl::OkStatus();
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace kvtier::tool
