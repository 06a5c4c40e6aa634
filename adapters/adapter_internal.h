// Helpers shared by the adapter sources; not part of the adapters' API.
#ifndef KVTIER_ADAPTERS_ADAPTER_INTERNAL_H_
#define KVTIER_ADAPTERS_ADAPTER_INTERNAL_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/adapters/target.h"
#include "kvtier/adapters/tensor_view.h"
#include "kvtier/cache.h"
#include "src/status_macros.h"

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

// The view element type of a codec's element type (packed FP4 for NVFP4).
ViewDType ViewTypeOf(ElementType type);

// A view whose element [0, ...] is at pool base + byte_offset.
TensorView MakeView(const PoolAndFormat& p, int64_t byte_offset, ViewDType dtype,
                    std::vector<int64_t> shape, std::vector<int64_t> strides);

// PartitionByFormat, refusing a part whose format `target` cannot read.
absl::StatusOr<std::vector<FormatPart>> ReadableParts(AdapterTarget target, const Options& options,
                                                      const PageTables& tables);

// The most pages a row of `part` holds.
int32_t MaxPages(const FormatPart& part);

// OK when a dense table of `rows` x `columns` entries fits the bound every adapter keeps
// (2^28 entries: a 1 GiB int32 block table, far above any batch), so that a batch too wide is
// refused, not allocated; else InvalidArgument naming `what` and both counts.
absl::Status CheckDenseTable(int64_t rows, int64_t columns, absl::string_view what);

// The prologue of every per-target part builder: one T per part of `tables` that `target` can
// read, in palette order, with T's format, batch_index and seq_lens (the part's lengths) set;
// `fill(part, &t)` sets the rest and returns OK, or the error that refuses the batch.
template <typename T, typename Fill>
absl::StatusOr<std::vector<T>> BuildParts(AdapterTarget target, const Options& options,
                                          const PageTables& tables, Fill fill) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<FormatPart> parts, ReadableParts(target, options, tables));
  std::vector<T> out;
  out.reserve(parts.size());
  for (const FormatPart& part : parts) {
    T t;
    t.format = part.format;
    t.batch_index = part.batch_index;
    t.seq_lens.assign(part.lengths.begin(), part.lengths.end());
    KVTIER_RETURN_IF_ERROR(fill(part, &t));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace kvtier::adapter_internal

#endif  // KVTIER_ADAPTERS_ADAPTER_INTERNAL_H_
