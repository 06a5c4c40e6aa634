// The cache: paged K/V storage for many sequences in a palette of formats over one budget.
//
// Thread-safety: a Cache is thread-safe. Every method takes one internal mutex (std::mutex); an engine's
// scheduler thread drives it while other threads (metrics, tools) read stats concurrently.
//
// Every fallible method returns absl::Status or absl::StatusOr and, on failure, leaves the
// cache exactly as it was. Nothing throws.
//
// Typical step of an engine:
//   cache->Append(seq, 1, &slots);          // reserve a slot for the new token
//   cache->WriteKV(layer, slots, kv);        // for each layer, after computing K/V
//   cache->BuildPageTables(batch, &tables);  // for attention
//   cache->EndStep();                        // retire freed pages, return empty slabs
#ifndef KVTIER_CACHE_H_
#define KVTIER_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/export.h"
#include "kvtier/ids.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"
#include "kvtier/policy.h"
#include "kvtier/stats.h"

namespace kvtier {

// Element types of tensors passed in. WriteKV accepts kFloat16 and kBFloat16.
enum class DType : uint8_t { kFloat16, kBFloat16, kFloat32 };

// K and V of `num_tokens` new tokens of one layer, each a contiguous row-major array
// [num_tokens, num_heads, head_dim] of `dtype`. The caller owns the memory. REQUIRES: k and v
// aligned to 16 bytes on the CUDA backend (its kernels load rows 16 bytes at a time), to their
// element on the CPU backend; InvalidArgument otherwise.
struct KVInput {
  DType dtype = DType::kFloat16;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
};

enum class BlockState : uint8_t {
  kFree,    // not holding data; its id is stale
  kInUse,   // referenced by at least one sequence
  kCached,  // unreferenced, kept for prefix reuse, evictable
  kOffloaded,  // unreferenced, kept for prefix reuse in the host tier (Options::host_tier_bytes)
};

struct BlockInfo {
  BlockState state = BlockState::kFree;
  int32_t format = 0;     // palette index
  int32_t page = 0;       // page index in that format's pools
  int32_t ref_count = 0;  // sequences holding the block
  int32_t num_tokens = 0;  // tokens filled, block_tokens when full
  // The largest attention weight reported for it (Cache::RecordAttention) times its
  // sequence's block count then: 1 is a uniform share. 0 before any report. Kept in 16 bits:
  // 8 significant bits, rounded down.
  float attention = 0;
};

// One (format, layer) pool as external kernels see it: page p starts at
// base + p * page_bytes, and each part of a page sits at a fixed offset (docs/formats.md).
// Only pages inside mapped slabs are accessible; touching another faults.
struct PoolInfo {
  void* base = nullptr;
  int64_t page_bytes = 0;
  int64_t capacity_pages = 0;     // page indices are below this
  int64_t k_offset = 0;           // K payload [heads, block_tokens, row_bytes]
  int64_t v_offset = 0;           // V payload, same shape
  int64_t row_bytes = 0;          // payload bytes per (head, token), K and V alike
  int64_t k_micro_offset = 0;     // NVFP4: E4M3 micro-scales of K (V's follow at v_micro_offset)
  int64_t v_micro_offset = 0;
  int64_t k_scale_offset = 0;     // fp32 per-(block, head) or per-(token, head) scales
  int64_t v_scale_offset = 0;
  float k_tensor_scale = 1.f;     // for per-tensor codecs: real = stored x scale
  float v_tensor_scale = 1.f;
  // The CUDA device holding the pool (the one current at Cache::Create); 0 on the CPU backend.
  int32_t device_id = 0;
};

// One block of the prefix index (Cache::IndexedBlocks).
struct IndexedBlock {
  uint64_t hash = 0;  // its prefix identity; KV events publish it unless kv_events_vllm_hash_seed
  BlockState state = BlockState::kFree;  // kInUse or kCached: device tier; kOffloaded: host tier
  int32_t format = 0;                    // palette index
};

// How a new sequence is admitted.
struct SequenceOptions {
  // Prompt tokens to match against cached prefixes: the longest run of whole cached blocks is
  // attached to the new sequence, leaving at least one prompt token for the engine to compute.
  // The caller then appends the remaining prompt tokens. Default: empty (no matching).
  absl::Span<const int32_t> prompt;
  // Makes equal tokens different content (adapter id, multimodal hash, cache salt). Only blocks
  // with the same extra key match. Default: 0.
  uint64_t extra_key = 0;
  // Per-request minimum precision: the coldest palette index this sequence's blocks may take.
  // A cached block colder than this is a miss, and policies never demote the sequence's blocks
  // below it (nor an offload, once cached, until another request takes the block up). Default:
  // -1, any palette format.
  int32_t coldest_format = -1;
  // Eviction priority, 0 to 7, of the blocks this sequence leaves cached when released: blocks
  // of a lower priority are evicted first. Default: 0 (plain LRU).
  int32_t priority = 0;
  // Steps (EndStep calls) after its release for which a block keeps `priority`; then it is
  // evicted like priority 0, ahead of blocks that are still fresh there, once it is the oldest
  // of its priority (a lapsed block behind one of that priority that has not lapsed, as with a
  // longer TTL, waits for it). Default: -1 (forever).
  int64_t priority_ttl_steps = -1;
};

struct AddResult {
  SequenceId id;
  int64_t cached_tokens = 0;  // prompt tokens found in the cache (a multiple of block_tokens)
  int64_t host_tokens = 0;    // of which brought back from the host tier
  int64_t remote_tokens = 0;  // of which read from the remote tier (Options::remote_tier_url)
  // A fence that passes once the blocks brought back from the host tier or read from the
  // remote tier hold their data (Cache::FencePassed); 0 when none was. Work on the CUDA
  // backend's stream, or on the legacy default stream, is ordered after the copies anyway.
  uint64_t ready_fence = 0;
};

class KVTIER_EXPORT Cache {
 public:
  // Creates a cache, reserving address space for every (format, layer) pool. Fails with
  // InvalidArgument naming the field when `options` is invalid, Unimplemented when the
  // backend is not built in, or the backend's error when memory cannot be reserved.
  static absl::StatusOr<std::unique_ptr<Cache>> Create(const Options& options);

