// The data plane of CacheImpl: K/V written into and read out of pages, page tables for
// attention kernels, pool views, and per-tensor scale calibration.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/codec/hadamard.h"
#include "kernels/codec/half.h"
#include "kernels/page_codec.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

// Tokens one K/V input may hold: bounds num_tokens x heads x head_dim far below int64's range.
constexpr int64_t kMaxInputTokens = int64_t{1} << 40;

// Element i of an FP16 or BF16 input (checked by CheckInput).
float InputValue(const KVInput& kv, const void* data, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return kv.dtype == DType::kFloat16 ? codec::HalfToFloat(bits) : codec::Bf16ToFloat(bits);
}

}  // namespace

absl::Status CacheImpl::CheckLayer(int32_t layer) const {
  if (layer < 0 || layer >= options_.geometry.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is outside [0, ", options_.geometry.num_layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::CheckInput(const KVInput& kv, int64_t num_tokens) const {
  const Geometry& g = options_.geometry;
  if (kv.dtype != DType::kFloat16 && kv.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError("K/V input must be FP16 or BF16");
  }
  if (kv.num_tokens != num_tokens || kv.num_heads != g.num_kv_heads || kv.head_dim != g.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K/V shape [", kv.num_tokens, ", ", kv.num_heads, ", ", kv.head_dim, "] != [", num_tokens,
        ", ", g.num_kv_heads, ", ", g.head_dim, "]"));
  }
  if (kv.num_tokens < 0 || kv.num_tokens > kMaxInputTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("K/V num_tokens ", kv.num_tokens, " is outside [0, ", kMaxInputTokens, "]"));
  }
  if (kv.num_tokens > 0 && (kv.k == nullptr || kv.v == nullptr)) {
    const char* which = kv.k == nullptr ? (kv.v == nullptr ? "k and v" : "k") : "v";
    return absl::InvalidArgumentError(absl::StrCat("K/V input: the ", which, " data pointer is null"));
  }
  // The CUDA kernels load rows 16 bytes at a time; the CPU reads 2-byte elements.
  const uintptr_t alignment = options_.backend == BackendKind::kCuda ? 16 : 2;
  for (const auto& [name, data] : {std::pair{"k", kv.k}, std::pair{"v", kv.v}}) {
    if (kv.num_tokens > 0 && reinterpret_cast<uintptr_t>(data) % alignment != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("K/V input: the ", name, " data pointer is not ", alignment, "-byte aligned"));
    }
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::CheckSlot(int64_t slot) const {
  const int64_t s = options_.geometry.block_tokens;
  const PagePool& hot = pages_->pool(0);
  const int64_t limit = int64_t{hot.capacity_pages()} * s;
  if (slot < 0 || slot >= limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, " is outside [0, ", limit, "): slots are page * ", s,
        " + offset in the hot format's pools, as Append returns them"));
  }
  const uint32_t page = static_cast<uint32_t>(slot / s);
  const uint32_t owner = hot.Owner(page);
  if (owner == PagePool::kPending) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, " is in page ", page, ", whose block was released (or demoted)"));
  }
  if (owner >= pool_.blocks().capacity()) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " is in page ", page, ", which holds no block"));
  }
  const BlockMeta& b = pool_[owner];
  if (b.state != BlockState::kInUse) {  // a stale slot must not rewrite a cached prefix
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, " is in a cached block, kept for prefix reuse after its sequence was "
        "released"));
  }
  if (slot % s >= b.num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, " is offset ", slot % s, " of a block with ", b.num_tokens,
        " reserved tokens (offsets [0, ", b.num_tokens, ")): append first"));
  }
  if (b.ref_count > 1 && !indexed_this_step_.contains(BlockKey(pool_.blocks().IdOf(owner)))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", slot, " is in a block shared by ", b.ref_count,
        " sequences; append to the sequence again to get a private copy"));
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::CheckSlots(int32_t layer, absl::Span<const int64_t> slots,
                                   const KVInput& kv) const {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  KVTIER_RETURN_IF_ERROR(CheckInput(kv, static_cast<int64_t>(slots.size())));
  for (int64_t slot : slots) KVTIER_RETURN_IF_ERROR(CheckSlot(slot));
  return absl::OkStatus();
}

