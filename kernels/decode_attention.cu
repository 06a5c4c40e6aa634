// kvtier's fused mixed-format paged decode attention (contract in decode_attention.cuh).
//
// Work split: a block of 4 warps attends one (sequence, KV head, split); its warps take the
// split's pages in turn, each keeping its own online-softmax state for the GQA group, and the
// block merges the four states at the end. Each warp streams its pages into shared memory
// through its own cp.async ring (kStages deep; page-table entries are read 32 at a time, a batch
// ahead) and handles one 16-token page per step with m16n8k16 tensor-core products (FP16 in,
// FP32 accumulate). The query heads are the mma's N dimension, so that a GQA group of 8 fills it
// (smaller groups leave columns, never rows, unused) and a page costs 16 mma:
//   S^T = K Q^T:  A = K [16 tokens x 16 dims], B = Q^T [16 dims x 8 heads]  (8 k-steps)
//   O^T += V^T P^T:  A = V^T [16 dims x 16 tokens], B = P^T [16 tokens x 8 heads]  (8 tiles)
// P^T comes from S^T's accumulators by one movmatrix transpose per 8 tokens. Lane
// (g = lane / 4, c = lane % 4) holds K rows g and g + 8 (dims 32c..32c+31) and V rows 2c, 2c+1,
// 2c+8, 2c+9 (dims 16g..16g+15). Because a dot product is indifferent to the order of its terms,
// K's dims may sit in the registers in any order that Q's fragments share; the order used is the
// one NVFP4 decodes into cheaply (pairs of dims d and d + 4), and FP16 and FP8 rows are permuted
// into it with byte permutes. Every format decodes exactly to FP16: FP8 codes by the hardware
// conversion, NVFP4 by placing the E2M1 bits in an FP16 (the value times 2^-14) and multiplying
// by the E4M3 micro-scale times 2^7 (exact; the kernel's scale undoes the 2^-7). FP32 scales
// apply to the logits (K) and to the probabilities (V, relative to a running V scale that is the
// unit of the output accumulator).
//
// Per page, the format's side kinds select compile-time layouts (DispatchSide); the running
// maximum is allowed to lag by up to 8 in log2 units (a factor of 2^8) so that most pages skip
// rescaling the accumulators (the decision is per warp, and the maxima are reduced across lanes
// only when it is taken).
// In a palette with smaller formats, all-FP16 pages (the recent tokens) are read straight from
// global memory, so that the shared memory per block, and the occupancy, follow the smaller
// formats.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/decode_attention.cuh"
#include "kvtier/page_tables.h"

namespace kvtier::gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  return __byte_perm(a, b, sel);
}

__device__ __forceinline__ uint32_t HalfBits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 AsHalf2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

__device__ __forceinline__ uint32_t Hmul2(uint32_t a, uint32_t b) {
  return HalfBits(__hmul2(AsHalf2(a), AsHalf2(b)));
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  return HalfBits(__floats2half2_rn(lo, hi));
}

// Two E4M3 codes (lo byte first) as an FP16 pair: exact.
__device__ __forceinline__ uint32_t E4M3x2ToHalf2(uint32_t codes16) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes16), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The four FP8 codes of w as two FP16 pairs (bytes 0-1 in lo, 2-3 in hi): exact, and each
// conversion reads its half of w in place.
template <bool kE5M2>
__device__ __forceinline__ void Fp8x4ToHalf2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (kE5M2) {
    asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e5m2x2 %0, a;\n"
        " cvt.rn.f16x2.e5m2x2 %1, b;\n}" : "=r"(lo), "=r"(hi) : "r"(w));
  } else {
    asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
        " cvt.rn.f16x2.e4m3x2 %1, b;\n}" : "=r"(lo), "=r"(hi) : "r"(w));
  }
}

// The eight E2M1 codes of w as four FP16 pairs scaled by 2^-14: pair p holds nibbles p and
// p + 4. Each code's sign goes to bit 15 and its three magnitude bits to bits 11..9 (exponent
// LSBs and mantissa MSB), which is exactly the E2M1 value times 2^-14, subnormal codes included.
// So that one shift and one mask place most pairs, the codes are first regrouped: in `even`,
// byte q holds nibble 2q's magnitude at bits 0-2 and its sign at bit 6; in `odd`, nibble 2q+1's
// magnitude at bits 4-6 and its sign at bit 10 (the other bits are masked off later).
__device__ __forceinline__ void E2M1x8Scaled(uint32_t w, uint32_t h[4]) {
  constexpr uint32_t kPair = 0x8E008E00u;  // sign and magnitude bits of both halves
  const uint32_t w3 = w << 3;
  const uint32_t even = (w & 0x07070707u) | (w3 & ~0x07070707u);
  const uint32_t odd = (w & 0x70707070u) | (w3 & ~0x70707070u);
  h[0] = (even << 9) & kPair;
  h[1] = (odd << 5) & kPair;
  h[2] = (even << 1) & kPair;
  h[3] = ((w >> 3) & 0x0E000E00u) | (w & 0x80008000u);  // nibble 7's sign is already in place
}

