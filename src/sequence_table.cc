#include "src/sequence_table.h"

#include "absl/strings/str_cat.h"

namespace kvtier {

absl::Status UnknownSequence(SequenceId id) {
  return absl::NotFoundError(
      absl::StrCat("sequence ", id.index, "/", id.generation, " is unknown or released"));
}

SequenceId SequenceTable::Add() {
  uint32_t index;
  if (free_.empty()) {
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    next_generation_.push_back(1);
  } else {
    index = free_.back();
    free_.pop_back();
  }
  Sequence& s = slots_[index];
  s.index = index;
  s.generation = next_generation_[index];
  next_generation_[index] = s.generation + 1 == 0 ? 1 : s.generation + 1;
  s.num_tokens = 0;
  s.blocks.clear();
  s.tail_tokens.clear();
  s.hashing = true;
  s.chain_hash = 0;
  s.tier_cursor.fill(0);
  s.dirty = false;
  live_ += 1;
  return SequenceId{index, s.generation};
}

Sequence* SequenceTable::Find(SequenceId id) {
  if (id.index >= slots_.size() || id.generation == 0) return nullptr;
  Sequence& s = slots_[id.index];
  return s.generation == id.generation ? &s : nullptr;
}

const Sequence* SequenceTable::Find(SequenceId id) const {
  return const_cast<SequenceTable*>(this)->Find(id);
}

void SequenceTable::Remove(SequenceId id) {
  Sequence& s = slots_[id.index];
  s.generation = 0;
  s.num_tokens = 0;
  s.blocks.clear();  // keeps capacity for the slot's next sequence
  s.tail_tokens.clear();
  free_.push_back(id.index);
  live_ -= 1;
}

}  // namespace kvtier
