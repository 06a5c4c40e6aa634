#include "src/evictor.h"

#include "absl/strings/str_cat.h"

namespace kvtier {

Evictor::Evictor(uint32_t capacity) : capacity_(capacity), nodes_(capacity + kLevels) {
  for (int level = 0; level < kLevels; ++level) {
    EvictorNode& s = nodes_[Sentinel(level)];
    s.prev = s.next = Sentinel(level);
    s.expires_at = kNever;
  }
}

void Evictor::LinkAfter(uint32_t at, uint32_t block, int64_t expires_at) {
  EvictorNode& n = nodes_[block];
  n.prev = at;
  n.next = nodes_[at].next;
  n.expires_at = expires_at;
  nodes_[n.next].prev = block;
  nodes_[at].next = block;
  size_ += 1;
  if (expires_at != kNever) expiring_ += 1;
}

void Evictor::Unlink(uint32_t block) {
  EvictorNode& n = nodes_[block];
  nodes_[n.prev].next = n.next;
  nodes_[n.next].prev = n.prev;
  n.prev = n.next = kNone;
  size_ -= 1;
  if (n.expires_at != kNever) expiring_ -= 1;
}

void Evictor::Add(uint32_t block, int level, int64_t now, int64_t expires_at) {
  if (level == 0 || expires_at <= now) {
    level = 0;
    expires_at = kNever;
  }
  // The tail of a circular list is its sentinel's prev.
  LinkAfter(nodes_[Sentinel(level)].prev, block, expires_at);
}

void Evictor::AddColdest(uint32_t block, int level, int64_t expires_at) {
  LinkAfter(Sentinel(level), block, level == 0 ? kNever : expires_at);
}

void Evictor::Remove(uint32_t block) { Unlink(block); }

uint32_t Evictor::PopVictim(int64_t now) {
  uint32_t victim = kNone;
  if (expiring_ > 0) {
    int64_t earliest = kNever;
    for (int level = 1; level < kLevels; ++level) {
      const uint32_t head = nodes_[Sentinel(level)].next;
      if (head < capacity_ && nodes_[head].expires_at <= now &&
          (victim == kNone || nodes_[head].expires_at < earliest)) {
        victim = head;
        earliest = nodes_[head].expires_at;
      }
    }
  }
  for (int level = 0; victim == kNone && level < kLevels; ++level) {
    const uint32_t head = nodes_[Sentinel(level)].next;
    if (head < capacity_) victim = head;
  }
  if (victim != kNone) Unlink(victim);
  return victim;
}

absl::Status Evictor::CheckConsistency() const {
  uint32_t listed = 0;
  uint32_t expiring = 0;
  for (int level = 0; level < kLevels; ++level) {
    const uint32_t sentinel = Sentinel(level);
    uint32_t prev = sentinel;
    for (uint32_t b = nodes_[sentinel].next; b != sentinel; prev = b, b = nodes_[b].next) {
      if (b >= capacity_) {
        return absl::InternalError(absl::StrCat("evictor level ", level, " links to ", b));
      }
      if (nodes_[b].prev != prev) {
        return absl::InternalError(
            absl::StrCat("evictor block ", b, " has prev ", nodes_[b].prev, ", expected ", prev));
      }
      if (++listed > size_) {
        return absl::InternalError(absl::StrCat("evictor lists more than its size ", size_));
      }
      if (nodes_[b].expires_at != kNever) {
        if (level == 0) {
          return absl::InternalError(absl::StrCat("evictor block ", b, " expires at level 0"));
        }
        expiring += 1;
      }
    }
    if (nodes_[sentinel].prev != prev) {
      return absl::InternalError(absl::StrCat("evictor level ", level, " has a bad tail"));
    }
  }
  uint32_t marked = 0;
  for (uint32_t b = 0; b < capacity_; ++b) {
    if (Contains(b)) marked += 1;
  }
  if (listed != size_ || marked != size_ || expiring != expiring_) {
    return absl::InternalError(absl::StrCat("evictor size ", size_, " but ", listed, " listed and ",
                                            marked, " marked; ", expiring_, " expiring but ",
                                            expiring, " listed"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
