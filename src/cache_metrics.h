// The cache's counters, histograms and clocks: everything behind the counter and histogram
// fields of CacheStats. Fields are plain members (one table, as in mimalloc's stats) that the
// cache and its block pool update as they work (the page store counts its own slab moves).
//
// Thread-compatible: the cache's mutex guards it.
#ifndef KVTIER_SRC_CACHE_METRICS_H_
#define KVTIER_SRC_CACHE_METRICS_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "kvtier/stats.h"
#include "src/histogram.h"

namespace kvtier {

class CacheMetrics {
 public:
  static constexpr uint32_t kNoTime = 0xFFFFFFFFu;

  explicit CacheMetrics(int num_formats);

  // Milliseconds since creation (the clock of block ages and lifetimes).
  uint32_t NowMs() const;

  // Counts `blocks` demoted from palette format `from` to `to`, moving `bytes`.
  void CountMigration(int from, int to, int64_t blocks, int64_t bytes);

  // Writes the counters, histograms and migrations into `stats`.
  void Fill(CacheStats* stats) const;

  int64_t steps = 0;  // EndStep calls: the clock of priorities and eviction order
  int64_t tokens = 0;  // summed over live sequences
  int64_t allocation_failures = 0;
  int64_t copy_on_write_blocks = 0;
  int64_t nonfinite_values = 0;
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_hit_blocks = 0;
  int64_t prefix_missed_blocks = 0;
  int64_t evicted_blocks = 0;
  int64_t abandoned_blocks = 0;
  int64_t demotions_under_pressure = 0;
  int64_t compacted_pages = 0;
  int64_t policy_demotion_failures = 0;
  HostTierStats host;  // the counter fields only
  Histogram migration_seconds{Histogram::Exponential(1e-5, 4, 10)};
  Histogram block_lifetime_seconds{Histogram::Exponential(0.01, 4, 12)};
  Histogram idle_before_evict_seconds{Histogram::Exponential(0.01, 4, 12)};

 private:
  const int num_formats_;
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  std::vector<MigrationStats> migrations_;  // [from * formats + to]
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CACHE_METRICS_H_
