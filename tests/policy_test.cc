// Precision policies: parsing, presets, and aging through EndStep on the CPU backend.
#include "kvtier/policy.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::SmallOptions;

TEST(PolicyTest, PresetsAreValidAndRoundTripThroughJson) {
  for (const std::string& name : PolicyPresetNames()) {
    const Policy p = *PolicyPreset(name);
    EXPECT_TRUE(ValidatePolicy(p).ok()) << name;
    const Policy again = *ParsePolicyJson(PolicyToJson(p));
    EXPECT_EQ(PolicyToJson(again), PolicyToJson(p));
    EXPECT_EQ(PolicyPalette(again), PolicyPalette(p));
  }
  EXPECT_EQ(PolicyPreset("turbo").status().code(), absl::StatusCode::kNotFound);
  const Policy balanced = *PolicyPreset("balanced");
  ASSERT_EQ(balanced.tiers.size(), 3u);
  EXPECT_EQ(balanced.tiers[1].max_age_tokens, 2048);
}

TEST(PolicyTest, InvalidPoliciesNameTheField) {
  struct Case {
    const char* json;
    const char* field;
  };
  for (const Case& c : {
           Case{R"({"tiers": []})", "policy.tiers"},
           Case{R"({"tiers": [{"format": "fp17"}]})", "tiers[0].format"},
           Case{R"({"tiers": [{"format": "fp16", "max_age_tokens": 10}]})", "tiers[0].max_age_tokens"},
           Case{R"({"tiers": [{"format": "fp16", "max_age_tokens": 64},
                              {"format": "fp8_e4m3/block_head", "max_age_tokens": 32},
                              {"format": "nvfp4/block_head"}]})", "tiers[1].max_age_tokens"},
           Case{R"({"tiers": [{"format": "fp8_e4m3/block_head"}]})", "tiers[0].format"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": -1})", "sink_tokens"},
           Case{R"({"tiers": [{"format": "fp16"}], "pressure_watermark": 1.5})", "pressure_watermark"},
           Case{R"({"tiers": [{"format": "fp16"}], "pressure_window_scale": 0})", "pressure_window_scale"},
           Case{R"({"tiers": [{"format": "fp16"}], "attention_keep_ratio": 0.5})", "attention_keep_ratio"},
           Case{R"({"tiers": [{"format": "fp16"}], "attention_keep_ratio": -1})", "attention_keep_ratio"},
           Case{R"({"tiers": [{"format": "fp16"}], "attention_keep_ratio": 1e9})", "attention_keep_ratio"},
           Case{R"({"tiers": [{"format": "fp16"}], "attention_keep_ratio": "8"})", "attention_keep_ratio"},
           Case{R"({"tiers": [{"format": "fp16", "colour": 1}]})",
                "tiers[0]: unknown field 'colour'"},
           Case{R"({"tier": []})", "policy: unknown field 'tier'"},
           Case{R"({"tiers": [{"format": "fp16"}], )", "JSON at byte"},
       }) {
    const absl::StatusOr<Policy> p = ParsePolicyJson(c.json);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(p.status().message().find(c.field), absl::string_view::npos)
        << c.field << " not in: " << p.status().message();
  }
}

TEST(PolicyTest, LoadsAPresetOrAFile) {
  EXPECT_EQ(LoadPolicy("fp8")->name, "fp8");
  const std::string path = ::testing::TempDir() + "/policy.json";
  std::ofstream(path) << R"({"name": "mine", "tiers": [{"format": "fp16", "max_age_tokens": 128},
                                                       {"format": "nvfp4/block_head"}]})";
  const Policy p = *LoadPolicy(path);
  EXPECT_EQ(p.name, "mine");
  EXPECT_EQ(p.tiers[0].max_age_tokens, 128);
  EXPECT_EQ(LoadPolicy("/nonexistent/policy.json").status().code(), absl::StatusCode::kNotFound);
  // A bare name is a preset's: the error says how a file is named.
  const absl::Status bare = LoadPolicy("mine").status();
  EXPECT_EQ(bare.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(bare.message().find("holds a '/' or ends in .json"), absl::string_view::npos) << bare;
  std::remove(path.c_str());
}

