// The block events of the cache core (src/block_events.h) on the CPU backend, through a
// capturing sink: stored on publish, removed on eviction, offload and onload between the tiers,
// precision changes, AllBlocksCleared on destruction, nothing for private blocks; and a random
// walk whose event stream, replayed, rebuilds exactly the blocks per tier the cache reports.
#include <map>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/backend.h"
#include "src/block_events.h"
#include "src/prefix_hash.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Tokens;

enum class Kind { kStored, kRemoved, kFormat, kCleared, kEndStep };

struct Event {
  Kind kind;
  Medium medium = Medium::kDevice;
  uint64_t hash = 0;
  uint64_t parent = 0;
  std::vector<int32_t> tokens;
  int format = 0;
};

// Records every event into a log that outlives the cache.
class CapturingSink : public BlockEventSink {
 public:
  explicit CapturingSink(std::shared_ptr<std::vector<Event>> log) : log_(std::move(log)) {}
  void Stored(Medium m, uint64_t hash, uint64_t parent, uint64_t /*extra_key*/,
              absl::Span<const int32_t> t) override {
    log_->push_back({Kind::kStored, m, hash, parent, {t.begin(), t.end()}, 0});
  }
  void Removed(Medium m, uint64_t hash) override {
    log_->push_back({Kind::kRemoved, m, hash, 0, {}, 0});
  }
  void FormatChanged(Medium m, uint64_t hash, int format) override {
    log_->push_back({Kind::kFormat, m, hash, 0, {}, format});
  }
  void AllBlocksCleared() override { log_->push_back({Kind::kCleared, Medium::kDevice, 0, 0, {}, 0}); }
  void EndStep() override { log_->push_back({Kind::kEndStep, Medium::kDevice, 0, 0, {}, 0}); }

 private:
  std::shared_ptr<std::vector<Event>> log_;
};

// The blocks per tier (hash -> palette format) that a subscriber rebuilds from the events,
// failing on an event that contradicts what it holds.
using TierView = std::map<Medium, std::map<uint64_t, int>>;

void Apply(const Event& e, TierView* view) {
  std::map<uint64_t, int>& tier = (*view)[e.medium];
  switch (e.kind) {
    case Kind::kStored:
      ASSERT_EQ(tier.count(e.hash), 0u) << "stored twice in " << MediumName(e.medium);
      // A router drops a block whose parent it does not hold (Dynamo: ParentBlockNotFound).
      ASSERT_TRUE(e.parent == kRootParentHash || (*view)[Medium::kDevice].count(e.parent) != 0 ||
                  (*view)[Medium::kHost].count(e.parent) != 0)
          << "stored with a parent held in no tier";
      tier[e.hash] = 0;
      break;
    case Kind::kRemoved:
      ASSERT_EQ(tier.erase(e.hash), 1u) << "removed but not held in " << MediumName(e.medium);
      break;
    case Kind::kFormat:
      ASSERT_EQ(tier.count(e.hash), 1u) << "format of a block not held";
      tier[e.hash] = e.format;
      break;
    case Kind::kCleared:
      view->clear();
      return;
    case Kind::kEndStep:
      break;
  }
  if (tier.empty()) view->erase(e.medium);  // as ViewOf: only tiers that hold blocks
}

// The cache's own view, in the same terms.
TierView ViewOf(const Cache& cache) {
  TierView view;
  for (const IndexedBlock& b : cache.IndexedBlocks()) {
    const Medium m = b.state == BlockState::kOffloaded ? Medium::kHost : Medium::kDevice;
    view[m][b.hash] = b.format;
  }
  return view;
}

// 2 layers of 2 heads x 64 dims, 16-token blocks: 8 KiB FP16 pages, 256 to a 2 MiB slab; one
// slab per layer in each tier; FP16 then FP8.
Options EventOptions(bool host_tier) {
  Options o = testing::PaletteOptions(Geometry{2, 2, 64, 16}, {"fp16", "fp8_e4m3/block_head"}, 8);
  o.memory_budget_bytes = size_t{4} * o.slab_bytes;
  if (host_tier) o.host_tier_bytes = size_t{2} * o.slab_bytes;
  return o;
}

