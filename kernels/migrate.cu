// The migration kernel: requantises full blocks from one palette format into a colder one in
// every layer, in one launch. One warp owns one (layer, block, head, K/V side) tile of
// block_tokens x head_dim values and reproduces page_codec.h's DecodeRow + EncodeBlockHead on
// it:
//   - the tile is read in groups of 16 consecutive elements of a token (two 16-byte loads for
//     a 16-bit source), lane l taking groups l, l + 32, ...; up to kCachedGroups groups per
//     lane stay in registers between the amax pass and the encode pass (all of them for
//     16 x 128 tiles), larger tiles are read again;
//   - the block's amax is a warp max (exact: max does not depend on order);
//   - FP8 and NVFP4 values are encoded with the fast forms of fast_codec.cuh. A tile whose
//     values the fast forms could treat differently from the codec (an Inf, which the fast amax
//     does not skip; for NVFP4 also a NaN, whose E2M1 sign the fast form does not clear) is
//     redone with the exact codec functions throughout (a warp-uniform branch taken before
//     anything is written).
// Codecs that encode token by token (FP16, BF16, FP8 per tensor or per (token, head), NVFP4
// per tensor) take a lane per token and the codec functions directly.
#include <cfloat>
#include <cstdint>

#include "kernels/data_plane.cuh"
#include "kernels/tile_io.cuh"

namespace kvtier::gpu {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kCachedGroups = 4;
// 3 blocks of 8 warps per SM (at most 85 registers) for 16-bit sources, whose cached groups
// are raw: enough loads in flight to keep HBM busy. Other sources cache floats: 2 blocks.
constexpr int kMinBlocksPerSm = 3;

// One warp's work: a (layer, block, head, side) tile.
struct Tile {
  const uint8_t* src;  // source page
  uint8_t* dst;        // destination page
  CodecLayout sc;  // source and destination codecs of this side
  CodecLayout dc;
  int head;
  float src_scale;  // per-tensor scales of this side
  float dst_scale;
};

// g -> (token, first element) for groups of 16 along head_dim, without a division per group.
struct GroupIndex {
  uint32_t per_token;  // head_dim / 16
  uint64_t magic;      // ceil(2^32 / per_token): exact for g * per_token < 2^32 / 64

  __device__ explicit GroupIndex(int head_dim)
      : per_token(static_cast<uint32_t>(head_dim) / kMicroBlock),
        magic(0xFFFFFFFFull / per_token + 1) {}
  __device__ int Token(int g) const { return static_cast<int>((g * magic) >> 32); }
  __device__ int Dim(int g, int token) const {
    return (g - token * static_cast<int>(per_token)) * kMicroBlock;
  }
};

enum class DstKind { kRowWise, kFp8Block, kNvfp4Block, kNvfp4Channel };

__device__ DstKind KindOf(const CodecLayout& c) {
  if (c.scope != ScaleScope::kBlockHead) return DstKind::kRowWise;
  if (c.type != ElementType::kNvfp4) return DstKind::kFp8Block;
  return c.axis == MicroAxis::kHeadDim ? DstKind::kNvfp4Block : DstKind::kNvfp4Channel;
}

// A group of 16 source elements kept in registers between the amax pass and the encode
// pass: the raw 32 bytes for 16-bit sources (half the registers of floats, so more warps fit),
// decoded floats otherwise.
template <bool kFast, bool kSrc16>
struct CachedGroup {
  float v[16];
  __device__ __forceinline__ void Load(const PageLayout& l, const Tile& t, int token, int d0) {
    LoadGroup<kFast>(l, t.sc, t.src, t.head, token, d0, t.src_scale, v);
  }
  __device__ __forceinline__ void Get(const Tile&, float x[16]) const {
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = v[i];
  }
};

template <bool kFast>
struct CachedGroup<kFast, true> {
  uint4 a, b;
  __device__ __forceinline__ void Load(const PageLayout& l, const Tile& t, int token, int d0) {
    const uint8_t* row = t.src + l.PayloadOffset(t.sc, t.head, token) + d0 * 2;
    a = *reinterpret_cast<const uint4*>(row);
    b = *reinterpret_cast<const uint4*>(row + 16);
  }
  __device__ __forceinline__ void Get(const Tile& t, float x[16]) const {
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = Decode16<kFast>(t.sc.type, w[i] & 0xFFFFu);
      x[2 * i + 1] = Decode16<kFast>(t.sc.type, w[i] >> 16);
    }
  }
};

