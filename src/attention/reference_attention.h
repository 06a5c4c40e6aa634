// CPU reference decode attention: the oracle that kvtier's GPU kernels and every adapter are
// checked against, and DecodeAttention's CPU path. Two entry points share one implementation of
// the math of kvtier/attention.h (each dot product accumulated in double from fp32 operands,
// outputs accumulated in double), so on the same K/V values they return bit-identical logits,
// outputs and LSE:
//   - PagedDecodeAttention reads each sequence's pages through the packed (format, page) table
//     of a PageTables and decodes every row with the page codec (kernels/page_codec.h), so it
//     sees exactly what the cache stores, in any mix of palette formats;
//   - DenseDecodeAttention (kvtier/reference_attention.h) runs it over plain float K/V arrays.
// MergeStates (kvtier/merge_states.h) combines partial states exactly.
//
// Thread-safety: the functions are thread-compatible; they read the pools without locking, so
// the caller must not write or demote the sequences being attended concurrently.
#ifndef KVTIER_SRC_ATTENTION_REFERENCE_ATTENTION_H_
#define KVTIER_SRC_ATTENTION_REFERENCE_ATTENTION_H_

#include "absl/status/status.h"
#include "kvtier/attention.h"
#include "kvtier/export.h"
#include "kvtier/page_tables.h"
#include "kvtier/reference_attention.h"
#include "src/attention/attention_contract.h"

namespace kvtier {

// Decode attention for `tables.seq_lens.size()` sequences over the pages of `kv`, using
// tables.packed_indptr / packed / seq_lens (per_format is not read). InvalidArgument as
// ValidatePagedDecode. Exported (not installed) for the Python module, which links a shared
// libkvtier on the GPU machine; engines call DecodeAttention, which is this on the CPU backend.
KVTIER_EXPORT absl::Status PagedDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                                const DecodeQueries& queries,
                                                const DecodeOutputs& outputs);

}  // namespace kvtier

#endif  // KVTIER_SRC_ATTENTION_REFERENCE_ATTENTION_H_
