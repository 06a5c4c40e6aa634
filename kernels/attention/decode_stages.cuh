// The per-page stages of kvtier's decode kernel (decode_kernel.cuh has the work split and the
// math of one page): load Q, S^T = K Q^T (QK), the online softmax, and O^T += V^T P^T (PV).
// Each is a __forceinline__ function over one warp's registers, composed by PagedDecodeKernel.
#ifndef KVTIER_KERNELS_ATTENTION_DECODE_STAGES_CUH_
#define KVTIER_KERNELS_ATTENTION_DECODE_STAGES_CUH_

#include <cmath>
#include <cstdint>

#include "kernels/attention/convert.cuh"
#include "kernels/attention/fragments.cuh"
#include "kernels/attention/mma.cuh"
#include "kernels/attention/side_kind.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/rotate_row.cuh"

namespace kvtier::gpu::attention {

// Warps per block (each takes the split's pages in turn): 4 or 8, chosen per launch by
// ChooseDecodeSplit (decode_launch.cu). kMostWarps: the larger.
constexpr int kMostWarps = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// The running maximum may lag the true one by up to kLazy (logits are in log2 units), so that
// most pages skip rescaling the accumulators; probabilities stay below 2^kLazy in FP16.
constexpr float kLazy = 8.f;
// A page whose V scales all fall below the accumulator unit times this factor forces a rescale
// (FP16 probabilities keep their precision above it). Every rescale, whatever triggered it,
// makes the page's largest V scale the new unit.
constexpr float kUnitFloor = 1.f / 1024.f;

// What a thread of a block attends: one (sequence b, KV head, split), and its place in the block
// (lane = 4 g + c of warp `warp`).
struct DecodeBlock {
  int split, kv_head, b;
  int warp, lane, g, c;
  int group;  // query heads per KV head
  int seq_len, first_entry;
  int pages;                 // the sequence's pages (its packed entries)
  int page_begin, page_end;  // the split's pages of the sequence
};

__device__ __forceinline__ DecodeBlock BlockOf(const PagedDecodeParams& p) {
  DecodeBlock k;
  k.split = blockIdx.x, k.kv_head = blockIdx.y, k.b = blockIdx.z;
  k.warp = threadIdx.x / 32, k.lane = threadIdx.x % 32;
  k.g = k.lane / 4, k.c = k.lane % 4;
  k.group = p.num_q_heads / p.num_kv_heads;
  k.seq_len = p.seq_lens[k.b];
  k.first_entry = p.packed_indptr[k.b];
  k.pages = (k.seq_len + kDecodeBlockTokens - 1) / kDecodeBlockTokens;
  k.page_begin = k.split * p.pages_per_split;
  k.page_end = min(k.pages, k.page_begin + p.pages_per_split);
  return k;
}

// One warp's attention state (locals of the kernel, so that each array is promoted to
// registers on its own). Lane (g, c) keeps heads 8t + 2c and 8t + 2c + 1 (index 2t + h): their
// running maxima m_run and sums l_run (this lane's tokens only), and, of the output o, dims
// 16g + 2i and 16g + 2i + 1 of tile i: o[t][i] = {(2i, head 2c), (2i, 2c+1), (2i+1, 2c),
// (2i+1, 2c+1)}, in units of the V scale `unit` (inv_unit = 1 / unit).
template <int kTiles>
__device__ __forceinline__ void InitState(float (&m_run)[2 * kTiles], float (&l_run)[2 * kTiles],
                                          float (&o)[kTiles][8][4]) {
#pragma unroll
  for (int h = 0; h < 2 * kTiles; ++h) m_run[h] = -INFINITY, l_run[h] = 0.f;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[t][i][0] = o[t][i][1] = o[t][i][2] = o[t][i][3] = 0.f;
  }
}

// A page as the stages read it: staged in shared memory, or (direct) an all-FP16 page's head in
// global memory, K rows at direct_k and V rows `direct_v` bytes after them.
struct StagedPage {
  const PagedDecodeParams::FormatPlan* plan;
  uint32_t kinds;  // plan->kinds
  uint8_t* page;
  uint8_t* v_side;
  int valid;  // tokens of the page within the sequence (1..16)
  bool direct;
  const uint8_t* direct_k;
  uint32_t direct_v;
};