// A policy with short windows: FP16 while younger than 32 tokens, FP8 below 96, then NVFP4.
Policy ShortWindows(int64_t sinks = 4) {
  Policy p;
  p.name = "short";
  p.tiers = {{*ParseFormat("fp16"), 32},
             {*ParseFormat("fp8_e4m3/block_head"), 96},
             {*ParseFormat("nvfp4/block_head"), -1}};
  p.sink_tokens = sinks;
  p.pressure_watermark = 0;
  return p;
}

std::unique_ptr<Cache> PolicyCache(const Policy& p, int slabs = 8) {
  Options o = SmallOptions(slabs);
  o.palette = PolicyPalette(p);
  auto cache = MustCreate(o);
  EXPECT_TRUE(cache->SetPolicy(p).ok());
  return cache;
}

std::vector<int> Formats(Cache& cache, SequenceId seq) {
  std::vector<int> formats;
  const std::vector<BlockId> blocks = *cache.SequenceBlocks(seq);
  for (BlockId b : blocks) formats.push_back(cache.GetBlockInfo(b)->format);
  return formats;
}

TEST(PolicyAgingTest, BlocksCrossTierBoundariesAsTheyAge) {
  auto cache = PolicyCache(ShortWindows());
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  for (int t = 1; t <= 160; ++t) {
    ASSERT_TRUE(cache->Append(seq, 1, &slots).ok());
    ASSERT_TRUE(cache->EndStep().ok());
    const std::vector<int> formats = Formats(*cache, seq);
    for (size_t i = 0; i < formats.size(); ++i) {
      const int64_t end = static_cast<int64_t>(i + 1) * 16;
      const int64_t age = t - end;
      int want = 0;
      if (end <= t && i > 0) want = age >= 96 ? 2 : age >= 32 ? 1 : 0;  // block 0 holds sinks
      ASSERT_EQ(formats[i], want) << "block " << i << " at length " << t;
    }
    ASSERT_TRUE(cache->CheckConsistency().ok());
  }
  const CacheStats s = cache->GetStats();
  EXPECT_EQ(s.policy, "short");
  EXPECT_LT(s.effective_bits_per_element, 10.0);
}

TEST(PolicyAgingTest, ASequencesMinimumPrecisionCapsItsBlocks) {
  auto cache = PolicyCache(ShortWindows(0));
  SequenceOptions strict;
  strict.coldest_format = 1;
  const SequenceId seq = cache->AddSequence(strict)->id;
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 200, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  for (int f : Formats(*cache, seq)) EXPECT_LE(f, 1);
  EXPECT_EQ(Formats(*cache, seq).front(), 1);
}

