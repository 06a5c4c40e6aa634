// Host-side benchmarks of the cache's bookkeeping (no device, no data movement). Results and
// the command that produced them are recorded in docs/benchmarks.md.
#include <cstdlib>
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "kvtier/cache.h"
#include "src/block_table.h"
#include "src/page_pool.h"

namespace kvtier {
namespace {

// The reference: one malloc/free pair of 64 bytes.
void BM_MallocFree64(benchmark::State& state) {
  for (auto _ : state) {
    void* p = std::malloc(64);
    benchmark::DoNotOptimize(p);
    std::free(p);
  }
}
BENCHMARK(BM_MallocFree64);

// Allocate + free of one block: its metadata slot and a page of a mapped slab. Arg: the page's
// bytes (8 KB: 256 pages a 2 MiB slab; 18688: an NVFP4 page, 112 a slab; 64 KB: an FP16 page of
// the Llama-shaped geometry, 32 a slab).
void BM_BlockAllocFree(benchmark::State& state) {
  BlockTable blocks(4096);
  PagePool pool(static_cast<uint32_t>(state.range(0)), size_t{2} << 20, 16);
  pool.AddSlot(pool.UnmappedSlot());
  const uint32_t keep = pool.Allocate(0);  // a partially used slab, as in steady state
  for (auto _ : state) {
    const uint32_t b = blocks.Allocate(0, 0);
    blocks[b].page = pool.Allocate(b);
    benchmark::DoNotOptimize(blocks[b].page);
    pool.Free(blocks[b].page);
    blocks.Free(b);
  }
  pool.Free(keep);
}
BENCHMARK(BM_BlockAllocFree)->Arg(8192)->Arg(18688)->Arg(65536);

// The same through the public API: a sequence of one full block, added and released.
void BM_SequenceOfOneBlock(benchmark::State& state) {
  Options o;
  o.geometry = Geometry{1, 1, 16, 16};
  o.memory_budget_bytes = size_t{64} << 20;
  auto cache = std::move(*Cache::Create(o));
  std::vector<int64_t> slots;
  slots.reserve(16);
  for (auto _ : state) {
    const SequenceId s = *cache->AddSequence();
    slots.clear();
    benchmark::DoNotOptimize(cache->Append(s, 16, &slots));
    benchmark::DoNotOptimize(cache->Release(s));
  }
}
BENCHMARK(BM_SequenceOfOneBlock);

// One scheduler step: append one token to each of 1024 sequences.
void BM_AppendStep1024(benchmark::State& state) {
  constexpr int kSequences = 1024;
  constexpr int kStepsPerRound = 512;
  Options o;
  o.geometry = Geometry{32, 8, 128, 16};  // Llama-3-8B shaped; only metadata is touched
  o.memory_budget_bytes = size_t{1} << 38;  // address space only: no page is written
  auto cache = std::move(*Cache::Create(o));
  std::vector<SequenceId> seqs;
  std::vector<int64_t> slots;
  slots.reserve(kSequences);
  auto reset = [&] {
    for (SequenceId s : seqs) (void)cache->Release(s);
    seqs.clear();
    for (int i = 0; i < kSequences; ++i) seqs.push_back(*cache->AddSequence());
  };
  // Steady state: the pool already holds the slabs a round needs (mapping a slab is a rare,
  // batched event that EndStep reverses only for slabs left empty).
  const std::vector<int64_t> ones(kSequences, 1);
  reset();
  for (int i = 0; i < kStepsPerRound; ++i) {
    for (SequenceId s : seqs) (void)cache->Append(s, 1, &slots);
  }
  reset();
  int step = 0;
  for (auto _ : state) {
    slots.clear();
    benchmark::DoNotOptimize(cache->AppendBatch(seqs, ones, {}, &slots));
    if (++step % kStepsPerRound == 0) {
      state.PauseTiming();
      reset();
      state.ResumeTiming();
    }
  }
  state.SetItemsProcessed(state.iterations() * kSequences);
}
BENCHMARK(BM_AppendStep1024)->Unit(benchmark::kMicrosecond);

// The page tables of one decode step: 256 sequences of 32K tokens (2048 blocks each; one layer,
// one small head, so that only the tables' size matters), grown together a block at a time as
// in decoding, so that a sequence's blocks lie apart in the block table.
void BM_BuildPageTables256x32K(benchmark::State& state) {
  constexpr int kSequences = 256;
  constexpr int64_t kTokens = 32768;
  Options o;
  o.geometry = Geometry{1, 1, 16, 16};
  o.memory_budget_bytes = size_t{1} << 30;
  auto cache = std::move(*Cache::Create(o));
  std::vector<SequenceId> seqs;
  for (int i = 0; i < kSequences; ++i) seqs.push_back(*cache->AddSequence());
  const std::vector<int64_t> block(kSequences, 16);
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < kTokens; t += 16) {
    slots.clear();
    if (!cache->AppendBatch(seqs, block, {}, &slots).ok()) {
      state.SkipWithError("append failed");
      return;
    }
  }
  PageTables tables;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cache->BuildPageTables(seqs, &tables));
  }
  state.SetItemsProcessed(state.iterations() * kSequences * (kTokens / 16));
}
BENCHMARK(BM_BuildPageTables256x32K)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvtier

BENCHMARK_MAIN();
