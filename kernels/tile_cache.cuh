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

// The tile's rows in `page` (laid out as `l`): the (head, side) rows of a page are contiguous
// ([heads][tokens][row_bytes]), so group g (GroupIndex) starts at element 16 g of them.
template <typename Byte>
__device__ __forceinline__ Byte* TileRows(const PageLayout& l, const Tile& t, Byte* page) {
  return page + l.PayloadOffset(Side(l, t), t.head, 0);
}

// The tile's NVFP4 micro-scales in t.dst: for micro-blocks along head_dim, the one of group g is
// byte g of them.
__device__ __forceinline__ uint8_t* TileMicroScales(const PageLayout& l, const Tile& t) {
  const uint32_t per_head = static_cast<uint32_t>(l.tokens) * (l.head_dim / kMicroBlock);
  return t.dst + Side(l, t).micro_offset + static_cast<uint32_t>(t.head) * per_head;
}

// The groups of 16 consecutive elements of a token in a tile.
__device__ __forceinline__ int TileGroups(const PageLayout& l) {
  return l.tokens * (l.head_dim / kMicroBlock);
}

// g -> (token, first element) for groups of 16 along head_dim, without a division per group
// (one per tile, for the multiplier).
struct GroupIndex {
  int groups;          // in the tile
  uint32_t per_token;  // head_dim / 16
  uint64_t magic;      // ceil(2^32 / per_token): exact for g * per_token < 2^32 / 64

  __device__ explicit GroupIndex(const PageLayout& l)
      : groups(TileGroups(l)),
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
// Each is loaded by Load(l, t, rows, g, token, s): group g of the tile, rows = TileRows(l, t,
// t.src), token = g's token where kNeedsToken or the source's scales are per (token, head) (else
// 0), s = RowScale of that token (DecodeRow's scale; E4M3 sources use it).
// Each gives: Get, the 16 values; Signs, their sign bits as FastPackE2M1x8 takes them; AbsMax,
// their largest magnitude, NaN or +Inf where the fast forms must not be used.

// 16 source elements: decoded floats for any source...
template <SrcKind kSrc>
struct CachedGroup {
  static constexpr bool kNeedsToken = true;
  float v[16];
  __device__ __forceinline__ void Load(const PageLayout& l, const Tile& t, const uint8_t*, int g,
                                       int token, float) {
    const int d0 = g * kMicroBlock - token * l.head_dim;
    LoadGroup<true>(l, Side(l, t), t.src, t.head, token, d0, t.src_scale, v);
  }
  __device__ __forceinline__ void Get(const Tile&, float x[16]) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = v[i];
  }
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
  static constexpr bool kNeedsToken = false;
  uint4 a, b;
  __device__ __forceinline__ void Load(const PageLayout&, const Tile&, const uint8_t* rows, int g,
                                       int, float) {
    const uint8_t* group = rows + static_cast<uint32_t>(g) * 32;
    a = *reinterpret_cast<const uint4*>(group);
    b = *reinterpret_cast<const uint4*>(group + 16);
  }
  __device__ __forceinline__ void Get(const Tile& t, float x[16]) const {
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = Decode16<true>(t.src_type, w[i] & 0xFFFFu);
      x[2 * i + 1] = Decode16<true>(t.src_type, w[i] >> 16);
    }
  }
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

// ...or, for E4M3 sources, the 16 codes and the row's scale s, decoded two codes per conversion
// instruction and multiplied by s: E4M3ToFloat(code) x s rounded once, as DecodeRow computes it.
// s is used only after every load of the tile is issued, so that no load waits for another. The
// micro-block amax is the largest magnitude code (rounding is monotonic) decoded once. Valid only
// where s is a finite non-negative float (the sign bits are the codes') and no code is NaN:
// AbsMax returns NaN otherwise, which sends the tile to the exact path.
template <>
struct CachedGroup<SrcKind::kE4M3> {
  static constexpr bool kNeedsToken = false;
  uint4 q;
  float s;
  __device__ __forceinline__ void Load(const PageLayout&, const Tile&, const uint8_t* rows, int g,
                                       int, float row_scale) {
    q = *reinterpret_cast<const uint4*>(rows + static_cast<uint32_t>(g) * 16);
    s = row_scale;
  }
  __device__ __forceinline__ void Get(const Tile&, float x[16]) const {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 lo = FastE4M3x2ToFloat2<0>(w[i]), hi = FastE4M3x2ToFloat2<1>(w[i]);
      x[4 * i] = lo.x * s;
      x[4 * i + 1] = lo.y * s;
      x[4 * i + 2] = hi.x * s;
      x[4 * i + 3] = hi.y * s;
    }
  }
  __device__ __forceinline__ float AbsMax(const Tile&) const {
    // The magnitude codes as u16 lanes: bytes 0 and 2 of each word, and bytes 1 and 3 eight
    // bits up (their maximum taken apart, then shifted down).
    constexpr uint32_t kEven = 0x007F007Fu, kOdd = 0x7F007F00u;
    const uint32_t odd =
        __vimax3_u16x2(q.x & kOdd, q.y & kOdd, __vmaxu2(q.z & kOdd, q.w & kOdd)) >> 8;
    uint32_t m = __vimax3_u16x2(q.z & kEven, q.w & kEven, odd);
    m = __vimax3_u16x2(q.x & kEven, q.y & kEven, m);
    m = __vmaxu2(m, __byte_perm(m, 0, 0x1032));  // the largest code in both lanes
    const bool valid = m < 0x007F007Fu && __float_as_uint(s) < 0x7F800000u;
    return valid ? FastE4M3x2ToFloat2<0>(m).x * s : __uint_as_float(0x7FFFFFFFu);
  }
  __device__ __forceinline__ uint32_t Signs(const Tile&, int h) const {
    return h == 0 ? SignNibbles8(q.x, q.y) : SignNibbles8(q.z, q.w);
  }
};

// All groups of a tile with at most kCachedGroups groups per lane.
template <SrcKind kSrc>
struct TileCache {
  CachedGroup<kSrc> group[kCachedGroups];

  // kFull: the tile has exactly 32 x kCachedGroups groups (no lane has fewer).
  template <bool kFull>
  __device__ __forceinline__ void Load(const PageLayout& sl, const Tile& t, int lane) {
    const int groups = kFull ? 32 * kCachedGroups : TileGroups(sl);
    const uint8_t* rows = TileRows(sl, t, t.src);
    const CodecLayout& c = Side(sl, t);
    // E4M3 rows may have a scale per (token, head).
    if (CachedGroup<kSrc>::kNeedsToken ||
        (kSrc == SrcKind::kE4M3 && c.scope == ScaleScope::kTokenHead)) {
      const GroupIndex gi(sl);  // a warp-uniform branch: one division per tile
#pragma unroll
      for (int k = 0; k < kCachedGroups; ++k) {
        const int g = lane + 32 * k;
        const int token = gi.Token(g);
        if (kFull || g < groups) {
          group[k].Load(sl, t, rows, g, token, RowScale(sl, c, t.src, t.head, token, t.src_scale));
        }
      }
    } else {
      const float s = RowScale(sl, c, t.src, t.head, 0, t.src_scale);  // the tile's
#pragma unroll
      for (int k = 0; k < kCachedGroups; ++k) {
        const int g = lane + 32 * k;
        if (kFull || g < groups) group[k].Load(sl, t, rows, g, 0, s);
      }
    }
  }
};

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_TILE_CACHE_CUH_
