// FlashInfer: the parts' CSR tables and each pool as paged_kv_cache (HND).
#include "kvtier/adapters/flashinfer.h"

#include "adapters/adapter_internal.h"
#include "kernels/page_layout.h"
#include "kvtier/adapters/scale_conventions.h"
#include "kvtier/adapters/target.h"
#include "src/status_macros.h"

namespace kvtier {

using adapter_internal::GetPoolAndFormat;
using adapter_internal::MakeView;
using adapter_internal::PoolAndFormat;
using adapter_internal::ViewTypeOf;

absl::StatusOr<std::vector<FormatPart>> BuildFlashInferParts(const Options& options,
                                                             const PageTables& tables) {
  return adapter_internal::ReadableParts(AdapterTarget::kFlashInfer, options, tables);
}

absl::StatusOr<FlashInferLayer> GetFlashInferLayer(const Cache& cache, int32_t format,
                                                   int32_t layer) {
  KVTIER_ASSIGN_OR_RETURN(const PoolAndFormat p,
                          GetPoolAndFormat(AdapterTarget::kFlashInfer, cache, format, layer));
  const Geometry& g = p.geometry;
  const int64_t h = g.num_kv_heads, s = g.block_tokens, d = g.head_dim;
  const ElementType type = p.format.k.type;
  const ViewDType dtype = ViewTypeOf(type);
  const int64_t e = ViewDTypeBytes(dtype);
  // Elements of the last dimension: D values, or D/2 bytes of packed FP4.
  const int64_t last = type == ElementType::kNvfp4 ? d / 2 : d;
  FlashInferLayer out;
  out.kv = MakeView(p, p.pool.k_offset, dtype, {p.pool.capacity_pages, 2, h, s, last},
                    {p.pool.page_bytes / e, (p.pool.v_offset - p.pool.k_offset) / e, s * last,
                     last, 1});
  if (type == ElementType::kNvfp4) {
    const int64_t sf = d / kMicroBlock;
    out.kv_cache_sf = MakeView(p, p.pool.k_micro_offset, ViewDType::kFloat8E4M3,
                               {p.pool.capacity_pages, 2, h, s, sf},
                               {p.pool.page_bytes, p.pool.v_micro_offset - p.pool.k_micro_offset,
                                s * sf, sf, 1});
  }
  if (p.format.k.scope == ScaleScope::kTensor) {
    constexpr ScaleConvention kConvention = ScaleConvention::kFlashInferKVScale;
    KVTIER_ASSIGN_OR_RETURN(out.k_scale, ToConvention(p.pool.k_tensor_scale, type, kConvention));
    KVTIER_ASSIGN_OR_RETURN(out.v_scale, ToConvention(p.pool.v_tensor_scale, type, kConvention));
  }
  return out;
}

}  // namespace kvtier
