// Random option sets drawn over each field's whole valid range, not only the shapes the other
// tests fix: Cache::Create either refuses with InvalidArgument, or the cache fills its budget
// with shared prompts and private appends, demotes, drains, and passes its checker throughout.
// (A fixed-geometry suite missed a page over half a slab: some slabs held no page, and the pool
// divided by that zero.)
#include <iterator>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"

namespace kvtier {
namespace {

constexpr const char* kColdFormats[] = {
    "bf16", "fp8_e4m3/tensor", "fp8_e4m3/block_head", "fp8_e5m2/token_head", "nvfp4/block_head",
    "nvfp4_channel/block_head", "k:fp8_e4m3/block_head,v:nvfp4/block_head"};

// Mostly engine-like shapes, a quarter of the time anywhere in a field's range.
Options RandomOptions(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto rarely = [&] { return pick(0, 3) == 0; };
  Options o;
  o.geometry.num_layers = pick(1, 3);
  o.geometry.num_kv_heads = rarely() ? pick(1, 256) : pick(1, 8);
  o.geometry.head_dim = 16 * (rarely() ? pick(1, 64) : pick(4, 8));
  o.geometry.block_tokens = rarely() ? pick(1, 1024) : 16 * pick(1, 4);
  o.slab_bytes = (size_t{2} << 20) * pick(1, 3);
  o.palette = {*ParseFormat(pick(0, 1) == 0 ? "fp16" : "fp8_e4m3/tensor")};
  const int last = static_cast<int>(std::size(kColdFormats)) - 1;
  for (int f = pick(0, 2); f > 0; --f) {
    o.palette.push_back(*ParseFormat(kColdFormats[pick(0, last)]));
  }
  o.memory_budget_bytes = o.slab_bytes * o.geometry.num_layers * pick(1, 6);
  return o;
}

struct Coverage {
  int created = 0;
  int filled = 0;         // option sets whose budget refused a sequence
  int64_t demoted = 0;    // blocks
  int64_t prefix_hits = 0;
};

// Sequences until the budget refuses one: every other one with a shared prompt (prefix hits),
// each with a private tail; then every full block of every other sequence demoted to the
// coldest format, and everything released.
void FillDemoteDrain(Cache& cache, std::mt19937& rng, Coverage* coverage) {
  const int64_t block = cache.options().geometry.block_tokens;
  std::vector<int32_t> prompt(4 * block + 1);
  std::iota(prompt.begin(), prompt.end(), 7);
  std::vector<SequenceId> live;
  std::vector<int64_t> slots;
  for (int i = 0; i < 48; ++i) {
    SequenceOptions options;
    if (i % 2 == 0) options.prompt = prompt;
    const absl::StatusOr<AddResult> added = cache.AddSequence(options);
    ASSERT_TRUE(added.ok()) << added.status();
    live.push_back(added->id);
    absl::Status s = absl::OkStatus();
    if (i % 2 == 0) {
      s = cache.AppendTokens(added->id, absl::MakeConstSpan(prompt).subspan(added->cached_tokens),
                             &slots);
    }
    if (s.ok()) s = cache.Append(added->id, 1 + rng() % (3 * block), &slots);
    ASSERT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << s;
    if (i % 8 == 7 || !s.ok()) {
      ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
    }
    if (!s.ok()) {
      coverage->filled += 1;
      break;
    }
  }
  const int32_t coldest = static_cast<int32_t>(cache.options().palette.size()) - 1;
  for (size_t i = 1; coldest > 0 && i < live.size(); i += 2) {
    std::vector<BlockId> blocks = *cache.SequenceBlocks(live[i]);
    blocks.resize(*cache.SequenceLength(live[i]) / block);  // full blocks only
    const absl::Status s = cache.Demote(blocks, coldest);
    ASSERT_TRUE(s.ok() || absl::IsResourceExhausted(s)) << s;
    if (s.ok()) coverage->demoted += static_cast<int64_t>(blocks.size());
  }
  ASSERT_TRUE(cache.EndStep().ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
  coverage->prefix_hits += cache.GetStats().prefix_hit_blocks;
  for (const SequenceId id : live) ASSERT_TRUE(cache.Release(id).ok());
  ASSERT_TRUE(cache.EndStep().ok());
  ASSERT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
}

TEST(OptionsSpaceTest, EveryOptionSetIsRefusedOrWorks) {
  std::mt19937 rng(20261205);
  Coverage coverage;
  for (int i = 0; i < 300; ++i) {
    const Options o = RandomOptions(rng);
    const Geometry& g = o.geometry;
    SCOPED_TRACE(testing::Message()
                 << "option set " << i << ": " << g.num_layers << " layers, " << g.num_kv_heads
                 << " heads of " << g.head_dim << ", blocks of " << g.block_tokens
                 << ", slabs of " << o.slab_bytes << ", " << o.palette.size() << " formats, last "
                 << FormatName(o.palette.back()));
    absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
    if (!cache.ok()) {
      ASSERT_TRUE(absl::IsInvalidArgument(cache.status())) << cache.status();
      continue;
    }
    coverage.created += 1;
    FillDemoteDrain(**cache, rng, &coverage);
    if (HasFatalFailure()) return;
  }
  // The draw reaches what it is for (seed 20261205: 182 of 300 sets created, 74 filled, 1327
  // blocks demoted, 12144 prefix hits).
  EXPECT_GT(coverage.created, 120);
  EXPECT_GT(coverage.filled, 35);
  EXPECT_GT(coverage.prefix_hits, 5000);
  EXPECT_GT(coverage.demoted, 600);
}

}  // namespace
}  // namespace kvtier
