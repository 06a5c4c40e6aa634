#include "kvtier/cache.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::RandomHalves;
using ::kvtier::testing::SmallOptions;

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override { cache_ = MustCreate(SmallOptions()); }
  void TearDown() override {
    if (cache_) {
      EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
    }
  }

  // Appends `n` tokens to `seq` and writes random K/V to every layer; returns what was written,
  // per layer [n, heads, dim] for K then V.
  std::vector<std::vector<uint16_t>> AppendAndWrite(SequenceId seq, int n, uint32_t seed,
                                                    DType dtype = DType::kFloat16) {
    std::vector<int64_t> slots;
    EXPECT_TRUE(cache_->Append(seq, n, &slots).ok());
    const Geometry& g = cache_->options().geometry;
    std::vector<std::vector<uint16_t>> written;
    for (int l = 0; l < g.num_layers; ++l) {
      const size_t count = static_cast<size_t>(n) * g.num_kv_heads * g.head_dim;
      written.push_back(RandomHalves(count, seed + 2 * l));
      written.push_back(RandomHalves(count, seed + 2 * l + 1));
      if (dtype == DType::kBFloat16) {
        for (auto* w : {&written[2 * l], &written[2 * l + 1]}) {
          for (uint16_t& x : *w) x = codec::FloatToBf16(codec::HalfToFloat(x));
        }
      }
      KVInput kv{dtype, written[2 * l].data(), written[2 * l + 1].data(), n, g.num_kv_heads, g.head_dim};
      EXPECT_TRUE(cache_->WriteKV(l, slots, kv).ok());
    }
    return written;
  }

  std::vector<float> Read(SequenceId seq, int layer, bool keys) {
    const Geometry& g = cache_->options().geometry;
    const size_t n = static_cast<size_t>(*cache_->SequenceLength(seq)) * g.num_kv_heads * g.head_dim;
    std::vector<float> k(n), v(n);
    EXPECT_TRUE(cache_->ReadKV(seq, layer, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
    return keys ? k : v;
  }

  std::unique_ptr<Cache> cache_;
};

TEST_F(CacheTest, AppendReturnsSlotsInHotBlocks) {
  const SequenceId seq = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(seq, 20, &slots).ok());
  ASSERT_EQ(slots.size(), 20u);
  for (int i = 1; i < 16; ++i) EXPECT_EQ(slots[i], slots[0] + i);  // one block
  EXPECT_EQ(slots[16] % 16, 0);                                    // a second block
  EXPECT_EQ(*cache_->SequenceLength(seq), 20);
  const std::vector<BlockId> blocks = *cache_->SequenceBlocks(seq);
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(cache_->GetBlockInfo(blocks[0])->num_tokens, 16);
  EXPECT_EQ(cache_->GetBlockInfo(blocks[1])->num_tokens, 4);
  EXPECT_EQ(cache_->GetBlockInfo(blocks[1])->page * 16, slots[16]);
}

TEST_F(CacheTest, Fp16RoundTripIsBitExact) {
  const SequenceId seq = *cache_->AddSequence();
  auto first = AppendAndWrite(seq, 21, 1);
  auto second = AppendAndWrite(seq, 30, 100);
  for (int l = 0; l < 2; ++l) {
    for (int side = 0; side < 2; ++side) {
      std::vector<uint16_t> want = first[2 * l + side];
      want.insert(want.end(), second[2 * l + side].begin(), second[2 * l + side].end());
      const std::vector<float> got = Read(seq, l, side == 0);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(codec::FloatToHalf(got[i]), want[i]) << "layer " << l << " at " << i;
      }
    }
  }
}

