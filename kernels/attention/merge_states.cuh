// The LSE merge of partial attention states on the GPU, one block per row (contract in
// kernels/decode_attention.cuh): the body that MergeStatesKernel (merge_states.cu) runs, and
// that the split merge of a decode launch with page weights shares its grid with
// (page_weight.cu).
#ifndef KVTIER_KERNELS_ATTENTION_MERGE_STATES_CUH_
#define KVTIER_KERNELS_ATTENTION_MERGE_STATES_CUH_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/decode_attention.cuh"

namespace kvtier::gpu::attention {

// Threads of a merge block. MergeStatesKernel and the split merge with page weights
// (page_weight.cu) both merge rows with this many, so that their outputs have the same bits.
constexpr int kMergeThreads = 128;

// Max (kMax) or sum of x over the warp's 32 lanes, in every lane.
template <bool kMax>
__device__ __forceinline__ float WarpReduce(float x) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    const float y = __shfl_xor_sync(0xFFFFFFFFu, x, d);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  return x;
}

// Parts' partial outputs a thread loads together before it adds any (MergeRow): one per lane
// of a warp, whose lanes hold their weights.
constexpr int kMergeLoadsAtOnce = 32;
static_assert(kMergeLoadsAtOnce == 32, "MergeRow broadcasts load j's weight from lane j");

// x[j] = v[j * stride] for j < n, else 0: a round of loads, all issued before any is used.
__device__ __forceinline__ void LoadRound(const float* v, int64_t stride, int n,
                                          float (&x)[kMergeLoadsAtOnce]) {
#pragma unroll
  for (int j = 0; j < kMergeLoadsAtOnce; ++j) x[j] = j < n ? v[j * stride] : 0.f;
}

// Merges row `row` of p with the block's kThreads threads, without a barrier: each warp reduces
// the row's LSEs itself (lane k loads parts k, k + 32, ...: the maximum and the sum of the
// weights exp(s_k - max) by shuffles), and thread d accumulates dims d, d + kThreads, ... over
// the parts a round of kMergeLoadsAtOnce at a time, part k's weight broadcast from the lane that
// computed it. At batch 1 this merge follows the attention on the critical path, bound by its
// dependent steps rather than its bytes: the first round of outputs is loaded before the LSEs,
// so that with at most kMergeLoadsAtOnce parts (the decode's split rule) the merge makes one
// round trip to memory, and no step waits for another warp (without the block-wide reductions'
// barriers and shared memory, batch 1 ran 0.4-1.6% faster; docs/benchmarks.md, session 38).
// REQUIRES: every thread of the block calls it.
template <int kThreads>
__device__ __forceinline__ void MergeRow(const MergeStatesParams& p, int64_t row) {
  static_assert(kThreads % 32 == 0, "whole warps");
  const int lane = threadIdx.x % 32;
  const float* s = p.s + row;
  float first[kMergeLoadsAtOnce];  // dim threadIdx.x of parts 0, 1, ...
  LoadRound(p.v + row * p.head_dim + threadIdx.x, p.v_part_stride,
            static_cast<int>(threadIdx.x) < p.head_dim ? min(kMergeLoadsAtOnce, p.parts) : 0,
            first);
  const float own = lane < p.parts ? s[lane * p.s_part_stride] : -INFINITY;  // part `lane`
  float m = own;
  bool nan = isnan(own);
  for (int k = lane + 32; k < p.parts; k += 32) {
    const float x = s[k * p.s_part_stride];
    nan |= isnan(x);
    m = fmaxf(m, x);
  }
  m = WarpReduce<true>(m);
  nan = __any_sync(0xFFFFFFFFu, nan) || m == INFINITY;  // e^(+inf - +inf) is NaN, as MergeStates
  const bool live = m != -INFINITY && !nan;
  // Part k's weight, in lane k % 32; 0 for parts past the last (LSE -inf).
  const auto weight = [&](float lse) { return live ? expf(lse - m) : 0.f; };
  const float own_weight = weight(own);
  float total = own_weight;
  for (int k = lane + 32; k < p.parts; k += 32) total += weight(s[k * p.s_part_stride]);
  total = WarpReduce<false>(total);
  for (int d0 = 0; d0 < p.head_dim; d0 += kThreads) {
    const int d = d0 + threadIdx.x;
    const float* v = p.v + row * p.head_dim + d;
    float acc = 0.f;
    for (int base = 0; base < p.parts; base += kMergeLoadsAtOnce) {
      const int n = min(kMergeLoadsAtOnce, p.parts - base);
      float x[kMergeLoadsAtOnce];
      float w_lane = own_weight;
      if (d0 == 0 && base == 0) {
#pragma unroll
        for (int j = 0; j < kMergeLoadsAtOnce; ++j) x[j] = first[j];
      } else {
        LoadRound(v + base * p.v_part_stride, p.v_part_stride, d < p.head_dim ? n : 0, x);
        if (base > 0) w_lane = lane < n ? weight(s[(base + lane) * p.s_part_stride]) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kMergeLoadsAtOnce; ++j) {
        // An empty part (weight 0) may hold anything: it must not reach the sum.
        const float w = __shfl_sync(0xFFFFFFFFu, w_lane, j);
        if (w > 0.f) acc += w * x[j];
      }
    }
    if (d < p.head_dim) p.out[row * p.head_dim + d] = nan ? NAN : total > 0.f ? acc / total : 0.f;
  }
  if (threadIdx.x == 0) p.lse[row] = nan ? NAN : total > 0.f ? m + logf(total) : -INFINITY;
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_MERGE_STATES_CUH_
