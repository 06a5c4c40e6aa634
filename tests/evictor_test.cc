#include "src/evictor.h"

#include <cstdint>
#include <iterator>
#include <list>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/allocation_counter.h"

namespace kvtier {
namespace {

constexpr uint32_t kNone = Evictor::kNone;

std::vector<uint32_t> Drain(Evictor& e, int64_t now) {
  std::vector<uint32_t> out;
  for (uint32_t b = e.PopVictim(now); b != kNone; b = e.PopVictim(now)) out.push_back(b);
  return out;
}

TEST(EvictorTest, LruWithinALevel) {
  Evictor e(8);
  EXPECT_EQ(e.PopVictim(0), kNone);
  for (uint32_t b : {3, 1, 4, 0}) e.Add(b, Evictor::kDefaultLevel, 0);
  EXPECT_EQ(e.size(), 4u);
  EXPECT_TRUE(e.Contains(4));
  EXPECT_FALSE(e.Contains(2));
  EXPECT_EQ(Drain(e, 0), (std::vector<uint32_t>{3, 1, 4, 0}));
  EXPECT_EQ(e.size(), 0u);
  EXPECT_FALSE(e.Contains(4));
  EXPECT_TRUE(e.CheckConsistency().ok());
}

TEST(EvictorTest, LowestLevelFirst) {
  Evictor e(8);
  e.Add(0, 3, 0);
  e.Add(1, 0, 0);
  e.Add(2, 7, 0);
  e.Add(3, 0, 0);
  e.Add(4, 3, 0);
  EXPECT_TRUE(e.CheckConsistency().ok());
  EXPECT_EQ(Drain(e, 0), (std::vector<uint32_t>{1, 3, 0, 4, 2}));
}

TEST(EvictorTest, AddColdestGoesNextInItsLevel) {
  Evictor e(8);
  e.Add(0, 0, 0);
  e.Add(1, 0, 0);
  e.Add(2, 2, 0);
  e.AddColdest(3, 0);  // a parent whose child was just evicted
  e.AddColdest(4, 2);  // evict-first within level 2, still after level 0
  EXPECT_EQ(Drain(e, 0), (std::vector<uint32_t>{3, 0, 1, 4, 2}));
}

TEST(EvictorTest, RemoveFromHeadMiddleAndTail) {
  Evictor e(8);
  for (uint32_t b = 0; b < 6; ++b) e.Add(b, 0, 0);
  e.Remove(2);  // middle
  e.Remove(0);  // head
  e.Remove(5);  // tail
  EXPECT_FALSE(e.Contains(2));
  EXPECT_EQ(e.size(), 3u);
  EXPECT_TRUE(e.CheckConsistency().ok());
  e.Add(2, 0, 1);  // re-added: most recent
  EXPECT_EQ(Drain(e, 1), (std::vector<uint32_t>{1, 3, 4, 2}));
  e.Add(7, 1, 0);
  e.Remove(7);  // the only member of its level
  EXPECT_EQ(e.PopVictim(0), kNone);
  EXPECT_TRUE(e.CheckConsistency().ok());
}

TEST(EvictorTest, ExpiryDemotesToLevelZero) {
  Evictor e(8);
  e.Add(0, 0, /*now=*/0);
  e.Add(1, 5, /*now=*/0, /*expires_at=*/10);
  e.Add(2, 0, /*now=*/1);
  EXPECT_EQ(e.PopVictim(5), 0u);   // 1 still holds level 5
  EXPECT_EQ(e.PopVictim(10), 1u);  // expired: ahead of every level-0 block
  EXPECT_EQ(e.PopVictim(10), 2u);
  // Unexpired, it waits for the lower levels.
  e.Add(3, 5, 20, 100);
  e.Add(4, 0, 20);
  EXPECT_EQ(Drain(e, 99), (std::vector<uint32_t>{4, 3}));
  // Added already expired: plain level 0, in LRU order.
  e.Add(5, 0, 30);
  e.Add(6, 6, 30, 30);
  e.Add(7, 0, 30);
  EXPECT_EQ(Drain(e, 30), (std::vector<uint32_t>{5, 6, 7}));
  EXPECT_TRUE(e.CheckConsistency().ok());
}

TEST(EvictorTest, EarliestExpiryFirstAcrossLevels) {
  Evictor e(8);
  e.Add(0, 0, 0);
  e.Add(1, 4, 0, 30);
  e.Add(2, 2, 0, 20);
  e.Add(3, 6, 0, 10);
  e.Add(4, 6, 0, 1000);
  EXPECT_EQ(Drain(e, 50), (std::vector<uint32_t>{3, 2, 1, 0, 4}));
}

// The documented limit of lazy expiry: an expired block behind an unexpired one in its level
// is demoted late (when it reaches the head), never early.
TEST(EvictorTest, ExpiryIsCheckedAtTheHeadOfEachLevel) {
  Evictor e(8);
  e.Add(0, 3, 0, /*expires_at=*/100);
  e.Add(1, 3, 0, /*expires_at=*/10);  // expires first, but is behind 0
  e.Add(2, 0, 0);
  EXPECT_EQ(e.PopVictim(50), 2u);
  EXPECT_EQ(e.PopVictim(50), 0u);  // level 3 in LRU order
  EXPECT_EQ(e.PopVictim(50), 1u);
  // AddColdest with its child's expiry keeps the level's expiry order.
  e.Add(3, 3, 0, 10);
  e.AddColdest(4, 3, 10);
  e.Add(5, 0, 0);
  EXPECT_EQ(Drain(e, 10), (std::vector<uint32_t>{4, 3, 5}));
}

// With one TTL per level and a nondecreasing clock, lazy expiry misses nothing: every expired
// block goes before every unexpired one, earliest expiry first.
TEST(EvictorTest, ExactWithOneTtlPerLevel) {
  const int64_t ttl[Evictor::kLevels] = {0, 5, 50, 7, 100, 3, 1000, 20};
  constexpr uint32_t kBlocks = 256;
  Evictor e(kBlocks);
  std::mt19937 rng(1);
  std::vector<int64_t> expires(kBlocks);
  int64_t now = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    now += rng() % 3;
    const int level = static_cast<int>(rng() % Evictor::kLevels);
    expires[b] = level == 0 ? Evictor::kNever : now + ttl[level];
    e.Add(b, level, now, expires[b]);
  }
  const int64_t at = now + 10;
  size_t expired = 0;
  for (const int64_t x : expires) expired += x <= at;
  ASSERT_GT(expired, 50u);
  ASSERT_LT(expired, kBlocks - 50u);
  const std::vector<uint32_t> order = Drain(e, at);
  ASSERT_EQ(order.size(), kBlocks);
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(expires[order[i]] <= at, i < expired) << "position " << i;
  }
  for (size_t i = 1; i < expired; ++i) EXPECT_LE(expires[order[i - 1]], expires[order[i]]);
}

