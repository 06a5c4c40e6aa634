// The second step of the decode kernel's page weights (kernels/attention/page_weight.cuh): a
// block takes 32 packed entries of one sequence, lane l entry l and warp w the KV heads w,
// w + kWeightWarps, ... (a warp reads its KV heads' page LSEs of the 32 pages as one coalesced
// range); each thread keeps the largest weight of its heads, the block reduces them over its
// warps in shared memory, and warp 0 max-accumulates each entry's into page_weight.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/page_weight.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWeightWarps = 8;
constexpr int kWeightEntries = 32;  // per block, one per lane
using attention::kLog2e;

// Block (x, b): entries x * kWeightEntries + lane of sequence b.
__global__ void __launch_bounds__(kWeightWarps * 32) PageWeightKernel(const PagedDecodeParams p) {
  __shared__ float warp_weight[kWeightWarps][kWeightEntries];
  WaitForPriorKernels();  // the page LSEs and the final LSEs (LaunchDependent)
  TriggerDependents();
  const int b = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = p.packed_indptr[b];
  const int pages = p.packed_indptr[b + 1] - first;
  const int i = blockIdx.x * kWeightEntries + lane;
  if (blockIdx.x * kWeightEntries >= pages) return;  // the whole block
  const int group = p.num_q_heads / p.num_kv_heads;
  const float* lse = p.lse + static_cast<int64_t>(b) * p.num_q_heads;
  float weight = 0.f;
  for (int kv = warp; kv < p.num_kv_heads && i < pages; kv += kWeightWarps) {
    const float* page_lse = p.page_lse + attention::PageLseIndex(p, first, pages, kv, i, 0);
    for (int h = 0; h < group; ++h) {
      const float l = lse[kv * group + h];
      // A head whose LSE is not finite (NaN, or -inf: nothing attended) adds nothing.
      if (isfinite(l)) weight = fmaxf(weight, exp2f(page_lse[h] - l * kLog2e));
    }
  }
  warp_weight[warp][lane] = weight;
  __syncthreads();
  if (warp != 0 || i >= pages) return;
#pragma unroll
  for (int w = 1; w < kWeightWarps; ++w) weight = fmaxf(weight, warp_weight[w][lane]);
  weight = fminf(weight, 1.f);  // rounding may exceed 1 for a page that holds all the weight
  if (weight > 0.f) {
    atomicMax(reinterpret_cast<int*>(p.page_weight + first + i), __float_as_int(weight));
  }
}

}  // namespace

int64_t PageLseFloats(int64_t entries, int32_t num_q_heads) {
  return entries * num_q_heads;
}

cudaError_t LaunchPageWeights(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.page_weight == nullptr || p.page_lse == nullptr) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const int64_t most_pages = static_cast<int64_t>(p.num_splits) * p.pages_per_split;
  const dim3 grid(static_cast<unsigned>((most_pages + kWeightEntries - 1) / kWeightEntries),
                  static_cast<unsigned>(p.batch));
  return LaunchDependent(PageWeightKernel, grid, dim3(kWeightWarps * 32), 0, stream, p);
}

}  // namespace kvtier::gpu
