// Compaction, the last part of EndStep's policy work. Pools grow by whole slabs and return a slab
// only when every page in it is free, so a pool whose use has fallen keeps its free pages
// scattered over partly used slabs, and another format cannot grow even though the budget has
// room: in `kvtier simulate` the NVFP4 pool held tens of slabs' worth of free pages while the FP16
// pool could not take the next prefill chunk. When no slab of the budget is free or empty, a pool
// whose scattered free pages add up to its emptiest partly used slab moves that slab's blocks
// into them (a same-format page copy, no requantisation) and the emptied slab returns to the
// budget at this EndStep. On an asynchronous backend that waits for the device (before deciding
// and after each slab's copies), only in the steps where compaction may run (MayCompact).
//
// Safe at EndStep for the same reason as demotion: page tables and slots are never held across a
// step, and the old pages are retired behind the step's fence.
#include <vector>

#include "src/cache_impl.h"

namespace kvtier {
namespace {

// Bounds one EndStep's copying to a few slabs per pool; the rest waits for the next step.
constexpr int kMaxCompactedSlabsPerStep = 4;

}  // namespace

bool CacheImpl::MayCompact() const {
  // With one format an emptied slab would only return to the pool it left.
  if (num_formats() < 2 || pages_->free_slabs() > 0) return false;
  // What compaction can gather once every retired page is back is at most the scattered free
  // pages plus the pending ones; the same test on every backend, since the pages pending on an
  // asynchronous backend are already free on a synchronous one.
  bool gatherable = false;
  for (int f = 0; f < num_formats(); ++f) {
    const PagePool& pool = pages_->pool(f);
    if (pool.empty_slots() > 0) return false;  // MapSlabs takes an empty slab of another pool
    gatherable |= pool.ScatteredFreePages() + pool.pending_pages() >= pool.MinPagesPerSlot();
  }
  return gatherable;
}

void CacheImpl::CompactPools() {
  if (!MayCompact()) return;
  // Decide on the state with every retired page back, which is the same on every backend (on an
  // asynchronous one this waits for the device), and wait again after each slab's copies, so that
  // it leaves the same pages and slabs on every backend (CudaStressTest compares them). A failed
  // wait or copy moves nothing more: compaction is an optimisation, retried at the next step.
  if (!pages_->ReclaimAll().ok() || !pages_->ReturnEmptySlabs().ok() || !MayCompact()) return;
  for (int f = 0; f < num_formats(); ++f) {
    for (int n = 0; n < kMaxCompactedSlabsPerStep; ++n) {
      const PagePool& pool = pages_->pool(f);
      const uint32_t slot = pool.EmptiestSlot();
      if (slot == PagePool::kNone || pool.ScatteredFreePages() < pool.PagesInSlot(slot)) break;
      if (!CompactSlot(f, slot).ok() || !pages_->ReclaimAll().ok()) return;
    }
  }
  pages_->ReturnEmptySlabs().IgnoreError();  // a slab that failed to unmap stays in its pool
}

absl::Status CacheImpl::CompactSlot(int format, uint32_t slot) {
  const PagePool& pool = pages_->pool(format);
  std::vector<uint32_t> blocks, src, dst;
  const uint32_t first = pool.FirstPage(slot);
  for (uint32_t page = first; page < first + pool.PagesInSlot(slot); ++page) {
    const uint32_t owner = pool.Owner(page);
    if (owner == PagePool::kNone || owner == PagePool::kPending) continue;
    blocks.push_back(owner);
    src.push_back(page);
  }
  for (uint32_t b : blocks) dst.push_back(pages_->AllocateOutside(format, b, slot));
  std::vector<PoolView> views;
  for (int l = 0; l < options_.geometry.num_layers; ++l) views.push_back(pages_->View(format, l));
  if (absl::Status s = backend_->CopyPages(views, views, src, dst); !s.ok()) {
    for (uint32_t page : dst) pages_->FreeNow(format, page);
    return s;
  }
  for (size_t i = 0; i < blocks.size(); ++i) pool_.MoveToPage(blocks[i], format, dst[i]);
  metrics_.compacted_pages += static_cast<int64_t>(blocks.size());
  return absl::OkStatus();
}

}  // namespace kvtier
