// The CUDA side of kvtier/attention.h and kvtier/merge_states.h: the fused decode kernel and
// the LSE merge kernel behind the checks of src/attention/attention_contract.h.
// Compiled in CUDA builds only.
#ifndef KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_
#define KVTIER_SRC_CUDA_CUDA_DECODE_ATTENTION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/attention.h"
#include "kvtier/page_tables.h"
#include "src/attention/attention_contract.h"
#include "src/mutex.h"

namespace kvtier {

// A batch's packed_indptr, packed and seq_lens in device memory (PreparedDecode's CUDA half),
// readable from any stream: Read on a stream other than the upload's first makes it wait for the
// upload (an event recorded after the copies), then records the end of its reads in that
// stream's event; the destructor makes the upload stream wait for every reader stream's event
// before it frees the copies there. Reads captured into a CUDA graph are not tracked (an event
// recorded in a capture cannot be waited on outside it; see PreparedDecode's REQUIRES).
// Thread-safety: Read may be called concurrently.
class CudaDecodeTables {
 public:
  // Copies them on `stream` (a cudaStream_t) into buffers with room for `packed_capacity`
  // packed entries (at least the tables' own); with `any_stream`, records the upload event for
  // reads on other streams. Internal for a CUDA error.
  static absl::StatusOr<std::unique_ptr<CudaDecodeTables>> Upload(const PageTables& tables,
                                                                  void* stream, bool any_stream,
                                                                  size_t packed_capacity);
  ~CudaDecodeTables();  // frees the copies on the stream of Upload, after every reader stream

  // Copies `tables` into the same buffers on the stream of Upload, after the reads on other
  // streams so far (and, with any_stream, records the upload event again). REQUIRES: as many
  // sequences as Upload's, at most packed_capacity() entries; not concurrent with Read.
  // Internal for a CUDA error (the device tables are then undefined).
  absl::Status Overwrite(const PageTables& tables);
  size_t packed_capacity() const { return packed_capacity_; }

  // Runs `enqueue`, which enqueues reads of the tables on `stream`, ordered after the upload and
  // before the free. REQUIRES: a stream other than Upload's only with any_stream. Internal for a
  // CUDA error (nothing enqueued when the wait for the upload fails), else enqueue's status.
  absl::Status Read(void* stream, absl::FunctionRef<absl::Status()> enqueue) const;

  const int32_t* packed_indptr() const { return indptr_; }
  const uint32_t* packed() const { return packed_; }
  const int32_t* seq_lens() const { return seq_lens_; }

 private:
  struct Reader {
    void* stream;
    void* done;  // a cudaEvent_t recorded after the stream's last read
  };
  explicit CudaDecodeTables(void* stream) : stream_(stream) {}
  absl::StatusOr<void*> ReaderEvent(void* stream) const;  // found or created
  absl::Status CopyIn(const PageTables& tables);           // on the stream of Upload

  void* stream_;
  void* uploaded_ = nullptr;  // a cudaEvent_t recorded after the copies (with any_stream)
  int32_t* indptr_ = nullptr;
  uint32_t* packed_ = nullptr;
  size_t packed_capacity_ = 0;
  int32_t* seq_lens_ = nullptr;
  mutable Mutex mu_;
  mutable std::vector<Reader> readers_ ABSL_GUARDED_BY(mu_);
  // A reader's event could not be recorded: the destructor waits for the whole device.
  mutable std::atomic<bool> lost_reader_{false};
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
