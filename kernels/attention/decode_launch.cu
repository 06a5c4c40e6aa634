// The host side of kvtier's fused decode attention (contract in kernels/decode_attention.cuh):
// each palette format's staging plan, the split of a batch's pages that fills the GPU, and the
// launch of PagedDecodeKernel (decode_kernel.cuh) followed, for a split batch, by the merge of
// its partial states (merge_states.cu), and with page weights, their blocks (page_weight.cu).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/attention/decode_kernel.cuh"
#include "kernels/attention/merge_states.cuh"
#include "kernels/attention/page_weight.cuh"
#include "kernels/attention/side_kind.cuh"
#include "kernels/attention/stage_page.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"

namespace kvtier::gpu {
namespace {

using attention::kDirectFp16;
using attention::kE4M3Side;
using attention::kE5M2Side;
using attention::kFp16Side;
using attention::kNvfp4DimSide;
using attention::kNvfp4TokenSide;
using attention::kDeepStages;
using attention::kShallowStages;
using attention::kMostWarps;
using attention::PagedDecodeKernel;
using attention::PageLse;

bool AllFp16(const PageLayout& l) {
  return l.k.type == ElementType::kFp16 && l.v.type == ElementType::kFp16;
}

// FP32 scales per head that a page of layout l holds for side c: none for FP16 (unscaled),
// else PageScalesPerHead (16 per token, 1 per block, 0 per tensor).
uint32_t SideScalesPerHead(const PageLayout& l, const CodecLayout& c) {
  return c.type == ElementType::kFp16
             ? 0
             : PageScalesPerHead(CodecSpec{c.type, c.scope, c.axis}, l.tokens);
}

// Fills k's format plans, stage_bytes and scales_at from its pools. Returns false for a layout
// the kernel does not read (BF16, a page other than 16 tokens x head_dim 128).
bool PlanStaging(PagedDecodeParams& k) {
  bool mixed = false;  // all-FP16 formats next to smaller ones are read directly, unless staged
  const float logit_scale = k.softmax_scale * attention::kLog2e;  // logits in log2 units
  for (int f = 0; f < k.num_formats; ++f) mixed |= !AllFp16(k.pools[f].layout);
  mixed &= !k.stage_fp16;
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
      plan.scale_count[side] = SideScalesPerHead(l, c);
      plan.scale_src[side] = plan.scale_count[side] > 0 ? l.ScaleOffset(c, 0, 0) : 0;
      const float fill = plan.scale_count[side] > 0 ? 0.f : scaled ? tensor[side] : 1.f;
      const float mul = nvfp4 ? 128.f : 1.f;
      plan.scale_mul[side] = side == 0 ? mul * logit_scale : mul;
      plan.scale_add[side] = fill == 0.f ? 0.f : fill * plan.scale_mul[side];  // 0, not 0 x inf
      plan.kinds |= kind << (3 * side);
    }
    plan.v_at = side_bytes[0];
    k.stage_bytes =
        std::max<int32_t>(k.stage_bytes, (side_bytes[0] + side_bytes[1] + 15) / 16 * 16);
  }
  k.scales_at = k.stage_bytes;
  k.stage_bytes += 32 * sizeof(float);
  return true;
}

using Kernel = void (*)(PagedDecodeParams);

// The kKinds of the kernels for palettes with kernels of their own (kAnyKinds: the generic one).
constexpr uint32_t kPaletteKinds[] = {attention::kAnyKinds, attention::kNvfp4Kinds,
                                      attention::kE4M3Kinds};

// Every instance of the kernel, instance i = ((((eight * 3 + kinds) * 2 + wide) * 2 + deep) * 3 +
// PageLse) * 2 + uniform V scales (KernelIndex): kWarps 4 or 8 (eight), kKinds =
// kPaletteKinds[kinds], kTiles 1 or 2 (wide), the shallow or deep ring, the page LSE store, and
// kUniformV.
template <size_t i>
constexpr Kernel kInstance =
    PagedDecodeKernel<i / 72 == 1 ? 8 : 4, static_cast<int>(i / 12 % 2) + 1,
                      (i / 6) % 2 == 1 ? kDeepStages : kShallowStages,
                      static_cast<PageLse>(i / 2 % 3), i % 2 == 1, kPaletteKinds[i / 24 % 3]>;
template <size_t... i>
constexpr std::array<Kernel, sizeof...(i)> Instances(std::index_sequence<i...>) {
  return {kInstance<i>...};
}
constexpr std::array<Kernel, 144> kKernels = Instances(std::make_index_sequence<144>());

constexpr size_t KernelIndex(int warps, size_t kinds, bool wide, bool deep, PageLse store,
                             bool uniform_v) {
  const size_t eight = warps == 8;
  return ((((eight * 3 + kinds) * 2 + wide) * 2 + deep) * 3 + static_cast<size_t>(store)) * 2 +
         uniform_v;
}

