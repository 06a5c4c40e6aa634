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
constexpr int kMergeChunk = 256;  // parts whose weights are in shared memory at a time

// Max (kMax) or sum of x over the block's kThreads threads, in every thread.
template <int kThreads, bool kMax>
__device__ __forceinline__ float BlockReduce(float x, float* scratch) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    const float y = __shfl_xor_sync(0xFFFFFFFFu, x, d);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  __syncthreads();  // scratch may still be read from a previous reduction
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

// Parts' partial outputs a thread loads together before it adds any (MergeRow).
constexpr int kMergeLoadsAtOnce = 32;

// x[j] = v[j * stride] for j < n, else 0: a round of loads, all issued before any is used.
__device__ __forceinline__ void LoadRound(const float* v, int64_t stride, int n,
                                          float (&x)[kMergeLoadsAtOnce]) {
#pragma unroll
  for (int j = 0; j < kMergeLoadsAtOnce; ++j) x[j] = j < n ? v[j * stride] : 0.f;
}

// Merges row `row` of p with the block's kThreads threads. Thread j loads the LSEs of parts j,
// j + kThreads, ... once (the first kMergeChunk in registers); their weights exp(s_k - max) go
// to shared memory a chunk at a time, and thread d accumulates dims d, d + kThreads, ... over the
// parts, kMergeLoadsAtOnce partial outputs loaded before the first is added (coalesced reads).
// At batch 1 this merge follows the attention on the critical path: it is bound by its rounds
// of loads (one of LSEs, one of outputs per kMergeLoadsAtOnce parts), not by bytes, so the
// first round of outputs is loaded before the LSEs, and both round trips overlap.
// REQUIRES: every thread of the block calls it.
template <int kThreads>
__device__ __forceinline__ void MergeRow(const MergeStatesParams& p, int64_t row) {
  constexpr int kHeld = kMergeChunk / kThreads;  // LSEs of the first chunk a thread holds
  static_assert(kHeld * kThreads == kMergeChunk, "the first chunk is whole rounds of threads");
  __shared__ float weight[kMergeChunk];
  __shared__ float scratch[kThreads / 32];
  const float* s = p.s + row;
  float first[kMergeLoadsAtOnce];  // dim threadIdx.x of parts 0, 1, ...
  if (static_cast<int>(threadIdx.x) < p.head_dim) {
    LoadRound(p.v + row * p.head_dim + threadIdx.x, p.v_part_stride,
              min(kMergeLoadsAtOnce, p.parts), first);
  }
  float held[kHeld];
  float m = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int k = threadIdx.x + kThreads * j;
    held[j] = k < p.parts ? s[k * p.s_part_stride] : -INFINITY;
    nan |= isnan(held[j]);
    m = fmaxf(m, held[j]);
  }
  for (int k = threadIdx.x + kMergeChunk; k < p.parts; k += kThreads) {
    const float x = s[k * p.s_part_stride];
    nan |= isnan(x);
    m = fmaxf(m, x);
  }
  m = BlockReduce<kThreads, true>(m, scratch);
  nan = __syncthreads_or(nan) || m == INFINITY;  // e^(+inf - +inf) is NaN, as in MergeStates
  const bool live = m != -INFINITY && !nan;
  // The sum of the weights, in each thread's order of parts; the first chunk's weights stay in
  // shared memory (BlockReduce's barrier publishes them).
  float total = 0.f;
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const float w = live ? expf(held[j] - m) : 0.f;  // 0 for parts past the last (-inf)
    weight[threadIdx.x + kThreads * j] = w;
    total += w;
  }
  for (int k = threadIdx.x + kMergeChunk; k < p.parts; k += kThreads) {
    total += live ? expf(s[k * p.s_part_stride] - m) : 0.f;
  }
  total = BlockReduce<kThreads, false>(total, scratch);
  for (int d0 = 0; d0 < p.head_dim; d0 += kThreads) {
    const int d = d0 + threadIdx.x;
    float acc = 0.f;
    for (int base = 0; base < p.parts; base += kMergeChunk) {
      const int n = min(kMergeChunk, p.parts - base);
      // Past the first chunk (or for a second pass over dims with several chunks) the chunk's
      // weights are computed again.
      if (base > 0 || (d0 > 0 && p.parts > kMergeChunk)) {
        __syncthreads();  // the previous chunk's weights have been used
        for (int k = threadIdx.x; k < n; k += kThreads) {
          weight[k] = live ? expf(s[(base + k) * p.s_part_stride] - m) : 0.f;
        }
        __syncthreads();
      }
      if (d < p.head_dim) {
        const float* v = p.v + base * p.v_part_stride + row * p.head_dim + d;
        for (int k0 = 0; k0 < n; k0 += kMergeLoadsAtOnce) {
          float x[kMergeLoadsAtOnce];
          if (d0 == 0 && base == 0 && k0 == 0) {
#pragma unroll
            for (int j = 0; j < kMergeLoadsAtOnce; ++j) x[j] = first[j];
          } else {
            LoadRound(v + k0 * p.v_part_stride, p.v_part_stride, n - k0, x);
          }
#pragma unroll
          for (int j = 0; j < kMergeLoadsAtOnce; ++j) {
            // An empty part (weight 0) may hold anything: it must not reach the sum.
            const float w = k0 + j < n ? weight[k0 + j] : 0.f;
            if (w > 0.f) acc += w * x[j];
          }
        }
      }
    }
    if (d < p.head_dim) p.out[row * p.head_dim + d] = nan ? NAN : total > 0.f ? acc / total : 0.f;
  }
  if (threadIdx.x == 0) p.lse[row] = nan ? NAN : total > 0.f ? m + logf(total) : -INFINITY;
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_MERGE_STATES_CUH_
