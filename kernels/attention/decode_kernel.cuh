// kvtier's fused mixed-format paged decode attention kernel (contract in
// kernels/decode_attention.cuh; host planner and launchers in decode_launch.cu).
//
// Work split: a block of 4 or 8 warps (kWarps, chosen per launch by ChooseDecodeSplit) attends
// one (sequence, KV head, split); its warps take the split's pages in turn, each keeping its own
// online-softmax state for the GQA group, and the block merges their states at the end. Each
// warp streams its pages into shared memory through its own cp.async ring (3 or 5 deep;
// page-table entries are read 32 at a time, a batch ahead) and handles one 16-token page per
// step with m16n8k16 tensor-core products (FP16 in, FP32 accumulate). The query heads are the
// mma's N dimension, so that a GQA group of 8 fills it (smaller groups leave columns, never
// rows, unused) and a page costs 16 mma:
//   S^T = K Q^T:  A = K [16 tokens x 16 dims], B = Q^T [16 dims x 8 heads]  (8 k-steps)
//   O^T += V^T P^T:  A = V^T [16 dims x 16 tokens], B = P^T [16 tokens x 8 heads]  (8 tiles)
// P^T comes from S^T's accumulators by one movmatrix transpose per 8 tokens. The fragments'
// layout is in fragments.cuh. Every format decodes exactly to FP16 (convert.cuh): FP8 codes by
// the hardware conversion, NVFP4 by placing the E2M1 bits in an FP16 (the value times 2^-14)
// and multiplying by the E4M3 micro-scale times 2^7 (exact; the kernel's scale undoes the
// 2^-7). FP32 scales apply to the logits (K) and to the probabilities (V, relative to a running
// V scale that is the unit of the output accumulator).
//
// Per page, the format's side kinds select compile-time layouts (DispatchSide); the running
// maximum is allowed to lag by up to 8 in log2 units (a factor of 2^8) so that most pages skip
// rescaling the accumulators (the decision is per warp, and the maxima are reduced across lanes
// only when it is taken).
// In a palette with smaller formats, all-FP16 pages (the recent tokens) are read straight from
// global memory, so that the shared memory per block, and the occupancy, follow the smaller
// formats, unless they are most of the batch's pages (PagedDecodeParams::stage_fp16).
//
// One step per page, each a function of decode_stages.cuh: stage (PageRing, stage_page.cuh),
// QK (ComputeLogits), softmax (OnlineSoftmax), PV (AccumulateValues), and with page weights the
// page's LSE per head (StorePageLse); then the epilogue merges the warps (StoreWarpState,
// MergeWarps).
#ifndef KVTIER_KERNELS_ATTENTION_DECODE_KERNEL_CUH_
#define KVTIER_KERNELS_ATTENTION_DECODE_KERNEL_CUH_

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attention/cp_async.cuh"
#include "kernels/attention/decode_stages.cuh"
#include "kernels/attention/page_weight.cuh"
#include "kernels/attention/stage_page.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"
#include "kvtier/page_tables.h"

namespace kvtier::gpu::attention {

// Stage: this warp's pages, first, first + kWarps, ... below the split's end, through its ring
// of kStages staged pages. Their table entries are read 32 at a time (lane l holds entry
// 32 n + l), a batch ahead.
template <int kWarps>
struct PageRing {
  uint8_t* ring;
  uint32_t ring_shared;  // the ring's shared-memory address
  uint32_t* ring_entry;  // the table entry of each slot
  const uint32_t* entries;
  int first, count, lane;
  uint32_t batch, next_batch;

  __device__ __forceinline__ uint32_t LoadBatch(int n) const {
    const int i = 32 * n + lane;
    return i < count ? entries[i * kWarps] : 0u;
  }

