// Staging pages in shared memory for the decode kernel (kernels/attention/): each warp streams
// its pages through a ring of staged pages with cp.async (kShallowStages or kDeepStages deep),
// so that the loads of the next pages are in flight while it computes on this one. A staged
// page holds one KV head of one page: [K rows][K micro-scales][V rows][V micro-scales] as the
// format's plan lays them out (PagedDecodeParams::FormatPlan), then 16 K and 16 V FP32 scales
// at `scales_at`.
#ifndef KVTIER_KERNELS_ATTENTION_STAGE_PAGE_CUH_
#define KVTIER_KERNELS_ATTENTION_STAGE_PAGE_CUH_

#include <cstdint>
#include <type_traits>

#include "kernels/attention/cp_async.cuh"
#include "kernels/attention/side_kind.cuh"
#include "kernels/decode_attention.cuh"
#include "kvtier/page_tables.h"

namespace kvtier::gpu::attention {

// The depths of a warp's ring the kernel is compiled for. Every block keeps its warps x (depth - 1)
// pages in flight; the planner (decode_launch.cu) takes the deep ring when it fits the blocks
// that the registers allow on a multiprocessor, which small pages (NVFP4) need: with 3 stages an
// NVFP4 page of 2.4 KB left 77 KB in flight per multiprocessor, too few for the read roof.
constexpr int kShallowStages = 3;
constexpr int kDeepStages = 5;

// The staged bytes of a side's 16 token rows, as a compile-time constant (DispatchRows).
template <uint32_t kRows>
using Rows = std::integral_constant<uint32_t, kRows>;

// Calls f(Rows<bytes>()) with the staged bytes of the 16 token rows of a side of kind `kind`
// (warp-uniform): 4096 (FP16), 2048 (FP8) or 1024 (NVFP4, whose 128 bytes of micro-scales
// follow the rows).
template <typename F>
__device__ __forceinline__ void DispatchRows(uint32_t kind, F&& f) {
  if (kind == kFp16Side) {
    f(Rows<4096>());
  } else if (kind <= kE5M2Side) {
    f(Rows<2048>());
  } else {
    f(Rows<1024>());
  }
}

// Starts copying one side of a page's head into a staged page at shared address dst: kRows
// bytes of token rows from `rows` (lane l: 16-byte chunks l, l + 32, ...), then, for NVFP4, the
// 128 bytes of micro-scales from `micro` (lane l: bytes 4l..4l+3, so that every lane copies and
// no copy needs a branch).
template <uint32_t kRows>
__device__ __forceinline__ void StageSide(uint32_t dst, const uint8_t* rows, const uint8_t* micro,
                                          uint32_t lane) {
#pragma unroll
  for (uint32_t i = 0; i < kRows / 512; ++i) Copy16(dst + 16 * lane + 512 * i, rows + 512 * i);
  if constexpr (kRows == 1024) Copy4(dst + kRows + 4 * lane, micro, 4);
}

// The palette format of the page `entry` names. kOneFormat: the palette has one format (a
// palette kernel's run-time branch, PagedDecodeKernel), 0 at compile time, so that its plan and
// pool are operands from the parameters' constant bank, not loaded per page at an index.
template <bool kOneFormat>
__device__ __forceinline__ uint32_t FormatOf(uint32_t entry) {
  return kOneFormat ? 0u : entry >> kPackedFormatShift;
}

// Starts copying the data of `head` in the page `entry` names into the staged page at shared
// address dst as the format's plan says, then the 16 K and 16 V scales (lanes 0-15 and 16-31),
// slot t holding token t's scale: a per-token scale in each slot, a per-block one in every slot,
// and 0 where the side has none in the page (ScaleLogits adds FormatPlan::scale_add); with 0, 1
// or 16 scales per head, slot & (count - 1) is the slot's scale. One straight run of copies per
// pair of side kinds, so that ptxas pads one block of cp.async, not one per side. kKinds: the
// palette's kinds when every format has the same (kAnyKinds: the plan's); kOneFormat as
// FormatOf.
template <uint32_t kKinds, bool kOneFormat>
__device__ __forceinline__ void StagePage(const PagedDecodeParams& p, uint32_t entry, int head,
                                          uint32_t dst, int lane) {
  const uint32_t format = FormatOf<kOneFormat>(entry);
  const PagedDecodeParams::FormatPlan& plan = p.plans[format];
  const uint8_t* page = p.pools[format].base + static_cast<uint64_t>(entry & kPackedPageMask) *
                                                   p.pools[format].layout.page_bytes;
  asm("" : "+l"(page));  // one base for every copy's address: ptxas would fold each offset into
                         // its own wide multiply-add (docs/attention.md)
  const uint32_t kinds = kKinds == kAnyKinds ? plan.kinds : kKinds, h = head, l = lane;
  const uint32_t side = l / 16, slot = l % 16, count = plan.scale_count[side];
  const uint8_t* scale = page + (plan.scale_src[side] + 4 * (h * count + (slot & (count - 1))));
  const auto stage_scale = [&] { Copy4(dst + p.scales_at + 4 * l, scale, count > 0 ? 4 : 0); };
  if (kinds & kDirectFp16) {
    stage_scale();
    return;
  }
  DispatchRows(kinds & 7, [&](auto k) {
    DispatchRows((kinds >> 3) & 7, [&](auto v) {
      constexpr uint32_t kK = decltype(k)::value, kV = decltype(v)::value;
      StageSide<kK>(dst, page + (plan.src[0] + h * kK + 16 * l),
                    page + (plan.src[2] + h * 128 + 4 * l), l);
      StageSide<kV>(dst + plan.v_at, page + (plan.src[1] + h * kV + 16 * l),
                    page + (plan.src[3] + h * 128 + 4 * l), l);
      stage_scale();
    });
  });
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
