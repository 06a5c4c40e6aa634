// A seeded random walk of 100,000 mixed operations under a small budget: shared prompts, forks,
// priorities, demotion and eviction, with the consistency checker after every operation and a
// shadow model of every sequence's contents.
#include <random>
#include <unordered_map>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

// The value written for token id `token` at position `pos`: a function of both, so that a
// block reused through the prefix index must hold exactly what its owner wrote. Small integers
// are exact in FP16 and BF16, so demotion to BF16 changes nothing.
uint16_t ValueOf(int32_t token, int64_t pos) {
  return codec::FloatToHalf(static_cast<float>((token * 31 + pos * 7) % 256 - 128));
}

struct IdHash {
  size_t operator()(SequenceId id) const { return (uint64_t{id.index} << 32) | id.generation; }
};

class RandomWalk {
 public:
  RandomWalk(uint32_t seed, Options options) : rng_(seed), cache_(testing::MustCreate(options)) {
    // Eight "system prompts" of 0 to 120 tokens that requests share.
    for (int p = 0; p < 8; ++p) {
      std::vector<int32_t> prompt(std::uniform_int_distribution<int>(0, 120)(rng_));
      for (int32_t& t : prompt) t = static_cast<int32_t>(rng_() % 50000);
      prompts_.push_back(prompt);
    }
  }

  void Run(int operations) {
    for (int i = 0; i < operations; ++i) {
      Step();
      if (::testing::Test::HasFatalFailure()) return;
      const absl::Status ok = cache_->CheckConsistency();
      ASSERT_TRUE(ok.ok()) << "after operation " << i << ": " << ok;
    }
    for (auto& [id, tokens] : live_) Verify(id, tokens);
    const CacheStats s = cache_->GetStats();
    EXPECT_GT(s.prefix_hit_blocks, 0);
    EXPECT_GT(s.evicted_blocks, 0);
    EXPECT_GT(s.allocation_failures, 0);
    ASSERT_EQ(s.migrations.size(), 1u);
    if (cache_->options().host_tier_bytes > 0) {
      EXPECT_GT(s.host.offloaded_blocks, 0);
      EXPECT_GT(s.host.onloaded_blocks, 0);
      EXPECT_GT(s.host.hit_tokens, 0);
      EXPECT_GT(s.host.evicted_blocks, 0);
    }
  }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  SequenceId Pick() {
    auto it = live_.begin();
    std::advance(it, Uniform(0, static_cast<int>(live_.size()) - 1));
    return it->first;
  }

  void Step() {
    const int op = Uniform(0, 99);
    if (live_.empty() || op < 10) {
      Add();
    } else if (op < 55) {
      Append(Pick());
    } else if (op < 62) {
      const SequenceId parent = Pick();
      const SequenceId child = *cache_->Fork(parent);
      live_[child] = live_[parent];
    } else if (op < 76) {
      const SequenceId id = Pick();
      ASSERT_TRUE(cache_->Release(id).ok());
      live_.erase(id);
    } else if (op < 84) {
      std::vector<SequenceId> batch;
      for (int i = 0; i < 4; ++i) batch.push_back(Pick());
      ASSERT_TRUE(cache_->BuildPageTables(batch, &tables_).ok());
      for (size_t b = 0; b < batch.size(); ++b) {
        ASSERT_EQ(tables_.seq_lens[b], static_cast<int32_t>(live_[batch[b]].size()));
      }
    } else if (op < 90) {
      Demote(Pick());
    } else if (op < 96) {
      ASSERT_TRUE(cache_->EndStep().ok());
    } else {
      const SequenceId id = Pick();
      Verify(id, live_[id]);
    }
  }

  void Add() {
    const std::vector<int32_t>& system = prompts_[Uniform(0, 7)];
    std::vector<int32_t> prompt = system;
    const int extra = Uniform(0, 40);
    for (int i = 0; i < extra; ++i) prompt.push_back(static_cast<int32_t>(rng_() % 50000));
    SequenceOptions options;
    options.prompt = prompt;
    options.priority = Uniform(0, 2);
    options.priority_ttl_steps = Uniform(-1, 5);
    const AddResult added = *cache_->AddSequence(options);
    std::vector<int32_t>& tokens = live_[added.id];
    tokens.assign(prompt.begin(), prompt.begin() + added.cached_tokens);
    const std::vector<int32_t> rest(prompt.begin() + added.cached_tokens, prompt.end());
    if (!rest.empty()) Write(added.id, rest);
  }

