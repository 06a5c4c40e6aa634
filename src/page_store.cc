#include "src/page_store.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/page_codec.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

std::vector<PageLayout> MakeLayouts(const Options& o) {
  std::vector<PageLayout> layouts;
  const Geometry& g = o.geometry;
  for (const FormatSpec& f : o.palette) {
    layouts.push_back(MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, f));
  }
  return layouts;
}

// The ScaleScope::kTensor scale of `type` for a layer whose amax is `amax` (0: uncalibrated).
// FP8 scales are at least FLT_MIN, so that the encoders' 1 / scale is finite (an infinite one
// turns a zero into NaN): an amax below 448 x 2^-126 (E4M3) encodes as that one would.
float TensorScale(ElementType type, float amax) {
  if (amax <= 0) return 1.f;
  constexpr float kMinScale = std::numeric_limits<float>::min();
  switch (type) {
    case ElementType::kFp8E4M3: return std::max(amax / 448.f, kMinScale);
    case ElementType::kFp8E5M2: return std::max(amax / 57344.f, kMinScale);
    case ElementType::kNvfp4: return amax / 2688.f;
    default: return 1.f;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<PageStore>> PageStore::Create(const Options& options,
                                                             Backend* backend, Memory memory) {
  std::unique_ptr<PageStore> store(new PageStore(options, backend, memory));
  const bool host = memory == Memory::kHost;
  const int layers = options.geometry.num_layers;
  for (int f = 0; f < store->num_formats(); ++f) {
    for (int l = 0; l < layers; ++l) {
      KVTIER_ASSIGN_OR_RETURN(uint8_t* base, host ? backend->ReserveHost(store->range_bytes_)
                                                   : backend->Reserve(store->range_bytes_));
      store->bases_.push_back(base);  // the destructor releases what was reserved so far
    }
  }
  return store;
}

PageStore::PageStore(const Options& options, Backend* backend, Memory memory)
    : options_(options),
      backend_(backend),
      memory_(memory),
      layouts_(MakeLayouts(options)),
      num_slabs_(static_cast<uint32_t>(
          (memory == Memory::kHost ? options.host_tier_bytes : options.memory_budget_bytes) /
          options.slab_bytes / options.geometry.num_layers)),
      range_bytes_(num_slabs_ * options.slab_bytes),
      free_slabs_(num_slabs_) {
  const int layers = options.geometry.num_layers;
  for (int f = 0; f < num_formats(); ++f) {
    pools_.emplace_back(layouts_[f].page_bytes, options.slab_bytes, num_slabs_);
    const FormatSpec& spec = options.palette[f];
    for (int l = 0; l < layers; ++l) {
      k_scales_.push_back(
          TensorScale(spec.k.type, options.k_tensor_amax.empty() ? 0 : options.k_tensor_amax[l]));
      v_scales_.push_back(
          TensorScale(spec.v.type, options.v_tensor_amax.empty() ? 0 : options.v_tensor_amax[l]));
    }
  }
}

PageStore::~PageStore() {
  // Host slabs stay page-locked while mapped (CUDA backend): release them before their range,
  // or a later reservation at the same address could not be registered again.
  if (memory_ == Memory::kHost) {
    for (int f = 0; f < num_formats(); ++f) {
      for (uint32_t slot = 0; slot < pools_[f].num_slots(); ++slot) {
        if (!pools_[f].IsMapped(slot)) continue;
        for (int l = 0; l < options_.geometry.num_layers; ++l) {
          UnmapMemory(SlotAddress(f, l, slot)).IgnoreError();
        }
      }
    }
  }
  for (uint8_t* base : bases_) {
    if (memory_ == Memory::kHost) {
      backend_->UnreserveHost(base, range_bytes_);
    } else {
      backend_->Unreserve(base, range_bytes_);
    }
  }
}

uint32_t PageStore::MaxLivePages() const {
  uint32_t densest = 0;
  for (const PageLayout& l : layouts_) {
    densest = std::max(densest, static_cast<uint32_t>(options_.slab_bytes / l.page_bytes));
  }
  return num_slabs_ * densest;
}

PoolView PageStore::View(int format, int layer) const {
  const size_t i = static_cast<size_t>(format) * options_.geometry.num_layers + layer;
  return PoolView{bases_[i], layouts_[format], k_scales_[i], v_scales_[i]};
}

uint8_t* PageStore::SlotAddress(int format, int layer, uint32_t slot) const {
  return bases_[static_cast<size_t>(format) * options_.geometry.num_layers + layer] +
         slot * options_.slab_bytes;
}

absl::Status PageStore::MapSlot(int format) {
  PagePool& pool = pools_[format];
  const uint32_t slot = pool.UnmappedSlot();
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    absl::Status s = MapMemory(SlotAddress(format, l, slot));
    if (!s.ok()) {
      bool unmapped = true;
      while (l-- > 0) unmapped &= UnmapMemory(SlotAddress(format, l, slot)).ok();
      if (!unmapped) {  // mapping over it would fail: withheld, as in UnmapSlot
        pool.DropUnmappedSlot();
        free_slabs_ -= 1;
        lost_slabs_ += 1;
      }
      return s;
    }
  }
  pool.AddSlot(slot);
  free_slabs_ -= 1;
  slab_moves_ += 1;
  return absl::OkStatus();
}

absl::Status PageStore::MapMemory(uint8_t* addr) {
  return memory_ == Memory::kHost ? backend_->MapHost(addr, options_.slab_bytes)
                                  : backend_->Map(addr, options_.slab_bytes);
}

absl::Status PageStore::UnmapMemory(uint8_t* addr) {
  return memory_ == Memory::kHost ? backend_->UnmapHost(addr, options_.slab_bytes)
                                  : backend_->Unmap(addr, options_.slab_bytes);
}

absl::Status PageStore::UnmapSlot(int format, uint32_t slot) {
  slab_unmaps_ += 1;
  absl::Status status;
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    status.Update(UnmapMemory(SlotAddress(format, l, slot)));
  }
  // A slab some layer of which may still be mapped is never mapped again (the CUDA backend
  // refuses to map over mapped memory, which would refuse this pool every later slab) and stays
  // charged to the budget.
  pools_[format].RemoveSlot(slot, /*reusable=*/status.ok());
  if (status.ok()) {
    free_slabs_ += 1;
    return status;
  }
  lost_slabs_ += 1;
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), "; slab ", slot, " of ",
                                   FormatName(options_.palette[format]),
                                   " is withheld from the budget (", lost_slabs_, " so far)"));
}