class BlockEventsTest : public ::testing::Test {
 protected:
  void Create(const Options& o) {
    log_ = std::make_shared<std::vector<Event>>();
    absl::StatusOr<std::unique_ptr<Cache>> cache =
        CreateCache(o, MakeCpuBackend(), std::make_unique<CapturingSink>(log_));
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  SequenceId Compute(const std::vector<int32_t>& tokens) {
    const SequenceId id = cache_->AddSequence().value();
    std::vector<int64_t> slots;
    EXPECT_TRUE(cache_->AppendTokens(id, tokens, &slots).ok());
    return id;
  }

  std::vector<Event> Take(Kind kind) {
    std::vector<Event> out;
    for (const Event& e : *log_) {
      if (e.kind == kind) out.push_back(e);
    }
    return out;
  }

  std::shared_ptr<std::vector<Event>> log_;
  std::unique_ptr<Cache> cache_;
};

TEST_F(BlockEventsTest, PublishingFullBlocksStoresThemOnTheDeviceWithTokensAndParents) {
  Create(EventOptions(false));
  const std::vector<int32_t> tokens = Tokens(3 * 16 + 5, 100);
  Compute(tokens);
  const std::vector<Event> stored = Take(Kind::kStored);
  ASSERT_EQ(stored.size(), 3u);
  uint64_t parent = kRootParentHash;
  for (size_t i = 0; i < stored.size(); ++i) {
    const std::vector<int32_t> block(tokens.begin() + 16 * i, tokens.begin() + 16 * (i + 1));
    EXPECT_EQ(stored[i].medium, Medium::kDevice);
    EXPECT_EQ(stored[i].tokens, block);
    EXPECT_EQ(stored[i].parent, parent);
    EXPECT_EQ(stored[i].hash, HashBlock(parent, block, 0));
    parent = stored[i].hash;
  }
  EXPECT_EQ(log_->size(), 3u);  // no step ended yet
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_EQ(log_->back().kind, Kind::kEndStep);
}

TEST_F(BlockEventsTest, BlocksWithoutTokenIdsOrAlreadyIndexedAreNotStored) {
  Create(EventOptions(false));
  const SequenceId a = cache_->AddSequence().value();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(a, 40, &slots).ok());  // no ids: private blocks
  Compute(Tokens(32, 7));
  Compute(Tokens(32, 7));  // equal content computed again stays private
  EXPECT_EQ(Take(Kind::kStored).size(), 2u);
  ASSERT_TRUE(cache_->Release(a).ok());
  EXPECT_TRUE(Take(Kind::kRemoved).empty());
}

TEST_F(BlockEventsTest, EvictionWithoutAHostTierRemovesFromTheDevice) {
  Create(EventOptions(false));  // 512 device blocks
  ASSERT_TRUE(cache_->Release(Compute(Tokens(16 * 400, 0))).ok());
  Compute(Tokens(16 * 400, 1000000));  // evicts most of the first 400
  const std::vector<Event> removed = Take(Kind::kRemoved);
  EXPECT_GT(removed.size(), 200u);
  EXPECT_EQ(removed.size(), static_cast<size_t>(cache_->GetStats().evicted_blocks));
  for (const Event& e : removed) EXPECT_EQ(e.medium, Medium::kDevice);
  TierView view;
  for (const Event& e : *log_) Apply(e, &view);
  EXPECT_EQ(view, ViewOf(*cache_));
}

// A sequence whose own copy of a block is private (another sequence indexed it first), and
// that block's indexed twin is evicted: the sequence's next block is not stored under a parent
// the routers were told is gone (it stays private, as matching could not reach it either).
TEST_F(BlockEventsTest, ABlockWhoseParentIsGoneIsNotStored) {
  Create(EventOptions(false));  // 512 device blocks
  const std::vector<int32_t> t = Tokens(32, 5);
  const std::vector<int32_t> first(t.begin(), t.begin() + 16), second(t.begin() + 16, t.end());
  const SequenceId a = Compute(first);
  const SequenceId b = Compute(first);  // a private copy
  ASSERT_TRUE(cache_->Release(a).ok());
  for (int i = 1; i < 8 && cache_->GetStats().evicted_blocks == 0; ++i) {
    ASSERT_TRUE(cache_->Release(Compute(Tokens(16 * 400, 1000000 * i))).ok());
  }
  ASSERT_GT(cache_->GetStats().evicted_blocks, 0);
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(b, second, &slots).ok());
  TierView view;
  for (const Event& e : *log_) Apply(e, &view);
  EXPECT_EQ(view, ViewOf(*cache_));
  EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
}