// 2^7 twice, as an FP16 pair: E4M3 micro-scales times 2^7 are exact in FP16, and so are their
// products with E2M1x8Scaled's values (the E2M1 x E4M3 product times 2^-7).
constexpr uint32_t kHalf2Pow7 = 0x58005800u;

__device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 Load16(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// The codecs one side (K or V) of a page can be in, as the kernel decodes them: each has a
// compile-time staged layout, [16 token rows][128 micro-scale bytes, NVFP4 only].
enum SideKind : uint32_t { kFp16Side, kE4M3Side, kE5M2Side, kNvfp4DimSide, kNvfp4TokenSide };
// FormatPlan::kinds bit of an all-FP16 format whose pages are read straight from global memory
// instead of staged (in a mixed palette, so that the staged pages of the smaller formats set the
// shared memory per block, and with it the occupancy).
constexpr uint32_t kDirectFp16 = 1u << 8;

// Bytes of one token row of a side of `kind` (NVFP4 micro-scales, 128 bytes, follow the rows).
__host__ __device__ constexpr uint32_t RowBytes(uint32_t kind) {
  return kind == kFp16Side ? 256 : kind <= kE5M2Side ? 128 : 64;
}

// 32 FP8 codes (dims 32c..32c+31 of a row, in two uint4) as 16 FP16 pairs in the canonical K
// order: pair r = 4m + q holds dims 8m + q and 8m + q + 4.
template <bool kE5M2>
__device__ __forceinline__ void Fp8RowToCanonical(uint4 a, uint4 b, uint32_t h[16]) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t lo = Prmt(w[2 * m], w[2 * m + 1], 0x5140);  // dims q and q + 4, q = 0, 1
    const uint32_t hi = Prmt(w[2 * m], w[2 * m + 1], 0x7362);  // q = 2, 3
    Fp8x4ToHalf2x2<kE5M2>(lo, h[4 * m + 0], h[4 * m + 1]);
    Fp8x4ToHalf2x2<kE5M2>(hi, h[4 * m + 2], h[4 * m + 3]);
  }
}

