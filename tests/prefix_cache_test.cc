// Prefix sharing and eviction through the public API.
#include <numeric>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::ExpectSameState;
using ::kvtier::testing::MustCreate;
using ::kvtier::testing::SmallOptions;
using ::kvtier::testing::Tokens;

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { cache_ = MustCreate(SmallOptions(/*slabs_per_layer=*/1)); }
  void TearDown() override {
    EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
  }

  // A sequence that computed `tokens` and was released, leaving its full blocks cached.
  void Serve(const std::vector<int32_t>& tokens, SequenceOptions options = {}) {
    const AddResult added = *cache_->AddSequence(options);
    std::vector<int64_t> slots;
    ASSERT_TRUE(cache_->AppendTokens(added.id, tokens, &slots).ok());
    ASSERT_TRUE(cache_->Release(added.id).ok());
  }

  // An owner that filled the first three blocks of `prompt` in this step, and a sharer admitted
  // meanwhile with its first 50 tokens, which matches those blocks: {owner, sharer}.
  std::pair<SequenceId, SequenceId> OwnerAndSharer(const std::vector<int32_t>& prompt) {
    const AddResult owner = *cache_->AddSequence({});
    std::vector<int64_t> slots;
    EXPECT_TRUE(
        cache_->AppendTokens(owner.id, absl::MakeConstSpan(prompt).subspan(0, 48), &slots).ok());
    SequenceOptions options;
    options.prompt = absl::MakeConstSpan(prompt).subspan(0, 50);
    const AddResult sharer = *cache_->AddSequence(options);
    EXPECT_EQ(sharer.cached_tokens, 48);
    return {owner.id, sharer.id};
  }

  std::unique_ptr<Cache> cache_;
};

TEST_F(PrefixCacheTest, ASharedPromptIsMatchedAndLeavesOneTokenToCompute) {
  const std::vector<int32_t> prompt = Tokens(50, 1000);
  const AddResult first = *cache_->AddSequence({});
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(first.id, prompt, &slots).ok());
  const std::vector<BlockId> first_blocks = *cache_->SequenceBlocks(first.id);

  SequenceOptions options;
  options.prompt = prompt;
  const AddResult second = *cache_->AddSequence(options);
  EXPECT_EQ(second.cached_tokens, 48);
  EXPECT_EQ(*cache_->SequenceLength(second.id), 48);
  const std::vector<BlockId> shared = *cache_->SequenceBlocks(second.id);
  ASSERT_EQ(shared.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(shared[i], first_blocks[i]);
    EXPECT_EQ(cache_->GetBlockInfo(shared[i])->ref_count, 2);
  }
  // A prompt of exactly three blocks keeps its last block to compute.
  options.prompt = absl::MakeConstSpan(prompt).subspan(0, 48);
  EXPECT_EQ(cache_->AddSequence(options)->cached_tokens, 32);

  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.prefix_queried_tokens, 98);
  EXPECT_EQ(s.prefix_hit_tokens, 80);
  EXPECT_EQ(s.prefix_hit_blocks, 5);
  EXPECT_EQ(s.prefix_missed_blocks, 1);
  EXPECT_EQ(s.indexed_blocks, 3);
}

TEST_F(PrefixCacheTest, ReleasedBlocksStayCachedAndAreReused) {
  Serve(Tokens(40, 7));
  CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.formats[0].blocks_cached, 2);
  EXPECT_EQ(s.evictable_blocks, 1);  // leaf-first: only the last full block can go
  SequenceOptions options;
  const std::vector<int32_t> prompt = Tokens(40, 7);
  options.prompt = prompt;
  const AddResult again = *cache_->AddSequence(options);
  EXPECT_EQ(again.cached_tokens, 32);
  s = cache_->GetStats();
  EXPECT_EQ(s.formats[0].blocks_cached, 0);
  EXPECT_EQ(s.formats[0].blocks_in_use, 2);
}