// Bytes of shared memory that the staging rings of a block of `warps` warps, `stages` pages of
// `stage_bytes` each, take with each slot's table entry (PageRing), rounded up to 16: the Q^T
// fragments follow.
__host__ __device__ constexpr int RingBytes(int warps, int stages, int stage_bytes) {
  return (warps * stages * (stage_bytes + 4) + 15) / 16 * 16;
}
// Bytes of the Q^T fragments of one tile of 8 query heads (PackQuery).
constexpr int kQueryBytesPerTile = 4 * 32 * 16;

// Whether the kernel for palettes of side kinds `kinds` (kAnyKinds, or the one pair of side kinds
// of its palette's formats) keeps its Q^T fragments in shared memory (QueryFragments): every
// palette kernel of its own. The launch adds their bytes to the block's shared memory.
__host__ __device__ constexpr bool QueryInSharedMemory(uint32_t kinds) {
  return kinds != kAnyKinds;
}
// Whether PackQuery passes the fragments through shared memory (loaded by every warp, then a
// barrier): where they stay there, and in the generic kernel without page weights, whose
// batch-1 steps it shortened; with them its loop ran 2% slower at batch 64 x 32K (session 41).
// The launch adds their bytes to the block's shared memory.
__host__ __device__ constexpr bool QueryStagedInSharedMemory(uint32_t kinds, bool page_weights) {
  return QueryInSharedMemory(kinds) || !page_weights;
}

// This lane's Q^T fragments (PackQuery), those of k-steps 2m and 2m + 1 of tile t as At(t, m).
// kShared: in shared memory (kTiles x kQueryBytesPerTile bytes at `base` - lane, lane l's at
// [(4t + m) * 32 + l]), written by the block's warps in turn (PackQuery) and read at every page,
// one 16-byte load a quarter: in registers they pushed the NVFP4 page loop to the kernel's
// 128-register limit, where ptxas recomputed lane indices and addresses at each page
// (docs/benchmarks.md, session 19). Else in registers, which the other formats' page loops run
// faster with.
template <int kTiles, bool kShared>
struct QueryFragments {
  uint4 f[kTiles][4];
  __device__ __forceinline__ uint4 At(int t, int m) const { return f[t][m]; }
  __device__ __forceinline__ void Set(int t, int m, uint4 v) { f[t][m] = v; }
};
template <int kTiles>
struct QueryFragments<kTiles, true> {
  uint4* base;
  __device__ __forceinline__ uint4 At(int t, int m) const { return base[(4 * t + m) * 32]; }
  __device__ __forceinline__ void Set(int t, int m, uint4 v) { base[(4 * t + m) * 32] = v; }
};

// The query values this lane packs into its Q^T fragments (PackQuery), read apart from their
// packing so that the reads can be issued before the first pages' copies and do not queue
// behind them.
template <int kTiles>
struct QueryValues {
  float x[kTiles][4][8];
};

// The group's query rows in p.q.
__device__ __forceinline__ const float* QueryRows(const PagedDecodeParams& p,
                                                  const DecodeBlock& k) {
  return p.q + (static_cast<int64_t>(k.b) * p.num_q_heads + k.kv_head * k.group) * kDecodeHeadDim;
}

// Whether fragment (t, m) is this warp's to read and pack: with kStaged, fragment (t, m) is warp
// (4t + m) mod the block's warps', so that their round trips overlap; else every warp's.
template <bool kStaged>
__device__ __forceinline__ bool OwnsFragment(const DecodeBlock& k, int t, int m) {
  return !kStaged || (4 * t + m) % static_cast<int>(blockDim.x / 32) == k.warp;
}

// Reads the values of this lane's fragments from the group's rows q0 (QueryRows, or rotated
// rows in shared memory) into v: fragment (t, m) holds k-steps 2m and 2m + 1, dims d, d + 4 and
// d + 1, d + 5 for d = d0 and d0 + 2; rows past the group read as zeros.
template <bool kStaged, int kTiles>
__device__ __forceinline__ void ReadQuery(const float* q0, const DecodeBlock& k,
                                          QueryValues<kTiles>& v) {
  constexpr int kD = kDecodeHeadDim;
  // Rows lie 512 bytes apart, so the first row's alignment is every row's: 16-byte loads where
  // it allows (a quarter of the load instructions; the scalar loads' queue and round trips held
  // the first page back at batch 1, docs/benchmarks.md, session 41).
  const bool vector = (reinterpret_cast<uintptr_t>(q0) & 15) == 0;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int row = k.g + 8 * t;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      if (!OwnsFragment<kStaged>(k, t, m)) continue;
      const float* d0 = q0 + row * kD + 32 * k.c + 8 * m;
      float* x = v.x[t][m];
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = 0.f;
      if (row < k.group && vector) {
        const float4 a = *reinterpret_cast<const float4*>(d0);
        const float4 b = *reinterpret_cast<const float4*>(d0 + 4);
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
      } else if (row < k.group) {
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = d0[i];
      }
    }
  }
}

