// The second step of the decode kernel's page weights (kernels/attention/page_weight.cuh): a
// block takes kWeightEntries packed entries of one sequence, lane l entries l, l + 32, ... and
// warp w the KV heads w, w + kWeightWarps, ... (a warp reads a KV head's page LSEs of 32 pages as
// one coalesced range, kWeightRounds ranges in flight); each thread keeps the largest weight of
// its heads per entry, and the block reduces them over its warps in shared memory and max-
// accumulates each entry's into page_weight. A wave of blocks covers batch 64 x 32K.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/page_weight.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWeightWarps = 8;
constexpr int kWeightRounds = 4;                      // entries per lane
constexpr int kWeightEntries = 32 * kWeightRounds;    // per block
static_assert(kWeightEntries <= kWeightWarps * 32, "a thread per entry in the block's reduction");
using attention::kLog2e;

// Block (x, b): entries x * kWeightEntries ... of sequence b.
__global__ void __launch_bounds__(kWeightWarps * 32, 8) PageWeightKernel(const PagedDecodeParams p) {
  __shared__ float warp_weight[kWeightWarps][kWeightEntries];
  WaitForPriorKernels();  // the page LSEs and the final LSEs (LaunchDependent)
  TriggerDependents();
  const int b = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int first = p.packed_indptr[b];
  const int pages = p.packed_indptr[b + 1] - first;
  const int block_page = blockIdx.x * kWeightEntries;
  if (block_page >= pages) return;  // the whole block
  const int group = p.num_q_heads / p.num_kv_heads;
  const float* lse = p.lse + static_cast<int64_t>(b) * p.num_q_heads;
  // Lane's page of each round; past the sequence's end, its last page (read, never kept), so
  // that every round's load is issued unconditionally.
  int page[kWeightRounds];
#pragma unroll
  for (int r = 0; r < kWeightRounds; ++r) page[r] = min(block_page + lane + 32 * r, pages - 1);
  float weight[kWeightRounds] = {};
  for (int kv = warp; kv < p.num_kv_heads; kv += kWeightWarps) {
    for (int h = 0; h < group; ++h) {
      const float l = lse[kv * group + h];
      // A head whose LSE is not finite (NaN, or -inf: nothing attended) adds nothing.
      if (!isfinite(l)) continue;
      const float* page_lse = p.page_lse + attention::PageLseIndex(p, first, pages, kv, 0, h);
#pragma unroll
      for (int r = 0; r < kWeightRounds; ++r) {
        const float x = page_lse[static_cast<int64_t>(page[r]) * group];
        weight[r] = fmaxf(weight[r], exp2f(x - l * kLog2e));
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
  for (int w = 0; w < kWeightWarps; ++w) most = fmaxf(most, warp_weight[w][e]);
  most = fminf(most, 1.f);  // rounding may exceed 1 for a page that holds all the weight
  if (most > 0.f) {
    atomicMax(reinterpret_cast<int*>(p.page_weight + first + block_page + e),
              __float_as_int(most));
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
