// The CUDA backend writes the same bytes as the CPU backend: append into every hot format and
// demotion through every legal palette pair, for odd geometries and batch shapes, on random
// data with outlier channels (and, in one test, NaN/Inf/subnormal inputs).
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "tests/gpu/cache_pair.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier::testing {
namespace {

const char* const kHotFormats[] = {"fp16", "bf16", "fp8_e4m3/tensor", "fp8_e4m3/token_head",
                                   "nvfp4/tensor"};
const char* const kColdFormats[] = {
    "fp16",
    "bf16",
    "fp8_e4m3/tensor",
    "fp8_e4m3/block_head",
    "fp8_e4m3/token_head",
    "fp8_e5m2/tensor",
    "fp8_e5m2/block_head",
    "fp8_e5m2/token_head",
    "nvfp4/tensor",
    "nvfp4/block_head",
    "nvfp4_channel/block_head",
    "k:nvfp4_channel/block_head,v:nvfp4/block_head",
    "k:fp16,v:fp8_e4m3/block_head",
};

Options MakeOptions(const Geometry& g, const std::vector<std::string>& palette) {
  Options o;
  o.geometry = g;
  o.memory_budget_bytes = size_t{16} * g.num_layers * o.slab_bytes;
  for (const std::string& name : palette) o.palette.push_back(ParseFormat(name).value());
  o.palette.erase(o.palette.begin());  // the default FP16 entry
  // Per-tensor scales a little below the data's range, so that saturation is exercised too.
  o.k_tensor_amax.assign(g.num_layers, 30.f);
  o.v_tensor_amax.assign(g.num_layers, 3.f);
  return o;
}

// Appends odd-sized batches to a few sequences, writes every layer, demotes full blocks along
// the palette (to each colder format in turn, and straight to the coldest), and compares.
void RunPalette(const Geometry& g, const std::vector<std::string>& palette, uint32_t seed,
                bool specials) {
  SCOPED_TRACE(absl::StrCat("geometry ", g.num_layers, "x", g.num_kv_heads, "x", g.head_dim,
                            " block ", g.block_tokens, ", palette ", palette[0], " | ",
                            palette.back(), palette.size() > 2 ? " (3 formats)" : "",
                            ", seed ", seed));
  absl::StatusOr<std::unique_ptr<CachePair>> made = CachePair::Create(MakeOptions(g, palette));
  if (!made.ok()) {
    // Not a valid cache (e.g. NVFP4 along tokens with blocks of 5): both backends refuse it.
    ASSERT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << made.status();
    return;
  }
  CachePair& pair = **made;
  std::mt19937 rng(seed);
  std::vector<SequenceId> seqs;
  for (int i = 0; i < 5; ++i) seqs.push_back(pair.AddSequence());
  std::uniform_int_distribution<int64_t> len(1, 3 * g.block_tokens + 3);
  for (int round = 0; round < 2; ++round) {
    std::vector<int64_t> tokens;
    for (size_t i = 0; i < seqs.size(); ++i) tokens.push_back(len(rng));
    ASSERT_TRUE(pair.AppendBatch(seqs, tokens).ok());
    pair.WriteAllLayers(&rng, specials);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const int formats = static_cast<int>(palette.size());
  // Demote: full blocks of the first two sequences one format at a time, the rest straight
  // to the coldest format.
  for (int target = 1; target < formats; ++target) {
    std::vector<BlockId> blocks;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (i >= 2 && target != formats - 1) continue;
      const std::vector<BlockId> list = pair.cpu().SequenceBlocks(seqs[i]).value();
      for (BlockId b : list) {
        const BlockInfo info = pair.cpu().GetBlockInfo(b).value();
        if (info.num_tokens == g.block_tokens && info.format < target) blocks.push_back(b);
      }
    }
    const absl::Status s = pair.Demote(blocks, target);
    ASSERT_TRUE(s.ok()) << s;
  }
  for (SequenceId s : seqs) {
    const std::string diff = pair.CompareSequence(s);
    EXPECT_EQ(diff, "");
    if (!diff.empty()) break;
  }
  const CacheStats a = pair.cpu().GetStats();
  const CacheStats b = pair.gpu().GetStats();
  EXPECT_EQ(a.nonfinite_values, b.nonfinite_values);
  if (specials) {
    EXPECT_GT(a.nonfinite_values, 0);
  }
  ASSERT_EQ(a.migrations.size(), b.migrations.size());
  for (size_t i = 0; i < a.migrations.size(); ++i) {
    EXPECT_EQ(a.migrations[i].blocks, b.migrations[i].blocks);
    EXPECT_EQ(a.migrations[i].bytes, b.migrations[i].bytes);
  }
  EXPECT_TRUE(pair.cpu().CheckConsistency().ok());
  EXPECT_TRUE(pair.gpu().CheckConsistency().ok());
}

// Geometries: non-power-of-two head_dim; the benchmark shape (register-cached tiles);
// head_dim 256 with 32-token blocks (tiles read twice, two channel segments); tiny heads with
// 5-token blocks.
const Geometry kGeometries[] = {
    Geometry{3, 3, 80, 16},
    Geometry{2, 8, 128, 16},
    Geometry{1, 2, 256, 32},
    Geometry{2, 1, 16, 5},
};

TEST(CudaParityTest, EveryPalettePairMatchesTheCpuBackend) {
  KVTIER_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  const int geometries = std::min(4, TestScale(4));  // fewer under compute-sanitizer
  for (int gi = 0; gi < geometries; ++gi) {
    const Geometry& g = kGeometries[gi];
    for (const char* hot : kHotFormats) {
      for (const char* cold : kColdFormats) {
        if (std::string(hot) == cold) continue;
        RunPalette(g, {hot, cold}, seed++, /*specials=*/false);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaParityTest, ChainedDemotionsMatchTheCpuBackend) {
  KVTIER_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  for (const Geometry& g : kGeometries) {
    RunPalette(g, {"fp16", "fp8_e4m3/block_head", "nvfp4/block_head"}, seed++, false);
    // The E4M3-source kernel on NaN codes and saturated values (tiles redone exactly).
    RunPalette(g, {"fp16", "fp8_e4m3/block_head", "nvfp4/block_head"}, seed++, true);
    RunPalette(g, {"bf16", "fp8_e4m3/token_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"},
               seed++, false);
    RunPalette(g, {"fp8_e4m3/tensor", "fp8_e5m2/block_head", "nvfp4/tensor"}, seed++, false);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(CudaParityTest, NonFiniteInputsMatchTheCpuBackend) {
  KVTIER_REQUIRE_GPU();
  uint32_t seed = std::random_device{}();
  for (const Geometry& g : {kGeometries[0], kGeometries[1]}) {
    for (const char* hot : kHotFormats) {
      for (const char* cold : kColdFormats) {
        if (std::string(hot) == cold) continue;
        RunPalette(g, {hot, cold}, seed++, /*specials=*/true);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::testing
