// The key-rotation kernel (Options::key_rotation): rows of FP16, BF16 or FP32 values rotated by
// the randomised Hadamard R_h of kernels/codec/hadamard.h into FP32 rows. The append path
// rotates new keys with it before encoding them; decode attention rotates the step's queries
// once, into a scratch buffer the fused kernel then reads as its queries.
//
// A block per row, rotated in shared memory by kernels/rotate_row.cuh (bit-identical to the CPU
// backend's codec::RotateKey).
#include <cstdint>

#include "kernels/codec/hadamard.h"
#include "kernels/codec/half.h"
#include "kernels/data_plane.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/rotate_row.cuh"

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
  TriggerDependents();
  const int n = p.head_dim;
  for (int64_t row = blockIdx.x; row < p.num_rows; row += gridDim.x) {
    const int head = static_cast<int>(row % p.heads) / p.group;
    const int64_t first = row * n;
    RotateRowInBlock(x, n, p.seed, head, [&](int d) { return InputAt(p, first + d); },
                     p.out + first);
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
