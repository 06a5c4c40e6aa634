// The prefix index: block identity hash (src/prefix_hash.h) -> index of the cached block that
// holds it. One entry per cached full block; a lookup walks a prompt's hash chain block by
// block and stops at the first miss.
//
// Keys are already uniformly distributed XXH3 values, so the table uses them as their own hash
// (the Swiss table takes its probe position and control byte from different bits).
//
// Thread-compatible.
#ifndef KVTIER_SRC_PREFIX_INDEX_H_
#define KVTIER_SRC_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"

namespace kvtier {

class PrefixIndex {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;  // no block

  PrefixIndex() = default;

  // Makes room for `n` entries, so that inserting up to `n` allocates nothing more.
  void Reserve(size_t n) { map_.reserve(n); }
  size_t size() const { return map_.size(); }

  // The block with identity `hash`, or kNone.
  uint32_t Find(uint64_t hash) const;
  // Maps `hash` to `block`. False, with nothing changed, when `hash` is already present.
  // REQUIRES: block != kNone.
  bool Insert(uint64_t hash, uint32_t block);
  // Removes `hash`. False when it was absent.
  bool Erase(uint64_t hash);

 private:
  struct PassThroughHash {
    size_t operator()(uint64_t hash) const { return static_cast<size_t>(hash); }
  };

  absl::flat_hash_map<uint64_t, uint32_t, PassThroughHash> map_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_PREFIX_INDEX_H_
