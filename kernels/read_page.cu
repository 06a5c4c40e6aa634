// Decodes one page to floats with page_codec.h's DecodeRow: a thread per (token, head, side).
// For tests and tools (the backend's ReadPage), not for the decode path.
#include "kernels/data_plane.cuh"
#include "kernels/page_codec.h"

namespace kvtier::gpu {
namespace {

__global__ void ReadPageKernel(const __grid_constant__ ReadPageParams p) {
  const PageLayout& l = p.layout;
  const int rows = p.num_tokens * l.heads;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 2 * rows) return;
  const int side = i / rows;
  const int token = (i % rows) / l.heads;
  const int head = i % l.heads;
  float* out = (side == 0 ? p.k : p.v) + static_cast<size_t>(i % rows) * l.head_dim;
  DecodeRow(l, side == 0 ? l.k : l.v, p.page, head, token, out,
            side == 0 ? p.k_scale : p.v_scale);
}

}  // namespace

cudaError_t LaunchReadPage(const ReadPageParams& p, cudaStream_t stream) {
  const int threads = 2 * p.num_tokens * p.layout.heads;
  if (threads == 0) return cudaSuccess;
  ReadPageKernel<<<(threads + 127) / 128, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