TEST(PolicyAgingTest, SharedBlocksFollowTheirYoungestSharer) {
  auto cache = PolicyCache(ShortWindows(0));
  std::vector<int32_t> prompt(48);
  for (int i = 0; i < 48; ++i) prompt[i] = 7 * i + 1;
  const SequenceId old_seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->AppendTokens(old_seq, prompt, &slots).ok());
  // A younger request shares the first two blocks (32 tokens matched, 16 recomputed).
  SequenceOptions o;
  o.prompt = prompt;
  const AddResult young = *cache->AddSequence(o);
  ASSERT_EQ(young.cached_tokens, 32);
  ASSERT_TRUE(cache->Append(young.id, 16, &slots).ok());
  // The old sequence grows by 40: its age for block 0 is 72 >= 32, the young one's is 32.
  ASSERT_TRUE(cache->Append(old_seq, 40, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  std::vector<int> old_formats = Formats(*cache, old_seq);
  EXPECT_EQ(old_formats[0], 1);  // both sharers crossed 32 for block 0 (young: 48 - 16 = 32)
  EXPECT_EQ(old_formats[1], 0);  // young's age for block 1 is 16: not yet
  EXPECT_EQ(old_formats[2], 1);  // private to the old sequence, age 40
  ASSERT_TRUE(cache->Append(young.id, 16, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, old_seq)[1], 1);  // now the young one crossed too
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

// An old sequence of 48 prompt tokens and a young one sharing its first two blocks, one token
// past them; the old one grows by `growth` (Default: 40) and a step ends (ShortWindows(0)): the
// old one has voted for block 0 (age 32 + growth), the young one not (17), so block 0 is still
// FP16.
struct Sharers {
  SequenceId old_seq, young;
};
Sharers OldVotedYoungNot(Cache& cache, int64_t growth = 40) {
  std::vector<int32_t> prompt(48);
  for (int i = 0; i < 48; ++i) prompt[i] = 7 * i + 1;
  const SequenceId old_seq = *cache.AddSequence();
  std::vector<int64_t> slots;
  EXPECT_TRUE(cache.AppendTokens(old_seq, prompt, &slots).ok());
  SequenceOptions o;
  o.prompt = prompt;
  const SequenceId young = cache.AddSequence(o)->id;
  EXPECT_TRUE(cache.Append(young, 1, &slots).ok());
  EXPECT_TRUE(cache.Append(old_seq, growth, &slots).ok());
  EXPECT_TRUE(cache.EndStep().ok());
  EXPECT_EQ(Formats(cache, old_seq)[0], 0);
  return {old_seq, young};
}

// Sharers whose ages for a block lie in different tiers: the block moves to each tier once
// every sharer has crossed into it, and when the younger leaves, to the coldest the older has
// crossed. A block kept one vote tier at a time reset its count whenever the sharers' tiers
// differed, so it never moved (and the release withdrew the wrong vote).
TEST(PolicyAgingTest, SharersInDifferentTiersMoveTheBlockTierByTier) {
  auto cache = PolicyCache(ShortWindows(0));  // FP16 to age 32, FP8 to 96, then NVFP4
  const auto [old_seq, young] = OldVotedYoungNot(*cache, 100);  // ages 132 and 17 for block 0
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(young, 15, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, old_seq)[0], 1);  // young's is 32: both crossed into FP8
  ASSERT_TRUE(cache->Append(young, 64, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, old_seq)[0], 2);  // young's is 96: both crossed into NVFP4
  EXPECT_EQ(Formats(*cache, old_seq)[1], 1);  // young's age for block 1 is 80
  // The young one leaves: block 1 follows the old one alone (its age 116: NVFP4).
  ASSERT_TRUE(cache->Release(young).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, old_seq)[1], 2);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

TEST(PolicyAgingTest, ASharerLeavingBeforeItsVoteLetsTheBlockMove) {
  auto cache = PolicyCache(ShortWindows(0));
  const auto [old_seq, young] = OldVotedYoungNot(*cache);
  ASSERT_TRUE(cache->Release(young).ok());  // leaves before its vote
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, old_seq)[0], 1);  // its only holder's age, 80, crossed 32 long ago
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

TEST(PolicyAgingTest, AForkAfterItsParentVotedVotesToo) {
  auto cache = PolicyCache(ShortWindows(0));
  const auto [old_seq, young] = OldVotedYoungNot(*cache);
  const SequenceId fork = *cache->Fork(old_seq);  // as old as its parent: it votes too
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(young, 31, &slots).ok());  // the young one crosses 32
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, old_seq)[0], 1);
  EXPECT_EQ(Formats(*cache, fork)[0], 1);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

