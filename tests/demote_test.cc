// Demotion (requantisation of full blocks to colder formats), calibration of per-tensor scales
// and non-finite input counting, through the public API on the CPU backend.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/relative_error.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::ExpectSameState;
using ::kvtier::testing::MustCreate;
using ::kvtier::testing::SmallOptions;

// Keys with three outlier channels ~10x the rest, values Gaussian; FP16 bit patterns.
std::vector<uint16_t> SyntheticKV(int tokens, int heads, int dim, bool keys, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<uint16_t> out(static_cast<size_t>(tokens) * heads * dim);
  for (size_t i = 0; i < out.size(); ++i) {
    const int channel = static_cast<int>(i % dim);
    const bool outlier = keys && (channel == 3 || channel == 17 || channel == dim - 5);
    out[i] = codec::FloatToHalf(n(rng) * (outlier ? 10.f : 1.f) + (outlier ? 4.f : 0.f));
  }
  return out;
}

struct Written {
  SequenceId seq;
  std::vector<std::vector<uint16_t>> k, v;  // per layer
};

Written WriteSequence(Cache& cache, int tokens, uint32_t seed) {
  const Geometry& g = cache.options().geometry;
  Written w{*cache.AddSequence(), {}, {}};
  std::vector<int64_t> slots;
  EXPECT_TRUE(cache.Append(w.seq, tokens, &slots).ok());
  for (int l = 0; l < g.num_layers; ++l) {
    w.k.push_back(SyntheticKV(tokens, g.num_kv_heads, g.head_dim, true, seed + l));
    w.v.push_back(SyntheticKV(tokens, g.num_kv_heads, g.head_dim, false, seed + 100 + l));
    const KVInput kv{DType::kFloat16, w.k[l].data(), w.v[l].data(), tokens, g.num_kv_heads, g.head_dim};
    EXPECT_TRUE(cache.WriteKV(l, slots, kv).ok());
  }
  return w;
}

std::pair<double, double> ReadError(Cache& cache, const Written& w, int layer) {
  std::vector<float> k(w.k[layer].size()), v(k.size());
  EXPECT_TRUE(cache.ReadKV(w.seq, layer, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
  return {RelativeErrorToHalf(k, w.k[layer]), RelativeErrorToHalf(v, w.v[layer])};
}

std::vector<BlockId> FullBlocks(Cache& cache, SequenceId seq) {
  std::vector<BlockId> full;
  const std::vector<BlockId> all = *cache.SequenceBlocks(seq);
  for (BlockId b : all) {
    if (cache.GetBlockInfo(b)->num_tokens == cache.options().geometry.block_tokens) full.push_back(b);
  }
  return full;
}

struct ColdFormat {
  const char* name;
  double max_key_error;    // relative L2 error bounds of the format's codec
  double max_value_error;
};

class DemoteTest : public ::testing::TestWithParam<ColdFormat> {};

TEST_P(DemoteTest, RequantisesFullBlocksWithinTheCodecsError) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("fp16"), *ParseFormat(GetParam().name)};
  auto cache = MustCreate(o);
  const Written w = WriteSequence(*cache, 45, 11);  // two full blocks and a partial tail
  const std::vector<BlockId> full = FullBlocks(*cache, w.seq);
  ASSERT_EQ(full.size(), 2u);
  ASSERT_TRUE(cache->Demote(full, 1).ok());
  for (BlockId b : full) EXPECT_EQ(cache->GetBlockInfo(b)->format, 1);
  EXPECT_EQ(cache->GetBlockInfo(cache->SequenceBlocks(w.seq)->back())->format, 0);  // tail hot
  for (int l = 0; l < 2; ++l) {
    const auto [k_err, v_err] = ReadError(*cache, w, l);
    EXPECT_GT(k_err, 0.0);
    EXPECT_LT(k_err, GetParam().max_key_error) << GetParam().name << " layer " << l;
    EXPECT_LT(v_err, GetParam().max_value_error) << GetParam().name << " layer " << l;
  }
  const CacheStats s = cache->GetStats();
  ASSERT_EQ(s.migrations.size(), 1u);
  EXPECT_EQ(s.migrations[0].blocks, 2);
  EXPECT_EQ(s.formats[1].blocks_in_use, 2);
  EXPECT_EQ(s.formats[0].pages_used, 1);  // old pages reclaimed at once on the CPU
  EXPECT_LE(s.effective_bits_per_element, 16.0);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

INSTANTIATE_TEST_SUITE_P(
    EveryColdFormat, DemoteTest,
    ::testing::Values(ColdFormat{"bf16", 0.005, 0.005},
                      ColdFormat{"fp8_e4m3/block_head", 0.05, 0.05},
                      ColdFormat{"fp8_e4m3/token_head", 0.05, 0.05},
                      ColdFormat{"fp8_e5m2/block_head", 0.1, 0.1},
                      ColdFormat{"fp8_e5m2/token_head", 0.1, 0.1},
                      ColdFormat{"nvfp4/block_head", 0.15, 0.15},
                      ColdFormat{"nvfp4_channel/block_head", 0.15, 0.2},
                      ColdFormat{"k:nvfp4_channel/block_head,v:nvfp4/block_head", 0.15, 0.15}),
    [](const ::testing::TestParamInfo<ColdFormat>& info) {
      std::string name;
      for (const char* c = info.param.name; *c; ++c) name += std::isalnum(*c) ? *c : '_';
      return name;
    });

TEST(DemoteChainTest, Fp8ThenNvfp4AddsLittleErrorOverDirect) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head"),
               *ParseFormat("nvfp4/block_head")};
  auto cache = MustCreate(o);
  const Written direct = WriteSequence(*cache, 64, 21);
  const Written chained = WriteSequence(*cache, 64, 21);  // identical data
  ASSERT_TRUE(cache->Demote(FullBlocks(*cache, direct.seq), 2).ok());
  ASSERT_TRUE(cache->Demote(FullBlocks(*cache, chained.seq), 1).ok());
  ASSERT_TRUE(cache->Demote(FullBlocks(*cache, chained.seq), 2).ok());
  const auto [dk, dv] = ReadError(*cache, direct, 0);
  const auto [ck, cv] = ReadError(*cache, chained, 0);
  // The chain rounds twice: never better than direct by more than noise, and within 10% worse.
  EXPECT_GT(ck, dk * 0.95);
  EXPECT_LT(ck, dk * 1.10);
  EXPECT_LT(cv, dv * 1.10);
  ASSERT_EQ(cache->GetStats().migrations.size(), 3u);
}

