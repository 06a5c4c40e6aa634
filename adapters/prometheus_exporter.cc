#include "kvtier/adapters/prometheus_exporter.h"

#include <deque>
#include <iterator>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvtier {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

class Builder {
 public:
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    families_.push_back(MetricFamily{name, help, type, {}});
    return families_.back();
  }
  void Gauge(const std::string& name, const std::string& help, double value) {
    Add(Family(name, help, MetricType::Gauge), {}, value);
  }
  void Counter(const std::string& name, const std::string& help, double value) {
    Add(Family(name, help, MetricType::Counter), {}, value);
  }
  static void Add(MetricFamily& family, std::vector<ClientMetric::Label> labels, double value) {
    ClientMetric m;
    m.label = std::move(labels);
    if (family.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    family.metric.push_back(std::move(m));
  }
  void Histogram(const std::string& name, const std::string& help, const HistogramStats& h) {
    ClientMetric m;
    m.histogram.sample_count = static_cast<uint64_t>(h.count);
    m.histogram.sample_sum = h.sum;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += static_cast<uint64_t>(h.counts[i]);
      m.histogram.bucket.push_back({cumulative, h.bounds[i]});
    }
    m.histogram.bucket.push_back({static_cast<uint64_t>(h.count), std::numeric_limits<double>::infinity()});
    Family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() {
    return std::vector<MetricFamily>(std::make_move_iterator(families_.begin()),
                                     std::make_move_iterator(families_.end()));
  }

 private:
  std::deque<MetricFamily> families_;  // a deque: references from Family() stay valid
};

// The device and host tiers (docs/tiers.md); the host rows are zero without a host tier.
void AddTiers(Builder& b, const CacheStats& s) {
  int64_t device_blocks = 0;
  for (const FormatStats& f : s.formats) device_blocks += f.blocks_in_use + f.blocks_cached;
  const HostTierStats& h = s.host;
  MetricFamily& blocks = b.Family("kvtier_tier_blocks", "Blocks held by each tier (device: in use and cached; host: offloaded).", MetricType::Gauge);
  Builder::Add(blocks, {{"tier", "device"}}, static_cast<double>(device_blocks));
  Builder::Add(blocks, {{"tier", "host"}}, static_cast<double>(h.blocks));
  MetricFamily& bytes = b.Family("kvtier_tier_bytes", "Bytes of the pages of the blocks each tier holds, all layers.", MetricType::Gauge);
  Builder::Add(bytes, {{"tier", "device"}}, static_cast<double>(s.used_bytes + s.cached_bytes));
  Builder::Add(bytes, {{"tier", "host"}}, static_cast<double>(h.bytes));
  MetricFamily& capacity = b.Family("kvtier_tier_capacity_bytes", "The budget of each tier in bytes.", MetricType::Gauge);
  Builder::Add(capacity, {{"tier", "device"}}, static_cast<double>(s.budget_bytes));
  Builder::Add(capacity, {{"tier", "host"}}, static_cast<double>(h.budget_bytes));
  MetricFamily& hits = b.Family("kvtier_tier_hit_tokens_total", "Prompt tokens found in the prefix cache, by the tier that held them.", MetricType::Counter);
  Builder::Add(hits, {{"tier", "device"}},
               static_cast<double>(s.prefix_hit_tokens - h.hit_tokens - s.remote.hit_tokens));
  Builder::Add(hits, {{"tier", "host"}}, static_cast<double>(h.hit_tokens));
  Builder::Add(hits, {{"tier", "remote"}}, static_cast<double>(s.remote.hit_tokens));
  MetricFamily& moved = b.Family("kvtier_tier_moved_blocks_total", "Blocks copied between the tiers.", MetricType::Counter);
  Builder::Add(moved, {{"direction", "offload"}}, static_cast<double>(h.offloaded_blocks));
  Builder::Add(moved, {{"direction", "onload"}}, static_cast<double>(h.onloaded_blocks));
  MetricFamily& moved_bytes = b.Family("kvtier_tier_moved_bytes_total", "Bytes copied between the tiers, all layers.", MetricType::Counter);
  Builder::Add(moved_bytes, {{"direction", "offload"}}, static_cast<double>(h.bytes_offloaded));
  Builder::Add(moved_bytes, {{"direction", "onload"}}, static_cast<double>(h.bytes_onloaded));
  MetricFamily& failed = b.Family("kvtier_tier_move_failures_total", "Offloads that dropped the block instead, and prefix hits cut at a host block.", MetricType::Counter);
  Builder::Add(failed, {{"direction", "offload"}}, static_cast<double>(h.offload_failures));
  Builder::Add(failed, {{"direction", "onload"}}, static_cast<double>(h.onload_failures));
  b.Counter("kvtier_host_evicted_blocks_total", "Offloaded blocks dropped to make room in the host tier (part of kvtier_evicted_blocks_total).", static_cast<double>(h.evicted_blocks));
}