uint32_t PageStore::AvailableSlabs(int format, bool after_reclaim) const {
  uint32_t available = free_slabs_;
  for (int g = 0; g < num_formats(); ++g) {
    if (g != format) available += pools_[g].empty_slots() + (after_reclaim ? pools_[g].reclaimable_slots() : 0);
  }
  return available;
}

uint64_t PageStore::RoomFor(int format, bool after_reclaim) const {
  const PagePool& pool = pools_[format];
  const uint64_t free = pool.free_pages() + (after_reclaim ? pool.pending_pages() : 0);
  return free + uint64_t{AvailableSlabs(format, after_reclaim)} * pool.MinPagesPerSlot();
}

uint32_t PageStore::SlabsNeeded(int format, uint32_t count, bool after_reclaim) const {
  const PagePool& pool = pools_[format];
  const uint64_t per_slab = pool.MinPagesPerSlot();
  const uint64_t free = uint64_t{pool.free_pages()} + (after_reclaim ? pool.pending_pages() : 0);
  if (free >= count) return 0;
  // In 64 bits: a count near 2^32 wrapped to 0 slabs, and the allocation ran past the pool.
  return static_cast<uint32_t>(
      std::min<uint64_t>((count - free + per_slab - 1) / per_slab, UINT32_MAX));
}

absl::Status PageStore::MapSlabs(int format, uint32_t count) {
  const uint32_t needed = SlabsNeeded(format, count);
  for (uint32_t i = 0; i < needed; ++i) {
    absl::Status s;
    for (int g = 0; s.ok() && free_slabs_ == 0 && g < num_formats(); ++g) {
      if (g != format && pools_[g].EmptySlot() != PagePool::kNone) {
        s = UnmapSlot(g, pools_[g].EmptySlot());
      }
    }
    if (s.ok()) s = MapSlot(format);
    if (!s.ok()) {  // the slabs mapped so far are empty: back to the budget, never moved
      for (uint32_t j = 0; j < i && pools_[format].EmptySlot() != PagePool::kNone; ++j) {
        UnmapSlot(format, pools_[format].EmptySlot()).IgnoreError();
        slab_moves_ -= 1;
      }
      return s;
    }
  }
  return absl::OkStatus();
}

void PageStore::Retire(int format, uint32_t page) {
  if (memory_ == Memory::kHost) {  // stream-ordered: see the header
    pools_[format].Free(page);
    return;
  }
  pools_[format].Retire(page);
  reclaim_.Push(static_cast<uint8_t>(format), page);
}

void PageStore::RetireSynchronous() {
  if (!backend_->synchronous()) return;
  ReclaimQueue::Entry e;
  while (reclaim_.PopAny(&e)) pools_[e.format].Free(e.page);
}

absl::Status PageStore::ReclaimAll() {
  if (!backend_->synchronous()) {  // wait for the device so that the pages may be reused at once
    KVTIER_RETURN_IF_ERROR(AwaitIssuedWork(
        *backend_, "the work issued before this call (retired pages stay pending)"));
  }
  ReclaimQueue::Entry e;
  while (reclaim_.PopAny(&e)) pools_[e.format].Free(e.page);
  return absl::OkStatus();
}

