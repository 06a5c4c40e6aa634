// The CUDA side of src/attention/decode_attention.h: the fused decode kernel and the LSE merge
// kernel behind host-side checks. Compiled in CUDA builds only.
#ifndef KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_
#define KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/page_tables.h"
#include "src/attention/decode_attention.h"
#include "src/attention/reference_attention.h"

namespace kvtier {

// DecodeAttention's CUDA path; `kv` holds device pointers.
absl::Status CudaDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                 const DecodeQueries& queries, const DecodeOutputs& outputs,
                                 const DeviceLaunch& launch);

// MergeStatesOn's CUDA path.
absl::Status CudaMergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                             absl::Span<const float> out_b, absl::Span<const float> lse_b,
                             int64_t rows, int32_t head_dim, absl::Span<float> out,
                             absl::Span<float> lse, const DeviceLaunch& launch);

}  // namespace kvtier

#endif  // KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_
