#include "src/cuda/cuda_append_step.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "src/cuda/cuda_status.h"

namespace kvtier {
namespace {

// The buffer: the row count, then the slots, then the pools (each 8-byte aligned).
constexpr size_t kSlotsOffset = sizeof(int64_t);

size_t PoolsOffset(int64_t max_rows) {
  return kSlotsOffset + static_cast<size_t>(max_rows) * sizeof(gpu::RowSlot);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaAppendStep>> CudaAppendStep::Create(const Spec& spec,
                                                                        void* stream) {
  std::unique_ptr<CudaAppendStep> step(new CudaAppendStep(spec, stream));
  const auto s = static_cast<cudaStream_t>(stream);
  int device = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&step->num_sms_, cudaDevAttrMultiProcessorCount, device));
  const size_t bytes =
      PoolsOffset(spec.max_rows) + static_cast<size_t>(spec.num_layers) * sizeof(gpu::AppendPool);
  void* buffer = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&buffer, bytes, s));
  step->buffer_ = static_cast<uint8_t*>(buffer);
  // No slots yet: a launch before the first Overwrite writes nothing.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer, 0, sizeof(int64_t), s));
  if (spec.rotate_keys) {
    const size_t floats = static_cast<size_t>(spec.num_layers) * spec.max_rows *
                          spec.layout.heads * spec.layout.head_dim;
    void* rotated = nullptr;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&rotated, floats * sizeof(float), s));
    step->rotated_ = static_cast<float*>(rotated);
  }
  step->host_.resize(bytes);
  return step;
}

CudaAppendStep::~CudaAppendStep() {
  const auto s = static_cast<cudaStream_t>(stream_);
  if (buffer_ != nullptr) cudaFreeAsync(buffer_, s);
  if (rotated_ != nullptr) cudaFreeAsync(rotated_, s);
}

absl::Status CudaAppendStep::Overwrite(absl::Span<const int64_t> slots,
                                       absl::Span<const gpu::AppendPool> pools) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const int64_t rows = static_cast<int64_t>(slots.size());
  std::memcpy(host_.data(), &rows, sizeof(rows));
  gpu::SplitSlots(slots.data(), slots.size(), static_cast<uint32_t>(spec_.layout.tokens),
                  reinterpret_cast<gpu::RowSlot*>(host_.data() + kSlotsOffset));
  const size_t pools_offset = PoolsOffset(spec_.max_rows);
  std::memcpy(host_.data() + pools_offset, pools.data(), pools.size() * sizeof(gpu::AppendPool));
  // From pageable memory: each copy has taken the host bytes when it returns.
  const size_t head = kSlotsOffset + slots.size() * sizeof(gpu::RowSlot);
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buffer_, host_.data(), head, cudaMemcpyHostToDevice, s));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer_ + pools_offset, host_.data() + pools_offset,
                                              host_.size() - pools_offset,
                                              cudaMemcpyHostToDevice, s));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaAppendStep::Launch(absl::Span<const KVInput> layers,
                                            bool synchronize) const {
  const auto s = static_cast<cudaStream_t>(stream_);
  const PageLayout& l = spec_.layout;
  gpu::WriteLayersParams p;
  p.layout = l;
  p.slots = reinterpret_cast<const gpu::RowSlot*>(buffer_ + kSlotsOffset);
  p.num_rows = reinterpret_cast<const int64_t*>(buffer_);
  p.max_rows = spec_.max_rows;
  p.bf16 = !layers.empty() && layers[0].dtype == DType::kBFloat16;
  p.key_rotation_seed = spec_.key_rotation_seed;
  p.nonfinite = static_cast<unsigned long long*>(spec_.nonfinite);
  p.num_sms = num_sms_;
  const auto* pools = reinterpret_cast<const gpu::AppendPool*>(buffer_ + PoolsOffset(p.max_rows));
  const size_t layer_floats = static_cast<size_t>(p.max_rows) * l.heads * l.head_dim;
  for (size_t first = 0; first < layers.size(); first += gpu::kWriteLayersMax) {
    const size_t n = std::min<size_t>(gpu::kWriteLayersMax, layers.size() - first);
    p.pools = pools + first;
    p.num_layers = static_cast<int32_t>(n);
    p.k_rotated = rotated_ == nullptr ? nullptr : rotated_ + first * layer_floats;
    for (size_t i = 0; i < n; ++i) {
      p.k[i] = layers[first + i].k;
      p.v[i] = layers[first + i].v;
    }
    KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchWriteLayers(p, s));
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(s, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  if (synchronize && !capturing) KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return capturing;
}

}  // namespace kvtier
