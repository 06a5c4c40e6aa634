// `kvtier simulate`'s plot: a long run's occupancy bars stay visible, and its file stays small.
#include "examples/kvtier/simulate_plot.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvtier::tool {
namespace {

// 200,000 steps sampled every 10: each sample's bar was 0.03 px wide, written "0.0" (nothing
// drawn), and 40,000 of them (plus a 20,000-point line per run) made a file of megabytes.
TEST(SimulatePlotTest, ALongRunDrawsAtMostTheBarLimitAndNoneEmpty) {
  constexpr int64_t kSteps = 200000;
  std::vector<Sample> samples;
  for (int64_t step = 0; step < kSteps; step += 10) {
    samples.push_back({step, 5 + step % 7, 0, {64 << 20, 128 << 20}, 0});
  }
  samples.push_back({kSteps - 1, 5, 0, {64 << 20, 128 << 20}, 0});
  const PlotRun run{"balanced", samples, 8, {"fp16", "nvfp4/block_head"}};
  const PlotRun fp16{"fp16", samples, 8, {"fp16"}};
  const std::string path =
      std::filesystem::temp_directory_path() / absl::StrCat("kvtier_plot_", getpid(), ".svg");
  ASSERT_TRUE(WriteSimulatePlot(path, run, fp16, kSteps, 512).ok());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  std::filesystem::remove(path);
  const std::string svg = text.str();
  size_t rects = 0;
  for (size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) {
    ++rects;
  }
  // Two formats a bar, plus two frames and three legend squares.
  EXPECT_LE(rects, 2 * kMaxOccupancyBars + 5);
  EXPECT_GE(rects, 2 * kMaxOccupancyBars - 2);
  EXPECT_EQ(svg.find("width=\"0.0\""), std::string::npos);
  EXPECT_LT(svg.size(), size_t{200} << 10);
}

}  // namespace
}  // namespace kvtier::tool