// A plain model of the documented contract: one std::list per level.
class ReferenceEvictor {
 public:
  struct Entry {
    uint32_t block;
    int64_t expires_at;
  };

  void Add(uint32_t block, int level, int64_t now, int64_t expires_at) {
    if (level == 0 || expires_at <= now) level = 0, expires_at = Evictor::kNever;
    levels_[level].push_back({block, expires_at});
  }
  void AddColdest(uint32_t block, int level, int64_t expires_at) {
    levels_[level].push_front({block, level == 0 ? Evictor::kNever : expires_at});
  }
  void Remove(uint32_t block) {
    for (auto& list : levels_) {
      for (auto it = list.begin(); it != list.end(); ++it) {
        if (it->block == block) {
          list.erase(it);
          return;
        }
      }
    }
    ADD_FAILURE() << "removing an absent block";
  }
  uint32_t PopVictim(int64_t now) {
    int best = -1;
    for (int level = 1; level < Evictor::kLevels; ++level) {
      const auto& list = levels_[level];
      if (!list.empty() && list.front().expires_at <= now &&
          (best < 0 || list.front().expires_at < levels_[best].front().expires_at)) {
        best = level;
      }
    }
    for (int level = 0; best < 0 && level < Evictor::kLevels; ++level) {
      if (!levels_[level].empty()) best = level;
    }
    if (best < 0) return kNone;
    const uint32_t block = levels_[best].front().block;
    levels_[best].pop_front();
    return block;
  }