TEST_F(BlockEventsTest, OffloadAndOnloadMoveBlocksBetweenTheTiers) {
  Options o = EventOptions(true);  // 512 device blocks, a host tier of one slab per layer
  o.host_tier_format = 1;          // demoted on the way down
  Create(o);
  const std::vector<int32_t> first = Tokens(16 * 400 + 1, 0);
  ASSERT_TRUE(cache_->Release(Compute(first)).ok());
  ASSERT_TRUE(cache_->Release(Compute(Tokens(16 * 400, 1000000))).ok());
  const size_t offloaded = static_cast<size_t>(cache_->GetStats().host.offloaded_blocks);
  ASSERT_GT(offloaded, 0u);
  std::vector<Event> host_stores;
  for (const Event& e : Take(Kind::kStored)) {
    if (e.medium == Medium::kHost) host_stores.push_back(e);
  }
  ASSERT_EQ(host_stores.size(), offloaded);
  EXPECT_EQ(host_stores[0].tokens.size(), 16u);  // tokens kept for the move
  size_t host_formats = 0;
  for (const Event& e : Take(Kind::kFormat)) host_formats += e.medium == Medium::kHost ? 1 : 0;
  EXPECT_EQ(host_formats, offloaded);  // FP8 in the host tier

  log_->clear();
  SequenceOptions again;
  again.prompt = first;
  const AddResult hit = cache_->AddSequence(again).value();
  ASSERT_GT(hit.host_tokens, 0);
  std::vector<Event> stored;  // making device room offloads other blocks meanwhile
  for (const Event& e : Take(Kind::kStored)) {
    if (e.medium == Medium::kDevice) stored.push_back(e);
  }
  ASSERT_EQ(stored.size(), static_cast<size_t>(hit.host_tokens / 16));
  uint64_t parent = stored[0].parent;
  for (const Event& e : stored) {  // chain order: each block's parent before it
    EXPECT_EQ(e.parent, parent);
    parent = e.hash;
  }
}

TEST_F(BlockEventsTest, DemotionChangesTheFormatOfIndexedBlocksOnly) {
  Create(EventOptions(false));
  const SequenceId id = Compute(Tokens(16 * 2 + 3, 5));
  const SequenceId anon = cache_->AddSequence().value();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(anon, 32, &slots).ok());
  std::vector<BlockId> blocks = cache_->SequenceBlocks(id).value();
  blocks.pop_back();  // the partial tail
  ASSERT_TRUE(cache_->Demote(blocks, 1).ok());
  ASSERT_TRUE(cache_->Demote(cache_->SequenceBlocks(anon).value(), 1).ok());
  const std::vector<Event> changed = Take(Kind::kFormat);
  ASSERT_EQ(changed.size(), 2u);
  for (const Event& e : changed) {
    EXPECT_EQ(e.medium, Medium::kDevice);
    EXPECT_EQ(e.format, 1);
  }
  TierView view;
  for (const Event& e : *log_) Apply(e, &view);
  EXPECT_EQ(view, ViewOf(*cache_));
}

TEST_F(BlockEventsTest, AbandonRemovesTheBlocksIndexedThisStepOnly) {
  Create(EventOptions(false));
  const std::vector<int32_t> prompt = Tokens(4 * 16 + 3, 300);
  const SequenceId first = Compute(std::vector<int32_t>(prompt.begin(), prompt.begin() + 32));
  ASSERT_TRUE(cache_->EndStep().ok());  // its two blocks are from an earlier step
  std::vector<int64_t> slots;
  ASSERT_TRUE(
      cache_->AppendTokens(first, absl::MakeConstSpan(prompt).subspan(32), &slots).ok());
  const std::vector<Event> stored = Take(Kind::kStored);
  ASSERT_EQ(stored.size(), 4u);
  ASSERT_TRUE(cache_->Abandon(first).ok());
  const std::vector<Event> removed = Take(Kind::kRemoved);
  ASSERT_EQ(removed.size(), 2u);  // the last two, the last first
  EXPECT_EQ(removed[0].hash, stored[3].hash);
  EXPECT_EQ(removed[1].hash, stored[2].hash);
  TierView view;
  for (const Event& e : *log_) Apply(e, &view);
  EXPECT_EQ(view, ViewOf(*cache_));
}

