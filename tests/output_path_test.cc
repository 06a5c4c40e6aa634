// The tool's output files: written whole or not at all.
#include "examples/kvtier/output_path.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvtier::tool {
namespace {

std::string Contents(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("kvtier_output_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

TEST_F(OutputFileTest, WritesANewFileAndReplacesAnOldOne) {
  const std::string path = dir_ / "result.json";
  ASSERT_TRUE(WriteOutputFile(path, "first").ok());
  EXPECT_EQ(Contents(path), "first");
  ASSERT_TRUE(WriteOutputFile(path, "second, longer").ok());
  EXPECT_EQ(Contents(path), "second, longer");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1);  // no leftovers
}

TEST_F(OutputFileTest, AFailedWriteLeavesTheEarlierFile) {
  const std::string path = dir_ / "result.json";
  ASSERT_TRUE(WriteOutputFile(path, "earlier").ok());
  // The file written beside it cannot be made (a folder holds its name), as when a disk is full.
  std::filesystem::create_directory(absl::StrCat(path, ".", getpid(), ".tmp"));
  const absl::Status s = WriteOutputFile(path, "later");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  EXPECT_EQ(Contents(path), "earlier");
}

TEST_F(OutputFileTest, ADeviceIsWrittenInPlace) {
  EXPECT_TRUE(WriteOutputFile("/dev/null", "discarded").ok());
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));  // not replaced by a file
  if (std::filesystem::exists("/dev/full")) {  // every write fails: no space
    EXPECT_EQ(WriteOutputFile("/dev/full", "x").code(), absl::StatusCode::kInvalidArgument);
  }
}

// A result kept through a link (latest.json -> runs/42.json): the link stays a link, the file it
// leads to takes the new result, and keeps its permissions. Was: the link was replaced by a
// file, and the mode became the umask's.
TEST_F(OutputFileTest, ALinkStaysALinkAndItsFileKeepsItsPermissions) {
  namespace fs = std::filesystem;
  fs::create_directory(dir_ / "runs");
  const std::string file = dir_ / "runs" / "42.json", link = dir_ / "latest.json";
  ASSERT_TRUE(WriteOutputFile(file, "earlier").ok());
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  fs::create_symlink(fs::path("runs") / "42.json", link);
  ASSERT_TRUE(CheckOutputFile(link).ok());
  ASSERT_TRUE(WriteOutputFile(link, "later").ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(Contents(file), "later");
  EXPECT_EQ(fs::status(file).permissions(),
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "runs"), {}), 1);  // no leftovers
}

// An existing file in a folder that takes no new file: refused by the check before the work, not
// by the write after it (the file is replaced by one written beside it). Root writes anywhere.
TEST_F(OutputFileTest, AFileInAFolderThatTakesNoNewFileIsRefusedUpFront) {
  if (geteuid() == 0) GTEST_SKIP() << "root may write into any folder";
  namespace fs = std::filesystem;
  const fs::path folder = dir_ / "read-only";
  fs::create_directory(folder);
  const std::string path = folder / "result.json";
  ASSERT_TRUE(WriteOutputFile(path, "earlier").ok());
  fs::permissions(folder, fs::perms::owner_read | fs::perms::owner_exec);
  const absl::Status s = CheckOutputFile(path);
  fs::permissions(folder, fs::perms::owner_all);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("folder is not writable"), std::string::npos) << s;
}

}  // namespace
}  // namespace kvtier::tool
