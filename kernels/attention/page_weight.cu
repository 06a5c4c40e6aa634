// The second step of the decode kernel's page weights (kernels/attention/page_weight.cuh): one
// warp per packed entry reads its page LSEs and the sequence's final LSEs (lanes take the query
// heads in turn, coalesced), reduces the page's largest weight across the warp, and max-
// accumulates it into page_weight.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/page_weight.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWeightWarps = 8;  // entries per block
using attention::kLog2e;

// Block (x, b): entries x * kWeightWarps + warp of sequence b.
__global__ void __launch_bounds__(kWeightWarps * 32) PageWeightKernel(const PagedDecodeParams p) {
  WaitForPriorKernels();  // the page LSEs and the final LSEs (LaunchDependent)
  const int b = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int first = p.packed_indptr[b];
  const int i = blockIdx.x * kWeightWarps + threadIdx.x / 32;
  if (i >= p.packed_indptr[b + 1] - first) return;  // the whole warp
  const int64_t entry = static_cast<int64_t>(first) + i;
  const float* page_lse = p.page_lse + entry * p.num_q_heads;
  const float* lse = p.lse + static_cast<int64_t>(b) * p.num_q_heads;
  float weight = 0.f;
  for (int h = lane; h < p.num_q_heads; h += 32) {
    const float l = lse[h];
    // A head whose LSE is not finite (NaN, or -inf: nothing attended) adds nothing.
    if (isfinite(l)) weight = fmaxf(weight, exp2f(page_lse[h] - l * kLog2e));
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) weight = fmaxf(weight, __shfl_xor_sync(0xFFFFFFFFu, weight, d));
  weight = fminf(weight, 1.f);  // rounding may exceed 1 for a page that holds all the weight
  if (lane == 0 && weight > 0.f) {
    atomicMax(reinterpret_cast<int*>(p.page_weight + entry), __float_as_int(weight));
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
  const dim3 grid(static_cast<unsigned>((most_pages + kWeightWarps - 1) / kWeightWarps),
                  static_cast<unsigned>(p.batch));
  return LaunchDependent(PageWeightKernel, grid, dim3(kWeightWarps * 32), 0, stream, p);
}

}  // namespace kvtier::gpu
