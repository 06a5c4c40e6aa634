// Staged K and V as the decode kernel's tensor-core fragments (kernels/attention/): each side
// kind's rows (and NVFP4 micro-scales) decoded exactly to FP16 in the register order the
// m16n8k16 products of decode_stages.cuh take. Lane (g = lane / 4, c = lane % 4) holds K rows g
// and g + 8 (dims 32c..32c+31) and V rows 2c, 2c+1, 2c+8, 2c+9 (dims 16g..16g+15). Because a dot
// product is indifferent to the order of its terms, K's dims may sit in the registers in any
// order that Q's fragments share; the order used (the canonical K order) is the one NVFP4
// decodes into cheaply (pairs of dims d and d + 4), and FP16 and FP8 rows are permuted into it.
#ifndef KVTIER_KERNELS_ATTENTION_FRAGMENTS_CUH_
#define KVTIER_KERNELS_ATTENTION_FRAGMENTS_CUH_

#include <cstdint>

#include "kernels/attention/convert.cuh"
#include "kernels/attention/side_kind.cuh"
#include "kernels/decode_attention.cuh"

namespace kvtier::gpu::attention {

// 16 bytes at p (shared or global memory). REQUIRES: p is 16-byte aligned.
__device__ __forceinline__ uint4 Load16(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// K rows g and g + 8 of a staged side, dims 32c..32c+31, as loaded: the codes (FP8 8 words
// per row, NVFP4 4) and the NVFP4 micro-scale codes, which KeyQuad decodes a quarter at a time
// so that a quarter's products start while the next is decoded and only a quarter's FP16
// pairs are live at once. FP16 rows, as large as their pairs, are read a quarter at a time
// (from `row`): the same 16-byte loads as a whole row, with only a quarter's words live.
template <uint32_t kKind>
struct RawKeys {
  static constexpr bool kByQuarter = kKind == kFp16Side;
  static constexpr int kWords = kByQuarter ? 1 : kKind <= kE5M2Side ? 8 : 4;
  uint32_t w[2][kWords];
  const uint8_t* row[2];                                 // FP16 only
  uint32_t micro[2][kKind == kNvfp4TokenSide ? 8 : 1];  // dim side: one pair of codes per row
};

template <uint32_t kKind>
__device__ __forceinline__ RawKeys<kKind> LoadKeys(const uint8_t* side, int g, int c) {
  constexpr uint32_t kRow = RowBytes(kKind);
  constexpr int kWords = RawKeys<kKind>::kWords;
  const uint8_t* micro = side + 16 * kRow;
  RawKeys<kKind> r;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int token = g + 8 * n;
    const uint8_t* row = side + token * kRow + (kRow / 4) * c;
    r.row[n] = row;
#pragma unroll
    for (int i = 0; i < kWords / 4; ++i) {
      const uint4 v = Load16(row + 16 * i);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int u = 0; u < 4; ++u) r.w[n][4 * i + u] = w[u];
    }
    if constexpr (kKind == kNvfp4DimSide) {
      r.micro[n][0] = *reinterpret_cast<const uint16_t*>(micro + 8 * token + 2 * c);
    }
  }
  if constexpr (kKind == kNvfp4TokenSide) {  // one micro-scale per dim, shared by both rows
    const uint4 a = Load16(micro + 32 * c), b = Load16(micro + 32 * c + 16);
    const uint32_t m[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) r.micro[0][i] = m[i];
  }
  return r;
}

