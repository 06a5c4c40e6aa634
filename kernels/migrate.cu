// The migration kernel: requantises full blocks from one palette format into a colder one in
// every layer, in one launch. One warp owns one (layer, block, head, K/V side) tile of
// block_tokens x head_dim values and reproduces page_codec.h's DecodeRow + EncodeBlockHead on
// it:
//   - the tile is read in groups of 16 consecutive elements of a token (two 16-byte loads for
//     a 16-bit source), lane l taking groups l, l + 32, ...; a tile's rows are contiguous in a
//     page, so group g is at a fixed stride from the first (TileRows), as is its NVFP4
//     micro-scale (TileMicroScales);
//   - the grid's y index is the layer; a power-of-two head count splits a warp's index into
//     (block, side, head) with shifts;
//   - the block's amax is a warp max (exact: max does not depend on order);
//   - FP8 and NVFP4 values are encoded with the fast forms of fast_codec.cuh, and the amax is
//     taken so that a NaN or an Inf makes it non-finite: such a tile (or one whose amax passes
//     kFastAmaxMax) is redone with the codec functions throughout (a warp-uniform branch taken
//     before anything is written), so the fast forms only ever see inputs on which they equal
//     the codec.
// Tiles of at most kCachedGroups groups per lane (16 x 128 and smaller) stay in registers
// between the amax pass and the encode pass (tile_cache.cuh), as raw bytes for FP16, BF16 and
// E4M3 sources (a kernel compiled for that source type, so that a lane issues all its loads
// before it waits), so that 3 to 5 blocks of 8 warps fit per SM (migrate_occupancy.h) and keep
// enough loads in flight (docs/gpu.md has the measurements, and a persistent cp.async variant
// that was slower).
// Larger tiles are read twice. Codecs that encode token by token (FP16, BF16, FP8 per tensor
// or per (token, head), NVFP4 per tensor) take a lane per token and the codec functions.
#include <cfloat>
#include <cstdint>

#include "kernels/data_plane.cuh"
#include "kernels/tile_cache.cuh"
#include "kernels/tile_io.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWarpsPerBlock = 8;

// The tile of warp `item` of layer `layer`: item = (block * 2 + side) * heads + head, so that
// neighbouring warps touch neighbouring bytes of a page. A power-of-two head count (the usual
// case) takes shifts instead of a 32-bit division.
// kOneTensor (a layout where SidesAreOneTensor holds for source and destination): the tile is
// named as K's head side * heads + head, which the K side's offsets place on V's data, so that
// the layout's fields come from K alone (no per-side selects); only the per-tensor scales
// depend on the side.
template <bool kOneTensor>
__device__ __forceinline__ Tile TileOf(const RequantizeParams& p, uint32_t layer, uint32_t item) {
  const uint32_t heads = static_cast<uint32_t>(p.src.heads);
  uint32_t head, pair;  // pair = block * 2 + side
  if ((heads & (heads - 1)) == 0) {
    head = item & (heads - 1);
    pair = item >> (__ffs(heads) - 1);
  } else {
    head = item % heads;
    pair = item / heads;
  }
  const uint32_t side = pair & 1, block = pair >> 1;
  const LayerPools& pools = p.layers[layer];
  Tile t;
  t.src = pools.src + static_cast<size_t>(p.src_pages[block]) * p.src.page_bytes;
  t.dst = pools.dst + static_cast<size_t>(p.dst_pages[block]) * p.dst.page_bytes;
  t.side = kOneTensor ? 0 : static_cast<int>(side);
  t.src_type = side == 0 || kOneTensor ? p.src.k.type : p.src.v.type;
  t.dst_type = side == 0 || kOneTensor ? p.dst.k.type : p.dst.v.type;
  t.head = static_cast<int>(kOneTensor ? side * heads + head : head);
  t.src_scale = side == 0 ? pools.src_k_scale : pools.src_v_scale;
  t.dst_scale = side == 0 ? pools.dst_k_scale : pools.dst_v_scale;
  return t;
}

enum class DstKind { kRowWise, kFp8Block, kNvfp4Block, kNvfp4Channel };