// Q^T fragments (the B operand of S^T = K Q^T) in the canonical K order from ReadQuery's values:
// k-step j pairs with K pairs 2j and 2j + 1, which hold dims 32c + 8m + q (+4), m = j / 2, q = 2
// (j % 2) (+1), into q (with kStaged through `staged`, this lane's fragment (t, m) at [(4t + m) *
// 32], then a barrier and every warp's copy). Every thread of the block calls it.
template <bool kStaged, int kTiles, bool kShared>
__device__ __forceinline__ void PackQuery(const PagedDecodeParams& p, const DecodeBlock& k,
                                          const QueryValues<kTiles>& v, uint4* staged,
                                          QueryFragments<kTiles, kShared>& q) {
  static_assert(kStaged || !kShared);
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      if (!OwnsFragment<kStaged>(k, t, m)) continue;
      const float* x = v.x[t][m];
      const uint4 f = make_uint4(PackHalf2(x[0], x[4]), PackHalf2(x[1], x[5]),
                                 PackHalf2(x[2], x[6]), PackHalf2(x[3], x[7]));
      if (kStaged) {
        staged[(4 * t + m) * 32] = f;
      } else {
        q.Set(t, m, f);
      }
    }
  }
  // Every warp reads staged fragments; the staging ring reuses the rotated rows' memory.
  if (kStaged || p.rotate_queries) __syncthreads();
  if constexpr (kStaged && !kShared) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int m = 0; m < 4; ++m) q.Set(t, m, staged[(4 * t + m) * 32]);
    }
  }
}

// The Q^T fragments of rotated queries (p.rotate_queries): the group's rows rotated into `smem`
// (the block's shared memory before the fragments, the staging ring's: REQUIRES no copy into it
// in flight), then read and packed. Every thread of the block calls it.
template <bool kStaged, int kTiles, bool kShared>
__device__ __forceinline__ void LoadRotatedQuery(const PagedDecodeParams& p, const DecodeBlock& k,
                                                 uint8_t* smem, uint4* staged,
                                                 QueryFragments<kTiles, kShared>& q) {
  constexpr int kD = kDecodeHeadDim;
  const float* q0 = QueryRows(p, k);
  float* rows = reinterpret_cast<float*>(smem);
  float* scratch = rows + k.group * kD;
  for (int r = 0; r < k.group; ++r) {
    RotateRowInBlock(scratch, kD, p.key_rotation_seed, k.kv_head,
                     [&](int d) { return q0[r * kD + d]; }, rows + r * kD);
  }
  QueryValues<kTiles> v;
  ReadQuery<kStaged>(rows, k, v);
  PackQuery<kStaged>(p, k, v, staged, q);
}

// QK of one side kind into s (QK's layout): quarter m of K's rows (pairs 4m..4m+3) feeds
// k-steps 2m and 2m + 1, decoded just before its products, in kChains chains of products summed
// at the end: 2 (k-steps even and odd) or 4 (quarters even and odd too). Q: QueryFragments.
template <uint32_t kKind, int kTiles, int kChains, class Q>
__device__ __forceinline__ void KeyProducts(const RawKeys<kKind>& raw, const Q& q,
                                            float (&s)[kTiles][4]) {
  static_assert(kChains == 2 || kChains == 4);
  float acc[kChains][kTiles][4];
#pragma unroll
  for (int a = 0; a < kChains; ++a) {
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[a][t][e] = 0.f;
    }
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    uint32_t k0[4], k1[4];
    KeyQuad<kKind>(raw, 0, m, k0);
    KeyQuad<kKind>(raw, 1, m, k1);
    const uint32_t a_even[4] = {k0[0], k1[0], k0[1], k1[1]};
    const uint32_t a_odd[4] = {k0[2], k1[2], k0[3], k1[3]};
    const int chain = kChains == 4 ? 2 * (m % 2) : 0;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const uint4 f = q.At(t, m);
      Mma(acc[chain][t], a_even, f.x, f.y);
      Mma(acc[chain + 1][t], a_odd, f.z, f.w);
    }
  }
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[t][e] = acc[0][t][e] + acc[1][t][e];
      if constexpr (kChains == 4) s[t][e] += acc[2][t][e] + acc[3][t][e];
    }
  }
}

