// The key-rotation kernel (Options::key_rotation): rows of FP16, BF16 or FP32 values rotated by
// the randomised Hadamard R_h of kernels/codec/hadamard.h into FP32 rows. The append path
// rotates new keys with it before encoding them; decode attention rotates the step's queries
// once, into a scratch buffer the fused kernel then reads as its queries.
//
// A block per row: the row is staged in shared memory with its signs applied, then the
// butterflies run stage by stage (stage h = 1, 2, 4, ...), each pair (j, j + h) taken by one
// thread, exactly the operations of codec::FastHadamard in the same order, so that the output is
// bit-identical to the CPU backend's (compiled with --fmad=false, as every kernel here).
#include <cstdint>

#include "kernels/codec/hadamard.h"
#include "kernels/codec/half.h"
#include "kernels/data_plane.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kRotateThreads = 128;

__device__ __forceinline__ float InputAt(const RotateRowsParams& p, int64_t i) {
  switch (p.in_type) {
    case RotateInput::kFp16: return codec::HalfToFloat(static_cast<const uint16_t*>(p.in)[i]);
    case RotateInput::kBf16: return codec::Bf16ToFloat(static_cast<const uint16_t*>(p.in)[i]);
    default: return static_cast<const float*>(p.in)[i];
  }
}

__global__ void __launch_bounds__(kRotateThreads) RotateRowsKernel(const RotateRowsParams p) {
  extern __shared__ float x[];
  WaitForPriorKernels();  // the rows (LaunchDependent)
  const int n = p.head_dim;
  for (int64_t row = blockIdx.x; row < p.num_rows; row += gridDim.x) {
    const int head = static_cast<int>(row % p.heads) / p.group;
    const int64_t first = row * n;
    for (int d = threadIdx.x; d < n; d += blockDim.x) {
      x[d] = InputAt(p, first + d) * codec::RotationSign(p.seed, head, d);
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
    for (int d = threadIdx.x; d < n; d += blockDim.x) p.out[first + d] = x[d] * scale;
    __syncthreads();  // x is refilled by the next row
  }
}

}  // namespace

cudaError_t LaunchRotateRows(const RotateRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  const int64_t max_blocks = int64_t{1} << 16;
  const int64_t blocks = p.num_rows < max_blocks ? p.num_rows : max_blocks;
  return LaunchDependent(RotateRowsKernel, dim3(static_cast<unsigned>(blocks)), dim3(kRotateThreads),
                         static_cast<size_t>(p.head_dim) * sizeof(float), stream, p);
}

}  // namespace kvtier::gpu
