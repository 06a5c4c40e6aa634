// A fixed-bucket histogram for the stats snapshot (Prometheus-style bounds).
//
// Thread-compatible.
#ifndef KVTIER_SRC_HISTOGRAM_H_
#define KVTIER_SRC_HISTOGRAM_H_

#include <algorithm>
#include <vector>

#include "kvtier/stats.h"

namespace kvtier {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) {
    stats_.bounds = std::move(bounds);
    stats_.counts.assign(stats_.bounds.size() + 1, 0);
  }

  void Observe(double value) {
    const auto it = std::lower_bound(stats_.bounds.begin(), stats_.bounds.end(), value);
    stats_.counts[it - stats_.bounds.begin()] += 1;
    stats_.sum += value;
    stats_.count += 1;
  }

  const HistogramStats& stats() const { return stats_; }

  // Bounds from `first` growing by `factor`, `n` of them.
  static std::vector<double> Exponential(double first, double factor, int n) {
    std::vector<double> bounds;
    for (double b = first; n-- > 0; b *= factor) bounds.push_back(b);
    return bounds;
  }

 private:
  HistogramStats stats_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_HISTOGRAM_H_
