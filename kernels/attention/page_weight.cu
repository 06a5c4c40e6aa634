// The second step of the decode kernel's page weights (kernels/attention/page_weight.cuh): one
// thread per packed entry reads its page LSEs and the heads' final LSEs, and max-accumulates the
// page's largest weight into page_weight.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/page_weight.cuh"
#include "kernels/decode_attention.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWeightThreads = 256;
using attention::kLog2e;

// Block (x, b): entries x * kWeightThreads + threadIdx.x of sequence b.
__global__ void __launch_bounds__(kWeightThreads) PageWeightKernel(const PagedDecodeParams p) {
  const int b = blockIdx.y;
  const int first = p.packed_indptr[b];
  const int i = blockIdx.x * kWeightThreads + threadIdx.x;
  if (i >= p.packed_indptr[b + 1] - first) return;
  const int64_t entry = static_cast<int64_t>(first) + i;
  const float* page_lse = p.page_lse + entry * p.num_q_heads;
  const float* lse = p.lse + static_cast<int64_t>(b) * p.num_q_heads;
  float weight = 0.f;
  for (int h = 0; h < p.num_q_heads; ++h) {
    const float l = lse[h];
    // A head whose LSE is not finite (NaN, or -inf: nothing attended) adds nothing.
    if (isfinite(l)) weight = fmaxf(weight, exp2f(page_lse[h] - l * kLog2e));
  }
  weight = fminf(weight, 1.f);  // rounding may exceed 1 for a page that holds all the weight
  if (weight > 0.f) {
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
  const dim3 grid(static_cast<unsigned>((most_pages + kWeightThreads - 1) / kWeightThreads),
                  static_cast<unsigned>(p.batch));
  PageWeightKernel<<<grid, kWeightThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
