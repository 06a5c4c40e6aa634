// Decode attention with the backend of a cache: the CPU reference on the CPU backend, kvtier's
// fused mixed-format kernel (kernels/decode_attention.cuh) on the CUDA backend. The shapes and
// the math are those of reference_attention.h; on the CUDA backend the query and output spans
// describe device memory, and the fused kernel's accuracy against the reference is stated in
// docs/attention.md.
//
// Thread-safety: as reference_attention.h; the caller must not write, demote or release the
// sequences of `tables` until the attention has finished on the device.
#ifndef KVTIER_SRC_ATTENTION_DECODE_ATTENTION_H_
#define KVTIER_SRC_ATTENTION_DECODE_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/page_tables.h"
#include "src/attention/reference_attention.h"

namespace kvtier {

struct DeviceLaunch {
  void* stream = nullptr;    // a cudaStream_t. Default: the legacy default stream
  bool synchronize = false;  // wait for the work to finish. Default: return once enqueued
};

// Decode attention over `layer` of `cache` for the batch of `tables` (BuildPageTables of this
// step). CPU backend: PagedDecodeAttention on host spans (`launch` is ignored). CUDA backend:
// the fused kernel; `tables` are copied to the device by the call (so they may be freed when it
// returns) and the work runs on launch.stream. outputs.logits must be empty there.
// InvalidArgument as ValidatePagedDecode; also, on CUDA, for a head_dim other than 128, pages
// of other than 16 tokens, GQA groups over 16, or BF16 pages, which the fused kernel does not
// read. Unavailable in builds without CUDA; Internal for a CUDA error.
KVTIER_EXPORT absl::Status DecodeAttention(const Cache& cache, int32_t layer,
                                           const PageTables& tables, const DecodeQueries& queries,
                                           const DecodeOutputs& outputs,
                                           const DeviceLaunch& launch = {});

// A decode step's page tables made ready once for every layer's DecodeAttention of that step:
// checked against the cache's palette (CheckPageTables) and, on the CUDA backend, copied to the
// device on launch.stream (Create does not synchronize). An engine makes one per step after
// BuildPageTables and passes it to each layer's call, which on CUDA then does no per-page host
// work and no copy. Valid, like the tables, until the cache changes (Append, Demote, EndStep):
// a stale step is not detected, only pages outside the pools are. Move-only.
// REQUIRES (CUDA): the attention calls run on Create's stream or on streams ordered after the
// upload (e.g. by an event the caller records on Create's stream), and the step is destroyed
// after them, or once they have finished when they run on other streams: its device copy is
// freed on Create's stream when it is destroyed.
// Thread-safety: const methods may be called concurrently.
class KVTIER_EXPORT PreparedDecode {
 public:
  // InvalidArgument as CheckPageTables; Unavailable on CUDA in builds without CUDA; Internal
  // for a CUDA error.
  static absl::StatusOr<PreparedDecode> Create(const Cache& cache, const PageTables& tables,
                                               const DeviceLaunch& launch = {});
  PreparedDecode(PreparedDecode&&) noexcept;
  PreparedDecode& operator=(PreparedDecode&&) noexcept;
  ~PreparedDecode();

  int64_t batch() const;  // sequences in the step; 0 when moved from

 private:
  struct Rep;
  explicit PreparedDecode(std::unique_ptr<Rep> rep);
  friend absl::Status DecodeAttention(const Cache&, int32_t, const PreparedDecode&,
                                      const DecodeQueries&, const DecodeOutputs&,
                                      const DeviceLaunch&);
  std::unique_ptr<Rep> rep_;
};

// DecodeAttention over a prepared step: the same results as with the step's PageTables.
// InvalidArgument for a cache other than the one the step was prepared for, when a page of the
// step is outside this layer's pools, for spans not shaped for step.batch() sequences, and as
// the table overload otherwise; FailedPrecondition for a moved-from step.
KVTIER_EXPORT absl::Status DecodeAttention(const Cache& cache, int32_t layer,
                                           const PreparedDecode& step, const DecodeQueries& queries,
                                           const DecodeOutputs& outputs,
                                           const DeviceLaunch& launch = {});

// MergeStates (reference_attention.h) for spans in the memory of `backend`: on the CUDA backend
// with the LSE merge kernel, on launch.stream. out/lse may alias a or b.
KVTIER_EXPORT absl::Status MergeStatesOn(BackendKind backend, absl::Span<const float> out_a,
                                         absl::Span<const float> lse_a,
                                         absl::Span<const float> out_b,
                                         absl::Span<const float> lse_b, int64_t rows,
                                         int32_t head_dim, absl::Span<float> out,
                                         absl::Span<float> lse, const DeviceLaunch& launch = {});

}  // namespace kvtier

#endif  // KVTIER_SRC_ATTENTION_DECODE_ATTENTION_H_