 private:
  std::list<Entry> levels_[Evictor::kLevels];
};

TEST(EvictorTest, MatchesReferenceModel) {
  constexpr uint32_t kCapacity = 300;
  constexpr int kOps = 100000;
  Evictor e(kCapacity);
  ReferenceEvictor ref;
  std::vector<uint32_t> listed;                      // blocks in the evictor
  std::vector<uint32_t> position(kCapacity, kNone);  // index in `listed`
  auto mark = [&](uint32_t b) {
    position[b] = static_cast<uint32_t>(listed.size());
    listed.push_back(b);
  };
  auto unmark = [&](uint32_t b) {
    const uint32_t last = listed.back();
    listed[position[b]] = last;
    position[last] = position[b];
    listed.pop_back();
    position[b] = kNone;
  };
  std::mt19937_64 rng(42);
  int64_t now = 0;
  int pops = 0;
  for (int op = 0; op < kOps; ++op) {
    now += static_cast<int64_t>(rng() % 4);
    const int kind = static_cast<int>(rng() % 10);
    const int level = rng() % 3 == 0 ? 0 : static_cast<int>(rng() % Evictor::kLevels);
    // Half the expiring blocks share a TTL per level, half get any expiry.
    const int64_t expires_at = rng() % 4 == 0   ? Evictor::kNever
                               : rng() % 2 == 0 ? now + 10 * level
                                                : now - 5 + static_cast<int64_t>(rng() % 200);
    if (kind < 5 && listed.size() < kCapacity) {  // Add or AddColdest a free block
      uint32_t b = static_cast<uint32_t>(rng() % kCapacity);
      while (position[b] != kNone) b = (b + 1) % kCapacity;
      if (kind < 4) {
        e.Add(b, level, now, expires_at);
        ref.Add(b, level, now, expires_at);
      } else {
        e.AddColdest(b, level, expires_at);
        ref.AddColdest(b, level, expires_at);
      }
      mark(b);
    } else if (kind < 7 && !listed.empty()) {  // Remove any listed block
      const uint32_t b = listed[rng() % listed.size()];
      e.Remove(b);
      ref.Remove(b);
      unmark(b);
    } else {
      const uint32_t b = e.PopVictim(now);
      ASSERT_EQ(b, ref.PopVictim(now)) << "op " << op;
      if (b != kNone) unmark(b), ++pops;
    }
    ASSERT_EQ(e.size(), listed.size());
    if (op % 997 == 0) {
      ASSERT_TRUE(e.CheckConsistency().ok()) << e.CheckConsistency();
      for (uint32_t b = 0; b < kCapacity; ++b) ASSERT_EQ(e.Contains(b), position[b] != kNone);
    }
  }
  EXPECT_GT(pops, kOps / 10);
  EXPECT_TRUE(e.CheckConsistency().ok());
}

TEST(EvictorTest, NeverAllocatesAfterConstruction) {
  const int64_t start = testing::AllocationCount();
  Evictor e(1024);
  ASSERT_GT(testing::AllocationCount(), start);  // the counter sees allocations
  std::mt19937 rng(7);
  const int64_t before = testing::AllocationCount();
  for (int i = 0; i < 20000; ++i) {
    const uint32_t b = rng() % 1024;
    if (e.Contains(b)) {
      e.Remove(b);
    } else if (i % 3 == 0) {
      e.AddColdest(b, static_cast<int>(rng() % Evictor::kLevels), i + 10);
    } else {
      e.Add(b, static_cast<int>(rng() % Evictor::kLevels), i, i + 50);
    }
    if (i % 5 == 0) e.PopVictim(i);
  }
  EXPECT_EQ(testing::AllocationCount(), before);
}

TEST(EvictorTest, NodeIsSixteenBytes) { EXPECT_EQ(sizeof(EvictorNode), 16u); }

}  // namespace
}  // namespace kvtier
