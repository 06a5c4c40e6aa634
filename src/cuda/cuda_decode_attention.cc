#include "src/cuda/cuda_decode_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/attention/logits.cuh"
#include "kernels/data_plane.cuh"
#include "kernels/decode_attention.cuh"
#include "src/cuda/cuda_status.h"

namespace kvtier {
namespace {

// `count` T (at least one) from the stream-ordered allocator.
template <typename T>
absl::StatusOr<T*> AllocateOn(cudaStream_t stream, size_t count) {
  void* p = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, std::max<size_t>(count, 1) * sizeof(T), stream));
  return static_cast<T*>(p);
}

// Stream-ordered device buffers of one call, freed on the stream when it ends (the stream-
// ordered allocator keeps the memory pooled, so steady-state calls do not reach the driver).
class StreamBuffers {
 public:
  explicit StreamBuffers(cudaStream_t stream) : stream_(stream) {}
  ~StreamBuffers() {
    for (void* p : owned_) cudaFreeAsync(p, stream_);
  }
  template <typename T>
  absl::StatusOr<T*> Allocate(size_t count) {
    KVTIER_ASSIGN_OR_RETURN(T * p, AllocateOn<T>(stream_, count));
    owned_.push_back(p);
    return p;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> owned_;
};

absl::Status Finish(cudaStream_t stream, const DeviceLaunch& launch) {
  if (launch.synchronize) KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

// CheckDecodeCall, and what the fused kernel reads (InvalidArgument with the reason otherwise).
absl::Status CheckFusedCall(const PagedLayer& kv, const TableExtent& extent,
                            const DecodeQueries& queries, const DecodeOutputs& outputs) {
  KVTIER_RETURN_IF_ERROR(CheckDecodeCall(kv, extent, queries, outputs));
  const int32_t group = queries.num_q_heads / kv.num_kv_heads;
  if (kv.head_dim != gpu::kDecodeHeadDim || kv.block_tokens != gpu::kDecodeBlockTokens ||
      group > gpu::kDecodeMaxGroup) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the fused decode kernel reads head_dim ", gpu::kDecodeHeadDim, ", pages of ",
        gpu::kDecodeBlockTokens, " tokens and GQA groups up to ", gpu::kDecodeMaxGroup,
        "; this cache has head_dim ", kv.head_dim, ", ", kv.block_tokens,
        "-token pages and the queries a group of ", group));
  }
  if (extent.batch > gpu::kDecodeMaxBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", extent.batch, " sequences; the fused decode kernel attends at ",
                     "most ", gpu::kDecodeMaxBatch, " per call"));
  }
  if (kv.formats.size() > static_cast<size_t>(gpu::kDecodeMaxFormats)) {
    return absl::InvalidArgumentError(absl::StrCat("a palette of ", kv.formats.size(),
                                                   " formats; the packed table names at most ",
                                                   gpu::kDecodeMaxFormats));
  }
  for (size_t f = 0; f < kv.formats.size(); ++f) {
    const PageLayout& layout = kv.formats[f].layout;
    if (layout.k.type == ElementType::kBf16 || layout.v.type == ElementType::kBf16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "palette format ", f, " stores BF16, which the fused decode kernel does not read "
          "(use an FP16 hot format)"));
    }
  }
  return absl::OkStatus();
}

// The queries the kernels read, for a cache with rotated keys (stored as R_h k) when the logits
// kernel is launched too: R_h q in a buffer of `buffers` (kernels/rotate.cu). (Without logits
// the fused kernel rotates the queries as it loads them: PagedDecodeParams::rotate_queries.)
absl::StatusOr<const float*> RotatedQueries(const PagedLayer& kv, const DecodeQueries& queries,
                                            cudaStream_t stream, StreamBuffers* buffers) {
  KVTIER_ASSIGN_OR_RETURN(float* rotated, buffers->Allocate<float>(queries.q.size()));
  gpu::RotateRowsParams r;
  r.in = queries.q.data();
  r.in_type = gpu::RotateInput::kFp32;
  r.out = rotated;
  r.num_rows = static_cast<int64_t>(queries.q.size()) / kv.head_dim;
  r.head_dim = kv.head_dim;
  r.heads = queries.num_q_heads;
  r.group = queries.num_q_heads / kv.num_kv_heads;
  r.seed = kv.key_rotation_seed;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchRotateRows(r, stream));
  return static_cast<const float*>(rotated);
}

