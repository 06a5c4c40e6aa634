// `kvtier simulate`'s plot: the policy run's bytes by format over time (stacked bars) and the
// concurrent sequences of both runs, from the samples each run took.
#ifndef KVTIER_EXAMPLES_KVTIER_SIMULATE_PLOT_H_
#define KVTIER_EXAMPLES_KVTIER_SIMULATE_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvtier::tool {

// The cache's state every 10 steps (and at the last step).
struct Sample {
  int64_t step = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  std::vector<int64_t> bytes;  // [format], pages of live blocks
  double bits = 0;
};

// One run as the plot draws it.
struct PlotRun {
  std::string policy;
  absl::Span<const Sample> samples;  // by step
  double mean_running = 0;
  std::vector<std::string> formats;  // the names of Sample::bytes' formats
};

// At most this many occupancy bars: consecutive samples share a bar (their mean), so that a long
// run's bars stay visible (at 10 steps a sample, 200,000 steps drew 20,000 bars 0.03 px wide).
inline constexpr size_t kMaxOccupancyBars = 300;

// Writes the plot of `run` (occupancy and sequences) beside `fp16` (sequences) over `steps` steps
// at a budget of `budget_mib` to `path` (WriteOutputFile's rules).
absl::Status WriteSimulatePlot(const std::string& path, const PlotRun& run, const PlotRun& fp16,
                               int64_t steps, int64_t budget_mib);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_SIMULATE_PLOT_H_
