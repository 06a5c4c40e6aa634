// Asynchronous copies from global to shared memory (cp.async) and the shared-memory stores the
// decode kernel's staging uses (kernels/attention/). Copies of one lane complete in commit-group
// order; WaitCopies<n> returns when at most n of the lane's groups are still in flight.
#ifndef KVTIER_KERNELS_ATTENTION_CP_ASYNC_CUH_
#define KVTIER_KERNELS_ATTENTION_CP_ASYNC_CUH_

#include <cstdint>

namespace kvtier::gpu::attention {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts copying 16 bytes from global src to the shared-memory address dst (bypassing L1).
__device__ __forceinline__ void Copy16(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Starts copying the first `bytes` (0 or 4) of the 4 at global src to the shared-memory address
// dst, zero-filling the rest: with 0, dst gets 0 and src is not read.
__device__ __forceinline__ void Copy4(uint32_t dst, const uint8_t* src, uint32_t bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_CP_ASYNC_CUH_