absl::Status CacheImpl::CheckSlotList(absl::Span<const int64_t> slots) const {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < slots.size(); ++i) {
    const absl::Status s = CheckSlot(slots[i]);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("slots[", i, "]: ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CacheImpl::DeviceNonfiniteCounter() {
  MutexLock lock(&mu_);
  return backend_->DeviceNonfiniteCounter(&metrics_.nonfinite_values);
}

absl::Status CacheImpl::JoinStream(void* stream, bool stream_waits) {
  MutexLock lock(&mu_);
  return backend_->JoinStream(stream, stream_waits);
}

absl::Status CacheImpl::WriteKV(int32_t layer, absl::Span<const int64_t> slots, const KVInput& kv) {
  MutexLock lock(&mu_);
  KVTIER_RETURN_IF_ERROR(CheckSlots(layer, slots, kv));
  if (slots.empty()) return absl::OkStatus();
  PoolView hot = pages_->View(0, layer);
  hot.rotate_keys = options_.key_rotation == KeyRotation::kHadamard;
  hot.key_rotation_seed = options_.key_rotation_seed;
  return backend_->WriteRows(hot, slots, kv, &metrics_.nonfinite_values);
}

absl::Status CacheImpl::ReadKV(SequenceId id, int32_t layer, absl::Span<float> k,
                               absl::Span<float> v) const {
  MutexLock lock(&mu_);
  const Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  const Geometry& g = options_.geometry;
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
  const size_t want = static_cast<size_t>(seq->num_tokens) * row;
  if (k.size() != want || v.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("ReadKV spans hold ", k.size(), " and ", v.size(),
                                                   " floats; the sequence needs ", want, " each"));
  }
  for (size_t i = 0; i < seq->blocks.size(); ++i) {
    const BlockMeta& b = pool_[seq->blocks[i]];
    const size_t at = i * g.block_tokens * row;
    KVTIER_RETURN_IF_ERROR(
        backend_->ReadPage(pages_->View(b.format, layer), b.page, b.num_tokens, k.data() + at, v.data() + at));
  }
  if (options_.key_rotation == KeyRotation::kHadamard) {  // stored R_h k: return k
    for (size_t r = 0; r < k.size() / g.head_dim; ++r) {
      codec::UnrotateKey(k.data() + r * g.head_dim, g.head_dim, options_.key_rotation_seed,
                         static_cast<int>(r % g.num_kv_heads));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolInfo> CacheImpl::GetPool(int32_t format, int32_t layer) const {
  if (format < 0 || format >= num_formats() || layer < 0 || layer >= options_.geometry.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("no pool for format ", format, ", layer ", layer));
  }
  MutexLock lock(&mu_);
  const PoolView view = pages_->View(format, layer);
  const PageLayout& l = view.layout;
  PoolInfo info;
  info.base = view.base;
  info.page_bytes = l.page_bytes;
  info.capacity_pages = pages_->pool(format).capacity_pages();
  info.k_offset = l.k.payload_offset;
  info.v_offset = l.v.payload_offset;
  info.row_bytes = l.k.row_bytes;
  info.k_micro_offset = l.k.micro_offset;
  info.v_micro_offset = l.v.micro_offset;
  info.k_scale_offset = l.k.scale_offset;
  info.v_scale_offset = l.v.scale_offset;
  info.k_tensor_scale = view.k_tensor_scale;
  info.v_tensor_scale = view.v_tensor_scale;
  info.device_id = backend_->device_id();
  return info;
}

absl::Status CacheImpl::CheckTablesHeld(const PageTables& tables) const {
  MutexLock lock(&mu_);
  std::vector<std::vector<bool>> held(num_formats());  // [format][page]
  for (uint32_t b = 0; b < pool_.blocks().capacity(); ++b) {
    const BlockMeta& m = pool_[b];
    if (m.state != BlockState::kInUse && m.state != BlockState::kCached) continue;
    std::vector<bool>& pages = held[m.format];
    if (pages.size() <= m.page) pages.resize(m.page + 1);
    pages[m.page] = true;
  }
  for (size_t e = 0; e < tables.packed.size(); ++e) {
    const uint32_t format = PackedFormat(tables.packed[e]), page = PackedPage(tables.packed[e]);
    if (format >= held.size() || page >= held[format].size() || !held[format][page]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "page table entry ", e, " names page ", page, " of format ", format,
          ", which holds no block now: tables from before the cache changed, or another cache's"));
    }
  }
  return absl::OkStatus();
}

