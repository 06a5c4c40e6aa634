// The host tier (Options::host_tier_bytes) on the CPU backend: offload instead of eviction,
// onload on a prefix hit, leaf-first dropping in the host tier, forks over blocks of both tiers,
// demotion on the way down, and every failure path with state unchanged.
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/backend.h"
#include "tests/fault_backend.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Tokens;

// 2 layers of 8 heads x 128 dims, 16-token blocks: 64 KiB FP16 pages, 32 to a 2 MiB slab. The
// device and the host tier each hold one slab per layer: 32 blocks.
Options TierOptions() {
  Options o;
  o.geometry = Geometry{2, 8, 128, 16};
  o.memory_budget_bytes = size_t{2} * o.slab_bytes;
  o.host_tier_bytes = size_t{2} * o.slab_bytes;
  return o;
}

// Two slabs per layer in each tier, so that both formats can get a host slab, and the palette
// {FP16, BF16} whose host tier stores BF16 where a block's sharers allow it.
Options TwoFormatTierOptions() {
  Options o = TierOptions();
  o.memory_budget_bytes *= 2;
  o.host_tier_bytes *= 2;
  o.palette = {*ParseFormat("fp16"), *ParseFormat("bf16")};
  o.host_tier_format = 1;
  return o;
}

constexpr int kBlock = 16;
constexpr int kDeviceBlocks = 32;

// The value every element of token `t` (its id) of `layer` holds: exact in FP16 and BF16.
uint16_t ValueOf(int32_t token, int layer) {
  return codec::FloatToHalf(static_cast<float>((token * 7 + layer * 3) % 61 - 30) / 4.f);
}

class HostTierTest : public ::testing::Test {
 protected:
  void SetUp() override { Create(TierOptions()); }
  void TearDown() override {
    EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
  }