// Two E4M3 micro-scales (lo byte first) as an FP16 pair times 2^7: exact (at most 57344).
__device__ __forceinline__ uint32_t MicroPair(uint32_t codes16) {
  return Hmul2(E4M3x2ToHalf2(codes16), kHalf2Pow7);
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

template <uint32_t kKind>
using Side = std::integral_constant<uint32_t, kKind>;

// Calls f(Side<kind>()) for the side kind `kind` (warp-uniform), so that f is compiled once
// per kind with its layout known.
template <typename F>
__device__ __forceinline__ void DispatchSide(uint32_t kind, F&& f) {
  switch (kind) {
    case kFp16Side: f(Side<kFp16Side>()); break;
    case kE4M3Side: f(Side<kE4M3Side>()); break;
    case kE5M2Side: f(Side<kE5M2Side>()); break;
    case kNvfp4DimSide: f(Side<kNvfp4DimSide>()); break;
    default: f(Side<kNvfp4TokenSide>()); break;
  }
}

// 2^x by the hardware approximation (2 ulp; 0 for -inf).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max (kMax) or sum of x over the lanes with equal lane % 4, in each of them.
template <bool kMax>
__device__ __forceinline__ float ReduceOverG(float x) {
#pragma unroll
  for (int d = 4; d < 32; d *= 2) {
    const float y = __shfl_xor_sync(0xFFFFFFFFu, x, d);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  return x;
}

// The 8x8 FP16 matrix held as one pair per lane (row lane / 4, columns 2 (lane % 4) + {0, 1}),
// transposed in the same layout.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// ---- Staging pages in shared memory ----
// Each warp streams its pages through a ring of kStages buffers with cp.async, so that the
// loads of the next pages are in flight while it computes on this one.
constexpr int kStages = 3;

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts copying 16 bytes from global src to the shared-memory address dst.
__device__ __forceinline__ void Copy16(uint32_t dst, const uint8_t* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// Starts copying one side of a page's head into a staged page at shared address dst: the warp
// copies kRows bytes of token rows from `rows`, then, for NVFP4 (kMicro), the 128 bytes of
// micro-scales from `micro`. Lane l takes 16-byte chunks l, l + 32, ...
template <uint32_t kRows, bool kMicro>
__device__ __forceinline__ void StageSide(uint32_t dst, const uint8_t* rows, const uint8_t* micro,
                                          int lane) {
  const uint32_t to = dst + 16 * lane;
  const uint8_t* from = rows + 16 * lane;
#pragma unroll
  for (uint32_t i = 0; i < kRows / 512; ++i) Copy16(to + 512 * i, from + 512 * i);
  if (kMicro && lane < 8) Copy16(to + kRows, micro + 16 * lane);
}

// Stages one side (K: 0, V: 1) of `head` of `page` at shared address dst, by the side's kind.
__device__ __forceinline__ void StageSideOf(const PagedDecodeParams::FormatPlan& plan, int side,
                                            uint32_t dst, const uint8_t* page, int head, int lane) {
  const uint32_t kind = (plan.kinds >> (3 * side)) & 7;
  const uint8_t* rows = page + plan.src[side];
  const uint8_t* micro = page + plan.src[2 + side] + head * 128;
  if (kind == kFp16Side) {
    StageSide<4096, false>(dst, rows + head * 4096, micro, lane);
  } else if (kind <= kE5M2Side) {
    StageSide<2048, false>(dst, rows + head * 2048, micro, lane);
  } else {
    StageSide<1024, true>(dst, rows + head * 1024, micro, lane);
  }
}

// Starts copying the data of `head` in the page `entry` names into the staged page at shared
// address dst as the format's plan says, then the 16 K and 16 V scales (lanes 0-15 and 16-31;
// a per-block scale lands in slot 0, a per-tensor one is written there).
__device__ __forceinline__ void StagePage(const PagedDecodeParams& p, uint32_t entry, int head,
                                          uint32_t dst, int lane) {
  const uint32_t format = entry >> kPackedFormatShift;
  const PagedDecodeParams::FormatPlan& plan = p.plans[format];
  const uint8_t* page = p.pools[format].base + static_cast<uint64_t>(entry & kPackedPageMask) *
                                                   p.pools[format].layout.page_bytes;
  if (!(plan.kinds & kDirectFp16)) {
    StageSideOf(plan, 0, dst, page, head, lane);
    StageSideOf(plan, 1, dst + plan.v_at, page, head, lane);
  }
  const int side = lane / 16, slot = lane % 16;
  const uint32_t count = plan.scale_count[side];
  const uint32_t scale = dst + p.scales_at + 4 * lane;
  if (static_cast<uint32_t>(slot) < count) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(scale),
                 "l"(page + plan.scale_src[side] + 4 * (head * count + slot)));
  } else if (count == 0 && slot == 0) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scale), "f"(plan.fill[side]));
  }
}

// Zeroes the V rows (and per-token micro-scales) of tokens valid..15 of a staged page, so that
// whatever the cache holds past a sequence's end cannot reach the output. Rare: the last page.
__device__ __noinline__ void ClearValuesPast(uint8_t* v_side, uint32_t kind, int valid, int lane) {
  const uint32_t row = RowBytes(kind);
  for (uint32_t at = valid * row + 4 * lane; at < 16 * row; at += 128) {
    *reinterpret_cast<uint32_t*>(v_side + at) = 0;
  }
  // Micro-scales along head_dim: 8 per token, so lane l clears those of token l / 2.
  if (kind == kNvfp4DimSide && lane >= 2 * valid) {
    *reinterpret_cast<uint32_t*>(v_side + 16 * row + 4 * lane) = 0;
  }
}

