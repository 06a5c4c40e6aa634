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

// K rows g and g + 8 of a staged side, dims 32c..32c+31, decoded to the canonical order
// (NVFP4 times 2^-7); the FP32 scale is left out.
template <uint32_t kKind>
__device__ __forceinline__ void LoadKeys(const uint8_t* side, int g, int c, uint32_t k[2][16]) {
  constexpr uint32_t kRow = RowBytes(kKind);
  const uint8_t* micro = side + 16 * kRow;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int token = g + 8 * n;
    const uint8_t* row = side + token * kRow;
    if constexpr (kKind == kFp16Side) {
      uint32_t w[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = Load16(row + 64 * c + 16 * i);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
      // Word u holds dims 2u, 2u + 1; pair 4m + q needs dims 8m + q and 8m + q + 4.
#pragma unroll
      for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          k[n][4 * m + q] = Prmt(w[4 * m + q / 2], w[4 * m + 2 + q / 2], q % 2 ? 0x7632 : 0x5410);
        }
      }
    } else if constexpr (kKind == kE4M3Side || kKind == kE5M2Side) {
      Fp8RowToCanonical<kKind == kE5M2Side>(Load16(row + 32 * c), Load16(row + 32 * c + 16), k[n]);
    } else {
      const uint4 v = Load16(row + 16 * c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t scale[16];  // per canonical pair
      if constexpr (kKind == kNvfp4DimSide) {
        // Two micro-blocks: dims 32c..+15 (words 0, 1) and 32c+16..+31 (words 2, 3).
        const uint32_t pair =
            MicroPair(*reinterpret_cast<const uint16_t*>(micro + 8 * token + 2 * c));
        const uint32_t lo = Prmt(pair, pair, 0x1010), hi = Prmt(pair, pair, 0x3232);
#pragma unroll
        for (int r = 0; r < 16; ++r) scale[r] = r < 8 ? lo : hi;
      } else {
        // One micro-scale per dim (the page is one 16-token group): the canonical order of an
        // FP8 row.
        uint32_t ms[16];
        Fp8RowToCanonical<false>(Load16(micro + 32 * c), Load16(micro + 32 * c + 16), ms);
#pragma unroll
        for (int r = 0; r < 16; ++r) scale[r] = Hmul2(ms[r], kHalf2Pow7);
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        uint32_t h[4];
        E2M1x8Scaled(w[m], h);
#pragma unroll
        for (int q = 0; q < 4; ++q) k[n][4 * m + q] = Hmul2(h[q], scale[4 * m + q]);
      }
    }
  }
}

// V of tokens (2c, 2c+1) and (2c+8, 2c+9), dims 16g..16g+15, of a staged side, as token
// pairs: v[j][t] holds dim 16g + t of token pair j (NVFP4 times 2^-7). The FP32 scale is left
// out. kMasked (FP16 only): tokens at or past `valid` read as zeros.
template <uint32_t kKind, bool kMasked = false>
__device__ __forceinline__ void LoadValues(const uint8_t* side, int g, int c, uint32_t v[2][16],
                                           int valid = kDecodeBlockTokens) {
  static_assert(!kMasked || kKind == kFp16Side);
  constexpr uint32_t kRow = RowBytes(kKind);
  const uint8_t* micro = side + 16 * kRow;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t0 = 2 * c + 8 * j;
    const uint8_t* ra = side + t0 * kRow;
    const uint8_t* rb = ra + kRow;
    if constexpr (kKind == kFp16Side) {
      const uint4 a0 = Load16(ra + 32 * g), a1 = Load16(ra + 32 * g + 16);
      const uint4 b0 = Load16(rb + 32 * g), b1 = Load16(rb + 32 * g + 16);
      uint32_t a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      uint32_t b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      if constexpr (kMasked) {
        const uint32_t keep_a = t0 < valid ? ~0u : 0u, keep_b = t0 + 1 < valid ? ~0u : 0u;
#pragma unroll
        for (int w = 0; w < 8; ++w) a[w] &= keep_a, b[w] &= keep_b;
      }
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        v[j][2 * w] = Prmt(a[w], b[w], 0x5410);
        v[j][2 * w + 1] = Prmt(a[w], b[w], 0x7632);
      }
    } else if constexpr (kKind == kE4M3Side || kKind == kE5M2Side) {
      const uint4 a = Load16(ra + 16 * g), b = Load16(rb + 16 * g);
      const uint32_t wa[4] = {a.x, a.y, a.z, a.w};
      const uint32_t wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t lo = Prmt(wa[w], wb[w], 0x5140);  // dims 4w, 4w + 1
        const uint32_t hi = Prmt(wa[w], wb[w], 0x7362);  // dims 4w + 2, 4w + 3
        Fp8x4ToHalf2x2<kKind == kE5M2Side>(lo, v[j][4 * w + 0], v[j][4 * w + 1]);
        Fp8x4ToHalf2x2<kKind == kE5M2Side>(hi, v[j][4 * w + 2], v[j][4 * w + 3]);
      }
    } else {
      const uint2 a = *reinterpret_cast<const uint2*>(ra + 8 * g);
      const uint2 b = *reinterpret_cast<const uint2*>(rb + 8 * g);
      uint32_t scale[16];  // per dim t: the micro-scales of the two tokens
      if constexpr (kKind == kNvfp4DimSide) {
        const uint32_t pair =
            MicroPair(micro[8 * t0 + g] | (static_cast<uint32_t>(micro[8 * t0 + 8 + g]) << 8));
#pragma unroll
        for (int t = 0; t < 16; ++t) scale[t] = pair;
      } else {
        const uint4 m = Load16(micro + 16 * g);
        const uint32_t mw[4] = {m.x, m.y, m.z, m.w};
#pragma unroll
        for (int t = 0; t < 16; t += 2) {
          const uint32_t pair = MicroPair((mw[t / 4] >> (8 * (t % 4))) & 0xFFFFu);
          scale[t] = Prmt(pair, pair, 0x1010);
          scale[t + 1] = Prmt(pair, pair, 0x3232);
        }
      }
      // Bytes of token a then token b, so that nibbles p and p + 4 are dim p of each token.
      const uint32_t x[4] = {Prmt(a.x, b.x, 0x5410), Prmt(a.x, b.x, 0x7632),
                             Prmt(a.y, b.y, 0x5410), Prmt(a.y, b.y, 0x7632)};
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // dims 4i .. 4i + 3
        uint32_t h[4];
        E2M1x8Scaled(x[i], h);
#pragma unroll
        for (int q = 0; q < 4; ++q) v[j][4 * i + q] = Hmul2(h[q], scale[4 * i + q]);
      }
    }
  }
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_FRAGMENTS_CUH_
