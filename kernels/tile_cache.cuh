// The register cache of the migration kernel (migrate.cu): a warp's tile, one (layer, block,
// head, K/V side) of block_tokens x head_dim values, read in groups of 16 consecutive elements
// of a token, lane l taking groups l, l + 32, ... Tiles of at most kCachedGroups groups per lane
// are loaded once, all loads issued before the first is used, and kept between the amax pass
// and the encode pass: decoded floats for any source, raw bytes for FP16, BF16 and E4M3 sources
// (SrcKind, a kernel compiled for that source type).
#ifndef KVTIER_KERNELS_TILE_CACHE_CUH_
#define KVTIER_KERNELS_TILE_CACHE_CUH_

#include <cstdint>

#include "kernels/fast_codec.cuh"
#include "kernels/page_layout.h"
#include "kernels/tile_io.cuh"

namespace kvtier::gpu {

constexpr int kCachedGroups = 4;

// One warp's work: a (layer, block, head, side) tile.
struct Tile {
  const uint8_t* src;  // source page
  uint8_t* dst;        // destination page
  int side;            // 0: K, 1: V
  int head;
  ElementType src_type;
  ElementType dst_type;
  float src_scale;  // per-tensor scales of this side
  float dst_scale;
};

// The codec layout of the tile's side in `l` (a kernel parameter: read from constant memory).
__device__ __forceinline__ const CodecLayout& Side(const PageLayout& l, const Tile& t) {
  return t.side == 0 ? l.k : l.v;
}

// g -> (token, first element) for groups of 16 along head_dim, without a division per group.
struct GroupIndex {
  int groups;          // in the tile
  uint32_t per_token;  // head_dim / 16
  uint64_t magic;      // ceil(2^32 / per_token): exact for g * per_token < 2^32 / 64

  __device__ explicit GroupIndex(const PageLayout& l)
      : groups(l.tokens * (l.head_dim / kMicroBlock)),
        per_token(static_cast<uint32_t>(l.head_dim) / kMicroBlock),
        magic(0xFFFFFFFFull / per_token + 1) {}
  __device__ int Token(int g) const { return static_cast<int>((g * magic) >> 32); }
  __device__ int Dim(int g, int token) const {
    return (g - token * static_cast<int>(per_token)) * kMicroBlock;
  }
};

// The source element types a kernel is compiled for: any (a switch per group), FP16/BF16 on
// both sides, or FP8 E4M3 on both sides (any scale scope).
enum class SrcKind { kAny, k16, kE4M3 };

// The sign bits of x[0..7] as FastPackE2M1x8 takes them (bit 4i + 3: x[i] is negative).
__device__ __forceinline__ uint32_t FloatSignNibbles(const float* x) {
  uint32_t s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) s |= (__float_as_uint(x[i]) >> 31) << (4 * i + 3);
  return s;
}

// ---- Groups kept in registers (fast paths) ----
// Each gives: Get, the 16 values; Magnitudes, values with their magnitudes (signs may be
// dropped) for the NVFP4 encoder, which takes the signs from Signs; AbsMax, their largest
// magnitude, NaN or +Inf where the fast forms must not be used.

// 16 source elements: decoded floats for any source...
template <SrcKind kSrc>
struct CachedGroup {
  float v[16];
  __device__ __forceinline__ void Load(const PageLayout& l, const Tile& t, int token, int d0) {
    LoadGroup<true>(l, Side(l, t), t.src, t.head, token, d0, t.src_scale, v);
  }
  __device__ __forceinline__ void Get(const Tile&, float x[16]) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = v[i];
  }
  __device__ __forceinline__ void Magnitudes(const Tile& t, float x[16]) const { Get(t, x); }
  __device__ __forceinline__ float AbsMax(const Tile&) const {
    float a = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) a = MaxAbsNan(a, v[i]);
    return a;
  }
  // The sign bits of elements 8h..8h+7 as FastPackE2M1x8 takes them.
  __device__ __forceinline__ uint32_t Signs(const Tile&, int h) const {
    return FloatSignNibbles(v + 8 * h);
  }
};

// ...or, for FP16/BF16 sources, the raw 32 bytes (half the registers of floats, so more warps
// fit), whose amax is taken two values at a time with packed max.NaN (exact: max of halves).
__device__ __forceinline__ uint32_t MaxNan16x2(uint32_t a, uint32_t b, bool bf16) {
  uint32_t r;
  if (bf16) {
    asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  } else {
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  }
  return r;
}