// A sequence appended once without ids stops hashing; in a batch with ids, its ids are still
// skipped, so that the next sequence's block is indexed under its own tokens.
TEST_F(PrefixCacheTest, ABatchSkipsTheIdsOfASequenceThatStoppedHashing) {
  const SequenceId unhashed = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(unhashed, 1, &slots).ok());
  const SequenceId hashed = *cache_->AddSequence();
  std::vector<int32_t> ids = Tokens(16, 0);
  const std::vector<int32_t> own = Tokens(16, 1000);
  ids.insert(ids.end(), own.begin(), own.end());
  ASSERT_TRUE(cache_->AppendBatch({unhashed, hashed}, {16, 16}, ids, &slots).ok());
  SequenceOptions probe;
  const std::vector<int32_t> skipped = Tokens(17, 0), indexed = Tokens(17, 1000);
  probe.prompt = skipped;
  EXPECT_EQ(cache_->AddSequence(probe)->cached_tokens, 0);
  probe.prompt = indexed;
  EXPECT_EQ(cache_->AddSequence(probe)->cached_tokens, 16);
}

// Two requests with one prompt admitted in one step: the second shares the first's blocks
// before their K/V is written, and the first's WriteKV fills them for both. From the next step
// on, a shared block takes no write.
TEST_F(PrefixCacheTest, ABlockSharedBeforeItsKVIsWrittenTakesItsOwnersWrite) {
  const std::vector<int32_t> prompt = Tokens(33, 0);
  const SequenceId first = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(first, absl::MakeConstSpan(prompt).subspan(0, 32), &slots).ok());
  SequenceOptions same;
  same.prompt = prompt;
  const AddResult second = *cache_->AddSequence(same);
  ASSERT_EQ(second.cached_tokens, 32);
  const Geometry& g = cache_->options().geometry;
  const std::vector<uint16_t> kv =
      ::kvtier::testing::RandomHalves(32 * g.num_kv_heads * g.head_dim, 9);
  const KVInput input{DType::kFloat16, kv.data(), kv.data(), 32, g.num_kv_heads, g.head_dim};
  for (int l = 0; l < g.num_layers; ++l) ASSERT_TRUE(cache_->WriteKV(l, slots, input).ok());
  std::vector<float> k1(kv.size()), v1(kv.size()), k2(kv.size()), v2(kv.size());
  ASSERT_TRUE(cache_->ReadKV(first, 0, absl::MakeSpan(k1), absl::MakeSpan(v1)).ok());
  ASSERT_TRUE(cache_->ReadKV(second.id, 0, absl::MakeSpan(k2), absl::MakeSpan(v2)).ok());
  EXPECT_NE(k2, std::vector<float>(k2.size(), 0.f));  // written, and read through `second`
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(v1, v2);
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_EQ(cache_->WriteKV(0, slots, input).code(), absl::StatusCode::kFailedPrecondition);
}

// A parent and its fork that share a partial tail and both append in one batch make one copy:
// the second finds the tail its own. With one free page the batch fits.
TEST_F(PrefixCacheTest, AForkAndItsParentInOneBatchCopyTheirTailOnce) {
  const SequenceId parent = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(parent, 20, &slots).ok());
  const SequenceId child = *cache_->Fork(parent);
  const SequenceId filler = *cache_->AddSequence();
  ASSERT_TRUE(cache_->Append(filler, 253 * 16, &slots).ok());  // one slab: 1 of 256 pages left
  const CacheStats before = cache_->GetStats();
  slots.clear();
  ASSERT_TRUE(cache_->AppendBatch({parent, child}, {1, 1}, {}, &slots).ok());
  EXPECT_EQ(cache_->GetStats().copy_on_write_blocks, before.copy_on_write_blocks + 1);
  EXPECT_EQ(cache_->GetStats().allocation_failures, before.allocation_failures);
  EXPECT_NE(slots[0] / 16, slots[1] / 16);
}

TEST_F(PrefixCacheTest, ExtraKeyAndMinimumPrecisionMakeMisses) {
  Serve(Tokens(40, 7));
  const std::vector<int32_t> prompt = Tokens(40, 7);
  SequenceOptions options;
  options.prompt = prompt;
  options.extra_key = 99;  // another adapter: same tokens, other content
  EXPECT_EQ(cache_->AddSequence(options)->cached_tokens, 0);
  options.extra_key = 0;
  options.prompt = Tokens(40, 8);  // other tokens
  EXPECT_EQ(cache_->AddSequence(options)->cached_tokens, 0);
}