// KV events (docs/events.md); zero without them.
void AddEvents(Builder& b, const CacheStats& s) {
  const EventStats& e = s.events;
  MetricFamily& batches = b.Family("kvtier_events_batches_total", "KV-event batches sent on the PUB socket or dropped because the publisher's queue was full.", MetricType::Counter);
  Builder::Add(batches, {{"outcome", "published"}}, static_cast<double>(e.published_batches));
  Builder::Add(batches, {{"outcome", "dropped"}}, static_cast<double>(e.dropped_batches));
  MetricFamily& events = b.Family("kvtier_events_total", "KV events in those batches.", MetricType::Counter);
  Builder::Add(events, {{"outcome", "published"}}, static_cast<double>(e.published_events));
  Builder::Add(events, {{"outcome", "dropped"}}, static_cast<double>(e.dropped_events));
  b.Counter("kvtier_events_replay_requests_total", "Requests served on the KV-event replay socket.", static_cast<double>(e.replay_requests));
  b.Gauge("kvtier_events_queued_batches", "KV-event batches waiting for the publisher thread.", static_cast<double>(e.queued_batches));
}

// The remote tier (docs/tiers.md); zero without one.
void AddRemote(Builder& b, const RemoteTierStats& r) {
  b.Gauge("kvtier_remote_connected", "1 while the remote tier's lookup connection is up.", r.connected ? 1 : 0);
  b.Gauge("kvtier_remote_queued_blocks", "Blocks waiting to be written to the remote tier.", static_cast<double>(r.queued_blocks));
  MetricFamily& blocks = b.Family("kvtier_remote_blocks_total", "Blocks read from the remote tier and attached, and blocks written to it.", MetricType::Counter);
  Builder::Add(blocks, {{"op", "read"}}, static_cast<double>(r.hit_blocks));
  Builder::Add(blocks, {{"op", "write"}}, static_cast<double>(r.written_blocks));
  MetricFamily& bytes = b.Family("kvtier_remote_bytes_total", "Value bytes read from and written to the remote tier.", MetricType::Counter);
  Builder::Add(bytes, {{"op", "read"}}, static_cast<double>(r.bytes_read));
  Builder::Add(bytes, {{"op", "write"}}, static_cast<double>(r.bytes_written));
  b.Counter("kvtier_remote_misses_total", "Remote lookups that ended before the prompt's last block (a missing or unusable value).", static_cast<double>(r.missed_blocks));
  MetricFamily& errors = b.Family("kvtier_remote_errors_total", "Remote tier failures by kind: each a miss or a dropped write.", MetricType::Counter);
  const std::pair<const char*, int64_t> kinds[] = {
      {"unavailable", r.unavailable}, {"timeout", r.timeouts}, {"corrupt", r.corrupt_values},
      {"mismatch", r.mismatched_values},
      {"unauthenticated", r.unauthenticated_values}, {"server_error", r.server_errors},
      {"queue_full", r.dropped_writes}, {"import", r.import_failures}};
  for (const auto& [kind, n] : kinds) Builder::Add(errors, {{"kind", kind}}, static_cast<double>(n));
  b.Counter("kvtier_remote_reconnects_total", "Connections to the remote tier made after the first.", static_cast<double>(r.reconnects));
  b.Histogram("kvtier_remote_lookup_duration_seconds", "Wall time of one AddSequence lookup in the remote tier.", r.lookup_seconds);
}

}  // namespace