TEST(DemoteErrorsTest, BadRequestsChangeNothing) {
  Options o = SmallOptions(/*slabs_per_layer=*/2);
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head")};
  auto cache = MustCreate(o);
  const Written w = WriteSequence(*cache, 40, 5);
  const std::vector<BlockId> blocks = *cache->SequenceBlocks(w.seq);
  CacheStats before = cache->GetStats();
  auto expect = [&](absl::Status s, absl::StatusCode code) {
    EXPECT_EQ(s.code(), code) << s;
    ExpectSameState(before, cache->GetStats());
    EXPECT_TRUE(cache->CheckConsistency().ok());
  };
  expect(cache->Demote({blocks[0]}, 2), absl::StatusCode::kInvalidArgument);
  expect(cache->Demote({blocks[0]}, 0), absl::StatusCode::kInvalidArgument);
  expect(cache->Demote({blocks[0], blocks[0]}, 1), absl::StatusCode::kInvalidArgument);
  expect(cache->Demote({blocks[0], blocks[2]}, 1), absl::StatusCode::kFailedPrecondition);
  expect(cache->Demote({blocks[0], BlockId{blocks[1].index, blocks[1].generation + 1}}, 1),
         absl::StatusCode::kNotFound);
  ASSERT_TRUE(cache->Demote({blocks[0]}, 1).ok());
  before = cache->GetStats();
  expect(cache->Demote({blocks[0]}, 1), absl::StatusCode::kInvalidArgument);  // not colder now
}

