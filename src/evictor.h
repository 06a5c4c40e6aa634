// The set of evictable blocks and the order in which they go: cached blocks that no sequence
// references, that are in the prefix index and that have no cached child (leaf-first eviction
// is the caller's invariant: it adds a block only when it is such a leaf, and removes it when
// it gains a reference or a cached child).
//
// Blocks sit in kLevels priority levels; level 0 is evicted first. Within a level the order is
// LRU: Add puts a block at the evict-last end, AddColdest at the evict-first end (for a parent
// that became a leaf because its child was just evicted: the rest of a cold chain goes next).
//
// Expiry. A block added at level >= 1 with `expires_at` counts as level 0 from the moment
// now >= expires_at, ahead of every block added to level 0 (it has been idle for at least its
// whole TTL, usually longer than the blocks that plain LRU still holds). Expiry is checked
// lazily at the head (evict-first end) of each level, so PopVictim is O(kLevels) with no
// timers. The guarantee, precisely: PopVictim(now) returns
//   1. among the blocks that are at the head of a level >= 1 and have expires_at <= now, the
//      one with the smallest expires_at (then the lowest level); else
//   2. the head of the lowest non-empty level.
// An expired block is never missed when, within each level, expiry is nondecreasing from head
// to tail: for example when every block of a level gets the same TTL (expires_at = now + ttl)
// from a nondecreasing `now`. Otherwise a block whose expiry has passed behind an unexpired
// one is demoted late (when it reaches the head), never early. Add with expires_at <= now puts
// the block at level 0 directly. Blocks added at level 0 ignore expiry.
//
// Memory. The Evictor owns one 16-byte EvictorNode per block (two 32-bit index links and the
// expiry; four per cache line), plus one sentinel node per level, allocated in the
// constructor. No operation allocates afterwards, and every one but PopVictim and
// CheckConsistency is O(1); PopVictim is O(kLevels).
//
// Thread-compatible.
#ifndef KVTIER_SRC_EVICTOR_H_
#define KVTIER_SRC_EVICTOR_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"

namespace kvtier {

// Links of one block in its level's circular list. Indices >= capacity are level sentinels.
struct EvictorNode {
  uint32_t prev = 0xFFFFFFFFu;  // kNone while the block is not evictable
  uint32_t next = 0xFFFFFFFFu;
  int64_t expires_at = 0;  // meaningful at levels >= 1 only; Evictor::kNever for none
};
static_assert(sizeof(EvictorNode) == 16, "keep the per-block node small");

class Evictor {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;  // no block
  static constexpr int kLevels = 8;
  static constexpr int kDefaultLevel = 0;  // the plain LRU level; expired blocks join it
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  static constexpr uint32_t kMaxCapacity = kNone - kLevels;

  // Blocks are indices in [0, capacity). `now` and `expires_at` are in the caller's units of
  // a nondecreasing clock (steps, microseconds, ...). REQUIRES: capacity <= kMaxCapacity.
  explicit Evictor(uint32_t capacity);

  uint32_t capacity() const { return capacity_; }
  // Evictable blocks.
  uint32_t size() const { return size_; }
  // REQUIRES: block < capacity().
  bool Contains(uint32_t block) const { return nodes_[block].next != kNone; }

  // Makes `block` evictable at the evict-last end of `level`, or of level 0 when level >= 1
  // and expires_at <= now. REQUIRES: block < capacity(), !Contains(block),
  // 0 <= level < kLevels.
  void Add(uint32_t block, int level, int64_t now, int64_t expires_at = kNever);
  // As Add, at the evict-first end of `level` (there is no `now`: an expiry already past
  // makes it the next victim by rule 1). Give a block put at the head of an expiring level an
  // expiry too (its child's), or it holds back the expiry of the blocks behind it.
  void AddColdest(uint32_t block, int level, int64_t expires_at = kNever);
  // Makes `block` not evictable. REQUIRES: Contains(block).
  void Remove(uint32_t block);

  // Removes and returns the next block to evict (see the guarantee above), or kNone when
  // there is none.
  uint32_t PopVictim(int64_t now);

  // Verifies links, membership flags and counts. O(capacity).
  absl::Status CheckConsistency() const;

 private:
  uint32_t Sentinel(int level) const { return capacity_ + static_cast<uint32_t>(level); }
  // Links `block` after `at` (at may be a sentinel).
  void LinkAfter(uint32_t at, uint32_t block, int64_t expires_at);
  void Unlink(uint32_t block);

  uint32_t capacity_;
  std::vector<EvictorNode> nodes_;  // [capacity + kLevels], sentinels last
  uint32_t size_ = 0;
  uint32_t expiring_ = 0;  // listed blocks with expires_at != kNever (all at levels >= 1)
};

}  // namespace kvtier

#endif  // KVTIER_SRC_EVICTOR_H_
