// Bookkeeping of the pages of one format's pools: which slab slots are mapped, which pages are
// free, and which block owns each used page. Memory itself is mapped by the backend; a page
// index means the same page in every layer's pool.
//
// Page p occupies bytes [p * page_bytes, (p + 1) * page_bytes) of each layer's range, so an
// external kernel sees one base pointer and one stride. A page that would straddle two slab
// slots is never used (at most one page per slab is lost).
//
// Allocation takes a page from the fullest mapped slab that has one, so that lightly used
// slabs drain and can return to the budget. Allocation and free are O(1) amortised and never
// allocate memory.
//
// Thread-compatible.
#ifndef KVTIER_SRC_PAGE_POOL_H_
#define KVTIER_SRC_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace kvtier {

class PagePool {
 public:
  static constexpr uint32_t kNone = 0xFFFFFFFFu;     // no page / no owner
  static constexpr uint32_t kPending = 0xFFFFFFFEu;  // freed, awaiting its fence

  PagePool(uint32_t page_bytes, size_t slab_bytes, uint32_t num_slots);

  uint32_t page_bytes() const { return page_bytes_; }
  uint32_t num_slots() const { return static_cast<uint32_t>(slots_.size()); }
  // Page indices in [0, capacity_pages()) exist when their slot is mapped.
  uint32_t capacity_pages() const { return slot_end_.back(); }
  uint32_t FirstPage(uint32_t slot) const { return slot_begin_[slot]; }
  uint32_t PagesInSlot(uint32_t slot) const { return slot_end_[slot] - slot_begin_[slot]; }
  uint32_t MinPagesPerSlot() const { return min_pages_per_slot_; }
  uint32_t SlotOfPage(uint32_t page) const;

  uint32_t free_pages() const { return free_pages_; }
  // Used pages retired (owner kPending): free once their fence has passed.
  uint32_t pending_pages() const { return pending_pages_; }
  // Mapped slots whose used pages are all pending (and at least one is): empty once reclaimed.
  uint32_t reclaimable_slots() const { return reclaimable_slots_; }
  uint32_t used_pages() const { return mapped_pages_ - free_pages_; }
  uint32_t mapped_pages() const { return mapped_pages_; }
  uint32_t mapped_slots() const { return mapped_slots_; }
  uint32_t empty_slots() const { return static_cast<uint32_t>(empty_.size()); }
  bool IsMapped(uint32_t slot) const { return slots_[slot].mapped; }

  // A slot not mapped now, or kNone when every slot is mapped.
  uint32_t UnmappedSlot() const;
  // Marks `slot` mapped with all its pages free. REQUIRES: slot == UnmappedSlot() != kNone.
  void AddSlot(uint32_t slot);
  // Takes UnmappedSlot() out of use for good (its memory could not be unmapped after a failed
  // map). REQUIRES: UnmappedSlot() != kNone.
  void DropUnmappedSlot() { unmapped_.pop_back(); }
  // A mapped slot with no used page, or kNone.
  uint32_t EmptySlot() const { return empty_.empty() ? kNone : empty_.back(); }
  // Marks an empty slot unmapped. AddSlot maps it again unless `reusable` is false (its memory
  // could not be unmapped: it stays out of use). REQUIRES: `slot` is mapped and empty.
  void RemoveSlot(uint32_t slot, bool reusable = true);

  // A free page of the fullest slab that has one, now owned by `owner`.
  // REQUIRES: free_pages() > 0.
  uint32_t Allocate(uint32_t owner);
  // Allocate's page taken from any slab but `slot`. REQUIRES: `slot` is partly used; a free page
  // outside it.
  uint32_t AllocateOutside(uint32_t owner, uint32_t slot);
  // The partly used slot with the most free pages, or kNone.
  uint32_t EmptiestSlot() const;
  // Free pages in partly used slots (not in empty ones): what compaction could gather.
  uint32_t ScatteredFreePages() const;
  // Returns a used page to its slab. REQUIRES: the page is used (owned or pending).
  void Free(uint32_t page);
  // Marks an owned page pending (retired, awaiting its fence). REQUIRES: owned by a block.
  void Retire(uint32_t page);

  // The owner of a page: a block index, kPending, or kNone when free or unmapped.
  uint32_t Owner(uint32_t page) const { return owner_[page]; }
  // Overwrites an owner without bookkeeping: for tests that corrupt a pool on purpose.
  void SetOwnerForTest(uint32_t page, uint32_t owner) { owner_[page] = owner; }

  // Verifies free lists, per-slot counts and bucket membership. O(pages).
  absl::Status CheckConsistency() const;

 private:
  struct Slot {
    bool mapped = false;
    uint32_t used = 0;
    uint32_t pending = 0;  // of the used pages
    uint32_t free_head = kNone;  // free pages linked through next_free_
    uint32_t prev = kNone;       // neighbours in the bucket of slots with equal free count
    uint32_t next = kNone;
    uint32_t empty_index = kNone;  // position in empty_ while empty
  };

  uint32_t FreeCount(uint32_t slot) const { return PagesInSlot(slot) - slots_[slot].used; }
  static bool Reclaimable(const Slot& s) { return s.used > 0 && s.pending == s.used; }
  // Partially used slots live in buckets_[free count], but for current_; empty and full slots in
  // none.
  void Link(uint32_t slot);
  void Unlink(uint32_t slot);
  // The smallest free count of a bucketed slot, or kNone.
  uint32_t FewestFreeBucket() const;
  // Links current_ back into its bucket; no slot is allocated from until the next Allocate.
  void Settle();
  void PushEmpty(uint32_t slot);
  // CheckConsistency's part for the buckets, given the partly used slots other than current_.
  absl::Status CheckBuckets(uint32_t bucketed) const;
  void PopEmpty(uint32_t slot);

  uint32_t page_bytes_;
  uint32_t min_pages_per_slot_ = kNone;
  size_t slab_bytes_;
  int slab_shift_;  // log2(slab_bytes_) when a power of two (SlotOfPage shifts), else 0
  std::vector<uint32_t> slot_begin_;       // [slots] first page inside the slot
  std::vector<uint32_t> slot_end_;         // [slots] one past its last page
  std::vector<Slot> slots_;
  std::vector<uint32_t> next_free_;        // [capacity_pages]
  std::vector<uint32_t> owner_;            // [capacity_pages]
  std::vector<uint32_t> buckets_;          // head slot per free count
  std::vector<uint64_t> nonempty_;         // bit per bucket
  std::vector<uint32_t> empty_;            // mapped slots with no used page
  std::vector<uint32_t> unmapped_;         // stack of unmapped slots
  // The slot Allocate takes from while it stays the fullest: kept out of the buckets, so that
  // allocations and frees within it move no bucket. kNone, or a partly used slot whose free
  // count is at most every bucketed slot's.
  uint32_t current_ = kNone;
  uint32_t linked_slots_ = 0;  // slots in buckets
  uint32_t free_pages_ = 0;
  uint32_t pending_pages_ = 0;
  uint32_t reclaimable_slots_ = 0;
  uint32_t mapped_pages_ = 0;
  uint32_t mapped_slots_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_PAGE_POOL_H_
