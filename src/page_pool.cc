#include "src/page_pool.h"

#include <algorithm>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"

namespace kvtier {

PagePool::PagePool(uint32_t page_bytes, size_t slab_bytes, uint32_t num_slots)
    : page_bytes_(page_bytes),
      slab_bytes_(slab_bytes),
      slab_shift_(absl::has_single_bit(slab_bytes) ? absl::countr_zero(slab_bytes) : 0),
      slots_(num_slots) {
  slot_begin_.resize(num_slots);
  slot_end_.resize(num_slots);
  uint32_t max_pages = 0;
  for (uint32_t s = 0; s < num_slots; ++s) {
    slot_begin_[s] = static_cast<uint32_t>((s * slab_bytes + page_bytes - 1) / page_bytes);
    slot_end_[s] = static_cast<uint32_t>((s + 1) * slab_bytes / page_bytes);
    min_pages_per_slot_ = std::min(min_pages_per_slot_, PagesInSlot(s));
    max_pages = std::max(max_pages, PagesInSlot(s));
  }
  next_free_.assign(capacity_pages(), kNone);
  owner_.assign(capacity_pages(), kNone);
  buckets_.assign(max_pages + 1, kNone);
  nonempty_.assign(max_pages / 64 + 1, 0);
  empty_.reserve(num_slots);
  unmapped_.reserve(num_slots);
  for (uint32_t s = num_slots; s-- > 0;) unmapped_.push_back(s);
}

uint32_t PagePool::SlotOfPage(uint32_t page) const {
  const size_t byte = static_cast<size_t>(page) * page_bytes_;
  return static_cast<uint32_t>(slab_shift_ != 0 ? byte >> slab_shift_ : byte / slab_bytes_);
}

uint32_t PagePool::UnmappedSlot() const { return unmapped_.empty() ? kNone : unmapped_.back(); }

void PagePool::AddSlot(uint32_t slot) {
  unmapped_.pop_back();
  Slot& s = slots_[slot];
  s.mapped = true;
  s.used = 0;
  s.free_head = kNone;
  for (uint32_t p = slot_end_[slot]; p-- > slot_begin_[slot];) {
    next_free_[p] = s.free_head;
    s.free_head = p;
  }
  PushEmpty(slot);
  mapped_slots_ += 1;
  mapped_pages_ += PagesInSlot(slot);
  free_pages_ += PagesInSlot(slot);
}

void PagePool::RemoveSlot(uint32_t slot, bool reusable) {
  PopEmpty(slot);
  Slot& s = slots_[slot];
  s.mapped = false;
  s.free_head = kNone;
  if (reusable) unmapped_.push_back(slot);
  mapped_slots_ -= 1;
  mapped_pages_ -= PagesInSlot(slot);
  free_pages_ -= PagesInSlot(slot);
}

inline void PagePool::Link(uint32_t slot) {
  const uint32_t b = FreeCount(slot);
  Slot& s = slots_[slot];
  s.prev = kNone;
  s.next = buckets_[b];
  if (s.next != kNone) slots_[s.next].prev = slot;
  buckets_[b] = slot;
  nonempty_[b / 64] |= uint64_t{1} << (b % 64);
  linked_slots_ += 1;
}

inline void PagePool::Unlink(uint32_t slot) {
  const uint32_t b = FreeCount(slot);
  Slot& s = slots_[slot];
  if (s.prev != kNone) {
    slots_[s.prev].next = s.next;
  } else {
    buckets_[b] = s.next;
    if (s.next == kNone) nonempty_[b / 64] &= ~(uint64_t{1} << (b % 64));
  }
  if (s.next != kNone) slots_[s.next].prev = s.prev;
  s.prev = s.next = kNone;
  linked_slots_ -= 1;
}

uint32_t PagePool::FewestFreeBucket() const {
  if (linked_slots_ == 0) return kNone;  // the common case: one partly used slot, current_
  for (size_t w = 0; w < nonempty_.size(); ++w) {
    if (nonempty_[w] != 0) return static_cast<uint32_t>(w * 64 + __builtin_ctzll(nonempty_[w]));
  }
  return kNone;
}

void PagePool::Settle() {
  if (current_ == kNone) return;
  Link(current_);
  current_ = kNone;
}

uint32_t PagePool::Allocate(uint32_t owner) {
  if (current_ == kNone) {
    const uint32_t bucket = FewestFreeBucket();
    if (bucket != kNone) {
      current_ = buckets_[bucket];
      Unlink(current_);
    } else {
      current_ = empty_.back();
      PopEmpty(current_);
    }
  }
  Slot& s = slots_[current_];
  reclaimable_slots_ -= Reclaimable(s);
  const uint32_t page = s.free_head;
  s.free_head = next_free_[page];
  s.used += 1;
  if (s.used == PagesInSlot(current_)) current_ = kNone;  // full: in no bucket
  free_pages_ -= 1;
  owner_[page] = owner;
  return page;
}

uint32_t PagePool::AllocateOutside(uint32_t owner, uint32_t slot) {
  Settle();
  Unlink(slot);  // its free count is unchanged below, so it links back to the same bucket
  const uint32_t page = Allocate(owner);
  Settle();  // the slot Allocate took from may hold more free pages than `slot`
  Link(slot);
  return page;
}

uint32_t PagePool::EmptiestSlot() const {
  for (size_t w = nonempty_.size(); w-- > 0;) {
    if (nonempty_[w] != 0) return buckets_[w * 64 + 63 - __builtin_clzll(nonempty_[w])];
  }
  return current_;  // the fullest partly used slot is the emptiest only when it is the only one
}

uint32_t PagePool::ScatteredFreePages() const {
  uint32_t in_empty = 0;
  for (uint32_t slot : empty_) in_empty += PagesInSlot(slot);
  return free_pages_ - in_empty;
}

void PagePool::Free(uint32_t page) {
  const uint32_t slot = SlotOfPage(page);
  Slot& s = slots_[slot];
  if (slot != current_ && s.used < PagesInSlot(slot)) Unlink(slot);
  reclaimable_slots_ -= Reclaimable(s);
  if (owner_[page] == kPending) {
    s.pending -= 1;
    pending_pages_ -= 1;
  }
  next_free_[page] = s.free_head;
  s.free_head = page;
  s.used -= 1;
  reclaimable_slots_ += Reclaimable(s);
  owner_[page] = kNone;
  free_pages_ += 1;
  if (s.used == 0) {
    if (slot == current_) current_ = kNone;
    PushEmpty(slot);
  } else if (slot == current_) {
    if (FewestFreeBucket() < FreeCount(slot)) Settle();  // no longer the fullest
  } else {
    Link(slot);
    if (current_ != kNone && FreeCount(slot) < FreeCount(current_)) Settle();
  }
}

void PagePool::Retire(uint32_t page) {
  Slot& s = slots_[SlotOfPage(page)];
  reclaimable_slots_ -= Reclaimable(s);
  owner_[page] = kPending;
  s.pending += 1;
  pending_pages_ += 1;
  reclaimable_slots_ += Reclaimable(s);
}

void PagePool::PushEmpty(uint32_t slot) {
  slots_[slot].empty_index = static_cast<uint32_t>(empty_.size());
  empty_.push_back(slot);
}

void PagePool::PopEmpty(uint32_t slot) {
  const uint32_t i = slots_[slot].empty_index;
  empty_[i] = empty_.back();
  slots_[empty_[i]].empty_index = i;
  empty_.pop_back();
  slots_[slot].empty_index = kNone;
}

absl::Status PagePool::CheckConsistency() const {
  uint32_t free_total = 0, mapped_pages = 0, mapped_slots = 0, pending_total = 0, reclaimable = 0;
  uint32_t bucketed = 0, fewest_bucketed = kNone;  // partly used slots but current_
  for (uint32_t slot = 0; slot < num_slots(); ++slot) {
    const Slot& s = slots_[slot];
    uint32_t free_here = 0;
    for (uint32_t p = s.free_head; p != kNone; p = next_free_[p]) {
      if (p < slot_begin_[slot] || p >= slot_end_[slot] || owner_[p] != kNone) {
        return absl::InternalError(absl::StrCat("slot ", slot, ": free page ", p, " is misplaced"));
      }
      if (++free_here > PagesInSlot(slot)) {
        return absl::InternalError(absl::StrCat("slot ", slot, ": free list has a cycle"));
      }
    }
    uint32_t owned = 0, pending = 0;
    for (uint32_t p = slot_begin_[slot]; p < slot_end_[slot]; ++p) {
      owned += owner_[p] != kNone;
      pending += owner_[p] == kPending;
    }
    if (pending != s.pending) {
      return absl::InternalError(absl::StrCat("slot ", slot, ": ", pending, " pending pages, counted ",
                                              s.pending));
    }
    pending_total += pending;
    reclaimable += Reclaimable(s);
    if (!s.mapped) {
      if (owned != 0 || free_here != 0) {
        return absl::InternalError(absl::StrCat("slot ", slot, " is unmapped but has pages"));
      }
      continue;
    }
    mapped_slots += 1;
    mapped_pages += PagesInSlot(slot);
    free_total += free_here;
    if (owned != s.used || owned + free_here != PagesInSlot(slot)) {
      return absl::InternalError(absl::StrCat("slot ", slot, ": used ", s.used, ", owned ", owned,
                                              ", free ", free_here, " of ", PagesInSlot(slot)));
    }
    const bool empty = s.used == 0, full = FreeCount(slot) == 0;
    if (empty != (s.empty_index != kNone)) {
      return absl::InternalError(absl::StrCat("slot ", slot, ": empty-list membership is wrong"));
    }
    if (!empty && !full && slot != current_) {
      bucketed += 1;
      fewest_bucketed = std::min(fewest_bucketed, FreeCount(slot));
    }
  }
  if (current_ != kNone &&
      (current_ >= num_slots() || !slots_[current_].mapped || slots_[current_].used == 0 ||
       FreeCount(current_) == 0 || FreeCount(current_) > fewest_bucketed)) {
    return absl::InternalError(absl::StrCat("slot ", current_, " is allocated from but is not ",
                                            "the fullest partly used slot"));
  }
  if (free_total != free_pages_ || mapped_pages != mapped_pages_ || mapped_slots != mapped_slots_ ||
      pending_total != pending_pages_ || reclaimable != reclaimable_slots_) {
    return absl::InternalError("pool totals disagree with its slots");
  }
  return CheckBuckets(bucketed);
}

absl::Status PagePool::CheckBuckets(uint32_t bucketed) const {
  uint32_t linked = 0;
  for (uint32_t b = 0; b < buckets_.size(); ++b) {
    if (((nonempty_[b / 64] >> (b % 64)) & 1) != (buckets_[b] != kNone)) {
      return absl::InternalError(absl::StrCat("bucket ", b, ": its bit disagrees with its list"));
    }
    for (uint32_t slot = buckets_[b], prev = kNone; slot != kNone;
         prev = slot, slot = slots_[slot].next) {
      if (slot >= num_slots() || slot == current_ || !slots_[slot].mapped || b == 0 ||
          b == PagesInSlot(slot) || FreeCount(slot) != b || slots_[slot].prev != prev ||
          ++linked > bucketed) {
        return absl::InternalError(absl::StrCat("bucket ", b, " holds slot ", slot,
                                                ", which does not belong there"));
      }
    }
  }
  // Every entry is a distinct partly used slot (a slot sits in the one bucket of its count, and
  // a list that repeats one runs past `bucketed`): equal counts mean each is linked once.
  if (linked != bucketed || linked != linked_slots_) {
    return absl::InternalError(absl::StrCat(linked, " slots in buckets, ", bucketed,
                                            " partly used, ", linked_slots_, " counted"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