TEST(PrefixPrecisionTest, ACachedBlockColderThanTheRequestAllowsIsAMiss) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head")};
  auto cache = MustCreate(o);
  const std::vector<int32_t> prompt = Tokens(40, 3);
  const SequenceId a = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->AppendTokens(a, prompt, &slots).ok());
  const std::vector<BlockId> blocks = *cache->SequenceBlocks(a);
  ASSERT_TRUE(cache->Demote({blocks[1]}, 1).ok());
  ASSERT_TRUE(cache->Release(a).ok());
  SequenceOptions strict;
  strict.prompt = prompt;
  strict.coldest_format = 0;  // FP16 only
  EXPECT_EQ(cache->AddSequence(strict)->cached_tokens, 16);  // block 1 is FP8: a miss
  SequenceOptions any;
  any.prompt = prompt;
  const AddResult reused = *cache->AddSequence(any);
  EXPECT_EQ(reused.cached_tokens, 32);  // found at FP8, reused at FP8
  // The strict request's block 0 may not be demoted below FP16.
  EXPECT_EQ(cache->Demote({blocks[0]}, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

// A strict request (FP16 only) fills a prefix and leaves; a request that allows FP8 takes the
// prefix up: the blocks follow its limit, Demote and the policy may demote them. Was: the limit
// of the request that had left stayed on the blocks for good, so that one strict request kept
// a shared prefix in FP16 for every request after it.
TEST(PrefixPrecisionTest, AStrictRequestThatLeftNoLongerLimitsItsBlocks) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head")};
  auto cache = MustCreate(o);
  const std::vector<int32_t> prompt = Tokens(40, 3);
  SequenceOptions strict;
  strict.coldest_format = 0;
  const SequenceId s = cache->AddSequence(strict)->id;
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->AppendTokens(s, prompt, &slots).ok());
  ASSERT_TRUE(cache->Release(s).ok());
  SequenceOptions any;
  any.prompt = prompt;
  const AddResult lenient = *cache->AddSequence(any);
  ASSERT_EQ(lenient.cached_tokens, 32);
  const std::vector<BlockId> blocks = *cache->SequenceBlocks(lenient.id);
  EXPECT_TRUE(cache->Demote({blocks[0]}, 1).ok());
  // A strict request taking up block 0 again finds it FP8: a miss.
  SequenceOptions strict_again = strict;
  strict_again.prompt = Tokens(17, 3);
  EXPECT_EQ(cache->AddSequence(strict_again)->cached_tokens, 0);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

TEST_F(PrefixCacheTest, AllocationEvictsColdPrefixesLeafFirst) {
  // One slab: 256 FP16 blocks. Cache 4 chains of 50 blocks, then ask for 100 blocks.
  for (int chain = 0; chain < 4; ++chain) Serve(Tokens(50 * 16, chain * 100000));
  EXPECT_EQ(cache_->GetStats().formats[0].blocks_cached, 200);
  const SequenceId big = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(big, 100 * 16, &slots).ok());
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.evicted_blocks, 200 + 100 - 256);
  // The oldest chain went first, from its leaf back: 44 of its 50 blocks are gone and its head
  // survives; the newest chain is whole.
  std::vector<int32_t> oldest = Tokens(50 * 16, 0), newest = Tokens(50 * 16, 300000);
  SequenceOptions probe;
  probe.prompt = newest;
  EXPECT_EQ(cache_->AddSequence(probe)->cached_tokens, 49 * 16);
  probe.prompt = oldest;
  EXPECT_EQ(cache_->AddSequence(probe)->cached_tokens, 6 * 16);
}

TEST_F(PrefixCacheTest, ExhaustedWhenNothingIsEvictableChangesNothing) {
  const SequenceId holder = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(holder, Tokens(200 * 16, 1), &slots).ok());
  Serve(Tokens(10 * 16, 500000));  // 10 cached blocks
  const CacheStats before = cache_->GetStats();
  const SequenceId other = *cache_->AddSequence();
  slots.clear();
  // 56 free + 10 evictable < 100: fails without evicting anything.
  EXPECT_EQ(cache_->Append(other, 100 * 16, &slots).code(), absl::StatusCode::kResourceExhausted);
  const CacheStats after = cache_->GetStats();
  EXPECT_EQ(after.evicted_blocks, before.evicted_blocks);
  EXPECT_EQ(after.formats[0].blocks_cached, 10);
  EXPECT_EQ(*cache_->SequenceLength(holder), 200 * 16);  // referenced blocks never go
}

