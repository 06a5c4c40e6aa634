// The CPU reference decode attention over plain float K/V: the storage-error-free oracle an
// engine can check its own kernel (or kvtier's, through Cache::ReadKV) against. Same math as
// DecodeAttention on the CPU backend (kvtier/attention.h), sharing one implementation: given the
// values a cache stores (ReadKV), it returns bit-identical outputs, LSE and logits (for a cache
// with Options::key_rotation, equal up to the FP32 rounding of ReadKV's un-rotation).
//
// Thread-safety: thread-compatible (no shared state).
#ifndef KVTIER_REFERENCE_ATTENTION_H_
#define KVTIER_REFERENCE_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/attention.h"
#include "kvtier/export.h"

namespace kvtier {

// One sequence's K and V as float arrays [length, num_kv_heads, head_dim] (Cache::ReadKV's
// layout).
struct DenseSequence {
  absl::Span<const float> k;
  absl::Span<const float> v;
  int64_t length = 0;
};

// Decode attention for batch = seqs.size() sequences on host memory. InvalidArgument for spans
// of the wrong size or bad head counts.
KVTIER_EXPORT absl::Status DenseDecodeAttention(absl::Span<const DenseSequence> seqs,
                                                int32_t num_kv_heads, int32_t head_dim,
                                                const DecodeQueries& queries,
                                                const DecodeOutputs& outputs);

}  // namespace kvtier

#endif  // KVTIER_REFERENCE_ATTENTION_H_
