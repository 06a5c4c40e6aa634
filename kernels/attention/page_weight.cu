// The second step of the decode kernel's page weights (kernels/attention/page_weight.cuh): a
// weights block takes kWeightEntries packed entries of one sequence, lane l entries l, l + 32,
// ... and warp w of its W the KV heads w, w + W, ... (a warp reads a KV head's page LSEs of 32
// pages as one coalesced range, kWeightRounds ranges in flight); each thread keeps the largest
// weight of its heads per entry, and the block reduces them over its warps in shared memory and
// max-accumulates each entry's into page_weight. A wave of blocks covers batch 64 x 32K.
//
// Launch not split: a kernel of weights blocks after the attention, reading the final LSEs. Split
// launch: the weights blocks share one grid with the merge's blocks (one per row), each merging
// the final LSEs of its heads from the splits' partial LSEs itself, so that the weights need no
// launch of their own and do not wait for the merge (at batch 1 each kernel boundary costs
// microseconds: a third kernel cost 4-8% at batch 1 x 128K).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/merge_states.cuh"
#include "kernels/attention/page_weight.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWeightRounds = 4;                    // entries per lane
constexpr int kWeightEntries = 32 * kWeightRounds;  // per block
constexpr int kHeadsAtOnce = 4;                     // query heads whose LSEs a lane loads at once
// Warps of a weights block: of the kernel after a launch that is not split, and of the merge's
// grid (as many as a merge block's).
constexpr int kWeightWarps = 8;
constexpr int kMergeWarps = attention::kMergeThreads / 32;
static_assert(kWeightEntries <= kMergeWarps * 32, "a thread per entry in the block's reduction");
using attention::kLog2e;

// Parts of a split launch whose partial LSEs a lane loads for kHeadsAtOnce rows at once (SplitLses):
// up to 32 * kPartRounds splits are one round trip to memory.
constexpr int kPartRounds = 4;

// x[r][i] = the partial LSE of part k0 + 32 r of row row + i, from the splits' partial LSEs at
// s (row 0's), or -inf for a part past num_splits or a row from `heads` on: a round of loads, all
// issued before any is used.
__device__ __forceinline__ void LoadPartLses(const float* s, int64_t rows, int k0, int num_splits,
                                             int heads, float (&x)[kPartRounds][kHeadsAtOnce]) {
#pragma unroll
  for (int r = 0; r < kPartRounds; ++r) {
#pragma unroll
    for (int i = 0; i < kHeadsAtOnce; ++i) {
      const int k = k0 + 32 * r;
      x[r][i] = k < num_splits && i < heads ? s[k * rows + i] : -INFINITY;
    }
  }
}

// Calls f(i, x) for each of a lane's part LSEs x of row row + i, i < kHeadsAtOnce, at s (row 0's),
// in rounds of LoadPartLses; a part past num_splits, or of a row from `heads` on, comes as -inf.
template <typename F>
__device__ __forceinline__ void ForEachPartLse(const float* s, int64_t rows, int lane,
                                               int num_splits, int heads, F f) {
  for (int k0 = lane; k0 < num_splits; k0 += 32 * kPartRounds) {
    float x[kPartRounds][kHeadsAtOnce];
    LoadPartLses(s, rows, k0, num_splits, heads, x);
#pragma unroll
    for (int r = 0; r < kPartRounds; ++r) {
#pragma unroll
      for (int i = 0; i < kHeadsAtOnce; ++i) f(i, x[r][i]);
    }
  }
}

// v[i] = op over the warp's lanes of v[i], on every lane. REQUIRES: every lane calls it.
template <typename Op>
__device__ __forceinline__ void WarpAllReduce(float (&v)[kHeadsAtOnce], Op op) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
#pragma unroll
    for (int i = 0; i < kHeadsAtOnce; ++i) v[i] = op(v[i], __shfl_xor_sync(0xFFFFFFFFu, v[i], d));
  }
}

