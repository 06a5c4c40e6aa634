// The LSE merge of partial attention states on the GPU (contract in kernels/decode_attention.cuh):
// one block per row. Used by the decode launch for a split batch and by MergeStatesOn.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kMergeThreads = 128;
constexpr int kMergeChunk = 256;  // parts whose weights are in shared memory at a time

// Max (kMax) or sum of x over the block's kMergeThreads threads, in every thread.
template <bool kMax>
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
  for (int w = 1; w < kMergeThreads / 32; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

// One block per row: the parts' weights exp(s_k - max) go to shared memory a chunk at a time,
// and thread d accumulates dims d, d + kMergeThreads, ... over the parts (coalesced reads).
__global__ void __launch_bounds__(kMergeThreads) MergeStatesKernel(const MergeStatesParams p) {
  __shared__ float weight[kMergeChunk];
  __shared__ float scratch[kMergeThreads / 32];
  WaitForPriorKernels();  // the parts (LaunchDependent)
  TriggerDependents();
  const int64_t row = blockIdx.x;
  float m = -INFINITY;
  bool nan = false;
  for (int k = threadIdx.x; k < p.parts; k += kMergeThreads) {
    const float s = p.s[k * p.s_part_stride + row];
    nan |= isnan(s);
    m = fmaxf(m, s);
  }
  m = BlockReduce<true>(m, scratch);
  nan = __syncthreads_or(nan) || m == INFINITY;  // e^(+inf - +inf) is NaN, as in MergeStates
  const bool live = m != -INFINITY && !nan;
  float total = 0.f;
  for (int k = threadIdx.x; k < p.parts; k += kMergeThreads) {
    total += live ? expf(p.s[k * p.s_part_stride + row] - m) : 0.f;
  }
  total = BlockReduce<false>(total, scratch);
  for (int d0 = 0; d0 < p.head_dim; d0 += kMergeThreads) {
    const int d = d0 + threadIdx.x;
    float acc = 0.f;
    for (int base = 0; base < p.parts; base += kMergeChunk) {
      const int n = min(kMergeChunk, p.parts - base);
      __syncthreads();  // the previous chunk's weights have been used
      for (int k = threadIdx.x; k < n; k += kMergeThreads) {
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

}  // namespace

cudaError_t LaunchMergeStates(const MergeStatesParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.rows > INT32_MAX || p.parts < 1 || p.head_dim < 1)
    return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  return LaunchDependent(MergeStatesKernel, dim3(static_cast<unsigned>(p.rows)),
                         dim3(kMergeThreads), 0, stream, p);
}

}  // namespace kvtier::gpu