// The logits kernel's parameters for the fused launch `p` (its pools, tables and queries).
gpu::DecodeLogitsParams LogitsParams(const gpu::PagedDecodeParams& p, const PagedLayer& kv,
                                     const DecodeOutputs& outputs) {
  gpu::DecodeLogitsParams l;
  for (int f = 0; f < p.num_formats; ++f) l.pools[f] = p.pools[f];
  l.num_formats = p.num_formats;
  l.packed_indptr = p.packed_indptr;
  l.packed = p.packed;
  l.seq_lens = p.seq_lens;
  l.batch = p.batch;
  l.num_q_heads = p.num_q_heads;
  l.num_kv_heads = p.num_kv_heads;
  l.head_dim = kv.head_dim;
  l.block_tokens = kv.block_tokens;
  l.softmax_scale = p.softmax_scale;
  l.q = p.q;
  l.logits = outputs.logits.data();
  l.logits_stride = outputs.logits_stride;
  return l;
}

// Launches the fused kernel over device tables, then the logits kernel when outputs.logits is
// set. REQUIRES: CheckFusedCall is OK.
absl::Status LaunchFused(const PagedLayer& kv, const CudaDecodeTables& tables,
                         const TableExtent& extent, const DecodeQueries& queries,
                         const DecodeOutputs& outputs, const DeviceLaunch& launch) {
  gpu::PagedDecodeParams p;
  for (size_t f = 0; f < kv.formats.size(); ++f) {
    const PagedLayer::Format& format = kv.formats[f];
    p.pools[f] = {format.base, format.layout, format.k_tensor_scale, format.v_tensor_scale};
  }
  p.num_formats = static_cast<int32_t>(kv.formats.size());
  // From entries_of alone, which a PreparedDecode keeps from its first tables (TableExtent), not
  // the current entries: its launches then agree.
  p.stage_fp16 = gpu::FavoursStagedFp16(p, extent.entries_of.data());
  const int32_t batch = static_cast<int32_t>(extent.batch);
  int device = 0, sms = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  p.batch = batch;
  p.num_q_heads = queries.num_q_heads;
  p.num_kv_heads = kv.num_kv_heads;
  gpu::DecodeSplit split;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::ChooseDecodeSplit(p, extent.max_pages, sms, &split));

  const auto stream = static_cast<cudaStream_t>(launch.stream);
  StreamBuffers buffers(stream);
  p.packed_indptr = tables.packed_indptr();
  p.packed = tables.packed();
  p.seq_lens = tables.seq_lens();
  p.softmax_scale = queries.softmax_scale;
  p.q = queries.q.data();
  if (kv.rotate_keys && outputs.logits.empty()) {
    p.rotate_queries = true;
    p.key_rotation_seed = kv.key_rotation_seed;
  } else if (kv.rotate_keys) {
    KVTIER_ASSIGN_OR_RETURN(p.q, RotatedQueries(kv, queries, stream, &buffers));
  }
  p.out = outputs.out.data();
  p.lse = outputs.lse.data();
  p.num_splits = split.num_splits;
  p.pages_per_split = split.pages_per_split;
  p.warps_per_block = split.warps_per_block;
  const int64_t workspace =
      gpu::DecodeWorkspaceFloats(batch, queries.num_q_heads, split.num_splits);
  if (workspace > 0) {
    KVTIER_ASSIGN_OR_RETURN(p.workspace, buffers.Allocate<float>(static_cast<size_t>(workspace)));
  }
  if (!outputs.page_weight.empty()) {
    // Sized for the tables' capacity, so that a captured call replays over grown tables; per
    // call (stream-ordered, capturable), so that calls on several streams never share it.
    const int64_t page_lse = gpu::PageLseFloats(static_cast<int64_t>(tables.packed_capacity()),
                                                queries.num_q_heads, kv.num_kv_heads);
    if (page_lse > int64_t{UINT32_MAX}) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page weights over ", tables.packed_capacity(), " packed entries x ",
          queries.num_q_heads, " query heads need ", page_lse,
          " page LSEs: the kernel indexes at most 2^32 - 1"));
    }
    KVTIER_ASSIGN_OR_RETURN(p.page_lse, buffers.Allocate<float>(static_cast<size_t>(page_lse)));
    p.page_weight = outputs.page_weight.data();
  }
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchPagedDecode(p, stream));
  if (!outputs.logits.empty()) {
    KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchDecodeLogits(LogitsParams(p, kv, outputs), stream));
  }
  return Finish(stream, launch);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDecodeTables>> CudaDecodeTables::Upload(
    const PageTables& tables, void* stream, bool any_stream, size_t packed_capacity) {
  std::unique_ptr<CudaDecodeTables> d(new CudaDecodeTables(stream));
  const auto s = static_cast<cudaStream_t>(stream);
  d->packed_capacity_ = std::max(packed_capacity, tables.packed.size());
  KVTIER_ASSIGN_OR_RETURN(d->indptr_, AllocateOn<int32_t>(s, tables.packed_indptr.size()));
  KVTIER_ASSIGN_OR_RETURN(d->packed_, AllocateOn<uint32_t>(s, d->packed_capacity_));
  KVTIER_ASSIGN_OR_RETURN(d->seq_lens_, AllocateOn<int32_t>(s, tables.seq_lens.size()));
  KVTIER_RETURN_IF_ERROR(d->CopyIn(tables));
  if (any_stream) {
    cudaEvent_t uploaded = nullptr;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
    d->uploaded_ = uploaded;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded, s));
  }
  return d;
}

