// The Cache implementation: sequences of blocks, prefix sharing and matching, copy-on-write,
// and the precision policy, over a block pool (blocks, index, eviction) on a page store
// (pools, slabs, reclamation), with a backend that moves the bytes. One mutex guards all state.
//
// Files: cache_impl.cc (sequences, sharing, matching), cache_data.cc (K/V in and out, page
// tables, pools), cache_policy.cc (the policy pass and demotion), cache_remote.cc (the remote
// tier's reads and writes), consistency_check.cc.
#ifndef KVTIER_SRC_CACHE_IMPL_H_
#define KVTIER_SRC_CACHE_IMPL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "kvtier/cache.h"
#include "src/backend.h"
#include "src/block_events.h"
#include "src/block_pool.h"
#include "src/cache_metrics.h"
#include "src/mutex.h"
#include "src/page_store.h"
#include "src/remote_block_codec.h"
#include "src/remote_staging.h"
#include "src/remote_tier.h"
#include "src/sequence_table.h"

namespace kvtier {

class CacheImpl final : public Cache {
 public:
  // REQUIRES: ValidateOptions(options) is OK.
  // `events` (or null) receives the block events.
  static absl::StatusOr<std::unique_ptr<CacheImpl>> Create(
      const Options& options, std::unique_ptr<Backend> backend,
      std::unique_ptr<BlockEventSink> events);
  // Publishes AllBlocksCleared to the event sink, if any.
  ~CacheImpl() override;

  const Options& options() const override { return options_; }
  absl::StatusOr<AddResult> AddSequence(const SequenceOptions& options) override;
  absl::Status AppendBatch(absl::Span<const SequenceId> batch, absl::Span<const int64_t> num_tokens,
                           absl::Span<const int32_t> tokens, std::vector<int64_t>* slots) override;
  absl::StatusOr<SequenceId> Fork(SequenceId parent) override;
  absl::Status Release(SequenceId seq) override;
  absl::Status Abandon(SequenceId seq) override;
  absl::StatusOr<int64_t> SequenceLength(SequenceId seq) const override;
  absl::StatusOr<std::vector<BlockId>> SequenceBlocks(SequenceId seq) const override;
  absl::StatusOr<BlockInfo> GetBlockInfo(BlockId block) const override;
  absl::Status WriteKV(int32_t layer, absl::Span<const int64_t> slots,
                       const KVInput& kv) override;
  absl::Status ReadKV(SequenceId seq, int32_t layer, absl::Span<float> k,
                      absl::Span<float> v) const override;
  absl::StatusOr<PoolInfo> GetPool(int32_t format, int32_t layer) const override;
  absl::Status CheckTablesHeld(const PageTables& tables) const override;
  absl::Status CheckTablesMapped(const PageTables& tables) const override;
  absl::Status BuildPageTables(absl::Span<const SequenceId> batch,
                               PageTables* tables) const override;
  absl::Status Demote(absl::Span<const BlockId> blocks, int32_t format) override;
  absl::Status CalibrateTensorScales(int32_t layer, const KVInput& kv) override;
  absl::Status SetPolicy(const Policy& policy) override;
  absl::Status RecordAttention(SequenceId seq, absl::Span<const float> block_weight) override;
  absl::Status EndStep() override;
  absl::StatusOr<bool> FencePassed(uint64_t fence) override;
  absl::StatusOr<uint64_t> RecordFence() override;
  CacheStats GetStats() const override;
  std::vector<IndexedBlock> IndexedBlocks() const override;
  absl::Status CheckConsistency() const override;

  // PreparedAppend's hooks (src/prepared_append.cc), each taking the mutex where it reads state.
  // OK when WriteKV could write into `slots` now; otherwise CheckSlot's error for the first bad
  // slot, naming its index.
  absl::Status CheckSlotList(absl::Span<const int64_t> slots) const;
  // InvalidArgument unless `kv` is an FP16 or BF16 input of `num_tokens` tokens of this geometry.
  absl::Status CheckInput(const KVInput& kv, int64_t num_tokens) const;
  // The backend's device counter for appends enqueued on callers' streams, bound to this
  // cache's count (CacheStats::nonfinite_values); null on the CPU backend.
  absl::StatusOr<void*> DeviceNonfiniteCounter();
  // Backend::JoinStream.
  absl::Status JoinStream(void* stream, bool stream_waits);
  // The device store's count of slab unmaps (PageTables::slab_unmaps, CheckTablesMapped).
  uint64_t SlabUnmaps() const;
  // OK when the count is still `slab_unmaps`; else FailedPrecondition: `what` (pages named
  // then) may lie in unmapped memory.
  absl::Status CheckMappedSince(uint64_t slab_unmaps, absl::string_view what) const;

 private:
  CacheImpl(const Options& options, std::unique_ptr<Backend> backend,
            std::unique_ptr<PageStore> pages, std::unique_ptr<PageStore> host,
            std::unique_ptr<BlockEventSink> events, std::unique_ptr<RemoteTier> remote,
            std::unique_ptr<RemoteStaging> staging);