// ---- FP8 per (block, head) ----

template <bool kFast>
__device__ __forceinline__ void StoreFp8Group(const PageLayout& dl, const Tile& t, int token,
                                              int d0, const float x[16], float inv) {
  uint32_t w[4];
  if (kFast && t.dc.type == ElementType::kFp8E4M3) {
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
        w[j] |= static_cast<uint32_t>(EncodeFp8(t.dc.type, x[4 * j + i] * inv)) << (8 * i);
      }
    }
  }
  *reinterpret_cast<uint4*>(t.dst + dl.PayloadOffset(t.dc, t.head, token) + d0) =
      make_uint4(w[0], w[1], w[2], w[3]);
}

// Returns false, having written nothing, when kFast and the tile holds +-Inf (the fast amax
// does not skip it; NaN is skipped by fmaxf and encoded as 0x7F by either form).
template <bool kFast, bool kSrc16>
__device__ __forceinline__ bool Fp8BlockTile(const PageLayout& sl, const PageLayout& dl,
                                             const Tile& t, int lane) {
  constexpr int kCache = kFast ? kCachedGroups : 0;
  const GroupIndex gi(sl.head_dim);
  const int groups = sl.tokens * static_cast<int>(gi.per_token);
  CachedGroup<kFast, kSrc16> cache[kCache > 0 ? kCache : 1];
  float amax = 0.f;
  float x[16];
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int g = lane + 32 * k;
    if (g < groups) {
      const int token = gi.Token(g);
      cache[k].Load(sl, t, token, gi.Dim(g, token));
    }
  }
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    if (lane + 32 * k < groups) {
      cache[k].Get(t, x);
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = AmaxStep<kFast>(amax, x[i]);
    }
  }
  for (int g = lane + 32 * kCache; g < groups; g += 32) {
    const int token = gi.Token(g);
    LoadGroup<kFast, kSrc16>(sl, t.sc, t.src, t.head, token, gi.Dim(g, token), t.src_scale, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = AmaxStep<kFast>(amax, x[i]);
  }
  amax = WarpMax(amax);
  if (kFast && !(amax <= FLT_MAX)) return false;
  const float scale = Fp8ScaleFor(t.dc.type, amax);
  if (lane == 0) *reinterpret_cast<float*>(t.dst + dl.ScaleOffset(t.dc, t.head, 0)) = scale;
  const float inv = Reciprocal(scale);
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int g = lane + 32 * k;
    if (g < groups) {
      const int token = gi.Token(g);
      cache[k].Get(t, x);
      StoreFp8Group<kFast>(dl, t, token, gi.Dim(g, token), x, inv);
    }
  }
  for (int g = lane + 32 * kCache; g < groups; g += 32) {
    const int token = gi.Token(g);
    const int d0 = gi.Dim(g, token);
    LoadGroup<kFast, kSrc16>(sl, t.sc, t.src, t.head, token, d0, t.src_scale, x);
    StoreFp8Group<kFast>(dl, t, token, d0, x, inv);
  }
  return true;
}

// ---- NVFP4, micro-blocks along head_dim, second level per (block, head) ----

// codec::Nvfp4MicroScale, and the multiplier codec::Nvfp4EncodeValue applies to every value
// of the micro-block (0 when the values encode as zeros), computed once.
template <bool kFast>
__device__ __forceinline__ uint8_t MicroScale(float s_enc, float micro_amax, float* m) {
  uint8_t sf;
  float decoded;
  if (kFast) {
    const float t = (s_enc * micro_amax) / codec::kE2M1Max;
    sf = t > 0.f ? static_cast<uint8_t>(FastE4M3x4(t, 0.f, 0.f, 0.f)) : 0;
    decoded = FastE4M3ToFloat(sf);  // never NaN: t is positive and finite or +Inf
  } else {
    sf = codec::Nvfp4MicroScale(s_enc, micro_amax);
    decoded = codec::E4M3ToFloat(sf);
  }
  const float q = s_enc / decoded;
  *m = q > 0.f && q <= FLT_MAX ? q : 0.f;
  return sf;
}