__host__ __device__ DstKind KindOf(const CodecLayout& c) {
  if (c.scope != ScaleScope::kBlockHead) return DstKind::kRowWise;
  if (c.type != ElementType::kNvfp4) return DstKind::kFp8Block;
  return c.axis == MicroAxis::kHeadDim ? DstKind::kNvfp4Block : DstKind::kNvfp4Channel;
}

// The amax step of the fast paths: max.NaN makes the amax NaN when a value is NaN, and it is
// +Inf when one is infinite; either sends the tile to the exact path. For tiles of finite
// values it equals page_codec.h's AmaxOf.
template <bool kFast>
__device__ __forceinline__ float AmaxStepOf(float amax, float x) {
  return kFast ? MaxAbsNan(amax, x) : fmaxf(amax, FiniteAbs(x));
}

// The largest tile amax the fast forms take: FastDivide2688By's range, below which an NVFP4
// micro-block's multiplier S_enc / sf >= 6 / amax stays in E2M1Steps' (kE2M1StepsMin).
constexpr float kFastAmaxMax = kFastDivide2688ByMax;
static_assert(6.f / kFastAmaxMax >= kE2M1StepsMin);

// True when any lane's fast amax is NaN, infinite or above kFastAmaxMax: the tile takes the
// exact path (checked before WarpMax, which drops NaN).
__device__ __forceinline__ bool AnyBeyondFastForms(float amax) {
  return __any_sync(kFullMask, !(amax <= kFastAmaxMax));
}

// ---- Encoders of one group of 16 elements along head_dim ----

// `out`: the group's 16 bytes in the destination page.
template <bool kFast>
__device__ __forceinline__ void StoreFp8Group(const Tile& t, uint8_t* out, const float x[16],
                                              float inv) {
  uint32_t w[4];
  if (kFast && t.dst_type == ElementType::kFp8E4M3) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = FastE4M3x4(x[4 * j] * inv, x[4 * j + 1] * inv, x[4 * j + 2] * inv,
                        x[4 * j + 3] * inv);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[j] |= static_cast<uint32_t>(EncodeFp8(t.dst_type, x[4 * j + i] * inv)) << (8 * i);
      }
    }
  }
  *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
}

// codec::Nvfp4MicroScale, and the multiplier codec::Nvfp4EncodeValue applies to every value
// of the micro-block (0 when the values encode as zeros), computed once.
// REQUIRES: s_enc from codec::Nvfp4EncodeScale (0, or in [2688 / FLT_MAX, 2688 x 2^96]); with
// kFast, micro_amax finite and non-negative. Then t is in [+0, FLT_MAX] (code 0 for +0, as the
// codec's t > 0 test gives), and a nonzero code's multiplier lies in [6 / FLT_MAX, 2^117]: a
// normal float, as FastDivideByE4M3 requires.
template <bool kFast>
__device__ __forceinline__ uint8_t MicroScale(float s_enc, float micro_amax, float* m) {
  if (kFast) {
    static_assert(codec::kE2M1Max == 6.f);
    const float t = FastDivideBy6(fminf(s_enc * micro_amax, FLT_MAX));
    const uint8_t sf = static_cast<uint8_t>(FastE4M3(t));
    *m = FastDivideByE4M3(s_enc, sf);
    return sf;
  }
  const uint8_t sf = codec::Nvfp4MicroScale(s_enc, micro_amax);
  *m = codec::Nvfp4EncodeMultiplier(s_enc, sf);
  return sf;
}

// The E2M1 codes of 8 values x[i] * m, packed (x[0] in the low nibble); all zero when m == 0,
// as codec::Nvfp4EncodeScaled. With kFast, computed without a branch, then masked; the sign
// bits are `signs` (FloatSignNibbles of the values; the magnitudes of x are used), kSaturate
// false skips the clamp to 6 (REQUIRES then |x[i] * m| < 7), and m is 0 or in E2M1Steps' range.
template <bool kFast, bool kSaturate = true>
__device__ __forceinline__ uint32_t PackE2M1x8(const float* x, float m, uint32_t signs) {
  if (kFast) return m > 0.f ? FastPackE2M1x8<kSaturate>(x, E2M1Steps(m), signs) : 0u;
  uint32_t w = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) w |= codec::Nvfp4EncodeScaled(x[i], m) << (4 * i);
  return w;
}