TEST(DemoteErrorsTest, ExhaustedBudgetChangesNothing) {
  Options o = SmallOptions(/*slabs_per_layer=*/2);  // 512 FP16 pages in two slabs
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head")};
  auto cache = MustCreate(o);
  const Written w = WriteSequence(*cache, 16 * 512, 5);  // both slabs full
  const CacheStats before = cache->GetStats();
  const absl::Status s = cache->Demote(FullBlocks(*cache, w.seq), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  const CacheStats after = cache->GetStats();
  ExpectSameState(before, after);
  EXPECT_EQ(after.allocation_failures, before.allocation_failures + 1);
}

TEST(DemoteSlabsTest, SlabsMoveBetweenFormatPools) {
  Options o = SmallOptions(/*slabs_per_layer=*/2);
  o.palette = {*ParseFormat("fp16"), *ParseFormat("nvfp4/block_head")};
  auto cache = MustCreate(o);
  const Written w = WriteSequence(*cache, 16 * 200, 9);  // 200 FP16 blocks: one slab
  ASSERT_TRUE(cache->Demote(FullBlocks(*cache, w.seq), 1).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  CacheStats s = cache->GetStats();
  EXPECT_EQ(s.formats[0].slabs_mapped, 1);  // emptied, kept as the spare
  EXPECT_EQ(s.formats[1].slabs_mapped, 1);  // NVFP4 pages are 3.5x smaller: one slab holds 200
  // The FP16 pool now needs two slabs: one comes from the budget... and none is left, so the
  // NVFP4 pool's spare is taken when it empties.
  std::vector<int64_t> slots;
  const SequenceId more = *cache->AddSequence();
  EXPECT_EQ(cache->Append(more, 16 * 300, &slots).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(cache->Release(w.seq).ok());
  EXPECT_TRUE(cache->Append(more, 16 * 300, &slots).ok());  // takes the emptied NVFP4 slab
  s = cache->GetStats();
  EXPECT_EQ(s.formats[0].slabs_mapped, 2);
  EXPECT_EQ(s.formats[1].slabs_mapped, 0);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
}

TEST(CalibrationTest, PerTensorScalesFollowTheData) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("fp8_e4m3/tensor")};
  const int tokens = 16;
  std::vector<uint16_t> k(tokens * 2 * 64), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = codec::FloatToHalf(static_cast<float>(i % 97) * 20.f - 960.f);  // beyond 448
    v[i] = codec::FloatToHalf(static_cast<float>(i % 13) * 0.001f);          // tiny
  }
  const KVInput kv{DType::kFloat16, k.data(), v.data(), tokens, 2, 64};
  double error[2];
  for (int calibrated = 0; calibrated < 2; ++calibrated) {
    auto cache = MustCreate(o);
    if (calibrated) {
      ASSERT_TRUE(cache->CalibrateTensorScales(0, kv).ok());
      EXPECT_FLOAT_EQ(cache->GetPool(0, 0)->k_tensor_scale, 960.f / 448.f);
    }
    const SequenceId seq = *cache->AddSequence();
    std::vector<int64_t> slots;
    ASSERT_TRUE(cache->Append(seq, tokens, &slots).ok());
    ASSERT_TRUE(cache->WriteKV(0, slots, kv).ok());
    std::vector<float> gk(k.size()), gv(k.size());
    ASSERT_TRUE(cache->ReadKV(seq, 0, absl::MakeSpan(gk), absl::MakeSpan(gv)).ok());
    error[calibrated] = RelativeErrorToHalf(gk, k) + RelativeErrorToHalf(gv, v);
    if (calibrated) {
      // Scales are fixed once a block holds data encoded with them.
      EXPECT_EQ(cache->CalibrateTensorScales(0, kv).code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  EXPECT_GT(error[0], 0.3);   // uncalibrated: keys saturate at 448, values underflow
  EXPECT_LT(error[1], 0.08);  // calibrated
}

// A per-tensor amax so small that amax / 448 has no finite reciprocal: zeros stay zeros (an
// infinite multiplier made them NaN) and the other values are at most the amax.
TEST(CalibrationTest, ATinyPerTensorAmaxKeepsZerosZero) {
  Options o = SmallOptions();
  o.palette = {*ParseFormat("fp8_e4m3/tensor")};
  o.k_tensor_amax = o.v_tensor_amax = {1e-37f, 1e-37f};
  auto cache = MustCreate(o);
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 1, &slots).ok());
  std::vector<uint16_t> kv(2 * 64, 0);
  kv[5] = codec::FloatToHalf(1.f);
  ASSERT_TRUE(cache->WriteKV(0, slots, {DType::kFloat16, kv.data(), kv.data(), 1, 2, 64}).ok());
  std::vector<float> k(kv.size()), v(kv.size());
  ASSERT_TRUE(cache->ReadKV(seq, 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
  for (size_t i = 0; i < k.size(); ++i) {
    ASSERT_TRUE(std::isfinite(k[i]) && std::isfinite(v[i])) << i;
    EXPECT_EQ(k[i] == 0, i != 5) << i;
  }
  EXPECT_LE(k[5], 1e-30f);  // saturated near the tiny amax's range
}

// Per-row and per-block FP8 scales of rows and blocks whose largest magnitude is below
// 448 x 2^-126 are 2^-126, so their reciprocal is finite: zeros stay zeros (0 x inf made them
// NaN) and tiny values decode as at most the scale's range. Written (per-token scales) and
// demoted from BF16 (every scope); the device codec is the same code.
TEST(CalibrationTest, TinyRowsAndBlocksKeepZerosZero) {
  for (const char* format : {"fp8_e4m3/token_head", "fp8_e4m3/block_head", "fp8_e5m2/block_head"}) {
    for (const bool demoted : {false, true}) {
      if (!demoted && std::string(format).find("block") != std::string::npos) continue;
      SCOPED_TRACE(::testing::Message() << format << (demoted ? " demoted" : " written"));
      Options o = SmallOptions();
      o.palette = {*ParseFormat(demoted ? "bf16" : format)};
      if (demoted) o.palette.push_back(*ParseFormat(format));
      auto cache = MustCreate(o);
      const SequenceId seq = *cache->AddSequence();
      std::vector<int64_t> slots;
      ASSERT_TRUE(cache->Append(seq, 16, &slots).ok());  // one full block
      std::vector<uint16_t> kv(16 * 2 * 64, 0);
      for (size_t i = 5; i < kv.size(); i += 128) kv[i] = 0x0100;  // BF16 2^-125, head 0
      for (int l = 0; l < 2; ++l) {
        ASSERT_TRUE(cache->WriteKV(l, slots, {DType::kBFloat16, kv.data(), kv.data(), 16, 2, 64}).ok());
      }
      if (demoted) {
        ASSERT_TRUE(cache->Demote(FullBlocks(*cache, seq), 1).ok());
      }
      std::vector<float> k(kv.size()), v(kv.size());
      ASSERT_TRUE(cache->ReadKV(seq, 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
      for (size_t i = 0; i < k.size(); ++i) {
        ASSERT_TRUE(std::isfinite(k[i]) && std::isfinite(v[i])) << i;
        if (kv[i] == 0) {
          ASSERT_EQ(k[i], 0.f) << i;
        }
        ASSERT_GE(k[i], 0.f) << i;
        ASSERT_LE(k[i], 1e-30f) << i;
      }
    }
  }
}

TEST(NonfiniteTest, WriteKVCountsNanAndInf) {
  auto cache = MustCreate(SmallOptions());
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 2, &slots).ok());
  std::vector<uint16_t> k(2 * 2 * 64, 0x3C00), v(k.size(), 0x3C00);
  k[5] = 0x7E00;   // NaN
  v[9] = 0x7C00;   // +Inf
  v[10] = 0xFC00;  // -Inf
  ASSERT_TRUE(cache->WriteKV(0, slots, KVInput{DType::kFloat16, k.data(), v.data(), 2, 2, 64}).ok());
  EXPECT_EQ(cache->GetStats().nonfinite_values, 3);
}

TEST(AppendBatchTest, AllOrNothing) {
  auto cache = MustCreate(SmallOptions(/*slabs_per_layer=*/1));
  const SequenceId a = *cache->AddSequence(), b = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->AppendBatch({a, b}, {20, 3}, {}, &slots).ok());
  EXPECT_EQ(slots.size(), 23u);
  EXPECT_EQ(*cache->SequenceLength(a), 20);
  const CacheStats before = cache->GetStats();
  slots.clear();
  EXPECT_EQ(cache->AppendBatch({a, b}, {1, 16 * 260}, {}, &slots).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->AppendBatch({a, SequenceId{}}, {1, 1}, {}, &slots).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache->AppendBatch({a, b}, {1}, {}, &slots).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->AppendBatch({a, b}, {1, 0}, {}, &slots).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(slots.empty());
  ExpectSameState(before, cache->GetStats());
  EXPECT_EQ(*cache->SequenceLength(a), 20);
}

// A batch whose pages add up to about 2^32 (each sequence's count within range): refused. The
// slab count wrapped to 0 in 32 bits, nothing was mapped, and allocation ran past the pool.
TEST(AppendBatchTest, PagesAddingUpTo2To32AreRefused) {
  auto cache = MustCreate(SmallOptions());  // 256 FP16 pages a slab
  std::vector<SequenceId> batch;
  for (int i = 0; i < 32; ++i) batch.push_back(*cache->AddSequence());
  const CacheStats before = cache->GetStats();
  std::vector<int64_t> slots;
  EXPECT_EQ(cache->AppendBatch(batch, std::vector<int64_t>(32, INT32_MAX), {}, &slots).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(slots.empty());
  ExpectSameState(before, cache->GetStats());
  EXPECT_TRUE(cache->CheckConsistency().ok());
}

}  // namespace
}  // namespace kvtier
