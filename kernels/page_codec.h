// Encoding and decoding of K/V rows inside a page, for every codec. These functions are the
// single definition of kvtier's storage rules: the CPU backend calls them in loops and the CUDA
// kernels call them per thread, so both produce bit-identical pages. Compile device code with
// --fmad=false so no multiply-add is fused differently from the host.
//
// `tensor_scale` is the per-(format, layer, K/V) scale used by ScaleScope::kTensor codecs
// (real = stored x scale; for NVFP4 the second-level decode multiplier). Other scopes ignore it.
// Scales are computed from the amax of the finite values in their scope; NaN and +-Inf are
// encoded by the element codec's own rule (FP8 saturates Inf and keeps NaN; E2M1 saturates).
#ifndef KVTIER_KERNELS_PAGE_CODEC_H_
#define KVTIER_KERNELS_PAGE_CODEC_H_

#include <cstdint>

#include <cmath>

#include "kernels/codec/fp4.h"
#include "kernels/codec/fp8.h"
#include "kernels/codec/half.h"
#include "kernels/codec/host_device.h"
#include "kernels/codec/nvfp4.h"
#include "kernels/page_layout.h"

namespace kvtier {

// |x| when x is finite, else 0: scales ignore NaN and Inf.
KVTIER_HD float FiniteAbs(float x) {
  const float a = fabsf(x);
  return a <= 3.402823466e38f ? a : 0.f;
}

// max(a, b) for operands that are never NaN; unlike fmaxf it inlines to one instruction on the
// host without -ffast-math.
KVTIER_HD float MaxOf(float a, float b) { return a > b ? a : b; }

// The largest |x[i * stride]| over finite values, i < n. Computed on the bit patterns, which
// order like the magnitudes of non-negative floats: branch-free, and exact.
KVTIER_HD float AmaxOf(const float* x, int n, int stride) {
  uint32_t amax = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t bits = codec::internal::FloatBits(x[i * stride]) & 0x7FFFFFFFu;
    const uint32_t finite = bits < 0x7F800000u ? bits : 0u;
    amax = finite > amax ? finite : amax;
  }
  return codec::internal::FloatFromBits(amax);
}

KVTIER_HD float Fp8Max(ElementType t) {
  return t == ElementType::kFp8E4M3 ? codec::kE4M3Max : codec::kE5M2Max;
}

KVTIER_HD uint8_t EncodeFp8(ElementType t, float x) {
  return t == ElementType::kFp8E4M3 ? codec::FloatToE4M3(x) : codec::FloatToE5M2(x);
}

KVTIER_HD float DecodeFp8(ElementType t, uint8_t q) {
  return t == ElementType::kFp8E4M3 ? codec::E4M3ToFloat(q) : codec::E5M2ToFloat(q);
}

// The FP8 scale for a scope whose finite amax is `amax`: amax / max, at least FLT_MIN so that
// its reciprocal is finite (0 for an all-zero scope).
KVTIER_HD float Fp8ScaleFor(ElementType t, float amax) {
  const float scale = amax / Fp8Max(t);
  return amax > 0.f && scale < FLT_MIN ? FLT_MIN : scale;
}
KVTIER_HD float Reciprocal(float s) { return s > 0.f ? 1.f / s : 0.f; }

// The NVFP4 encode multiplier S_enc for a per-tensor second-level decode multiplier.
KVTIER_HD float Nvfp4TensorEncodeScale(float tensor_scale) {
  return codec::Nvfp4EncodeScale(tensor_scale * 2688.f);
}

// Encodes one token row along head_dim with NVFP4 micro-blocks, given S_enc.
KVTIER_HD void EncodeNvfp4Row(const PageLayout& l, const CodecLayout& c, uint8_t* page, int head,
                              int token, const float* x, float s_enc) {
  uint8_t* q = page + l.PayloadOffset(c, head, token);
  for (int m = 0; m < l.head_dim / kMicroBlock; ++m) {
    const float* xm = x + m * kMicroBlock;
    const uint8_t sf = codec::Nvfp4MicroScale(s_enc, AmaxOf(xm, kMicroBlock, 1));
    page[l.MicroOffset(c, head, token, m * kMicroBlock)] = sf;
    const float mul = codec::Nvfp4EncodeMultiplier(s_enc, sf);
    for (int i = 0; i < kMicroBlock; i += 2) {
      q[(m * kMicroBlock + i) / 2] = static_cast<uint8_t>(
          codec::Nvfp4EncodeScaled(xm[i], mul) | (codec::Nvfp4EncodeScaled(xm[i + 1], mul) << 4));
    }
  }
}

// Encodes x[head_dim] as (head, token). REQUIRES: the codec encodes tokens one at a time
// (FP16, BF16, FP8 per tensor or per (token, head), NVFP4 per tensor along head_dim).
KVTIER_HD void EncodeRow(const PageLayout& l, const CodecLayout& c, uint8_t* page, int head,
                         int token, const float* x, float tensor_scale) {
  uint8_t* row = page + l.PayloadOffset(c, head, token);
  switch (c.type) {
    case ElementType::kFp16:
    case ElementType::kBf16: {
      uint16_t* out = reinterpret_cast<uint16_t*>(row);
      for (int i = 0; i < l.head_dim; ++i) {
        out[i] = c.type == ElementType::kFp16 ? codec::FloatToHalf(x[i]) : codec::FloatToBf16(x[i]);
      }
      return;
    }
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2: {
      float scale = tensor_scale;
      if (c.scope == ScaleScope::kTokenHead) {
        scale = Fp8ScaleFor(c.type, AmaxOf(x, l.head_dim, 1));
        *reinterpret_cast<float*>(page + l.ScaleOffset(c, head, token)) = scale;
      }
      const float inv = Reciprocal(scale);
      for (int i = 0; i < l.head_dim; ++i) row[i] = EncodeFp8(c.type, x[i] * inv);
      return;
    }
    case ElementType::kNvfp4:
      EncodeNvfp4Row(l, c, page, head, token, x, Nvfp4TensorEncodeScale(tensor_scale));
      return;
  }
}

