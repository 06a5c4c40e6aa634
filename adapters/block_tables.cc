// FlashAttention 2/3 and vLLM: dense block tables, NHD-shaped views over HND pages, FA3's
// descales and vLLM's slot_mapping.
#include "kvtier/adapters/block_tables.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/adapter_internal.h"
#include "kvtier/format.h"
#include "src/status_macros.h"

namespace kvtier {

using adapter_internal::GetPoolAndFormat;
using adapter_internal::MakeView;
using adapter_internal::PoolAndFormat;
using adapter_internal::ViewTypeOf;

namespace {

// InvalidArgument unless `target` reads dense block tables and NHD views (the formats each
// reads are CheckReadable's).
absl::Status CheckDenseTarget(AdapterTarget target) {
  if (target == AdapterTarget::kFlashAttention2 || target == AdapterTarget::kFlashAttention3 ||
      target == AdapterTarget::kVllm) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      AdapterTargetName(target), " takes no dense block table (FlashAttention-2, "
                                 "FlashAttention-3 and vLLM do)"));
}

// A bound on caller counts that size the outputs (far above any batch: 2^24 rows or tokens), so
// that a wrong count is refused, not allocated.
constexpr int64_t kMaxRows = int64_t{1} << 24;

}  // namespace

absl::StatusOr<std::vector<BlockTablePart>> BuildBlockTableParts(
    AdapterTarget target, const Options& options, const PageTables& tables,
    const BlockTableOptions& block_options) {
  KVTIER_RETURN_IF_ERROR(CheckDenseTarget(target));
  return adapter_internal::BuildParts<BlockTablePart>(
      target, options, tables, [&](const FormatPart& part, BlockTablePart* t) {
        const int32_t needed = adapter_internal::MaxPages(part);
        if (block_options.max_blocks != 0 && block_options.max_blocks < needed) {
          return absl::InvalidArgumentError(absl::StrCat(
              "max_blocks ", block_options.max_blocks, " is below the ", needed,
              " pages of format ", FormatName(options.palette[part.format]),
              " that a sequence holds"));
        }
        t->max_blocks = block_options.max_blocks != 0 ? block_options.max_blocks : needed;
        KVTIER_RETURN_IF_ERROR(
            adapter_internal::CheckDenseTable(part.rows(), t->max_blocks, "a block table"));
        t->block_table.assign(static_cast<size_t>(part.rows()) * t->max_blocks,
                              block_options.pad_value);
        for (int64_t r = 0; r < part.rows(); ++r) {
          std::copy(part.indices.begin() + part.indptr[r],
                    part.indices.begin() + part.indptr[r + 1],
                    t->block_table.begin() + r * t->max_blocks);
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<BlockTableLayer> GetBlockTableLayer(AdapterTarget target, const Cache& cache,
                                                   int32_t format, int32_t layer) {
  KVTIER_RETURN_IF_ERROR(CheckDenseTarget(target));  // FlashInfer reads FP4 and HND: no view here
  KVTIER_ASSIGN_OR_RETURN(const PoolAndFormat p, GetPoolAndFormat(target, cache, format, layer));
  const Geometry& g = p.geometry;
  const int64_t h = g.num_kv_heads, s = g.block_tokens, d = g.head_dim;
  const ViewDType dtype = ViewTypeOf(p.format.k.type);  // never FP4 here: no target reads it
  const int64_t e = ViewDTypeBytes(dtype);
  const std::vector<int64_t> shape = {p.pool.capacity_pages, s, h, d};
  const std::vector<int64_t> strides = {p.pool.page_bytes / e, d, s * d, 1};
  BlockTableLayer out;
  out.k = MakeView(p, p.pool.k_offset, dtype, shape, strides);
  out.v = MakeView(p, p.pool.v_offset, dtype, shape, strides);
  if (p.format.k.scope == ScaleScope::kTensor) {
    out.k_scale = p.pool.k_tensor_scale;  // kvtier's convention is vLLM's and FA3's
    out.v_scale = p.pool.v_tensor_scale;
  }
  return out;
}

absl::StatusOr<Fa3Descales> GetFa3Descales(const Cache& cache, int32_t format, int32_t layer,
                                           int64_t rows) {
  KVTIER_ASSIGN_OR_RETURN(const PoolAndFormat p,
                          GetPoolAndFormat(AdapterTarget::kFlashAttention3, cache, format, layer));
  if (p.format.k.scope != ScaleScope::kTensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format ", FormatName(p.format), " has no scale: FlashAttention-3 descales exist only for "
        "fp8_e4m3/tensor"));
  }
  if (rows < 0 || rows > kMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("rows ", rows, " is outside 0..", kMaxRows));
  }
  const size_t n = static_cast<size_t>(rows) * p.geometry.num_kv_heads;
  return Fa3Descales{std::vector<float>(n, p.pool.k_tensor_scale),
                     std::vector<float>(n, p.pool.v_tensor_scale)};
}

absl::StatusOr<std::vector<int64_t>> VllmSlotMapping(const Cache& cache,
                                                     absl::Span<const int64_t> slots,
                                                     int64_t padded_size) {
  const Options& o = cache.options();
  KVTIER_RETURN_IF_ERROR(CheckKeysUnrotated(AdapterTarget::kVllm, o));
  KVTIER_RETURN_IF_ERROR(CheckReadable(AdapterTarget::kVllm, o.palette[0], o.geometry));
  KVTIER_ASSIGN_OR_RETURN(const PoolInfo pool, cache.GetPool(0, 0));
  const int64_t limit = pool.capacity_pages * o.geometry.block_tokens;
  if (padded_size > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("padded_size ", padded_size, " is over ", kMaxRows, " tokens"));
  }
  if (padded_size != 0 && padded_size < static_cast<int64_t>(slots.size())) {
    return absl::InvalidArgumentError(absl::StrCat("padded_size ", padded_size, " is below the ",
                                                   slots.size(), " slots"));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < -1 || slots[i] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", i, " = ", slots[i],
                                                     " is outside the hot pools (0 to ", limit - 1,
                                                     ", or -1 to skip)"));
    }
  }
  std::vector<int64_t> out(slots.begin(), slots.end());
  if (padded_size > static_cast<int64_t>(out.size())) out.resize(padded_size, -1);
  return out;
}

}  // namespace kvtier
