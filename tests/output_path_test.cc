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

}  // namespace
}  // namespace kvtier::tool
