// Device helpers shared by the append and migration kernels: decoding 16 consecutive
// elements of a page row, and encoding a row 16 elements at a time. Every value goes through
// the codec functions in the same order of operations as page_codec.h's DecodeRow and
// EncodeRow, so results are bit-identical to the CPU backend; with kFast the FP16 decode is the
// hardware conversion (fast_codec.cuh), which differs only in NaN payloads.
#ifndef KVTIER_KERNELS_TILE_IO_CUH_
#define KVTIER_KERNELS_TILE_IO_CUH_

#include <cfloat>
#include <cstdint>

#include "kernels/fast_codec.cuh"
#include "kernels/page_codec.h"
#include "kernels/page_layout.h"

namespace kvtier::gpu {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

template <bool kFast>
__device__ __forceinline__ float Decode16(ElementType type, uint32_t bits) {
  if (type == ElementType::kBf16) return codec::Bf16ToFloat(static_cast<uint16_t>(bits));
  return kFast ? FastHalfToFloat(bits) : codec::HalfToFloat(static_cast<uint16_t>(bits));
}

// The fp32 scale DecodeRow uses for (head, token).
__device__ __forceinline__ float RowScale(const PageLayout& l, const CodecLayout& c,
                                          const uint8_t* page, int head, int token,
                                          float tensor_scale) {
  if (c.scope == ScaleScope::kBlockHead || c.scope == ScaleScope::kTokenHead) {
    return *reinterpret_cast<const float*>(page + l.ScaleOffset(c, head, token));
  }
  return tensor_scale;
}

// x[i] = element d0 + i of (head, token), i < 16, as DecodeRow computes it.
// REQUIRES: d0 % 16 == 0; with kOnly16, c is FP16 or BF16 (the other codecs are compiled out).
template <bool kFast, bool kOnly16 = false>
__device__ __forceinline__ void LoadGroup(const PageLayout& l, const CodecLayout& c,
                                          const uint8_t* page, int head, int token, int d0,
                                          float tensor_scale, float x[16]) {
  const uint8_t* row = page + l.PayloadOffset(c, head, token);
  switch (kOnly16 ? ElementType::kFp16 : c.type) {
    case ElementType::kFp16:
    case ElementType::kBf16: {
      const uint4 a = *reinterpret_cast<const uint4*>(row + d0 * 2);
      const uint4 b = *reinterpret_cast<const uint4*>(row + d0 * 2 + 16);
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        x[2 * i] = Decode16<kFast>(c.type, w[i] & 0xFFFFu);
        x[2 * i + 1] = Decode16<kFast>(c.type, w[i] >> 16);
      }
      return;
    }
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2: {
      const float scale = RowScale(l, c, page, head, token, tensor_scale);
      const uint4 q = *reinterpret_cast<const uint4*>(row + d0);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
      // The fast E4M3 decode differs from the codec only in NaN payloads (see Decode16).
      const bool fast = kFast && c.type == ElementType::kFp8E4M3;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint8_t code = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
        x[i] = (fast ? FastE4M3ToFloat(code) : DecodeFp8(c.type, code)) * scale;
      }
      return;
    }
    case ElementType::kNvfp4: {
      const float scale = RowScale(l, c, page, head, token, tensor_scale);
      const uint2 q = *reinterpret_cast<const uint2*>(row + d0 / 2);
      const uint32_t w[2] = {q.x, q.y};
      const uint8_t* micro = page + l.MicroOffset(c, head, token, d0);
      const bool per_dim = c.axis == MicroAxis::kTokens;  // one scale per channel
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint8_t nibble = (w[i / 8] >> (4 * (i % 8))) & 0xFu;
        x[i] = codec::Nvfp4DecodeValue(nibble, per_dim ? micro[i] : micro[0], scale);
      }
      return;
    }
  }
}

