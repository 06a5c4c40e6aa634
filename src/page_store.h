// The pages of every (format, layer) pool over one slab budget: address ranges reserved once,
// slabs mapped into and out of pools, page allocation, per-tensor scales, and stream-ordered
// reclamation of freed pages (ARCHITECTURE.md decisions 2 and 9).
//
// Each palette format has one PagePool whose page index means the same page in every layer;
// each (format, layer) pool is one reserved range, so a base pointer and a stride describe it
// whatever slabs are mapped. A freed device page is retired, not freed: it returns to its pool
// once the fence of the step that freed it has passed. A host-tier page is reused at once: only
// the backend's own copies (CopyPages, Requantize) touch host-tier pages, in stream order.
//
// Thread-compatible: the cache's mutex guards it.
#ifndef KVTIER_SRC_PAGE_STORE_H_
#define KVTIER_SRC_PAGE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/options.h"
#include "kvtier/stats.h"
#include "src/backend.h"
#include "src/page_pool.h"
#include "src/reclaim_queue.h"

namespace kvtier {

class PageStore {
 public:
  // Where a store's memory lives: the device pools (memory_budget_bytes), or the host tier
  // (host_tier_bytes, Backend::ReserveHost and MapHost).
  enum class Memory : uint8_t { kDevice, kHost };

  // Reserves every (format, layer) range. `backend` must outlive the store.
  // REQUIRES: ValidateOptions(options) is OK; host_tier_bytes > 0 for Memory::kHost.
  static absl::StatusOr<std::unique_ptr<PageStore>> Create(const Options& options,
                                                           Backend* backend,
                                                           Memory memory = Memory::kDevice);
  ~PageStore();

  const Options& options() const { return options_; }
  Memory memory() const { return memory_; }
  int num_formats() const { return static_cast<int>(layouts_.size()); }
  uint32_t num_slabs() const { return num_slabs_; }  // per layer
  uint32_t free_slabs() const { return free_slabs_; }
  // Slabs withheld from the budget because unmapping them failed: never mapped again.
  uint32_t lost_slabs() const { return lost_slabs_; }
  // Slabs unmapped so far (UnmapSlot): pages named before an unmap may lie in unmapped memory.
  uint64_t slab_unmaps() const { return slab_unmaps_; }
  const PageLayout& layout(int format) const { return layouts_[format]; }
  const PagePool& pool(int format) const { return pools_[format]; }
  // The most pages that could ever be live at once (all slabs in the densest format).
  uint32_t MaxLivePages() const;
  PoolView View(int format, int layer) const;

  // Pages of `format` allocatable now without eviction; with `after_reclaim`, once every retired
  // page has returned to its pool (the same on every backend).
  uint64_t RoomFor(int format, bool after_reclaim = false) const;
  // Slabs that `format`'s pool still needs to hold `count` free pages; with `after_reclaim`,
  // once every retired page has returned to its pool (ReclaimAll).
  uint32_t SlabsNeeded(int format, uint32_t count, bool after_reclaim = false) const;
  // Slabs obtainable for `format`'s pool: free, or empty in another pool (now, or with
  // `after_reclaim` once every retired page has returned).
  uint32_t AvailableSlabs(int format, bool after_reclaim = false) const;
  // Maps SlabsNeeded(format, count) slabs into `format`'s pool, taking empty slabs from other
  // pools when none is free. REQUIRES: SlabsNeeded(format, count) <= AvailableSlabs(format).
  // On a backend failure the slabs it mapped return to the budget (other pools' empty slabs
  // taken stay unmapped).
  absl::Status MapSlabs(int format, uint32_t count);

  // A free page of `format`, now owned by `owner`. REQUIRES: pool(format).free_pages() > 0.
  uint32_t Allocate(int format, uint32_t owner) { return pools_[format].Allocate(owner); }
  uint32_t AllocateOutside(int format, uint32_t owner, uint32_t slot) {
    return pools_[format].AllocateOutside(owner, slot);
  }
  // Returns a page that no device work has touched to its pool at once.
  void FreeNow(int format, uint32_t page) { pools_[format].Free(page); }
  // Queues a page for reclamation: it is reused once the device can no longer read it (a
  // host-tier page at once).
  void Retire(int format, uint32_t page);
  // Returns retired pages at once on a synchronous backend; no-op otherwise.
  void RetireSynchronous();
  // Returns every retired page, waiting for the device on an asynchronous backend:
  // DeadlineExceeded, with the pages still retired, when its fence has not passed in 2 s.
  absl::Status ReclaimAll();
  // Closes the step: records its fence, returns the pages whose fences have passed, and
  // ReturnEmptySlabs.
  absl::Status EndStep();
  // Returns every empty slab but one per pool to the budget (device memory only: the host tier
  // keeps its slabs mapped, and pinned, until another format needs them).
  absl::Status ReturnEmptySlabs();

  // Sets the per-tensor scales of `layer` from the amax of its K and V, for every format.
  // FailedPrecondition, with nothing changed, when a format with a per-tensor scale holds pages.
  absl::Status SetTensorScales(int layer, float k_amax, float v_amax);
  // FailedPrecondition when a format with a per-tensor scale holds pages.
  absl::Status CheckTensorScalesFree() const;

  // Bytes of used pages over all formats and layers.
  int64_t UsedBytes() const;
  // Writes the slab, pending and per-format pool fields of `stats` (stats->formats resized).
  void Fill(CacheStats* stats) const;
  // Checks, per pool, free + owned[format] + pending = mapped, and that slabs add up.
  absl::Status CheckConsistency(absl::Span<const uint32_t> owned) const;

 private:
  PageStore(const Options& options, Backend* backend, Memory memory);
  uint8_t* SlotAddress(int format, int layer, uint32_t slot) const;
  absl::Status MapSlot(int format);
  // One slab of one layer, through the backend calls of memory_.
  absl::Status MapMemory(uint8_t* addr);
  absl::Status UnmapMemory(uint8_t* addr);
  absl::Status UnmapSlot(int format, uint32_t slot);

  const Options options_;
  Backend* const backend_;
  const Memory memory_;
  const std::vector<PageLayout> layouts_;  // [format]
  const uint32_t num_slabs_;               // per layer
  const size_t range_bytes_;               // reserved per (format, layer)
  std::vector<uint8_t*> bases_;            // [format * layers + layer], fixed after Create
  std::vector<PagePool> pools_;            // [format]
  std::vector<float> k_scales_;            // [format * layers + layer]
  std::vector<float> v_scales_;
  uint32_t free_slabs_;
  uint32_t lost_slabs_ = 0;
  int64_t slab_moves_ = 0;  // slabs mapped into a pool
  uint64_t slab_unmaps_ = 0;
  ReclaimQueue reclaim_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_PAGE_STORE_H_
