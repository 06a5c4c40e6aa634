// The append kernel: encodes K/V rows of new tokens into their slots of the hot pool, exactly
// as page_codec.h's EncodeRow, and counts NaN/Inf inputs.
//
// blockIdx.y is the side (K, V). When the side's codec is the input's own type (FP16 into an
// FP16 pool, BF16 into BF16) the encode is the identity except that a NaN becomes the
// canonical 0x7FFF, so the kernel is a scattered copy: a thread moves 16 bytes of a
// (token, head) row per step, a block walks rows. Other token-wise codecs take a thread per
// (token, head) row and the codec functions (tile_io.cuh's EncodeRowChunked), as do rotated
// keys, which come as FP32 rows from LaunchRotateRows.
//
// LaunchWriteLayers appends a decode step's rows to every layer in one launch: blockIdx.z is the
// layer, each layer's pool comes from a device table and its inputs from the kernel parameters,
// and the row count from device memory, so that a launch captured in a CUDA graph replays over
// new slots. With rotated keys, one rotation launch over every layer (RotateLayersKernel) fills
// an FP32 scratch first.
#include <cstdint>

#include "kernels/codec/half.h"
#include "kernels/data_plane.cuh"
#include "kernels/rotate_row.cuh"
#include "kernels/tile_io.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kCopyUnroll = 4;
constexpr int kRotateThreads = 128;  // as kernels/rotate.cu

// Non-finite 16-bit values in w (two of them); FP16 and BF16 differ in the exponent mask.
__device__ __forceinline__ unsigned CountNonfinite(uint32_t w, uint32_t exp_mask) {
  return ((w & exp_mask) == exp_mask ? 1u : 0u) +
         (((w >> 16) & exp_mask) == exp_mask ? 1u : 0u);
}

// FloatToHalf(HalfToFloat(h)) (or the BF16 pair): h, except that a NaN becomes 0x7FFF.
__device__ __forceinline__ uint32_t CanonicalizeNan(uint32_t w, uint32_t exp_mask) {
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint32_t h = (w >> (16 * i)) & 0xFFFFu;
    if ((h & 0x7FFFu) > exp_mask) h = 0x7FFFu;
    out |= h << (16 * i);
  }
  return out;
}

__device__ __forceinline__ void AddCount(unsigned count, unsigned long long* counter) {
  count = __reduce_add_sync(kFullMask, count);
  if (count != 0 && threadIdx.x % 32 == 0) atomicAdd(counter, count);
}

// One layer's rows in a launch: its pool and its inputs.
struct LayerRows {
  uint8_t* base;
  float k_scale;
  float v_scale;
  const void* k;
  const void* v;
  const float* k_rotated;  // null unless keys are rotated
};

// The rows of one layer, over blockIdx.x (rows) and blockIdx.y (side), as WriteRowsParams says.
__device__ __forceinline__ void WriteLayerRows(const PageLayout& l, const LayerRows& p,
                                               const RowSlot* slots, int64_t num_rows, bool bf16,
                                               unsigned long long* counter) {
  const int side = blockIdx.y;
  const CodecLayout& c = side == 0 ? l.k : l.v;
  const uint16_t* in = static_cast<const uint16_t*>(side == 0 ? p.k : p.v);
  const ElementType in_type = bf16 ? ElementType::kBf16 : ElementType::kFp16;
  const uint32_t exp_mask = bf16 ? 0x7F80u : 0x7C00u;
  unsigned nonfinite = 0;
  const float* rotated = side == 0 ? p.k_rotated : nullptr;
  if (c.type == in_type && rotated == nullptr) {
    // Copy: chunk = 8 elements (16 bytes) of one (token, head) row.
    const int per_head = l.head_dim / 8;
    const int per_row = l.heads * per_head;
    for (int chunk = threadIdx.x; chunk < per_row; chunk += blockDim.x) {
      const int head = chunk / per_head;
      const int part = chunk % per_head;
      const size_t in_offset = static_cast<size_t>(head) * l.head_dim + part * 8;
      const uint32_t out_offset = c.payload_offset + part * 16;
      const uint32_t head_offset = static_cast<uint32_t>(head) * l.tokens * c.row_bytes;
      for (int64_t row0 = blockIdx.x; row0 < num_rows; row0 += kCopyUnroll * gridDim.x) {
        uint4 v[kCopyUnroll];
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
          const int64_t row = row0 + u * static_cast<int64_t>(gridDim.x);
          if (row < num_rows) {
            v[u] = *reinterpret_cast<const uint4*>(
                in + static_cast<size_t>(row) * per_row * 8 + in_offset);
          }
        }
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
          const int64_t row = row0 + u * static_cast<int64_t>(gridDim.x);
          if (row >= num_rows) continue;
          uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
          unsigned bad = 0;
#pragma unroll
          for (int i = 0; i < 4; ++i) bad += CountNonfinite(w[i], exp_mask);
          if (bad != 0) {
            nonfinite += bad;
#pragma unroll
            for (int i = 0; i < 4; ++i) w[i] = CanonicalizeNan(w[i], exp_mask);
          }
          const RowSlot s = slots[row];
          uint8_t* out = p.base + static_cast<size_t>(s.page) * l.page_bytes + out_offset +
                         head_offset + s.token * c.row_bytes;
          *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  } else {
    // A thread per (token, head) row through the codec functions.
    const float tensor_scale = side == 0 ? p.k_scale : p.v_scale;
    const int64_t rows = num_rows * l.heads;
    for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
         r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t row = r / l.heads;
      const int head = static_cast<int>(r % l.heads);
      const uint16_t* x = in + static_cast<size_t>(r) * l.head_dim;
      for (int d = 0; d < l.head_dim; d += 2) {
        nonfinite += CountNonfinite(x[d] | (static_cast<uint32_t>(x[d + 1]) << 16), exp_mask);
      }
      const RowSlot s = slots[row];
      uint8_t* page = p.base + static_cast<size_t>(s.page) * l.page_bytes;
      EncodeRowChunked(l, c, page, head, static_cast<int>(s.token), tensor_scale,
                       [&](int d0, float* v) {
                         for (int i = 0; i < 16; ++i) {
                           v[i] = rotated != nullptr ? rotated[r * l.head_dim + d0 + i]
                                                     : Decode16<false>(in_type, x[d0 + i]);
                         }
                       });
    }
  }
  AddCount(nonfinite, counter);
}