// The final LSEs (natural log) of output rows row ... row + kHeadsAtOnce - 1 of a split launch
// (those from `heads` on: NaN), from the splits' partial LSEs, by the merge's rules: NaN for a NaN
// or +inf part, -inf when every part is empty. A lane loads its parts of all the rows before it
// reduces any (a warp-wide max, then a sum of exp(x - max), each lane's parts in order), so that
// the rows share their round trips to memory: at batch 1 the weights blocks' chain of these
// trips, not their bytes, bounds the merge's grid. REQUIRES: every lane of the warp calls it.
__device__ __forceinline__ void SplitLses(const PagedDecodeParams& p, int64_t row, int heads,
                                          int lane, float (&l)[kHeadsAtOnce]) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_q_heads;
  const float* s = p.workspace + static_cast<int64_t>(p.num_splits) * rows * kDecodeHeadDim + row;
  float m[kHeadsAtOnce], total[kHeadsAtOnce];
  bool nan[kHeadsAtOnce];
#pragma unroll
  for (int i = 0; i < kHeadsAtOnce; ++i) m[i] = -INFINITY, total[i] = 0.f, nan[i] = false;
  ForEachPartLse(s, rows, lane, p.num_splits, heads, [&](int i, float x) {
    nan[i] |= isnan(x);
    m[i] = fmaxf(m[i], x);
  });
  WarpAllReduce(m, [](float a, float b) { return fmaxf(a, b); });
  // A part past the last adds exp(-inf) = +0, which leaves each lane's sum as it was.
  ForEachPartLse(s, rows, lane, p.num_splits, heads,
                 [&](int i, float x) { total[i] += expf(x - m[i]); });
  WarpAllReduce(total, [](float a, float b) { return a + b; });
#pragma unroll
  for (int i = 0; i < kHeadsAtOnce; ++i) {
    const bool bad = __any_sync(0xFFFFFFFFu, nan[i]) || m[i] == INFINITY;
    l[i] = i >= heads || bad ? NAN : m[i] == -INFINITY ? -INFINITY : m[i] + logf(total[i]);
  }
}

// The final LSEs of output rows row ... row + kHeadsAtOnce - 1, those from `heads` on NaN (kSplit:
// from the splits' partial LSEs, else from p.lse). REQUIRES: with kSplit, every lane of the warp
// calls it.
template <bool kSplit>
__device__ __forceinline__ void FinalLses(const PagedDecodeParams& p, int64_t row, int heads,
                                          int lane, float (&l)[kHeadsAtOnce]) {
  if constexpr (kSplit) {
    SplitLses(p, row, heads, lane, l);
  } else {
#pragma unroll
    for (int i = 0; i < kHeadsAtOnce; ++i) l[i] = i < heads ? p.lse[row + i] : NAN;
  }
}

// A page's LSEs of kHeadsAtOnce query heads from `at` on; those of heads >= `heads` are never
// used (-inf, or with kQuad the row's padding or a later head, whose final LSE the caller makes
// NaN). kQuad: at is 16-byte aligned and its row holds 4 floats from it (one vector load).
template <bool kQuad, bool kKeptInL2>
__device__ __forceinline__ void LoadPageLses(const float* at, int heads, float x[kHeadsAtOnce]) {
  if constexpr (kQuad) {
    const float4* const v = reinterpret_cast<const float4*>(at);
    const float4 q = kKeptInL2 ? __ldcs(v) : *v;
    x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
  } else {
#pragma unroll
    for (int i = 0; i < kHeadsAtOnce; ++i) {
      x[i] = i >= heads ? -INFINITY : kKeptInL2 ? __ldcs(at + i) : at[i];
    }
  }
}

// The packed entries of sequence b: the first, and how many. Read from the page tables, which
// only copies write, and so before WaitForPriorKernels (dependent_launch.cuh).
__device__ __forceinline__ int2 EntriesOf(const PagedDecodeParams& p, int b) {
  const int first = p.packed_indptr[b];
  return make_int2(first, p.packed_indptr[b + 1] - first);
}