TEST_F(BlockEventsTest, DestroyingTheCacheClearsAllBlocks) {
  Create(EventOptions(true));
  Compute(Tokens(64, 0));
  cache_.reset();
  ASSERT_GE(log_->size(), 2u);
  EXPECT_EQ((*log_)[log_->size() - 2].kind, Kind::kCleared);
  EXPECT_EQ(log_->back().kind, Kind::kEndStep);
}

// A random walk over both tiers: shared prompts, appends, forks, releases, demotion and steps,
// with the subscriber's view checked against the cache's own after every step.
TEST_F(BlockEventsTest, ReplayingTheStreamRebuildsEveryTierOfARandomWalk) {
  Options o = EventOptions(true);
  o.host_tier_format = 1;
  Create(o);
  std::mt19937 rng(20261201);
  std::vector<SequenceId> live;
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto pick = [&] { return static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1)); };
  std::vector<std::vector<int32_t>> prompts;
  // Many prompts, so that some go cold enough to be offloaded and are matched again later.
  for (int p = 0; p < 64; ++p) prompts.push_back(Tokens(uniform(0, 160), p * 100000));
  TierView view;
  size_t applied = 0;
  std::vector<int64_t> slots;
  for (int i = 0; i < 20000 && !HasFatalFailure(); ++i) {
    const int op = uniform(0, 99);
    if (live.empty() || op < 15) {
      std::vector<int32_t> prompt = prompts[uniform(0, 63)];
      for (int t = uniform(0, 40); t > 0; --t) prompt.push_back(uniform(0, 50000));
      SequenceOptions so;
      so.prompt = prompt;
      const AddResult added = cache_->AddSequence(so).value();
      live.push_back(added.id);
      const std::vector<int32_t> rest(prompt.begin() + added.cached_tokens, prompt.end());
      slots.clear();
      if (!rest.empty()) (void)cache_->AppendTokens(added.id, rest, &slots);
    } else if (op < 55) {
      std::vector<int32_t> fresh(uniform(1, 40));
      for (int32_t& t : fresh) t = uniform(0, 50000);
      slots.clear();
      (void)cache_->AppendTokens(live[pick()], fresh, &slots);
    } else if (op < 62) {
      live.push_back(cache_->Fork(live[pick()]).value());
    } else if (op < 78) {
      const size_t k = pick();
      ASSERT_TRUE((op < 74 ? cache_->Release(live[k]) : cache_->Abandon(live[k])).ok());
      live.erase(live.begin() + k);
    } else if (op < 88) {
      std::vector<BlockId> hot;
      const std::vector<BlockId> blocks = cache_->SequenceBlocks(live[pick()]).value();
      for (BlockId b : blocks) {
        const BlockInfo info = cache_->GetBlockInfo(b).value();
        if (info.format == 0 && info.num_tokens == 16) hot.push_back(b);
      }
      if (!hot.empty()) (void)cache_->Demote(hot, 1);
    } else {
      ASSERT_TRUE(cache_->EndStep().ok());
      for (; applied < log_->size(); ++applied) Apply((*log_)[applied], &view);
      ASSERT_EQ(view, ViewOf(*cache_)) << "after operation " << i;
      ASSERT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
    }
  }
  for (; applied < log_->size(); ++applied) Apply((*log_)[applied], &view);
  EXPECT_EQ(view, ViewOf(*cache_));
  const CacheStats s = cache_->GetStats();
  EXPECT_GT(s.host.offloaded_blocks, 0);
  EXPECT_GT(s.host.onloaded_blocks, 0);
  EXPECT_GT(s.host.evicted_blocks, 0);
}

}  // namespace
}  // namespace kvtier
