// Batched page copies between pools of one page size (data_plane.cuh, LaunchCopyPages): the
// host tier's offload and onload. A thread block copies one (layer, page) item at a time with
// 16-byte streaming loads and stores, several in flight per thread, so that enough bytes are
// outstanding to cover the latency of PCIe when one side is mapped host memory.
#include "kernels/data_plane.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 4;  // 16-byte loads per thread before their stores

__global__ void __launch_bounds__(kThreads) CopyPagesKernel(const __grid_constant__ CopyPagesParams p) {
  const uint32_t chunks = p.page_bytes / 16;
  const uint64_t items = static_cast<uint64_t>(p.num_layers) * p.num_pages;
  for (uint64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const uint32_t layer = static_cast<uint32_t>(item / p.num_pages);
    const uint32_t i = static_cast<uint32_t>(item % p.num_pages);
    const uint4* src = reinterpret_cast<const uint4*>(
        p.layers[layer].src + static_cast<size_t>(p.src_pages[i]) * p.page_bytes);
    uint4* dst = reinterpret_cast<uint4*>(p.layers[layer].dst +
                                          static_cast<size_t>(p.dst_pages[i]) * p.page_bytes);
    uint32_t c = threadIdx.x;
    for (; c + (kInFlight - 1) * kThreads < chunks; c += kInFlight * kThreads) {
      uint4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) v[u] = __ldcs(src + c + u * kThreads);
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) __stcs(dst + c + u * kThreads, v[u]);
    }
    for (; c < chunks; c += kThreads) __stcs(dst + c, __ldcs(src + c));
  }
}

}  // namespace

cudaError_t LaunchCopyPages(const CopyPagesParams& p, cudaStream_t stream) {
  if (p.num_layers == 0 || p.num_pages == 0) return cudaSuccess;
  if (p.page_bytes % 16 != 0 || p.num_sms <= 0) return cudaErrorInvalidValue;
  // Every SM full (2048 threads), each block looping over items.
  const uint64_t items = static_cast<uint64_t>(p.num_layers) * p.num_pages;
  const uint64_t resident = static_cast<uint64_t>(p.num_sms) * (2048 / kThreads);
  const unsigned blocks = static_cast<unsigned>(items < resident ? items : resident);
  CopyPagesKernel<<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