  Cache() = default;
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;
  virtual ~Cache();

  virtual const Options& options() const = 0;

  // ---- Sequences ----

  // A new sequence, attached to the longest cached prefix of `options.prompt`. Matched blocks
  // gain a reference. With a remote tier, the blocks after the local match are looked up in
  // Redis before the cache's mutex is taken, waiting up to Options::remote_timeout_ms; a remote
  // failure is only a shorter match. InvalidArgument for an out-of-range coldest_format or
  // priority.
  virtual absl::StatusOr<AddResult> AddSequence(const SequenceOptions& options) = 0;
  // A new, empty sequence with default options.
  absl::StatusOr<SequenceId> AddSequence();

  // Reserves slots for `num_tokens` new tokens at the end of `seq`, allocating hot blocks as
  // needed (a tail block shared after Fork is copied first). Appends to `slots` one entry per
  // token: page * block_tokens + offset in the hot format's pools (vLLM's slot_mapping).
  // Without token ids the sequence's later blocks cannot be shared as a prefix: prefer
  // AppendTokens. When the budget is full, unreferenced cached prefixes are evicted first.
  // Errors: NotFound (unknown or stale seq), InvalidArgument (num_tokens < 1),
  // ResourceExhausted (the budget cannot hold the new blocks even after eviction).
  absl::Status Append(SequenceId seq, int64_t num_tokens, std::vector<int64_t>* slots);
  // As Append, with the token ids: each block that fills is indexed by its hash chain, so that
  // later requests with the same prefix share it.
  absl::Status AppendTokens(SequenceId seq, absl::Span<const int32_t> tokens,
                            std::vector<int64_t>* slots);

  // Append for a whole batch under one lock, all or nothing: num_tokens[i] tokens to batch[i],
  // slots appended in batch order. `tokens` is empty (no ids) or holds the ids of all new
  // tokens, batch order. The scheduler's call for a decode step.
  virtual absl::Status AppendBatch(absl::Span<const SequenceId> batch,
                                   absl::Span<const int64_t> num_tokens,
                                   absl::Span<const int32_t> tokens,
                                   std::vector<int64_t>* slots) = 0;