  void Create(const Options& o) {
    absl::StatusOr<std::unique_ptr<Cache>> cache =
        CreateCache(o, std::make_unique<testing::FaultBackend>(faults_));
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  // A live sequence that computed `tokens` (matching none) with their values in every layer.
  SequenceId Compute(const std::vector<int32_t>& tokens, SequenceOptions options = {}) {
    const SequenceId id = cache_->AddSequence(options)->id;
    Append(id, tokens);
    return id;
  }

  void Append(SequenceId id, const std::vector<int32_t>& tokens) {
    std::vector<int64_t> slots;
    ASSERT_TRUE(cache_->AppendTokens(id, tokens, &slots).ok());
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<uint16_t> data(tokens.size() * row);
    for (int l = 0; l < g.num_layers; ++l) {
      for (size_t t = 0; t < tokens.size(); ++t) {
        std::fill(data.begin() + t * row, data.begin() + (t + 1) * row, ValueOf(tokens[t], l));
      }
      const KVInput kv{DType::kFloat16, data.data(), data.data(),
                       static_cast<int64_t>(tokens.size()), g.num_kv_heads, g.head_dim};
      ASSERT_TRUE(cache_->WriteKV(l, slots, kv).ok());
    }
  }

  // Computes `tokens` and releases the sequence, leaving its full blocks cached.
  void Serve(const std::vector<int32_t>& tokens) {
    ASSERT_TRUE(cache_->Release(Compute(tokens)).ok());
  }

  // A sequence matched against `prompt`.
  AddResult Match(const std::vector<int32_t>& prompt, int32_t coldest_format = -1) {
    SequenceOptions options;
    options.prompt = prompt;
    options.coldest_format = coldest_format;
    return *cache_->AddSequence(options);
  }

  // Checks that the first `n` tokens of `id` hold the values of `tokens` in every layer.
  void ExpectValues(SequenceId id, const std::vector<int32_t>& tokens, int64_t n) {
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    ASSERT_EQ(*cache_->SequenceLength(id), n);
    std::vector<float> k(n * row), v(n * row);
    for (int l = 0; l < g.num_layers; ++l) {
      ASSERT_TRUE(cache_->ReadKV(id, l, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
      for (int64_t t = 0; t < n; ++t) {
        ASSERT_EQ(codec::FloatToHalf(k[t * row]), ValueOf(tokens[t], l)) << t;
        ASSERT_EQ(codec::FloatToHalf(v[t * row + row - 1]), ValueOf(tokens[t], l)) << t;
      }
    }
  }

  BlockState StateOf(BlockId id) { return cache_->GetBlockInfo(id)->state; }

  std::shared_ptr<testing::Faults> faults_ = std::make_shared<testing::Faults>();
  std::unique_ptr<Cache> cache_;
};

TEST_F(HostTierTest, EvictedBlocksAreOffloadedAndAPrefixHitBringsThemBackIntact) {
  const std::vector<int32_t> a = Tokens(4 * kBlock + 1, 1000);
  const SequenceId first = Compute(a);
  const std::vector<BlockId> a_blocks = *cache_->SequenceBlocks(first);
  ASSERT_TRUE(cache_->Release(first).ok());
  // A sequence that needs the whole device pushes A's four cached blocks down.
  const SequenceId big = Compute(Tokens(kDeviceBlocks * kBlock, 50000));
  CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.offloaded_blocks, 4);
  EXPECT_EQ(s.host.blocks, 4);
  EXPECT_EQ(s.evicted_blocks, 0);
  const int64_t page_bytes = s.formats[0].page_bytes;
  EXPECT_EQ(s.host.bytes, 4 * page_bytes * 2);
  EXPECT_EQ(s.host.bytes_offloaded, 4 * page_bytes * 2);
  EXPECT_EQ(s.host.evictable_blocks, 1);  // leaf-first: only the chain's last block
  for (int i = 0; i < 4; ++i) EXPECT_EQ(StateOf(a_blocks[i]), BlockState::kOffloaded) << i;
  ASSERT_TRUE(cache_->Release(big).ok());

  // The hit brings the blocks back under the same ids, offloading four of the big sequence's.
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.cached_tokens, 4 * kBlock);
  EXPECT_EQ(hit.host_tokens, 4 * kBlock);
  EXPECT_EQ(hit.ready_fence, 0u);  // the CPU backend copies synchronously
  EXPECT_TRUE(*cache_->FencePassed(hit.ready_fence));
  const std::vector<BlockId> onloaded = *cache_->SequenceBlocks(hit.id);
  ASSERT_EQ(onloaded.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(onloaded[i], a_blocks[i]);
    EXPECT_EQ(StateOf(onloaded[i]), BlockState::kInUse);
    EXPECT_EQ(cache_->GetBlockInfo(onloaded[i])->format, 0);
  }
  ExpectValues(hit.id, a, 4 * kBlock);
  s = cache_->GetStats();
  EXPECT_EQ(s.host.onloaded_blocks, 4);
  EXPECT_EQ(s.host.hit_tokens, 4 * kBlock);
  EXPECT_EQ(s.prefix_hit_tokens, 4 * kBlock);
  EXPECT_EQ(s.host.bytes_onloaded, 4 * page_bytes * 2);
  EXPECT_EQ(s.host.offloaded_blocks, 8);
  EXPECT_EQ(s.host.blocks, 4);
}

// Eviction that makes room for one append moves all its victims down in one batch of copies
// and waits for the device once, on an asynchronous backend too.
TEST_F(HostTierTest, TheBlocksOneAppendEvictsGoDownInOneBatchWithOneWait) {
  faults_->asynchronous = true;
  Create(TierOptions());
  const std::vector<int32_t> a = Tokens(8 * kBlock + 1, 1000);
  Serve(a);
  Serve(Tokens(8 * kBlock + 1, 9000));  // a second chain: victims from two chains
  ASSERT_TRUE(cache_->EndStep().ok());
  const int64_t copies = faults_->copy_pages_calls, fences = faults_->fences_recorded;
  const SequenceId big = Compute(Tokens(kDeviceBlocks * kBlock, 50000));
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.offloaded_blocks, 16);
  EXPECT_EQ(faults_->copy_pages_calls - copies, 1);
  EXPECT_EQ(faults_->fences_recorded - fences, 1);
  ASSERT_TRUE(cache_->Release(big).ok());
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.host_tokens, 8 * kBlock);
  EXPECT_NE(hit.ready_fence, 0u);
  ExpectValues(hit.id, a, 8 * kBlock);
}

