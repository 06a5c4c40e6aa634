// The host tier on the CUDA backend (docs/tiers.md): page bytes identical after a round trip
// through pinned host memory in every palette format, and a stress loop of offloads and onloads
// with no synchronization but the fences (for compute-sanitizer memcheck and racecheck).
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace kvtier::testing {
namespace {

constexpr int kBlock = 16;

// FP16 pages of 64 KiB: 32 per 2 MiB slab. Four slabs per layer in each tier.
Options TierOptions() {
  Options o;
  o.geometry = Geometry{2, 8, 128, kBlock};
  o.palette = {ParseFormat("fp16").value(), ParseFormat("fp8_e4m3/block_head").value(),
               ParseFormat("k:nvfp4_channel/block_head,v:nvfp4/block_head").value()};
  o.memory_budget_bytes = size_t{2} * 4 * o.slab_bytes;
  o.host_tier_bytes = size_t{2} * 4 * o.slab_bytes;
  o.backend = BackendKind::kCuda;
  return o;
}

// The value of every element of token id `token` at position `pos`: exact in FP16.
uint16_t ValueOf(int32_t token, int64_t pos) {
  return codec::FloatToHalf(static_cast<float>((token * 7 + pos * 3) % 61 - 30) / 4.f);
}

class HostTierGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_REQUIRE_GPU();
    absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(TierOptions());
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }
  void TearDown() override {
    if (cache_ == nullptr) return;
    EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
  }

  // Appends `tokens` to `id` at positions from `first_pos`, their values in every layer;
  // without their ids when not `indexed` (private blocks: freed, not cached, on release).
  absl::Status Append(SequenceId id, const std::vector<int32_t>& tokens, int64_t first_pos,
                      bool indexed = true) {
    std::vector<int64_t> slots;
    const absl::Status appended =
        indexed ? cache_->AppendTokens(id, tokens, &slots)
                : cache_->Append(id, static_cast<int64_t>(tokens.size()), &slots);
    if (!appended.ok()) return appended;
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<uint16_t> host(tokens.size() * row);
    for (size_t t = 0; t < tokens.size(); ++t) {
      std::fill(host.begin() + t * row, host.begin() + (t + 1) * row,
                ValueOf(tokens[t], first_pos + static_cast<int64_t>(t)));
    }
    data_.Upload(host);
    const KVInput kv{DType::kFloat16, data_.data(), data_.data(),
                     static_cast<int64_t>(tokens.size()), g.num_kv_heads, g.head_dim};
    for (int l = 0; l < g.num_layers; ++l) {
      if (absl::Status s = cache_->WriteKV(l, slots, kv); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The bytes of `block`'s page in `layer`, copied back from the device.
  std::vector<uint8_t> PageBytes(BlockId block, int layer) {
    const BlockInfo info = cache_->GetBlockInfo(block).value();
    const PoolInfo pool = cache_->GetPool(info.format, layer).value();
    std::vector<uint8_t> bytes(pool.page_bytes);
    const uint8_t* page = static_cast<const uint8_t*>(pool.base) + info.page * pool.page_bytes;
    EXPECT_EQ(cudaMemcpy(bytes.data(), page, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return bytes;
  }

  // Checks the values of the first `n` tokens of `id` (token ids `tokens`).
  void ExpectValues(SequenceId id, const std::vector<int32_t>& tokens, int64_t n, float tolerance) {
    const Geometry& g = cache_->options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<float> k(n * row), v(n * row);
    ASSERT_TRUE(cache_->ReadKV(id, 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
    for (int64_t t = 0; t < n; ++t) {
      const float want = codec::HalfToFloat(ValueOf(tokens[t], t));
      ASSERT_NEAR(k[t * row], want, tolerance) << "token " << t;
      ASSERT_NEAR(v[t * row + row - 1], want, tolerance) << "token " << t;
    }
  }

  std::unique_ptr<Cache> cache_;
  DeviceBuffer data_;
};

TEST_F(HostTierGpuTest, PageBytesAreIdenticalAfterARoundTripInEveryFormat) {
  const int formats = static_cast<int>(cache_->options().palette.size());
  for (int f = 0; f < formats; ++f) {
    const std::vector<int32_t> prompt = Tokens(4 * kBlock + 1, 1000 * (f + 1));
    const SequenceId seq = cache_->AddSequence().value();
    ASSERT_TRUE(Append(seq, prompt, 0).ok());
    std::vector<BlockId> blocks = cache_->SequenceBlocks(seq).value();
    blocks.pop_back();  // the partial tail
    if (f > 0) {
      const absl::Status demoted = cache_->Demote(blocks, f);
      ASSERT_TRUE(demoted.ok()) << demoted;
    }
    std::vector<std::vector<uint8_t>> before;
    for (BlockId b : blocks) {
      for (int l = 0; l < 2; ++l) before.push_back(PageBytes(b, l));
    }
    ASSERT_TRUE(cache_->Release(seq).ok());
    // A private filler pushes every cached block down (leaf-first: the chain's root goes
    // last); released, its pages are freed, not cached, so the next format finds room.
    const SequenceId filler = cache_->AddSequence().value();
    for (int64_t pos = 0; cache_->GetBlockInfo(blocks[0])->state != BlockState::kOffloaded;
         pos += kBlock) {
      const absl::Status s =
          Append(filler, Tokens(kBlock, 500000 + static_cast<int32_t>(pos)), pos, false);
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_TRUE(cache_->Release(filler).ok());
    SequenceOptions options;
    options.prompt = prompt;
    const AddResult hit = cache_->AddSequence(options).value();
    ASSERT_EQ(hit.host_tokens, 4 * kBlock) << "format " << f;
    while (!cache_->FencePassed(hit.ready_fence).value()) {
    }
    size_t i = 0;
    for (BlockId b : blocks) {
      EXPECT_EQ(cache_->GetBlockInfo(b)->format, f);
      for (int l = 0; l < 2; ++l) ASSERT_EQ(PageBytes(b, l), before[i++]) << "format " << f;
    }
    ASSERT_TRUE(cache_->Release(hit.id).ok());
    ASSERT_TRUE(cache_->EndStep().ok());
  }
  const CacheStats s = cache_->GetStats();
  EXPECT_GT(s.host.offloaded_blocks, 0);
  EXPECT_EQ(s.host.onloaded_blocks, 12);
}

TEST_F(HostTierGpuTest, OffloadsAndOnloadsOrderedByFencesKeepEveryValue) {
  // Eight shared prompts; requests match one, add a few tokens, and go; pages are reused as
  // soon as their fences pass (no synchronization but EndStep), while offloads and onloads
  // move blocks both ways.
  std::mt19937 rng(20261201);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < 8; ++p) prompts.push_back(Tokens(kBlock * (8 + p * 4) + 1, 10000 * (p + 1)));
  std::vector<std::pair<SequenceId, std::vector<int32_t>>> live;
  const int steps = TestScale(400);
  for (int step = 0; step < steps; ++step) {
    const std::vector<int32_t>& prompt = prompts[rng() % prompts.size()];
    SequenceOptions options;
    options.prompt = prompt;
    const AddResult added = cache_->AddSequence(options).value();
    std::vector<int32_t> tokens(prompt.begin(), prompt.begin() + added.cached_tokens);
    const std::vector<int32_t> rest(prompt.begin() + added.cached_tokens, prompt.end());
    const absl::Status s = Append(added.id, rest, added.cached_tokens);
    ASSERT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << s;
    if (s.ok()) tokens.insert(tokens.end(), rest.begin(), rest.end());
    live.emplace_back(added.id, tokens);
    if (live.size() > 3 || rng() % 3 == 0) {
      const size_t victim = rng() % live.size();
      const int64_t n = cache_->SequenceLength(live[victim].first).value();
      ExpectValues(live[victim].first, live[victim].second, n, 0.0f);
      ASSERT_TRUE(cache_->Release(live[victim].first).ok());
      live.erase(live.begin() + victim);
    }
    ASSERT_TRUE(cache_->EndStep().ok());
    ASSERT_TRUE(cache_->CheckConsistency().ok()) << "step " << step;
  }
  const CacheStats s = cache_->GetStats();
  EXPECT_GT(s.host.offloaded_blocks, 0);
  EXPECT_GT(s.host.onloaded_blocks, 0);
}

}  // namespace
}  // namespace kvtier::testing