// Element `dim` of (head, token), as DecodeRow computes it.
template <bool kFast, bool kOnly16 = false>
__device__ __forceinline__ float LoadElement(const PageLayout& l, const CodecLayout& c,
                                             const uint8_t* page, int head, int token, int dim,
                                             float tensor_scale) {
  const uint8_t* row = page + l.PayloadOffset(c, head, token);
  switch (kOnly16 ? ElementType::kFp16 : c.type) {
    case ElementType::kFp16:
    case ElementType::kBf16:
      return Decode16<kFast>(c.type, reinterpret_cast<const uint16_t*>(row)[dim]);
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2:
      return DecodeFp8(c.type, row[dim]) * RowScale(l, c, page, head, token, tensor_scale);
    case ElementType::kNvfp4:
    default: {
      const uint8_t nibble = (row[dim / 2] >> ((dim & 1) * 4)) & 0xFu;
      return codec::Nvfp4DecodeValue(nibble, page[l.MicroOffset(c, head, token, dim)],
                                     RowScale(l, c, page, head, token, tensor_scale));
    }
  }
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Encodes (head, token) of a token-wise codec exactly as page_codec.h's EncodeRow, reading the
// row through load(d0, x) 16 values at a time (it may be called twice per group).
// REQUIRES: c is FP16, BF16, FP8 per tensor or per (token, head), or NVFP4 per tensor.
template <typename Load>
__device__ __forceinline__ void EncodeRowChunked(const PageLayout& l, const CodecLayout& c,
                                                 uint8_t* page, int head, int token,
                                                 float tensor_scale, Load load) {
  uint8_t* row = page + l.PayloadOffset(c, head, token);
  float x[16];
  switch (c.type) {
    case ElementType::kFp16:
    case ElementType::kBf16:
      for (int d0 = 0; d0 < l.head_dim; d0 += 16) {
        load(d0, x);
        uint32_t w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t lo = c.type == ElementType::kFp16 ? codec::FloatToHalf(x[2 * i])
                                                            : codec::FloatToBf16(x[2 * i]);
          const uint32_t hi = c.type == ElementType::kFp16 ? codec::FloatToHalf(x[2 * i + 1])
                                                            : codec::FloatToBf16(x[2 * i + 1]);
          w[i] = lo | (hi << 16);
        }
        uint4* out = reinterpret_cast<uint4*>(row + d0 * 2);
        out[0] = make_uint4(w[0], w[1], w[2], w[3]);
        out[1] = make_uint4(w[4], w[5], w[6], w[7]);
      }
      return;
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2: {
      float scale = tensor_scale;
      if (c.scope == ScaleScope::kTokenHead) {
        float amax = 0.f;
        for (int d0 = 0; d0 < l.head_dim; d0 += 16) {
          load(d0, x);
          amax = fmaxf(amax, AmaxOf(x, 16, 1));
        }
        scale = Fp8ScaleFor(c.type, amax);
        *reinterpret_cast<float*>(page + l.ScaleOffset(c, head, token)) = scale;
      }
      const float inv = Reciprocal(scale);
      for (int d0 = 0; d0 < l.head_dim; d0 += 16) {
        load(d0, x);
        uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          w[i / 4] |= static_cast<uint32_t>(EncodeFp8(c.type, x[i] * inv)) << (8 * (i % 4));
        }
        *reinterpret_cast<uint4*>(row + d0) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      return;
    }
    case ElementType::kNvfp4: {
      const float s_enc = Nvfp4TensorEncodeScale(tensor_scale);
      for (int d0 = 0; d0 < l.head_dim; d0 += 16) {
        load(d0, x);
        const uint8_t sf = codec::Nvfp4MicroScale(s_enc, AmaxOf(x, 16, 1));
        page[l.MicroOffset(c, head, token, d0)] = sf;
        uint32_t w[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          w[i / 8] |= static_cast<uint32_t>(codec::Nvfp4EncodeValue(x[i], s_enc, sf))
                      << (4 * (i % 8));
        }
        *reinterpret_cast<uint2*>(row + d0 / 2) = make_uint2(w[0], w[1]);
      }
      return;
    }
  }
}

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_TILE_IO_CUH_