std::vector<MetricFamily> MetricFamilies(const Options& options, const CacheStats& s) {
  Builder b;
  b.Gauge("kvtier_usage_ratio", "Bytes of in-use blocks over the memory budget (cached blocks count as free).", s.usage_ratio);
  b.Gauge("kvtier_cached_bytes", "Bytes of cached, evictable prefix blocks.", static_cast<double>(s.cached_bytes));
  b.Gauge("kvtier_capacity_bytes", "The memory budget in bytes.", static_cast<double>(s.budget_bytes));
  MetricFamily& blocks = b.Family("kvtier_blocks", "Blocks by format and state (free: free pages of the format's mapped slabs).", MetricType::Gauge);
  MetricFamily& bytes = b.Family("kvtier_bytes", "Bytes of slabs mapped into each format's pools.", MetricType::Gauge);
  for (const FormatStats& f : s.formats) {
    Builder::Add(blocks, {{"format", f.name}, {"state", "in_use"}}, static_cast<double>(f.blocks_in_use));
    Builder::Add(blocks, {{"format", f.name}, {"state", "cached"}}, static_cast<double>(f.blocks_cached));
    Builder::Add(blocks, {{"format", f.name}, {"state", "free"}}, static_cast<double>(f.pages_mapped - f.pages_used));
    Builder::Add(bytes, {{"format", f.name}}, static_cast<double>(f.bytes));
  }
  b.Gauge("kvtier_effective_bits_per_element", "Payload plus scale bits per stored K/V element over live blocks.", s.effective_bits_per_element);
  b.Gauge("kvtier_sequences", "Live sequences.", static_cast<double>(s.sequences));
  b.Gauge("kvtier_tokens", "Tokens held by live sequences.", static_cast<double>(s.tokens));
  b.Gauge("kvtier_under_pressure", "1 while the policy's windows are shrunk by memory pressure.", s.under_pressure ? 1 : 0);
  MetricFamily& slabs = b.Family("kvtier_slabs", "Slabs of the budget (per layer) by state.", MetricType::Gauge);
  Builder::Add(slabs, {{"state", "free"}}, static_cast<double>(s.slabs_free));
  Builder::Add(slabs, {{"state", "mapped"}},
               static_cast<double>(s.slabs_total - s.slabs_free - s.slabs_lost));
  Builder::Add(slabs, {{"state", "lost"}}, static_cast<double>(s.slabs_lost));
  b.Counter("kvtier_prefix_queried_tokens_total", "Prompt tokens looked up in the prefix cache.", static_cast<double>(s.prefix_queried_tokens));
  b.Counter("kvtier_prefix_hit_tokens_total", "Prompt tokens found in the prefix cache.", static_cast<double>(s.prefix_hit_tokens));
  b.Counter("kvtier_prefix_hit_blocks_total", "Whole prompt blocks found in the prefix cache.", static_cast<double>(s.prefix_hit_blocks));
  b.Counter("kvtier_prefix_missed_blocks_total", "Whole prompt blocks not found.", static_cast<double>(s.prefix_missed_blocks));
  MetricFamily& evicted = b.Family("kvtier_evicted_blocks_total", "Cached blocks dropped from the prefix cache.", MetricType::Counter);
  Builder::Add(evicted, {{"reason", "capacity"}}, static_cast<double>(s.evicted_blocks));
  Builder::Add(evicted, {{"reason", "abandoned"}}, static_cast<double>(s.abandoned_blocks));
  AddTiers(b, s);
  AddEvents(b, s);
  AddRemote(b, s.remote);
  MetricFamily& migrated = b.Family("kvtier_migrated_blocks_total", "Blocks demoted from one format to another.", MetricType::Counter);
  MetricFamily& migrated_bytes = b.Family("kvtier_migrated_bytes_total", "Bytes read plus written by demotions.", MetricType::Counter);
  // Every pair that can migrate from 0, so that rate() counts a pair's first demotions.
  for (size_t from = 0; from < s.formats.size(); ++from) {
    for (size_t to = from + 1; to < s.formats.size(); ++to) {
      MigrationStats m;
      for (const MigrationStats& done : s.migrations) {
        if (done.from == static_cast<int32_t>(from) && done.to == static_cast<int32_t>(to)) m = done;
      }
      const std::vector<ClientMetric::Label> labels = {{"from", s.formats[from].name}, {"to", s.formats[to].name}};
      Builder::Add(migrated, labels, static_cast<double>(m.blocks));
      Builder::Add(migrated_bytes, labels, static_cast<double>(m.bytes));
    }
  }
  b.Histogram("kvtier_migration_duration_seconds", "Wall time of one demotion batch on the host.", s.migration_seconds);
  b.Counter("kvtier_demotions_under_pressure_total", "Blocks demoted while the watermark was breached.", static_cast<double>(s.demotions_under_pressure));
  b.Counter("kvtier_policy_demotion_failures_total", "Planned demotions left queued for want of room, once per block per step.", static_cast<double>(s.policy_demotion_failures));
  MetricFamily& failures = b.Family("kvtier_allocation_failures_total", "Appends and demotions refused for room.", MetricType::Counter);
  Builder::Add(failures, {{"reason", "budget"}}, static_cast<double>(s.allocation_failures));
  b.Counter("kvtier_nonfinite_values_total", "NaN or Inf values seen by the append path.", static_cast<double>(s.nonfinite_values));
  b.Histogram("kvtier_block_lifetime_seconds", "Time from a block's allocation to its free.", s.block_lifetime_seconds);
  b.Histogram("kvtier_block_idle_before_evict_seconds", "Time an evicted block spent cached and unreferenced.", s.block_idle_before_evict_seconds);
  std::vector<std::string> palette;
  for (const FormatStats& f : s.formats) palette.push_back(f.name);
  const Geometry& g = options.geometry;
  MetricFamily& info = b.Family("kvtier_cache_info", "Configuration of the cache (always 1).", MetricType::Gauge);
  Builder::Add(info, {{"block_tokens", absl::StrCat(g.block_tokens)}, {"layers", absl::StrCat(g.num_layers)},
                      {"kv_heads", absl::StrCat(g.num_kv_heads)}, {"head_dim", absl::StrCat(g.head_dim)},
                      {"palette", absl::StrJoin(palette, ";")}, {"policy", s.policy}}, 1);
  return b.Take();
}

std::vector<MetricFamily> CacheCollectable::Collect() const {
  std::vector<MetricFamily> families = MetricFamilies(cache_->options(), cache_->GetStats());
  for (MetricFamily& family : families) {
    for (ClientMetric& metric : family.metric) {
      metric.label.insert(metric.label.begin(), labels_.begin(), labels_.end());
    }
  }
  return families;
}

}  // namespace kvtier