// kTiles: query-head tiles of 8 (1 when the GQA group fits in 8 heads, else 2).
template <int kTiles>
__global__ void __launch_bounds__(kThreads, kTiles == 1 ? 4 : 2)
    PagedDecodeKernel(const __grid_constant__ PagedDecodeParams p) {
  constexpr int kD = kDecodeHeadDim;
  constexpr int kRows = 8 * kTiles;
  // The running maximum may lag the true one by up to kLazy (logits are in log2 units), so
  // that most pages skip rescaling the accumulators; probabilities stay below 2^kLazy in FP16.
  constexpr float kLazy = 8.f;
  // A page whose V scales all fall below the accumulator unit times this factor forces a
  // rescale (FP16 probabilities keep their precision above it). Every rescale, whatever
  // triggered it, makes the page's largest V scale the new unit.
  constexpr float kUnitFloor = 1.f / 1024.f;
  extern __shared__ __align__(16) uint8_t smem[];

  const int split = blockIdx.x, kv_head = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int seq_len = p.seq_lens[b];
  const int first_entry = p.packed_indptr[b];
  const int pages = (seq_len + kDecodeBlockTokens - 1) / kDecodeBlockTokens;
  const int page_begin = split * p.pages_per_split;
  const int page_end = min(pages, page_begin + p.pages_per_split);

  // Q^T fragments (the B operand of S^T = K Q^T) in the canonical K order: k-step j pairs with
  // K pairs 2j and 2j + 1, which hold dims 32c + 8m + q (+4), m = j / 2, q = 2 (j % 2) (+1).
  uint32_t qb[kTiles][8][2];
  {
    const float* q0 = p.q + (static_cast<int64_t>(b) * p.num_q_heads + kv_head * group) * kD;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const int row = g + 8 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int d = 32 * c + 8 * (j / 2) + 2 * (j % 2);
        const float* qr = q0 + row * kD;
        qb[t][j][0] = row < group ? PackHalf2(qr[d], qr[d + 4]) : 0u;
        qb[t][j][1] = row < group ? PackHalf2(qr[d + 1], qr[d + 5]) : 0u;
      }
    }
  }

  const float logit_scale = p.softmax_scale * kLog2e;  // logits in log2 units
  // Lane (g, c) keeps heads 8t + 2c and 8t + 2c + 1 (index 2t + h) and, of the output, dims
  // 16g + 2i and 16g + 2i + 1 of tile i: o[t][i] = {(2i, head 2c), (2i, 2c+1), (2i+1, 2c),
  // (2i+1, 2c+1)}.
  float m_run[2 * kTiles], l_run[2 * kTiles];  // l: this lane's tokens only
