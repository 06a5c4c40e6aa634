// LaunchMergeStates (kernels/decode_attention.cuh): the merge kernel of merge_states.cuh, with
// nothing after each row.
#include <cuda_runtime_api.h>

#include "kernels/attention/merge_states.cuh"
#include "kernels/decode_attention.cuh"

namespace kvtier::gpu {

cudaError_t LaunchMergeStates(const MergeStatesParams& p, cudaStream_t stream) {
  return attention::LaunchMergeStatesWith(p, attention::NoTail{}, stream);
}

}  // namespace kvtier::gpu