// One NVFP4 micro-block along head_dim whose amax is `micro_amax`, written to its micro-scale
// byte `sf_out` and its 8 payload bytes `out`; signs[h]: the sign bits of x[8h..8h+7] (see
// PackE2M1x8).
// With a normal micro-scale (code >= 8: sf within 1/16 of t = S_enc a / 6, and at most 448
// since a <= A), every |x| m <= 6 (t / sf) (1 + 2^-21) <= 6.375 (1 + 2^-21) < 7, so the fast
// form needs no clamp; subnormal micro-scales (tiny micro-blocks against the block's amax) take
// the clamped form.
template <bool kFast>
__device__ __forceinline__ void StoreNvfp4Group(uint8_t* sf_out, uint8_t* out, const float x[16],
                                                float micro_amax, float s_enc,
                                                const uint32_t signs[2]) {
  float m;
  const uint8_t sf = MicroScale<kFast>(s_enc, micro_amax, &m);
  *sf_out = sf;
  uint2 q;
  if (!kFast || sf < 8) {
    q = make_uint2(PackE2M1x8<kFast>(x, m, signs[0]), PackE2M1x8<kFast>(x + 8, m, signs[1]));
  } else {
    q = make_uint2(PackE2M1x8<true, false>(x, m, signs[0]),
                   PackE2M1x8<true, false>(x + 8, m, signs[1]));
  }
  *reinterpret_cast<uint2*>(out) = q;
}

// The per-(block, head) fp32 scale and the value multiplier of a block-scoped codec.
// REQUIRES: with kFast, amax in [0, kFastAmaxMax] (NVFP4's scales by the fast divisions).
template <bool kFast>
__device__ __forceinline__ float StoreBlockScale(const PageLayout& dl, const Tile& t, int lane,
                                                 float amax) {
  const bool nvfp4 = t.dst_type == ElementType::kNvfp4;
  float scale, mult;
  if (kFast && nvfp4) {  // codec::Nvfp4DecodeScale and Nvfp4EncodeScale
    const bool zero = !(amax >= codec::kNvfp4MinAmax);
    scale = zero ? 0.f : FastDivideBy2688(amax);
    mult = zero ? 0.f : FastDivide2688By(amax);
  } else if (nvfp4) {
    scale = codec::Nvfp4DecodeScale(amax);
    mult = codec::Nvfp4EncodeScale(amax);
  } else {
    scale = Fp8ScaleFor(t.dst_type, amax);
    mult = Reciprocal(scale);
  }
  if (lane == 0) *reinterpret_cast<float*>(t.dst + dl.ScaleOffset(Side(dl, t), t.head, 0)) = scale;
  return mult;
}

// ---- Fast path over a cached tile: FP8 or NVFP4 (along head_dim) per (block, head) ----

// Returns false, having written nothing, when the tile holds a NaN, an Inf or a magnitude above
// kFastAmaxMax.
// REQUIRES: the tile has at most 32 x kCachedGroups groups; exactly that many with kFull (the
// 16 x 128 tiles of the usual geometry: no group is checked against the tile's end).
template <SrcKind kSrc, bool kFull>
__device__ __forceinline__ bool CachedBlockTile(const PageLayout& sl, const PageLayout& dl,
                                                const Tile& t, int lane) {
  TileCache<kSrc> cache;
  cache.template Load<kFull>(sl, t, lane);
  const int groups = kFull ? 32 * kCachedGroups : TileGroups(sl);
  float micro[kCachedGroups];
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < kCachedGroups; ++k) {
    micro[k] = kFull || lane + 32 * k < groups ? cache.group[k].AbsMax(t) : 0.f;
    amax = MaxAbsNan(amax, micro[k]);
  }
  if (AnyBeyondFastForms(amax)) return false;
  const float mult = StoreBlockScale<true>(dl, t, lane, WarpMax(amax));  // inv or s_enc
  const bool nvfp4 = t.dst_type == ElementType::kNvfp4;
  uint8_t* const rows = TileRows(dl, t, t.dst);
  uint8_t* const micro_scales = TileMicroScales(dl, t);
