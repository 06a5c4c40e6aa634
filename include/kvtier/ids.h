// Handles to sequences and blocks. Both are a dense index plus a generation: an id whose slot
// has since been released and reused fails every call (NotFound) instead of aliasing.
#ifndef KVTIER_IDS_H_
#define KVTIER_IDS_H_

#include <cstdint>

namespace kvtier {

struct SequenceId {
  uint32_t index = 0;
  uint32_t generation = 0;  // 0 is never issued, so a default-constructed id is invalid.

  friend bool operator==(SequenceId a, SequenceId b) {
    return a.index == b.index && a.generation == b.generation;
  }
  friend bool operator!=(SequenceId a, SequenceId b) { return !(a == b); }
};

// A logical block: `block_tokens` consecutive tokens of one sequence across all layers, K and
// V. Its id is stable for the block's whole life while its physical page may move.
struct BlockId {
  uint32_t index = 0;
  uint32_t generation = 0;

  friend bool operator==(BlockId a, BlockId b) {
    return a.index == b.index && a.generation == b.generation;
  }
  friend bool operator!=(BlockId a, BlockId b) { return !(a == b); }
};

}  // namespace kvtier

#endif  // KVTIER_IDS_H_
