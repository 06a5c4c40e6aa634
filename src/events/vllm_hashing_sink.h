// A BlockEventSink that renames blocks with vLLM's hashes (src/events/vllm_block_hash.h) before
// passing their events on: Options::kv_events_vllm_hash_seed, for routers that compute vLLM's
// sha256_cbor chain themselves and must find kvtier's blocks under it (docs/events.md).
//
// It keeps, for each kvtier hash that some tier holds or that a held block chains from, the
// block's vLLM hash (the chain needs the parent's). A block whose parent it does not know (the
// parent left every tier before the block was indexed) has no vLLM hash: its events are not
// passed on, and a router never hears of it.
//
// Thread-compatible, as every sink (the cache calls it under its mutex).
#ifndef KVTIER_SRC_EVENTS_VLLM_HASHING_SINK_H_
#define KVTIER_SRC_EVENTS_VLLM_HASHING_SINK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "src/block_events.h"
#include "src/events/vllm_block_hash.h"

namespace kvtier {

class VllmHashingSink : public BlockEventSink {
 public:
  // REQUIRES: next != nullptr. `seed`: vLLM's PYTHONHASHSEED.
  VllmHashingSink(std::unique_ptr<BlockEventSink> next, const std::string& seed);

  void Stored(Medium medium, uint64_t hash, uint64_t parent_hash, uint64_t extra_key,
              absl::Span<const int32_t> tokens) override;
  void Removed(Medium medium, uint64_t hash) override;
  void FormatChanged(Medium medium, uint64_t hash, int format) override;
  void AllBlocksCleared() override;
  void EndStep() override { next_->EndStep(); }
  EventStats Stats() const override { return next_->Stats(); }

  // Blocks it knows a vLLM hash for (held in a tier, or the parent of one that is).
  size_t known_blocks() const { return known_.size(); }

 private:
  struct Known {
    Sha256Digest vllm;
    uint64_t parent = 0;  // kvtier hash of the parent (kRootParentHash: none)
    int32_t tiers = 0;     // tiers holding the block
    int32_t children = 0;  // known blocks chaining from it
  };
  // Forgets `hash` and, up the chain, parents nothing holds or chains from any more.
  void Release(uint64_t hash);

  std::unique_ptr<BlockEventSink> next_;
  VllmBlockHasher hasher_;
  absl::flat_hash_map<uint64_t, Known> known_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_EVENTS_VLLM_HASHING_SINK_H_