// A hit whose fence cannot be recorded after its copies (an asynchronous backend) still gets a
// fence that covers them: the next one recorded, not 0, which has always passed.
TEST_F(HostTierTest, AHitWithoutItsOwnFenceGetsTheNextOne) {
  faults_->asynchronous = true;
  Create(TierOptions());
  const std::vector<int32_t> a = Tokens(4 * kBlock + 1, 1000);
  Serve(a);
  const SequenceId big = *cache_->AddSequence();  // no tokens: nothing of it stays cached
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(big, kDeviceBlocks * kBlock, &slots).ok());
  ASSERT_EQ(cache_->GetStats().host.blocks, 4);
  ASSERT_TRUE(cache_->Release(big).ok());
  ASSERT_TRUE(cache_->EndStep().ok());  // its pages back: the hit evicts nothing
  faults_->fail_record_fence = true;
  const AddResult hit = Match(a);
  faults_->fail_record_fence = false;
  EXPECT_EQ(hit.host_tokens, 4 * kBlock);
  EXPECT_NE(hit.ready_fence, 0u);
  EXPECT_FALSE(*cache_->FencePassed(hit.ready_fence));
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_TRUE(*cache_->FencePassed(hit.ready_fence));
  ExpectValues(hit.id, a, 4 * kBlock);
}

TEST_F(HostTierTest, APrefixMatchesAcrossBothTiersInOneChain) {
  const std::vector<int32_t> a = Tokens(8 * kBlock + 1, 1000);
  Serve(a);
  // 28 new blocks leave room for 4 of A's 8: its last four go down, leaf first.
  const SequenceId other = Compute(Tokens(28 * kBlock, 50000));
  ASSERT_EQ(cache_->GetStats().host.blocks, 4);
  ASSERT_TRUE(cache_->Release(other).ok());
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.cached_tokens, 8 * kBlock);
  EXPECT_EQ(hit.host_tokens, 4 * kBlock);
  ExpectValues(hit.id, a, 8 * kBlock);
}

TEST_F(HostTierTest, TheHostTierDropsItsLeavesFirstInLruOrder) {
  const std::vector<int32_t> a = Tokens(8 * kBlock + 1, 1000);
  Serve(a);
  Serve(Tokens(31 * kBlock + 1, 20000));  // A's 8 blocks go down
  ASSERT_EQ(cache_->GetStats().host.blocks, 8);
  // A third sequence pushes B's 31 blocks down; the host tier drops 7 of A's, the older ones,
  // from the chain's end: A's first block stays.
  ASSERT_TRUE(cache_->Release(Compute(Tokens(kDeviceBlocks * kBlock, 90000))).ok());
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.blocks, kDeviceBlocks);
  EXPECT_EQ(s.host.evicted_blocks, 7);
  EXPECT_EQ(s.evicted_blocks, 7);
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.cached_tokens, kBlock);
  EXPECT_EQ(hit.host_tokens, kBlock);
  ExpectValues(hit.id, a, kBlock);
}

TEST_F(HostTierTest, AFullHostTierOfBlocksBeingBroughtBackDropsTheEvictedBlocksInstead) {
  const std::vector<int32_t> b = Tokens(kDeviceBlocks * kBlock, 20000);
  Serve(b);
  ASSERT_TRUE(cache_->Release(Compute(Tokens(kDeviceBlocks * kBlock, 90000))).ok());
  ASSERT_EQ(cache_->GetStats().host.blocks, kDeviceBlocks);
  // Bringing B back needs the whole device: C's blocks cannot go down, as the host tier is
  // full of B's blocks, pinned until they are back; they are dropped instead.
  std::vector<int32_t> prompt = b;
  prompt.push_back(7);
  const AddResult hit = Match(prompt);
  EXPECT_EQ(hit.cached_tokens, kDeviceBlocks * kBlock);
  EXPECT_EQ(hit.host_tokens, kDeviceBlocks * kBlock);
  ExpectValues(hit.id, b, kDeviceBlocks * kBlock);
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.offload_failures, kDeviceBlocks);
  EXPECT_EQ(s.evicted_blocks, kDeviceBlocks);
  EXPECT_EQ(s.host.blocks, 0);
}

