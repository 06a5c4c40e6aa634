// Metadata of every logical block, in one preallocated array indexed by BlockId::index.
// A slot's generation changes each time it is freed, so an old BlockId never aliases a new
// block. Allocation and free are O(1) and never allocate memory.
//
// Thread-compatible.
#ifndef KVTIER_SRC_BLOCK_TABLE_H_
#define KVTIER_SRC_BLOCK_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/base/casts.h"
#include "kvtier/cache.h"
#include "kvtier/ids.h"

namespace kvtier {

// A non-negative float in 16 bits: its top half (bfloat16), rounded down, so that packed values
// order as the floats do.
inline uint16_t PackAttention(float x) {
  return static_cast<uint16_t>(absl::bit_cast<uint32_t>(x) >> 16);
}
inline float UnpackAttention(uint16_t packed) {
  return absl::bit_cast<float>(static_cast<uint32_t>(packed) << 16);
}

struct BlockMeta {
  uint64_t hash = 0;           // prefix identity while `indexed`
  int64_t expires_at = 0;      // step at which a cached block's priority lapses
  uint32_t generation = 1;     // of the current (or next) occupant
  uint32_t page = 0;           // page index in the pools of `format`
  uint32_t ref_count = 0;      // sequences holding the block
  uint32_t next_free = 0;      // free-list link while kFree
  uint32_t parent = 0xFFFFFFFFu;  // indexed block this one's hash chains from, or none
  uint32_t children = 0;       // indexed blocks on the device whose parent this is
  uint16_t num_tokens = 0;     // tokens filled, <= block_tokens
  uint8_t format = 0;          // palette index
  // The strictest minimum precision (palette index) of its holders; a cached block keeps its
  // last holders' (an offload keeps it), and the first to take it up again sets its own.
  uint8_t coldest_format = 0;
  uint8_t priority = 0;        // eviction level once cached
  bool indexed = false;        // in the prefix index
  BlockState state = BlockState::kFree;
  // Largest weight x sequence blocks reported (Cache::RecordAttention), as PackAttention.
  uint16_t attention = 0;
  uint32_t born_ms = 0;        // cache clock at allocation
  uint32_t idle_since_ms = 0;  // cache clock when it was last cached
  uint32_t offloaded_children = 0;  // indexed children in the host tier (`children`: device)
};

class BlockTable {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  explicit BlockTable(uint32_t capacity);

  uint32_t capacity() const { return static_cast<uint32_t>(blocks_.size()); }
  uint32_t free_count() const { return free_count_; }

  // A free slot, now kInUse with one reference and no tokens. REQUIRES: free_count() > 0.
  uint32_t Allocate(uint8_t format, uint32_t page);
  // Returns `index` to the free list and invalidates its id. REQUIRES: not kFree.
  void Free(uint32_t index);

  BlockMeta& operator[](uint32_t index) { return blocks_[index]; }
  const BlockMeta& operator[](uint32_t index) const { return blocks_[index]; }
  BlockId IdOf(uint32_t index) const { return BlockId{index, blocks_[index].generation}; }
  // True when `id` names a block that exists now.
  bool IsLive(BlockId id) const {
    return id.index < blocks_.size() && blocks_[id.index].state != BlockState::kFree &&
           blocks_[id.index].generation == id.generation;
  }
  // Counts the slots on the free list; for the consistency checker. O(capacity).
  uint32_t CountFreeList() const;

 private:
  std::vector<BlockMeta> blocks_;
  uint32_t free_head_ = kNone;
  uint32_t free_count_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_BLOCK_TABLE_H_
