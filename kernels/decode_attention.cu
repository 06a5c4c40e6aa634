// kvtier's fused mixed-format paged decode attention (contract in decode_attention.cuh).
//
// Work split: a block of 4 warps attends one (sequence, KV head, split); its warps take the
// split's pages in turn, each keeping its own online-softmax state for the GQA group, and the
// block merges the four states at the end. Each warp streams its pages into shared memory
// through its own cp.async ring (kStages deep) and handles one 16-token page per step with
// m16n8k16 tensor-core products (FP16 in, FP32 accumulate), laid out as in FlashAttention so
// that the probabilities of S = Q K^T are already in place as the A operand of O += P V:
//   S^T tile n:  A = Q [16 heads x 16 dims], B = K^T [16 dims x 8 tokens]  (8 k-steps, 2 tiles)
//   O tile t:    A = P [16 heads x 16 tokens], B = V [16 tokens x 8 dims]  (16 tiles)
// Lane (g = lane / 4, c = lane % 4) therefore holds K rows g and g + 8 (dims 32c..32c+31) and V
// rows 2c, 2c+1, 2c+8, 2c+9 (dims 16g..16g+15). Because a dot product is indifferent to the
// order of its terms, K's dims may sit in the registers in any order that Q's fragments share;
// the order used is the one NVFP4 decodes into for free (pairs of dims d and d + 4), and FP16
// and FP8 rows are permuted into it with byte permutes. Every format decodes exactly to FP16:
// FP8 codes by the hardware conversion, NVFP4 by placing the E2M1 bits in an FP16 (the value
// times 2^-14), scaling by 2^14 and by the E4M3 micro-scale (all products exact in FP16).
// FP32 scales apply to the logits (K) and to the probabilities (V, relative to the page's
// largest V scale, which becomes the unit of the output accumulator).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

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

// Two FP8 codes (lo byte first) as an FP16 pair: exact.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t codes16, bool e5m2) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes16),
                                                   e5m2 ? __NV_E5M2 : __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The E2M1 codes at nibbles p and p + 4 of `w` as an FP16 pair scaled by 2^-14: the sign goes
// to bit 15 and the three magnitude bits to bits 11..9 (exponent LSBs and mantissa MSB), which
// is exactly the E2M1 value times 2^-14, subnormal codes included.
template <int p>
__device__ __forceinline__ uint32_t E2M1PairScaled(uint32_t w) {
  const uint32_t x = p < 3 ? w << (9 - 4 * p) : w >> (4 * p - 9);
  return (x & 0x0E000E00u) | ((x << 3) & 0x80008000u);
}

// 2^14 twice, as the FP16 pair that undoes E2M1PairScaled's 2^-14 exactly.
constexpr uint32_t kHalf2Pow14 = 0x74007400u;

__device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 Load16(const uint8_t* p) {
  return *reinterpret_cast<const uint4*>(p);
}

// 32 FP8 codes (dims 32c..32c+31 of a row, in two uint4) as 16 FP16 pairs in the canonical K
// order: pair r = 4m + q holds dims 8m + q and 8m + q + 4.
__device__ __forceinline__ void Fp8RowToCanonical(uint4 a, uint4 b, bool e5m2, uint32_t h[16]) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t lo = Prmt(w[2 * m], w[2 * m + 1], 0x5140);  // dims q and q + 4, q = 0, 1
    const uint32_t hi = Prmt(w[2 * m], w[2 * m + 1], 0x7362);  // q = 2, 3
    h[4 * m + 0] = Fp8x2ToHalf2(lo & 0xFFFFu, e5m2);
    h[4 * m + 1] = Fp8x2ToHalf2(lo >> 16, e5m2);
    h[4 * m + 2] = Fp8x2ToHalf2(hi & 0xFFFFu, e5m2);
    h[4 * m + 3] = Fp8x2ToHalf2(hi >> 16, e5m2);
  }
}

