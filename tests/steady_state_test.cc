// A decode step's host path allocates nothing in steady state (PERFORMANCE.md), but for a
// sequence's block list and the prefix index growing: a step whose tokens all land in the
// sequences' tail blocks and fill none allocates nothing at all, and the steps that start or fill
// blocks at most one block-list growth per sequence and the index's doublings. In the binary of
// tests/allocation_counter.h.
#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/allocation_counter.h"

namespace kvtier {
namespace {

// With token ids (`with_ids`), blocks that fill are indexed for prefix sharing as well.
void ExpectDecodeStepsAllocateOnlyToGrow(bool with_ids) {
  constexpr int kSequences = 64;
  constexpr int64_t kPrompt = 100;
  Options o;
  o.geometry = Geometry{2, 2, 64, 16};
  o.memory_budget_bytes = size_t{64} << 20;  // 4096 blocks; the walk needs under 2000
  std::unique_ptr<Cache> cache = std::move(*Cache::Create(o));
  std::vector<SequenceId> batch;
  std::vector<int64_t> slots;
  std::vector<int32_t> ids(kPrompt);
  for (int i = 0; i < kSequences; ++i) {
    batch.push_back(*cache->AddSequence());
    for (int32_t& t : ids) t = i * 1000 + static_cast<int32_t>(&t - ids.data());
    ASSERT_TRUE(cache->AppendTokens(batch.back(), ids, &slots).ok());
  }
  const std::vector<int64_t> ones(kSequences, 1);
  slots.reserve(kSequences);
  ids.assign(with_ids ? kSequences : 0, 0);
  int32_t next_id = 1 << 20;
  auto step = [&] {
    slots.clear();
    for (int32_t& t : ids) t = next_id++;
    ASSERT_TRUE(cache->AppendBatch(batch, ones, ids, &slots).ok());
    ASSERT_TRUE(cache->EndStep().ok());
  };
  for (int s = 0; s < 64; ++s) step();  // warm: slabs mapped, per-step buffers at their size
  int64_t growth = 0;
  int tail_steps = 0;
  for (int s = 0; s < 256; ++s) {
    const int64_t length = kPrompt + 64 + s;  // every sequence's, before the step
    const int64_t before = testing::AllocationCount();
    step();
    if (::testing::Test::HasFatalFailure()) return;
    const int64_t allocations = testing::AllocationCount() - before;
    // A step starts new blocks, and with ids the step before indexes the blocks it fills.
    const int64_t block = o.geometry.block_tokens;
    if (length % block != 0 && !(with_ids && (length + 1) % block == 0)) {
      EXPECT_EQ(allocations, 0) << "step " << s << ": every token fits its sequence's tail";
      tail_steps += 1;
    } else {
      growth += allocations;
    }
  }
  EXPECT_EQ(tail_steps, with_ids ? 224 : 240);
  // 16 new blocks a sequence over the walk (11 -> 27): its block list grows once (16 -> 32);
  // with ids the prefix index also doubles now and then.
  EXPECT_GE(growth, kSequences);  // the counter sees them
  EXPECT_LE(growth, kSequences + (with_ids ? 4 : 0));
  EXPECT_TRUE(cache->CheckConsistency().ok());
}

TEST(SteadyStateTest, DecodeStepsAllocateOnlyToGrowBlockLists) {
  ExpectDecodeStepsAllocateOnlyToGrow(/*with_ids=*/false);
}

TEST(SteadyStateTest, DecodeStepsWithTokenIdsAllocateOnlyToGrow) {
  ExpectDecodeStepsAllocateOnlyToGrow(/*with_ids=*/true);
}

}  // namespace
}  // namespace kvtier
