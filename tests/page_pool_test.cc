#include "src/page_pool.h"

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

constexpr size_t kSlab = size_t{2} << 20;

TEST(PagePoolTest, PagesNeverStraddleSlabs) {
  const uint32_t page_bytes = 18688;  // NVFP4 per (block, head): does not divide 2 MiB
  PagePool pool(page_bytes, kSlab, 3);
  for (uint32_t s = 0; s < 3; ++s) {
    const uint64_t begin = uint64_t{pool.FirstPage(s)} * page_bytes;
    const uint64_t end = uint64_t{pool.FirstPage(s) + pool.PagesInSlot(s)} * page_bytes;
    EXPECT_GE(begin, s * kSlab);
    EXPECT_LE(end, (s + 1) * kSlab);
    EXPECT_GE(pool.PagesInSlot(s), kSlab / page_bytes - 1);
    EXPECT_EQ(pool.SlotOfPage(pool.FirstPage(s)), s);
  }
  EXPECT_EQ(pool.MinPagesPerSlot(), 111u);  // slots 1 and 2 lose a straddling page
}

// Every page maps to the slot that holds it, for slabs of a power of two (SlotOfPage shifts)
// and of other multiples of 2 MiB (it divides).
TEST(PagePoolTest, EveryPageKnowsItsSlot) {
  for (const size_t slab : {kSlab, 3 * kSlab, 4 * kSlab}) {
    for (const uint32_t page_bytes : {18688u, 65536u}) {
      PagePool pool(page_bytes, slab, 5);
      for (uint32_t s = 0; s < 5; ++s) {
        for (uint32_t p = pool.FirstPage(s); p < pool.FirstPage(s) + pool.PagesInSlot(s); ++p) {
          ASSERT_EQ(pool.SlotOfPage(p), s) << "slab " << slab << ", page " << p << " of "
                                           << page_bytes << " bytes";
        }
      }
    }
  }
}