  // Starts staging the warp's page i (if any) in `slot`, as one commit group. kKinds and
  // kOneFormat as StagePage.
  template <uint32_t kKinds, bool kOneFormat = false>
  __device__ __forceinline__ void Stage(const PagedDecodeParams& p, int head, int i, int slot) {
    if (i < count) {
      if (i % 32 == 0 && i > 0) batch = next_batch, next_batch = LoadBatch(i / 32 + 1);
      const uint32_t entry = __shfl_sync(0xFFFFFFFFu, batch, i % 32);
      if (lane == 0) ring_entry[slot] = entry;
      StagePage<kKinds, kOneFormat>(p, entry, head, ring_shared + slot * p.stage_bytes, lane);
    }
    CommitCopies();  // an empty group keeps the count of pending groups uniform
  }
};

template <int kWarps, int kStages>
__device__ __forceinline__ PageRing<kWarps> RingOf(const PagedDecodeParams& p, uint8_t* smem,
                                                   const DecodeBlock& k) {
  PageRing<kWarps> r;
  r.ring = smem + k.warp * kStages * p.stage_bytes;
  r.ring_shared = SharedAddress(r.ring);
  r.ring_entry =
      reinterpret_cast<uint32_t*>(smem + kWarps * kStages * p.stage_bytes) + k.warp * kStages;
  r.first = k.page_begin + k.warp;
  r.count = r.first < k.page_end ? (k.page_end - r.first + kWarps - 1) / kWarps : 0;
  r.entries = p.packed + k.first_entry + r.first;
  r.lane = k.lane;
  r.batch = r.LoadBatch(0), r.next_batch = r.LoadBatch(1);
  return r;
}

// The warp's page i, landed in `slot`: its plan and where the stages read it. Clears the V of
// tokens past the sequence's end in a staged last page. kKinds and kOneFormat as StagePage.
template <uint32_t kKinds, bool kOneFormat, int kWarps>
__device__ __forceinline__ StagedPage OpenPage(const PagedDecodeParams& p,
                                               const PageRing<kWarps>& r,
                                               const DecodeBlock& k, int i, int slot) {
  StagedPage pg;
  const uint32_t entry = r.ring_entry[slot];
  const uint32_t format = FormatOf<kOneFormat>(entry);
  pg.plan = &p.plans[format];
  pg.kinds = kKinds == kAnyKinds ? pg.plan->kinds : kKinds;
  pg.page = r.ring + static_cast<uint32_t>(slot * p.stage_bytes);  // no sign extension
  pg.v_side = pg.page + pg.plan->v_at;
  pg.valid =
      min(kDecodeBlockTokens, k.seq_len - (r.first + i * kWarps) * kDecodeBlockTokens);
  pg.direct = pg.kinds & kDirectFp16;
  pg.direct_k = nullptr;
  pg.direct_v = 0;
  if (pg.direct) {
    pg.direct_k =
        p.pools[format].base +
        static_cast<uint64_t>(entry & kPackedPageMask) * p.pools[format].layout.page_bytes +
        pg.plan->src[0] + k.kv_head * 4096;
    pg.direct_v = pg.plan->src[1] - pg.plan->src[0];
  } else if (pg.valid < kDecodeBlockTokens) {
    ClearValuesPast(pg.v_side, (pg.kinds >> 3) & 7, pg.valid, k.lane);
    __syncwarp();
  }
  return pg;
}

// The block merge's shared memory (the rings' space, reused): each warp's outputs, in absolute
// units, then its maxima and sums, for the kRows heads of the group.
template <int kRows>
struct MergeArea {
  float (*out)[kRows][kDecodeHeadDim];
  float (*m)[kRows];
  float (*l)[kRows];
};

template <int kWarps, int kRows>
__device__ __forceinline__ MergeArea<kRows> MergeAreaOf(uint8_t* smem) {
  MergeArea<kRows> a;
  a.out = reinterpret_cast<float(*)[kRows][kDecodeHeadDim]>(smem);
  a.m = reinterpret_cast<float(*)[kRows]>(smem + sizeof(float) * kWarps * kRows * kDecodeHeadDim);
  a.l = a.m + kWarps;
  return a;
}

// Epilogue, 1: this warp's state to shared memory.
template <int kWarps, int kTiles>
__device__ __forceinline__ void StoreWarpState(uint8_t* smem, const DecodeBlock& k,
                                               const float (&m_run)[2 * kTiles],
                                               const float (&l_run)[2 * kTiles], float unit,
                                               const float (&o)[kTiles][8][4]) {
  const MergeArea<8 * kTiles> s = MergeAreaOf<kWarps, 8 * kTiles>(smem);
#pragma unroll
  for (int h = 0; h < 2 * kTiles; ++h) {
    const int row = 8 * (h / 2) + 2 * k.c + h % 2;
    const float l_sum = ReduceOverG<false>(l_run[h]);
    if (k.g == 0) {
      s.m[k.warp][row] = m_run[h];
      s.l[k.warp][row] = l_sum;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s.out[k.warp][row][16 * k.g + 2 * i] = o[h / 2][i][h % 2] * unit;
      s.out[k.warp][row][16 * k.g + 2 * i + 1] = o[h / 2][i][2 + h % 2] * unit;
    }
  }
}

// Epilogue, 2: merges the warps' states (thread d takes dim d of every head of the group) into
// the output, or into the workspace when the sequence is split.
template <int kWarps, int kTiles>
__device__ __forceinline__ void MergeWarps(const PagedDecodeParams& p, uint8_t* smem,
                                           const DecodeBlock& k) {
  constexpr int kD = kDecodeHeadDim;
  constexpr int kThreads = kWarps * 32;
  const MergeArea<8 * kTiles> s = MergeAreaOf<kWarps, 8 * kTiles>(smem);
  static_assert(kThreads % kDecodeHeadDim == 0, "whole rows of dims in the block merge");
  const int d = threadIdx.x % kD;
  const bool split_kv = p.num_splits > 1;
  for (int row = threadIdx.x / kD; row < k.group; row += kThreads / kD) {
    float m = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s.m[w][row]), nan |= isnan(s.l[w][row]);
    // A NaN logit (never a maximum) leaves a NaN sum, as does exp2(+inf - +inf) for a +inf
    // maximum: the head is NaN, as in the CPU reference, not empty.
    nan |= m == INFINITY;
    float total = 0.f, acc = 0.f;
    if (m != -INFINITY && !nan) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(s.m[w][row] - m);
        total += s.l[w][row] * f;
        acc += s.out[w][row][d] * f;
      }
    }
    const bool empty = !nan && !(total > 0.f);
    const float out = nan ? NAN : empty ? 0.f : acc / total;
    const float lse = nan ? NAN : empty ? -INFINITY : (m + log2f(total)) * kLn2;
    const int64_t out_row = static_cast<int64_t>(k.b) * p.num_q_heads + k.kv_head * k.group + row;
    if (split_kv) {
      const int64_t rows = static_cast<int64_t>(p.batch) * p.num_q_heads;
      p.workspace[(k.split * rows + out_row) * kD + d] = out;
      if (d == 0) {
        p.workspace[static_cast<int64_t>(p.num_splits) * rows * kD + k.split * rows + out_row] =
            lse;
      }
    } else {
      p.out[out_row * kD + d] = out;
      if (d == 0) p.lse[out_row] = lse;
    }
  }
}