  // A new sequence with the same tokens as `parent`: full blocks are shared, and the partial
  // tail is shared until either sequence appends, which copies it first.
  virtual absl::StatusOr<SequenceId> Fork(SequenceId parent) = 0;

  // Drops `seq` and its references; blocks no other sequence holds stay cached when indexed
  // (evictable prefixes), else are freed. Freed pages are reused only after the backend's fence
  // for this step has passed. NotFound when unknown or already released.
  virtual absl::Status Release(SequenceId seq) = 0;
  // Release for a sequence whose K/V was not all written (its prefill failed): the blocks it
  // filled and indexed since the last EndStep (not those it matched or inherited through
  // Fork), and any indexed under them since, leave the prefix index (Removed events; no remote
  // write), so that no later prompt matches K/V that was never written. Such a block that
  // another sequence holds (one admitted meanwhile with that prefix, or a Fork) stays with it,
  // private, and that sequence indexes none of its later blocks: it may have computed them over
  // the missing K/V (abandon it too if it did). Blocks indexed before the last EndStep stay
  // cached, as after Release. NotFound when unknown or already released.
  virtual absl::Status Abandon(SequenceId seq) = 0;

  virtual absl::StatusOr<int64_t> SequenceLength(SequenceId seq) const = 0;
  // The blocks of `seq` in order.
  virtual absl::StatusOr<std::vector<BlockId>> SequenceBlocks(SequenceId seq) const = 0;
  // NotFound when `block` is unknown or stale.
  virtual absl::StatusOr<BlockInfo> GetBlockInfo(BlockId block) const = 0;

  // ---- Data ----

  // Writes K/V of `kv.num_tokens` tokens of `layer` into `slots` (as returned by Append),
  // encoding them into the hot format. REQUIRES: kv.dtype FP16 or BF16, kv shape
  // [slots.size(), num_kv_heads, head_dim]; every slot reserved and in a block that only one
  // sequence holds, or in one that AppendTokens filled and indexed since the last EndStep (a
  // request admitted meanwhile may share it already, and expects these K/V). InvalidArgument
  // otherwise (FailedPrecondition for a shared block), before anything is written.
  virtual absl::Status WriteKV(int32_t layer, absl::Span<const int64_t> slots,
                               const KVInput& kv) = 0;

  // Decodes `seq`'s K and V of `layer` to FP32, each [length, num_kv_heads, head_dim].
  // InvalidArgument when a span has the wrong size.
  virtual absl::Status ReadKV(SequenceId seq, int32_t layer, absl::Span<float> k,
                              absl::Span<float> v) const = 0;

  // The pool of palette format `format` in `layer`. InvalidArgument when out of range.
  virtual absl::StatusOr<PoolInfo> GetPool(int32_t format, int32_t layer) const = 0;

  // Requantises full blocks into palette format `format`, which must be colder than each
  // block's current format (blocks only move down the palette). Scales come from each block's
  // own data. The old pages are reclaimed after the step's fence. All or nothing:
  // NotFound (stale id), InvalidArgument (format out of range or not colder, a block listed
  // twice), FailedPrecondition (a partial block: the tail stays hot; a block in the host tier; a
  // format colder than a sharer's SequenceOptions::coldest_format allows), ResourceExhausted.
  virtual absl::Status Demote(absl::Span<const BlockId> blocks, int32_t format) = 0;

  // Runs `policy` from the next EndStep on: each step demotes the blocks whose age crossed a tier
  // boundary, at a cost bounded by the blocks that change tier. InvalidArgument when the policy
  // is malformed or a tier's format is not in the palette in palette order (the palette must
  // contain PolicyPalette(policy) in that order). Blocks already colder stay where they are.
  virtual absl::Status SetPolicy(const Policy& policy) = 0;

