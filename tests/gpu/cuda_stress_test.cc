// Many steps of append, fork, demotion, page tables and release on a CPU cache and a CUDA cache
// side by side. Every sequence is read back and compared after every step.
//
// Lockstep test: a tiny budget, so that pages and slabs are recycled constantly. Each step
// allocates before it frees (appends, then one Demote, then releases), and at its end the
// device is synchronized and EndStep called twice, so that the CUDA cache has reclaimed
// everything the CPU cache reclaimed at once: both then make the same allocations and their
// pages can be compared byte for byte.
//
// Asynchronous test: no synchronization at step ends, one EndStep per step, so freed pages
// wait for their fences while the device may still be working; data is compared through ReadKV
// (page placement may differ between the caches).
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

Options StressOptions(int slabs_per_layer) {
  Options o;
  o.geometry = Geometry{2, 8, 128, 16};  // FP16 pages of 64 KiB: 32 per 2 MiB slab
  o.palette = {ParseFormat("fp16").value(), ParseFormat("fp8_e4m3/block_head").value(),
               ParseFormat("k:nvfp4_channel/block_head,v:nvfp4/block_head").value()};
  o.memory_budget_bytes = size_t{2} * slabs_per_layer * o.slab_bytes;
  return o;
}

// Full blocks of `seqs` older than `keep` blocks from the tail, in formats below `target`.
std::vector<BlockId> Candidates(Cache& cache, const std::vector<SequenceId>& seqs, int target,
                                int keep, std::mt19937* rng) {
  std::vector<BlockId> out;
  for (SequenceId s : seqs) {
    const std::vector<BlockId> blocks = cache.SequenceBlocks(s).value();
    for (size_t i = 0; i + keep < blocks.size(); ++i) {
      const BlockInfo info = cache.GetBlockInfo(blocks[i]).value();
      if (info.num_tokens == cache.options().geometry.block_tokens && info.format < target &&
          std::find(out.begin(), out.end(), blocks[i]) == out.end() && (*rng)() % 4 != 0) {
        out.push_back(blocks[i]);
      }
    }
  }
  return out;
}

std::string ComparePageTables(const PageTables& a, const PageTables& b) {
  if (a.seq_lens != b.seq_lens) return "seq_lens differ";
  if (a.packed_indptr != b.packed_indptr) return "packed_indptr differs";
  for (size_t i = 0; i < a.packed.size(); ++i) {
    if (PackedFormat(a.packed[i]) != PackedFormat(b.packed[i])) return "packed formats differ";
  }
  if (a.per_format.size() != b.per_format.size()) return "format count differs";
  for (size_t f = 0; f < a.per_format.size(); ++f) {
    if (a.per_format[f].indptr != b.per_format[f].indptr) return absl::StrCat("indptr ", f);
    if (a.per_format[f].last_page_len != b.per_format[f].last_page_len) {
      return absl::StrCat("last_page_len ", f);
    }
  }
  return "";
}