// K rows g and g + 8 of `head`, dims 32c..32c+31, decoded to the canonical order; the FP32
// scale is left out.
__device__ __forceinline__ void LoadKeys(const PageLayout& l, const uint8_t* page, int head,
                                         int g, int c, uint32_t k[2][16]) {
  const CodecLayout& cl = l.k;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int token = g + 8 * n;
    const uint8_t* row = page + l.PayloadOffset(cl, head, token);
    if (cl.type == ElementType::kFp16) {
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
    } else if (cl.type == ElementType::kNvfp4) {
      const uint4 v = Load16(row + 16 * c);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t micro[4];  // per pair of the canonical order of word m
      if (cl.axis == MicroAxis::kHeadDim) {
        // Two micro-blocks: dims 32c..+15 (words 0, 1) and 32c+16..+31 (words 2, 3).
        const uint8_t* mp = page + l.MicroOffset(cl, head, token, 32 * c);
        const uint32_t pair = Fp8x2ToHalf2(mp[0] | (static_cast<uint32_t>(mp[1]) << 8), false);
        micro[0] = micro[1] = Prmt(pair, pair, 0x1010);
        micro[2] = micro[3] = Prmt(pair, pair, 0x3232);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          k[n][4 * m + 0] = Hmul2(Hmul2(E2M1PairScaled<0>(w[m]), kHalf2Pow14), micro[m]);
          k[n][4 * m + 1] = Hmul2(Hmul2(E2M1PairScaled<1>(w[m]), kHalf2Pow14), micro[m]);
          k[n][4 * m + 2] = Hmul2(Hmul2(E2M1PairScaled<2>(w[m]), kHalf2Pow14), micro[m]);
          k[n][4 * m + 3] = Hmul2(Hmul2(E2M1PairScaled<3>(w[m]), kHalf2Pow14), micro[m]);
        }
      } else {
        // One micro-scale per dim (the page is one 16-token group): the same canonical order
        // as an FP8 row.
        const uint8_t* mp = page + l.MicroOffset(cl, head, 0, 32 * c);
        uint32_t ms[16];
        Fp8RowToCanonical(Load16(mp), Load16(mp + 16), false, ms);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          k[n][4 * m + 0] = Hmul2(Hmul2(E2M1PairScaled<0>(w[m]), kHalf2Pow14), ms[4 * m + 0]);
          k[n][4 * m + 1] = Hmul2(Hmul2(E2M1PairScaled<1>(w[m]), kHalf2Pow14), ms[4 * m + 1]);
          k[n][4 * m + 2] = Hmul2(Hmul2(E2M1PairScaled<2>(w[m]), kHalf2Pow14), ms[4 * m + 2]);
          k[n][4 * m + 3] = Hmul2(Hmul2(E2M1PairScaled<3>(w[m]), kHalf2Pow14), ms[4 * m + 3]);
        }
      }
    } else {  // FP8
      Fp8RowToCanonical(Load16(row + 32 * c), Load16(row + 32 * c + 16),
                        cl.type == ElementType::kFp8E5M2, k[n]);
    }
  }
}

