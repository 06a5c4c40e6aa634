// The block events of the cache core (docs/events.md): what a router needs to know of the
// prefix index, tier by tier. The block pool calls a sink, when the cache has one, as indexed
// blocks enter and leave a tier; the cache closes each step's batch. Without a sink nothing is
// recorded and nothing is called.
//
// Events, in vLLM's terms (vllm/distributed/kv_events.py):
//   Stored(medium, hash, parent, ...)     BlockStored: a full block is indexed (kDevice) or
//                                         arrives in a tier (offload: kHost; onload: kDevice)
//   Removed(medium, hash)                 BlockRemoved: an indexed block leaves a tier (dropped,
//                                         evicted, or moved to the other tier)
//   FormatChanged(medium, hash, format)   kvtier's extension: the block is now in palette
//                                         format `format` (demotion, or a block stored in a
//                                         format other than palette[0])
//   AllBlocksCleared()                    every block of every tier is gone (the cache closes)
//
// Thread-compatible: the cache calls a sink under its mutex; an implementation must not block
// (no I/O), since the cache's step waits for it.
#ifndef KVTIER_SRC_BLOCK_EVENTS_H_
#define KVTIER_SRC_BLOCK_EVENTS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kvtier/stats.h"

namespace kvtier {

// The tier an event is about, published as vLLM's `medium` string (MediumName).
enum class Medium : uint8_t {
  kDevice,  // "GPU": the device pools (host memory on the CPU backend, still the device tier)
  kHost,    // "CPU": the host tier (Options::host_tier_bytes)
};

inline const char* MediumName(Medium medium) { return medium == Medium::kDevice ? "GPU" : "CPU"; }

class BlockEventSink {
 public:
  virtual ~BlockEventSink() = default;

  // The block `hash` (its prefix identity) is now held in `medium`. `parent_hash` is the
  // identity it chains from (kRootParentHash for a first block), `extra_key` its sequence's
  // SequenceOptions::extra_key (part of `hash`); `tokens` its block_tokens token ids, valid for
  // the call only.
  virtual void Stored(Medium medium, uint64_t hash, uint64_t parent_hash, uint64_t extra_key,
                      absl::Span<const int32_t> tokens) = 0;
  // The block `hash` is no longer held in `medium`.
  virtual void Removed(Medium medium, uint64_t hash) = 0;
  // The block `hash`, held in `medium`, is now in palette format `format`.
  virtual void FormatChanged(Medium medium, uint64_t hash, int format) = 0;
  // Every block of every tier is gone.
  virtual void AllBlocksCleared() = 0;
  // Ends the batch of events of one step (Cache::EndStep).
  virtual void EndStep() = 0;
  // The publisher's counters (CacheStats::events); none by default.
  virtual EventStats Stats() const { return {}; }
};

}  // namespace kvtier

#endif  // KVTIER_SRC_BLOCK_EVENTS_H_