// QK: S^T = K Q^T, the logits of tokens g (s[t][0..1]) and g + 8 (s[t][2..3]) for heads
// 8t + 2c, +1 (KeyProducts); q as KeyProducts. K's FP32 scales are left out. kKinds: the
// kernel's (PagedDecodeKernel); the all-NVFP4 palettes' kernel sums its products in 4 chains,
// whose longer decode leaves more of their latency exposed (from L2 at b64 x 32K 4% faster;
// the generic kernel's NVFP4 pages 1-2% slower so: docs/benchmarks.md, session 30), the others
// in 2.
template <int kTiles, uint32_t kKinds, class Q>
__device__ __forceinline__ void ComputeLogits(const StagedPage& pg, int g, int c, const Q& q,
                                              float (&s)[kTiles][4]) {
  constexpr int kChains = kKinds == kNvfp4Kinds ? 4 : 2;
  if (pg.direct) {
    KeyProducts<kFp16Side, kTiles, 2>(LoadKeys<kFp16Side>(pg.direct_k, g, c), q, s);
  } else {
    DispatchSide(pg.kinds & 7, [&](auto kind) {
      constexpr uint32_t kKind = decltype(kind)::value;
      KeyProducts<kKind, kTiles, kChains>(LoadKeys<kKind>(pg.page, g, c), q, s);
    });
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

// Softmax, 1: applies the K scales (and the softmax scale, in log2 units) to the logits, -inf
// past the sequence's end, and sets vs to the V scales of tokens g and g + 8 (0 past the end)
// and v_page to token g's whatever the end (the page's V scale when the scale is uniform: every
// slot holds it, StagePage). Returns whether one of this lane's logits exceeds its head's
// running maximum by over kLazy.
template <int kTiles>
__device__ __forceinline__ bool ScaleLogits(const PagedDecodeParams& p, const StagedPage& pg,
                                            int g, const float (&m_run)[2 * kTiles],
                                            float (&s)[kTiles][4], float (&vs)[2],
                                            float& v_page) {
  // Each token's K and V scale slots (StagePage puts a per-block scale in every slot).
  const float* scales = reinterpret_cast<const float*>(pg.page + p.scales_at);
  const float k_mul = pg.plan->scale_mul[0], k_add = pg.plan->scale_add[0];
  const float v_mul = pg.plan->scale_mul[1], v_add = pg.plan->scale_add[1];
  bool rescale = false;
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int token = g + 8 * n;
    const bool ok = token < pg.valid;
    const float ks = fmaf(scales[token], k_mul, k_add);
    const float v = fmaf(scales[16 + token], v_mul, v_add);
    if (n == 0) v_page = v;
    vs[n] = ok ? v : 0.f;
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
  return rescale;
}

// Softmax, 2: rescales only when a logit exceeds its head's running maximum by more than
// kLazy, or the V scales leave the accumulator unit's range (one above it, or all below its
// floor); the decision is the whole warp's, and the maxima are reduced only then.
template <int kTiles>
__device__ __forceinline__ void Rescale(bool rescale, const float (&vs)[2],
                                        const float (&s)[kTiles][4], float (&m_run)[2 * kTiles],
                                        float (&l_run)[2 * kTiles], float& unit, float& inv_unit,
                                        float (&o)[kTiles][8][4]) {
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
}

// Softmax, 3: P^T (the B operand of O^T = V^T P^T), the probabilities times V scale / unit in
// FP16, and the running sums. pair_sums gets, transposed as P^T, the FP16 sums of each lane's
// two tokens' probabilities without the V scales (relative to m_run): row c's pairs are heads
// 2c and 2c + 1 of tokens g and g + 8, so that summing its 8 columns gives each head's page sum.
// kUniformV (every format's V scale is one per page: per block or per tensor): pb is the FP16
// probabilities times the page's ratio v_page / unit in FP16, transposed, so that no FP32
// product is needed per probability (times the ratio before the transpose: faster on the H200
// than after it, docs/benchmarks.md session 13). Else pb is packed from the FP32 products
// (per-token ratios). pair_sums is unused, and so compiled away, unless page weights are kept.
template <int kTiles, bool kUniformV>
__device__ __forceinline__ void Probabilities(const float (&vs)[2], float v_page,
                                              const float (&s)[kTiles][4],
                                              const float (&m_run)[2 * kTiles],
                                              float (&l_run)[2 * kTiles], float inv_unit,
                                              uint32_t (&pb)[kTiles][2],
                                              uint32_t (&pair_sums)[kTiles]) {
  const uint32_t r_page = kUniformV ? PackHalf2(v_page * inv_unit, v_page * inv_unit) : 0u;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const float e0 = Exp2(s[t][0] - m_run[2 * t]), e1 = Exp2(s[t][1] - m_run[2 * t + 1]);
    const float e2 = Exp2(s[t][2] - m_run[2 * t]), e3 = Exp2(s[t][3] - m_run[2 * t + 1]);
    const float sum0 = e0 + e2, sum1 = e1 + e3;
    l_run[2 * t] += sum0;
    l_run[2 * t + 1] += sum1;
    pair_sums[t] = Transpose8x8(PackHalf2(sum0, sum1));
    if constexpr (kUniformV) {
      pb[t][0] = Transpose8x8(Hmul2(PackHalf2(e0, e1), r_page));
      pb[t][1] = Transpose8x8(Hmul2(PackHalf2(e2, e3), r_page));
    } else {
      const float r0 = vs[0] * inv_unit, r1 = vs[1] * inv_unit;
      pb[t][0] = Transpose8x8(PackHalf2(e0 * r0, e1 * r0));
      pb[t][1] = Transpose8x8(PackHalf2(e2 * r1, e3 * r1));
    }
  }
}

// Softmax: the page's logits s to P^T, updating the warp's state (InitState); pair_sums and
// kUniformV as Probabilities.
template <int kTiles, bool kUniformV>
__device__ __forceinline__ void OnlineSoftmax(const PagedDecodeParams& p, const StagedPage& pg,
                                              int g, float (&s)[kTiles][4],
                                              float (&m_run)[2 * kTiles],
                                              float (&l_run)[2 * kTiles], float& unit,
                                              float& inv_unit, float (&o)[kTiles][8][4],
                                              uint32_t (&pb)[kTiles][2],
                                              uint32_t (&pair_sums)[kTiles]) {
  float vs[2], v_page;
  const bool rescale = ScaleLogits<kTiles>(p, pg, g, m_run, s, vs, v_page);
  Rescale<kTiles>(rescale, vs, s, m_run, l_run, unit, inv_unit, o);
  Probabilities<kTiles, kUniformV>(vs, v_page, s, m_run, l_run, inv_unit, pb, pair_sums);
}

// PV of one side kind: quarter i of the values (dims 16g + 4i..4i+3 of both token pairs)
// feeds tiles 2i and 2i + 1, decoded just before their products.
template <uint32_t kKind, int kTiles>
__device__ __forceinline__ void ValueProducts(const RawValues<kKind>& raw,
                                              const uint32_t (&pb)[kTiles][2],
                                              float (&o)[kTiles][8][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t v0[4], v1[4];
    ValueQuad<kKind>(raw, 0, i, v0);
    ValueQuad<kKind>(raw, 1, i, v1);
    const uint32_t a_even[4] = {v0[0], v0[1], v1[0], v1[1]};
    const uint32_t a_odd[4] = {v0[2], v0[3], v1[2], v1[3]};
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      Mma(o[t][2 * i], a_even, pb[t][0], pb[t][1]);
      Mma(o[t][2 * i + 1], a_odd, pb[t][0], pb[t][1]);
    }
  }
}

// PV: O^T += V^T P^T over the page's 16 tokens (8 tiles of 16 dims per query-head tile).
template <int kTiles>
__device__ __forceinline__ void AccumulateValues(const StagedPage& pg, int g, int c,
                                                 const uint32_t (&pb)[kTiles][2],
                                                 float (&o)[kTiles][8][4]) {
  if (pg.direct) {
    ValueProducts<kFp16Side, kTiles>(
        LoadValues<kFp16Side, true>(pg.direct_k + pg.direct_v, g, c, pg.valid), pb, o);
  } else {
    DispatchSide((pg.kinds >> 3) & 7, [&](auto kind) {
      constexpr uint32_t kKind = decltype(kind)::value;
      ValueProducts<kKind, kTiles>(LoadValues<kKind>(pg.v_side, g, c), pb, o);
    });
  }
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_DECODE_STAGES_CUH_
