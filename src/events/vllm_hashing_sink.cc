#include "src/events/vllm_hashing_sink.h"

#include <utility>

#include "src/prefix_hash.h"

namespace kvtier {

VllmHashingSink::VllmHashingSink(std::unique_ptr<BlockEventSink> next, const std::string& seed)
    : next_(std::move(next)), hasher_(seed) {}

void VllmHashingSink::Stored(Medium medium, uint64_t hash, uint64_t parent_hash,
                             uint64_t extra_key, absl::Span<const int32_t> tokens) {
  auto it = known_.find(hash);
  if (it == known_.end()) {
    const Sha256Digest* parent = &hasher_.root();
    if (parent_hash != kRootParentHash) {
      auto p = known_.find(parent_hash);
      if (p == known_.end()) return;  // no chain to hash it under: not published
      p->second.children += 1;
      parent = &p->second.vllm;
    }
    it = known_.emplace(hash, Known{hasher_.Block(*parent, tokens, extra_key), parent_hash})
             .first;
  }
  it->second.tiers += 1;
  const uint64_t vllm_parent = parent_hash == kRootParentHash
                                   ? kRootParentHash
                                   : VllmEventHash(known_.at(parent_hash).vllm);
  next_->Stored(medium, VllmEventHash(it->second.vllm), vllm_parent, extra_key, tokens);
}

void VllmHashingSink::Removed(Medium medium, uint64_t hash) {
  auto it = known_.find(hash);
  if (it == known_.end() || it->second.tiers == 0) return;  // never published
  next_->Removed(medium, VllmEventHash(it->second.vllm));
  it->second.tiers -= 1;
  Release(hash);
}

void VllmHashingSink::FormatChanged(Medium medium, uint64_t hash, int format) {
  auto it = known_.find(hash);
  if (it == known_.end() || it->second.tiers == 0) return;
  next_->FormatChanged(medium, VllmEventHash(it->second.vllm), format);
}

void VllmHashingSink::AllBlocksCleared() {
  known_.clear();
  next_->AllBlocksCleared();
}

void VllmHashingSink::Release(uint64_t hash) {
  while (hash != kRootParentHash) {
    auto it = known_.find(hash);
    if (it->second.tiers > 0 || it->second.children > 0) return;
    const uint64_t parent = it->second.parent;
    known_.erase(it);
    if (parent != kRootParentHash) known_.at(parent).children -= 1;
    hash = parent;
  }
}

}  // namespace kvtier