// The index in kPaletteKinds of the kernel for k's palette: the side kinds every format has, if
// they have kernels of their own, else 0 (kAnyKinds).
size_t PaletteKinds(const PagedDecodeParams& k) {
  for (size_t i = 1; i < std::size(kPaletteKinds); ++i) {
    bool all = true;
    for (int f = 0; f < k.num_formats; ++f) all = all && k.plans[f].kinds == kPaletteKinds[i];
    if (all) return i;
  }
  return 0;
}

// Shared memory a multiprocessor gives its blocks (H100, H200: 228 KB), less the 1 KB the
// runtime keeps per block, divided among the blocks that the registers allow (the kernel's
// register cap: 16 warps an SM with one query-head tile, 8 with two).
constexpr size_t kSharedPerSm = 228 * 1024;
constexpr size_t kSharedReservedPerBlock = 1024;

// The most dynamic shared memory a launch asks for (FP16 K and V, the largest staged page, in
// the shallow ring, and two tiles of Q^T fragments), the kernels' opt-in limit.
constexpr size_t kMostSmem =
    attention::RingBytes(kMostWarps, kShallowStages,
                         2 * kDecodeBlockTokens * kDecodeHeadDim * 2 + 32 * 4) +
    2 * attention::kQueryBytesPerTile;

// The kernel of `warps` warps a block for k's GQA group (keeping page weights or not) and its
// dynamic shared memory: the staging rings (and the Q^T fragments where they are staged,
// QueryStagedInSharedMemory), or the block's merge of its warps' states if larger. The deep ring
// when it fits beside as many blocks as the registers allow (small pages: NVFP4), else the
// shallow one.
struct KernelLaunch {
  Kernel kernel;
  int smem;
  int threads;
};
KernelLaunch KernelFor(const PagedDecodeParams& k, int warps) {
  const bool wide = k.num_q_heads / k.num_kv_heads > 8;
  const size_t group_rows = wide ? 16 : 8;
  const size_t blocks_by_registers = (wide ? 8 : 16) / warps;
  const size_t kinds = PaletteKinds(k);
  const PageLse store = k.page_weight == nullptr ? PageLse::kNone
                        : PageLsesKeptInL2(k)    ? PageLse::kKeptInL2
                                                 : PageLse::kStored;
  const auto ring = [&](int stages) {
    return static_cast<size_t>(attention::RingBytes(warps, stages, k.stage_bytes)) +
           (attention::QueryStagedInSharedMemory(kPaletteKinds[kinds], store != PageLse::kNone)
                ? (wide ? 2 : 1) * attention::kQueryBytesPerTile
                : 0);
  };
  const size_t deep_ring = ring(kDeepStages);
  const bool deep = deep_ring <= kMostSmem &&
                    blocks_by_registers * (deep_ring + kSharedReservedPerBlock) <= kSharedPerSm;
  const size_t merge = warps * group_rows * (kDecodeHeadDim + 2) * sizeof(float);
  return {kKernels[KernelIndex(warps, kinds, wide, deep, store, ValueScalesUniform(k))],
          static_cast<int>(std::max(ring(deep ? kDeepStages : kShallowStages), merge)),
          32 * warps};
}