// V of tokens (2c, 2c+1) and (2c+8, 2c+9), dims 16g..16g+15, as token pairs: v[j][t] holds dim
// 16g + t of token pair j. Rows at or beyond `valid` tokens read as zeros. The FP32 scale is
// left out.
__device__ __forceinline__ void LoadValues(const PageLayout& l, const uint8_t* page, int head,
                                           int g, int c, int valid, uint32_t v[2][16]) {
  const CodecLayout& cl = l.v;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t0 = 2 * c + 8 * j;
    const uint8_t* ra = page + l.PayloadOffset(cl, head, t0);
    const uint8_t* rb = page + l.PayloadOffset(cl, head, t0 + 1);
    const uint32_t keep_a = t0 < valid ? 0xFFFFFFFFu : 0u;
    const uint32_t keep_b = t0 + 1 < valid ? 0xFFFFFFFFu : 0u;
    if (cl.type == ElementType::kFp16) {
      const uint4 a0 = Load16(ra + 32 * g), a1 = Load16(ra + 32 * g + 16);
      const uint4 b0 = Load16(rb + 32 * g), b1 = Load16(rb + 32 * g + 16);
      const uint32_t a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const uint32_t b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        const uint32_t x = a[w] & keep_a, y = b[w] & keep_b;
        v[j][2 * w] = Prmt(x, y, 0x5410);
        v[j][2 * w + 1] = Prmt(x, y, 0x7632);
      }
    } else if (cl.type == ElementType::kNvfp4) {
      const uint2 a = *reinterpret_cast<const uint2*>(ra + 8 * g);
      const uint2 b = *reinterpret_cast<const uint2*>(rb + 8 * g);
      const uint32_t wa[2] = {a.x & keep_a, a.y & keep_a};
      const uint32_t wb[2] = {b.x & keep_b, b.y & keep_b};
      uint32_t scale[16];  // per dim t: the micro-scales of the two tokens
      if (cl.axis == MicroAxis::kHeadDim) {
        const uint32_t ma = page[l.MicroOffset(cl, head, t0, 16 * g)] & keep_a;
        const uint32_t mb = page[l.MicroOffset(cl, head, t0 + 1, 16 * g)] & keep_b;
        const uint32_t pair = Fp8x2ToHalf2(ma | (mb << 8), false);
#pragma unroll
        for (int t = 0; t < 16; ++t) scale[t] = pair;
      } else {
        const uint4 m = Load16(page + l.MicroOffset(cl, head, 0, 16 * g));
        const uint32_t mw[4] = {m.x, m.y, m.z, m.w};
#pragma unroll
        for (int t = 0; t < 16; t += 2) {
          const uint32_t pair = Fp8x2ToHalf2((mw[t / 4] >> (8 * (t % 4))) & 0xFFFFu, false);
          scale[t] = Prmt(pair, pair, 0x1010);
          scale[t + 1] = Prmt(pair, pair, 0x3232);
        }
      }
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const uint32_t ha[4] = {E2M1PairScaled<0>(wa[w]), E2M1PairScaled<1>(wa[w]),
                                E2M1PairScaled<2>(wa[w]), E2M1PairScaled<3>(wa[w])};
        const uint32_t hb[4] = {E2M1PairScaled<0>(wb[w]), E2M1PairScaled<1>(wb[w]),
                                E2M1PairScaled<2>(wb[w]), E2M1PairScaled<3>(wb[w])};
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // dims 8w + q and 8w + q + 4
          const int d0 = 8 * w + q, d1 = d0 + 4;
          v[j][d0] = Hmul2(Hmul2(Prmt(ha[q], hb[q], 0x5410), kHalf2Pow14), scale[d0]);
          v[j][d1] = Hmul2(Hmul2(Prmt(ha[q], hb[q], 0x7632), kHalf2Pow14), scale[d1]);
        }
      }
    } else {  // FP8
      const bool e5m2 = cl.type == ElementType::kFp8E5M2;
      const uint4 a = Load16(ra + 16 * g), b = Load16(rb + 16 * g);
      const uint32_t wa[4] = {a.x & keep_a, a.y & keep_a, a.z & keep_a, a.w & keep_a};
      const uint32_t wb[4] = {b.x & keep_b, b.y & keep_b, b.z & keep_b, b.w & keep_b};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t lo = Prmt(wa[w], wb[w], 0x5140);  // dims 4w, 4w + 1
        const uint32_t hi = Prmt(wa[w], wb[w], 0x7362);  // dims 4w + 2, 4w + 3
        v[j][4 * w + 0] = Fp8x2ToHalf2(lo & 0xFFFFu, e5m2);
        v[j][4 * w + 1] = Fp8x2ToHalf2(lo >> 16, e5m2);
        v[j][4 * w + 2] = Fp8x2ToHalf2(hi & 0xFFFFu, e5m2);
        v[j][4 * w + 3] = Fp8x2ToHalf2(hi >> 16, e5m2);
      }
    }
  }
}

__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
}

__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
  return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);
}

