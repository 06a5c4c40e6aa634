// PyTorch FlexAttention's PagedAttention: page_table / physical_to_logical over a gathered copy
// of each part's pages, and the gather itself.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_FLEX_ATTENTION_H_
#define KVTIER_ADAPTERS_FLEX_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// PagedAttention reads K and V as (1, H, n_pages x S, D) tensors: token s of physical page p of
// head h at [0, h, p x S + s, :]. kvtier's pages are HND with K then V (and padding), so the
// token stride within a page (D) and the page stride (page_bytes) do not form one token axis:
// no strided view exists. GatherFlexKV copies the part's pages into such tensors; page_table
// then indexes the copy.

struct FlexAttentionPart {
  int32_t format = 0;
  std::vector<int32_t> batch_index;          // [rows]
  int64_t n_pages = 0;                       // physical pages of the gathered copy
  std::vector<int32_t> source_pages;         // [n_pages]: kvtier page copied to each
  std::vector<int64_t> page_table;           // [rows, n_pages]: logical -> physical, -1 none
  std::vector<int64_t> physical_to_logical;  // [rows, n_pages]: -1 none
  std::vector<int64_t> seq_lens;             // [rows]

  int64_t rows() const { return static_cast<int64_t>(batch_index.size()); }
};
KVTIER_EXPORT absl::StatusOr<std::vector<FlexAttentionPart>> BuildFlexAttentionParts(
    const Options& options, const PageTables& tables);

// A COPY: pages `pages` of (format, layer) into k_out and v_out, each (1, H, pages.size() x S,
// D) of the format's element type (raw bytes, FP16 or BF16). CPU backend only
// (FailedPrecondition on the CUDA backend). InvalidArgument for a bad format, layer, output size
// or a page index outside the pool; FailedPrecondition for a page that holds no block now
// (Cache::CheckTablesHeld: pages of tables from before the cache changed, whose slab may have
// returned to the budget).
KVTIER_EXPORT absl::Status GatherFlexKV(const Cache& cache, int32_t format, int32_t layer,
                                        absl::Span<const int32_t> pages, absl::Span<uint8_t> k_out,
                                        absl::Span<uint8_t> v_out);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_FLEX_ATTENTION_H_