// Raises the kernels' opt-in shared memory limit on the current device, once per device, to
// kMostSmem.
cudaError_t RaiseSharedLimit() {
  static std::atomic<uint64_t> raised{0};  // bit d: device d (devices past 63: every launch)
  int device = 0;
  const cudaError_t got = cudaGetDevice(&device);
  if (got != cudaSuccess) return got;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if ((raised.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  for (const Kernel f : kKernels) {
    const cudaError_t r = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMostSmem));
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

// The merge of a split launch's partial states (in p.workspace) into p.out and p.lse, with page
// weights in the same grid.
cudaError_t LaunchSplitMerge(const PagedDecodeParams& p, cudaStream_t stream) {
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
  return p.page_weight != nullptr ? LaunchMergeAndPageWeights(m, p, stream)
                                  : LaunchMergeStates(m, stream);
}

}  // namespace

bool FavoursStagedFp16(const PagedDecodeParams& p, const int64_t* entries_of) {
  int64_t fp16 = 0, all = 0;
  for (int f = 0; f < p.num_formats; ++f) {
    fp16 += AllFp16(p.pools[f].layout) ? entries_of[f] : 0;
    all += entries_of[f];
  }
  return FavoursStagedFp16(fp16, all);
}

uint32_t DecodeKernelKinds(const PagedDecodeParams& p) {
  PagedDecodeParams k = p;
  if (p.num_formats < 1 || p.num_formats > kDecodeMaxFormats || !PlanStaging(k)) return 0;
  return kPaletteKinds[PaletteKinds(k)];
}

cudaError_t ChooseDecodeSplit(const PagedDecodeParams& p, int32_t max_pages, int32_t num_sms,
                              DecodeSplit* split) {
  PagedDecodeParams k = p;
  if (!ValidShapes(p) || !PlanStaging(k)) return cudaErrorInvalidValue;
  k.page_weight = nullptr;  // the plain kernel's residency: the split, and the bits, are the same
  const cudaError_t raised = RaiseSharedLimit();
  if (raised != cudaSuccess) return raised;
  // One wave: as many splits as fill the resident blocks of every multiprocessor, with at least
  // 8 pages per split so that the merge stays small next to the attention, and no more splits
  // than the parts the merge loads in one round (kMergeLoadsAtOnce) nor than one per 64 pages
  // (rounded up), whichever is more: at batch 1 from 8K to 48K tokens a merge round more costs
  // more than the shorter splits save (NVFP4, FP8 and the balanced mix 5-10% faster,
  // docs/benchmarks.md, session 16).
  const int64_t blocks = std::max<int64_t>(1, static_cast<int64_t>(p.batch) * p.num_kv_heads);
  const int64_t most =
      std::max<int64_t>({1, std::min<int64_t>(attention::kMergeLoadsAtOnce, (max_pages + 7) / 8),
                         (max_pages + 63) / 64});
  // The split with blocks of `warps` warps, and that kernel's resident blocks an SM.
  const auto split_for = [&](int warps, int* per_sm) {
    const KernelLaunch launch = KernelFor(k, warps);
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        per_sm, launch.kernel, launch.threads, launch.smem);
    if (e != cudaSuccess) return e;
    const int64_t want = std::max<int64_t>(1, *per_sm) * num_sms / blocks;
    const int32_t splits = static_cast<int32_t>(std::max<int64_t>(1, std::min(want, most)));
    const int32_t per = std::max<int32_t>(1, (max_pages + splits - 1) / splits);
    *split = {static_cast<int32_t>((std::max(max_pages, 1) + per - 1) / per), per, warps};
    return cudaSuccess;
  };
  // Eight warps a block where 8-warp blocks still fill 16 warps an SM, for a split launch or
  // sequences of at least kEightWarpPages pages: each warp's chain of pages halves at the same
  // split count, which is what a short batch waits for (batch 1 x 8K NVFP4 11% faster on an
  // H100), and long unsplit NVFP4 sequences ran 3% faster; four otherwise: an unsplit launch of
  // short sequences in 8-warp blocks runs in twice the waves, each paying the block's fixed cost
  // (batch 64 x 1K NVFP4 16% slower), and staged FP16 pages fit one 8-warp block an SM, which
  // halves the split (docs/benchmarks.md, session 34).
  constexpr int32_t kEightWarpPages = 512;
  int per_sm = 0;
  const cudaError_t eight = split_for(8, &per_sm);
  if (eight != cudaSuccess) return eight;
  if (per_sm >= 2 && (split->num_splits > 1 || max_pages >= kEightWarpPages)) return cudaSuccess;
  return split_for(4, &per_sm);
}

bool ValueScalesUniform(const PagedDecodeParams& p) {
  for (int f = 0; f < p.num_formats; ++f) {
    const PageLayout& l = p.pools[f].layout;
    if (SideScalesPerHead(l, l.v) > 1) return false;
  }
  return true;
}

int64_t DecodeWorkspaceFloats(int32_t batch, int32_t num_q_heads, int32_t num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<int64_t>(num_splits) * batch * num_q_heads * (kDecodeHeadDim + 1);
}

cudaError_t LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream) {
  if (!ValidShapes(p) || p.num_splits < 1 || p.pages_per_split < 1 ||
      (p.warps_per_block != 4 && p.warps_per_block != 8) ||
      (p.num_splits > 1 && p.workspace == nullptr) ||
      (p.page_weight != nullptr &&
       (p.page_lse == nullptr || reinterpret_cast<uintptr_t>(p.page_lse) % sizeof(float2) != 0))) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  PagedDecodeParams k = p;
  if (!PlanStaging(k)) return cudaErrorInvalidValue;
  const cudaError_t raised = RaiseSharedLimit();
  if (raised != cudaSuccess) return raised;
  const KernelLaunch launch = KernelFor(k, p.warps_per_block);
  const dim3 grid(p.num_splits, p.num_kv_heads, p.batch);
  cudaError_t e =
      LaunchDependent(launch.kernel, grid, dim3(launch.threads), launch.smem, stream, k);
  if (e != cudaSuccess) return e;
  if (p.num_splits > 1) return LaunchSplitMerge(p, stream);
  return p.page_weight != nullptr ? LaunchPageWeights(p, stream) : cudaSuccess;
}

}  // namespace kvtier::gpu