TEST_F(HostTierTest, ForksShareOnloadedBlocksAndBlocksChainedFromTheHostTier) {
  const std::vector<int32_t> a = Tokens(4 * kBlock + 1, 1000);
  Serve(a);
  ASSERT_TRUE(cache_->Release(Compute(Tokens(kDeviceBlocks * kBlock, 50000))).ok());
  ASSERT_EQ(cache_->GetStats().host.blocks, 4);
  // A sequence that computes A again holds private copies, and its fifth block stays private
  // too: it would chain from A's fourth, in the host tier.
  std::vector<int32_t> longer = Tokens(5 * kBlock + 3, 1000);
  const SequenceId again = Compute(longer);
  const SequenceId fork = *cache_->Fork(again);
  Append(fork, Tokens(kBlock, 7000));
  ASSERT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
  // A prompt that matches the onloaded chain, then forked.
  const AddResult hit = Match(a);
  ASSERT_EQ(hit.host_tokens, 4 * kBlock);
  const SequenceId hit_fork = *cache_->Fork(hit.id);
  Append(hit_fork, Tokens(3, 1000 + 4 * kBlock));
  ExpectValues(hit_fork, Tokens(4 * kBlock + 3, 1000), 4 * kBlock + 3);
  ExpectValues(again, longer, static_cast<int64_t>(longer.size()));
  for (SequenceId id : {again, fork, hit.id, hit_fork}) ASSERT_TRUE(cache_->Release(id).ok());
  EXPECT_EQ(cache_->GetStats().sequences, 0);
}

TEST_F(HostTierTest, BlocksAreDemotedOnTheWayDownUnlessASharerForbidsIt) {
  Create(TwoFormatTierOptions());
  const std::vector<int32_t> a = Tokens(2 * kBlock + 1, 1000);
  const std::vector<int32_t> strict = Tokens(2 * kBlock + 1, 3000);
  Serve(a);
  SequenceOptions fp16_only;
  fp16_only.coldest_format = 0;
  ASSERT_TRUE(cache_->Release(Compute(strict, fp16_only)).ok());
  ASSERT_TRUE(cache_->Release(Compute(Tokens(2 * kDeviceBlocks * kBlock, 50000))).ok());
  const CacheStats s = cache_->GetStats();
  ASSERT_EQ(s.host.blocks, 4);
  EXPECT_EQ(s.host.bytes, 2 * s.formats[0].page_bytes * 2 + 2 * s.formats[1].page_bytes * 2);
  const AddResult strict_hit = Match(strict, /*coldest_format=*/0);
  ASSERT_EQ(strict_hit.host_tokens, 2 * kBlock);
  const std::vector<BlockId> strict_blocks = *cache_->SequenceBlocks(strict_hit.id);
  for (BlockId id : strict_blocks) EXPECT_EQ(cache_->GetBlockInfo(id)->format, 0);
  ExpectValues(strict_hit.id, strict, 2 * kBlock);
  const AddResult hit = Match(a);
  ASSERT_EQ(hit.host_tokens, 2 * kBlock);
  const std::vector<BlockId> demoted = *cache_->SequenceBlocks(hit.id);
  for (BlockId id : demoted) EXPECT_EQ(cache_->GetBlockInfo(id)->format, 1);
  ExpectValues(hit.id, a, 2 * kBlock);
}

TEST_F(HostTierTest, NoDeviceRoomCutsTheHitBeforeTheFirstOffloadedBlock) {
  const std::vector<int32_t> a = Tokens(8 * kBlock + 1, 1000);
  Serve(a);
  const SequenceId other = Compute(Tokens(28 * kBlock, 50000));  // A's last four go down
  const CacheStats before = cache_->GetStats();
  ASSERT_EQ(before.host.blocks, 4);
  // A's first four blocks are pinned by the match; no other room: the hit stops at block 4.
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.cached_tokens, 4 * kBlock);
  EXPECT_EQ(hit.host_tokens, 0);
  const CacheStats after = cache_->GetStats();
  EXPECT_EQ(after.host.onload_failures, 1);
  EXPECT_EQ(after.allocation_failures, before.allocation_failures);  // the call succeeded
  EXPECT_EQ(after.host.blocks, 4);
  EXPECT_EQ(after.host.evictable_blocks, before.host.evictable_blocks);
  EXPECT_EQ(after.formats[0].pages_used, before.formats[0].pages_used);
  ASSERT_TRUE(cache_->Release(hit.id).ok());
  ASSERT_TRUE(cache_->Release(other).ok());
}

