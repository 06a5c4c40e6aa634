// A seeded random walk of 100,000 mixed operations under a small budget, with the consistency
// checker after every step and a shadow model of every sequence's contents.
#include <random>
#include <vector>

#include <unordered_map>
#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

struct Shadow {
  std::vector<uint16_t> token_values;  // one FP16 value per token, written to every element
};

class RandomWalk {
 public:
  RandomWalk(uint32_t seed, Options options) : rng_(seed), cache_(testing::MustCreate(options)) {}

  void Run(int operations) {
    for (int i = 0; i < operations; ++i) {
      Step();
      const absl::Status ok = cache_->CheckConsistency();
      ASSERT_TRUE(ok.ok()) << "after operation " << i << ": " << ok;
    }
    for (auto& [id, shadow] : live_) Verify(id, shadow);
  }

 private:
  SequenceId Pick() {
    auto it = live_.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, live_.size() - 1)(rng_));
    return it->first;
  }

  void Step() {
    const int op = std::uniform_int_distribution<int>(0, 99)(rng_);
    if (live_.empty() || op < 8) {
      live_[*cache_->AddSequence()];
    } else if (op < 60) {
      Append(Pick());
    } else if (op < 68) {
      const SequenceId parent = Pick();
      const SequenceId child = *cache_->Fork(parent);
      live_[child] = live_[parent];
    } else if (op < 82) {
      const SequenceId id = Pick();
      ASSERT_TRUE(cache_->Release(id).ok());
      live_.erase(id);
    } else if (op < 92) {
      std::vector<SequenceId> batch;
      for (int i = 0; i < 4; ++i) batch.push_back(Pick());
      ASSERT_TRUE(cache_->BuildPageTables(batch, &tables_).ok());
      for (size_t b = 0; b < batch.size(); ++b) {
        ASSERT_EQ(tables_.seq_lens[b], static_cast<int32_t>(live_[batch[b]].token_values.size()));
      }
    } else if (op < 97) {
      ASSERT_TRUE(cache_->EndStep().ok());
    } else {
      const SequenceId id = Pick();
      Verify(id, live_[id]);
    }
  }

  void Append(SequenceId id) {
    const int n = std::uniform_int_distribution<int>(1, 40)(rng_);
    slots_.clear();
    const absl::Status s = cache_->Append(id, n, &slots_);
    if (absl::IsResourceExhausted(s)) {
      ASSERT_TRUE(slots_.empty());
      return;
    }
    ASSERT_TRUE(s.ok()) << s;
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    data_.resize(n * row);
    Shadow& shadow = live_[id];
    for (int t = 0; t < n; ++t) {
      const uint16_t value = codec::FloatToHalf(static_cast<float>(next_value_++ % 2048) - 1024.f);
      std::fill(data_.begin() + t * row, data_.begin() + (t + 1) * row, value);
      shadow.token_values.push_back(value);
    }
    const KVInput kv{DType::kFloat16, data_.data(), data_.data(), n, g.num_kv_heads, g.head_dim};
    ASSERT_TRUE(cache_->WriteKV(0, slots_, kv).ok());
  }

  void Verify(SequenceId id, const Shadow& shadow) {
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<float> k(shadow.token_values.size() * row), v(k.size());
    ASSERT_TRUE(cache_->ReadKV(id, 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
    for (size_t t = 0; t < shadow.token_values.size(); ++t) {
      ASSERT_EQ(codec::FloatToHalf(k[t * row]), shadow.token_values[t]) << "token " << t;
      ASSERT_EQ(codec::FloatToHalf(v[t * row + row - 1]), shadow.token_values[t]) << "token " << t;
    }
  }

  std::mt19937 rng_;
  std::unique_ptr<Cache> cache_;
  struct IdHash {
    size_t operator()(SequenceId id) const { return (uint64_t{id.index} << 32) | id.generation; }
  };
  std::unordered_map<SequenceId, Shadow, IdHash> live_;
  std::vector<int64_t> slots_;
  std::vector<uint16_t> data_;
  PageTables tables_;
  uint32_t next_value_ = 0;
};

TEST(CacheRandomizedTest, HundredThousandOperationsKeepEveryInvariant) {
  // 2 slabs per layer: 512 FP16 blocks, so appends regularly hit the budget.
  RandomWalk walk(20261129, testing::SmallOptions(/*slabs_per_layer=*/2));
  walk.Run(100000);
}

}  // namespace
}  // namespace kvtier
