// CudaBackend's data plane (src/cuda/cuda_backend.h): the staging of small host arrays for
// upload, the non-finite input counter, and the kernels and copies that write, read, requantize
// and copy pages. The memory side (pools, slabs, events, fences) is in cuda_backend.cc.
#include <algorithm>
#include <cstring>

#include "src/cuda/cuda_backend.h"

namespace kvtier {
namespace {

bool SameCodec(const CodecLayout& a, const CodecLayout& b) {
  return a.type == b.type && a.scope == b.scope && a.axis == b.axis &&
         a.row_bytes == b.row_bytes && a.payload_offset == b.payload_offset &&
         a.micro_offset == b.micro_offset && a.scale_offset == b.scale_offset;
}

bool SameLayout(const PageLayout& a, const PageLayout& b) {
  return a.heads == b.heads && a.tokens == b.tokens && a.head_dim == b.head_dim &&
         a.page_bytes == b.page_bytes && a.data_bytes == b.data_bytes && SameCodec(a.k, b.k) &&
         SameCodec(a.v, b.v);
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

// ---- Staging of small host arrays ----

absl::StatusOr<void*> CudaBackend::StageHost(size_t bytes) {
  next_staging_ = (next_staging_ + 1) % kStagingSlots;
  StagingSlot& s = staging_[next_staging_];
  // The copy that last read this buffer (kStagingSlots stagings ago) must have completed.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.copied));
  if (s.bytes < bytes) {
    const size_t want = std::max<size_t>(RoundUp(bytes, size_t{64} << 10), 2 * s.bytes);
    if (s.host != nullptr) KVTIER_CUDA_RETURN_IF_ERROR(cudaFreeHost(s.host));
    s.host = nullptr;
    s.bytes = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.host, want));
    s.bytes = want;
  }
  return s.host;
}

absl::Status CudaBackend::GrowDevice(void** buffer, size_t* capacity, size_t bytes) {
  if (*capacity >= bytes) return absl::OkStatus();
  // Stream-ordered: work already queued that reads the old buffer runs first.
  const size_t want = std::max<size_t>(RoundUp(bytes, size_t{64} << 10), 2 * *capacity);
  if (*buffer != nullptr) KVTIER_CUDA_RETURN_IF_ERROR(cudaFreeAsync(*buffer, stream_));
  *buffer = nullptr;
  *capacity = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(buffer, want, stream_));
  *capacity = want;
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::Upload(size_t bytes) {
  KVTIER_RETURN_IF_ERROR(GrowDevice(&device_staging_, &device_staging_bytes_, bytes));
  StagingSlot& s = staging_[next_staging_];
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_staging_, s.host, bytes, cudaMemcpyHostToDevice, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.copied, stream_));
  return device_staging_;
}

// ---- Non-finite counter ----

void CudaBackend::SnapshotNonfinite() {
  if (nonfinite_sink_ == nullptr || snapshot_free_.empty()) return;
  const int i = snapshot_free_.back();
  if (!CudaSucceeded(cudaMemcpyAsync(&snapshots_[i], nonfinite_device_, sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, stream_)) ||
      !CudaSucceeded(cudaEventRecord(snapshot_done_[i], stream_))) {
    return;  // a later snapshot takes the count
  }
  snapshot_free_.pop_back();
  snapshot_pending_.push_back(i);
}

void CudaBackend::FoldNonfinite() {
  while (!snapshot_pending_.empty()) {
    const cudaError_t e = cudaEventQuery(snapshot_done_[snapshot_pending_.front()]);
    if (e != cudaSuccess) {
      if (e != cudaErrorNotReady) sticky_.Update(CudaStatus(e, "cudaEventQuery (non-finite count)"));
      return;
    }
    const int i = snapshot_pending_.front();
    snapshot_pending_.pop_front();
    snapshot_free_.push_back(i);
    const uint64_t value = snapshots_[i];
    if (value > folded_) {
      *nonfinite_sink_ += static_cast<int64_t>(value - folded_);
      folded_ = value;
    }
  }
}

void CudaBackend::BindNonfinite(int64_t* nonfinite) {
  if (nonfinite != nonfinite_sink_) {
    FoldNonfinite();
    nonfinite_sink_ = nonfinite;
  }
}

absl::StatusOr<void*> CudaBackend::DeviceNonfiniteCounter(int64_t* nonfinite) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  BindNonfinite(nonfinite);
  return static_cast<void*>(nonfinite_device_);
}

// ---- Streams of callers ----

absl::Status CudaBackend::JoinStream(void* stream, bool stream_waits) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  const auto other = static_cast<cudaStream_t>(stream);
  if (other == stream_) return absl::OkStatus();
  // A wait enqueued on an event takes the record before it: re-recording later is safe.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(joined_, stream_waits ? stream_ : other));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_waits ? other : stream_, joined_, 0));
  return absl::OkStatus();
}

// ---- Data plane ----

absl::StatusOr<const float*> CudaBackend::RotateKeys(const PoolView& pool, const KVInput& kv) {
  const PageLayout& l = pool.layout;
  gpu::RotateRowsParams r;
  r.num_rows = kv.num_tokens * l.heads;
  KVTIER_RETURN_IF_ERROR(GrowDevice(&rotated_, &rotated_bytes_,
                                    static_cast<size_t>(r.num_rows) * l.head_dim * sizeof(float)));
  r.in = kv.k;
  r.in_type = kv.dtype == DType::kBFloat16 ? gpu::RotateInput::kBf16 : gpu::RotateInput::kFp16;
  r.out = static_cast<float*>(rotated_);
  r.head_dim = l.head_dim;
  r.heads = l.heads;
  r.seed = pool.key_rotation_seed;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchRotateRows(r, stream_));
  return static_cast<const float*>(rotated_);
}

