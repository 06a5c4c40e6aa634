// TensorRT-LLM: kv_cache_block_offsets [rows, 2, max_blocks] (K and V entries) in units of one
// side's block, from the (format, layer) pool's base. A contract read from kvCacheUtils.h; not
// yet run against TensorRT-LLM.
#include "kvtier/adapters/tensorrt_llm.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "adapters/adapter_internal.h"
#include "kernels/page_layout.h"
#include "kvtier/adapters/scale_conventions.h"
#include "src/status_macros.h"

namespace kvtier {

absl::StatusOr<std::vector<TensorRtLlmPart>> BuildTensorRtLlmParts(const Options& options,
                                                                   const PageTables& tables) {
  const Geometry& g = options.geometry;
  return adapter_internal::BuildParts<TensorRtLlmPart>(
      AdapterTarget::kTensorRtLlm, options, tables,
      [&](const FormatPart& part, TensorRtLlmPart* t) {
        const FormatSpec& f = options.palette[part.format];
        const PageLayout l = MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, f);
        const int64_t block = int64_t{g.num_kv_heads} * g.block_tokens * l.k.row_bytes;
        if (l.page_bytes % block != 0 || l.k.payload_offset % block != 0 ||
            l.v.payload_offset % block != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "TensorRT-LLM cannot address format ", FormatName(f), ": pages of ", l.page_bytes,
              " bytes are not a whole number of its ", block, "-byte K/V blocks"));
        }
        t->bytes_per_block = block;
        t->max_blocks = adapter_internal::MaxPages(part);
        KVTIER_RETURN_IF_ERROR(adapter_internal::CheckDenseTable(
            part.rows(), int64_t{2} * t->max_blocks, "TensorRT-LLM's block offsets"));
        t->block_offsets.assign(static_cast<size_t>(part.rows()) * 2 * t->max_blocks, 0);
        for (int64_t r = 0; r < part.rows(); ++r) {
          for (int32_t i = part.indptr[r]; i < part.indptr[r + 1]; ++i) {
            const int64_t first = int64_t{part.indices[i]} * (l.page_bytes / block);
            const int64_t k = first + l.k.payload_offset / block;
            const int64_t v = first + l.v.payload_offset / block;
            if (v > std::numeric_limits<int32_t>::max()) {
              return absl::InvalidArgumentError(
                  absl::StrCat("page ", part.indices[i], " is beyond int32 block offsets"));
            }
            const size_t column = static_cast<size_t>(i - part.indptr[r]);
            t->block_offsets[(r * 2 + 0) * t->max_blocks + column] = static_cast<int32_t>(k);
            t->block_offsets[(r * 2 + 1) * t->max_blocks + column] = static_cast<int32_t>(v);
          }
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<TensorRtLlmLayer> GetTensorRtLlmLayer(const Cache& cache, int32_t format,
                                                     int32_t layer) {
  KVTIER_ASSIGN_OR_RETURN(
      const adapter_internal::PoolAndFormat p,
      adapter_internal::GetPoolAndFormat(AdapterTarget::kTensorRtLlm, cache, format, layer));
  TensorRtLlmLayer out;
  out.pool_pointer = p.pool.base;
  out.bytes_per_block =
      int64_t{p.geometry.num_kv_heads} * p.geometry.block_tokens * p.pool.row_bytes;
  if (p.format.k.scope == ScaleScope::kTensor) {
    if (p.pool.k_tensor_scale != p.pool.v_tensor_scale) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TensorRT-LLM takes one FP8 scale for K and V; layer ", layer, " has K ",
          p.pool.k_tensor_scale, " and V ", p.pool.v_tensor_scale));
    }
    const ElementType type = p.format.k.type;
    KVTIER_ASSIGN_OR_RETURN(out.kv_scale_quant_orig,
                            ToConvention(p.pool.k_tensor_scale, type,
                                         ScaleConvention::kTensorRtLlmQuantOrig));
    KVTIER_ASSIGN_OR_RETURN(out.kv_scale_orig_quant,
                            ToConvention(p.pool.k_tensor_scale, type,
                                         ScaleConvention::kTensorRtLlmOrigQuant));
  }
  return out;
}

}  // namespace kvtier
