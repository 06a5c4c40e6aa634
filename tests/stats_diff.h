// Equality of two CacheStats snapshots as a refusal must leave them: every gauge and counter of
// the cache's state, all but `allocation_failures` (which counts refusals). No test framework,
// so that the fuzz target uses it too.
#ifndef KVTIER_TESTS_STATS_DIFF_H_
#define KVTIER_TESTS_STATS_DIFF_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "kvtier/stats.h"

namespace kvtier::testing {

// Empty when `a` and `b` hold the same state; otherwise the fields that differ.
inline std::string StateDifference(const CacheStats& a, const CacheStats& b) {
  std::string diff;
  auto field = [&diff](const char* name, auto x, auto y) {
    if (!(x == y)) absl::StrAppend(&diff, name, ": ", x, " != ", y, "; ");
  };
  field("slabs_free", a.slabs_free, b.slabs_free);
  field("used_bytes", a.used_bytes, b.used_bytes);
  field("cached_bytes", a.cached_bytes, b.cached_bytes);
  field("sequences", a.sequences, b.sequences);
  field("tokens", a.tokens, b.tokens);
  field("pages_pending_reclaim", a.pages_pending_reclaim, b.pages_pending_reclaim);
  field("steps", a.steps, b.steps);
  field("copy_on_write_blocks", a.copy_on_write_blocks, b.copy_on_write_blocks);
  field("slab_moves", a.slab_moves, b.slab_moves);
  field("nonfinite_values", a.nonfinite_values, b.nonfinite_values);
  field("prefix_queried_tokens", a.prefix_queried_tokens, b.prefix_queried_tokens);
  field("prefix_hit_tokens", a.prefix_hit_tokens, b.prefix_hit_tokens);
  field("evicted_blocks", a.evicted_blocks, b.evicted_blocks);
  field("evictable_blocks", a.evictable_blocks, b.evictable_blocks);
  field("indexed_blocks", a.indexed_blocks, b.indexed_blocks);
  field("policy", a.policy, b.policy);
  field("under_pressure", int{a.under_pressure}, int{b.under_pressure});
  field("demotions_under_pressure", a.demotions_under_pressure, b.demotions_under_pressure);
  field("compacted_pages", a.compacted_pages, b.compacted_pages);
  field("policy_demotion_failures", a.policy_demotion_failures, b.policy_demotion_failures);
  field("migration batches", a.migration_seconds.count, b.migration_seconds.count);
  field("freed blocks", a.block_lifetime_seconds.count, b.block_lifetime_seconds.count);
  field("migration pairs", a.migrations.size(), b.migrations.size());
  for (size_t i = 0; i < a.migrations.size() && i < b.migrations.size(); ++i) {
    field("migrated blocks", a.migrations[i].blocks, b.migrations[i].blocks);
  }
  field("host.slabs_free", a.host.slabs_free, b.host.slabs_free);
  field("host.blocks", a.host.blocks, b.host.blocks);
  field("host.evictable_blocks", a.host.evictable_blocks, b.host.evictable_blocks);
  field("host.offloaded_blocks", a.host.offloaded_blocks, b.host.offloaded_blocks);
  field("host.onloaded_blocks", a.host.onloaded_blocks, b.host.onloaded_blocks);
  field("host.evicted_blocks", a.host.evicted_blocks, b.host.evicted_blocks);
  field("formats", a.formats.size(), b.formats.size());
  for (size_t f = 0; f < a.formats.size() && f < b.formats.size(); ++f) {
    const FormatStats &x = a.formats[f], &y = b.formats[f];
    field("slabs_mapped", x.slabs_mapped, y.slabs_mapped);
    field("pages_mapped", x.pages_mapped, y.pages_mapped);
    field("pages_used", x.pages_used, y.pages_used);
    field("blocks_in_use", x.blocks_in_use, y.blocks_in_use);
    field("blocks_cached", x.blocks_cached, y.blocks_cached);
  }
  return diff;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_STATS_DIFF_H_
