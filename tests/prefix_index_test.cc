#include "src/prefix_index.h"

#include <xxhash.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

#include "gtest/gtest.h"
#include "src/prefix_hash.h"

namespace kvtier {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

void PutLE(uint64_t v, int bytes, std::vector<unsigned char>* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<unsigned char>(v >> (8 * i)));
}

// The documented definition, byte by byte.
uint64_t ReferenceHashTokens(const std::vector<int32_t>& t) {
  std::vector<unsigned char> b;
  for (const int32_t x : t) PutLE(static_cast<uint32_t>(x), 4, &b);
  return XXH3_64bits(b.data(), b.size());
}
uint64_t ReferenceHashBlock(uint64_t parent, const std::vector<int32_t>& t, uint64_t extra) {
  std::vector<unsigned char> b;
  PutLE(parent, 8, &b);
  PutLE(ReferenceHashTokens(t), 8, &b);
  PutLE(extra, 8, &b);
  return XXH3_64bits(b.data(), b.size());
}

// Identities are published across processes and machines: a change of these values is a
// change of the wire format, not a refactoring.
TEST(PrefixHashTest, ValuesAreFrozen) {
  const std::vector<int32_t> t = Tokens(16, 1000);
  EXPECT_EQ(HashTokens({}), 0x2d06800538d394c2u);  // XXH3-64 of no bytes, from xxHash itself
  EXPECT_EQ(HashTokens(t), 0x2b1e84fe7c4fd6fbu);
  const uint64_t root = HashBlock(kRootParentHash, t, 0);
  EXPECT_EQ(root, 0x5d427c9b3cf50d33u);
  EXPECT_EQ(HashBlock(root, t, 0), 0x9c75a22a53aa52afu);
}

TEST(PrefixHashTest, MatchesTheDocumentedDefinition) {
  const std::vector<int32_t> t = {0, -1, 0x01020304, 7, INT32_MIN, INT32_MAX};
  const uint64_t parent = 0x0123456789abcdefu;
  const uint64_t extra = 0xfedcba9876543210u;
  EXPECT_EQ(HashTokens(t), ReferenceHashTokens(t));
  EXPECT_EQ(HashBlock(parent, t, extra), ReferenceHashBlock(parent, t, extra));
  for (const int n : {0, 1, 15, 16, 17, 64, 1024, 32768}) {
    const std::vector<int32_t> long_t = Tokens(n, -5);
    EXPECT_EQ(HashTokens(long_t), ReferenceHashTokens(long_t)) << n;
    EXPECT_EQ(HashBlock(9, long_t, 3), ReferenceHashBlock(9, long_t, 3)) << n;
  }
}

TEST(PrefixHashTest, ChainSeparatesParentsAndExtraKeys) {
  const std::vector<int32_t> t = Tokens(16, 0);
  const uint64_t root = HashBlock(kRootParentHash, t, 0);
  EXPECT_EQ(root, HashBlock(kRootParentHash, Tokens(16, 0), 0));  // deterministic
  EXPECT_NE(root, HashBlock(1, t, 0));                            // other parent
  EXPECT_NE(root, HashBlock(kRootParentHash, t, 1));              // other extra key
  EXPECT_NE(root, HashTokens(t));                                 // chained != bare
  EXPECT_NE(root, HashBlock(kRootParentHash, Tokens(16, 1), 0));  // other tokens
  EXPECT_NE(root, HashBlock(kRootParentHash, Tokens(15, 0), 0));  // other length
  // Parent and extra key are not interchangeable.
  EXPECT_NE(HashBlock(5, t, 7), HashBlock(7, t, 5));
  // The same block under two different prefixes has two identities.
  const uint64_t a = HashBlock(HashBlock(kRootParentHash, Tokens(16, 100), 0), t, 0);
  const uint64_t b = HashBlock(HashBlock(kRootParentHash, Tokens(16, 200), 0), t, 0);
  EXPECT_NE(a, b);
}

TEST(PrefixIndexTest, InsertFindErase) {
  PrefixIndex index;
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.Find(42), PrefixIndex::kNone);
  EXPECT_TRUE(index.Insert(42, 7));
  EXPECT_TRUE(index.Insert(43, 0));
  EXPECT_FALSE(index.Insert(42, 9));  // present: unchanged
  EXPECT_EQ(index.Find(42), 7u);
  EXPECT_EQ(index.Find(43), 0u);
  EXPECT_EQ(index.size(), 2u);
  EXPECT_TRUE(index.Erase(42));
  EXPECT_FALSE(index.Erase(42));
  EXPECT_EQ(index.Find(42), PrefixIndex::kNone);
  EXPECT_EQ(index.size(), 1u);
  EXPECT_TRUE(index.Insert(42, 9));
  EXPECT_EQ(index.Find(42), 9u);
}

// Random inserts and erases against a model, with keys whose low bits (the home slot) take few
// values, so that probe runs are long, wrap around the table's end and are closed up by erases.
TEST(PrefixIndexTest, AgreesWithAMapUnderClusteredKeys) {
  for (const uint64_t home_values : {uint64_t{3}, uint64_t{64}, uint64_t{1} << 40}) {
    PrefixIndex index;
    std::unordered_map<uint64_t, uint32_t> model;
    std::mt19937_64 rng(home_values);
    std::vector<uint64_t> keys;
    for (int i = 0; i < 600; ++i) {
      // Low bits near the top of every power-of-two table: homes at its last slots.
      keys.push_back((rng() << 20) | ((~uint64_t{0} - rng() % home_values) & 0xFFFFF));
    }
    for (int step = 0; step < 20000; ++step) {
      const uint64_t key = keys[rng() % keys.size()];
      if (rng() % 3 != 0) {
        const uint32_t block = static_cast<uint32_t>(rng() % 1000);
        ASSERT_EQ(index.Insert(key, block), model.try_emplace(key, block).second) << step;
      } else {
        ASSERT_EQ(index.Erase(key), model.erase(key) == 1) << step;
      }
      ASSERT_EQ(index.size(), model.size());
      if (step % 97 == 0) {
        for (const uint64_t k : keys) {
          const auto it = model.find(k);
          ASSERT_EQ(index.Find(k), it == model.end() ? PrefixIndex::kNone : it->second)
              << "step " << step << ", key " << k;
        }
      }
    }
  }
}

TEST(PrefixIndexTest, MatchesAChainedPrompt) {
  constexpr int kBlocks = 2048;
  const std::vector<int32_t> prompt = Tokens(kBlocks * 16, 1);
  PrefixIndex index;
  index.Reserve(kBlocks);
  uint64_t h = kRootParentHash;
  for (int i = 0; i < kBlocks; ++i) {
    h = HashBlock(h, absl::MakeConstSpan(prompt).subspan(16 * i, 16), 0);
    ASSERT_TRUE(index.Insert(h, static_cast<uint32_t>(i))) << "collision at " << i;
  }
  // A prompt that diverges in block 1000 matches exactly 1000 blocks.
  std::vector<int32_t> other = prompt;
  other[1000 * 16 + 3] += 1;
  h = kRootParentHash;
  int matched = 0;
  for (; matched < kBlocks; ++matched) {
    h = HashBlock(h, absl::MakeConstSpan(other).subspan(16 * matched, 16), 0);
    const uint32_t block = index.Find(h);
    if (block == PrefixIndex::kNone) break;
    EXPECT_EQ(block, static_cast<uint32_t>(matched));
  }
  EXPECT_EQ(matched, 1000);
}

}  // namespace
}  // namespace kvtier
