// The page weights of kvtier's decode kernel (PagedDecodeParams::page_weight, docs/attention.md),
// in two steps: while it attends a page, each warp of PagedDecodeKernel stores the log-sum-exp
// of the page's logits for each query head of its group (StorePageLse); once every head's LSE is
// final (after the split merge), LaunchPageWeights turns them into exp(page LSE - LSE) and keeps
// each page's largest over its heads. The split-KV blocks never see a head's final LSE, hence
// the page LSEs in between.
#ifndef KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_
#define KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/decode_stages.cuh"
#include "kernels/decode_attention.cuh"

namespace kvtier::gpu {
namespace attention {

// log2(x) by the hardware approximation (-inf for 0).
__device__ __forceinline__ float Log2(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Stores the page LSE (log2 units) of the warp's page `page` of the block's sequence for each
// query head of its group: m_run (the heads' running maxima, equal across a column of lanes)
// plus log2 of page_sum (each lane's share of the page's sum relative to m_run, from
// Probabilities) summed over the column. Lane (g, c) holds heads 8t + 2c (+1), as StoreWarpState.
// REQUIRES: p.page_lse; every lane of the warp calls it.
template <int kTiles>
__device__ __forceinline__ void StorePageLse(const PagedDecodeParams& p, const DecodeBlock& k,
                                             int page, const float (&m_run)[2 * kTiles],
                                             const float (&page_sum)[2 * kTiles]) {
  float* row = p.page_lse + (static_cast<int64_t>(k.first_entry) + page) * p.num_q_heads +
               k.kv_head * k.group;
#pragma unroll
  for (int h = 0; h < 2 * kTiles; ++h) {
    const float sum = ReduceOverG<false>(page_sum[h]);
    const int head = 8 * (h / 2) + 2 * k.c + h % 2;
    if (k.g == 0 && head < k.group) row[head] = m_run[h] + Log2(sum);
  }
}

}  // namespace attention

// Enqueues the kernel that turns p.page_lse and the final p.lse into p.page_weight (max-
// accumulated). REQUIRES: p.page_weight and p.page_lse set; num_splits * pages_per_split is at
// least every sequence's page count.
cudaError_t LaunchPageWeights(const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_
