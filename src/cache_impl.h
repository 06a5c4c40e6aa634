// The Cache implementation: sequences of blocks, per-format page pools over one slab budget,
// a reclamation queue, and a backend that moves the bytes. One mutex guards all state.
#ifndef KVTIER_SRC_CACHE_IMPL_H_
#define KVTIER_SRC_CACHE_IMPL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "src/mutex.h"
#include "kvtier/cache.h"
#include "src/backend.h"
#include "src/block_table.h"
#include "src/evictor.h"
#include "src/histogram.h"
#include "src/page_pool.h"
#include "src/prefix_index.h"
#include "src/reclaim_queue.h"
#include "src/sequence_table.h"

namespace kvtier {

class CacheImpl final : public Cache {
 public:
  // REQUIRES: ValidateOptions(options) is OK.
  static absl::StatusOr<std::unique_ptr<CacheImpl>> Create(const Options& options,
                                                           std::unique_ptr<Backend> backend);
  ~CacheImpl() override;

  const Options& options() const override { return options_; }
  absl::StatusOr<AddResult> AddSequence(const SequenceOptions& options) override;
  absl::Status AppendBatch(absl::Span<const SequenceId> batch, absl::Span<const int64_t> num_tokens,
                           absl::Span<const int32_t> tokens, std::vector<int64_t>* slots) override;
  absl::StatusOr<SequenceId> Fork(SequenceId parent) override;
  absl::Status Release(SequenceId seq) override;
  absl::StatusOr<int64_t> SequenceLength(SequenceId seq) const override;
  absl::StatusOr<std::vector<BlockId>> SequenceBlocks(SequenceId seq) const override;
  absl::StatusOr<BlockInfo> GetBlockInfo(BlockId block) const override;
  absl::Status WriteKV(int32_t layer, absl::Span<const int64_t> slots,
                       const KVInput& kv) override;
  absl::Status ReadKV(SequenceId seq, int32_t layer, absl::Span<float> k,
                      absl::Span<float> v) const override;
  absl::StatusOr<PoolInfo> GetPool(int32_t format, int32_t layer) const override;
  absl::Status BuildPageTables(absl::Span<const SequenceId> batch,
                               PageTables* tables) const override;
  absl::Status Demote(absl::Span<const BlockId> blocks, int32_t format) override;
  absl::Status CalibrateTensorScales(int32_t layer, const KVInput& kv) override;
  absl::Status SetPolicy(const Policy& policy) override;
  absl::Status EndStep() override;
  CacheStats GetStats() const override;
  absl::Status CheckConsistency() const override;

 private:
  CacheImpl(const Options& options, std::unique_ptr<Backend> backend);