TEST_F(PrefixCacheTest, PrioritiesAndTheirExpiry) {
  SequenceOptions keep;
  keep.priority = 3;
  keep.priority_ttl_steps = 5;
  Serve(Tokens(16 * 100, 1), keep);     // high priority, older
  Serve(Tokens(16 * 100, 900000));      // priority 0, newer
  // 56 blocks are free; 156 more need 100 evictions: the priority-0 chain goes although it is
  // newer.
  const SequenceId a = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(a, 16 * 156, &slots).ok());
  std::vector<int32_t> kept = Tokens(16 * 100, 1);
  SequenceOptions probe = keep;
  probe.prompt = kept;
  AddResult r = *cache_->AddSequence(probe);
  EXPECT_EQ(r.cached_tokens, 99 * 16);
  ASSERT_TRUE(cache_->Release(r.id).ok());
  // After its TTL the kept chain is evicted like priority 0 (ahead of fresher level-0 blocks).
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(cache_->EndStep().ok());
  Serve(Tokens(16 * 10, 700000));  // the budget is full: 10 expired blocks make room
  ASSERT_TRUE(cache_->Append(a, 16 * 10, &slots).ok());  // 10 more expired blocks go
  const std::vector<int32_t> fresh = Tokens(16 * 10, 700000);
  probe = {};
  probe.prompt = fresh;
  EXPECT_EQ(cache_->AddSequence(probe)->cached_tokens, 9 * 16);  // the fresh level-0 chain stays
  EXPECT_EQ(cache_->GetStats().evicted_blocks, 100 + 10 + 10);
}

// A prefill that failed: the blocks its sequence filled this step leave the index (their K/V
// was never written), those of earlier steps stay cached and matchable.
TEST_F(PrefixCacheTest, AbandonWithdrawsOnlyTheBlocksFilledSinceTheLastStep) {
  const std::vector<int32_t> prompt = Tokens(70, 40);
  Serve(std::vector<int32_t>(prompt.begin(), prompt.begin() + 33));
  ASSERT_TRUE(cache_->EndStep().ok());
  SequenceOptions options;
  options.prompt = prompt;
  const AddResult failed = *cache_->AddSequence(options);
  ASSERT_EQ(failed.cached_tokens, 32);
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(failed.id, absl::MakeConstSpan(prompt).subspan(32), &slots)
                  .ok());
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 4);
  ASSERT_TRUE(cache_->Abandon(failed.id).ok());
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.indexed_blocks, 2);
  EXPECT_EQ(s.abandoned_blocks, 2);
  EXPECT_EQ(s.evicted_blocks, 0);
  EXPECT_EQ(s.formats[0].blocks_cached, 2);
  EXPECT_EQ(s.formats[0].blocks_in_use, 0);
  EXPECT_EQ(cache_->AddSequence(options)->cached_tokens, 32);
  EXPECT_EQ(cache_->Abandon(failed.id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache_->Release(failed.id).code(), absl::StatusCode::kNotFound);
}

// A request admitted with the abandoned blocks' prefix in the same step keeps them, private,
// and the block it indexed under them leaves the index too; nothing is cached once it goes.
TEST_F(PrefixCacheTest, ASharerOfAbandonedBlocksKeepsThemPrivate) {
  const std::vector<int32_t> prompt = Tokens(80, 9);
  const auto [owner, sharer] = OwnerAndSharer(prompt);
  std::vector<int64_t> slots;
  ASSERT_TRUE(
      cache_->AppendTokens(sharer, absl::MakeConstSpan(prompt).subspan(48, 16), &slots).ok());
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 4);

  ASSERT_TRUE(cache_->Abandon(owner).ok());
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 0);
  EXPECT_EQ(cache_->GetStats().abandoned_blocks, 4);  // the sharer's block under them too
  const std::vector<BlockId> kept = *cache_->SequenceBlocks(sharer);
  ASSERT_EQ(kept.size(), 4u);
  for (BlockId b : kept) EXPECT_EQ(cache_->GetBlockInfo(b)->ref_count, 1);
  SequenceOptions options;
  options.prompt = prompt;
  EXPECT_EQ(cache_->AddSequence(options)->cached_tokens, 0);
  ASSERT_TRUE(cache_->Release(sharer).ok());
  EXPECT_EQ(cache_->GetStats().formats[0].blocks_cached, 0);
}

