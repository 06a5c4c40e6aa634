#include "adapters/adapter_internal.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier::adapter_internal {

ViewDType ViewTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return ViewDType::kFloat16;
    case ElementType::kBf16: return ViewDType::kBFloat16;
    case ElementType::kFp8E4M3: return ViewDType::kFloat8E4M3;
    case ElementType::kFp8E5M2: return ViewDType::kFloat8E5M2;
    case ElementType::kNvfp4: return ViewDType::kFloat4E2M1x2;
  }
  return ViewDType::kFloat16;
}

absl::StatusOr<PoolAndFormat> GetPoolAndFormat(AdapterTarget target, const Cache& cache,
                                               int32_t format, int32_t layer) {
  PoolAndFormat p;
  KVTIER_ASSIGN_OR_RETURN(p.pool, cache.GetPool(format, layer));
  const Options& o = cache.options();
  KVTIER_RETURN_IF_ERROR(CheckKeysUnrotated(target, o));
  p.format = o.palette[format];
  KVTIER_RETURN_IF_ERROR(CheckReadable(target, p.format, o.geometry));
  p.geometry = o.geometry;
  p.device = o.backend;
  return p;
}

TensorView MakeView(const PoolAndFormat& p, int64_t byte_offset, ViewDType dtype,
                    std::vector<int64_t> shape, std::vector<int64_t> strides) {
  TensorView v;
  v.data = static_cast<uint8_t*>(p.pool.base) + byte_offset;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  v.device = p.device;
  v.device_id = p.pool.device_id;
  return v;
}

absl::StatusOr<std::vector<FormatPart>> ReadableParts(AdapterTarget target, const Options& options,
                                                      const PageTables& tables) {
  KVTIER_RETURN_IF_ERROR(CheckKeysUnrotated(target, options));
  KVTIER_ASSIGN_OR_RETURN(std::vector<FormatPart> parts, PartitionByFormat(options, tables));
  for (const FormatPart& part : parts) {
    KVTIER_RETURN_IF_ERROR(
        CheckReadable(target, options.palette[part.format], options.geometry));
  }
  return parts;
}

int32_t MaxPages(const FormatPart& part) {
  int32_t m = 0;
  for (int64_t r = 0; r < part.rows(); ++r) m = std::max(m, part.indptr[r + 1] - part.indptr[r]);
  return m;
}

absl::Status CheckDenseTable(int64_t rows, int64_t columns, absl::string_view what) {
  constexpr uint64_t kMaxEntries = uint64_t{1} << 28;
  if (static_cast<uint64_t>(rows) * static_cast<uint64_t>(columns) <= kMaxEntries) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(rows, " rows x ", columns, " columns is over the ",
                                                 kMaxEntries, " entries ", what, " may hold"));
}

}  // namespace kvtier::adapter_internal