// Encodes a full (block, head): x is [tokens][head_dim], rows `row_stride` floats apart.
// Works for every codec; block-wise scopes take their scale from all tokens of the block.
KVTIER_HD void EncodeBlockHead(const PageLayout& l, const CodecLayout& c, uint8_t* page,
                               int head, const float* x, int row_stride, float tensor_scale) {
  const bool block_scope = c.scope == ScaleScope::kBlockHead;
  float block_amax = 0.f;
  if (block_scope) {
    for (int t = 0; t < l.tokens; ++t) {
      block_amax = MaxOf(block_amax, AmaxOf(x + t * row_stride, l.head_dim, 1));
    }
  }
  if (c.type == ElementType::kNvfp4 && block_scope) {
    *reinterpret_cast<float*>(page + l.ScaleOffset(c, head, 0)) =
        codec::Nvfp4DecodeScale(block_amax);
    const float s_enc = codec::Nvfp4EncodeScale(block_amax);
    if (c.axis == MicroAxis::kHeadDim) {
      for (int t = 0; t < l.tokens; ++t) {
        EncodeNvfp4Row(l, c, page, head, t, x + t * row_stride, s_enc);
      }
      return;
    }
    // Micro-blocks of 16 tokens per channel; values still pack along head_dim.
    for (int g = 0; g < l.tokens; g += kMicroBlock) {
      for (int d = 0; d < l.head_dim; d += 2) {
        const float* xg = x + g * row_stride + d;
        const uint8_t sf0 = codec::Nvfp4MicroScale(s_enc, AmaxOf(xg, kMicroBlock, row_stride));
        const uint8_t sf1 =
            codec::Nvfp4MicroScale(s_enc, AmaxOf(xg + 1, kMicroBlock, row_stride));
        page[l.MicroOffset(c, head, g, d)] = sf0;
        page[l.MicroOffset(c, head, g, d + 1)] = sf1;
        const float mul0 = codec::Nvfp4EncodeMultiplier(s_enc, sf0);
        const float mul1 = codec::Nvfp4EncodeMultiplier(s_enc, sf1);
        for (int t = 0; t < kMicroBlock; ++t) {
          const float* xt = xg + t * row_stride;
          page[l.PayloadOffset(c, head, g + t) + d / 2] = static_cast<uint8_t>(
              codec::Nvfp4EncodeScaled(xt[0], mul0) | (codec::Nvfp4EncodeScaled(xt[1], mul1) << 4));
        }
      }
    }
    return;
  }
  if (block_scope) {  // FP8 per (block, head)
    const float scale = Fp8ScaleFor(c.type, block_amax);
    *reinterpret_cast<float*>(page + l.ScaleOffset(c, head, 0)) = scale;
    const float inv = Reciprocal(scale);
    for (int t = 0; t < l.tokens; ++t) {
      uint8_t* row = page + l.PayloadOffset(c, head, t);
      for (int i = 0; i < l.head_dim; ++i) row[i] = EncodeFp8(c.type, x[t * row_stride + i] * inv);
    }
    return;
  }
  for (int t = 0; t < l.tokens; ++t) EncodeRow(l, c, page, head, t, x + t * row_stride, tensor_scale);
}

// Decodes (head, token) into out[head_dim].
KVTIER_HD void DecodeRow(const PageLayout& l, const CodecLayout& c, const uint8_t* page,
                         int head, int token, float* out, float tensor_scale) {
  const uint8_t* row = page + l.PayloadOffset(c, head, token);
  float scale = tensor_scale;
  if (c.scope == ScaleScope::kBlockHead || c.scope == ScaleScope::kTokenHead) {
    scale = *reinterpret_cast<const float*>(page + l.ScaleOffset(c, head, token));
  }
  switch (c.type) {
    case ElementType::kFp16:
    case ElementType::kBf16: {
      const uint16_t* in = reinterpret_cast<const uint16_t*>(row);
      for (int i = 0; i < l.head_dim; ++i) {
        out[i] = c.type == ElementType::kFp16 ? codec::HalfToFloat(in[i]) : codec::Bf16ToFloat(in[i]);
      }
      return;
    }
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2:
      for (int i = 0; i < l.head_dim; ++i) out[i] = DecodeFp8(c.type, row[i]) * scale;
      return;
    case ElementType::kNvfp4:
      for (int i = 0; i < l.head_dim; ++i) {
        const uint8_t nibble = (row[i / 2] >> ((i & 1) * 4)) & 0xF;
        out[i] = codec::Nvfp4DecodeValue(nibble, page[l.MicroOffset(c, head, token, i)], scale);
      }
      return;
  }
}

}  // namespace kvtier

#endif  // KVTIER_KERNELS_PAGE_CODEC_H_