#pragma unroll
  for (int h = 0; h < 2 * kTiles; ++h) m_run[h] = -INFINITY, l_run[h] = 0.f;
  float unit = 1.f, inv_unit = 1.f;  // the output accumulator is in units of this V scale
  float o[kTiles][8][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[t][i][0] = o[t][i][1] = o[t][i][2] = o[t][i][3] = 0.f;
  }

  // This warp's pages: first, first + kWarps, ... below page_end, through its staging ring.
  // Their table entries are read 32 at a time (lane l holds entry 32 n + l), a batch ahead.
  uint8_t* ring = smem + warp * kStages * p.stage_bytes;
  const uint32_t ring_shared = SharedAddress(ring);
  uint32_t* ring_entry =
      reinterpret_cast<uint32_t*>(smem + kWarps * kStages * p.stage_bytes) + warp * kStages;
  const int first = page_begin + warp;
  const int count = first < page_end ? (page_end - first + kWarps - 1) / kWarps : 0;
  const uint32_t* entries = p.packed + first_entry + first;
  const auto load_batch = [&](int n) {
    const int i = 32 * n + lane;
    return i < count ? entries[i * kWarps] : 0u;
  };
  uint32_t batch = load_batch(0), next_batch = load_batch(1);
  const auto stage = [&](int i, int slot) {
    if (i < count) {
      if (i % 32 == 0 && i > 0) batch = next_batch, next_batch = load_batch(i / 32 + 1);
      const uint32_t entry = __shfl_sync(0xFFFFFFFFu, batch, i % 32);
      if (lane == 0) ring_entry[slot] = entry;
      StagePage(p, entry, kv_head, ring_shared + slot * p.stage_bytes, lane);
    }
    CommitCopies();  // an empty group keeps the count of pending groups uniform
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) stage(i, i);

  for (int i = 0, slot = 0; i < count; ++i, slot = slot == kStages - 1 ? 0 : slot + 1) {
    stage(i + kStages - 1, slot == 0 ? kStages - 1 : slot - 1);
    WaitCopies<kStages - 1>();  // page i has landed (this lane's copies)
    __syncwarp();               // ... and every lane's
    const uint32_t entry = ring_entry[slot];
    const uint32_t format = entry >> kPackedFormatShift;
    const PagedDecodeParams::FormatPlan& plan = p.plans[format];
    const uint32_t kinds = plan.kinds;
    uint8_t* page = ring + slot * p.stage_bytes;
    uint8_t* v_side = page + plan.v_at;
    const int valid = min(kDecodeBlockTokens, seq_len - (first + i * kWarps) * kDecodeBlockTokens);
    const bool direct = kinds & kDirectFp16;
    // A direct page's head in global memory: K rows, then (at `direct_v`) V rows.
    const uint8_t* direct_k = nullptr;
    uint32_t direct_v = 0;
    if (direct) {
      direct_k =
          p.pools[format].base +
          static_cast<uint64_t>(entry & kPackedPageMask) * p.pools[format].layout.page_bytes +
          plan.src[0] + kv_head * 4096;
      direct_v = plan.src[1] - plan.src[0];
    } else if (valid < kDecodeBlockTokens) {
      ClearValuesPast(v_side, (kinds >> 3) & 7, valid, lane);
      __syncwarp();
    }

    // S^T = K Q^T: logits of tokens g (s[t][0..1]) and g + 8 (s[t][2..3]) for heads 8t + 2c, +1,
    // as two chains of four k-steps.
    float s[kTiles][4];
    {
      uint32_t k[2][16];
      if (direct) {
        LoadKeys<kFp16Side>(direct_k, g, c, k);
      } else {
        DispatchSide(kinds & 7, [&](auto kind) { LoadKeys<decltype(kind)::value>(page, g, c, k); });
      }
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        float odd[4] = {0.f, 0.f, 0.f, 0.f};
        s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const uint32_t a[4] = {k[0][2 * j], k[1][2 * j], k[0][2 * j + 1], k[1][2 * j + 1]};
          Mma(j % 2 ? odd : s[t], a, qb[t][j][0], qb[t][j][1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[t][e] += odd[e];
      }
    }
    const float* scales = reinterpret_cast<const float*>(page + p.scales_at);
    const int k_step = (kinds >> 6) & 1, v_step = (kinds >> 7) & 1;
    float vs[2];  // V scales of tokens g and g + 8 (0 past the end)
    bool rescale = false;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int token = g + 8 * n;
      const bool ok = token < valid;
      const float ks = scales[token * k_step] * (plan.mul[0] * logit_scale);
      vs[n] = ok ? scales[16 + token * v_step] * plan.mul[1] : 0.f;
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = s[t][2 * n + h];
          x = ok ? x * ks : -INFINITY;
          rescale |= x > m_run[2 * t + h] + kLazy;
        }
      }
    }
    // Rescale only when a logit exceeds its head's running maximum by more than kLazy, or the V
    // scales leave the accumulator unit's range (one above it, or all below its floor); the
    // decision is the whole warp's, and the maxima are reduced only then.
    const float lane_unit = fmaxf(vs[0], vs[1]);
    rescale |= lane_unit > unit && lane_unit < INFINITY;
    const bool below = !(lane_unit >= unit * kUnitFloor);
    if (__any_sync(0xFFFFFFFFu, rescale) || __all_sync(0xFFFFFFFFu, below)) {
      const float page_unit = ReduceOverG<true>(lane_unit);
      const float new_unit = page_unit > 1e-30f && page_unit < INFINITY ? page_unit : unit;
      const float unit_ratio = unit / new_unit;
      unit = new_unit;
      inv_unit = 1.f / new_unit;
#pragma unroll
      for (int h = 0; h < 2 * kTiles; ++h) {
        const float m_page = ReduceOverG<true>(fmaxf(s[h / 2][h % 2], s[h / 2][2 + h % 2]));
        const float m_new = fmaxf(m_run[h], m_page);
        const float alpha = Exp2(m_run[h] - m_new);  // 0 for the first page (m_run = -inf)
        m_run[h] = m_new;
        l_run[h] *= alpha;
        const float r = alpha * unit_ratio;
#pragma unroll
        for (int i = 0; i < 8; ++i) o[h / 2][i][h % 2] *= r, o[h / 2][i][2 + h % 2] *= r;
      }
    }
    // P^T (the B operand of O^T = V^T P^T): probabilities times V scale / unit, in FP16.
    uint32_t pb[kTiles][2];
    const float r0 = vs[0] * inv_unit, r1 = vs[1] * inv_unit;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const float e0 = Exp2(s[t][0] - m_run[2 * t]), e1 = Exp2(s[t][1] - m_run[2 * t + 1]);
      const float e2 = Exp2(s[t][2] - m_run[2 * t]), e3 = Exp2(s[t][3] - m_run[2 * t + 1]);
      l_run[2 * t] += e0 + e2;
      l_run[2 * t + 1] += e1 + e3;
      pb[t][0] = Transpose8x8(PackHalf2(e0 * r0, e1 * r0));
      pb[t][1] = Transpose8x8(PackHalf2(e2 * r1, e3 * r1));
    }
    {
      uint32_t v[2][16];
      if (direct) {
        LoadValues<kFp16Side, true>(direct_k + direct_v, g, c, v, valid);
      } else {
        DispatchSide((kinds >> 3) & 7,
                     [&](auto kind) { LoadValues<decltype(kind)::value>(v_side, g, c, v); });
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t a[4] = {v[0][2 * i], v[0][2 * i + 1], v[1][2 * i], v[1][2 * i + 1]};
#pragma unroll
        for (int t = 0; t < kTiles; ++t) Mma(o[t][i], a, pb[t][0], pb[t][1]);
      }
    }
    __syncwarp();  // the buffer is refilled by the next iteration's stage()
  }
  WaitCopies<0>();
  __syncthreads();  // the rings are reused below

  float(*s_out)[kRows][kD] = reinterpret_cast<float(*)[kRows][kD]>(smem);
  float(*s_m)[kRows] =
      reinterpret_cast<float(*)[kRows]>(smem + sizeof(float) * kWarps * kRows * kD);
  float(*s_l)[kRows] = s_m + kWarps;

  // This warp's state to shared memory.