#pragma unroll
  for (int k = 0; k < kCachedGroups; ++k) {
    const uint32_t g = lane + 32 * k;
    if (kFull || g < static_cast<uint32_t>(groups)) {
      float x[16];
      cache.group[k].Get(t, x);
      if (nvfp4) {
        const uint32_t signs[2] = {cache.group[k].Signs(t, 0), cache.group[k].Signs(t, 1)};
        StoreNvfp4Group<true>(micro_scales + g, rows + 8 * g, x, micro[k], mult, signs);
      } else {
        StoreFp8Group<true>(t, rows + 16 * g, x, mult);
      }
    }
  }
  return true;
}

// ---- Streaming path, any tile size: amax pass, then encode pass reading the tile again ----

// Returns false, having written nothing, when kFast and the tile holds a NaN, an Inf or a
// magnitude above kFastAmaxMax.
template <bool kFast, bool kSrc16>
__device__ __forceinline__ bool StreamBlockTile(const PageLayout& sl, const PageLayout& dl,
                                                const Tile& t, int lane) {
  const GroupIndex gi(sl);
  float x[16];
  float amax = 0.f;
  for (int g = lane; g < gi.groups; g += 32) {
    const int token = gi.Token(g);
    LoadGroup<kFast, kSrc16>(sl, Side(sl, t), t.src, t.head, token, gi.Dim(g, token),
                             t.src_scale, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = AmaxStepOf<kFast>(amax, x[i]);
  }
  if (kFast && AnyBeyondFastForms(amax)) return false;
  const float mult = StoreBlockScale<kFast>(dl, t, lane, WarpMax(amax));
  const bool nvfp4 = t.dst_type == ElementType::kNvfp4;
  uint8_t* const rows = TileRows(dl, t, t.dst);
  uint8_t* const micro_scales = TileMicroScales(dl, t);
  for (int g = lane; g < gi.groups; g += 32) {
    const int token = gi.Token(g);
    LoadGroup<kFast, kSrc16>(sl, Side(sl, t), t.src, t.head, token, gi.Dim(g, token),
                             t.src_scale, x);
    if (nvfp4) {
      float micro = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) micro = AmaxStepOf<kFast>(micro, x[i]);
      const uint32_t signs[2] = {FloatSignNibbles(x), FloatSignNibbles(x + 8)};
      StoreNvfp4Group<kFast>(micro_scales + g, rows + 8 * g, x, micro, mult, signs);
    } else {
      StoreFp8Group<kFast>(t, rows + 16 * g, x, mult);
    }
  }
  return true;
}

// ---- NVFP4, micro-blocks of 16 tokens per channel, second level per (block, head) ----

// Returns false, having written nothing, when kFast and the tile holds a NaN, an Inf or a
// magnitude above kFastAmaxMax.
// A lane owns a channel pair (d, d + 1) of a 16-token segment: one output byte per token.
template <bool kFast, bool kSrc16>
__device__ __forceinline__ bool Nvfp4ChannelTile(const PageLayout& sl, const PageLayout& dl,
                                                 const Tile& t, int lane) {
  const GroupIndex gi(sl);
  float amax = 0.f;
  for (int g = lane; g < gi.groups; g += 32) {
    float x[16];
    const int token = gi.Token(g);
    LoadGroup<kFast, kSrc16>(sl, Side(sl, t), t.src, t.head, token, gi.Dim(g, token),
                             t.src_scale, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = AmaxStepOf<kFast>(amax, x[i]);
  }
  if (kFast && AnyBeyondFastForms(amax)) return false;
  const float s_enc = StoreBlockScale<kFast>(dl, t, lane, WarpMax(amax));
  const int pairs = sl.head_dim / 2;
  const int units = (sl.tokens / kMicroBlock) * pairs;
  for (int u = lane; u < units; u += 32) {
    const int t0 = (u / pairs) * kMicroBlock;
    const int d = (u % pairs) * 2;
    float x0[kMicroBlock], x1[kMicroBlock];
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int i = 0; i < kMicroBlock; ++i) {
      x0[i] = LoadElement<kFast, kSrc16>(sl, Side(sl, t), t.src, t.head, t0 + i, d, t.src_scale);
      x1[i] =
          LoadElement<kFast, kSrc16>(sl, Side(sl, t), t.src, t.head, t0 + i, d + 1, t.src_scale);
      a0 = AmaxStepOf<kFast>(a0, x0[i]);
      a1 = AmaxStepOf<kFast>(a1, x1[i]);
    }
    float m0, m1;
    t.dst[dl.MicroOffset(Side(dl, t), t.head, t0, d)] = MicroScale<kFast>(s_enc, a0, &m0);
    t.dst[dl.MicroOffset(Side(dl, t), t.head, t0, d + 1)] = MicroScale<kFast>(s_enc, a1, &m1);
    const uint32_t mask0 = m0 > 0.f ? 0xFu : 0u;
    const uint32_t mask1 = m1 > 0.f ? 0xF0u : 0u;
#pragma unroll
    for (int i = 0; i < kMicroBlock; ++i) {
      const uint32_t q0 =
          kFast ? FastE2M1(x0[i], E2M1Steps(m0)) : codec::Nvfp4EncodeScaled(x0[i], m0);
      const uint32_t q1 =
          kFast ? FastE2M1(x1[i], E2M1Steps(m1)) : codec::Nvfp4EncodeScaled(x1[i], m1);
      t.dst[dl.PayloadOffset(Side(dl, t), t.head, t0 + i) + d / 2] =
          static_cast<uint8_t>((q0 & mask0) | ((q1 << 4) & mask1));
    }
  }
  return true;
}

