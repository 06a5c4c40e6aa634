#include "src/block_table.h"

namespace kvtier {

BlockTable::BlockTable(uint32_t capacity) : blocks_(capacity), free_count_(capacity) {
  for (uint32_t i = capacity; i-- > 0;) {
    blocks_[i].next_free = free_head_;
    free_head_ = i;
  }
}

uint32_t BlockTable::Allocate(uint8_t format, uint32_t page) {
  const uint32_t index = free_head_;
  BlockMeta& b = blocks_[index];
  free_head_ = b.next_free;
  free_count_ -= 1;
  b.state = BlockState::kInUse;
  b.ref_count = 1;
  b.num_tokens = 0;
  b.format = format;
  b.page = page;
  b.parent = kNone;
  b.children = 0;
  b.offloaded_children = 0;
  b.indexed = false;
  b.priority = 0;
  b.attention = 0;
  return index;
}

void BlockTable::Free(uint32_t index) {
  BlockMeta& b = blocks_[index];
  b.state = BlockState::kFree;
  b.ref_count = 0;
  b.generation = b.generation + 1 == 0 ? 1 : b.generation + 1;
  b.next_free = free_head_;
  free_head_ = index;
  free_count_ += 1;
}

uint32_t BlockTable::CountFreeList() const {
  uint32_t n = 0;
  for (uint32_t i = free_head_; i != kNone && n <= capacity(); i = blocks_[i].next_free) ++n;
  return n;
}

}  // namespace kvtier
