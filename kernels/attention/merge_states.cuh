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

// Merges row `row` of p with the block's kThreads threads: the parts' weights exp(s_k - max) go
// to shared memory a chunk at a time, and thread d accumulates dims d, d + kThreads, ... over
// the parts (coalesced reads). REQUIRES: every thread of the block calls it.
template <int kThreads>
__device__ __forceinline__ void MergeRow(const MergeStatesParams& p, int64_t row) {
  __shared__ float weight[kMergeChunk];
  __shared__ float scratch[kThreads / 32];
  float m = -INFINITY;
  bool nan = false;
  for (int k = threadIdx.x; k < p.parts; k += kThreads) {
    const float s = p.s[k * p.s_part_stride + row];
    nan |= isnan(s);
    m = fmaxf(m, s);
  }
  m = BlockReduce<kThreads, true>(m, scratch);
  nan = __syncthreads_or(nan) || m == INFINITY;  // e^(+inf - +inf) is NaN, as in MergeStates
  const bool live = m != -INFINITY && !nan;
  float total = 0.f;
  for (int k = threadIdx.x; k < p.parts; k += kThreads) {
    total += live ? expf(p.s[k * p.s_part_stride + row] - m) : 0.f;
  }
  total = BlockReduce<kThreads, false>(total, scratch);
  for (int d0 = 0; d0 < p.head_dim; d0 += kThreads) {
    const int d = d0 + threadIdx.x;
    float acc = 0.f;
    for (int base = 0; base < p.parts; base += kMergeChunk) {
      const int n = min(kMergeChunk, p.parts - base);
      __syncthreads();  // the previous chunk's weights have been used
      for (int k = threadIdx.x; k < n; k += kThreads) {
        weight[k] = live ? expf(p.s[(base + k) * p.s_part_stride + row] - m) : 0.f;
      }
      __syncthreads();
      if (d < p.head_dim) {
        const float* v = p.v + base * p.v_part_stride + row * p.head_dim + d;
#pragma unroll 8
        for (int k = 0; k < n; ++k) {
          // An empty part (weight 0) may hold anything: it must not reach the sum.
          if (weight[k] > 0.f) acc += weight[k] * v[k * p.v_part_stride];
        }
      }
    }
    if (d < p.head_dim) p.out[row * p.head_dim + d] = nan ? NAN : total > 0.f ? acc / total : 0.f;
  }
  if (threadIdx.x == 0) p.lse[row] = nan ? NAN : total > 0.f ? m + logf(total) : -INFINITY;
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_MERGE_STATES_CUH_
