// Programmatic dependent launch (Hopper): a kernel launched with LaunchDependent may be scheduled
// once every block of the stream's previous kernel has called TriggerDependents (or exited), so
// that its launch and first instructions overlap that kernel's run instead of following it; it
// calls WaitForPriorKernels before it reads anything earlier work wrote. At batch 1 a decode call
// is a few short kernels in a row (query rotation, attention, split merge or page weights), where
// the gaps between kernels are a visible part of the step.
//
// A kernel launched this way must call WaitForPriorKernels before its first read of global
// memory that an earlier kernel of the stream writes (its kernel parameters are safe). After a
// copy or an event, rather than a kernel, the launch is an ordinary stream-ordered one: memory
// that only copies write (the decode page tables) may be read before the wait. CUDA graphs capture
// the dependency (a programmatic edge). KVTIER_CUDA_PDL=off in the environment makes every such
// launch an ordinary one (read once per process), to measure the difference.
#ifndef KVTIER_KERNELS_DEPENDENT_LAUNCH_CUH_
#define KVTIER_KERNELS_DEPENDENT_LAUNCH_CUH_

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace kvtier::gpu {

// Waits until every earlier kernel of the stream has completed and its writes are visible. A
// no-op in a kernel that was launched the ordinary way.
__device__ __forceinline__ void WaitForPriorKernels() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// Lets the stream's next kernel, if launched with LaunchDependent, be scheduled once every block
// of this kernel has called it (its blocks then wait in WaitForPriorKernels, on resources this
// kernel's blocks, all started, no longer need). The decode path's short kernels (rotation, split
// merge, page weights) call it right after WaitForPriorKernels, so that at most one kernel ahead
// waits; the attention kernel does not (the waiting blocks of its dependents slowed it by 1-4%).
// A no-op without a dependent.
__device__ __forceinline__ void TriggerDependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Whether LaunchDependent overlaps launches (KVTIER_CUDA_PDL is not "off"). Thread-safe.
inline bool DependentLaunchEnabled() {
  static const bool enabled = [] {
    const char* mode = std::getenv("KVTIER_CUDA_PDL");
    return mode == nullptr || std::strcmp(mode, "off") != 0;
  }();
  return enabled;
}

// Enqueues kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent launch.
// REQUIRES: the kernel calls WaitForPriorKernels before reading what earlier work wrote.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = DependentLaunchEnabled() ? 1 : 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_DEPENDENT_LAUNCH_CUH_
