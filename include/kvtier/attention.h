// Decode attention over a cache's pages, with the backend of the cache: the CPU reference on the
// CPU backend, kvtier's fused mixed-format kernel on the CUDA backend (docs/attention.md).
//
// One engine step:
//   cache->BuildPageTables(batch, &tables);
//   auto step = kvtier::PreparedDecode::Create(*cache, tables);    // once per step
//   for each layer: kvtier::DecodeAttention(*cache, layer, *step, queries, outputs);
//
// Math: logits l_i = softmax_scale * (q . k_i); LSE = log(sum_i exp(l_i)) in natural log;
// output = sum_i exp(l_i - LSE) v_i. GQA: query head h reads KV head
// h / (num_q_heads / num_kv_heads). A cache with rotated keys (Options::key_rotation) stores
// R_h k, and both paths rotate each query by R_h of its KV head first (the same logits up to
// rounding). An empty sequence (length 0) returns a zero output and
// LSE = -inf. A head with a NaN or +inf logit (e.g. from a NaN or infinite query), or whose
// logits are all -inf, gets NaN output and LSE on both backends. The CPU path accumulates in
// double and decodes every page with the cache's own codecs, so it sees exactly what the cache
// stores; the fused kernel's accuracy against it is stated in docs/attention.md.
//
// Thread-safety: the functions are thread-compatible; they read the pools without locking, so
// the caller must not write, demote or release the sequences being attended until the attention
// has finished (on the device, for the CUDA backend).
#ifndef KVTIER_ATTENTION_H_
#define KVTIER_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/cache.h"
#include "kvtier/device_launch.h"
#include "kvtier/export.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// The queries of one decode step. On the CUDA backend `q` describes device memory.
struct DecodeQueries {
  absl::Span<const float> q;     // [batch, num_q_heads, head_dim]
  int32_t num_q_heads = 0;       // REQUIRES: a positive multiple of num_kv_heads
  float softmax_scale = 0.f;     // usually 1 / sqrt(head_dim)
};

// Where results go. The caller owns the memory (device memory on the CUDA backend).
struct DecodeOutputs {
  absl::Span<float> out;  // [batch, num_q_heads, head_dim]
  absl::Span<float> lse;  // [batch, num_q_heads], natural log
  // Optional (empty to skip): the scaled logits l_i, [batch, num_q_heads, logits_stride]; key i
  // of sequence b at [b][h][i]; entries at or beyond the sequence's length are set to -inf.
  // On the CUDA backend (device memory) a second kernel computes them beside the fused one, in
  // FP32 from the keys as stored (with q unrounded, unlike the fused kernel's FP16 q): within
  // 1e-5 x softmax_scale x |q| |k_i| of the CPU reference's; the output and LSE bits are those
  // of the same call without logits. For tools and tests (the recall sweep), not a decode step:
  // it writes batch x num_q_heads x logits_stride floats.
  // REQUIRES when given: logits_stride >= every sequence's length.
  absl::Span<float> logits;
  int64_t logits_stride = 0;
  // Optional (empty to skip): the attention each page received, for Cache::RecordAttention.
  // One float per packed entry of the tables ([tables.packed_indptr[batch]], in their order):
  // the largest weight any query head of this layer gave the page (the sum over its tokens of
  // exp(l_i - LSE)), in [0, 1]. The call stores max(page_weight[e], weight), so one buffer
  // collects a step's layers: zero it first. A head whose LSE is not finite adds nothing.
  // Device memory on the CUDA backend.
  absl::Span<float> page_weight;
};

