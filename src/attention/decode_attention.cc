#include "src/attention/decode_attention.h"

#if KVTIER_WITH_CUDA
#include "src/cuda/cuda_decode_attention.h"
#endif

namespace kvtier {

absl::Status DecodeAttention(const Cache& cache, int32_t layer, const PageTables& tables,
                             const DecodeQueries& queries, const DecodeOutputs& outputs,
                             const DeviceLaunch& launch) {
  absl::StatusOr<PagedLayer> kv = GetPagedLayer(cache, layer);
  if (!kv.ok()) return kv.status();
  if (cache.options().backend == BackendKind::kCpu) {
    return PagedDecodeAttention(*kv, tables, queries, outputs);
  }
#if KVTIER_WITH_CUDA
  return CudaDecodeAttention(*kv, tables, queries, outputs, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

absl::Status MergeStatesOn(BackendKind backend, absl::Span<const float> out_a,
                           absl::Span<const float> lse_a, absl::Span<const float> out_b,
                           absl::Span<const float> lse_b, int64_t rows, int32_t head_dim,
                           absl::Span<float> out, absl::Span<float> lse,
                           const DeviceLaunch& launch) {
  if (backend == BackendKind::kCpu) {
    return MergeStates(out_a, lse_a, out_b, lse_b, rows, head_dim, out, lse);
  }
#if KVTIER_WITH_CUDA
  return CudaMergeStates(out_a, lse_a, out_b, lse_b, rows, head_dim, out, lse, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

}  // namespace kvtier