#pragma unroll
  for (int h = 0; h < 2 * kTiles; ++h) {
    const int row = 8 * (h / 2) + 2 * c + h % 2;
    const float l_sum = ReduceOverG<false>(l_run[h]);
    if (g == 0) {
      s_m[warp][row] = m_run[h];
      s_l[warp][row] = l_sum;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s_out[warp][row][16 * g + 2 * i] = o[h / 2][i][h % 2] * unit;
      s_out[warp][row][16 * g + 2 * i + 1] = o[h / 2][i][2 + h % 2] * unit;
    }
  }
  __syncthreads();

  // Merge the warps: thread d takes dim d of every head of the group.
  static_assert(kThreads == kDecodeHeadDim, "one thread per dim in the block merge");
  const int d = threadIdx.x;
  const bool split_kv = p.num_splits > 1;
  for (int row = 0; row < group; ++row) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s_m[w][row]);
    float total = 0.f, acc = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(s_m[w][row] - m);
        total += s_l[w][row] * f;
        acc += s_out[w][row][d] * f;
      }
    }
    const bool empty = !(total > 0.f);
    const float out = empty ? 0.f : acc / total;
    const float lse = empty ? -INFINITY : (m + log2f(total)) * kLn2;
    const int64_t out_row = static_cast<int64_t>(b) * p.num_q_heads + kv_head * group + row;
    if (split_kv) {
      const int64_t rows = static_cast<int64_t>(p.batch) * p.num_q_heads;
      p.workspace[(split * rows + out_row) * kD + d] = out;
      if (d == 0) {
        p.workspace[static_cast<int64_t>(p.num_splits) * rows * kD + split * rows + out_row] = lse;
      }
    } else {
      p.out[out_row * kD + d] = out;
      if (d == 0) p.lse[out_row] = lse;
    }
  }
}

constexpr int kMergeThreads = 128;
constexpr int kMergeChunk = 256;  // parts whose weights are in shared memory at a time

// Max (kMax) or sum of x over the block's kMergeThreads threads, in every thread.
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float x, float* scratch) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    const float y = __shfl_xor_sync(0xFFFFFFFFu, x, d);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  __syncthreads();  // scratch may still be read from a previous reduction
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int w = 1; w < kMergeThreads / 32; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

// One block per row: the parts' weights exp(s_k - max) go to shared memory a chunk at a time,
// and thread d accumulates dims d, d + kMergeThreads, ... over the parts (coalesced reads).
__global__ void __launch_bounds__(kMergeThreads) MergeStatesKernel(const MergeStatesParams p) {
  __shared__ float weight[kMergeChunk];
  __shared__ float scratch[kMergeThreads / 32];
  const int64_t row = blockIdx.x;
  float m = -INFINITY;
  bool nan = false;
  for (int k = threadIdx.x; k < p.parts; k += kMergeThreads) {
    const float s = p.s[k * p.s_part_stride + row];
    nan |= isnan(s);
    m = fmaxf(m, s);
  }
  m = BlockReduce<true>(m, scratch);
  nan = __syncthreads_or(nan);
  const bool live = m != -INFINITY && !nan;
  float total = 0.f;
  for (int k = threadIdx.x; k < p.parts; k += kMergeThreads) {
    total += live ? expf(p.s[k * p.s_part_stride + row] - m) : 0.f;
  }
  total = BlockReduce<false>(total, scratch);
  for (int d0 = 0; d0 < p.head_dim; d0 += kMergeThreads) {
    const int d = d0 + threadIdx.x;
    float acc = 0.f;
    for (int base = 0; base < p.parts; base += kMergeChunk) {
      const int n = min(kMergeChunk, p.parts - base);
      __syncthreads();  // the previous chunk's weights have been used
      for (int k = threadIdx.x; k < n; k += kMergeThreads) {
        weight[k] = live ? expf(p.s[(base + k) * p.s_part_stride + row] - m) : 0.f;
      }
      __syncthreads();
      if (d < p.head_dim) {
        const float* v = p.v + base * p.v_part_stride + row * p.head_dim + d;
#pragma unroll 8
        for (int k = 0; k < n; ++k) {
          // An empty part (weight 0) may hold anything: it must not reach the sum.
          if (weight[k] > 0.f) acc += weight[k] * v[k * p.v_part_stride];
        }
      }
    }
    if (d < p.head_dim) p.out[row * p.head_dim + d] = nan ? NAN : total > 0.f ? acc / total : 0.f;
  }
  if (threadIdx.x == 0) p.lse[row] = nan ? NAN : total > 0.f ? m + logf(total) : -INFINITY;
}

