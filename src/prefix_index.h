// The prefix index: block identity hash (src/prefix_hash.h) -> index of the cached block that
// holds it. One entry per cached full block; a lookup walks a prompt's hash chain block by
// block and stops at the first miss.
//
// Keys are already uniformly distributed XXH3 values, so the table takes a key's low bits as its
// home slot: an open-addressing table with linear probing, at most half full, whose erase shifts
// the entries behind the hole back (no tombstones), so a hit is usually one compare in one cache
// line. The table grows by doubling and never shrinks.
//
// Thread-compatible.
#ifndef KVTIER_SRC_PREFIX_INDEX_H_
#define KVTIER_SRC_PREFIX_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier {

class PrefixIndex {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;  // no block

  PrefixIndex() = default;

  // Makes room for `n` entries, so that inserting up to `n` allocates nothing more.
  // REQUIRES: n < 2^60.
  void Reserve(size_t n);
  size_t size() const { return size_; }

  // The block with identity `hash`, or kNone.
  uint32_t Find(uint64_t hash) const {
    if (size_ == 0) return kNone;
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.block == kNone || e.hash == hash) return e.block;
    }
  }
  // Starts loading the slot where a Find of `hash` begins: call it for a block's identity before
  // hashing the next block, and Find it after, so the load overlaps the hashing.
  void Prefetch(uint64_t hash) const {
    if (size_ != 0) __builtin_prefetch(&slots_[hash & mask_]);
  }
  // Maps `hash` to `block`. False, with nothing changed, when `hash` is already present.
  // REQUIRES: block != kNone.
  bool Insert(uint64_t hash, uint32_t block);
  // Removes `hash`. False when it was absent.
  bool Erase(uint64_t hash);

 private:
  struct Entry {
    uint64_t hash = 0;
    uint32_t block = kNone;  // kNone: an empty slot
  };

  // The slot holding `hash`, or the empty slot where its probe ends. REQUIRES: a table.
  size_t SlotOf(uint64_t hash) const;
  // Rebuilds the table with `slots` slots (a power of two above twice the entries).
  void Rehash(size_t slots);

  std::vector<Entry> slots_;
  size_t mask_ = 0;  // slots_.size() - 1
  size_t size_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_PREFIX_INDEX_H_
