#include "src/prefix_index.h"

#include <utility>

#include "absl/numeric/bits.h"

namespace kvtier {

size_t PrefixIndex::SlotOf(uint64_t hash) const {
  size_t i = hash & mask_;
  while (slots_[i].block != kNone && slots_[i].hash != hash) i = (i + 1) & mask_;
  return i;
}

void PrefixIndex::Reserve(size_t n) {
  const size_t slots = absl::bit_ceil(2 * n + 2);
  if (slots > slots_.size()) Rehash(slots);
}

void PrefixIndex::Rehash(size_t slots) {
  std::vector<Entry> old = std::exchange(slots_, std::vector<Entry>(slots));
  mask_ = slots - 1;
  for (const Entry& e : old) {
    if (e.block != kNone) slots_[SlotOf(e.hash)] = e;
  }
}

bool PrefixIndex::Insert(uint64_t hash, uint32_t block) {
  if (slots_.empty()) Rehash(4);
  size_t slot = SlotOf(hash);
  if (slots_[slot].block != kNone) return false;
  if (2 * (size_ + 1) >= slots_.size()) {
    Rehash(absl::bit_ceil(4 * (size_ + 1)));
    slot = SlotOf(hash);
  }
  slots_[slot] = Entry{hash, block};
  size_ += 1;
  return true;
}

bool PrefixIndex::Erase(uint64_t hash) {
  if (size_ == 0) return false;
  size_t hole = SlotOf(hash);
  if (slots_[hole].block == kNone) return false;
  // Backward shift: an entry after the hole moves into it unless its home slot lies cyclically
  // in (hole, entry], where its probe would no longer pass the hole.
  for (size_t i = (hole + 1) & mask_; slots_[i].block != kNone; i = (i + 1) & mask_) {
    const size_t home = slots_[i].hash & mask_;
    if (((i - home) & mask_) >= ((i - hole) & mask_)) {
      slots_[hole] = slots_[i];
      hole = i;
    }
  }
  slots_[hole] = Entry{};
  size_ -= 1;
  return true;
}

}  // namespace kvtier