  // Sets `layer`'s per-tensor scales (codecs with ScaleScope::kTensor) from the absolute maxima
  // of the finite values in `kv` (FP16/BF16, [num_tokens, heads, head_dim], in host memory
  // whatever the backend: calibration data is a sample, not the live K/V). FailedPrecondition
  // when a block already holds data in a format with a per-tensor codec, whose pages were
  // encoded with the old scale.
  virtual absl::Status CalibrateTensorScales(int32_t layer, const KVInput& kv) = 0;

  // Records the attention `seq`'s blocks received, for policies with
  // Policy::attention_keep_ratio: `block_weight` holds one weight in [0, 1] per block of the
  // sequence, in order (its entries of DecodeOutputs::page_weight, in host memory). Each block
  // keeps the largest weight x block_weight.size() reported for it (BlockInfo::attention);
  // blocks shared with other sequences take the largest over their sharers. Call it before the
  // EndStep that would age the blocks. All or nothing: NotFound (unknown or stale seq),
  // InvalidArgument (a size other than the sequence's block count, a weight outside [0, 1]).
  virtual absl::Status RecordAttention(SequenceId seq, absl::Span<const float> block_weight) = 0;

  // ---- Step ----

  // Page tables for `batch`, in its order, into `tables` (whose vectors are reused).
  // NotFound for an unknown sequence, leaving `tables` unchanged.
  virtual absl::Status BuildPageTables(absl::Span<const SequenceId> batch,
                                       PageTables* tables) const = 0;
  // OK when every page `tables` name (their packed entries) holds a block on the device now;
  // FailedPrecondition naming the first that does not: tables built before the cache changed
  // (a release, EndStep's moves), or another cache's, whose pages may lie in unmapped slabs.
  // O(blocks + entries). The CPU backend's attention calls it; on CUDA it is the caller's.
  virtual absl::Status CheckTablesHeld(const PageTables& tables) const = 0;
  // OK when no slab of the cache's device pools has been unmapped since BuildPageTables made
  // `tables` (PageTables::slab_unmaps), so that every page they name lies in mapped memory and
  // reading it cannot fault (whether it still holds the same block is CheckTablesHeld's
  // question); FailedPrecondition otherwise: tables from before a release and an EndStep, or an
  // Append that took another format's empty slabs. O(1): the CUDA backend's attention calls it
  // at every call, where a stale page would fault the device.
  virtual absl::Status CheckTablesMapped(const PageTables& tables) const = 0;

  // Ends a decode step: runs the policy (demotions planned from the sequences that grew, and
  // window shrinking under pressure), records the backend fence for work issued so far, returns
  // pages whose fences have passed to their slabs and empty slabs to the budget. With a remote
  // tier, first copies the blocks that filled and were indexed since the last EndStep (their
  // K/V written by now) into host buffers and queues them for Redis (on CUDA that copy waits
  // for the stream to reach it).
  virtual absl::Status EndStep() = 0;
  // True once the device work issued before `fence` (AddResult::ready_fence, RecordFence) has
  // completed; fences pass in order. Always true on the CPU backend and for fence 0.
  virtual absl::StatusOr<bool> FencePassed(uint64_t fence) = 0;
  // A fence after the device work the cache has issued on its own stream so far, WriteKV's
  // reads of its inputs included (not work on a caller's stream: DecodeAttention, a
  // PreparedAppend's writes): once FencePassed(fence), the caller may free or overwrite those
  // inputs (on CUDA WriteKV returns with its copy queued). A CUDA error's status otherwise
  // (ResourceExhausted when no event can be made, else Internal).
  virtual absl::StatusOr<uint64_t> RecordFence() = 0;

  // ---- Introspection ----

  virtual CacheStats GetStats() const = 0;

  // Every block of the prefix index, in no particular order: the set of blocks per tier that
  // KV events describe (docs/events.md). Cost: O(blocks).
  virtual std::vector<IndexedBlock> IndexedBlocks() const = 0;

  // Verifies every internal invariant: each block in exactly one state, reference counts equal
  // references, free + used = capacity per pool, every used page inside a mapped slab.
  // Internal with a description of the first violation. Cost: O(blocks + pages).
  virtual absl::Status CheckConsistency() const = 0;
};

}  // namespace kvtier

#endif  // KVTIER_CACHE_H_