// Quarter m of K row g + 8n (RawKeys) decoded to the canonical order: pairs 4m..4m+3, which
// hold dims 32c + 8m + q and 32c + 8m + q + 4 (NVFP4 times 2^-7); the FP32 scale is left out.
template <uint32_t kKind>
__device__ __forceinline__ void KeyQuad(const RawKeys<kKind>& r, int n, int m, uint32_t k[4]) {
  if constexpr (kKind == kFp16Side) {
    // Word u of the quarter holds dims 8m + 2u, 8m + 2u + 1.
    const uint4 v = Load16(r.row[n] + 16 * m);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) k[q] = Prmt(w[q / 2], w[2 + q / 2], q % 2 ? 0x7632 : 0x5410);
  } else if constexpr (kKind == kE4M3Side || kKind == kE5M2Side) {
    // Dims q and q + 4 for q = 0, 1 (lo), then q = 2, 3 (hi).
    const uint32_t lo = Prmt(r.w[n][2 * m], r.w[n][2 * m + 1], 0x5140);
    const uint32_t hi = Prmt(r.w[n][2 * m], r.w[n][2 * m + 1], 0x7362);
    Fp8x4ToHalf2x2<kKind == kE5M2Side>(lo, k[0], k[1]);
    Fp8x4ToHalf2x2<kKind == kE5M2Side>(hi, k[2], k[3]);
  } else {
    uint32_t scale[4];
    if constexpr (kKind == kNvfp4DimSide) {
      // Two micro-blocks: dims 32c..+15 (quarters 0, 1) and 32c+16..+31 (quarters 2, 3).
      const uint32_t pair = MicroPair(r.micro[n][0]);
      const uint32_t one = Prmt(pair, pair, m < 2 ? 0x1010 : 0x3232);
#pragma unroll
      for (int q = 0; q < 4; ++q) scale[q] = one;
    } else {
      // One micro-scale per dim (the page is one 16-token group), in the canonical order of
      // an FP8 row.
      const uint32_t lo = Prmt(r.micro[0][2 * m], r.micro[0][2 * m + 1], 0x5140);
      const uint32_t hi = Prmt(r.micro[0][2 * m], r.micro[0][2 * m + 1], 0x7362);
      Fp8x4ToHalf2x2<false>(lo, scale[0], scale[1]);
      Fp8x4ToHalf2x2<false>(hi, scale[2], scale[3]);
#pragma unroll
      for (int q = 0; q < 4; ++q) scale[q] = Hmul2(scale[q], kHalf2Pow7);
    }
    uint32_t h[4];
    E2M1x8Scaled(r.w[n][m], h);
#pragma unroll
    for (int q = 0; q < 4; ++q) k[q] = Hmul2(h[q], scale[q]);
  }
}

// V of tokens (2c, 2c+1) and (2c+8, 2c+9), dims 16g..16g+15, of a staged side, as loaded: the
// codes of each token (FP16 8 words, FP8 4, NVFP4 2) and the NVFP4 micro-scale codes, which
// ValueQuad decodes a quarter at a time. FP16 rows are loaded whole, in 16-byte loads (a
// quarter at a time they would take twice the loads, of 8 bytes). kMasked (FP16 only): tokens
// at or past `valid` read as zeros.
template <uint32_t kKind>
struct RawValues {
  static constexpr int kWords = kKind == kFp16Side ? 8 : kKind <= kE5M2Side ? 4 : 2;
  uint32_t a[2][kWords], b[2][kWords];  // [token pair j]: tokens 2c + 8j and 2c + 8j + 1
  uint32_t micro[2][kKind == kNvfp4TokenSide ? 4 : 1];
};