// The E2M1 codes of 8 values x[i] * m, packed (x[0] in the low nibble); all zero when m == 0,
// as codec::Nvfp4EncodeValue. Computed without a branch, then masked.
template <bool kFast>
__device__ __forceinline__ uint32_t PackE2M1x8(const float* x, float m) {
  uint32_t w = 0;
  if (kFast) {
    w = FastPackE2M1x8(x, m);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) w |= codec::FloatToE2M1(x[i] * m) << (4 * i);
  }
  return m > 0.f ? w : 0u;
}

// Encodes one 16-element micro-block along head_dim whose amax is `micro_amax`.
template <bool kFast>
__device__ __forceinline__ void StoreNvfp4Group(const PageLayout& dl, const Tile& t, int token,
                                                int d0, const float x[16], float micro_amax,
                                                float s_enc) {
  float m;
  t.dst[dl.MicroOffset(t.dc, t.head, token, d0)] = MicroScale<kFast>(s_enc, micro_amax, &m);
  *reinterpret_cast<uint2*>(t.dst + dl.PayloadOffset(t.dc, t.head, token) + d0 / 2) =
      make_uint2(PackE2M1x8<kFast>(x, m), PackE2M1x8<kFast>(x + 8, m));
}

// The amax step of NVFP4 tiles: the fast form turns the amax NaN when a value is NaN and
// +Inf when one is infinite, so that one check after the pass sends such tiles to the exact
// path (where a NaN's E2M1 sign and an Inf's exclusion from the amax follow the codec).
template <bool kFast>
__device__ __forceinline__ float Nvfp4AmaxStep(float amax, float x) {
  return kFast ? MaxAbsNan(amax, x) : fmaxf(amax, FiniteAbs(x));
}

// Returns false, having written nothing, when kFast and the tile holds a NaN or an Inf.
template <bool kFast, bool kSrc16>
__device__ __forceinline__ bool Nvfp4BlockTile(const PageLayout& sl, const PageLayout& dl,
                                               const Tile& t, int lane) {
  constexpr int kCache = kFast ? kCachedGroups : 0;
  const GroupIndex gi(sl.head_dim);
  const int groups = sl.tokens * static_cast<int>(gi.per_token);
  CachedGroup<kFast, kSrc16> cache[kCache > 0 ? kCache : 1];
  float micro[kCache > 0 ? kCache : 1];
  float amax = 0.f;
  float x[16];
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int g = lane + 32 * k;
    if (g < groups) {
      const int token = gi.Token(g);
      cache[k].Load(sl, t, token, gi.Dim(g, token));
    }
  }
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    micro[k] = 0.f;
    if (lane + 32 * k < groups) {
      cache[k].Get(t, x);
#pragma unroll
      for (int i = 0; i < 16; ++i) micro[k] = Nvfp4AmaxStep<kFast>(micro[k], x[i]);
      amax = Nvfp4AmaxStep<kFast>(amax, micro[k]);
    }
  }
  for (int g = lane + 32 * kCache; g < groups; g += 32) {
    const int token = gi.Token(g);
    LoadGroup<kFast, kSrc16>(sl, t.sc, t.src, t.head, token, gi.Dim(g, token), t.src_scale, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = Nvfp4AmaxStep<kFast>(amax, x[i]);
  }
  if (kFast && __any_sync(kFullMask, !(amax <= FLT_MAX))) return false;
  amax = WarpMax(amax);
  if (lane == 0) {
    *reinterpret_cast<float*>(t.dst + dl.ScaleOffset(t.dc, t.head, 0)) =
        codec::Nvfp4DecodeScale(amax);
  }
  const float s_enc = codec::Nvfp4EncodeScale(amax);
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    const int g = lane + 32 * k;
    if (g < groups) {
      const int token = gi.Token(g);
      cache[k].Get(t, x);
      StoreNvfp4Group<kFast>(dl, t, token, gi.Dim(g, token), x, micro[k], s_enc);
    }
  }
  for (int g = lane + 32 * kCache; g < groups; g += 32) {
    const int token = gi.Token(g);
    const int d0 = gi.Dim(g, token);
    LoadGroup<kFast, kSrc16>(sl, t.sc, t.src, t.head, token, d0, t.src_scale, x);
    float micro_amax = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) micro_amax = Nvfp4AmaxStep<kFast>(micro_amax, x[i]);
    StoreNvfp4Group<kFast>(dl, t, token, d0, x, micro_amax, s_enc);
  }
  return true;
}