bool AllFp16(const PageLayout& l) {
  return l.k.type == ElementType::kFp16 && l.v.type == ElementType::kFp16;
}

// Fills k's format plans, stage_bytes and scales_at from its pools. Returns false for a layout
// the kernel does not read (BF16, a page other than 16 tokens x head_dim 128).
bool PlanStaging(PagedDecodeParams& k) {
  bool mixed = false;  // all-FP16 formats next to smaller ones are read directly
  for (int f = 0; f < k.num_formats; ++f) mixed |= !AllFp16(k.pools[f].layout);
  k.stage_bytes = 0;
  for (int f = 0; f < k.num_formats; ++f) {
    const PageLayout& l = k.pools[f].layout;
    if (l.tokens != kDecodeBlockTokens || l.head_dim != kDecodeHeadDim) return false;
    PagedDecodeParams::FormatPlan& plan = k.plans[f];
    const CodecLayout* sides[2] = {&l.k, &l.v};
    const float tensor[2] = {k.pools[f].k_tensor_scale, k.pools[f].v_tensor_scale};
    const bool direct = mixed && AllFp16(l);
    uint32_t side_bytes[2];
    plan.kinds = direct ? kDirectFp16 : 0;
    for (int side = 0; side < 2; ++side) {
      const CodecLayout& c = *sides[side];
      if (c.type == ElementType::kBf16) return false;
      const bool nvfp4 = c.type == ElementType::kNvfp4;
      const uint32_t kind = c.type == ElementType::kFp16      ? kFp16Side
                            : c.type == ElementType::kFp8E4M3 ? kE4M3Side
                            : c.type == ElementType::kFp8E5M2 ? kE5M2Side
                            : c.axis == MicroAxis::kHeadDim   ? kNvfp4DimSide
                                                              : kNvfp4TokenSide;
      side_bytes[side] =
          direct ? 0 : l.tokens * c.row_bytes + (nvfp4 ? l.tokens * l.head_dim / kMicroBlock : 0);
      plan.src[side] = c.payload_offset;
      plan.src[2 + side] = nvfp4 ? c.micro_offset : 0;
      const bool scaled = c.type != ElementType::kFp16;
      plan.scale_count[side] =
          !scaled ? 0 : PageScalesPerHead(CodecSpec{c.type, c.scope, c.axis}, l.tokens);
      plan.scale_src[side] = plan.scale_count[side] > 0 ? l.ScaleOffset(c, 0, 0) : 0;
      plan.fill[side] = scaled ? tensor[side] : 1.f;
      plan.mul[side] = nvfp4 ? 128.f : 1.f;
      plan.kinds |= kind << (3 * side) | (plan.scale_count[side] == 16 ? 1u : 0u) << (6 + side);
    }
    plan.v_at = side_bytes[0];
    k.stage_bytes =
        std::max<int32_t>(k.stage_bytes, (side_bytes[0] + side_bytes[1] + 15) / 16 * 16);
  }
  k.scales_at = k.stage_bytes;
  k.stage_bytes += 32 * sizeof(float);
  return true;
}

// The kernel for k's GQA group and its dynamic shared memory: the staging rings, or the
// block's merge of its warps' states if larger.
struct KernelLaunch {
  void (*kernel)(PagedDecodeParams);
  int smem;
};
KernelLaunch KernelFor(const PagedDecodeParams& k) {
  const bool wide = k.num_q_heads / k.num_kv_heads > 8;
  const size_t group_rows = wide ? 16 : 8;
  const size_t ring = static_cast<size_t>(kWarps) * kStages * (k.stage_bytes + 4);
  const size_t merge = kWarps * group_rows * (kDecodeHeadDim + 2) * sizeof(float);
  return {wide ? PagedDecodeKernel<2> : PagedDecodeKernel<1>,
          static_cast<int>(std::max(ring, merge))};
}

