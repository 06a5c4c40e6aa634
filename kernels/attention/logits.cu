// DecodeOutputs::logits on the device (contract in kernels/attention/logits.cuh).
#include "kernels/attention/logits.cuh"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "kernels/page_codec.h"
#include "kvtier/page_tables.h"

namespace kvtier::gpu {
namespace {

constexpr int kLogitThreads = 128;
constexpr size_t kMaxSharedBytes = 48 * 1024;

// Floats between staged key rows: one more than head_dim, so that the threads of a warp, which
// read the same dim of different tokens, hit different banks.
__host__ __device__ inline int KeyRowStride(int head_dim) { return head_dim + 1; }

size_t SharedBytes(const DecodeLogitsParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  return (static_cast<size_t>(p.block_tokens) * KeyRowStride(p.head_dim) +
          static_cast<size_t>(group) * p.head_dim) *
         sizeof(float);
}

// Block (tile, b, kv_head): tokens [tile * block_tokens, + block_tokens) of sequence b for the
// query heads of kv_head.
__global__ void __launch_bounds__(kLogitThreads)
    DecodeLogitsKernel(const __grid_constant__ DecodeLogitsParams p) {
  extern __shared__ float staged[];
  const int b = blockIdx.y, kv_head = blockIdx.z;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int key_stride = KeyRowStride(p.head_dim);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.block_tokens;
  const int64_t left = static_cast<int64_t>(p.seq_lens[b]) - first;
  const int tokens = left <= 0 ? 0 : (left < p.block_tokens ? static_cast<int>(left) : p.block_tokens);
  const int64_t row = static_cast<int64_t>(b) * p.num_q_heads + static_cast<int64_t>(kv_head) * group;
  float* k = staged;                                  // [block_tokens][key_stride]
  float* q = staged + p.block_tokens * key_stride;    // [group][head_dim]
  if (tokens > 0) {  // uniform across the block
    const uint32_t entry = p.packed[p.packed_indptr[b] + blockIdx.x];
    const DecodePool& pool = p.pools[entry >> kPackedFormatShift];
    const uint8_t* page =
        pool.base + static_cast<uint64_t>(entry & kPackedPageMask) * pool.layout.page_bytes;
    for (int t = threadIdx.x; t < tokens; t += kLogitThreads) {
      DecodeRow(pool.layout, pool.layout.k, page, kv_head, t, k + t * key_stride,
                pool.k_tensor_scale);
    }
    for (int i = threadIdx.x; i < group * p.head_dim; i += kLogitThreads) {
      q[i] = p.q[row * p.head_dim + i];
    }
    __syncthreads();
  }
  float* logits = p.logits + row * p.logits_stride;
  for (int i = threadIdx.x; i < group * p.block_tokens; i += kLogitThreads) {
    const int g = i / p.block_tokens, t = i % p.block_tokens;
    if (first + t >= p.logits_stride) continue;
    float l = -INFINITY;
    if (t < tokens) {
      const float* qg = q + g * p.head_dim;
      const float* kt = k + t * key_stride;
      float dot = 0.f;
      for (int d = 0; d < p.head_dim; ++d) dot += qg[d] * kt[d];
      l = p.softmax_scale * dot;
    }
    logits[g * p.logits_stride + first + t] = l;
  }
}

}  // namespace

cudaError_t LaunchDecodeLogits(const DecodeLogitsParams& p, cudaStream_t stream) {
  if (p.num_kv_heads < 1 || p.num_q_heads < 1 || p.num_q_heads % p.num_kv_heads != 0 ||
      p.head_dim < 1 || p.block_tokens < 1 || p.batch < 0 || p.batch > kDecodeMaxBatch ||
      p.num_kv_heads > 65535 || p.logits_stride < 0 || SharedBytes(p) > kMaxSharedBytes) {
    return cudaErrorInvalidValue;
  }
  const int64_t tiles = (p.logits_stride + p.block_tokens - 1) / p.block_tokens;
  if (tiles > 0x7FFFFFFF) return cudaErrorInvalidValue;
  if (p.batch == 0 || tiles == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.batch),
                  static_cast<unsigned>(p.num_kv_heads));
  DecodeLogitsKernel<<<grid, kLogitThreads, SharedBytes(p), stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
