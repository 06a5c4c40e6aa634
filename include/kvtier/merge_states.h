// Merging partial attention states by their log-sum-exp: attend the parts of a sequence
// separately (e.g. a shared prefix and a suffix, or one call per page format), then combine
//   s = log(e^sa + e^sb),  v = (va e^sa + vb e^sb) / (e^sa + e^sb)
// exactly (docs/adapters.md). LSEs are natural logs.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_MERGE_STATES_H_
#define KVTIER_MERGE_STATES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/attention.h"
#include "kvtier/export.h"
#include "kvtier/options.h"

namespace kvtier {

// Merges two partial states of `rows` rows (e.g. batch x heads) into one, on the host, in
// double: out_* are [rows, head_dim], lse_* are [rows]. out/lse may alias a or b. A part with
// lse = -inf is empty and contributes nothing; when both are empty the result is a zero output
// with lse = -inf. A row with a NaN or +inf lse in either part gets NaN output and lse (on every
// backend: MergeStatesOn too). InvalidArgument for wrong sizes.
KVTIER_EXPORT absl::Status MergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                                       absl::Span<const float> out_b, absl::Span<const float> lse_b,
                                       int64_t rows, int32_t head_dim, absl::Span<float> out,
                                       absl::Span<float> lse);

// MergeStates for spans in the memory of `backend`: on the CUDA backend with the LSE merge
// kernel, on launch.stream (Unavailable in builds without CUDA; Internal for a CUDA error).
// out/lse may alias a or b.
KVTIER_EXPORT absl::Status MergeStatesOn(BackendKind backend, absl::Span<const float> out_a,
                                         absl::Span<const float> lse_a,
                                         absl::Span<const float> out_b,
                                         absl::Span<const float> lse_b, int64_t rows,
                                         int32_t head_dim, absl::Span<float> out,
                                         absl::Span<float> lse, const DeviceLaunch& launch = {});

}  // namespace kvtier

#endif  // KVTIER_MERGE_STATES_H_
