// The occupancy of the migration kernel (kernels/migrate.cu): how many blocks of 8 warps it is
// compiled to fit on one SM. More warps keep more loads in flight; fewer leave each thread more
// registers for independent work. Host logic, shared by the CUDA backend, its benchmark and the
// CPU tests (no CUDA header).
#ifndef KVTIER_KERNELS_MIGRATE_OCCUPANCY_H_
#define KVTIER_KERNELS_MIGRATE_OCCUPANCY_H_

#include <cstdint>
#include <string_view>
#include <utility>

#include "kernels/page_layout.h"

namespace kvtier::gpu {

// kAuto picks per source and destination format (RequantizeBlocksPerSm); the others force 2,
// 3, 4 or 5 blocks per SM (benchmarks and tests: KVTIER_CUDA_MIGRATE).
enum class RequantizeVariant : uint8_t {
  kAuto,
  kTwoBlocksPerSm,
  kThreeBlocksPerSm,
  kFourBlocksPerSm,
  kFiveBlocksPerSm,
};

// Blocks per SM of a migration from pages laid out as `src` (FP16, BF16 or FP8 E4M3) into pages
// laid out as `dst`. kAuto: where either side of `dst` is NVFP4, whose encoding needs more
// instructions per value than loads can hide at 3, 5 from all-E4M3 sources (their kernel fits
// 48 registers; 1.5% faster than at 4 on the H200, 4% on an H100) and 4 from the others; 3
// otherwise (FP8 destinations, which lose about 8% at 4). Measurements: docs/benchmarks.md,
// 2026-12-02 and session 24.
inline int RequantizeBlocksPerSm(RequantizeVariant variant, const PageLayout& src,
                                 const PageLayout& dst) {
  switch (variant) {
    case RequantizeVariant::kTwoBlocksPerSm:
      return 2;
    case RequantizeVariant::kThreeBlocksPerSm:
      return 3;
    case RequantizeVariant::kFourBlocksPerSm:
      return 4;
    case RequantizeVariant::kFiveBlocksPerSm:
      return 5;
    case RequantizeVariant::kAuto:
      break;
  }
  const bool nvfp4 = dst.k.type == ElementType::kNvfp4 || dst.v.type == ElementType::kNvfp4;
  const bool e4m3 = src.k.type == ElementType::kFp8E4M3 && src.v.type == ElementType::kFp8E4M3;
  return !nvfp4 ? 3 : e4m3 ? 5 : 4;
}

// The variant that KVTIER_CUDA_MIGRATE's value names: "2" to "5" blocks per SM, or "auto".
// Returns false, leaving *variant unchanged, for any other value.
inline bool ParseRequantizeVariant(std::string_view value, RequantizeVariant* variant) {
  constexpr std::pair<std::string_view, RequantizeVariant> kNames[] = {
      {"auto", RequantizeVariant::kAuto},
      {"2", RequantizeVariant::kTwoBlocksPerSm},
      {"3", RequantizeVariant::kThreeBlocksPerSm},
      {"4", RequantizeVariant::kFourBlocksPerSm},
      {"5", RequantizeVariant::kFiveBlocksPerSm},
  };
  for (const auto& [name, v] : kNames) {
    if (value == name) {
      *variant = v;
      return true;
    }
  }
  return false;
}

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_MIGRATE_OCCUPANCY_H_