// ---- Staging pages in shared memory ----
// Each warp streams its pages through a ring of kStages buffers with cp.async, so that the
// loads of the next pages are in flight while it computes on this one. A buffer holds one
// page's data for one KV head, laid out as a one-head page (PagedDecodeParams::StagePlan):
// the decode functions read it exactly as they would read the page, with head 0.
constexpr int kStages = 3;

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CommitCopies() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void WaitCopies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Starts copying the data of `head` in the page `entry` names into `dst` as the format's
// StagePlan says: K and V rows and micro-scales, then the 16 K and 16 V scales (lanes 0-15 and
// 16-31; a per-block scale lands in slot 0, a per-tensor one is written there).
__device__ __forceinline__ void StagePage(const PagedDecodeParams& p, uint32_t entry, int head,
                                          uint8_t* dst, int lane) {
  const uint32_t format = entry >> kPackedFormatShift;
  const PagedDecodeParams::StagePlan& plan = p.plans[format];
  const uint8_t* page = p.pools[format].base +
                        static_cast<uint64_t>(entry & kPackedPageMask) * p.pools[format].layout.page_bytes;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint8_t* src = page + plan.src[s] + head * plan.head_stride[s];
    for (uint32_t chunk = lane; chunk < plan.chunks[s]; chunk += 32) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                       SharedAddress(dst + plan.dst[s] + 16 * chunk)),
                   "l"(src + 16 * chunk));
    }
  }
  const int side = lane / 16, slot = lane % 16;
  const uint32_t count = plan.scale_count[side];
  float* scales = reinterpret_cast<float*>(dst + p.scales_at) + 16 * side;
  if (static_cast<uint32_t>(slot) < count) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(SharedAddress(scales + slot)),
                 "l"(page + plan.scale_src[side] + 4 * (head * count + slot)));
  } else if (count == 0 && slot == 0) {
    scales[0] = plan.fill[side];
  }
}

// kRows: 8 when the GQA group fits the mma's first 8 rows (the second 8 are then skipped).
template <int kRows>
__global__ void __launch_bounds__(kThreads) PagedDecodeKernel(const __grid_constant__ PagedDecodeParams p) {
  constexpr int kD = kDecodeHeadDim;
  constexpr int kHalves = kRows / 8;  // accumulator rows per lane: head g, and g + 8
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

  // Q fragments in the canonical K order: step j pairs with K pairs 2j and 2j + 1, which hold
  // dims 32c + 8m + q (+4), m = j / 2, q = 2 (j % 2) (+1).
  uint32_t qa[8][4];
  {
    const float* q0 = p.q + (static_cast<int64_t>(b) * p.num_q_heads + kv_head * group) * kD;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = 32 * c + 8 * (j / 2) + 2 * (j % 2);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = g + 8 * half;
        uint32_t lo = 0, hi = 0;
        if (row < group && half < kHalves) {
          const float* qr = q0 + row * kD;
          lo = PackHalf2(qr[d], qr[d + 4]);
          hi = PackHalf2(qr[d + 1], qr[d + 5]);
        }
        qa[j][half] = lo;      // a0a1 (row g) / a2a3 (row g + 8): k = 2c, 2c+1
        qa[j][2 + half] = hi;  // a4a5 / a6a7: k = 2c + 8, 2c + 9
      }
    }
  }

  const float logit_scale = p.softmax_scale * kLog2e;  // logits in log2 units
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};  // this lane's share of the row sums
  float unit = 1.f;             // the output accumulator is in units of this V scale
  float o[16][4];
