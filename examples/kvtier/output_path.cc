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
  const std::string written = in_place ? path : absl::StrCat(path, ".", getpid(), ".tmp");
  std::ofstream f(written, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();  // the bytes reach the file here: a full disk fails now
  if (!f) {
    if (!in_place) std::remove(written.c_str());
    return Refused(path, in_place ? "the write failed" : "the write failed (the file is as it was)");
  }
  if (!in_place && std::rename(written.c_str(), path.c_str()) != 0) {
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
