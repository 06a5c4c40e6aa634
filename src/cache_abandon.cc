// Cache::Abandon: a sequence whose K/V was not all written (its prefill failed) is released,
// and the prefix index forgets the blocks it filled this step, with every block indexed under
// them since, so that no later prompt matches K/V that was never written.
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "src/cache_impl.h"

namespace kvtier {

absl::Status CacheImpl::Abandon(SequenceId id) {
  MutexLock lock(&mu_);
  Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  StopHashingOver(WithdrawFilledBlocks(*seq), *seq);
  ReleaseLocked(*seq);
  return absl::OkStatus();
}

absl::flat_hash_set<uint32_t> CacheImpl::WithdrawFilledBlocks(const Sequence& seq) {
  const BlockTable& table = pool_.blocks();
  std::vector<uint32_t> roots;  // the blocks `seq` filled this step (not those it matched or
                                // inherited through Fork: other sequences wrote them)
  for (const uint32_t block : seq.blocks) {
    const auto filled = indexed_this_step_.find(BlockKey(table.IdOf(block)));
    if (filled != indexed_this_step_.end() && filled->second == SequenceKey(seq) &&
        pool_[block].indexed) {
      roots.push_back(block);
    }
  }
  if (roots.empty()) return {};  // a refused append, say: nothing to withdraw
  // Every indexed block's indexed children, those imported from the remote tier included
  // (indexed_this_step_ does not list them): O(capacity), on a failure path.
  absl::flat_hash_map<uint32_t, std::vector<uint32_t>> children;
  for (uint32_t b = 0; b < table.capacity(); ++b) {
    const BlockMeta& m = pool_[b];
    if (m.state != BlockState::kFree && m.indexed && m.parent != BlockTable::kNone) {
      children[m.parent].push_back(b);
    }
  }
  // Depth first from each root, every block listed after its children.
  std::vector<uint32_t> order;
  absl::flat_hash_set<uint32_t> seen;
  std::vector<std::pair<uint32_t, size_t>> path;  // a block and its next child to visit
  for (const uint32_t root : roots) {
    if (!seen.insert(root).second) continue;
    path.emplace_back(root, 0);
    while (!path.empty()) {
      const uint32_t block = path.back().first;
      const auto kids = children.find(block);
      if (kids != children.end() && path.back().second < kids->second.size()) {
        const uint32_t child = kids->second[path.back().second++];
        if (seen.insert(child).second) path.emplace_back(child, 0);
        continue;
      }
      order.push_back(block);
      path.pop_back();
    }
  }
  for (const uint32_t block : order) {
    indexed_this_step_.erase(BlockKey(table.IdOf(block)));
    pool_.Withdraw(block);
  }
  return seen;
}

void CacheImpl::StopHashingOver(const absl::flat_hash_set<uint32_t>& withdrawn,
                                const Sequence& seq) {
  if (withdrawn.empty()) return;
  for (uint32_t i = 0; i < sequences_.num_slots(); ++i) {
    Sequence* other = sequences_.Find(SequenceId{i, sequences_.slot(i).generation});
    if (other == nullptr || other == &seq || !other->hashing) continue;
    for (const uint32_t block : other->blocks) {
      if (withdrawn.contains(block)) {
        other->hashing = false;
        other->tail_tokens.clear();
        break;
      }
    }
  }
}

}  // namespace kvtier
