// The page weights of kvtier's decode kernel (PagedDecodeParams::page_weight, docs/attention.md),
// in two steps: while it attends a page, each warp of PagedDecodeKernel stores the log-sum-exp
// of the page's logits for each query head of its group (StorePageLse); once a head's LSE is
// final, the page's weight for it is exp(page LSE - LSE), and each page keeps its largest over
// the heads (WeighPages). Where the LSE becomes final does that second step: the attention
// kernel's epilogue for a launch that is not split (StorePageWeights: the block attended every
// page of its KV head), the split merge's kernel, row by row, for a split one (page_weight.cu).
// So no launch of its own: at batch 1 a kernel more in the step cost more than the work.
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

// The index in page_lse of query head h of KV head kv_head's group (`group` heads of
// num_q_heads) at page `page` of a sequence whose packed entries start at `first_entry` and
// number `pages`.
__host__ __device__ __forceinline__ int64_t PageLseIndex(int num_q_heads, int group,
                                                         int64_t first_entry, int pages,
                                                         int kv_head, int page, int h) {
  return first_entry * num_q_heads + (static_cast<int64_t>(kv_head) * pages + page) * group + h;
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
  return {p.page_lse + PageLseIndex(p.num_q_heads, k.group, k.first_entry, k.pages, k.kv_head,
                                    first_page, head),
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

constexpr int kWeighBatch = 16;  // pages per thread whose loads are in flight together

// Max-accumulates into page_weight[page], by atomicMax on the bits (non-negative floats order as
// integers), for every page < pages, the largest
// exp2(lse[page * stride + h] - head_lse2[h]) over the heads h < heads whose head_lse2 is finite
// (NaN, or -inf: nothing attended, adds nothing). Thread t of the block's kBlockThreads takes
// pages (start + t + n kBlockThreads) mod pages, kWeighBatch at a time, each batch's loads issued
// before its atomics (they may alias, so the compiler would not reorder them); the blocks that
// weigh one sequence start at different pages, so that their atomics meet on few cache lines.
template <int kBlockThreads>
__device__ __forceinline__ void WeighPages(const float* lse, int stride, int heads,
                                           const float* head_lse2, int pages, int start,
                                           float* page_weight) {
  for (int base = threadIdx.x; base < pages; base += kWeighBatch * kBlockThreads) {
    int page[kWeighBatch];
    float most[kWeighBatch];
#pragma unroll
    for (int j = 0; j < kWeighBatch; ++j) {
      const int i = base + j * kBlockThreads + start;
      page[j] = i < pages ? i : i - pages;
      most[j] = 0.f;
    }
    for (int h = 0; h < heads; ++h) {
      const float l = head_lse2[h];
      if (!isfinite(l)) continue;
#pragma unroll
      for (int j = 0; j < kWeighBatch; ++j) {
        if (base + j * kBlockThreads < pages) {
          most[j] = fmaxf(most[j], exp2f(lse[static_cast<int64_t>(page[j]) * stride + h] - l));
        }
      }
    }
    // Atomics only where the weight grows: a read (which may be stale, never too large: the
    // weights only grow) costs far less than an atomic, of which the H200 retired about 14 per
    // ns; a page weighs at most 1 (rounding may exceed it for a page that holds all the weight).
    float now[kWeighBatch];
#pragma unroll
    for (int j = 0; j < kWeighBatch; ++j) {
      now[j] = base + j * kBlockThreads < pages ? page_weight[page[j]] : 1.f;
    }
#pragma unroll
    for (int j = 0; j < kWeighBatch; ++j) {
      const float w = fminf(most[j], 1.f);
      if (w > now[j]) atomicMax(reinterpret_cast<int*>(page_weight + page[j]), __float_as_int(w));
    }
  }
}

// The epilogue of a launch that is not split: the block's pages (the sequence's), weighed over
// its group's heads. row_lse2: the heads' final LSEs, log2 units. REQUIRES: every page LSE of
// the block stored, and the block synchronized since.
__device__ __forceinline__ void StorePageWeights(const PagedDecodeParams& p, const DecodeBlock& k,
                                                 const float* row_lse2) {
  const int pages = k.page_end - k.page_begin;
  WeighPages<kThreads>(p.page_lse + PageLseIndex(p.num_q_heads, k.group, k.first_entry, k.pages,
                                                 k.kv_head, k.page_begin, 0),
                       k.group, k.group, row_lse2, pages, k.kv_head * pages / p.num_kv_heads,
                       p.page_weight + k.first_entry + k.page_begin);
}

}  // namespace attention

// Enqueues the merge of a split launch's partial states m (LaunchMergeStates) that also max-
// accumulates, once each row's LSE is final, its page weights into p.page_weight. REQUIRES:
// p.page_weight and p.page_lse set; m merges p's splits.
cudaError_t LaunchSplitMergeWithPageWeights(const MergeStatesParams& m,
                                            const PagedDecodeParams& p, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_ATTENTION_PAGE_WEIGHT_CUH_
