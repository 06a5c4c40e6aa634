// The CUDA side of kvtier/attention.h and kvtier/merge_states.h: the fused decode kernel and
// the LSE merge kernel behind the checks of src/attention/attention_contract.h.
// Compiled in CUDA builds only.
#ifndef KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_
#define KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/attention.h"
#include "kvtier/page_tables.h"
#include "src/attention/attention_contract.h"

namespace kvtier {

// A batch's packed_indptr, packed and seq_lens in device memory (PreparedDecode's CUDA half).
class CudaDecodeTables {
 public:
  // Copies them on `stream` (a cudaStream_t). Internal for a CUDA error.
  static absl::StatusOr<std::unique_ptr<CudaDecodeTables>> Upload(const PageTables& tables,
                                                                  void* stream);
  ~CudaDecodeTables();  // frees the copies on the stream of Upload

  const int32_t* packed_indptr() const { return indptr_; }
  const uint32_t* packed() const { return packed_; }
  const int32_t* seq_lens() const { return seq_lens_; }

 private:
  explicit CudaDecodeTables(void* stream) : stream_(stream) {}
  void* stream_;
  int32_t* indptr_ = nullptr;
  uint32_t* packed_ = nullptr;
  int32_t* seq_lens_ = nullptr;
};

// DecodeAttention's CUDA path; `kv` holds device pointers.
absl::Status CudaDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                 const DecodeQueries& queries, const DecodeOutputs& outputs,
                                 const DeviceLaunch& launch);

// The same over tables already on the device, which CheckPageTables summarised as `extent`
// (the pools and spans are checked here).
absl::Status CudaDecodeAttention(const PagedLayer& kv, const CudaDecodeTables& tables,
                                 const TableExtent& extent, const DecodeQueries& queries,
                                 const DecodeOutputs& outputs, const DeviceLaunch& launch);

// MergeStatesOn's CUDA path.
absl::Status CudaMergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                             absl::Span<const float> out_b, absl::Span<const float> lse_b,
                             int64_t rows, int32_t head_dim, absl::Span<float> out,
                             absl::Span<float> lse, const DeviceLaunch& launch);

}  // namespace kvtier

#endif  // KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_
