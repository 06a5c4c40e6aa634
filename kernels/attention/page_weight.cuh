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
#include "kernels/attention/mma.cuh"
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

// The floats of one (page, KV head)'s row of page LSEs: the GQA group rounded up to even, so
// that a lane stores its two heads' LSEs with one 8-byte store (an odd group's last slot is
// written, never read).
__host__ __device__ constexpr int PageLseRow(int group) { return group + group % 2; }

// The index in page_lse of query head h of KV head kv_head's group at page `page` of a sequence
// whose packed entries start at `first_entry` and number `pages`.
__device__ __forceinline__ int64_t PageLseIndex(const PagedDecodeParams& p, int64_t first_entry,
                                                int pages, int kv_head, int page, int h) {
  const int row = PageLseRow(p.num_q_heads / p.num_kv_heads);
  return (first_entry * p.num_kv_heads + static_cast<int64_t>(kv_head) * pages + page) * row + h;
}

// How a decode launch stores its page LSEs: not at all (no page weights), plainly, or with an L2
// evict_last hint, which the weights blocks answer by reading them as streaming (evict-first).
// Which is faster depends on the palette (PageLsesKeptInL2, kernels/decode_attention.cuh).
enum class PageLse { kNone, kStored, kKeptInL2 };

// Where a warp's page LSEs go. Lane (g, c) holds the running maxima of heads 8t + 2c and
// 8t + 2c + 1 (as StoreWarpState); the lanes g = 0 store those heads' page LSEs, as a pair.
// The position is a 32-bit index into p.page_lse, not a pointer: two registers fewer in a loop
// that runs at the register limit, and one instruction to step it instead of six (64-bit
// pointer arithmetic); and the pair is one 8-byte store (PageLseRow). Measured in
// docs/benchmarks.md, sessions 14 and 15.
template <int kTiles>
struct PageLseStore {
  uint32_t next;            // p.page_lse index of head 2c (tile 0) of the warp's next page
  uint32_t stride;          // floats from one of the warp's pages to its next
  bool stores[kTiles];      // whether this lane stores heads 8t + 2c and 8t + 2c + 1
};

template <int kWarps, int kTiles>
__device__ __forceinline__ PageLseStore<kTiles> PageLseStoreOf(const PagedDecodeParams& p,
                                                               const DecodeBlock& k,
                                                               int first_page) {
  PageLseStore<kTiles> out;
  out.next = static_cast<uint32_t>(
      PageLseIndex(p, k.first_entry, k.pages, k.kv_head, first_page, 2 * k.c));
  out.stride = kWarps * PageLseRow(k.group);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) out.stores[t] = k.g == 0 && 8 * t + 2 * k.c < k.group;
  return out;
}

// Stores two floats, marked for L2 to keep over other lines (evict_last): the weights blocks
// read them back soon, and so they need not reach memory in between, where a decode reads at
// its roof. REQUIRES: `at` is 8-byte aligned.
__device__ __forceinline__ void StoreKeptInL2(float2* at, float2 x) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(at), "f"(x.x),
               "f"(x.y), "l"(policy)
               : "memory");
}

// Stores the page LSEs of the warp's page for each query head of its group, from pair_sums
// (Probabilities: the lanes' pair sums of the page's probabilities without V scales, relative
// to m_run, transposed), as kPageLse says (kStored or kKeptInL2), and moves `out` to the warp's
// page after. A page's LSE is m_run plus log2 of the page's sum, which one product of a matrix
// of ones and pair_sums puts in every lane, for the heads of its m_run (no shuffles). Summing
// token pairs before the transpose takes one transpose and one product a page, not two of each.
// REQUIRES: every lane of the warp calls it.
template <int kTiles, PageLse kPageLse>
__device__ __forceinline__ void StorePageLse(const PagedDecodeParams& p,
                                             PageLseStore<kTiles>& out,
                                             const float (&m_run)[2 * kTiles],
                                             const uint32_t (&pair_sums)[kTiles]) {
  // Rows g of a matrix of ones; rows g + 8, whose products are never read, whatever a register
  // holds (an undefined value: no instruction to set it).
  uint32_t unread;
  asm("" : "=r"(unread));
  const uint32_t ones[2] = {0x3C003C00u, unread};  // two FP16 ones
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    float sum[4] = {0.f, 0.f, 0.f, 0.f};  // rows g (and g + 8) of (sums over tokens) x heads
    Mma(sum, ones, pair_sums[t]);         // k = 8 token pairs
    if (out.stores[t]) {  // heads 8t + 2c and 8t + 2c + 1: an even index (PageLseRow)
      float2* const at = reinterpret_cast<float2*>(p.page_lse + out.next + 8 * t);
      const float2 lse = make_float2(m_run[2 * t] + Log2(sum[0]), m_run[2 * t + 1] + Log2(sum[1]));
      if constexpr (kPageLse == PageLse::kKeptInL2) {
        StoreKeptInL2(at, lse);
      } else {
        *at = lse;
      }
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
