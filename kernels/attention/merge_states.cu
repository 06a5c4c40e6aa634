// LaunchMergeStates (kernels/decode_attention.cuh): one block of kMergeThreads per row
// (MergeRow, merge_states.cuh). Used by the decode launch for a split batch without page weights
// and by MergeStatesOn.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/merge_states.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

using attention::kMergeThreads;

__global__ void __launch_bounds__(kMergeThreads) MergeStatesKernel(const MergeStatesParams p) {
  WaitForPriorKernels();  // the parts (LaunchDependent)
  TriggerDependents();
  attention::MergeRow<kMergeThreads>(p, blockIdx.x);
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