TEST(CudaStressTest, TinyBudgetRecyclingMatchesTheCpuCacheEveryStep) {
  KVTIER_REQUIRE_GPU();
  // 3 slabs per layer for 3 formats: a pool grows only by taking another's empty slab.
  absl::StatusOr<std::unique_ptr<CachePair>> made = CachePair::Create(StressOptions(3));
  ASSERT_TRUE(made.ok()) << made.status();
  CachePair& pair = **made;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  std::vector<SequenceId> live;
  std::vector<SequenceId> fresh;
  int exhausted = 0, demoted = 0, forks = 0;
  const int steps = TestScale(60);
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    // Forks share blocks; the next append to either copies the shared tail (CopyPage).
    if (!live.empty() && rng() % 4 == 0) {
      const SequenceId parent = live[rng() % live.size()];
      const SequenceId a = pair.cpu().Fork(parent).value();
      const SequenceId b = pair.gpu().Fork(parent).value();
      ASSERT_EQ(a, b);
      live.push_back(a);
      forks += 1;
    }
    for (int i = static_cast<int>(rng() % 4); i > 0; --i) {
      live.push_back(pair.AddSequence());
      fresh.push_back(live.back());
    }
    std::vector<int64_t> tokens;
    for (SequenceId s : live) {
      const bool is_new = std::find(fresh.begin(), fresh.end(), s) != fresh.end();
      tokens.push_back(is_new ? 1 + rng() % 120 : 1 + rng() % 8);
    }
    fresh.clear();
    const absl::Status appended = pair.AppendBatch(live, tokens);
    if (appended.ok()) {
      pair.WriteAllLayers(&rng, /*specials=*/step % 7 == 3);
      if (::testing::Test::HasFatalFailure()) return;
    } else {
      ASSERT_EQ(appended.code(), absl::StatusCode::kResourceExhausted) << appended;
      exhausted += 1;
    }
    const int target = 1 + static_cast<int>(rng() % 2);
    const std::vector<BlockId> blocks = Candidates(pair.cpu(), live, target, 1 + rng() % 3, &rng);
    const absl::Status demote = pair.Demote(blocks, target);
    if (demote.ok()) {
      demoted += static_cast<int>(blocks.size());
    } else {
      ASSERT_EQ(demote.code(), absl::StatusCode::kResourceExhausted) << demote;
    }
    PageTables ta, tb;
    ASSERT_TRUE(pair.cpu().BuildPageTables(live, &ta).ok());
    ASSERT_TRUE(pair.gpu().BuildPageTables(live, &tb).ok());
    ASSERT_EQ(ComparePageTables(ta, tb), "");
    for (SequenceId s : live) {
      const std::string diff = pair.CompareSequence(s, /*pages=*/true);
      ASSERT_EQ(diff, "") << "sequence " << s.index;
    }
    // Releases: random ones, long ones, and a third of them when memory ran out.
    std::vector<SequenceId> keep;
    for (size_t i = 0; i < live.size(); ++i) {
      const bool old = !appended.ok() && i < live.size() / 3 + 1;
      if (old || rng() % 10 == 0 || pair.cpu().SequenceLength(live[i]).value() > 400) {
        pair.Release(live[i]);
      } else {
        keep.push_back(live[i]);
      }
    }
    live.swap(keep);
    // Step end: let the CUDA cache reclaim all that the CPU cache has.
    KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_TRUE(pair.cpu().EndStep().ok());
    ASSERT_TRUE(pair.gpu().EndStep().ok());
    KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_TRUE(pair.cpu().EndStep().ok());
    ASSERT_TRUE(pair.gpu().EndStep().ok());
    const absl::Status ca = pair.cpu().CheckConsistency();
    const absl::Status cb = pair.gpu().CheckConsistency();
    ASSERT_TRUE(ca.ok()) << ca;
    ASSERT_TRUE(cb.ok()) << cb;
    const CacheStats a = pair.cpu().GetStats();
    const CacheStats b = pair.gpu().GetStats();
    EXPECT_EQ(b.pages_pending_reclaim, 0);
    EXPECT_EQ(a.nonfinite_values, b.nonfinite_values);
    for (size_t f = 0; f < a.formats.size(); ++f) {
      EXPECT_EQ(a.formats[f].pages_used, b.formats[f].pages_used) << f;
      EXPECT_EQ(a.formats[f].blocks_in_use, b.formats[f].blocks_in_use) << f;
    }
  }
  RecordProperty("exhausted_steps", exhausted);
  RecordProperty("demoted_blocks", demoted);
  RecordProperty("forks", forks);
  EXPECT_GT(demoted, 0);
  if (steps >= 30) {  // not in the shortened runs under compute-sanitizer
    EXPECT_GT(exhausted, 0);
    EXPECT_GT(pair.gpu().GetStats().slab_moves, 0);  // how many depends on the random seed
  }
}

TEST(CudaStressTest, AsynchronousReclamationKeepsDataIntact) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<CachePair>> made = CachePair::Create(StressOptions(48));
  ASSERT_TRUE(made.ok()) << made.status();
  CachePair& pair = **made;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937 rng(seed);
  std::vector<SequenceId> live;
  int64_t max_pending = 0;
  const int steps = TestScale(60);
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    std::vector<int64_t> tokens(live.size(), 0);
    for (int64_t& t : tokens) t = 1 + rng() % 12;
    for (int i = static_cast<int>(rng() % 3); i > 0; --i) {
      live.push_back(pair.AddSequence());
      tokens.push_back(1 + rng() % 64);
    }
    ASSERT_TRUE(pair.AppendBatch(live, tokens, /*same_pages=*/false).ok());
    pair.WriteAllLayers(&rng, /*specials=*/false);
    if (::testing::Test::HasFatalFailure()) return;
    for (int target = 1; target <= 2; ++target) {
      const std::vector<BlockId> blocks =
          Candidates(pair.cpu(), live, target, target == 1 ? 1 : 3, &rng);
      ASSERT_TRUE(pair.Demote(blocks, target).ok());
    }
    if (step % 5 == 4) {
      for (SequenceId s : live) ASSERT_EQ(pair.CompareSequence(s, /*pages=*/false), "");
    }
    std::vector<SequenceId> keep;
    for (SequenceId s : live) {
      if (rng() % 5 == 0 || pair.cpu().SequenceLength(s).value() > 400) {
        pair.Release(s);
      } else {
        keep.push_back(s);
      }
    }
    live.swap(keep);
    ASSERT_TRUE(pair.cpu().EndStep().ok());
    ASSERT_TRUE(pair.gpu().EndStep().ok());
    max_pending = std::max(max_pending, pair.gpu().GetStats().pages_pending_reclaim);
    ASSERT_TRUE(pair.gpu().CheckConsistency().ok());
  }
  for (SequenceId s : live) ASSERT_EQ(pair.CompareSequence(s, /*pages=*/false), "");
  KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_TRUE(pair.gpu().EndStep().ok());
  KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_TRUE(pair.gpu().EndStep().ok());
  EXPECT_EQ(pair.gpu().GetStats().pages_pending_reclaim, 0);
  RecordProperty("max_pages_pending_reclaim", static_cast<int>(max_pending));
}

}  // namespace
}  // namespace kvtier::testing
