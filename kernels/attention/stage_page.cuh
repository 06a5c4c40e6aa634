// Staging pages in shared memory for the decode kernel (kernels/attention/): each warp streams
// its pages through a ring of staged pages with cp.async (kShallowStages or kDeepStages deep),
// so that the loads of the next pages are in flight while it computes on this one. A staged
// page holds one KV head of one page: [K rows][K micro-scales][V rows][V micro-scales] as the
// format's plan lays them out (PagedDecodeParams::FormatPlan), then 16 K and 16 V FP32 scales
// at `scales_at`.
#ifndef KVTIER_KERNELS_ATTENTION_STAGE_PAGE_CUH_
#define KVTIER_KERNELS_ATTENTION_STAGE_PAGE_CUH_

#include <cstdint>

#include "kernels/attention/cp_async.cuh"
#include "kernels/attention/side_kind.cuh"
#include "kernels/decode_attention.cuh"
#include "kvtier/page_tables.h"

namespace kvtier::gpu::attention {

// The depths of a warp's ring the kernel is compiled for. Every block keeps kWarps x (depth - 1)
// pages in flight; the planner (decode_launch.cu) takes the deep ring when it fits the blocks
// that the registers allow on a multiprocessor, which small pages (NVFP4) need: with 3 stages an
// NVFP4 page of 2.4 KB left 77 KB in flight per multiprocessor, too few for the read roof.
constexpr int kShallowStages = 3;
constexpr int kDeepStages = 5;

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
    Copy4(scale, page + plan.scale_src[side] + 4 * (head * count + slot));
  } else if (count == 0 && slot == 0) {
    StoreShared(scale, plan.fill[side]);
  }
}

// Zeroes the V rows (and per-token micro-scales) of tokens valid..15 of a staged page, so that
// whatever the cache holds past a sequence's end cannot reach the output. Rare: the last page,
// so it stays a call (noinline); static, as the file-local function the SASS was checked with.
static __device__ __noinline__ void ClearValuesPast(uint8_t* v_side, uint32_t kind, int valid,
                                                    int lane) {
  const uint32_t row = RowBytes(kind);
  for (uint32_t at = valid * row + 4 * lane; at < 16 * row; at += 128) {
    *reinterpret_cast<uint32_t*>(v_side + at) = 0;
  }
  // Micro-scales along head_dim: 8 per token, so lane l clears those of token l / 2.
  if (kind == kNvfp4DimSide && lane >= 2 * valid) {
    *reinterpret_cast<uint32_t*>(v_side + 16 * row + 4 * lane) = 0;
  }
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_STAGE_PAGE_CUH_
