// Benchmarks of prefix identity, lookup and eviction order (host only). A 32K-token prompt is
// 2048 blocks of 16 tokens; "per_block" counters are nanoseconds per block. Results and the
// command that produced them are recorded in docs/benchmarks.md.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "kvtier/cache.h"
#include "src/evictor.h"
#include "src/prefix_hash.h"
#include "src/prefix_index.h"

namespace kvtier {
namespace {

constexpr int kBlockTokens = 16;
constexpr int kPromptBlocks = 2048;

std::vector<int32_t> RandomPrompt() {
  std::mt19937 rng(1);
  std::vector<int32_t> t(kBlockTokens * kPromptBlocks);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 150000);  // a large vocabulary
  return t;
}

absl::Span<const int32_t> Block(const std::vector<int32_t>& prompt, int i) {
  return absl::MakeConstSpan(prompt).subspan(kBlockTokens * i, kBlockTokens);
}

void SetPerBlock(benchmark::State& state, int64_t blocks_per_iteration) {
  state.SetItemsProcessed(state.iterations() * blocks_per_iteration);
  state.counters["per_block"] = benchmark::Counter(
      static_cast<double>(blocks_per_iteration),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// (a) The baseline: each block's tokens hashed alone, no chain.
void BM_HashTokens32K(benchmark::State& state) {
  const std::vector<int32_t> prompt = RandomPrompt();
  for (auto _ : state) {
    for (int i = 0; i < kPromptBlocks; ++i) benchmark::DoNotOptimize(HashTokens(Block(prompt, i)));
  }
  SetPerBlock(state, kPromptBlocks);
}
BENCHMARK(BM_HashTokens32K);

// The hash chain alone: the identities of all blocks of the prompt.
void BM_HashChain32K(benchmark::State& state) {
  const std::vector<int32_t> prompt = RandomPrompt();
  for (auto _ : state) {
    uint64_t h = kRootParentHash;
    for (int i = 0; i < kPromptBlocks; ++i) h = HashBlock(h, Block(prompt, i), 0);
    benchmark::DoNotOptimize(h);
  }
  SetPerBlock(state, kPromptBlocks);
}
BENCHMARK(BM_HashChain32K);

// (b) Matching the prompt against an index that holds all of it: chain hash + Find per block.
// Arg: other entries in the index (2^20: a table far larger than the CPU caches).
void BM_MatchPrompt32K(benchmark::State& state) {
  const std::vector<int32_t> prompt = RandomPrompt();
  PrefixIndex index;
  const int other_blocks = static_cast<int>(state.range(0));
  index.Reserve(kPromptBlocks + other_blocks);
  uint64_t h = kRootParentHash;
  for (int i = 0; i < kPromptBlocks; ++i) {
    h = HashBlock(h, Block(prompt, i), 0);
    index.Insert(h, static_cast<uint32_t>(i));
  }
  for (int i = 0; i < other_blocks; ++i) index.Insert(HashBlock(1, Block(prompt, i % 64), i), 0);
  for (auto _ : state) {
    h = HashBlock(kRootParentHash, Block(prompt, 0), 0);
    int matched = 0;
    for (; matched < kPromptBlocks; ++matched) {
      index.Prefetch(h);
      const uint64_t next =
          matched + 1 < kPromptBlocks ? HashBlock(h, Block(prompt, matched + 1), 0) : 0;
      if (index.Find(h) == PrefixIndex::kNone) break;
      h = next;
    }
    if (matched != kPromptBlocks) state.SkipWithError("prompt not matched");
  }
  SetPerBlock(state, kPromptBlocks);
}
BENCHMARK(BM_MatchPrompt32K)->Arg(0)->Arg(1 << 20);

// (b') The same through the public API: AddSequence of a 32K prompt whose blocks are all cached
// (2047 matched: one token is left to compute), its Release untimed.
void BM_AddSequenceCached32K(benchmark::State& state) {
  const std::vector<int32_t> prompt = RandomPrompt();
  Options o;
  o.geometry = Geometry{1, 1, 16, kBlockTokens};
  o.memory_budget_bytes = size_t{64} << 20;
  auto cache = std::move(*Cache::Create(o));
  std::vector<int64_t> slots;
  const SequenceId first = *cache->AddSequence();
  if (!cache->AppendTokens(first, prompt, &slots).ok() || !cache->Release(first).ok()) {
    state.SkipWithError("could not cache the prompt");
  }
  SequenceOptions options;
  options.prompt = prompt;
  for (auto _ : state) {
    const absl::StatusOr<AddResult> added = cache->AddSequence(options);
    state.PauseTiming();
    if (!added.ok() || added->cached_tokens != (kPromptBlocks - 1) * kBlockTokens ||
        !cache->Release(added->id).ok()) {
      state.SkipWithError("prompt not matched");
    }
    state.ResumeTiming();
  }
  SetPerBlock(state, kPromptBlocks - 1);
}
BENCHMARK(BM_AddSequenceCached32K);

// An evictor holding `n` blocks at `level`, in random order unless `in_order` (random: each
// victim is a cache miss, as in a real cache; in order: the cost of the operations alone).
Evictor FilledEvictor(uint32_t n, int level, int64_t ttl, bool in_order = false) {
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  if (!in_order) std::shuffle(order.begin(), order.end(), std::mt19937(3));
  Evictor e(n);
  int64_t now = 0;
  for (const uint32_t b : order) {
    e.Add(b, level, now, ttl == 0 ? Evictor::kNever : now + ttl);
    now += 1;
  }
  return e;
}

// (c) Steady state of a full cache: evict the LRU block and cache a new one in its place.
// Arg 1: 1 when blocks are listed in index order.
void BM_EvictorAddPop(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  Evictor e = FilledEvictor(n, 0, 0, state.range(1) != 0);
  int64_t now = n;
  for (auto _ : state) {
    const uint32_t b = e.PopVictim(now);
    now += 1;
    e.Add(b, 0, now);
  }
  SetPerBlock(state, 1);
}
BENCHMARK(BM_EvictorAddPop)->ArgsProduct({{1000, 10000, 100000, 1000000}, {0, 1}});

// As (c) with every block at level 3 with a TTL of n/2: every victim is found by expiry.
void BM_EvictorAddPopExpiring(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const int64_t ttl = n / 2;
  Evictor e = FilledEvictor(n, 3, ttl);
  int64_t now = n;
  for (auto _ : state) {
    const uint32_t b = e.PopVictim(now);
    now += 1;
    e.Add(b, 3, now, now + ttl);
  }
  SetPerBlock(state, 1);
}
BENCHMARK(BM_EvictorAddPopExpiring)->RangeMultiplier(10)->Range(1000, 1000000);

}  // namespace
}  // namespace kvtier