TEST_F(HostTierTest, AFailingOffloadCopyDropsTheBlockAndChangesNothingElse) {
  Serve(Tokens(4 * kBlock + 1, 1000));
  faults_->fail_copy_pages = true;
  const SequenceId big = Compute(Tokens(kDeviceBlocks * kBlock, 50000));
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.offload_failures, 4);
  EXPECT_EQ(s.host.blocks, 0);
  EXPECT_EQ(s.host.offloaded_blocks, 0);
  EXPECT_EQ(s.evicted_blocks, 4);
  ASSERT_TRUE(cache_->Release(big).ok());
}

TEST_F(HostTierTest, AFailingOffloadCopyDropsTheBlockWithItsOffloadedDescendants) {
  Serve(Tokens(8 * kBlock + 1, 1000));
  ASSERT_TRUE(cache_->Release(Compute(Tokens(28 * kBlock, 50000))).ok());  // A's last 4 go down
  ASSERT_EQ(cache_->GetStats().host.blocks, 4);
  faults_->fail_copy_pages = true;
  const SequenceId big = Compute(Tokens(kDeviceBlocks * kBlock, 90000));
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.blocks, 0);
  EXPECT_EQ(s.host.evicted_blocks, 4);
  EXPECT_EQ(s.evicted_blocks, 36);
  ASSERT_TRUE(cache_->Release(big).ok());
}

TEST_F(HostTierTest, AFailingOnloadCopyLeavesTheBlocksOffloaded) {
  const std::vector<int32_t> a = Tokens(4 * kBlock + 1, 1000);
  Serve(a);
  ASSERT_TRUE(cache_->Release(Compute(Tokens(kDeviceBlocks * kBlock, 50000))).ok());
  const CacheStats before = cache_->GetStats();
  faults_->fail_copy_pages = true;
  const AddResult miss = Match(a);
  EXPECT_EQ(miss.cached_tokens, 0);
  const CacheStats after = cache_->GetStats();
  EXPECT_EQ(after.host.onload_failures, 1);
  EXPECT_EQ(after.host.blocks, 4);
  EXPECT_EQ(after.host.evictable_blocks, 1);
  faults_->fail_copy_pages = false;
  ASSERT_TRUE(cache_->Release(miss.id).ok());
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.host_tokens, 4 * kBlock);
  ExpectValues(hit.id, a, 4 * kBlock);
}

TEST_F(HostTierTest, AHitInTwoFormatsWithoutRoomForBothEvictsNothing) {
  Create(TwoFormatTierOptions());
  const std::vector<int32_t> a = Tokens(2 * kBlock + 1, 1000);
  const SequenceId first = Compute(a);
  const std::vector<BlockId> a_blocks = *cache_->SequenceBlocks(first);
  ASSERT_TRUE(cache_->Release(first).ok());
  // A request that forbids BF16 shares A's first block, so it goes down as FP16, the second
  // as BF16, when a sequence without token ids takes the whole device.
  ASSERT_TRUE(cache_->Release(Match(Tokens(kBlock + 1, 1000), /*coldest_format=*/0).id).ok());
  std::vector<int64_t> slots;
  const SequenceId big = *cache_->AddSequence();
  ASSERT_TRUE(cache_->Append(big, 2 * kDeviceBlocks * kBlock, &slots).ok());
  ASSERT_TRUE(cache_->Release(big).ok());
  ASSERT_EQ(cache_->GetBlockInfo(a_blocks[0])->format, 0);
  ASSERT_EQ(cache_->GetBlockInfo(a_blocks[1])->format, 1);
  ASSERT_EQ(StateOf(a_blocks[1]), BlockState::kOffloaded);
  // One cached FP16 block (C's) and a sequence in use filling the rest of the device: evicting
  // C gives A's FP16 block a page, but nothing can give its BF16 block a slab.
  const SequenceId c = Compute(Tokens(kBlock + 1, 7000));
  const BlockId c_block = cache_->SequenceBlocks(c)->front();
  ASSERT_TRUE(cache_->Release(c).ok());
  const SequenceId filler = *cache_->AddSequence();
  ASSERT_TRUE(cache_->Append(filler, (2 * kDeviceBlocks - 1) * kBlock, &slots).ok());
  const CacheStats before = cache_->GetStats();
  const AddResult miss = Match(a);
  EXPECT_EQ(miss.cached_tokens, 0);
  EXPECT_EQ(StateOf(c_block), BlockState::kCached);  // was offloaded for nothing
  const CacheStats after = cache_->GetStats();
  EXPECT_EQ(after.host.onload_failures, before.host.onload_failures + 1);
  EXPECT_EQ(after.host.offloaded_blocks, before.host.offloaded_blocks);
  EXPECT_EQ(after.host.blocks, 2);
  ASSERT_TRUE(cache_->Release(miss.id).ok());
  ASSERT_TRUE(cache_->Release(filler).ok());
  const AddResult hit = Match(a);  // room now: both come back
  EXPECT_EQ(hit.host_tokens, 2 * kBlock);
  ExpectValues(hit.id, a, 2 * kBlock);
}