// kTiles: query-head tiles of 8 (1 when the GQA group fits in 8 heads, else 2). kStages: the
// depth of each warp's ring (kShallowStages or kDeepStages, stage_page.cuh). kPageLse: with
// page weights (p.page_lse set), how each page's LSE per head is stored there (page_weight.cuh).
// Without them (kNone) the page sums are never used and compile away: the kernel does no extra
// work. kUniformV: every format of the palette has one V scale per page (OnlineSoftmax). kKinds:
// the side kinds every format of the palette has (kNvfp4Kinds, kE4M3Kinds), or kAnyKinds.
// kWarps: 4 or 8 warps a block.
template <int kWarps, int kTiles, int kStages, PageLse kPageLse, bool kUniformV, uint32_t kKinds>
// At most 128 registers for one tile of query heads (16 warps an SM), 255 for two (8): a cap,
// not __launch_bounds__, since with a 256-thread bound ptxas kept the 8-warp NVFP4 loop at 106
// registers and re-read the thread index in it (516 instructions a page against 470).
__global__ void __maxnreg__(kTiles == 1 ? 128 : 255)
    PagedDecodeKernel(const __grid_constant__ PagedDecodeParams p) {
  constexpr bool kPageWeights = kPageLse != PageLse::kNone;
  extern __shared__ __align__(16) uint8_t smem[];
  // The page tables, which only copies write (CudaDecodeTables), are read while the kernel
  // before may still run; the queries and pages after it (LaunchDependent). Dependents start as
  // this kernel's blocks exit: scheduled at its start (TriggerDependents), their waiting blocks
  // slowed it by 1-4%; scheduled once every block was past its pages, batch 1 x 8K steps back to
  // back by 18-20% (docs/benchmarks.md, session 13).
  const DecodeBlock k = BlockOf(p);
  PageRing<kWarps> ring = RingOf<kWarps, kStages>(p, smem, k);
  WaitForPriorKernels();
  // The queries' reads are issued first, then the first pages' copies, then the queries are
  // packed (a barrier where staged): the two latencies overlap, and the reads do not queue behind
  // the copies. With rotated queries, whose rotation uses the ring's memory, the copies follow.
  const auto stage_first = [&] {
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) ring.template Stage<kKinds>(p, k.kv_head, i, i);
  };
  constexpr bool kSharedQuery = QueryInSharedMemory(kKinds);
  constexpr bool kStagedQuery = QueryStagedInSharedMemory(kKinds, kPageWeights);
  QueryFragments<kTiles, kSharedQuery> query;
  uint4* const staged =
      reinterpret_cast<uint4*>(smem + RingBytes(kWarps, kStages, p.stage_bytes)) + k.lane;
  if constexpr (kSharedQuery) query.base = staged;
  if (!p.rotate_queries) {
    QueryValues<kTiles> values;
    ReadQuery<kStagedQuery>(QueryRows(p, k), k, values);
    stage_first();
    PackQuery<kStagedQuery>(p, k, values, staged, query);
  } else {
    LoadRotatedQuery<kStagedQuery>(p, k, smem, staged, query);
    stage_first();
  }
  float m_run[2 * kTiles], l_run[2 * kTiles];
  float unit = 1.f, inv_unit = 1.f;
  float o[kTiles][8][4];
  InitState<kTiles>(m_run, l_run, o);

  PageLseStore<kTiles> page_lse{};
  if constexpr (kPageWeights) page_lse = PageLseStoreOf<kWarps, kTiles>(p, k, ring.first);
  // The page loop, compiled twice in a palette's own kernel: for a palette of one format (its
  // plan and pool as constants, FormatOf: 17% fewer instructions a page of E4M3, docs/attention.md)
  // and for several.
  const auto pages = [&](auto one_format) {
    constexpr bool kOneFormat = decltype(one_format)::value;
    for (int i = 0, slot = 0; i < ring.count; ++i, slot = slot == kStages - 1 ? 0 : slot + 1) {
      ring.template Stage<kKinds, kOneFormat>(p, k.kv_head, i + kStages - 1,
                                              slot == 0 ? kStages - 1 : slot - 1);
      WaitCopies<kStages - 1>();  // page i has landed (this lane's copies)
      __syncwarp();               // ... and every lane's
      const StagedPage pg = OpenPage<kKinds, kOneFormat>(p, ring, k, i, slot);
      float s[kTiles][4];
      ComputeLogits<kTiles, kKinds>(pg, k.g, k.c, query, s);
      uint32_t pb[kTiles][2], pair_sums[kTiles];
      OnlineSoftmax<kTiles, kUniformV>(p, pg, k.g, s, m_run, l_run, unit, inv_unit, o, pb,
                                       pair_sums);
      if constexpr (kPageWeights) StorePageLse<kTiles, kPageLse>(p, page_lse, m_run, pair_sums);
      AccumulateValues<kTiles>(pg, k.g, k.c, pb, o);
      __syncwarp();  // the buffer is refilled by the next iteration's Stage()
    }
  };
  if constexpr (kKinds != kAnyKinds) {
    if (p.num_formats == 1) {
      pages(std::true_type());
    } else {
      pages(std::false_type());
    }
  } else {
    pages(std::false_type());
  }
  WaitCopies<0>();
  __syncthreads();  // the rings are reused below

  StoreWarpState<kWarps, kTiles>(smem, k, m_run, l_run, unit, o);
  __syncthreads();
  MergeWarps<kWarps, kTiles>(p, smem, k);
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_DECODE_KERNEL_CUH_
