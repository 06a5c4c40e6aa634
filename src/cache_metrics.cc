#include "src/cache_metrics.h"

namespace kvtier {

CacheMetrics::CacheMetrics(int num_formats) : num_formats_(num_formats) {
  for (int f = 0; f < num_formats * num_formats; ++f) {
    migrations_.push_back(MigrationStats{f / num_formats, f % num_formats, 0, 0});
  }
}

uint32_t CacheMetrics::NowMs() const {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - created_)
                                   .count());
}

void CacheMetrics::CountMigration(int from, int to, int64_t blocks, int64_t bytes) {
  MigrationStats& m = migrations_[from * num_formats_ + to];
  m.blocks += blocks;
  m.bytes += bytes;
}

void CacheMetrics::Fill(CacheStats* s) const {
  s->steps = steps;
  s->tokens = tokens;
  s->allocation_failures = allocation_failures;
  s->copy_on_write_blocks = copy_on_write_blocks;
  s->nonfinite_values = nonfinite_values;
  s->prefix_queried_tokens = prefix_queried_tokens;
  s->prefix_hit_tokens = prefix_hit_tokens;
  s->prefix_hit_blocks = prefix_hit_blocks;
  s->prefix_missed_blocks = prefix_missed_blocks;
  s->evicted_blocks = evicted_blocks;
  s->abandoned_blocks = abandoned_blocks;
  s->demotions_under_pressure = demotions_under_pressure;
  s->compacted_pages = compacted_pages;
  s->policy_demotion_failures = policy_demotion_failures;
  s->migration_seconds = migration_seconds.stats();
  s->block_lifetime_seconds = block_lifetime_seconds.stats();
  s->block_idle_before_evict_seconds = idle_before_evict_seconds.stats();
  s->host = host;  // the counters; the block pool writes the gauges after
  s->migrations.clear();
  for (const MigrationStats& m : migrations_) {
    if (m.blocks > 0) s->migrations.push_back(m);
  }
}

}  // namespace kvtier
