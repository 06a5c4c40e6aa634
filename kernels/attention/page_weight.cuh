// The page weights of kvtier's decode kernel (PagedDecodeParams::page_weight, docs/attention.md),
// in two steps: while it attends a page, each warp of PagedDecodeKernel stores the log-sum-exp
// of the page's logits for each query head of its group (StorePageLse); once every head's LSE is
// final, weights blocks turn them into exp(page LSE - LSE) and keep each page's largest over its
// heads: a kernel of their own after a launch that is not split (LaunchPageWeights), blocks
// beside the split merge's in one grid after a split one (LaunchMergeAndPageWeights). The
// split-KV blocks never see a head's final LSE, hence the page LSEs in between.
//
// The page LSEs (log2 units) of a sequence lie KV head by KV head, page by page, each page's
// query heads side by side (PageLseIndex): the pages a block attends are one range that only its
// own warps write, at about the same time. (Entry-major, each 32-byte sector would be shared by
// the blocks of two KV heads, often written far apart in time: a half-written sector that leaves
// L2 costs a DRAM read-modify-write, paid in time by a bandwidth-bound decode.)
#ifndef KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_
#define KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/decode_stages.cuh"
#include "kernels/decode_attention.cuh"

namespace kvtier::gpu {
namespace attention {

// log2(x) by the hardware approximation; -inf for 0 and for subnormals (a page whose sum relative
// to the running maximum is that small weighs under 2^-126: the maximum is at most the LSE).
__device__ __forceinline__ float Log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The index in page_lse of query head h of KV head kv_head's group at page `page` of a sequence
// whose packed entries start at `first_entry` and number `pages`.
__device__ __forceinline__ int64_t PageLseIndex(const PagedDecodeParams& p, int64_t first_entry,
                                                int pages, int kv_head, int page, int h) {
  const int group = p.num_q_heads / p.num_kv_heads;
  return first_entry * p.num_q_heads + (static_cast<int64_t>(kv_head) * pages + page) * group + h;
}

// Where a warp's page LSEs go: lane (g, c) ends StorePageLse with the sum of query head
// 8t + 2c + (g >= 4 ? 1 : 0) of its group, and the lanes g = 0 and g = 4 store it.
struct PageLseStore {
  float* next;  // this lane's head (tile 0) in the warp's next page
  int stride;   // floats from one of the warp's pages to its next
};

__device__ __forceinline__ PageLseStore PageLseStoreOf(const PagedDecodeParams& p,
                                                       const DecodeBlock& k, int first_page) {
  const int head = 2 * k.c + (k.g >= 4 ? 1 : 0);
  return {p.page_lse + PageLseIndex(p, k.first_entry, k.pages, k.kv_head, first_page, head),
          kWarps * k.group};
}

// Stores the page LSE of the warp's next page for each query head of its group, and moves `out`
// to the page after: m_run (the heads' running maxima, equal across a column of lanes) plus log2
// of page_sum (each lane's share of the page's sum relative to m_run, from Probabilities) summed
// over the column. Lane (g, c) holds heads 8t + 2c and 8t + 2c + 1, as StoreWarpState; the
// column's two sums take three shuffles: the lanes g < 4 and g >= 4 first swap halves, so that
// the former end with head 8t + 2c's sum and the latter with head 8t + 2c + 1's.
// REQUIRES: every lane of the warp calls it.
template <int kTiles>
__device__ __forceinline__ void StorePageLse(PageLseStore& out, const DecodeBlock& k,
                                             const float (&m_run)[2 * kTiles],
                                             const float (&page_sum)[2 * kTiles]) {
  const bool odd = k.g >= 4;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const float even_sum = page_sum[2 * t], odd_sum = page_sum[2 * t + 1];
    float sum = (odd ? odd_sum : even_sum) +
                __shfl_xor_sync(0xFFFFFFFFu, odd ? even_sum : odd_sum, 16);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 4);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 8);
    if ((k.g & 3) == 0 && 8 * t + 2 * k.c + (odd ? 1 : 0) < k.group) {
      out.next[8 * t] = (odd ? m_run[2 * t + 1] : m_run[2 * t]) + Log2(sum);
    }
  }
  out.next += out.stride;
}

}  // namespace attention

// Enqueues the kernel that turns p.page_lse and the final p.lse into p.page_weight (max-
// accumulated), for a launch that is not split. REQUIRES: p.page_weight and p.page_lse set;
// num_splits 1, pages_per_split at least every sequence's page count.
cudaError_t LaunchPageWeights(const PagedDecodeParams& p, cudaStream_t stream);

// Enqueues, for a split launch, the merge m of its partial states (as LaunchMergeStates) and,
// in the same grid, the weights blocks, which merge the final LSEs they need from the partial
// ones in p.workspace themselves. REQUIRES: p.page_weight and p.page_lse set; m merges p's
// splits (m.rows = p.batch * p.num_q_heads); num_splits * pages_per_split is at least every
// sequence's page count.
cudaError_t LaunchMergeAndPageWeights(const MergeStatesParams& m, const PagedDecodeParams& p,
                                      cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_