absl::Status CudaDecodeTables::CopyIn(const PageTables& tables) {
  const auto s = static_cast<cudaStream_t>(stream_);
  const auto copy = [s](const auto& host, auto* device) -> absl::Status {
    using T = typename std::decay_t<decltype(host)>::value_type;
    if (host.empty()) return absl::OkStatus();
    return CudaStatus(
        cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync");
  };
  KVTIER_RETURN_IF_ERROR(copy(tables.packed_indptr, indptr_));
  KVTIER_RETURN_IF_ERROR(copy(tables.packed, packed_));
  return copy(tables.seq_lens, seq_lens_);
}

absl::Status CudaDecodeTables::Overwrite(const PageTables& tables) {
  const auto s = static_cast<cudaStream_t>(stream_);
  {
    MutexLock lock(&mu_);
    for (const Reader& r : readers_) {
      KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(r.done), 0));
    }
  }
  KVTIER_RETURN_IF_ERROR(CopyIn(tables));
  if (uploaded_ != nullptr) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(uploaded_), s));
  }
  return absl::OkStatus();
}

CudaDecodeTables::~CudaDecodeTables() {
  const auto s = static_cast<cudaStream_t>(stream_);
  if (lost_reader_.load()) cudaDeviceSynchronize();
  {
    MutexLock lock(&mu_);
    for (const Reader& r : readers_) {
      cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(r.done), 0);
      cudaEventDestroy(static_cast<cudaEvent_t>(r.done));  // released once it has completed
    }
  }
  if (uploaded_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(uploaded_));
  for (void* p : {static_cast<void*>(indptr_), static_cast<void*>(packed_),
                  static_cast<void*>(seq_lens_)}) {
    if (p != nullptr) cudaFreeAsync(p, s);
  }
}

absl::StatusOr<void*> CudaDecodeTables::ReaderEvent(void* stream) const {
  MutexLock lock(&mu_);
  for (const Reader& r : readers_) {
    if (r.stream == stream) return r.done;
  }
  cudaEvent_t done = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  readers_.push_back({stream, done});
  return static_cast<void*>(done);
}