// Weights block x of sequence b, of kWarps warps: entries x * kWeightEntries ... of the KV heads
// kv_first + warp, kv_first + warp + kv_step, ... (kSplit: the final LSEs from the splits'
// partial ones, else from p.lse; kKeptInL2: the page LSEs were stored with PageLse::kKeptInL2,
// and are read as streaming; kQuads: a page's row of LSEs (PageLseRow) is a multiple of 4 floats
// and p.page_lse 16-byte aligned). A lane loads the final LSEs of
// kHeadsAtOnce heads and their page LSEs on each of its pages before it waits for any: the
// loads' latency, not their bytes, bounds this step (a wave of blocks covers batch 64 x 32K).
// `entries`: EntriesOf(p, b). REQUIRES: every thread of the block calls it, after
// WaitForPriorKernels.
template <int kWarps, bool kSplit, bool kKeptInL2, bool kQuads>
__device__ __forceinline__ void WeighEntries(const PagedDecodeParams& p, int x, int b,
                                             int2 entries, int kv_first, int kv_step) {
  __shared__ float warp_weight[kWarps][kWeightEntries];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = entries.x, pages = entries.y;
  const int block_page = x * kWeightEntries;
  if (block_page >= pages) return;  // the whole block
  const int group = p.num_q_heads / p.num_kv_heads, lse_row = attention::PageLseRow(group);
  const int64_t first_row = static_cast<int64_t>(b) * p.num_q_heads;
  // Lane's page of each round; past the sequence's end, its last page (read, never kept), so
  // that every round's load is issued unconditionally.
  int page[kWeightRounds];
#pragma unroll
  for (int r = 0; r < kWeightRounds; ++r) page[r] = min(block_page + lane + 32 * r, pages - 1);
  float weight[kWeightRounds] = {};
  for (int kv = kv_first + warp; kv < p.num_kv_heads; kv += kv_step) {
    for (int h0 = 0; h0 < group; h0 += kHeadsAtOnce) {
      const int64_t row = first_row + kv * group + h0;
      const int heads = group - h0;
      const float* page_lse = p.page_lse + attention::PageLseIndex(p, first, pages, kv, 0, h0);
      float x[kWeightRounds][kHeadsAtOnce];
#pragma unroll
      for (int r = 0; r < kWeightRounds; ++r) {
        LoadPageLses<kQuads, kKeptInL2>(page_lse + static_cast<int64_t>(page[r]) * lse_row, heads,
                                        x[r]);
      }
      float l[kHeadsAtOnce];
      FinalLses<kSplit>(p, row, heads, lane, l);
#pragma unroll
      for (int i = 0; i < kHeadsAtOnce; ++i) {
        // A head whose LSE is not finite (NaN, or -inf: nothing attended) adds nothing.
        if (!isfinite(l[i])) continue;
#pragma unroll
        for (int r = 0; r < kWeightRounds; ++r) {
          weight[r] = fmaxf(weight[r], exp2f(x[r][i] - l[i] * kLog2e));
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kWeightRounds; ++r) warp_weight[warp][lane + 32 * r] = weight[r];
  __syncthreads();
  const int e = threadIdx.x;  // the block's entry this thread reduces
  if (e >= kWeightEntries || block_page + e >= pages) return;
  float most = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) most = fmaxf(most, warp_weight[w][e]);
  most = fminf(most, 1.f);  // rounding may exceed 1 for a page that holds all the weight
  if (most > 0.f) {
    atomicMax(reinterpret_cast<int*>(p.page_weight + first + block_page + e),
              __float_as_int(most));
  }
}

// Launch not split. Block (x, b): weights block x of sequence b.
template <bool kKeptInL2, bool kQuads>
__global__ void __launch_bounds__(kWeightWarps * 32, 8)
    PageWeightKernel(const PagedDecodeParams p) {
  const int2 entries = EntriesOf(p, blockIdx.y);
  WaitForPriorKernels();  // the page LSEs and the final LSEs (LaunchDependent)
  TriggerDependents();
  WeighEntries<kWeightWarps, false, kKeptInL2, kQuads>(p, blockIdx.x, blockIdx.y, entries, 0,
                                                       kWeightWarps);
}

// Split launch. Block i < m.rows merges row i, its first round of outputs loaded early (as the
// plain merge: 3 blocks per SM leave the registers for it without a spill); block m.rows + y *
// x_blocks + x * kv_parts + k is weights block x of sequence y for KV heads k * kMergeWarps ...
// (k * kMergeWarps + kMergeWarps - 1) (kv_parts of them: a warp per KV head).
template <bool kKeptInL2, bool kQuads>
__global__ void __launch_bounds__(kMergeWarps * 32, 3)
    MergeAndWeighKernel(const MergeStatesParams m, const PagedDecodeParams p, int x_blocks,
                        int kv_parts) {
  const int64_t i = blockIdx.x;
  const int w = static_cast<int>(i - m.rows);  // a weights block's index, for i >= m.rows
  const int2 entries = i < m.rows ? int2{} : EntriesOf(p, w / x_blocks);
  WaitForPriorKernels();  // the partial states and the page LSEs (LaunchDependent)
  TriggerDependents();
  if (i < m.rows) {
    attention::MergeRow<attention::kMergeThreads>(m, i);
  } else {
    const int x = w % x_blocks;
    WeighEntries<kMergeWarps, true, kKeptInL2, kQuads>(p, x / kv_parts, w / x_blocks, entries,
                                                       x % kv_parts * kMergeWarps,
                                                       kv_parts * kMergeWarps);
  }
}

// Weights blocks per sequence: enough for num_splits * pages_per_split pages.
int WeightBlocks(const PagedDecodeParams& p) {
  const int64_t most_pages = static_cast<int64_t>(p.num_splits) * p.pages_per_split;
  return static_cast<int>((most_pages + kWeightEntries - 1) / kWeightEntries);
}

// Whether p's weights blocks load a page's LSEs of 4 heads at once (WeighEntries' kQuads).
bool LoadsQuads(const PagedDecodeParams& p) {
  const int row = attention::PageLseRow(p.num_q_heads / p.num_kv_heads);
  return row % kHeadsAtOnce == 0 &&
         reinterpret_cast<uintptr_t>(p.page_lse) % sizeof(float4) == 0;
}

// Every instance of the weights kernels: [kKeptInL2][kQuads].
constexpr decltype(&PageWeightKernel<false, false>) kPageWeightKernels[2][2] = {
    {PageWeightKernel<false, false>, PageWeightKernel<false, true>},
    {PageWeightKernel<true, false>, PageWeightKernel<true, true>}};
constexpr decltype(&MergeAndWeighKernel<false, false>) kMergeAndWeighKernels[2][2] = {
    {MergeAndWeighKernel<false, false>, MergeAndWeighKernel<false, true>},
    {MergeAndWeighKernel<true, false>, MergeAndWeighKernel<true, true>}};

}  // namespace

int64_t PageLseFloats(int64_t entries, int32_t num_q_heads, int32_t num_kv_heads) {
  return entries * num_kv_heads * attention::PageLseRow(num_q_heads / num_kv_heads);
}

bool PageLsesKeptInL2(const PagedDecodeParams& p) {
  for (int f = 0; f < p.num_formats; ++f) {
    const PageLayout& l = p.pools[f].layout;
    if (l.k.type == ElementType::kNvfp4 || l.v.type == ElementType::kNvfp4) return false;
  }
  return true;
}

cudaError_t LaunchPageWeights(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.page_weight == nullptr || p.page_lse == nullptr || p.num_splits != 1) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(WeightBlocks(p)), static_cast<unsigned>(p.batch));
  const auto kernel = kPageWeightKernels[PageLsesKeptInL2(p)][LoadsQuads(p)];
  return LaunchDependent(kernel, grid, dim3(kWeightWarps * 32), 0, stream, p);
}

cudaError_t LaunchMergeAndPageWeights(const MergeStatesParams& m, const PagedDecodeParams& p,
                                      cudaStream_t stream) {
  if (p.page_weight == nullptr || p.page_lse == nullptr || p.num_splits < 2 ||
      p.workspace == nullptr || m.rows != static_cast<int64_t>(p.batch) * p.num_q_heads) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  const int kv_parts = (p.num_kv_heads + kMergeWarps - 1) / kMergeWarps;
  const int x_blocks = WeightBlocks(p) * kv_parts;
  const int64_t blocks = m.rows + static_cast<int64_t>(x_blocks) * p.batch;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  const auto kernel = kMergeAndWeighKernels[PageLsesKeptInL2(p)][LoadsQuads(p)];
  return LaunchDependent(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kMergeWarps * 32), 0,
                         stream, m, p, x_blocks, kv_parts);
}

}  // namespace kvtier::gpu