TEST(PolicyAgingTest, SetPolicyAppliesTheNewRulesToBlocksAlreadyAged) {
  auto cache = PolicyCache(ShortWindows(0));
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 200, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  ASSERT_EQ(Formats(*cache, seq)[6], 1);  // age 88: FP8 under the first rules
  Policy colder;
  colder.name = "colder";
  colder.tiers = {{*ParseFormat("fp16"), 32}, {*ParseFormat("nvfp4/block_head"), -1}};
  colder.sink_tokens = 0;
  colder.pressure_watermark = 0;
  ASSERT_TRUE(cache->SetPolicy(colder).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const std::vector<int> formats = Formats(*cache, seq);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(formats[i], 2) << i;  // every block 32 or more old
  EXPECT_EQ(formats[10], 0);
}

TEST(PolicyAttentionTest, RecordAttentionKeepsTheLargestShareAndRefusesBadReports) {
  auto cache = PolicyCache(ShortWindows());
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 40, &slots).ok());  // 3 blocks, the last partial
  ASSERT_TRUE(cache->RecordAttention(seq, std::vector<float>{0.5f, 0.f, 0.5f}).ok());
  ASSERT_TRUE(cache->RecordAttention(seq, std::vector<float>{0.25f, 0.75f, 0.f}).ok());
  const std::vector<BlockId> blocks = *cache->SequenceBlocks(seq);
  EXPECT_FLOAT_EQ(cache->GetBlockInfo(blocks[0])->attention, 1.5f);  // max(0.5, 0.25) x 3
  EXPECT_FLOAT_EQ(cache->GetBlockInfo(blocks[1])->attention, 2.25f);
  EXPECT_FLOAT_EQ(cache->GetBlockInfo(blocks[2])->attention, 1.5f);
  // -0 is 0: it keeps no later report out (packed, -0 ranked above every positive weight).
  ASSERT_TRUE(cache->RecordAttention(seq, std::vector<float>{0.f, 0.f, -0.f}).ok());
  ASSERT_TRUE(cache->RecordAttention(seq, std::vector<float>{0.f, 0.f, 1.f}).ok());
  EXPECT_FLOAT_EQ(cache->GetBlockInfo(blocks[2])->attention, 3.f);
  struct Bad {
    std::vector<float> weights;
    absl::StatusCode code;
    const char* says;
  };
  for (const Bad& bad : {Bad{{0.f, 1.f}, absl::StatusCode::kInvalidArgument, "3 blocks"},
                         Bad{{1.f, 1.f, 1.f, 1.f}, absl::StatusCode::kInvalidArgument, "3 blocks"},
                         Bad{{1.f, 1.5f, 1.f}, absl::StatusCode::kInvalidArgument, "block_weight[1]"},
                         Bad{{1.f, 1.f, -0.f - 1}, absl::StatusCode::kInvalidArgument, "block_weight[2]"},
                         Bad{{NAN, 1.f, 1.f}, absl::StatusCode::kInvalidArgument, "block_weight[0]"}}) {
    const absl::Status s = cache->RecordAttention(seq, bad.weights);
    EXPECT_EQ(s.code(), bad.code) << s;
    EXPECT_NE(s.message().find(bad.says), absl::string_view::npos) << s;
  }
  EXPECT_FLOAT_EQ(cache->GetBlockInfo(blocks[1])->attention, 2.25f);  // nothing recorded
  EXPECT_EQ(cache->RecordAttention(SequenceId{9, 9}, std::vector<float>{}).code(),
            absl::StatusCode::kNotFound);
  // A freed block's slot starts again from 0.
  ASSERT_TRUE(cache->Release(seq).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const SequenceId next = *cache->AddSequence();
  ASSERT_TRUE(cache->Append(next, 16, &slots).ok());
  EXPECT_EQ(cache->GetBlockInfo(cache->SequenceBlocks(next)->front())->attention, 0.f);
}

TEST(PolicyAttentionTest, BlocksAttentionSinglesOutStayOneTierHotter) {
  Policy p = ShortWindows(0);
  p.attention_keep_ratio = 4;
  auto cache = PolicyCache(p);
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 64, &slots).ok());  // 4 blocks, all younger than 96 tokens
  // Block 1 gets 4x a uniform share (1/4 of 4 blocks would be 1x): kept; block 2 gets 3x: not.
  ASSERT_TRUE(cache->RecordAttention(seq, std::vector<float>{0.f, 1.f, 0.75f, 0.f}).ok());
  ASSERT_TRUE(cache->Append(seq, 16, &slots).ok());  // 80 tokens: blocks 0-2 aged past 32
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, seq), (std::vector<int>{1, 0, 1, 0, 0}));
  ASSERT_TRUE(cache->Append(seq, 160, &slots).ok());  // 240 tokens: blocks 0-8 past 96
  ASSERT_TRUE(cache->EndStep().ok());
  const std::vector<int> formats = Formats(*cache, seq);
  EXPECT_EQ(formats[0], 2);
  EXPECT_EQ(formats[1], 1);  // NVFP4 by age, kept in FP8
  EXPECT_EQ(formats[2], 2);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
  // Without the rule the same reports change nothing.
  auto plain = PolicyCache(ShortWindows(0));
  const SequenceId other = *plain->AddSequence();
  ASSERT_TRUE(plain->Append(other, 64, &slots).ok());
  ASSERT_TRUE(plain->RecordAttention(other, std::vector<float>{0.f, 1.f, 0.75f, 0.f}).ok());
  ASSERT_TRUE(plain->Append(other, 176, &slots).ok());
  ASSERT_TRUE(plain->EndStep().ok());
  EXPECT_EQ(Formats(*plain, other)[1], 2);
}