// ---- Token-wise destination codecs: a lane per token, exact codec functions ----

__device__ __forceinline__ void RowWiseTile(const PageLayout& sl, const PageLayout& dl,
                                            const Tile& t, int lane) {
  for (int token = lane; token < sl.tokens; token += 32) {
    EncodeRowChunked(dl, Side(dl, t), t.dst, t.head, token, t.dst_scale, [&](int d0, float* x) {
      LoadGroup<false>(sl, Side(sl, t), t.src, t.head, token, d0, t.src_scale, x);
    });
  }
}

// The codec functions throughout, out of line so that their registers do not weigh on the
// fast paths.
__device__ __noinline__ void ExactTile(const PageLayout& sl, const PageLayout& dl, Tile t,
                                       int lane) {
  switch (KindOf(Side(dl, t))) {
    case DstKind::kRowWise:
      RowWiseTile(sl, dl, t, lane);
      return;
    case DstKind::kFp8Block:
    case DstKind::kNvfp4Block:
      StreamBlockTile<false, false>(sl, dl, t, lane);
      return;
    case DstKind::kNvfp4Channel:
      Nvfp4ChannelTile<false, false>(sl, dl, t, lane);
      return;
  }
}

// A warp per tile, blockIdx.y the layer. kSrc: the source element types it is compiled for
// (SrcKind).
// kBlocksPerSm blocks of 8 warps per SM: more warps keep more loads in flight, fewer
// registers per thread leave less room for independent work (RequantizeVariant).
// kOneTensor: both layouts' sides are one tensor (SidesAreOneTensor; TileOf).
template <bool kFast, SrcKind kSrc, int kBlocksPerSm, bool kOneTensor = false>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kBlocksPerSm)
    RequantizeKernel(const __grid_constant__ RequantizeParams p) {
  const uint32_t item = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  // The launcher keeps the items of a layer below 2^32.
  if (item >= static_cast<uint32_t>(p.num_blocks) * 2 * static_cast<uint32_t>(p.src.heads)) return;
  const int lane = threadIdx.x % 32;
  constexpr bool kSrc16 = kSrc == SrcKind::k16;
  const Tile t = TileOf<kOneTensor>(p, blockIdx.y, item);
  if (kFast) {
    switch (KindOf(Side(p.dst, t))) {
      case DstKind::kFp8Block:
      case DstKind::kNvfp4Block:
        if (TileGroups(p.src) == 32 * kCachedGroups) {
          if (CachedBlockTile<kSrc, true>(p.src, p.dst, t, lane)) return;
        } else if (TileGroups(p.src) < 32 * kCachedGroups) {
          if (CachedBlockTile<kSrc, false>(p.src, p.dst, t, lane)) return;
        } else if (StreamBlockTile<true, kSrc16>(p.src, p.dst, t, lane)) {
          return;
        }
        break;
      case DstKind::kNvfp4Channel:
        if (Nvfp4ChannelTile<true, kSrc16>(p.src, p.dst, t, lane)) return;
        break;
      case DstKind::kRowWise:
        break;
    }
  }
  ExactTile(p.src, p.dst, t, lane);
}

