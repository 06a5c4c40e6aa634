// A plain snapshot of a cache's state and counters. Exporting it (Prometheus) is a separate,
// optional target.
#ifndef KVTIER_STATS_H_
#define KVTIER_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {

struct FormatStats {
  std::string name;              // FormatName() of the palette entry
  int64_t page_bytes = 0;        // bytes of one page (one block in one layer)
  int64_t slabs_mapped = 0;      // slabs this format's pools hold now
  int64_t pages_mapped = 0;      // pages inside those slabs
  int64_t pages_used = 0;        // pages holding a block or awaiting reclamation
  int64_t blocks_in_use = 0;     // blocks referenced by at least one sequence
  int64_t blocks_cached = 0;     // unreferenced blocks kept for prefix reuse
  int64_t bytes = 0;             // slabs_mapped x slab bytes x layers
  double bits_per_element = 0;   // payload plus scale bits per stored K/V element
};

// Demotions from one palette format to another, since creation.
struct MigrationStats {
  int32_t from = 0;
  int32_t to = 0;
  int64_t blocks = 0;
  int64_t bytes = 0;  // bytes read plus written, all layers
};

// A histogram with fixed bucket bounds: counts[i] observations <= bounds[i] (and above
// bounds[i-1]); counts.back() holds those above every bound.
struct HistogramStats {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // [bounds.size() + 1]
  double sum = 0;
  int64_t count = 0;
};

// The host tier below the device pools (Options::host_tier_bytes); all zero without one.
struct HostTierStats {
  int64_t budget_bytes = 0;
  int64_t slabs_free = 0;        // per layer, not mapped into any host pool
  int64_t blocks = 0;            // offloaded blocks held there now
  int64_t bytes = 0;             // bytes of their pages, all layers
  int64_t evictable_blocks = 0;  // offloaded blocks that can be dropped now (leaves)
  // Counters since creation.
  int64_t offloaded_blocks = 0;  // cached device blocks copied down instead of evicted
  int64_t onloaded_blocks = 0;   // offloaded blocks brought back by a prefix hit
  int64_t evicted_blocks = 0;    // offloaded blocks dropped to make room in the host tier
  int64_t offload_failures = 0;  // blocks dropped from the device because no host room or copy
  int64_t onload_failures = 0;   // prefix hits cut short at a host block (no device room, copy)
  int64_t hit_tokens = 0;        // prefix_hit_tokens served from the host tier
  int64_t bytes_offloaded = 0;   // device -> host bytes, all layers
  int64_t bytes_onloaded = 0;    // host -> device bytes, all layers
};

// KV events (Options::kv_events_endpoint, docs/events.md); all zero without them. Counters
// since creation.
struct EventStats {
  int64_t published_batches = 0;  // KVEventBatch messages sent on the PUB socket
  int64_t published_events = 0;   // events in them
  int64_t dropped_batches = 0;    // batches dropped: the publisher's queue was full, or (rarely)
                                  // the PUB socket refused the send
  int64_t dropped_events = 0;     // events in them (a subscriber sees a gap in sequence numbers)
  int64_t replay_requests = 0;    // requests served on the replay socket
  int64_t queued_batches = 0;     // gauge: batches waiting for the publisher thread
};