#pragma unroll
  for (int t = 0; t < 16; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;

  // This warp's pages: first, first + kWarps, ... below page_end, through its staging ring.
  uint8_t* ring = smem + warp * kStages * p.stage_bytes;
  uint32_t* ring_entry =
      reinterpret_cast<uint32_t*>(smem + kWarps * kStages * p.stage_bytes) + warp * kStages;
  const int first = page_begin + warp;
  const int count = first < page_end ? (page_end - first + kWarps - 1) / kWarps : 0;
  const auto stage = [&](int i) {
    if (i < count) {
      const uint32_t entry = p.packed[first_entry + first + i * kWarps];
      if (lane == 0) ring_entry[i % kStages] = entry;
      StagePage(p, entry, kv_head, ring + (i % kStages) * p.stage_bytes, lane);
    }
    CommitCopies();  // an empty group keeps the count of pending groups uniform
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) stage(i);

  for (int i = 0; i < count; ++i) {
    stage(i + kStages - 1);
    WaitCopies<kStages - 1>();  // page i has landed (this lane's copies)
    __syncwarp();               // ... and every lane's
    const uint32_t entry = ring_entry[i % kStages];
    const PagedDecodeParams::StagePlan& plan = p.plans[entry >> kPackedFormatShift];
    const PageLayout& l = plan.layout;
    const uint8_t* page = ring + (i % kStages) * p.stage_bytes;
    const int page_index = first + i * kWarps;
    const int valid = min(kDecodeBlockTokens, seq_len - page_index * kDecodeBlockTokens);

    // Logits of tokens 2c, 2c+1 (tile 0) and 2c+8, 2c+9 (tile 1), for heads g and g + 8.
    float s[2][4];
    {
      uint32_t k[2][16];
      LoadKeys(l, page, 0, g, c, k);
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) Mma(s[n], qa[j], k[n][2 * j], k[n][2 * j + 1]);
      }
    }
    float vscale[4];  // tokens 2c, 2c+1, 2c+8, 2c+9
    const float* staged_scales = reinterpret_cast<const float*>(page + p.scales_at);
    const int k_stride = plan.scale_count[0] == 16, v_stride = plan.scale_count[1] == 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int token = 2 * c + (i & 1) + 8 * (i >> 1);
      const float ks = staged_scales[token * k_stride];
      const bool ok = token < valid;
      vscale[i] = ok ? staged_scales[16 + token * v_stride] : 0.f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float& x = s[i >> 1][2 * half + (i & 1)];
        x = ok ? x * (ks * logit_scale) : -INFINITY;
      }
    }
    // The page's largest V scale becomes the accumulator's unit. It must be the same in the
    // four lanes of a quad: their probabilities meet in the same output accumulators.
    float page_unit = QuadMax(fmaxf(fmaxf(vscale[0], vscale[1]), fmaxf(vscale[2], vscale[3])));
    if (!(page_unit > 1e-30f) || !isfinite(page_unit)) page_unit = 1.f;
    const float inv_page_unit = 1.f / page_unit;
    const float unit_ratio = unit * inv_page_unit;
    unit = page_unit;

    uint32_t pa[4];
#pragma unroll
    for (int half = 0; half < kHalves; ++half) {
      float mx = fmaxf(fmaxf(s[0][2 * half], s[0][2 * half + 1]),
                       fmaxf(s[1][2 * half], s[1][2 * half + 1]));
      mx = QuadMax(mx);
      const float m_new = fmaxf(m_run[half], mx);
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_run[half] - base);
      m_run[half] = m_new;
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) e[i] = exp2f(s[i >> 1][2 * half + (i & 1)] - base);
      l_run[half] = l_run[half] * alpha + ((e[0] + e[1]) + (e[2] + e[3]));
      const float rescale = alpha * unit_ratio;
#pragma unroll
      for (int t = 0; t < 16; ++t) {
        o[t][2 * half] *= rescale;
        o[t][2 * half + 1] *= rescale;
      }
      const float r = inv_page_unit;
      pa[half] = PackHalf2(e[0] * (vscale[0] * r), e[1] * (vscale[1] * r));
      pa[2 + half] = PackHalf2(e[2] * (vscale[2] * r), e[3] * (vscale[3] * r));
    }
    if (kHalves == 1) pa[1] = pa[3] = 0u;

    uint32_t v[2][16];
    LoadValues(l, page, 0, g, c, valid, v);
