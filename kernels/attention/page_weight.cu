// The page weights of a split decode launch (kernels/attention/page_weight.cuh), in the split
// merge: once row (sequence b, query head q) has its final LSE, the merge block weighs b's pages
// for q alone (WeighPages), starting at a page of its own.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/merge_states.cuh"
#include "kernels/attention/page_weight.cuh"
#include "kernels/decode_attention.cuh"

namespace kvtier::gpu {
namespace {

struct PageWeightTail {
  const int32_t* packed_indptr;
  const float* page_lse;
  float* page_weight;
  int32_t num_q_heads, group;

  // REQUIRES: row's sequence's page LSEs stored (the attention kernel has completed).
  __device__ __forceinline__ void operator()(int64_t row, float lse) const {
    if (!isfinite(lse)) return;  // NaN, or -inf: nothing attended, adds nothing
    const int b = static_cast<int>(row / num_q_heads), q = static_cast<int>(row % num_q_heads);
    const int first = packed_indptr[b], pages = packed_indptr[b + 1] - first;
    const float lse2 = lse * attention::kLog2e;
    const int kv = q / group, h = q % group;
    attention::WeighPages<attention::kMergeThreads>(
        page_lse + attention::PageLseIndex(num_q_heads, group, first, pages, kv, 0, h), group, 1,
        &lse2, pages, static_cast<int>(static_cast<int64_t>(q) * pages / num_q_heads),
        page_weight + first);
  }
};

}  // namespace

int64_t PageLseFloats(int64_t entries, int32_t num_q_heads) {
  return entries * num_q_heads;
}

cudaError_t LaunchSplitMergeWithPageWeights(const MergeStatesParams& m,
                                            const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.page_weight == nullptr || p.page_lse == nullptr) return cudaErrorInvalidValue;
  const int32_t group = p.num_q_heads / p.num_kv_heads;
  return attention::LaunchMergeStatesWith(
      m, PageWeightTail{p.packed_indptr, p.page_lse, p.page_weight, p.num_q_heads, group}, stream);
}

}  // namespace kvtier::gpu