// Blocks a sequence matched from another one, or inherited through Fork, in the same step
// are the other's to write: abandoning it withdraws none of them (only those it filled), and
// their owner's WriteKV into them, still shared, goes through.
TEST_F(PrefixCacheTest, AbandonLeavesTheBlocksOthersFilled) {
  const std::vector<int32_t> prompt = Tokens(50, 77);
  const AddResult owner = *cache_->AddSequence({});
  std::vector<int64_t> owner_slots, slots;
  ASSERT_TRUE(cache_->AppendTokens(owner.id, prompt, &owner_slots).ok());
  SequenceOptions options;
  options.prompt = prompt;
  const AddResult sharer = *cache_->AddSequence(options);
  ASSERT_EQ(sharer.cached_tokens, 48);
  ASSERT_TRUE(cache_->AppendTokens(sharer.id, absl::MakeConstSpan(prompt).subspan(48), &slots)
                  .ok());
  const SequenceId child = *cache_->Fork(owner.id);
  ASSERT_TRUE(cache_->AppendTokens(child, Tokens(14, 5000), &slots).ok());  // fills its 4th
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 4);
  ASSERT_TRUE(cache_->Abandon(sharer.id).ok());
  const Geometry& g = cache_->options().geometry;
  std::vector<uint16_t> rows(owner_slots.size() * g.num_kv_heads * g.head_dim, 0x3C00);  // 1.0
  KVInput kv;
  kv.k = kv.v = rows.data();
  kv.num_tokens = static_cast<int64_t>(owner_slots.size());
  kv.num_heads = g.num_kv_heads;
  kv.head_dim = g.head_dim;
  EXPECT_TRUE(cache_->WriteKV(0, owner_slots, kv).ok()) << cache_->WriteKV(0, owner_slots, kv);
  ASSERT_TRUE(cache_->Abandon(child).ok());
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 3);  // the child's own block went
  EXPECT_EQ(cache_->AddSequence(options)->cached_tokens, 48);
}

// After its owner abandons them, a sharer computes over K/V that was never written: none of
// its later blocks is indexed, even once the same prefix is computed and indexed again.
TEST_F(PrefixCacheTest, ASharerOfAbandonedBlocksIndexesNothingMore) {
  const std::vector<int32_t> prompt = Tokens(80, 21);
  const auto [owner, sharer] = OwnerAndSharer(prompt);
  ASSERT_TRUE(cache_->Abandon(owner).ok());
  const AddResult again = *cache_->AddSequence({});
  std::vector<int64_t> slots;
  ASSERT_TRUE(
      cache_->AppendTokens(again.id, absl::MakeConstSpan(prompt).subspan(0, 48), &slots).ok());
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 3);  // the same prefix, computed and indexed again
  ASSERT_TRUE(
      cache_->AppendTokens(sharer, absl::MakeConstSpan(prompt).subspan(48, 32), &slots).ok());
  EXPECT_EQ(cache_->GetStats().indexed_blocks, 3);
}

TEST_F(PrefixCacheTest, BadOptions) {
  SequenceOptions o;
  o.coldest_format = 1;
  EXPECT_EQ(cache_->AddSequence(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.priority = 8;
  EXPECT_EQ(cache_->AddSequence(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.priority_ttl_steps = -2;
  EXPECT_EQ(cache_->AddSequence(o).status().code(), absl::StatusCode::kInvalidArgument);
  const SequenceId s = *cache_->AddSequence();
  std::vector<int64_t> slots;
  const int32_t two[] = {1, 2};
  EXPECT_EQ(cache_->AppendBatch({s}, {3}, two, &slots).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache_->GetStats().sequences, 1);
}

}  // namespace
}  // namespace kvtier