uint64_t CacheImpl::SlabUnmaps() const {
  MutexLock lock(&mu_);
  return pages_->slab_unmaps();
}

absl::Status CacheImpl::CheckMappedSince(uint64_t slab_unmaps, absl::string_view what) const {
  const uint64_t unmaps = SlabUnmaps();
  if (slab_unmaps == unmaps) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " made at ", slab_unmaps, " slab unmaps, the cache is at ", unmaps,
      " (an earlier step's, or another cache's): their pages may lie in unmapped memory; "
      "make them again"));
}

absl::Status CacheImpl::CheckTablesMapped(const PageTables& tables) const {
  return CheckMappedSince(tables.slab_unmaps, "page tables");
}

// Blocks ahead whose metadata BuildPageTables prefetches.
constexpr size_t kMetaPrefetch = 16;

absl::Status CacheImpl::BuildPageTables(absl::Span<const SequenceId> batch,
                                        PageTables* tables) const {
  if (tables == nullptr) return absl::InvalidArgumentError("tables is null");
  MutexLock lock(&mu_);
  for (SequenceId id : batch) {
    if (sequences_.Find(id) == nullptr) return UnknownSequence(id);
  }
  tables->per_format.resize(num_formats());
  for (FormatPageTable& t : tables->per_format) {
    t.indptr.assign(1, 0);
    t.indices.clear();
    t.last_page_len.clear();
  }
  tables->packed_indptr.assign(1, 0);
  tables->packed.clear();
  tables->seq_lens.clear();
  tables->slab_unmaps = pages_->slab_unmaps();
  for (SequenceId id : batch) {
    const Sequence& seq = *sequences_.Find(id);
    for (FormatPageTable& t : tables->per_format) t.last_page_len.push_back(0);
    const size_t n = seq.blocks.size();
    for (size_t i = 0; i < n; ++i) {
      // Each block's metadata is a cache line of its own, scattered: ask for it ahead.
      if (i + kMetaPrefetch < n) __builtin_prefetch(&pool_[seq.blocks[i + kMetaPrefetch]]);
      const BlockMeta& b = pool_[seq.blocks[i]];
      FormatPageTable& t = tables->per_format[b.format];
      t.indices.push_back(static_cast<int32_t>(b.page));
      t.last_page_len.back() = b.num_tokens;
      tables->packed.push_back(PackPage(b.format, b.page));
    }
    for (FormatPageTable& t : tables->per_format) {
      t.indptr.push_back(static_cast<int32_t>(t.indices.size()));
    }
    tables->packed_indptr.push_back(static_cast<int32_t>(tables->packed.size()));
    tables->seq_lens.push_back(static_cast<int32_t>(seq.num_tokens));
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::CalibrateTensorScales(int32_t layer, const KVInput& kv) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  KVTIER_RETURN_IF_ERROR(CheckInput(kv, kv.num_tokens));
  // The K maximum is that of what WriteKV stores: rotated keys when keys are rotated.
  const bool rotate = options_.key_rotation == KeyRotation::kHadamard;
  std::vector<float> row(kv.head_dim);
  float k_amax = 0, v_amax = 0;
  for (int64_t r = 0; r < kv.num_tokens * kv.num_heads; ++r) {
    for (int d = 0; d < kv.head_dim; ++d) {
      row[d] = InputValue(kv, kv.k, r * kv.head_dim + d);
      v_amax = std::max(v_amax, FiniteAbs(InputValue(kv, kv.v, r * kv.head_dim + d)));
    }
    if (rotate) {
      codec::RotateKey(row.data(), kv.head_dim, options_.key_rotation_seed,
                       static_cast<int>(r % kv.num_heads));
    }
    for (int d = 0; d < kv.head_dim; ++d) k_amax = std::max(k_amax, FiniteAbs(row[d]));
  }
  MutexLock lock(&mu_);
  return pool_.SetTensorScales(layer, k_amax, v_amax);
}

}  // namespace kvtier
