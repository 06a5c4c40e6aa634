// The codecs one side (K or V) of a page can be in, as the decode kernel reads them
// (kernels/attention/), and the dispatch from a runtime kind to code compiled for that kind.
// Used by the kernel and by the host planner (decode_launch.cu) that sets each format's kinds.
#ifndef KVTIER_KERNELS_ATTENTION_SIDE_KIND_CUH_
#define KVTIER_KERNELS_ATTENTION_SIDE_KIND_CUH_

#include <cstdint>
#include <type_traits>

namespace kvtier::gpu::attention {

// Each kind has a compile-time staged layout, [16 token rows][128 micro-scale bytes, NVFP4 only].
enum SideKind : uint32_t { kFp16Side, kE4M3Side, kE5M2Side, kNvfp4DimSide, kNvfp4TokenSide };
// FormatPlan::kinds bit of an all-FP16 format whose pages are read straight from global memory
// instead of staged (in a mixed palette, so that the staged pages of the smaller formats set the
// shared memory per block, and with it the occupancy).
constexpr uint32_t kDirectFp16 = 1u << 8;
// FormatPlan::kinds of every format of a palette, as a kernel's template argument: kAnyKinds when
// the formats differ (each page's kinds are read from its plan), or the one pair of side kinds
// (K | V << 3) of a palette whose formats all share it, so that the dispatch compiles away.
constexpr uint32_t kAnyKinds = ~0u;
constexpr uint32_t kNvfp4Kinds = kNvfp4DimSide | kNvfp4DimSide << 3;
constexpr uint32_t kE4M3Kinds = kE4M3Side | kE4M3Side << 3;

// Bytes of one token row of a side of `kind` (NVFP4 micro-scales, 128 bytes, follow the rows).
__host__ __device__ constexpr uint32_t RowBytes(uint32_t kind) {
  return kind == kFp16Side ? 256 : kind <= kE5M2Side ? 128 : 64;
}

template <uint32_t kKind>
using Side = std::integral_constant<uint32_t, kKind>;

// Calls f(Side<kind>()) for the side kind `kind` (warp-uniform), so that f is compiled once
// per kind with its layout known. The kinds are tested in turn, NVFP4 first: its pages are the
// ones whose decode is bound by instruction issue (a switch took 3 compares and branches).
template <typename F>
__device__ __forceinline__ void DispatchSide(uint32_t kind, F&& f) {
  if (kind == kNvfp4DimSide) {
    f(Side<kNvfp4DimSide>());
  } else if (kind == kNvfp4TokenSide) {
    f(Side<kNvfp4TokenSide>());
  } else if (kind == kE4M3Side) {
    f(Side<kE4M3Side>());
  } else if (kind == kE5M2Side) {
    f(Side<kE5M2Side>());
  } else {
    f(Side<kFp16Side>());
  }
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_SIDE_KIND_CUH_