template <>
struct CachedGroup<SrcKind::k16> {
  uint4 a, b;
  __device__ __forceinline__ void Load(const PageLayout& l, const Tile& t, int token, int d0) {
    const uint8_t* row = t.src + l.PayloadOffset(Side(l, t), t.head, token) + d0 * 2;
    a = *reinterpret_cast<const uint4*>(row);
    b = *reinterpret_cast<const uint4*>(row + 16);
  }
  __device__ __forceinline__ void Get(const Tile& t, float x[16]) const {
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = Decode16<true>(t.src_type, w[i] & 0xFFFFu);
      x[2 * i + 1] = Decode16<true>(t.src_type, w[i] >> 16);
    }
  }
  __device__ __forceinline__ void Magnitudes(const Tile& t, float x[16]) const { Get(t, x); }
  __device__ __forceinline__ float AbsMax(const Tile& t) const {
    const bool bf16 = t.src_type == ElementType::kBf16;
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t m = w[0] & 0x7FFF7FFFu;
#pragma unroll
    for (int i = 1; i < 8; ++i) m = MaxNan16x2(m, w[i] & 0x7FFF7FFFu, bf16);
    return MaxAbsNan(Decode16<true>(t.src_type, m & 0xFFFFu), Decode16<true>(t.src_type, m >> 16));
  }
  // The sign bit of a 16-bit value is bit 7 of its high byte.
  __device__ __forceinline__ uint32_t Signs(const Tile&, int h) const {
    const uint4 q = h == 0 ? a : b;
    return SignNibbles8(__byte_perm(q.x, q.y, 0x7531), __byte_perm(q.z, q.w, 0x7531));
  }
};

// ...or, for E4M3 sources, the 16 codes and the row's scale s. Decoded as
// FastE4M3Magnitude(bits) x s2 with s2 = s x 2^120: |code value| x s rounded once, as DecodeRow
// computes it, with no conversion instruction; the sign is the code's (s2 >= +0). s2 is formed
// where it is used, not in Load, so that no load waits for another. The micro-block amax is the
// largest magnitude code decoded (rounding is monotonic). Valid only where s2 is a finite
// non-negative float (s in [+0, 2^8)) and no code is NaN: AbsMax returns NaN otherwise, which
// sends the tile to the exact path.
template <>
struct CachedGroup<SrcKind::kE4M3> {
  uint4 q;
  float s;
  __device__ __forceinline__ void Load(const PageLayout& l, const Tile& t, int token, int d0) {
    const CodecLayout& c = Side(l, t);
    q = *reinterpret_cast<const uint4*>(t.src + l.PayloadOffset(c, t.head, token) + d0);
    s = RowScale(l, c, t.src, t.head, token, t.src_scale);
  }
  // x[i], or with kSign false |x[i]|.
  template <bool kSign>
  __device__ __forceinline__ void Decode(float x[16]) const {
    const float s2 = s * 0x1p120f;
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t b = i % 4;
      const uint32_t mag = (b < 3 ? w[i / 4] << (20 - 8 * b) : w[i / 4] >> 4) & 0x07F00000u;
      x[i] = FastE4M3Magnitude(mag) * s2;
      const uint32_t sign = (w[i / 4] << (24 - 8 * b)) & 0x80000000u;
      if (kSign) x[i] = __uint_as_float(__float_as_uint(x[i]) | sign);
    }
  }
  __device__ __forceinline__ void Get(const Tile&, float x[16]) const { Decode<true>(x); }
  __device__ __forceinline__ void Magnitudes(const Tile&, float x[16]) const { Decode<false>(x); }
  __device__ __forceinline__ float AbsMax(const Tile&) const {
    // The 16 magnitude codes as u16 pairs (bytes 0 and 2, then bytes 1 and 3 of each word).
    constexpr uint32_t kLow7 = 0x007F007Fu;
    uint32_t m = __vimax3_u16x2(q.x & kLow7, q.y & kLow7, q.z & kLow7);
    m = __vimax3_u16x2(m, q.w & kLow7, (q.x >> 8) & kLow7);
    m = __vimax3_u16x2(m, (q.y >> 8) & kLow7, (q.z >> 8) & kLow7);
    m = __vimax3_u16x2(m, (q.w >> 8) & kLow7, 0u);
    m = max(m & 0xFFFFu, m >> 16);
    const float s2 = s * 0x1p120f;
    const bool valid = m < 0x7Fu && __float_as_uint(s2) < 0x7F800000u;
    return valid ? FastE4M3Magnitude(m << 20) * s2 : __uint_as_float(0x7FFFFFFFu);
  }
  __device__ __forceinline__ uint32_t Signs(const Tile&, int h) const {
    return h == 0 ? SignNibbles8(q.x, q.y) : SignNibbles8(q.z, q.w);
  }
};

// All groups of a tile with at most kCachedGroups groups per lane.
template <SrcKind kSrc>
struct TileCache {
  CachedGroup<kSrc> group[kCachedGroups];

  __device__ __forceinline__ void Load(const PageLayout& sl, const Tile& t, int lane) {
    const GroupIndex gi(sl);
#pragma unroll
    for (int k = 0; k < kCachedGroups; ++k) {
      const int g = lane + 32 * k;
      if (g < gi.groups) {
        const int token = gi.Token(g);
        group[k].Load(sl, t, token, gi.Dim(g, token));
      }
    }
  }
};

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_TILE_CACHE_CUH_