  int num_formats() const { return static_cast<int>(layouts_.size()); }
  PoolView View(int format, int layer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t* SlotAddress(int format, int layer, uint32_t slot) const;

  // Makes `count` pages of `format` allocatable, mapping slabs from the budget, taking empty
  // slabs from other formats' pools, and, when `may_evict`, evicting cached prefixes
  // (leaf-first) when neither suffices. ResourceExhausted when it cannot, with nothing changed
  // if even evicting every cached block could not have made room.
  absl::Status EnsureFreePages(int format, uint32_t count, bool may_evict = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pages of `format` allocatable without eviction.
  uint64_t RoomFor(int format) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Slabs obtainable now for a pool other than `format`'s: free, or empty in another pool.
  uint32_t AvailableSlabs(int format) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts one cached block; false when none is evictable.
  bool EvictOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a block's page for reclamation and frees its metadata.
  void FreeBlock(uint32_t block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Indexes the block that `seq`'s tail tokens just filled, when `seq` is hashing.
  void IndexFullTail(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a reference to a block found in the prefix index for `seq`.
  void Attach(Sequence& seq, uint32_t block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MapSlot(int format) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UnmapSlot(int format, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new in-use block with a page of `format`, born at `now_ms` (NowMs(), read once per call
  // by callers that allocate many). REQUIRES: EnsureFreePages(format, 1) passed.
  uint32_t NewBlock(int format, uint32_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one reference held by `seq`. At the last one an indexed block becomes cached (and
  // evictable when it is a leaf); any other block is freed.
  void DropRef(uint32_t block, const Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireSynchronous() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tokens the last block of `seq` can still take (0 when it is full or there is none).
  int64_t TailRoom(const Sequence& seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the shared partial tail of `seq` with a private copy.
  // REQUIRES: a free page of the hot format.
  absl::Status CopyTail(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Demote's body for validated, distinct block indices all hotter than `format`.
  absl::Status DemoteLocked(absl::Span<const uint32_t> blocks, int format)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The policy pass of EndStep (cache_policy.cc).
  void RunPolicy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues into demote_queue_ the blocks of `seq` that crossed a tier boundary.
  void AgeSequence(Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDirty(SequenceId id, Sequence& seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLayer(int32_t layer) const;
  absl::Status CheckInput(const KVInput& kv, int64_t num_tokens) const;
  absl::Status CheckSlots(int32_t layer, absl::Span<const int64_t> slots, const KVInput& kv) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<Backend> backend_;
  const std::vector<PageLayout> layouts_;  // [format]
  const uint32_t num_slabs_;               // per layer
  const size_t range_bytes_;               // reserved per (format, layer)
  std::vector<uint8_t*> bases_;            // [format * layers + layer], fixed after Create

  mutable Mutex mu_;
  std::vector<PagePool> pools_ ABSL_GUARDED_BY(mu_);  // [format]
  std::vector<float> k_scales_ ABSL_GUARDED_BY(mu_);  // [format * layers + layer]
  std::vector<float> v_scales_ ABSL_GUARDED_BY(mu_);
  uint32_t free_slabs_ ABSL_GUARDED_BY(mu_);
  BlockTable blocks_ ABSL_GUARDED_BY(mu_);
  SequenceTable sequences_ ABSL_GUARDED_BY(mu_);
  PrefixIndex index_ ABSL_GUARDED_BY(mu_);
  Evictor evictor_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> cached_by_format_ ABSL_GUARDED_BY(mu_);  // [format]
  int64_t prefix_queried_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_hit_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_hit_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t prefix_missed_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_blocks_ ABSL_GUARDED_BY(mu_) = 0;

  // The policy in force, resolved to palette indices (cache_policy.cc).
  struct ActivePolicy {
    std::string name;
    std::vector<int> tier_format;   // [tier] palette index
    std::vector<int64_t> bounds;    // [tier] max_age_tokens, -1 for the last
    int64_t sink_tokens = 0;
    double watermark = 0;
    double window_scale = 1;
  };
  std::optional<ActivePolicy> policy_ ABSL_GUARDED_BY(mu_);
  bool under_pressure_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<SequenceId> dirty_ ABSL_GUARDED_BY(mu_);
  // AppendBatch's sequences, found once (capacity kept across calls: no steady-state allocation).
  std::vector<Sequence*> batch_sequences_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint32_t>> demote_queue_ ABSL_GUARDED_BY(mu_);  // [target format]
  int64_t demotions_under_pressure_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t policy_demotion_failures_ ABSL_GUARDED_BY(mu_) = 0;

  // Residency and migration timing, on a millisecond clock from creation.
  uint32_t NowMs() const;
  static constexpr uint32_t kNoTime = 0xFFFFFFFFu;
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  Histogram migration_seconds_ ABSL_GUARDED_BY(mu_){Histogram::Exponential(1e-5, 4, 10)};
  Histogram block_lifetime_seconds_ ABSL_GUARDED_BY(mu_){Histogram::Exponential(0.01, 4, 12)};
  Histogram idle_before_evict_seconds_ ABSL_GUARDED_BY(mu_){Histogram::Exponential(0.01, 4, 12)};
  ReclaimQueue reclaim_ ABSL_GUARDED_BY(mu_);
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t allocation_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t copy_on_write_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t slab_moves_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t nonfinite_values_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<MigrationStats> migrations_ ABSL_GUARDED_BY(mu_);  // [from * formats + to]
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CACHE_IMPL_H_