  // What AddSequence found in the remote tier before taking the mutex.
  struct RemoteFetch {
    absl::Span<const int32_t> prompt;   // SequenceOptions::prompt
    int64_t first = 0;                  // the first prompt block looked up
    std::vector<uint64_t> hashes;       // of every matchable prompt block
    std::vector<std::string> values;    // the leading values found from `first` on
    std::vector<DecodedBlock> blocks;   // the leading valid ones, into `values`
    std::vector<uint64_t> scales_digest;  // [format] that they were checked against
  };

  int num_formats() const { return static_cast<int>(options_.palette.size()); }

  // Sequences and sharing (cache_impl.cc).
  // Indexes the block that `seq`'s tail tokens just filled (and lists it in indexed_this_step_).
  void IndexFullTail(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block's id as one key: index and generation.
  static uint64_t BlockKey(BlockId id) { return uint64_t{id.index} << 32 | id.generation; }
  // A sequence's id as one key, the same way.
  static uint64_t SequenceKey(const Sequence& seq) {
    return uint64_t{seq.index} << 32 | seq.generation;
  }
  // Appends to `seq` a block found in the prefix index, already referenced for it.
  void Attach(Sequence& seq, uint32_t block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one reference held by `seq` (pool_.Unreferenced at the last).
  void DropRef(uint32_t block, const Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Release's work on the live sequence `seq`.
  void ReleaseLocked(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Abandon's (cache_abandon.cc): withdraws from the prefix index the blocks that `seq` filled
  // since the last EndStep and every block indexed under them, each after its indexed children
  // (BlockPool::Withdraw). Returns the blocks withdrawn.
  absl::flat_hash_set<uint32_t> WithdrawFilledBlocks(const Sequence& seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops indexing the later blocks of every live sequence but `seq` that holds one of
  // `withdrawn`: they may be computed over K/V that was never written.
  void StopHashingOver(const absl::flat_hash_set<uint32_t>& withdrawn, const Sequence& seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tokens the last block of `seq` can still take (0 when it is full or there is none).
  int64_t TailRoom(const Sequence& seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What appending `num_tokens[i]` to each `batch` sequence needs: pages of the hot format, of
  // which `shared_tails` are copies of partial tails that other sequences share.
  struct AppendPlan {
    int64_t pages = 0;
    int64_t shared_tails = 0;
  };
  // Plans an AppendBatch and finds its sequences into batch_sequences_. NotFound for an unknown
  // sequence.
  absl::StatusOr<AppendPlan> PlanAppend(absl::Span<const SequenceId> batch,
                                        absl::Span<const int64_t> num_tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `n` tokens to `seq`: its ids are tokens[*next_token..+n) (hashed while the
  // sequence hashes), and *next_token moves past them whenever `tokens` holds ids.
  void AppendTokensLocked(Sequence& seq, int64_t n, absl::Span<const int32_t> tokens,
                          size_t* next_token, uint32_t* now_ms, std::vector<int64_t>* slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `s`, counted in allocation_failures when it answers the caller ResourceExhausted. Only the
  // calls that pass a refusal on count it: a shorter prefix match (no room to onload or import)
  // or a policy demotion left for the next step refuses nothing.
  absl::Status CountRefusal(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the shared partial tail of `seq` with a private copy.
  // REQUIRES: a free page of the hot format.
  absl::Status CopyTail(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The remote tier (cache_remote.cc).
  // Looks up the prompt blocks after the local match in Redis. Takes mu_ briefly.
  RemoteFetch FetchRemote(const SequenceOptions& options) ABSL_LOCKS_EXCLUDED(mu_);
  // Attaches to `seq`, whose first `matched` prompt blocks are attached, the fetched blocks
  // that follow them, each in a new device page and published in the index. Returns how many.
  int64_t ImportRemote(Sequence& seq, const RemoteFetch& fetched, int64_t matched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ImportBlock(Sequence& seq, uint64_t hash, const DecodedBlock& block,
                   absl::Span<const int32_t> tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues block `block`, just indexed under `hash`, for the next StageRemoteWrites.
  void QueueRemoteWrite(uint32_t block, uint64_t hash) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies the queued blocks still indexed on the device into values for the writer thread.
  void StageRemoteWrites() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RemoteBlockSpec RemoteSpec() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // K/V in and out (cache_data.cc).
  absl::Status CheckLayer(int32_t layer) const;
  // OK when `slot` is reserved in a block that only one sequence holds, or in one indexed in
  // this step; otherwise which case it is (out of range, a released or empty page, an
  // unreserved offset, a shared block).
  absl::Status CheckSlot(int64_t slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSlots(int32_t layer, absl::Span<const int64_t> slots, const KVInput& kv) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Policy and demotion (cache_policy.cc).
  // Demote's body for validated, distinct block indices all hotter than `format`.
  absl::Status DemoteLocked(absl::Span<const uint32_t> blocks, int format)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The blocks of one source format requantised into new pages (dst) of the target format,
  // not moved yet.
  struct Requantized {
    int from;
    std::vector<uint32_t> blocks, dst;
  };
  // Requantises the blocks of `ids` now in format `from` into new pages of `format`; on failure
  // frees those pages.
  absl::StatusOr<Requantized> RequantizeFrom(int from, absl::Span<const uint32_t> ids, int format)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The policy pass of EndStep.
  void RunPolicy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates under_pressure_ from the free budget; a change lists every sequence.
  void UpdatePressure() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Demotes what fits of demote_queue_[format]; what finds no room stays queued.
  void DrainDemoteQueue(int format) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compaction at EndStep (cache_compact.cc): when no slab of the budget is free or empty, moves
  // the blocks of a pool's emptiest slabs into its scattered free pages so the slabs can return.
  void CompactPools() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether compaction could move a slab once every retired page is back (a necessary test,
  // without waiting for the device).
  bool MayCompact() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves every owned page of `slot` of pool `format` elsewhere in that pool; on failure moves
  // nothing.
  absl::Status CompactSlot(int format, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues into demote_queue_ the blocks of `seq` that crossed a tier boundary.
  void AgeSequence(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a sharer's crossing of shared block `b` into tiers from + 1 to k (it had voted up to
  // `from` before); returns the coldest tier up to k every sharer has crossed (0: none).
  int VoteCrossed(uint32_t b, int from, int k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `seq`, about to drop its reference to its block `position`, leaves that block's votes: those
  // its cursors cast are withdrawn, and the block is queued for the coldest tier every remaining
  // sharer has crossed.
  void LeaveVote(const Sequence& seq, size_t position) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDirty(SequenceId id, Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkAllDirty() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<Backend> backend_;

  mutable Mutex mu_;
  CacheMetrics metrics_ ABSL_GUARDED_BY(mu_);
  // Outlives the pool that calls it; its own methods are called under mu_.
  const std::unique_ptr<BlockEventSink> events_ ABSL_PT_GUARDED_BY(mu_);
  const std::unique_ptr<PageStore> pages_ ABSL_PT_GUARDED_BY(mu_);
  BlockPool pool_ ABSL_GUARDED_BY(mu_);
  SequenceTable sequences_ ABSL_GUARDED_BY(mu_);
  // AppendBatch's sequences, found once (capacity kept across calls: no steady-state allocation).
  std::vector<Sequence*> batch_sequences_ ABSL_GUARDED_BY(mu_);
  // PlanAppend's number for its batch (Sequence::planned_by); 0 is no batch's.
  uint64_t batch_number_ ABSL_GUARDED_BY(mu_) = 0;
  // The blocks indexed since the last EndStep (BlockKey), each with the sequence that filled it
  // (SequenceKey): their K/V is due by then, and a request admitted meanwhile may already share
  // them, so their owner's WriteKV still goes through (the same tokens, so the same K/V); an
  // owner that abandons them withdraws them (cache_abandon.cc).
  absl::flat_hash_map<uint64_t, uint64_t> indexed_this_step_ ABSL_GUARDED_BY(mu_);

  // The policy in force, resolved to palette indices (cache_policy.cc).
  struct ActivePolicy {
    std::string name;
    std::vector<int> tier_format;   // [tier] palette index
    std::vector<int64_t> bounds;    // [tier] max_age_tokens, -1 for the last
    int64_t sink_tokens = 0;
    double watermark = 0;
    double window_scale = 1;
    double keep_ratio = 0;  // Policy::attention_keep_ratio
  };
  std::optional<ActivePolicy> policy_ ABSL_GUARDED_BY(mu_);
  bool under_pressure_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SequenceId> dirty_ ABSL_GUARDED_BY(mu_);
  // Shared blocks' votes, by block index: [k] sharers whose age for the block has crossed tier
  // k's bound (saturating at 65535; crossing k counts for every tier up to k). A shared block
  // moves to tier k once all have. Kept for blocks with a vote and more than one holder.
  absl::flat_hash_map<uint32_t, std::array<uint16_t, kMaxPolicyTiers>> shared_votes_
      ABSL_GUARDED_BY(mu_);
  // [target format] Blocks the policy moves colder, by id: a block that cannot move in its
  // step stays queued, and its index may name another block by the next.
  std::vector<std::vector<BlockId>> demote_queue_ ABSL_GUARDED_BY(mu_);

  // The remote tier (thread-safe itself), null without one, and the blocks indexed since the
  // last EndStep that it should receive.
  const std::unique_ptr<RemoteTier> remote_;
  const std::unique_ptr<RemoteStaging> staging_ ABSL_PT_GUARDED_BY(mu_);  // with remote_
  struct PendingWrite {
    BlockId id;
    uint64_t hash;
  };
  std::vector<PendingWrite> remote_pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CACHE_IMPL_H_