absl::Status PageStore::EndStep() {
  if (backend_->synchronous()) {
    RetireSynchronous();
  } else {
    KVTIER_ASSIGN_OR_RETURN(const uint64_t fence, backend_->RecordFence());
    reclaim_.CloseStep(fence);
    absl::Status device;  // a failed query: the device's error
    const auto passed = [&](uint64_t f) {
      absl::StatusOr<bool> p = backend_->FencePassed(f);
      device.Update(p.status());
      return p.value_or(false);
    };
    ReclaimQueue::Entry e;
    while (reclaim_.PopPassed(passed, &e)) pools_[e.format].Free(e.page);
    KVTIER_RETURN_IF_ERROR(device);
  }
  return ReturnEmptySlabs();
}

absl::Status PageStore::ReturnEmptySlabs() {
  // Each pool keeps one empty slab for the next step; the others return to the budget. The host
  // tier keeps them all: registering pinned memory is slow (about a millisecond per slab and
  // layer), and MapSlabs takes empty slabs from other pools anyway.
  absl::Status status;
  for (int f = 0; f < num_formats() && memory_ == Memory::kDevice; ++f) {
    while (pools_[f].empty_slots() > 1) status.Update(UnmapSlot(f, pools_[f].EmptySlot()));
  }
  return status;
}

absl::Status PageStore::CheckTensorScalesFree() const {
  for (int f = 0; f < num_formats(); ++f) {
    const FormatSpec& spec = options_.palette[f];
    const bool per_tensor = spec.k.scope == ScaleScope::kTensor || spec.v.scope == ScaleScope::kTensor;
    if (per_tensor && pools_[f].used_pages() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          FormatName(spec), " already holds blocks encoded with the current per-tensor scale",
          memory_ == Memory::kHost ? " in the host tier" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status PageStore::SetTensorScales(int layer, float k_amax, float v_amax) {
  KVTIER_RETURN_IF_ERROR(CheckTensorScalesFree());
  for (int f = 0; f < num_formats(); ++f) {
    const size_t i = static_cast<size_t>(f) * options_.geometry.num_layers + layer;
    k_scales_[i] = TensorScale(options_.palette[f].k.type, k_amax);
    v_scales_[i] = TensorScale(options_.palette[f].v.type, v_amax);
  }
  return absl::OkStatus();
}

int64_t PageStore::UsedBytes() const {
  int64_t used = 0;
  for (int f = 0; f < num_formats(); ++f) {
    used += static_cast<int64_t>(pools_[f].used_pages()) * layouts_[f].page_bytes;
  }
  return used * options_.geometry.num_layers;
}

void PageStore::Fill(CacheStats* s) const {
  const Geometry& g = options_.geometry;
  s->budget_bytes = static_cast<int64_t>(options_.memory_budget_bytes);
  s->slab_bytes = static_cast<int64_t>(options_.slab_bytes);
  s->slabs_total = num_slabs_;
  s->slabs_free = free_slabs_;
  s->slabs_lost = lost_slabs_;
  s->slab_moves = slab_moves_;
  s->pages_pending_reclaim = static_cast<int64_t>(reclaim_.size());
  s->formats.resize(num_formats());
  for (int f = 0; f < num_formats(); ++f) {
    FormatStats& fs = s->formats[f];
    const PagePool& pool = pools_[f];
    fs.name = FormatName(options_.palette[f]);
    fs.page_bytes = layouts_[f].page_bytes;
    fs.slabs_mapped = pool.mapped_slots();
    fs.pages_mapped = pool.mapped_pages();
    fs.pages_used = pool.used_pages();
    fs.bytes = fs.slabs_mapped * s->slab_bytes * g.num_layers;
    const double elements = 2.0 * g.num_kv_heads * g.block_tokens * g.head_dim;
    fs.bits_per_element = layouts_[f].data_bytes * 8.0 / elements;
  }
}

absl::Status PageStore::CheckConsistency(absl::Span<const uint32_t> owned) const {
  std::vector<uint32_t> pending(num_formats(), 0);
  for (const ReclaimQueue::Entry& e : reclaim_.entries()) {
    pending[e.format] += 1;
    if (pools_[e.format].Owner(e.page) != PagePool::kPending) {
      return absl::InternalError(
          absl::StrCat("consistency: page ", e.page, " awaits reclamation but is owned"));
    }
  }
  uint32_t slabs = free_slabs_ + lost_slabs_;
  for (int f = 0; f < num_formats(); ++f) {
    const PagePool& pool = pools_[f];
    KVTIER_RETURN_IF_ERROR(pool.CheckConsistency());
    if (pool.free_pages() + owned[f] + pending[f] != pool.mapped_pages()) {
      return absl::InternalError(absl::StrCat("consistency: format ", f, ": free ",
                                              pool.free_pages(), " + owned ", owned[f],
                                              " + pending ", pending[f], " != mapped ",
                                              pool.mapped_pages()));
    }
    slabs += pool.mapped_slots();
  }
  if (slabs != num_slabs_) {
    return absl::InternalError(
        absl::StrCat("consistency: slabs: ", slabs, " accounted of ", num_slabs_,
                     " (free, lost and mapped)"));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