// On the CPU backend WriteKV is done on return: a fence recorded after it has passed, and
// fences increase.
TEST_F(CacheTest, RecordFenceAfterWriteKVHasPassedOnTheCpuBackend) {
  const SequenceId seq = *cache_->AddSequence();
  AppendAndWrite(seq, 5, 7);
  const absl::StatusOr<uint64_t> fence = cache_->RecordFence();
  ASSERT_TRUE(fence.ok()) << fence.status();
  EXPECT_GT(*fence, 0u);
  EXPECT_TRUE(*cache_->FencePassed(*fence));
  const absl::StatusOr<uint64_t> next = cache_->RecordFence();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(*next, *fence);
}

TEST(CacheBf16Test, Bf16RoundTripIsBitExact) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("bf16")};
  auto cache = MustCreate(o);
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 17, &slots).ok());
  const size_t n = 17 * 2 * 64;
  std::vector<uint16_t> k = RandomHalves(n, 3), v = RandomHalves(n, 4);
  for (uint16_t& x : k) x = codec::FloatToBf16(codec::HalfToFloat(x));
  for (uint16_t& x : v) x = codec::FloatToBf16(codec::HalfToFloat(x));
  ASSERT_TRUE(cache->WriteKV(1, slots, KVInput{DType::kBFloat16, k.data(), v.data(), 17, 2, 64}).ok());
  std::vector<float> gk(n), gv(n);
  ASSERT_TRUE(cache->ReadKV(seq, 1, absl::MakeSpan(gk), absl::MakeSpan(gv)).ok());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(codec::FloatToBf16(gk[i]), k[i]);
    ASSERT_EQ(codec::FloatToBf16(gv[i]), v[i]);
  }
}

TEST_F(CacheTest, ForkSharesFullBlocksAndCopiesTheTailOnWrite) {
  const SequenceId parent = *cache_->AddSequence();
  auto written = AppendAndWrite(parent, 20, 7);
  const SequenceId child = *cache_->Fork(parent);
  const std::vector<BlockId> pb = *cache_->SequenceBlocks(parent);
  std::vector<BlockId> cb = *cache_->SequenceBlocks(child);
  EXPECT_EQ(pb, cb);
  EXPECT_EQ(cache_->GetBlockInfo(pb[1])->ref_count, 2);

  // The child appends: its tail is copied first, the full block stays shared.
  AppendAndWrite(child, 1, 50);
  cb = *cache_->SequenceBlocks(child);
  EXPECT_EQ(cb[0], pb[0]);
  EXPECT_NE(cb[1], pb[1]);
  EXPECT_EQ(cache_->GetBlockInfo(pb[0])->ref_count, 2);
  EXPECT_EQ(cache_->GetBlockInfo(pb[1])->ref_count, 1);
  EXPECT_EQ(cache_->GetStats().copy_on_write_blocks, 1);

  // Both still read the parent's 20 tokens; the child has one more.
  const std::vector<float> pk = Read(parent, 0, true), ck = Read(child, 0, true);
  ASSERT_EQ(ck.size(), pk.size() + 2 * 64);
  for (size_t i = 0; i < pk.size(); ++i) {
    ASSERT_EQ(codec::FloatToHalf(pk[i]), written[0][i]);
    ASSERT_EQ(ck[i], pk[i]);
  }
}

TEST_F(CacheTest, ReleaseFreesBlocksOnlyWhenUnreferenced) {
  const SequenceId a = *cache_->AddSequence();
  AppendAndWrite(a, 32, 9);
  const SequenceId b = *cache_->Fork(a);
  const std::vector<BlockId> blocks = *cache_->SequenceBlocks(a);
  ASSERT_TRUE(cache_->Release(a).ok());
  EXPECT_EQ(cache_->GetBlockInfo(blocks[0])->ref_count, 1);
  ASSERT_TRUE(cache_->Release(b).ok());
  EXPECT_EQ(cache_->GetBlockInfo(blocks[0]).status().code(), absl::StatusCode::kNotFound);
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.formats[0].pages_used, 0);
  EXPECT_EQ(s.sequences, 0);
  EXPECT_EQ(s.pages_pending_reclaim, 0);  // the CPU fence is immediate
}

