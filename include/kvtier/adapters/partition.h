// Partition by format: one part per palette format present in a batch (docs/adapters.md).
//
// Everything in kvtier/adapters/ is built on the host from one PageTables snapshot
// (Cache::BuildPageTables) and the pools' PoolInfo (Cache::GetPool). Page tables must not
// outlive the step they were built for; tensor views stay valid as long as the cache does, but
// only pages inside mapped slabs may be touched.
//
// External kernels read one format per call. Every table builder therefore returns one *part*
// per palette format present in the batch: the sequences (rows) that own at least one page in
// that format, each with its pages of that format in sequence order. A row's part length is
// block_tokens x (pages - 1) + last_page_len, with 1 <= last_page_len <= block_tokens; only the
// part holding the sequence's partial tail has a short last page. Sequences with no page in a
// format are *left out* of that format's part (`batch_index` maps part rows back to batch
// positions), so no kernel ever sees an empty sequence (FlashInfer, FlashAttention and
// FlexAttention disagree about what an empty sequence returns). Attend each part, then merge the
// partial (output, LSE) states with MergePartialStates (kvtier/adapters/partial_states.h); a
// sequence in one part only needs no merge.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_PARTITION_H_
#define KVTIER_ADAPTERS_PARTITION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/export.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// One format's share of a batch, in FlashInfer's CSR form.
struct FormatPart {
  int32_t format = 0;                  // palette index
  std::vector<int32_t> batch_index;    // [rows]: batch position of each row
  std::vector<int32_t> indptr;         // [rows + 1]
  std::vector<int32_t> indices;        // [nnz]: pages of this format's pools, sequence order
  std::vector<int32_t> last_page_len;  // [rows]: 1 to block_tokens
  std::vector<int32_t> lengths;        // [rows]: tokens of the row in this part
  uint64_t slab_unmaps = 0;            // the tables' (PageTables::slab_unmaps)

  int64_t rows() const { return static_cast<int64_t>(batch_index.size()); }
};

// Splits `tables` (built for a cache with `options`) into one part per palette format present,
// in palette order. InvalidArgument when the tables do not match the palette or a last page
// length is outside 1..block_tokens.
KVTIER_EXPORT absl::StatusOr<std::vector<FormatPart>> PartitionByFormat(const Options& options,
                                                                        const PageTables& tables);

// A part as a packed PageTables that DecodeAttention (kvtier/attention.h) attends: kvtier's own
// attention acting as "one kernel call for one format".
KVTIER_EXPORT PageTables PartAsPageTables(const FormatPart& part);

// Rows `batch_index` of a row-major [batch, row_elems] array: the queries of one part.
// REQUIRES: every index is in [0, x.size() / row_elems).
KVTIER_EXPORT std::vector<float> GatherRows(absl::Span<const float> x, int64_t row_elems,
                                            absl::Span<const int32_t> batch_index);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_PARTITION_H_
