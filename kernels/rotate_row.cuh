// One row rotated by the key rotation R_h (kernels/codec/hadamard.h) by a whole thread block in
// shared memory: the row is staged with its signs applied, then the butterflies run stage by
// stage (h = 1, 2, 4, ...), each pair (j, j + h) taken by one thread, exactly the operations of
// codec::FastHadamard in the same order, so that the output is bit-identical to codec::RotateKey
// (compiled with --fmad=false, as every kernel here). Shared by the rotation kernel
// (kernels/rotate.cu) and the all-layers append (kernels/append.cu).
#ifndef KVTIER_KERNELS_ROTATE_ROW_CUH_
#define KVTIER_KERNELS_ROTATE_ROW_CUH_

#include <cstdint>

#include "kernels/codec/hadamard.h"

namespace kvtier::gpu {

// out[d] = (R_head x)[d] for d < n, where x[d] = load(d). Every thread of the block calls it
// with the same arguments; `x` is the block's shared scratch of n floats, free again on return.
// REQUIRES: n a power of two, at most 1024.
template <typename Load>
__device__ __forceinline__ void RotateRowInBlock(float* x, int n, uint64_t seed, int head,
                                                 Load load, float* out) {
  for (int d = threadIdx.x; d < n; d += blockDim.x) {
    x[d] = load(d) * codec::RotationSign(seed, head, d);
  }
  for (int h = 1; h < n; h <<= 1) {
    __syncthreads();
    for (int j = threadIdx.x; j < n / 2; j += blockDim.x) {
      const int i = (j / h) * 2 * h + j % h;
      const float a = x[i];
      const float b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
  }
  __syncthreads();
  const float scale = codec::HadamardScale(n);
  for (int d = threadIdx.x; d < n; d += blockDim.x) out[d] = x[d] * scale;
  __syncthreads();  // x is refilled by the next row
}

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_ROTATE_ROW_CUH_
