// FlashInfer: BatchDecode/BatchPrefillWithPagedKVCacheWrapper's paged_kv_indptr / indices /
// last_page_len for each part, and each (format, layer) pool as paged_kv_cache (HND).
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_FLASHINFER_H_
#define KVTIER_ADAPTERS_FLASHINFER_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/adapters/tensor_view.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// The parts of `tables` for FlashInfer (PartitionByFormat after CheckReadable on each format
// present). indptr/indices/last_page_len are what plan() takes (int32).
KVTIER_EXPORT absl::StatusOr<std::vector<FormatPart>> BuildFlashInferParts(
    const Options& options, const PageTables& tables);

// One (format, layer) pool as FlashInfer's paged_kv_cache, HND.
struct FlashInferLayer {
  // [P, 2, H, S, D] of FP16/BF16/FP8, or [P, 2, H, S, D/2] of packed FP4 (uint8) for NVFP4.
  // K at [:, 0] and V at [:, 1] have identical strides; P is the pool's page capacity.
  TensorView kv;
  // NVFP4 only: the E4M3 micro-scales as FlashInfer's kv_cache_sf, [P, 2, H, S, D/16].
  std::optional<TensorView> kv_cache_sf;
  // FlashInfer's k_scale / v_scale (kvtier/adapters/scale_conventions.h, kFlashInferKVScale);
  // 1 for FP16/BF16.
  float k_scale = 1.f;
  float v_scale = 1.f;
};
KVTIER_EXPORT absl::StatusOr<FlashInferLayer> GetFlashInferLayer(const Cache& cache,
                                                                 int32_t format, int32_t layer);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_FLASHINFER_H_