// Raises the kernels' opt-in shared memory limit on the current device, once per device, to the
// most any launch asks for (FP16 K and V, the largest staged page).
cudaError_t RaiseSharedLimit() {
  static std::atomic<uint64_t> raised{0};  // bit d: device d (devices past 63: every launch)
  int device = 0;
  const cudaError_t got = cudaGetDevice(&device);
  if (got != cudaSuccess) return got;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if ((raised.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  constexpr int kMostSmem =
      kWarps * kStages * (2 * kDecodeBlockTokens * kDecodeHeadDim * 2 + 32 * 4 + 4);
  for (const auto f : {PagedDecodeKernel<1>, PagedDecodeKernel<2>}) {
    const cudaError_t r =
        cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kMostSmem);
    if (r != cudaSuccess) return r;
  }
  raised.fetch_or(bit, std::memory_order_relaxed);
  return cudaSuccess;
}

bool ValidShapes(const PagedDecodeParams& p) {
  return p.batch >= 0 && p.batch <= kDecodeMaxBatch && p.num_kv_heads >= 1 &&
         p.num_q_heads % p.num_kv_heads == 0 && p.num_q_heads / p.num_kv_heads >= 1 &&
         p.num_q_heads / p.num_kv_heads <= kDecodeMaxGroup && p.num_formats >= 1 &&
         p.num_formats <= kDecodeMaxFormats;
}

}  // namespace

cudaError_t ChooseDecodeSplit(const PagedDecodeParams& p, int32_t max_pages, int32_t num_sms,
                              DecodeSplit* split) {
  PagedDecodeParams k = p;
  if (!ValidShapes(p) || !PlanStaging(k)) return cudaErrorInvalidValue;
  const cudaError_t raised = RaiseSharedLimit();
  if (raised != cudaSuccess) return raised;
  const KernelLaunch launch = KernelFor(k);
  int per_sm = 0;
  const cudaError_t e =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, launch.kernel, kThreads, launch.smem);
  if (e != cudaSuccess) return e;
  // One wave: as many splits as fill the resident blocks of every multiprocessor, and at least
  // 8 pages per split (two per warp) so that the merge stays small next to the attention.
  const int64_t blocks = std::max<int64_t>(1, static_cast<int64_t>(p.batch) * p.num_kv_heads);
  const int64_t want = std::max<int64_t>(1, per_sm) * num_sms / blocks;
  const int64_t most = std::max<int64_t>(1, (max_pages + 7) / 8);
  const int32_t splits = static_cast<int32_t>(std::max<int64_t>(1, std::min(want, most)));
  const int32_t per = std::max<int32_t>(1, (max_pages + splits - 1) / splits);
  *split = {static_cast<int32_t>((std::max(max_pages, 1) + per - 1) / per), per};
  return cudaSuccess;
}

int64_t DecodeWorkspaceFloats(int32_t batch, int32_t num_q_heads, int32_t num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<int64_t>(num_splits) * batch * num_q_heads * (kDecodeHeadDim + 1);
}

cudaError_t LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!ValidShapes(p) || p.num_splits < 1 || p.pages_per_split < 1 ||
      (p.num_splits > 1 && p.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  PagedDecodeParams k = p;
  if (!PlanStaging(k)) return cudaErrorInvalidValue;
  const cudaError_t raised = RaiseSharedLimit();
  if (raised != cudaSuccess) return raised;
  const KernelLaunch launch = KernelFor(k);
  const dim3 grid(p.num_splits, p.num_kv_heads, p.batch);
  launch.kernel<<<grid, kThreads, launch.smem, stream>>>(k);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || p.num_splits == 1) return e;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.num_q_heads;
  MergeStatesParams m;
  m.v = p.workspace;
  m.s = p.workspace + static_cast<int64_t>(p.num_splits) * rows * kDecodeHeadDim;
  m.v_part_stride = rows * kDecodeHeadDim;
  m.s_part_stride = rows;
  m.parts = p.num_splits;
  m.rows = rows;
  m.head_dim = kDecodeHeadDim;
  m.out = p.out;
  m.lse = p.lse;
  return LaunchMergeStates(m, stream);
}

cudaError_t LaunchMergeStates(const MergeStatesParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.rows > INT32_MAX || p.parts < 1 || p.head_dim < 1)
    return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  MergeStatesKernel<<<static_cast<unsigned>(p.rows), kMergeThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