// ---- NVFP4, micro-blocks of 16 tokens per channel, second level per (block, head) ----

// Returns false, having written nothing, when kFast and the tile holds a NaN or an Inf.
// A lane owns a channel pair (d, d + 1) of a 16-token segment: one output byte per token.
template <bool kFast, bool kSrc16>
__device__ __forceinline__ bool Nvfp4ChannelTile(const PageLayout& sl, const PageLayout& dl,
                                                 const Tile& t, int lane) {
  const GroupIndex gi(sl.head_dim);
  const int groups = sl.tokens * static_cast<int>(gi.per_token);
  float amax = 0.f;
  for (int g = lane; g < groups; g += 32) {
    float x[16];
    const int token = gi.Token(g);
    LoadGroup<kFast, kSrc16>(sl, t.sc, t.src, t.head, token, gi.Dim(g, token), t.src_scale, x);
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = Nvfp4AmaxStep<kFast>(amax, x[i]);
  }
  if (kFast && __any_sync(kFullMask, !(amax <= FLT_MAX))) return false;
  amax = WarpMax(amax);
  if (lane == 0) {
    *reinterpret_cast<float*>(t.dst + dl.ScaleOffset(t.dc, t.head, 0)) =
        codec::Nvfp4DecodeScale(amax);
  }
  const float s_enc = codec::Nvfp4EncodeScale(amax);
  const int pairs = sl.head_dim / 2;
  const int units = (sl.tokens / kMicroBlock) * pairs;
  for (int u = lane; u < units; u += 32) {
    const int t0 = (u / pairs) * kMicroBlock;
    const int d = (u % pairs) * 2;
    float x0[kMicroBlock], x1[kMicroBlock];
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int i = 0; i < kMicroBlock; ++i) {
      x0[i] = LoadElement<kFast, kSrc16>(sl, t.sc, t.src, t.head, t0 + i, d, t.src_scale);
      x1[i] = LoadElement<kFast, kSrc16>(sl, t.sc, t.src, t.head, t0 + i, d + 1, t.src_scale);
      a0 = Nvfp4AmaxStep<kFast>(a0, x0[i]);
      a1 = Nvfp4AmaxStep<kFast>(a1, x1[i]);
    }
    float m0, m1;
    t.dst[dl.MicroOffset(t.dc, t.head, t0, d)] = MicroScale<kFast>(s_enc, a0, &m0);
    t.dst[dl.MicroOffset(t.dc, t.head, t0, d + 1)] = MicroScale<kFast>(s_enc, a1, &m1);
    const uint32_t mask0 = m0 > 0.f ? 0xFu : 0u;
    const uint32_t mask1 = m1 > 0.f ? 0xF0u : 0u;
#pragma unroll
    for (int i = 0; i < kMicroBlock; ++i) {
      const uint32_t q0 = kFast ? FastE2M1(x0[i] * m0) : codec::FloatToE2M1(x0[i] * m0);
      const uint32_t q1 = kFast ? FastE2M1(x1[i] * m1) : codec::FloatToE2M1(x1[i] * m1);
      t.dst[dl.PayloadOffset(t.dc, t.head, t0 + i) + d / 2] =
          static_cast<uint8_t>((q0 & mask0) | ((q1 << 4) & mask1));
    }
  }
  return true;
}