TEST(PolicyAgingTest, UnderPressureWindowsShrinkBeforePrefixesAreEvicted) {
  Policy p = ShortWindows(0);
  p.tiers[0].max_age_tokens = 512;
  p.tiers[1].max_age_tokens = 4096;
  p.pressure_watermark = 0.3;
  p.pressure_window_scale = 0.125;
  auto cache = PolicyCache(p, /*slabs=*/8);  // 2048 FP16 blocks
  // A cached prefix of 20 blocks, then a sequence that fills 74% of the budget.
  std::vector<int32_t> prompt(320);
  for (int i = 0; i < 320; ++i) prompt[i] = i;
  const SequenceId first = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->AppendTokens(first, prompt, &slots).ok());
  ASSERT_TRUE(cache->Release(first).ok());
  const SequenceId big = *cache->AddSequence();
  ASSERT_TRUE(cache->Append(big, 16 * 1500, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  CacheStats s = cache->GetStats();
  EXPECT_TRUE(s.under_pressure);
  EXPECT_GT(s.demotions_under_pressure, 0);  // windows shrank 8x: old blocks left FP16
  EXPECT_EQ(s.evicted_blocks, 0);             // and no cached prefix was dropped
  EXPECT_EQ(s.formats[0].blocks_cached, 20);
  EXPECT_GT(s.formats[1].blocks_in_use, 0);
  EXPECT_GT(s.formats[2].blocks_in_use, 0);
  EXPECT_EQ(s.policy_demotion_failures, 0);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

Policy TwoTiers() {
  Policy p;
  p.name = "two";
  p.tiers = {{*ParseFormat("fp16"), 16}, {*ParseFormat("fp8_e4m3/block_head"), -1}};
  p.sink_tokens = 0;
  p.pressure_watermark = 0;
  return p;
}

// A sequence with token ids, grown 1024 tokens a step until a policy demotion finds no room:
// the colder pool is full of its blocks.
SequenceId GrowUntilADemotionFails(Cache& cache) {
  const SequenceId x = *cache.AddSequence();
  std::vector<int64_t> slots;
  std::vector<int32_t> tokens(1024);
  for (int round = 0; cache.GetStats().policy_demotion_failures == 0 && round < 20; ++round) {
    for (int i = 0; i < 1024; ++i) tokens[i] = round * 1024 + i;
    EXPECT_TRUE(cache.AppendTokens(x, tokens, &slots).ok());
    EXPECT_TRUE(cache.EndStep().ok());
  }
  EXPECT_GT(cache.GetStats().policy_demotion_failures, 0);
  return x;
}

// A policy demotion into a pool full of cached blocks evicts some: blocks in use come first.
TEST(PolicyAgingTest, DemotionEvictsCachedBlocksWhenTheColderPoolIsFull) {
  auto cache = PolicyCache(TwoTiers(), /*slabs=*/2);  // one FP16 and one FP8 slab at most
  std::vector<int64_t> slots;
  const SequenceId x = GrowUntilADemotionFails(*cache);
  // A demotion left queued refuses no call: it is not an allocation failure.
  EXPECT_EQ(cache->GetStats().allocation_failures, 0);
  ASSERT_TRUE(cache->Release(x).ok());  // the FP8 slab is full of cached blocks
  CacheStats s = cache->GetStats();
  EXPECT_EQ(s.slabs_free, 0);
  EXPECT_GT(s.formats[1].blocks_cached, 0);
  const SequenceId y = *cache->AddSequence();
  ASSERT_TRUE(cache->Append(y, 64, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_EQ(Formats(*cache, y), (std::vector<int>{1, 1, 1, 0}));
  EXPECT_GT(cache->GetStats().evicted_blocks, s.evicted_blocks);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

// A demotion queue longer than evicting every cached block could make room for moves what it
// can: asking for the whole queue was refused, and nothing ever moved.
TEST(PolicyAgingTest, DemotionMovesWhatEvictionCanMakeRoomFor) {
  auto cache = PolicyCache(TwoTiers(), /*slabs=*/2);  // one FP16 and one FP8 slab at most
  std::vector<int64_t> slots;
  const SequenceId x = GrowUntilADemotionFails(*cache);
  ASSERT_TRUE(cache->Release(x).ok());  // the FP8 slab is full of cached blocks
  // A sequence in use takes the FP8 slab's pages a block a step, until 8 cached ones are left.
  const SequenceId z = *cache->AddSequence();
  for (int step = 0; cache->GetStats().formats[1].blocks_cached > 8; ++step) {
    ASSERT_LT(step, 2000);
    ASSERT_TRUE(cache->Append(z, 16, &slots).ok());
    ASSERT_TRUE(cache->EndStep().ok());
  }
  const CacheStats before = cache->GetStats();
  ASSERT_EQ(before.formats[1].blocks_cached, 8);
  ASSERT_EQ(before.formats[1].pages_used, before.formats[1].pages_mapped);
  // 40 blocks age at once: room for 8 of them.
  const SequenceId y = *cache->AddSequence();
  ASSERT_TRUE(cache->Append(y, 16 * 41, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const std::vector<int> formats = Formats(*cache, y);
  EXPECT_EQ(std::count(formats.begin(), formats.end(), 1), 8);
  EXPECT_EQ(cache->GetStats().evicted_blocks, before.evicted_blocks + 8);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

// Free pages scattered over a pool's slabs come back to the budget at EndStep.
TEST(PolicyAgingTest, EndStepCompactsAPoolSoAnotherCanGrow) {
  Options o = SmallOptions(4);
  o.palette = PolicyPalette(TwoTiers());  // no policy: only the explicit demotions below
  auto cache = MustCreate(o);
  std::vector<SequenceId> small;
  std::vector<int64_t> slots;
  // One-block sequences, demoted to FP8 at once, until the FP8 pool maps a second slab.
  while (cache->GetStats().formats[1].slabs_mapped < 2 || small.size() % 2 != 0) {
    small.push_back(*cache->AddSequence());
    ASSERT_TRUE(cache->Append(small.back(), 16, &slots).ok());
    ASSERT_TRUE(cache->Demote(*cache->SequenceBlocks(small.back()), 1).ok());
  }
  // Every other one released: about a slab's worth of free FP8 pages, spread over both slabs.
  for (size_t i = 0; i < small.size(); i += 2) ASSERT_TRUE(cache->Release(small[i]).ok());
  // A long FP16 sequence takes the rest of the budget; its last block stays hot (partial).
  const SequenceId big = *cache->AddSequence();
  while (cache->GetStats().slabs_free > 0 || cache->GetStats().formats[0].pages_mapped -
                                                     cache->GetStats().formats[0].pages_used > 16) {
    ASSERT_TRUE(cache->Append(big, 16, &slots).ok());
  }
  const std::vector<BlockId> kept = *cache->SequenceBlocks(small[1]);
  CacheStats s = cache->GetStats();
  EXPECT_EQ(s.compacted_pages, 0);
  // FP16 cannot grow: the FP8 pool's free pages are scattered.
  EXPECT_EQ(cache->Append(big, 16 * 64, &slots).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(cache->EndStep().ok());
  s = cache->GetStats();
  EXPECT_GT(s.compacted_pages, 0);
  EXPECT_EQ(s.formats[1].blocks_in_use, static_cast<int64_t>(small.size() / 2));
  EXPECT_TRUE(cache->Append(big, 16 * 64, &slots).ok());
  EXPECT_EQ(cache->GetBlockInfo(kept[0])->format, 1);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

TEST(PolicyAgingTest, SetPolicyNeedsItsFormatsInThePalette) {
  auto cache = MustCreate(SmallOptions());  // palette {fp16}
  EXPECT_EQ(cache->SetPolicy(ShortWindows()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache->SetPolicy(*PolicyPreset("fp16")).ok());
  Policy bad = ShortWindows();
  bad.tiers.clear();
  EXPECT_EQ(cache->SetPolicy(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