// Decode attention over `layer` of `cache` for the batch of `tables` (BuildPageTables of this
// step), using tables.packed_indptr / packed / seq_lens. CPU backend: the reference on host
// spans (`launch` is ignored). CUDA backend: the fused kernel (and, for outputs.logits, the
// logits kernel); `tables` are copied to the device by the call (so they may be freed when it
// returns) and the work runs on launch.stream. REQUIRES (CUDA): launch.stream is ordered after
// the cache's own device work (WriteKV, Append's tail copies, EndStep's moves), which runs on a
// stream ordered with the legacy default stream: so the default stream is; another stream is
// not, unless its K/V is written on it (PreparedAppend) or the engine orders it (an event after
// the cache's calls, or a device synchronisation). Not checked.
// InvalidArgument for inconsistent shapes: spans of the wrong size, num_q_heads not a multiple
// of num_kv_heads, a sequence whose page count does not match its length, a packed entry naming
// a format outside the palette or a page outside its pool's reserved pages. FailedPrecondition on
// the CPU backend for a page that holds no block now (Cache::CheckTablesHeld: tables of an
// earlier step, or of another cache); on CUDA for tables made before a slab was unmapped
// (Cache::CheckTablesMapped, O(1): their pages may lie in unmapped memory, which would fault the
// device), while a page whose block changed but whose slab stays mapped is read as it is:
// REQUIRES tables that BuildPageTables made in this step, pages that hold blocks now (on CUDA
// the unmapped-slab refusal comes before any shape check). InvalidArgument also, on
// CUDA, for a head_dim other than 128, pages of other than 16 tokens, GQA groups over 16, or BF16
// pages, which the fused kernel does not read, and for page weights whose scratch, the tables'
// packed entries (their capacity, for a PreparedDecode) times num_q_heads (each GQA group
// rounded up to even), would pass 2^32 - 1 floats (the kernel's scratch index).
// Unavailable in builds without CUDA; Internal for a CUDA error.
KVTIER_EXPORT absl::Status DecodeAttention(const Cache& cache, int32_t layer,
                                           const PageTables& tables, const DecodeQueries& queries,
                                           const DecodeOutputs& outputs,
                                           const DeviceLaunch& launch = {});

// A decode step's page tables made ready once for every layer's DecodeAttention of that step:
// checked against the cache's palette and, on the CUDA backend, copied to the device on
// launch.stream (Create does not synchronize). An engine makes one per step after
// BuildPageTables and passes it to each layer's call, which on CUDA then does no per-page host
// work and no copy. Valid, like the tables, until the cache changes (Append, Demote, EndStep):
// on CUDA a stale step is refused once a slab has been unmapped since its tables were made
// (Cache::CheckTablesMapped, at every call), otherwise read as it is; pages outside the pools
// are refused (the CPU backend checks its pages, Cache::CheckTablesHeld). Move-only.
// CUDA streams: the step may be read from any stream. A call on a stream other than Create's
// first makes that stream wait for the upload (an event recorded by Create), and records the end
// of its work there; destroying the step frees the device copy on Create's stream once every
// stream that read it has finished those reads (without blocking the host). The step may be
// destroyed as soon as the last call returns.
// REQUIRES (CUDA): Create's stream outlives the step (or is the default stream). Calls captured
// into a CUDA graph are not tracked: the upload must be complete before such a graph runs, and
// the step must outlive its runs (e.g. run the graph on Create's stream and destroy the step
// after the last run was enqueued there).
// Thread-safety: const methods may be called concurrently, and DecodeAttention over one step
// may run concurrently on several threads and streams.
class KVTIER_EXPORT PreparedDecode {
 public:
  // With room for the step's sequences to grow to `max_pages` pages each (Default 0: the
  // tables' longest), for Update: the split of each sequence's pages across the GPU is planned
  // for that many, and how FP16 pages are read (staged when they are most of these tables'
  // pages) is chosen from these tables, so the results of a step depend on max_pages and on
  // its first tables (bits, not accuracy).
  // InvalidArgument when the tables are inconsistent (as DecodeAttention says) or name a format
  // outside the palette, or max_pages outside [0, ceil(2^31 / block_tokens)] (the pages an int32
  // length can take); Unavailable on CUDA in builds without CUDA; Internal for a CUDA error.
  static absl::StatusOr<PreparedDecode> Create(const Cache& cache, const PageTables& tables,
                                               const DeviceLaunch& launch = {},
                                               int32_t max_pages = 0);

  // Makes the step the one of `tables`, a later step's tables of the same sequences (e.g. after
  // each sequence's Append), in place: on CUDA the copy goes to the same device buffers, on
  // Create's stream, after the reads of the previous tables on other streams. So a CUDA graph
  // that captured DecodeAttention over this step on Create's stream replays over the new
  // tables, with the same bits as an uncaptured call. Not concurrent with the const methods.
  // InvalidArgument (the step unchanged) when the tables are inconsistent, have another number
  // of sequences, or a sequence over max_pages pages; FailedPrecondition for a moved-from step;
  // Internal for a CUDA error (the step's device tables are then undefined: destroy it).
  absl::Status Update(const PageTables& tables);
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

}  // namespace kvtier

#endif  // KVTIER_ATTENTION_H_