#pragma unroll
    for (int t = 0; t < 16; ++t) Mma(o[t], pa, v[0][t], v[1][t]);
    __syncwarp();  // the buffer is refilled by the next iteration's stage()
  }
  WaitCopies<0>();
  __syncthreads();  // the rings are reused below

  float(*s_out)[kRows][kD] = reinterpret_cast<float(*)[kRows][kD]>(smem);
  float(*s_m)[kRows] = reinterpret_cast<float(*)[kRows]>(smem + sizeof(float) * kWarps * kRows * kD);
  float(*s_l)[kRows] = s_m + kWarps;

  // This warp's state to shared memory: lane (g, c) holds dims 32c + t and 32c + 16 + t.
#pragma unroll
  for (int half = 0; half < kHalves; ++half) {
    const float l_sum = QuadSum(l_run[half]);
    const int row = g + 8 * half;
    if (c == 0) {
      s_m[warp][row] = m_run[half];
      s_l[warp][row] = l_sum;
    }
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      s_out[warp][row][32 * c + t] = o[t][2 * half] * unit;
      s_out[warp][row][32 * c + 16 + t] = o[t][2 * half + 1] * unit;
    }
  }
  __syncthreads();

  // Merge the warps: thread d takes dim d of every head of the group.
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
      if (d == 0) p.workspace[static_cast<int64_t>(p.num_splits) * rows * kD + split * rows + out_row] = lse;
    } else {
      p.out[out_row * kD + d] = out;
      if (d == 0) p.lse[out_row] = lse;
    }
  }
}

// One warp per row.
__global__ void MergeStatesKernel(const MergeStatesParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  float m = -INFINITY;
  bool nan = false;
  for (int k = 0; k < p.parts; ++k) {
    const float s = p.s[k * p.s_part_stride + row];
    nan |= isnan(s);
    m = fmaxf(m, s);
  }
  float total = 0.f;
  if (m != -INFINITY && !nan) {
    for (int k = 0; k < p.parts; ++k) total += expf(p.s[k * p.s_part_stride + row] - m);
  }
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.f;
    if (total > 0.f) {
      for (int k = 0; k < p.parts; ++k) {
        const float w = expf(p.s[k * p.s_part_stride + row] - m);
        if (w > 0.f) acc += w * p.v[k * p.v_part_stride + row * p.head_dim + d];
      }
    }
    p.out[row * p.head_dim + d] = nan ? NAN : total > 0.f ? acc / total : 0.f;
  }
  if (lane == 0) p.lse[row] = nan ? NAN : total > 0.f ? m + logf(total) : -INFINITY;
}

}  // namespace

DecodeSplit ChooseDecodeSplit(int32_t batch, int32_t num_kv_heads, int32_t max_pages,
                              int32_t num_sms) {
  // Enough blocks for about four per multiprocessor, and at least 8 pages per split (two
  // per warp) so that the merge stays small next to the attention.
  const int64_t blocks = static_cast<int64_t>(batch) * num_kv_heads;
  const int64_t want = (4 * static_cast<int64_t>(num_sms) + blocks - 1) / std::max<int64_t>(blocks, 1);
  const int64_t most = std::max<int64_t>(1, (max_pages + 7) / 8);
  const int32_t splits = static_cast<int32_t>(std::max<int64_t>(1, std::min(want, most)));
  const int32_t per = std::max<int32_t>(1, (max_pages + splits - 1) / splits);
  return {static_cast<int32_t>((std::max(max_pages, 1) + per - 1) / per), per};
}

int64_t DecodeWorkspaceFloats(int32_t batch, int32_t num_q_heads, int32_t num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<int64_t>(num_splits) * batch * num_q_heads * (kDecodeHeadDim + 1);
}