// The remote tier (Options::remote_tier_url); all zero without one. Counters since creation.
struct RemoteTierStats {
  bool enabled = false;
  bool connected = false;            // the lookup connection was up at the last call
  int64_t hit_blocks = 0;            // blocks read from Redis and attached to a sequence
  int64_t hit_tokens = 0;            // prefix_hit_tokens served from the remote tier
  int64_t missed_blocks = 0;         // lookups ended by a missing or unusable value, or an error
  int64_t written_blocks = 0;        // blocks stored in Redis
  int64_t bytes_read = 0;            // header and page bytes of the blocks attached
  int64_t bytes_written = 0;         // header and page bytes stored (a MAC trailer not counted)
  int64_t queued_blocks = 0;         // writes waiting now (gauge)
  // Errors by kind; each is a miss (reads) or a dropped write, never an error of the call.
  int64_t unavailable = 0;     // calls skipped or failed because the server could not be reached
  int64_t timeouts = 0;        // calls that ran past remote_timeout_ms
  int64_t corrupt_values = 0;  // bad magic, length or checksum, truncated values
  int64_t mismatched_values = 0;  // another model, geometry, codec version, format or scales
  int64_t unauthenticated_values = 0;  // with remote_secret: no MAC, or one that fails
  int64_t server_errors = 0;   // commands the server refused (a write past maxmemory, ...)
  int64_t dropped_writes = 0;  // writes not queued (a full queue) or, rarely, not signed
  int64_t import_failures = 0;  // values read but not attached (no device room, a failed copy)
  int64_t reconnects = 0;      // connections made after the first
  HistogramStats lookup_seconds;  // wall time of each AddSequence lookup
};

struct CacheStats {
  int64_t budget_bytes = 0;
  int64_t slab_bytes = 0;             // per layer
  int64_t slabs_total = 0;            // per layer
  int64_t slabs_free = 0;             // not mapped into any pool
  int64_t slabs_lost = 0;             // withheld after unmapping them failed (never reused)
  int64_t used_bytes = 0;             // bytes of pages of in-use blocks, all formats and layers
  int64_t cached_bytes = 0;           // bytes of pages of cached (evictable) blocks
  double usage_ratio = 0;             // used_bytes / budget_bytes (cached blocks count as free,
                                      // as in vLLM's kv_cache_usage_perc)
  double effective_bits_per_element = 0;  // over all live blocks; 0 when there are none
  int64_t sequences = 0;
  int64_t tokens = 0;                 // summed over live sequences
  int64_t pages_pending_reclaim = 0;  // freed pages waiting for their fence
  int64_t steps = 0;                  // EndStep calls
  std::vector<FormatStats> formats;   // [palette size]

  // Counters since creation.
  int64_t allocation_failures = 0;    // appends and demotions refused for room (ResourceExhausted)
  int64_t copy_on_write_blocks = 0;   // shared tail blocks copied before a write
  int64_t slab_moves = 0;             // slabs mapped into a pool
  int64_t nonfinite_values = 0;       // NaN/Inf values seen by WriteKV
  int64_t prefix_queried_tokens = 0;  // prompt tokens looked up (vLLM's queries)
  int64_t prefix_hit_tokens = 0;      // of which found cached
  int64_t prefix_hit_blocks = 0;      // whole blocks found (TensorRT-LLM's reused blocks)
  int64_t prefix_missed_blocks = 0;   // whole prompt blocks not found
  int64_t evicted_blocks = 0;         // cached blocks dropped to make room (either tier)
  int64_t abandoned_blocks = 0;       // blocks Cache::Abandon withdrew from the prefix index
  int64_t evictable_blocks = 0;       // cached blocks that can go now (leaves)
  int64_t indexed_blocks = 0;         // blocks in the prefix index (in use, cached or offloaded)
  std::string policy;                 // name of the policy in force, empty for none
  bool under_pressure = false;        // the policy's windows are shrunk
  int64_t demotions_under_pressure = 0;  // blocks demoted while under pressure
  int64_t compacted_pages = 0;  // pages moved within their format so a slab could return (EndStep)
  int64_t policy_demotion_failures = 0;  // planned demotions that found no room, once per block
                                         // per step it waits (retried later)
  HistogramStats migration_seconds;       // wall time of each demotion batch on the host
  HistogramStats block_lifetime_seconds;  // allocation to free, for freed blocks
  HistogramStats block_idle_before_evict_seconds;  // cached (unreferenced) time of evicted blocks
  std::vector<MigrationStats> migrations;  // pairs with at least one block
  HostTierStats host;
  EventStats events;
  RemoteTierStats remote;
};

}  // namespace kvtier

#endif  // KVTIER_STATS_H_