// Whether the K and V sides of `l` lie as one tensor of 2 x heads heads: the same codec, and
// V's payload, micro-scales and scales each right after K's.
bool SidesAreOneTensor(const PageLayout& l) {
  const CodecLayout &k = l.k, &v = l.v;
  const uint32_t heads = static_cast<uint32_t>(l.heads), tokens = static_cast<uint32_t>(l.tokens);
  const uint32_t micro_per_head = tokens * static_cast<uint32_t>(l.head_dim) / kMicroBlock;
  const uint32_t scales_per_head = k.scope == ScaleScope::kTokenHead ? tokens : 1;
  const bool page_scales = k.scope == ScaleScope::kBlockHead || k.scope == ScaleScope::kTokenHead;
  return k.type == v.type && k.scope == v.scope && k.axis == v.axis && k.row_bytes == v.row_bytes &&
         v.payload_offset == k.payload_offset + heads * tokens * k.row_bytes &&
         (k.type != ElementType::kNvfp4 ||
          v.micro_offset == k.micro_offset + heads * micro_per_head) &&
         (!page_scales || v.scale_offset == k.scale_offset + heads * scales_per_head * 4);
}

// The fast kernel for sources kSrc at `blocks` (2 to 5) blocks per SM.
template <SrcKind kSrc, bool kOneTensor>
void LaunchFastKernel(const RequantizeParams& p, int blocks, dim3 grid, cudaStream_t stream) {
  constexpr int kThreads = kWarpsPerBlock * 32;
  if (blocks == 2) {
    RequantizeKernel<true, kSrc, 2, kOneTensor><<<grid, kThreads, 0, stream>>>(p);
  } else if (blocks == 4) {
    RequantizeKernel<true, kSrc, 4, kOneTensor><<<grid, kThreads, 0, stream>>>(p);
  } else if (blocks == 5) {
    RequantizeKernel<true, kSrc, 5, kOneTensor><<<grid, kThreads, 0, stream>>>(p);
  } else {
    RequantizeKernel<true, kSrc, 3, kOneTensor><<<grid, kThreads, 0, stream>>>(p);
  }
}

// LaunchFast for sources kSrc, over one tensor where both layouts allow it and the source is
// E4M3 (measured on the H200, docs/benchmarks.md session 17: E4M3 -> NVFP4 2.4% faster; FP16 ->
// NVFP4 14% slower, for reasons not found).
template <SrcKind kSrc>
void LaunchFast(const RequantizeParams& p, int blocks, dim3 grid, cudaStream_t stream) {
  if constexpr (kSrc == SrcKind::kE4M3) {
    if (SidesAreOneTensor(p.src) && SidesAreOneTensor(p.dst)) {
      return LaunchFastKernel<kSrc, true>(p, blocks, grid, stream);
    }
  }
  LaunchFastKernel<kSrc, false>(p, blocks, grid, stream);
}

}  // namespace

cudaError_t LaunchRequantize(const RequantizeParams& p, cudaStream_t stream) {
  const uint64_t items = static_cast<uint64_t>(p.num_blocks) * 2 * p.src.heads;  // per layer
  if (items == 0 || p.num_layers == 0) return cudaSuccess;
  if (items > 0xFFFFFFFFull || p.num_layers > 65535) return cudaErrorInvalidValue;
  auto is16 = [](const CodecLayout& c) {
    return c.type == ElementType::kFp16 || c.type == ElementType::kBf16;
  };
  const bool e4m3 = p.src.k.type == ElementType::kFp8E4M3 && p.src.v.type == ElementType::kFp8E4M3;
  const dim3 grid(static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(p.num_layers));
  const int blocks_per_sm = RequantizeBlocksPerSm(p.variant, p.src, p.dst);
  if (!p.fast) {
    RequantizeKernel<false, SrcKind::kAny, 2><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  } else if (e4m3) {
    LaunchFast<SrcKind::kE4M3>(p, blocks_per_sm, grid, stream);
  } else if (!is16(p.src.k) || !is16(p.src.v)) {
    RequantizeKernel<true, SrcKind::kAny, 2><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  } else {
    LaunchFast<SrcKind::k16>(p, blocks_per_sm, grid, stream);
  }
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