// ---- Token-wise destination codecs: a lane per token, exact codec functions ----

__device__ __forceinline__ void RowWiseTile(const PageLayout& sl, const PageLayout& dl,
                                            const Tile& t, int lane) {
  for (int token = lane; token < sl.tokens; token += 32) {
    EncodeRowChunked(dl, t.dc, t.dst, t.head, token, t.dst_scale, [&](int d0, float* x) {
      LoadGroup<false>(sl, t.sc, t.src, t.head, token, d0, t.src_scale, x);
    });
  }
}

// The exact codec path, out of line so that its registers do not weigh on the fast path.
__device__ __noinline__ void ExactTile(const PageLayout& sl, const PageLayout& dl, Tile t,
                                       int lane) {
  switch (KindOf(t.dc)) {
    case DstKind::kRowWise:
      RowWiseTile(sl, dl, t, lane);
      return;
    case DstKind::kFp8Block:
      Fp8BlockTile<false, false>(sl, dl, t, lane);
      return;
    case DstKind::kNvfp4Block:
      Nvfp4BlockTile<false, false>(sl, dl, t, lane);
      return;
    case DstKind::kNvfp4Channel:
      Nvfp4ChannelTile<false, false>(sl, dl, t, lane);
      return;
  }
}

// kSrc16: both sides of the source format are FP16 or BF16 (the common demotion from the hot
// format), which compiles the other source codecs out of the hot loop.
template <bool kFast, bool kSrc16>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kSrc16 ? kMinBlocksPerSm : 2)
    RequantizeKernel(const __grid_constant__ RequantizeParams p) {
  const uint64_t item =
      static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int heads = p.src.heads;
  const uint64_t items = static_cast<uint64_t>(p.num_layers) * p.num_blocks * 2 * heads;
  if (item >= items) return;  // warp-uniform
  const int lane = threadIdx.x % 32;
  // item = ((layer * num_blocks + block) * 2 + side) * heads + head: neighbouring warps
  // touch neighbouring bytes of a page.
  const int head = static_cast<int>(item % heads);
  const int side = static_cast<int>((item / heads) % 2);
  const uint64_t lb = item / heads / 2;
  const int block = static_cast<int>(lb % p.num_blocks);
  const int layer = static_cast<int>(lb / p.num_blocks);
  const LayerPools& pools = p.layers[layer];
  Tile t;
  t.src = pools.src + static_cast<size_t>(p.src_pages[block]) * p.src.page_bytes;
  t.dst = pools.dst + static_cast<size_t>(p.dst_pages[block]) * p.dst.page_bytes;
  t.sc = side == 0 ? p.src.k : p.src.v;
  t.dc = side == 0 ? p.dst.k : p.dst.v;
  t.head = head;
  t.src_scale = side == 0 ? pools.src_k_scale : pools.src_v_scale;
  t.dst_scale = side == 0 ? pools.dst_k_scale : pools.dst_v_scale;
  if (kFast) {
    switch (KindOf(t.dc)) {
      case DstKind::kFp8Block:
        if (Fp8BlockTile<true, kSrc16>(p.src, p.dst, t, lane)) return;
        break;
      case DstKind::kNvfp4Block:
        if (Nvfp4BlockTile<true, kSrc16>(p.src, p.dst, t, lane)) return;
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

}  // namespace

cudaError_t LaunchRequantize(const RequantizeParams& p, cudaStream_t stream) {
  const uint64_t items =
      static_cast<uint64_t>(p.num_layers) * p.num_blocks * 2 * p.src.heads;
  if (items == 0) return cudaSuccess;
  const uint64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7FFFFFFFull) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  auto is16 = [](const CodecLayout& c) {
    return c.type == ElementType::kFp16 || c.type == ElementType::kBf16;
  };
  if (!p.fast) {
    RequantizeKernel<false, false><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  } else if (is16(p.src.k) && is16(p.src.v)) {
    RequantizeKernel<true, true><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  } else {
    RequantizeKernel<true, false><<<grid, kWarpsPerBlock * 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
