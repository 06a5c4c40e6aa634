// The partial (output, LSE) states of a batch's parts (kvtier/adapters/partition.h) and their
// exact merge into one state per sequence.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_PARTIAL_STATES_H_
#define KVTIER_ADAPTERS_PARTIAL_STATES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/export.h"

namespace kvtier {

enum class LseBase : uint8_t { kNatural, kBase2 };  // FlashInfer returns base 2
KVTIER_EXPORT void NaturalToBase2Lse(absl::Span<float> lse);  // x log2(e); -inf stays -inf
KVTIER_EXPORT void Base2ToNaturalLse(absl::Span<float> lse);  // x ln(2)

// One part's attention result.
struct PartialState {
  absl::Span<const int32_t> batch_index;  // [rows]
  absl::Span<const float> out;            // [rows, num_q_heads, head_dim]
  absl::Span<const float> lse;            // [rows, num_q_heads]; -inf marks an empty row
  LseBase base = LseBase::kNatural;
};

// Merges the parts of a batch exactly (MergeStates of kvtier/merge_states.h, row by row) into
// `out` [batch, num_q_heads, head_dim] and `lse` [batch, num_q_heads] (natural log). A batch row
// in no part gets a zero output and LSE -inf. InvalidArgument for wrong sizes or a batch index
// out of range or repeated within a part, with `out` and `lse` left as they were.
KVTIER_EXPORT absl::Status MergePartialStates(absl::Span<const PartialState> parts, int64_t batch,
                                              int32_t num_q_heads, int32_t head_dim,
                                              absl::Span<float> out, absl::Span<float> lse);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_PARTIAL_STATES_H_