TEST(PagePoolTest, AllocatesFromTheFullestSlab) {
  PagePool pool(kSlab / 4, kSlab, 3);  // 4 pages per slab
  pool.AddSlot(pool.UnmappedSlot());
  pool.AddSlot(pool.UnmappedSlot());
  std::vector<uint32_t> pages;
  for (int i = 0; i < 8; ++i) pages.push_back(pool.Allocate(100 + i));
  EXPECT_EQ(pool.free_pages(), 0u);
  // Free one page in slot 0 and three in slot 1: the next allocation drains slot 0's hole,
  // the fuller slab, and leaves slot 1 to empty out.
  pool.Free(pages[0]);
  pool.Free(pages[4]);
  pool.Free(pages[5]);
  pool.Free(pages[6]);
  EXPECT_EQ(pool.SlotOfPage(pool.Allocate(7)), pool.SlotOfPage(pages[0]));
  pool.Free(pages[7]);
  EXPECT_EQ(pool.empty_slots(), 1u);
  const uint32_t empty = pool.EmptySlot();
  pool.RemoveSlot(empty);
  EXPECT_EQ(pool.mapped_slots(), 1u);
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

TEST(PagePoolTest, ASlotRemovedForGoodIsNeverMappedAgain) {
  PagePool pool(kSlab / 4, kSlab, 3);
  const uint32_t first = pool.UnmappedSlot();
  pool.AddSlot(first);
  pool.RemoveSlot(first, /*reusable=*/false);
  EXPECT_NE(pool.UnmappedSlot(), first);
  pool.DropUnmappedSlot();  // the second, as if its failed map could not be undone
  const uint32_t last = pool.UnmappedSlot();
  pool.AddSlot(last);
  EXPECT_EQ(pool.UnmappedSlot(), PagePool::kNone);  // one of three slots left to use
  EXPECT_EQ(pool.mapped_slots(), 1u);
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

TEST(PagePoolTest, FindsTheEmptiestSlabAndAllocatesOutsideIt) {
  PagePool pool(kSlab / 4, kSlab, 4);  // 4 pages per slab
  for (int s = 0; s < 3; ++s) pool.AddSlot(pool.UnmappedSlot());
  EXPECT_EQ(pool.EmptiestSlot(), PagePool::kNone);  // empty slabs are not "partly used"
  EXPECT_EQ(pool.ScatteredFreePages(), 0u);
  std::vector<uint32_t> pages;
  for (int i = 0; i < 8; ++i) pages.push_back(pool.Allocate(100 + i));  // two full slabs
  pool.Free(pages[1]);  // slab A: 3 used
  pool.Free(pages[4]);  // slab B: 1 used
  pool.Free(pages[5]);
  pool.Free(pages[6]);
  const uint32_t b = pool.SlotOfPage(pages[4]);
  EXPECT_EQ(pool.EmptiestSlot(), b);
  EXPECT_EQ(pool.ScatteredFreePages(), 4u);  // not the 4 of the empty third slab
  // Both partly used slabs hold 3 free pages now; allocation outside B never lands in it.
  pool.Free(pages[2]);
  pool.Free(pages[3]);
  EXPECT_NE(pool.SlotOfPage(pool.AllocateOutside(200, b)), b);
  EXPECT_NE(pool.SlotOfPage(pool.AllocateOutside(201, b)), b);
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

TEST(PagePoolTest, OwnersAndCounts) {
  PagePool pool(8192, kSlab, 2);
  EXPECT_EQ(pool.capacity_pages(), 512u);
  pool.AddSlot(pool.UnmappedSlot());
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < 256; ++i) {
    const uint32_t p = pool.Allocate(i);
    EXPECT_TRUE(seen.insert(p).second);
    EXPECT_EQ(pool.Owner(p), i);
  }
  EXPECT_EQ(pool.used_pages(), 256u);
  pool.Retire(*seen.begin());
  EXPECT_EQ(pool.pending_pages(), 1u);
  pool.Free(*seen.begin());
  EXPECT_EQ(pool.Owner(*seen.begin()), PagePool::kNone);
  EXPECT_EQ(pool.pending_pages(), 0u);
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

// A slot whose used pages are all retired is counted reclaimable: empty once they are freed.
TEST(PagePoolTest, CountsSlotsThatReclamationWouldEmpty) {
  PagePool pool(8192, kSlab, 2);  // 256 pages per slot
  pool.AddSlot(pool.UnmappedSlot());
  std::vector<uint32_t> pages;
  for (uint32_t i = 0; i < 3; ++i) pages.push_back(pool.Allocate(i));
  pool.Retire(pages[0]);
  pool.Retire(pages[1]);
  EXPECT_EQ(pool.pending_pages(), 2u);
  EXPECT_EQ(pool.reclaimable_slots(), 0u);  // one page still owned
  pool.Free(pages[2]);
  EXPECT_EQ(pool.reclaimable_slots(), 1u);
  const uint32_t again = pool.Allocate(7);  // the slot has owned pages again
  EXPECT_EQ(pool.reclaimable_slots(), 0u);
  pool.Retire(again);
  EXPECT_EQ(pool.reclaimable_slots(), 1u);
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
  for (uint32_t p : {pages[0], pages[1], again}) pool.Free(p);
  EXPECT_EQ(pool.reclaimable_slots(), 0u);
  EXPECT_EQ(pool.empty_slots(), 1u);
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

// Free pages of a mapped slot, counted from the owners alone.
uint32_t FreeIn(const PagePool& pool, uint32_t slot) {
  uint32_t n = 0;
  for (uint32_t p = pool.FirstPage(slot); p < pool.FirstPage(slot) + pool.PagesInSlot(slot); ++p) {
    n += pool.Owner(p) == PagePool::kNone;
  }
  return n;
}

// Random allocations, frees, retirements, compaction moves and slab changes, in phases that fill
// the pool and drain it again. Every allocation comes from a fullest partly used slab (an empty
// one only when there is none), the emptiest slab is one with the most free pages, and the pool
// stays consistent after each step.
void CheckRandomOperations(uint32_t page_bytes, uint32_t seed) {
  constexpr uint32_t kSlots = 6;
  PagePool pool(page_bytes, kSlab, kSlots);
  std::mt19937 rng(seed);
  std::vector<uint32_t> used;
  auto partly_used = [&](uint32_t slot) {
    const uint32_t free = pool.IsMapped(slot) ? FreeIn(pool, slot) : 0;
    return free > 0 && free < pool.PagesInSlot(slot);
  };
  // `page` was just allocated, outside `outside`: judge the choice on the counts before it.
  auto expect_fullest = [&](uint32_t page, uint32_t outside, uint32_t owner) {
    pool.SetOwnerForTest(page, PagePool::kNone);
    uint32_t fewest = PagePool::kNone;
    for (uint32_t s = 0; s < kSlots; ++s) {
      if (s != outside && partly_used(s)) fewest = std::min(fewest, FreeIn(pool, s));
    }
    const uint32_t slot = pool.SlotOfPage(page);
    EXPECT_NE(slot, outside);
    EXPECT_EQ(FreeIn(pool, slot), fewest == PagePool::kNone ? pool.PagesInSlot(slot) : fewest)
        << "slot " << slot;
    pool.SetOwnerForTest(page, owner);
  };
  for (int step = 0; step < 6000; ++step) {
    const bool filling = (step / 300) % 2 == 0;
    const int r = static_cast<int>(rng() % 16);
    if (r < (filling ? 10 : 3)) {  // allocate, mapping a slab when none is free
      if (pool.free_pages() == 0) {
        if (pool.UnmappedSlot() == PagePool::kNone) continue;
        pool.AddSlot(pool.UnmappedSlot());
      }
      const uint32_t page = pool.Allocate(1);
      expect_fullest(page, PagePool::kNone, 1);
      used.push_back(page);
    } else if (r < 13) {  // free, or retire first
      if (used.empty()) continue;
      const size_t i = rng() % used.size();
      if (rng() % 4 == 0 && pool.Owner(used[i]) != PagePool::kPending) {
        pool.Retire(used[i]);
      } else {
        pool.Free(used[i]);
        used[i] = used.back();
        used.pop_back();
      }
    } else if (r == 13) {  // a compaction move out of the emptiest slab
      const uint32_t emptiest = pool.EmptiestSlot();
      uint32_t most = 0;
      for (uint32_t s = 0; s < kSlots; ++s) {
        if (partly_used(s)) most = std::max(most, FreeIn(pool, s));
      }
      if (emptiest == PagePool::kNone) {
        EXPECT_EQ(most, 0u);
        continue;
      }
      EXPECT_EQ(FreeIn(pool, emptiest), most);
      if (pool.free_pages() == most) continue;  // no free page outside it
      const uint32_t page = pool.AllocateOutside(2, emptiest);
      expect_fullest(page, emptiest, 2);
      used.push_back(page);
    } else if (r == 14) {
      if (pool.UnmappedSlot() != PagePool::kNone) pool.AddSlot(pool.UnmappedSlot());
    } else if (pool.EmptySlot() != PagePool::kNone) {
      pool.RemoveSlot(pool.EmptySlot());
    }
    ASSERT_TRUE(pool.CheckConsistency().ok()) << "step " << step << ": " << pool.CheckConsistency();
  }
}

TEST(PagePoolTest, RandomOperationsKeepFullestFirst) {
  // 8 pages a slab; 3 and 2 in turns; one; 112 and 111.
  for (const uint32_t page_bytes : {uint32_t{kSlab / 8}, 600000u, uint32_t{kSlab}, 18688u}) {
    for (const uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(testing::Message() << page_bytes << "-byte pages, seed " << seed);
      CheckRandomOperations(page_bytes, seed);
      if (HasFatalFailure()) return;
    }
  }
}

// Compaction moving pages out of the only partly used slab, the one being allocated from: they
// land in an empty slab, and the next allocation returns to the fuller first slab.
TEST(PagePoolTest, AllocatesOutsideTheSlabItAllocatesFrom) {
  PagePool pool(kSlab / 4, kSlab, 2);  // 4 pages per slab
  pool.AddSlot(pool.UnmappedSlot());
  pool.AddSlot(pool.UnmappedSlot());
  const uint32_t slot = pool.SlotOfPage(pool.Allocate(1));
  pool.Allocate(2);
  EXPECT_EQ(pool.EmptiestSlot(), slot);
  const uint32_t moved = pool.AllocateOutside(3, slot);
  EXPECT_NE(pool.SlotOfPage(moved), slot);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
  EXPECT_EQ(pool.SlotOfPage(pool.Allocate(4)), slot);  // 2 free there, 3 in the other
  EXPECT_EQ(pool.EmptiestSlot(), pool.SlotOfPage(moved));
  EXPECT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

TEST(PagePoolTest, CheckerFindsACorruptOwner) {
  PagePool pool(8192, kSlab, 1);
  pool.AddSlot(pool.UnmappedSlot());
  const uint32_t p = pool.Allocate(5);
  pool.SetOwnerForTest(p, PagePool::kNone);  // a used page that claims to be free
  EXPECT_EQ(pool.CheckConsistency().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace kvtier