TEST_F(CacheTest, PageTablesDescribeEachSequence) {
  const SequenceId a = *cache_->AddSequence();
  const SequenceId b = *cache_->AddSequence();
  const SequenceId c = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(a, 40, &slots).ok());
  ASSERT_TRUE(cache_->Append(b, 16, &slots).ok());
  PageTables t;
  ASSERT_TRUE(cache_->BuildPageTables({b, a, c}, &t).ok());
  ASSERT_EQ(t.per_format.size(), 1u);
  const FormatPageTable& hot = t.per_format[0];
  EXPECT_EQ(hot.indptr, (std::vector<int32_t>{0, 1, 4, 4}));
  EXPECT_EQ(hot.last_page_len, (std::vector<int32_t>{16, 8, 0}));
  EXPECT_EQ(t.seq_lens, (std::vector<int32_t>{16, 40, 0}));
  EXPECT_EQ(t.packed_indptr, (std::vector<int32_t>{0, 1, 4, 4}));
  const std::vector<BlockId> ab = *cache_->SequenceBlocks(a);
  for (int i = 0; i < 3; ++i) {
    const BlockInfo info = *cache_->GetBlockInfo(ab[i]);
    EXPECT_EQ(hot.indices[1 + i], info.page);
    EXPECT_EQ(t.packed[1 + i], PackPage(0, info.page));
  }
}

TEST_F(CacheTest, SlabsReturnToTheBudgetAtStepEnd) {
  const CacheStats empty = cache_->GetStats();
  EXPECT_EQ(empty.slabs_free, 4);
  std::vector<SequenceId> seqs;
  std::vector<int64_t> slots;
  for (int i = 0; i < 3; ++i) {  // 3 x 256 blocks: three slabs
    seqs.push_back(*cache_->AddSequence());
    ASSERT_TRUE(cache_->Append(seqs.back(), 256 * 16, &slots).ok());
  }
  EXPECT_EQ(cache_->GetStats().slabs_free, 1);
  for (SequenceId s : seqs) ASSERT_TRUE(cache_->Release(s).ok());
  EXPECT_EQ(cache_->GetStats().formats[0].slabs_mapped, 3);  // empty, until the step ends
  ASSERT_TRUE(cache_->EndStep().ok());
  const CacheStats after = cache_->GetStats();
  EXPECT_EQ(after.formats[0].slabs_mapped, 1);  // one spare stays
  EXPECT_EQ(after.slabs_free, 3);
  EXPECT_EQ(after.steps, 1);
}

TEST_F(CacheTest, StatsReportUsageAndBits) {
  const SequenceId a = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(a, 33, &slots).ok());
  const CacheStats s = cache_->GetStats();
  EXPECT_EQ(s.tokens, 33);
  EXPECT_EQ(s.sequences, 1);
  EXPECT_EQ(s.formats[0].blocks_in_use, 3);
  EXPECT_EQ(s.used_bytes, 3 * 8192 * 2);
  EXPECT_DOUBLE_EQ(s.effective_bits_per_element, 16.0);
  EXPECT_DOUBLE_EQ(s.usage_ratio, 3.0 * 8192 * 2 / s.budget_bytes);
  EXPECT_EQ(s.formats[0].name, "fp16");
}

TEST(CacheDeathTest, UnmappedSlabsFault) {
  auto cache = MustCreate(SmallOptions());
  const SequenceId a = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(a, 1, &slots).ok());
  const PoolInfo pool = *cache->GetPool(0, 0);
  volatile uint8_t* base = static_cast<uint8_t*>(pool.base);
  EXPECT_EQ(base[slots[0] / 16 * pool.page_bytes], base[slots[0] / 16 * pool.page_bytes]);
  // Page 256 is the first page of slab slot 1, which is not mapped: touching it faults.
  EXPECT_DEATH(base[256 * pool.page_bytes] = 1, "");
}

}  // namespace
}  // namespace kvtier