template <uint32_t kKind, bool kMasked = false>
__device__ __forceinline__ RawValues<kKind> LoadValues(const uint8_t* side, int g, int c,
                                                       int valid = kDecodeBlockTokens) {
  static_assert(!kMasked || kKind == kFp16Side);
  constexpr uint32_t kRow = RowBytes(kKind);
  constexpr int kWords = RawValues<kKind>::kWords;
  const uint8_t* micro = side + 16 * kRow;
  RawValues<kKind> r;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t0 = 2 * c + 8 * j;
    const uint8_t* ra = side + t0 * kRow + (kRow / 8) * g;
    const uint8_t* rb = ra + kRow;
    if constexpr (kWords == 2) {
      const uint2 a = *reinterpret_cast<const uint2*>(ra);
      const uint2 b = *reinterpret_cast<const uint2*>(rb);
      r.a[j][0] = a.x, r.a[j][1] = a.y, r.b[j][0] = b.x, r.b[j][1] = b.y;
    } else {
#pragma unroll
      for (int i = 0; i < kWords / 4; ++i) {
        const uint4 a = Load16(ra + 16 * i), b = Load16(rb + 16 * i);
        const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) r.a[j][4 * i + u] = wa[u], r.b[j][4 * i + u] = wb[u];
      }
    }
    if constexpr (kMasked) {
      const uint32_t keep_a = t0 < valid ? ~0u : 0u, keep_b = t0 + 1 < valid ? ~0u : 0u;
#pragma unroll
      for (int w = 0; w < kWords; ++w) r.a[j][w] &= keep_a, r.b[j][w] &= keep_b;
    }
    if constexpr (kKind == kNvfp4DimSide) {
      r.micro[j][0] = micro[8 * t0 + g] | (static_cast<uint32_t>(micro[8 * t0 + 8 + g]) << 8);
    }
  }
  if constexpr (kKind == kNvfp4TokenSide) {  // one micro-scale per dim, shared by every token
    const uint4 m = Load16(micro + 16 * g);
    r.micro[0][0] = m.x, r.micro[0][1] = m.y, r.micro[0][2] = m.z, r.micro[0][3] = m.w;
  }
  return r;
}

// Quarter i of token pair j (RawValues) decoded: v[q] holds dim 16g + 4i + q of the pair's two
// tokens (NVFP4 times 2^-7); the FP32 scale is left out.
template <uint32_t kKind>
__device__ __forceinline__ void ValueQuad(const RawValues<kKind>& r, int j, int i, uint32_t v[4]) {
  if constexpr (kKind == kFp16Side) {
#pragma unroll
    for (int w = 0; w < 2; ++w) {  // word 2i + w holds dims 4i + 2w, 4i + 2w + 1
      v[2 * w] = Prmt(r.a[j][2 * i + w], r.b[j][2 * i + w], 0x5410);
      v[2 * w + 1] = Prmt(r.a[j][2 * i + w], r.b[j][2 * i + w], 0x7632);
    }
  } else if constexpr (kKind == kE4M3Side || kKind == kE5M2Side) {
    const uint32_t lo = Prmt(r.a[j][i], r.b[j][i], 0x5140);  // dims 4i, 4i + 1
    const uint32_t hi = Prmt(r.a[j][i], r.b[j][i], 0x7362);  // dims 4i + 2, 4i + 3
    Fp8x4ToHalf2x2<kKind == kE5M2Side>(lo, v[0], v[1]);
    Fp8x4ToHalf2x2<kKind == kE5M2Side>(hi, v[2], v[3]);
  } else {
    uint32_t scale[4];  // per dim: the micro-scales of the two tokens
    if constexpr (kKind == kNvfp4DimSide) {
      const uint32_t pair = MicroPair(r.micro[j][0]);
#pragma unroll
      for (int q = 0; q < 4; ++q) scale[q] = pair;
    } else {
#pragma unroll
      for (int q = 0; q < 4; q += 2) {
        const uint32_t pair = MicroPair((r.micro[0][i] >> (8 * q)) & 0xFFFFu);
        scale[q] = Prmt(pair, pair, 0x1010);
        scale[q + 1] = Prmt(pair, pair, 0x3232);
      }
    }
    // Bytes of token a then token b, so that nibbles p and p + 4 are dim p of each token.
    const uint32_t x = Prmt(r.a[j][i / 2], r.b[j][i / 2], i % 2 ? 0x7632 : 0x5410);
    uint32_t h[4];
    E2M1x8Scaled(x, h);
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = Hmul2(h[q], scale[q]);
  }
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_FRAGMENTS_CUH_