  void Append(SequenceId id) {
    std::vector<int32_t> fresh(Uniform(1, 40));
    for (int32_t& t : fresh) t = static_cast<int32_t>(rng_() % 50000);
    Write(id, fresh);
  }

  // Appends `fresh` to `id` with token ids and writes their values to layer 0.
  void Write(SequenceId id, const std::vector<int32_t>& fresh) {
    slots_.clear();
    const absl::Status s = cache_->AppendTokens(id, fresh, &slots_);
    if (absl::IsResourceExhausted(s)) {
      ASSERT_TRUE(slots_.empty());
      return;
    }
    ASSERT_TRUE(s.ok()) << s;
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<int32_t>& tokens = live_[id];
    data_.resize(fresh.size() * row);
    for (size_t t = 0; t < fresh.size(); ++t) {
      std::fill(data_.begin() + t * row, data_.begin() + (t + 1) * row,
                ValueOf(fresh[t], static_cast<int64_t>(tokens.size())));
      tokens.push_back(fresh[t]);
    }
    const KVInput kv{DType::kFloat16, data_.data(), data_.data(),
                     static_cast<int64_t>(fresh.size()), g.num_kv_heads, g.head_dim};
    ASSERT_TRUE(cache_->WriteKV(0, slots_, kv).ok());
  }

  void Demote(SequenceId id) {
    const std::vector<BlockId> blocks = *cache_->SequenceBlocks(id);
    std::vector<BlockId> hot_full;
    for (BlockId b : blocks) {
      const BlockInfo info = *cache_->GetBlockInfo(b);
      if (info.format == 0 && info.num_tokens == cache_->options().geometry.block_tokens) {
        hot_full.push_back(b);
      }
    }
    if (hot_full.empty()) return;
    hot_full.resize(Uniform(1, static_cast<int>(hot_full.size())));
    const absl::Status s = cache_->Demote(hot_full, 1);
    ASSERT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << s;
  }

  void Verify(SequenceId id, const std::vector<int32_t>& tokens) {
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<float> k(tokens.size() * row), v(k.size());
    ASSERT_TRUE(cache_->ReadKV(id, 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
    for (size_t t = 0; t < tokens.size(); ++t) {
      const uint16_t want = ValueOf(tokens[t], static_cast<int64_t>(t));
      ASSERT_EQ(codec::FloatToHalf(k[t * row]), want) << "token " << t;
      ASSERT_EQ(codec::FloatToHalf(v[t * row + row - 1]), want) << "token " << t;
    }
  }

  std::mt19937 rng_;
  std::unique_ptr<Cache> cache_;
  std::vector<std::vector<int32_t>> prompts_;
  std::unordered_map<SequenceId, std::vector<int32_t>, IdHash> live_;  // token ids
  std::vector<int64_t> slots_;
  std::vector<uint16_t> data_;
  PageTables tables_;
};

TEST(CacheRandomizedTest, HundredThousandOperationsKeepEveryInvariant) {
  // 2 slabs per layer: 512 FP16 blocks, so appends regularly evict and hit the budget.
  Options o = testing::SmallOptions(/*slabs_per_layer=*/2);
  o.palette = {*ParseFormat("fp16"), *ParseFormat("bf16")};
  RandomWalk walk(20261129, o);
  walk.Run(100000);
}

TEST(CacheRandomizedTest, WithAHostTierOffloadAndOnloadKeepEveryInvariant) {
  // A host tier of 1 slab per layer below the same device budget; offloaded FP16 blocks are
  // demoted to BF16 on the way down (the walk's values are exact in both).
  Options o = testing::SmallOptions(/*slabs_per_layer=*/2);
  o.palette = {*ParseFormat("fp16"), *ParseFormat("bf16")};
  o.host_tier_bytes = size_t{2} * o.slab_bytes;
  o.host_tier_format = 1;
  RandomWalk walk(20261201, o);
  walk.Run(100000);
}

}  // namespace
}  // namespace kvtier