absl::Status CudaDecodeTables::Read(void* stream,
                                    absl::FunctionRef<absl::Status()> enqueue) const {
  if (stream == stream_) return enqueue();  // in stream order with the upload and the free
  const auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(s, &capture));
  if (capture != cudaStreamCaptureStatusNone) return enqueue();
  if (uploaded_ == nullptr) {
    return absl::InternalError("device page tables uploaded for one stream read on another");
  }
  KVTIER_ASSIGN_OR_RETURN(void* done, ReaderEvent(stream));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(uploaded_), 0));
  const absl::Status enqueued = enqueue();
  const cudaError_t recorded = cudaEventRecord(static_cast<cudaEvent_t>(done), s);
  if (recorded != cudaSuccess) lost_reader_.store(true);
  KVTIER_RETURN_IF_ERROR(enqueued);
  return CudaStatus(recorded, "cudaEventRecord");
}

absl::Status CudaDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                 const DecodeQueries& queries, const DecodeOutputs& outputs,
                                 const DeviceLaunch& launch) {
  KVTIER_ASSIGN_OR_RETURN(const TableExtent extent,
                          CheckPageTables(tables, kv.block_tokens, kv.formats.size()));
  KVTIER_RETURN_IF_ERROR(CheckFusedCall(kv, extent, queries, outputs));
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<CudaDecodeTables> device,
                          CudaDecodeTables::Upload(tables, launch.stream, /*any_stream=*/false, 0));
  return LaunchFused(kv, *device, extent, queries, outputs, launch);
}

absl::Status CudaDecodeAttention(const PagedLayer& kv, const CudaDecodeTables& tables,
                                 const TableExtent& extent, const DecodeQueries& queries,
                                 const DecodeOutputs& outputs, const DeviceLaunch& launch) {
  KVTIER_RETURN_IF_ERROR(CheckFusedCall(kv, extent, queries, outputs));
  return tables.Read(launch.stream, [&] {
    return LaunchFused(kv, tables, extent, queries, outputs, launch);
  });
}

absl::Status CudaMergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                             absl::Span<const float> out_b, absl::Span<const float> lse_b,
                             int64_t rows, int32_t head_dim, absl::Span<float> out,
                             absl::Span<float> lse, const DeviceLaunch& launch) {
  KVTIER_RETURN_IF_ERROR(ValidateMergeStates(out_a.size(), lse_a.size(), out_b.size(),
                                             lse_b.size(), rows, head_dim, out.size(), lse.size()));
  const size_t n = static_cast<size_t>(rows);
  const size_t nd = n * static_cast<size_t>(head_dim);
  // The kernel reads parts at one stride: gather both into one buffer.
  const auto stream = static_cast<cudaStream_t>(launch.stream);
  StreamBuffers buffers(stream);
  KVTIER_ASSIGN_OR_RETURN(float* parts, buffers.Allocate<float>(2 * (nd + n)));
  float* v = parts;
  float* s = parts + 2 * nd;
  const auto copy = [&](float* dst, absl::Span<const float> src) {
    return cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(float), cudaMemcpyDeviceToDevice,
                           stream);
  };
  if (n > 0) {
    KVTIER_CUDA_RETURN_IF_ERROR(copy(v, out_a));
    KVTIER_CUDA_RETURN_IF_ERROR(copy(v + nd, out_b));
    KVTIER_CUDA_RETURN_IF_ERROR(copy(s, lse_a));
    KVTIER_CUDA_RETURN_IF_ERROR(copy(s + n, lse_b));
  }
  gpu::MergeStatesParams p;
  p.v = v;
  p.s = s;
  p.v_part_stride = static_cast<int64_t>(nd);
  p.s_part_stride = static_cast<int64_t>(n);
  p.parts = 2;
  p.rows = rows;
  p.head_dim = head_dim;
  p.out = out.data();
  p.lse = lse.data();
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchMergeStates(p, stream));
  return Finish(stream, launch);
}

}  // namespace kvtier
