// Backend faults injected under a cache (tests/fault_backend.h): slab mapping, allocation
// mid-demotion, mid-append and after a fork, the data plane, fences that never pass. Each
// answers a clear Status, loses no K/V already written, and leaves CheckConsistency passing.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/backend.h"
#include "tests/fault_backend.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::ExpectSameState;
using ::kvtier::testing::Faults;
using ::kvtier::testing::FaultBackend;
using ::kvtier::testing::RandomHalves;
using ::kvtier::testing::SmallOptions;

class FaultInjectionTest : public ::testing::Test {
 protected:
  void Create(Options o) {
    faults_ = std::make_shared<Faults>();
    absl::StatusOr<std::unique_ptr<Cache>> cache =
        CreateCache(o, std::make_unique<FaultBackend>(faults_));
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  // Palette {FP16, FP8} under the "fp8" policy without sink tokens: a full block moves to FP8
  // at the EndStep after it is 16 tokens old.
  void CreateWithFp8Policy() {
    Options o = SmallOptions(4);
    o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
    Create(o);
    Policy p = *PolicyPreset("fp8");
    p.sink_tokens = 0;
    ASSERT_TRUE(cache_->SetPolicy(p).ok());
  }

  // A sequence of `tokens` tokens with random K/V in every layer.
  SequenceId Written(int64_t tokens, uint32_t seed) {
    const SequenceId seq = *cache_->AddSequence();
    std::vector<int64_t> slots;
    EXPECT_TRUE(cache_->Append(seq, tokens, &slots).ok());
    const Geometry& g = cache_->options().geometry;
    for (int l = 0; l < g.num_layers; ++l) {
      const std::vector<uint16_t> kv = RandomHalves(tokens * g.num_kv_heads * g.head_dim, seed + l);
      EXPECT_TRUE(cache_->WriteKV(l, slots, {DType::kFloat16, kv.data(), kv.data(), tokens,
                                             g.num_kv_heads, g.head_dim})
                      .ok());
    }
    return seq;
  }

  // K of every layer of `seq`, decoded.
  std::vector<float> Read(SequenceId seq) {
    const Geometry& g = cache_->options().geometry;
    const size_t n = static_cast<size_t>(*cache_->SequenceLength(seq)) * g.num_kv_heads * g.head_dim;
    std::vector<float> all, k(n), v(n);
    for (int l = 0; l < g.num_layers; ++l) {
      EXPECT_TRUE(cache_->ReadKV(seq, l, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
      all.insert(all.end(), k.begin(), k.end());
    }
    return all;
  }

  void ExpectHealthy() {
    const absl::Status s = cache_->CheckConsistency();
    EXPECT_TRUE(s.ok()) << s;
  }

  std::shared_ptr<Faults> faults_;
  std::unique_ptr<Cache> cache_;
};

TEST_F(FaultInjectionTest, SlabMapFailsInAppend) {
  Create(SmallOptions(4));
  const SequenceId seq = Written(40, 1);
  const std::vector<float> data = Read(seq);
  const CacheStats before = cache_->GetStats();
  for (int64_t maps_ok : {0, 1, 2, 3}) {  // fails at layer 0 or 1 of the first or second slab
    faults_->maps_before_failure = maps_ok;
    std::vector<int64_t> slots;
    const absl::Status s = cache_->Append(seq, 16 * 600, &slots);  // two more slabs
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("injected fault: Map"), absl::string_view::npos) << s;
    EXPECT_TRUE(slots.empty());
    ExpectSameState(before, cache_->GetStats());
    EXPECT_EQ(Read(seq), data);
    ExpectHealthy();
  }
  faults_->maps_before_failure = -1;
  std::vector<int64_t> slots;
  EXPECT_TRUE(cache_->Append(seq, 16 * 600, &slots).ok());
  ExpectHealthy();
}

TEST_F(FaultInjectionTest, AllocationFailsMidDemotion) {
  Options o = SmallOptions(4);
  o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
  Create(o);
  const SequenceId seq = Written(64, 2);
  const std::vector<float> data = Read(seq);
  const std::vector<BlockId> blocks = *cache_->SequenceBlocks(seq);
  const CacheStats before = cache_->GetStats();
  faults_->maps_before_failure = 1;  // the FP8 slab maps in layer 0, not in layer 1
  absl::Status s = cache_->Demote(blocks, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  ExpectSameState(before, cache_->GetStats());
  faults_->maps_before_failure = -1;
  faults_->fail_requantize = true;  // the slab maps; the device work fails
  s = cache_->Demote(blocks, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  for (BlockId b : blocks) EXPECT_EQ(cache_->GetBlockInfo(b)->format, 0);
  EXPECT_EQ(Read(seq), data);
  ExpectHealthy();
  faults_->fail_requantize = false;
  EXPECT_TRUE(cache_->Demote(blocks, 1).ok());
  ExpectHealthy();
}

// A demotion from two source formats is one change: when the second format's requantisation
// fails, the first's blocks have not moved either.
TEST_F(FaultInjectionTest, DemotionFromTwoFormatsFailsAsAWhole) {
  Options o = SmallOptions(4);
  o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
  o.palette.push_back(*ParseFormat("nvfp4/block_head"));
  Create(o);
  const SequenceId seq = Written(64, 6);
  const std::vector<BlockId> blocks = *cache_->SequenceBlocks(seq);
  ASSERT_TRUE(cache_->Demote({blocks[0]}, 1).ok());
  ASSERT_TRUE(cache_->Demote({blocks[2]}, 2).ok());  // both colder pools hold a slab
  const std::vector<float> data = Read(seq);
  const CacheStats before = cache_->GetStats();
  faults_->requantizes_before_failure = 1;  // FP16 -> NVFP4 succeeds, FP8 -> NVFP4 fails
  const absl::Status s = cache_->Demote({blocks[0], blocks[1]}, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(cache_->GetBlockInfo(blocks[0])->format, 1);
  EXPECT_EQ(cache_->GetBlockInfo(blocks[1])->format, 0);
  ExpectSameState(before, cache_->GetStats());
  EXPECT_EQ(Read(seq), data);
  ExpectHealthy();
  faults_->requantizes_before_failure = -1;
  EXPECT_TRUE(cache_->Demote({blocks[0], blocks[1]}, 2).ok());
  ExpectHealthy();
}

// The policy's demotions in EndStep meet the same faults: the blocks stay hot and are retried.
TEST_F(FaultInjectionTest, PolicyDemotionFailsInEndStep) {
  CreateWithFp8Policy();
  const SequenceId seq = Written(80, 3);
  const std::vector<float> data = Read(seq);
  faults_->fail_requantize = true;
  EXPECT_TRUE(cache_->EndStep().ok());  // a failed plan is counted, not an error of the step
  EXPECT_GT(cache_->GetStats().policy_demotion_failures, 0);
  EXPECT_EQ(Read(seq), data);
  ExpectHealthy();
  faults_->fail_requantize = false;
  EXPECT_TRUE(cache_->EndStep().ok());
  EXPECT_GT(cache_->GetStats().formats[1].blocks_in_use, 0);
  ExpectHealthy();
}

// Blocks left queued by a failed policy demotion are named by id: by the next step their indices
// may hold other blocks (a new sequence's, whose tail must stay hot), and a request that
// attached to them since may forbid the colder format.
TEST_F(FaultInjectionTest, BlocksLeftQueuedForDemotionAreCheckedAgain) {
  CreateWithFp8Policy();
  // Freed and reused: the four queued blocks' indices go to the next sequence's blocks.
  const SequenceId gone = Written(80, 3);
  faults_->fail_requantize = true;
  EXPECT_TRUE(cache_->EndStep().ok());
  ASSERT_GT(cache_->GetStats().policy_demotion_failures, 0);
  ASSERT_TRUE(cache_->Release(gone).ok());
  const SequenceId reused = Written(17, 4);
  faults_->fail_requantize = false;
  EXPECT_TRUE(cache_->EndStep().ok());
  const std::vector<BlockId> reused_blocks = *cache_->SequenceBlocks(reused);
  for (BlockId b : reused_blocks) {
    EXPECT_EQ(cache_->GetBlockInfo(b)->format, 0) << "block " << b.index;
  }
  ExpectHealthy();
  // Attached since by a request that keeps FP16.
  const std::vector<int32_t> ids = ::kvtier::testing::Tokens(80, 100);
  const SequenceId owner = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(owner, ids, &slots).ok());
  faults_->fail_requantize = true;
  EXPECT_TRUE(cache_->EndStep().ok());
  SequenceOptions strict;
  strict.prompt = absl::MakeConstSpan(ids).subspan(0, 65);
  strict.coldest_format = 0;
  const AddResult held = *cache_->AddSequence(strict);
  ASSERT_EQ(held.cached_tokens, 64);
  faults_->fail_requantize = false;
  EXPECT_TRUE(cache_->EndStep().ok());
  const std::vector<BlockId> held_blocks = *cache_->SequenceBlocks(held.id);
  for (BlockId b : held_blocks) {
    EXPECT_EQ(cache_->GetBlockInfo(b)->format, 0) << "block " << b.index;
  }
  ExpectHealthy();
}

TEST_F(FaultInjectionTest, TailCopyFailsAfterFork) {
  Create(SmallOptions(4));
  const SequenceId parent = Written(20, 4);
  const SequenceId child = *cache_->Fork(parent);
  const SequenceId other = Written(5, 5);
  const std::vector<float> data = Read(parent), other_data = Read(other);
  faults_->fail_copy_page = true;
  std::vector<int64_t> slots;
  // The batch fails at the copy, before any sequence (the first one included) gets a token.
  const SequenceId batch[] = {other, child};
  const int64_t counts[] = {1, 1};
  const absl::Status s = cache_->AppendBatch(batch, counts, {}, &slots);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(slots.empty());
  EXPECT_EQ(*cache_->SequenceLength(other), 5);
  EXPECT_EQ(*cache_->SequenceLength(child), 20);
  EXPECT_EQ(Read(child), data);
  EXPECT_EQ(Read(other), other_data);
  ExpectHealthy();
  faults_->fail_copy_page = false;
  EXPECT_TRUE(cache_->AppendBatch(batch, counts, {}, &slots).ok());
  EXPECT_EQ(Read(parent), data);
  ExpectHealthy();
}

TEST_F(FaultInjectionTest, DataPlaneFailures) {
  Create(SmallOptions(4));
  const SequenceId seq = Written(20, 6);
  const std::vector<float> data = Read(seq);
  faults_->fail_write_rows = true;
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(seq, 1, &slots).ok());
  std::vector<uint16_t> row(2 * 64, 0x3C00);
  const KVInput kv{DType::kFloat16, row.data(), row.data(), 1, 2, 64};
  EXPECT_EQ(cache_->WriteKV(0, slots, kv).code(), absl::StatusCode::kInternal);
  faults_->fail_write_rows = false;
  faults_->fail_read_page = true;
  std::vector<float> k(21 * 2 * 64), v(k.size());
  EXPECT_EQ(cache_->ReadKV(seq, 0, absl::MakeSpan(k), absl::MakeSpan(v)).code(),
            absl::StatusCode::kInternal);
  faults_->fail_read_page = false;
  const std::vector<float> now = Read(seq);
  EXPECT_TRUE(std::equal(data.begin(), data.begin() + 20 * 2 * 64, now.begin()));
  ExpectHealthy();
}

// An asynchronous backend whose fences never pass: freed pages stay pending (never reused
// under device work), eviction gives up with DeadlineExceeded instead of spinning, and
// everything resumes once the fence passes.
TEST_F(FaultInjectionTest, FenceThatNeverPasses) {
  Create(SmallOptions(1));  // 256 blocks
  faults_->asynchronous = true;
  faults_->fences_pass = false;
  const std::vector<int32_t> prompt(16 * 200, 3);
  const SequenceId cached = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(cached, prompt, &slots).ok());
  const SequenceId released = *cache_->AddSequence();
  ASSERT_TRUE(cache_->Append(released, 16 * 40, &slots).ok());
  ASSERT_TRUE(cache_->Release(cached).ok());    // 200 cached blocks
  ASSERT_TRUE(cache_->Release(released).ok());  // 40 pages pending behind a fence
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_EQ(cache_->GetStats().pages_pending_reclaim, 40);
  // A write into a page awaiting its fence names the case.
  std::vector<uint16_t> row(2 * 64, 0x3C00);
  const KVInput kv{DType::kFloat16, row.data(), row.data(), 1, 2, 64};
  const absl::Status w = cache_->WriteKV(0, absl::MakeConstSpan(&slots[16 * 200], 1), kv);
  EXPECT_NE(w.message().find("whose block was released"), absl::string_view::npos) << w;
  const absl::Status c = cache_->WriteKV(0, absl::MakeConstSpan(slots.data(), 1), kv);
  EXPECT_NE(c.message().find("in a cached block"), absl::string_view::npos) << c;
  // 40 pending + 16 free cannot hold 100 blocks without eviction; eviction waits for a fence.
  const SequenceId next = *cache_->AddSequence();
  std::vector<int64_t> more;
  const absl::Status s = cache_->Append(next, 16 * 100, &more);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(more.empty());
  ExpectHealthy();
  faults_->fences_pass = true;
  EXPECT_TRUE(cache_->Append(next, 16 * 100, &more).ok());
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_EQ(cache_->GetStats().pages_pending_reclaim, 0);
  ExpectHealthy();
}

// A device fault behind a fence (the CUDA backend's event query fails): the fence reports the
// device's error, at once, to Cache::FencePassed, to the eviction that waits for pending pages
// and to EndStep, instead of not passing until a deadline (or forever); nothing is freed under
// the failed work.
TEST_F(FaultInjectionTest, FenceQueryErrorIsReportedNotWaitedFor) {
  Create(SmallOptions(1));  // 256 blocks
  faults_->asynchronous = true;
  faults_->fences_pass = false;
  const SequenceId released = *cache_->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(released, 16 * 240, &slots).ok());
  ASSERT_TRUE(cache_->Release(released).ok());  // 240 pages pending behind a fence
  ASSERT_TRUE(cache_->EndStep().ok());
  const uint64_t fence = *cache_->RecordFence();
  faults_->fail_fence_query = true;
  const absl::StatusOr<bool> passed = cache_->FencePassed(fence);
  EXPECT_EQ(passed.status().code(), absl::StatusCode::kInternal) << passed.status();
  const SequenceId next = *cache_->AddSequence();
  std::vector<int64_t> more;
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = cache_->Append(next, 16 * 100, &more);  // must wait for the pages
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(cache_->EndStep().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cache_->GetStats().pages_pending_reclaim, 240);
  ExpectHealthy();
  faults_->fail_fence_query = false;
  faults_->fences_pass = true;
  EXPECT_TRUE(*cache_->FencePassed(fence));
  EXPECT_TRUE(cache_->Append(next, 16 * 100, &more).ok());
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_EQ(cache_->GetStats().pages_pending_reclaim, 0);
  ExpectHealthy();
}

TEST_F(FaultInjectionTest, FenceRecordingAndUnmapFail) {
  Create(SmallOptions(4));
  faults_->asynchronous = true;
  const SequenceId seq = Written(16 * 300, 7);  // two slabs
  const std::vector<float> data = Read(seq);
  faults_->fail_record_fence = true;
  EXPECT_EQ(cache_->EndStep().code(), absl::StatusCode::kInternal);
  faults_->fail_record_fence = false;
  ASSERT_TRUE(cache_->Release(seq).ok());
  faults_->fail_unmap = true;
  const absl::Status unmap = cache_->EndStep();  // one of the two slabs goes back (one stays)
  EXPECT_EQ(unmap.code(), absl::StatusCode::kInternal);
  EXPECT_NE(unmap.message().find("withheld from the budget"), std::string::npos) << unmap;
  EXPECT_EQ(cache_->GetStats().slabs_lost, 1);  // still mapped: it is never mapped again
  ExpectHealthy();
  faults_->fail_unmap = false;
  const SequenceId again = Written(16 * 300, 7);
  EXPECT_EQ(Read(again), data);  // the other slabs serve
  ExpectHealthy();
}

TEST_F(FaultInjectionTest, SlabWhoseFailedMapCannotBeUndoneIsWithheld) {
  Create(SmallOptions(4));
  faults_->maps_before_failure = 1;    // a slab's layer 0 maps, its layer 1 fails,
  faults_->unmaps_before_failure = 0;  // and layer 0 cannot be unmapped again
  const SequenceId seq = *cache_->AddSequence();
  std::vector<int64_t> slots;
  EXPECT_FALSE(cache_->Append(seq, 16, &slots).ok());
  EXPECT_EQ(cache_->GetStats().slabs_lost, 1);
  EXPECT_EQ(cache_->GetStats().slabs_free, 3);
  ExpectHealthy();
  faults_->maps_before_failure = -1;
  faults_->unmaps_before_failure = -1;
  const SequenceId other = Written(16 * 300, 3);  // two of the three slabs left
  EXPECT_EQ(*cache_->SequenceLength(other), 16 * 300);
  ExpectHealthy();
}

}  // namespace
}  // namespace kvtier
