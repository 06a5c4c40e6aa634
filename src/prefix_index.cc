#include "src/prefix_index.h"

namespace kvtier {

uint32_t PrefixIndex::Find(uint64_t hash) const {
  const auto it = map_.find(hash);
  return it == map_.end() ? kNone : it->second;
}

bool PrefixIndex::Insert(uint64_t hash, uint32_t block) {
  return map_.try_emplace(hash, block).second;
}

bool PrefixIndex::Erase(uint64_t hash) { return map_.erase(hash) != 0; }

}  // namespace kvtier