__global__ void WriteRowsKernel(const __grid_constant__ WriteRowsParams p) {
  WriteLayerRows(p.layout, {p.base, p.k_scale, p.v_scale, p.k, p.v, p.k_rotated}, p.slots,
                 p.num_rows, p.bf16, p.nonfinite);
}

// Floats of one layer's part of WriteLayersParams::k_rotated.
__device__ __forceinline__ size_t RotatedLayerFloats(const WriteLayersParams& p) {
  return static_cast<size_t>(p.max_rows) * p.layout.heads * p.layout.head_dim;
}

// blockIdx.z is the layer.
__global__ void WriteLayersKernel(const __grid_constant__ WriteLayersParams p) {
  const int layer = blockIdx.z;
  const AppendPool pool = p.pools[layer];
  const float* rotated =
      p.k_rotated == nullptr ? nullptr : p.k_rotated + layer * RotatedLayerFloats(p);
  WriteLayerRows(p.layout, {pool.base, pool.k_scale, pool.v_scale, p.k[layer], p.v[layer], rotated},
                 p.slots, *p.num_rows, p.bf16, p.nonfinite);
}

// Every layer's K rows rotated into k_rotated (blockIdx.y is the layer), as
// CudaBackend::RotateKeys does one layer with LaunchRotateRows: a block per (token, head) row.
__global__ void __launch_bounds__(kRotateThreads)
    RotateLayersKernel(const __grid_constant__ WriteLayersParams p) {
  extern __shared__ float x[];
  const PageLayout& l = p.layout;
  const int layer = blockIdx.y;
  const int64_t rows = *p.num_rows * l.heads;
  const uint16_t* in = static_cast<const uint16_t*>(p.k[layer]);
  float* out = p.k_rotated + layer * RotatedLayerFloats(p);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t first = row * l.head_dim;
    RotateRowInBlock(
        x, l.head_dim, p.key_rotation_seed, static_cast<int>(row % l.heads),
        [&](int d) {
          return p.bf16 ? codec::Bf16ToFloat(in[first + d]) : codec::HalfToFloat(in[first + d]);
        },
        out + first);
  }
}

// Threads of a write block: a block handles whole rows so that its threads share one slot.
int RowThreads(const PageLayout& l) {
  const int per_row = l.heads * l.head_dim / 8;
  return per_row >= 256 ? 256 : (per_row + 31) / 32 * 32;
}

}  // namespace

cudaError_t LaunchWriteRows(const WriteRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  int sms = p.num_sms;
  if (sms <= 0) {
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
  }
  // Enough resident threads for the copy path to keep many 16-byte loads in flight.
  const int threads = RowThreads(p.layout);
  const int64_t max_blocks = static_cast<int64_t>(sms) * (2048 / threads);
  const int64_t blocks = p.num_rows < max_blocks ? p.num_rows : max_blocks;
  WriteRowsKernel<<<dim3(static_cast<unsigned>(blocks), 2), threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchWriteLayers(const WriteLayersParams& p, cudaStream_t stream) {
  if (p.num_layers < 1 || p.num_layers > kWriteLayersMax || p.max_rows < 1 || p.num_sms < 1) {
    return cudaErrorInvalidValue;
  }
  if (p.k_rotated != nullptr) {
    const int64_t rows = p.max_rows * p.layout.heads;
    const int64_t blocks = rows < (int64_t{1} << 16) ? rows : (int64_t{1} << 16);
    RotateLayersKernel<<<dim3(static_cast<unsigned>(blocks), p.num_layers), kRotateThreads,
                         static_cast<size_t>(p.layout.head_dim) * sizeof(float), stream>>>(p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  // As LaunchWriteRows, the resident blocks shared between the layers.
  const int threads = RowThreads(p.layout);
  const int64_t per_layer = static_cast<int64_t>(p.num_sms) * (2048 / threads) / p.num_layers;
  const int64_t blocks = p.max_rows < per_layer ? p.max_rows : (per_layer > 0 ? per_layer : 1);
  WriteLayersKernel<<<dim3(static_cast<unsigned>(blocks), 2, p.num_layers), threads, 0, stream>>>(
      p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