TEST_F(HostTierTest, HostLeavesThatCannotFreeASlabOfTheWantedFormatStay) {
  Create(TwoFormatTierOptions());
  // S, two blocks no request lets go to BF16; A, 33 blocks of which a strict request shares the
  // first: A's first block and S's go down as FP16, A's other 32 fill the host's BF16 slab.
  SequenceOptions fp16_only;
  fp16_only.coldest_format = 0;
  ASSERT_TRUE(cache_->Release(Compute(Tokens(2 * kBlock + 1, 3000), fp16_only)).ok());
  const std::vector<int32_t> a = Tokens(33 * kBlock + 1, 1000);
  Serve(a);
  ASSERT_TRUE(cache_->Release(Match(Tokens(kBlock + 1, 1000), /*coldest_format=*/0).id).ok());
  ASSERT_TRUE(cache_->Release(Compute(Tokens(2 * kDeviceBlocks * kBlock, 50000))).ok());
  ASSERT_EQ(cache_->GetStats().host.blocks, 35);
  // Bringing A back evicts device blocks that want BF16 host pages: every BF16 page is A's,
  // pinned, and S's blocks share their FP16 slab with A's pinned first block, so dropping them
  // could free no slab. They stay; the device blocks are dropped instead.
  const AddResult hit = Match(a);
  EXPECT_EQ(hit.host_tokens, 33 * kBlock);
  ExpectValues(hit.id, a, 33 * kBlock);
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.host.evicted_blocks, 0);
  EXPECT_EQ(s.host.blocks, 2);
}

TEST_F(HostTierTest, AnOffloadedBlockCannotBeDemoted) {
  Serve(Tokens(2 * kBlock + 1, 1000));
  ASSERT_TRUE(cache_->Release(Compute(Tokens(kDeviceBlocks * kBlock, 50000))).ok());
  BlockId offloaded{};
  for (uint32_t i = 0; i < 4 * kDeviceBlocks; ++i) {
    for (uint32_t g = 1; g < 4; ++g) {
      const absl::StatusOr<BlockInfo> info = cache_->GetBlockInfo(BlockId{i, g});
      if (info.ok() && info->state == BlockState::kOffloaded) offloaded = BlockId{i, g};
    }
  }
  ASSERT_NE(offloaded.generation, 0u);
  EXPECT_TRUE(absl::IsFailedPrecondition(cache_->Demote({offloaded}, 0)));
}

TEST(HostTierOptionsTest, ABudgetBelowOneSlabPerLayerOrAFormatOutsideThePaletteIsRefused) {
  Options o = TierOptions();
  o.host_tier_bytes = o.slab_bytes;  // 2 layers
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateOptions(o)));
  o.host_tier_bytes = 0;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.host_tier_format = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateOptions(o)));
}

}  // namespace
}  // namespace kvtier
