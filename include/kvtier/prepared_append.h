// The append of a decode step to every layer at once, prepared so that an engine can capture it
// in a CUDA graph with the step's attention (kvtier/attention.h's PreparedDecode).
//
// Cache::WriteKV writes one layer per call, staging and uploading the slots each time and
// launching on the backend's own stream: a step of L layers costs L uploads and L launches, and
// cannot be captured. A PreparedAppend holds the step's slots in device buffers made once;
// WriteKVLayers then encodes every layer's new rows with the same bytes as WriteKV (NaN
// canonicalised, non-finite inputs counted, keys rotated when the cache rotates them) in one
// kernel launch on the caller's stream (two with rotated keys: every layer's keys are rotated
// first, in one launch; one more launch per 128 layers beyond the first 128).
//
// One engine step, captured once and replayed:
//   cache->AppendBatch(batch, ones, {}, &slots);     // reserve this step's slots
//   append.Update(slots);                            // after the cache's own work, on `stream`
//   decode.Update(tables);                           // tables of BuildPageTables
//   ... write K/V and queries into the engine's buffers on `stream` ...
//   cudaGraphLaunch(exec, stream);                   // WriteKVLayers + DecodeAttention x L + ...
//   append.AfterGraphLaunch();                       // the cache's later work waits for it
//   cache->EndStep();
//
// Thread-safety: WriteKVLayers over one step may run concurrently; Update and AfterGraphLaunch
// are not concurrent with any other call on the same step.
#ifndef KVTIER_PREPARED_APPEND_H_
#define KVTIER_PREPARED_APPEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/cache.h"
#include "kvtier/device_launch.h"
#include "kvtier/export.h"

namespace kvtier {

// A decode step's slots (as Append returns them), checked once and, on the CUDA backend, held in
// device buffers of fixed address on Create's stream for every layer's append of the step.
// Valid, like the slots, until the cache changes them (Release, Demote of their blocks, Fork):
// on CUDA, WriteKVLayers refuses a step once a slab has been unmapped since its Update
// (FailedPrecondition: the slots may lie in unmapped memory; an EndStep or an Append that took
// another format's empty slab), otherwise writes where the slots point; on the CPU backend each
// slot is checked as WriteKV checks it. Move-only.
// CUDA streams: every call runs on Create's stream (launch.stream of WriteKVLayers must be it).
// Update orders that stream after the cache's own work issued so far (the zero-fill of a slab
// that Append mapped, a tail copied at Append), and WriteKVLayers orders the cache's later work
// (a tail copy, a demotion at EndStep) after its launch; a launch captured in a CUDA graph is
// not tracked: call AfterGraphLaunch after launching the graph. Destroying the step frees its
// buffers on Create's stream after the work enqueued there.
// REQUIRES: the cache and (CUDA) Create's stream outlive the step; the K/V inputs of a graph
// replay hold as many tokens as the step's slots at replay time.
class KVTIER_EXPORT PreparedAppend {
 public:
  // With room for `max_rows` slots (tokens appended per step). On CUDA, allocates device buffers
  // for the slots and every layer's pool (and, when the cache rotates keys, an FP32 scratch of
  // max_rows x num_layers x num_kv_heads x head_dim floats) on launch.stream. The step holds no
  // slots until Update. InvalidArgument for max_rows < 1 or over 2^31 tokens; Unavailable on CUDA
  // in builds without CUDA; Internal for a CUDA error.
  static absl::StatusOr<PreparedAppend> Create(Cache& cache, int64_t max_rows,
                                               const DeviceLaunch& launch = {});

  // Makes the step the one of `slots` (at most max_rows), checked as WriteKV checks them: each
  // reserved, in a block that one sequence holds (InvalidArgument, or FailedPrecondition for a
  // shared block, naming the index of the first bad slot; the step unchanged). On CUDA, copies
  // them into the same device buffers, on Create's stream, after the cache's work issued so far,
  // so that a CUDA graph that captured WriteKVLayers over this step replays over the new slots.
  // InvalidArgument for more than max_rows slots; FailedPrecondition for a moved-from step;
  // Internal for a CUDA error (the device slots are then undefined: destroy the step).
  absl::Status Update(absl::Span<const int64_t> slots);

  // Orders the cache's own later device work (tail copies at Append, demotions at EndStep, the
  // tiers' copies) after the work enqueued on Create's stream so far, e.g. a CUDA graph that
  // captured WriteKVLayers. Call it after each graph launch, before the cache's next Append or
  // EndStep (WriteKVLayers outside a capture does it itself). OK and nothing to do on the CPU
  // backend; FailedPrecondition for a moved-from step; Internal for a CUDA error.
  absl::Status AfterGraphLaunch();

  PreparedAppend(PreparedAppend&&) noexcept;
  PreparedAppend& operator=(PreparedAppend&&) noexcept;
  ~PreparedAppend();

  int64_t rows() const;      // slots of the last Update (0 before it, or when moved from)
  int64_t max_rows() const;  // 0 when moved from

 private:
  struct Rep;
  explicit PreparedAppend(std::unique_ptr<Rep> rep);
  friend absl::Status WriteKVLayers(Cache&, const PreparedAppend&, absl::Span<const KVInput>,
                                    const DeviceLaunch&);
  std::unique_ptr<Rep> rep_;
};

// Writes K/V of the step's new tokens into its slots in every layer: layers[l] holds layer l's
// K and V, [step.rows(), num_kv_heads, head_dim], all FP16 or all BF16; device memory on the CUDA
// backend, where the call enqueues one launch (see above) on launch.stream and returns. The bytes
// and the non-finite count are those of WriteKV(l, slots, layers[l]) for every l.
// CPU backend: WriteKV layer by layer, after checking every input (launch is ignored).
// InvalidArgument (nothing written) for a cache other than the step's, layers.size() other than
// num_layers, an input WriteKV would refuse, inputs of different dtypes, or (CUDA) a stream other
// than Create's; on the CPU backend, WriteKV's errors for slots made stale since Update;
// FailedPrecondition (nothing written) for a moved-from step, or on CUDA for a step whose
// Update came before a slab unmap (its slots may lie in unmapped memory: Update it again);
// Internal for a CUDA error.
KVTIER_EXPORT absl::Status WriteKVLayers(Cache& cache, const PreparedAppend& step,
                                         absl::Span<const KVInput> layers,
                                         const DeviceLaunch& launch = {});

}  // namespace kvtier

#endif  // KVTIER_PREPARED_APPEND_H_