cudaError_t LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.num_kv_heads < 1 || p.num_q_heads % p.num_kv_heads != 0 ||
      p.num_q_heads / p.num_kv_heads < 1 || p.num_q_heads / p.num_kv_heads > kDecodeMaxGroup ||
      p.num_splits < 1 || p.pages_per_split < 1 || p.num_formats < 1 ||
      p.num_formats > kDecodeMaxFormats || (p.num_splits > 1 && p.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  PagedDecodeParams k = p;
  k.stage_bytes = 0;
  for (int f = 0; f < p.num_formats; ++f) {
    const PageLayout& l = p.pools[f].layout;
    FormatSpec spec;
    spec.k = {l.k.type, l.k.scope, l.k.axis};
    spec.v = {l.v.type, l.v.scope, l.v.axis};
    PagedDecodeParams::StagePlan& plan = k.plans[f];
    plan.layout = MakePageLayout(1, l.tokens, l.head_dim, spec);
    const CodecLayout* full[2] = {&l.k, &l.v};
    const CodecLayout* one[2] = {&plan.layout.k, &plan.layout.v};
    const float tensor[2] = {p.pools[f].k_tensor_scale, p.pools[f].v_tensor_scale};
    for (int side = 0; side < 2; ++side) {
      const CodecLayout& c = *full[side];
      const uint32_t row_run = static_cast<uint32_t>(l.tokens) * c.row_bytes;
      plan.src[side] = l.PayloadOffset(c, 0, 0);
      plan.head_stride[side] = row_run;
      plan.dst[side] = one[side]->payload_offset;
      plan.chunks[side] = row_run / 16;
      const uint32_t micro_run = static_cast<uint32_t>(l.tokens) * l.head_dim / kMicroBlock;
      const bool nvfp4 = c.type == ElementType::kNvfp4;
      plan.src[2 + side] = nvfp4 ? l.MicroOffset(c, 0, 0, 0) : 0;
      plan.head_stride[2 + side] = micro_run;
      plan.dst[2 + side] = one[side]->micro_offset;
      plan.chunks[2 + side] = nvfp4 ? micro_run / 16 : 0;
      const bool scaled = c.type != ElementType::kFp16 && c.type != ElementType::kBf16;
      plan.scale_count[side] = !scaled ? 0 : PageScalesPerHead(CodecSpec{c.type, c.scope, c.axis}, l.tokens);
      plan.scale_src[side] = plan.scale_count[side] > 0 ? l.ScaleOffset(c, 0, 0) : 0;
      plan.fill[side] = scaled ? tensor[side] : 1.f;
    }
    k.stage_bytes = std::max<int32_t>(k.stage_bytes, (plan.layout.data_bytes + 15) / 16 * 16);
  }
  k.scales_at = k.stage_bytes;
  k.stage_bytes += 32 * sizeof(float);
  const bool wide = p.num_q_heads / p.num_kv_heads > 8;
  const size_t group_rows = wide ? 16 : 8;
  const size_t ring = static_cast<size_t>(kWarps) * kStages * (k.stage_bytes + 4);
  const size_t merge = kWarps * group_rows * (kDecodeHeadDim + 2) * sizeof(float);
  const int smem = static_cast<int>(std::max(ring, merge));
  const dim3 grid(p.num_splits, p.num_kv_heads, p.batch);
  const auto kernel = wide ? PagedDecodeKernel<16> : PagedDecodeKernel<8>;
  // The opt-in shared memory limit is raised once per kernel, to the most any launch asks for
  // (FP16 K and V, the largest staged page), not on every launch.
  static const cudaError_t raised = [] {
    constexpr int kMostSmem =
        kWarps * kStages * (2 * kDecodeBlockTokens * kDecodeHeadDim * 2 + 32 * 4 + 4);
    for (const auto f : {PagedDecodeKernel<8>, PagedDecodeKernel<16>}) {
      const cudaError_t r =
          cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kMostSmem);
      if (r != cudaSuccess) return r;
    }
    return cudaSuccess;
  }();
  if (raised != cudaSuccess) return raised;
  kernel<<<grid, kThreads, smem, stream>>>(k);
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
  if (p.rows < 0 || p.parts < 1 || p.head_dim < 1) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  constexpr int kRowsPerBlock = 8;
  const int64_t blocks = (p.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  MergeStatesKernel<<<static_cast<unsigned>(blocks), kRowsPerBlock * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