absl::Status CudaBackend::WriteRows(const PoolView& pool, absl::Span<const int64_t> slots,
                                    const KVInput& kv, int64_t* nonfinite) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (kv.dtype != DType::kFloat16 && kv.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError("K/V input must be FP16 or BF16");
  }
  if (slots.empty()) return absl::OkStatus();
  BindNonfinite(nonfinite);
  const PageLayout& l = pool.layout;
  const size_t bytes = slots.size() * sizeof(gpu::RowSlot);
  KVTIER_ASSIGN_OR_RETURN(void* host, StageHost(bytes));
  auto* rows = static_cast<gpu::RowSlot*>(host);
  gpu::SplitSlots(slots.data(), slots.size(), static_cast<uint32_t>(l.tokens), rows);
  KVTIER_ASSIGN_OR_RETURN(void* device_rows, Upload(bytes));
  gpu::WriteRowsParams p;
  p.base = pool.base;
  p.layout = l;
  p.k_scale = pool.k_tensor_scale;
  p.v_scale = pool.v_tensor_scale;
  p.slots = static_cast<const gpu::RowSlot*>(device_rows);
  p.num_rows = static_cast<int64_t>(slots.size());
  p.k = kv.k;
  p.v = kv.v;
  p.bf16 = kv.dtype == DType::kBFloat16;
  p.nonfinite = nonfinite_device_;
  p.num_sms = num_sms_;
  if (pool.rotate_keys) {
    KVTIER_ASSIGN_OR_RETURN(p.k_rotated, RotateKeys(pool, kv));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchWriteRows(p, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReadPage(const PoolView& pool, uint32_t page, int num_tokens, float* k,
                                   float* v) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (num_tokens <= 0) return absl::OkStatus();
  const PageLayout& l = pool.layout;
  const size_t floats = static_cast<size_t>(num_tokens) * l.heads * l.head_dim;
  KVTIER_RETURN_IF_ERROR(GrowDevice(&scratch_, &scratch_bytes_, 2 * floats * sizeof(float)));
  gpu::ReadPageParams p;
  p.page = pool.base + static_cast<size_t>(page) * l.page_bytes;
  p.layout = l;
  p.k_scale = pool.k_tensor_scale;
  p.v_scale = pool.v_tensor_scale;
  p.num_tokens = num_tokens;
  p.k = static_cast<float*>(scratch_);
  p.v = p.k + floats;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchReadPage(p, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k, p.k, floats * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v, p.v, floats * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  SnapshotNonfinite();
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  FoldNonfinite();
  return absl::OkStatus();
}

absl::StatusOr<CudaBackend::PageBatch> CudaBackend::StagePageBatch(
    const char* call, absl::Span<const PoolView> from, absl::Span<const PoolView> to,
    absl::Span<const uint32_t> src_pages, absl::Span<const uint32_t> dst_pages) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (from.size() != to.size() || src_pages.size() != dst_pages.size() || from.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": mismatched layer or page lists"));
  }
  for (size_t l = 1; l < from.size(); ++l) {
    if (!SameLayout(from[l].layout, from[0].layout) || !SameLayout(to[l].layout, to[0].layout)) {
      return absl::InvalidArgumentError(absl::StrCat(call, ": page layouts differ between layers"));
    }
  }
  const size_t layers = from.size();
  const size_t n = src_pages.size();
  const size_t table = layers * sizeof(gpu::LayerPools);
  const size_t bytes = table + 2 * n * sizeof(uint32_t);
  KVTIER_ASSIGN_OR_RETURN(void* host, StageHost(bytes));
  auto* pools = static_cast<gpu::LayerPools*>(host);
  for (size_t l = 0; l < layers; ++l) {
    pools[l].src = from[l].base;
    pools[l].dst = to[l].base;
    pools[l].src_k_scale = from[l].k_tensor_scale;
    pools[l].src_v_scale = from[l].v_tensor_scale;
    pools[l].dst_k_scale = to[l].k_tensor_scale;
    pools[l].dst_v_scale = to[l].v_tensor_scale;
  }
  auto* pages = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(host) + table);
  std::memcpy(pages, src_pages.data(), n * sizeof(uint32_t));
  std::memcpy(pages + n, dst_pages.data(), n * sizeof(uint32_t));
  KVTIER_ASSIGN_OR_RETURN(void* device, Upload(bytes));
  PageBatch batch;
  batch.layers = static_cast<const gpu::LayerPools*>(device);
  batch.src_pages = reinterpret_cast<const uint32_t*>(static_cast<uint8_t*>(device) + table);
  batch.dst_pages = batch.src_pages + n;
  return batch;
}

absl::Status CudaBackend::Requantize(absl::Span<const PoolView> from,
                                     absl::Span<const PoolView> to,
                                     absl::Span<const uint32_t> src_pages,
                                     absl::Span<const uint32_t> dst_pages) {
  if (src_pages.empty() && from.size() == to.size() && !from.empty()) return sticky_;
  KVTIER_ASSIGN_OR_RETURN(const PageBatch batch,
                          StagePageBatch("Requantize", from, to, src_pages, dst_pages));
  gpu::RequantizeParams p;
  p.src = from[0].layout;
  p.dst = to[0].layout;
  p.layers = batch.layers;
  p.src_pages = batch.src_pages;
  p.dst_pages = batch.dst_pages;
  p.num_layers = static_cast<int32_t>(from.size());
  p.num_blocks = static_cast<int32_t>(src_pages.size());
  p.fast = fast_;
  p.variant = variant_;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchRequantize(p, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyPage(const PoolView& pool, uint32_t src, uint32_t dst) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  const size_t bytes = pool.layout.page_bytes;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pool.base + dst * bytes, pool.base + src * bytes,
                                              bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

}  // namespace kvtier
