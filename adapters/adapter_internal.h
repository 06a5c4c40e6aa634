// Helpers shared by the adapter sources; not part of the adapters' API.
#ifndef KVTIER_ADAPTERS_ADAPTER_INTERNAL_H_
#define KVTIER_ADAPTERS_ADAPTER_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "adapters/page_table_adapters.h"
#include "kvtier/cache.h"

namespace kvtier::adapter_internal {

// A pool with its palette format, geometry and device, after CheckReadable for a target.
struct PoolAndFormat {
  PoolInfo pool;
  FormatSpec format;
  Geometry geometry;
  BackendKind device = BackendKind::kCpu;
};

// InvalidArgument for a bad format or layer, or a format `target` cannot read.
absl::StatusOr<PoolAndFormat> GetPoolAndFormat(AdapterTarget target, const Cache& cache,
                                               int32_t format, int32_t layer);

// A view whose element [0, ...] is at pool base + byte_offset.
TensorView MakeView(const PoolAndFormat& p, int64_t byte_offset, ViewDType dtype,
                    std::vector<int64_t> shape, std::vector<int64_t> strides);

// PartitionByFormat, refusing a part whose format `target` cannot read.
absl::StatusOr<std::vector<FormatPart>> ReadableParts(AdapterTarget target, const Options& options,
                                                      const PageTables& tables);

// The most pages a row of `part` holds.
int32_t MaxPages(const FormatPart& part);

}  // namespace kvtier::adapter_internal

#endif  // KVTIER_ADAPTERS_ADAPTER_INTERNAL_H_
