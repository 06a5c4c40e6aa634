// PreparedDecode on the CPU backend: a prepared step gives the results of the step's tables on
// every layer, and bad tables, spans and caches are refused with InvalidArgument.
#include <cmath>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::PaletteOptions;
using ::kvtier::testing::RandomFloats;
using ::kvtier::testing::RandomHalves;

constexpr int kQHeads = 4;

// A cache with `palette`, 2 layers, 2 KV heads, head_dim 32, 16-token blocks.
Options TestOptions(const std::vector<std::string>& palette) {
  return PaletteOptions(Geometry{2, 2, 32, 16}, palette, 8);
}

// Sequences of `lengths` random tokens (0: empty) in every layer; the first block of each is
// demoted to the palette's last format when it is full, so the batch mixes formats.
std::vector<SequenceId> WriteBatch(Cache& cache, const std::vector<int64_t>& lengths) {
  const Geometry& g = cache.options().geometry;
  std::vector<SequenceId> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const SequenceId seq = *cache.AddSequence();
    seqs.push_back(seq);
    if (lengths[i] == 0) continue;  // an empty sequence
    std::vector<int64_t> slots;
    EXPECT_TRUE(cache.Append(seq, lengths[i], &slots).ok());
    const size_t n = static_cast<size_t>(lengths[i]) * g.num_kv_heads * g.head_dim;
    for (int32_t layer = 0; layer < g.num_layers; ++layer) {
      const uint32_t seed = static_cast<uint32_t>(10 * i + layer);
      const std::vector<uint16_t> k = RandomHalves(n, seed), v = RandomHalves(n, seed + 5);
      const KVInput input{DType::kFloat16, k.data(), v.data(), lengths[i], g.num_kv_heads,
                          g.head_dim};
      EXPECT_TRUE(cache.WriteKV(layer, slots, input).ok());
    }
    if (lengths[i] >= g.block_tokens) {
      const BlockId first = (*cache.SequenceBlocks(seq))[0];
      const int32_t coldest = static_cast<int32_t>(cache.options().palette.size()) - 1;
      EXPECT_TRUE(cache.Demote({first}, coldest).ok());
    }
  }
  EXPECT_TRUE(cache.EndStep().ok());
  return seqs;
}

struct Outputs {
  std::vector<float> out, lse;
  explicit Outputs(int64_t batch) : out(batch * kQHeads * 32), lse(batch * kQHeads) {}
  DecodeOutputs View() { return DecodeOutputs{absl::MakeSpan(out), absl::MakeSpan(lse), {}, 0, {}}; }
};

TEST(PreparedDecodeTest, EqualsTheTablesOnEveryLayer) {
  auto cache = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head", "nvfp4/block_head"}));
  const std::vector<SequenceId> seqs = WriteBatch(*cache, {40, 0, 17, 64});
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables(seqs, &tables).ok());
  const absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache, tables);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->batch(), 4);
  const std::vector<float> q = RandomFloats(4 * kQHeads * 32, 3);
  const DecodeQueries queries{q, kQHeads, 0.2f};
  for (int32_t layer = 0; layer < 2; ++layer) {
    Outputs want(4), got(4);
    ASSERT_TRUE(DecodeAttention(*cache, layer, tables, queries, want.View()).ok());
    ASSERT_TRUE(DecodeAttention(*cache, layer, *step, queries, got.View()).ok());
    EXPECT_EQ(got.out, want.out) << layer;
    EXPECT_EQ(got.lse, want.lse) << layer;
  }
}

TEST(PreparedDecodeTest, RefusesBadTablesSpansAndCaches) {
  auto cache = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head"}));
  const std::vector<SequenceId> seqs = WriteBatch(*cache, {40, 20});
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables(seqs, &tables).ok());
  auto invalid = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kInvalidArgument;
  };

  PageTables bad = tables;
  bad.packed[1] = PackPage(5, 0);  // a format outside the palette
  EXPECT_TRUE(invalid(PreparedDecode::Create(*cache, bad).status()));
  bad = tables;
  bad.seq_lens[1] = 40;  // 3 pages for 2
  EXPECT_TRUE(invalid(PreparedDecode::Create(*cache, bad).status()));
  bad = tables;  // offsets that decrease: sequence 0's 6 pages would run past the 5 entries
  bad.seq_lens = {96, 0};
  bad.packed_indptr = {0, 6, 5};
  EXPECT_TRUE(invalid(PreparedDecode::Create(*cache, bad).status()));
  {
    const std::vector<float> q = RandomFloats(2 * kQHeads * 32, 4);
    Outputs two(2);
    EXPECT_TRUE(invalid(DecodeAttention(*cache, 0, bad, {q, kQHeads, 1.f}, two.View())));
  }

  EXPECT_TRUE(invalid(PreparedDecode::Create(*cache, tables, {}, -1).status()));
  EXPECT_TRUE(invalid(PreparedDecode::Create(*cache, tables, {}, INT32_MAX).status()));

  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache, tables);
  ASSERT_TRUE(step.ok()) << step.status();
  const std::vector<float> q = RandomFloats(2 * kQHeads * 32, 4);
  const DecodeQueries queries{q, kQHeads, 1.f};
  Outputs one(1), two(2);
  const DecodeQueries one_query{absl::MakeConstSpan(q).subspan(0, kQHeads * 32), kQHeads, 1.f};
  EXPECT_TRUE(invalid(DecodeAttention(*cache, 0, *step, one_query, one.View())));  // 2 in the step
  EXPECT_TRUE(invalid(DecodeAttention(*cache, 2, *step, queries, two.View())));    // no layer 2

  // Another cache, even of the same options: the step's pages do not describe it.
  auto other = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head"}));
  EXPECT_TRUE(invalid(DecodeAttention(*other, 0, *step, queries, two.View())));

  // A page past the end of a pool: the step is made, each layer's call refuses it.
  bad = tables;
  const int64_t capacity = (*cache).GetPool(0, 0)->capacity_pages;
  bad.packed[0] = PackPage(0, static_cast<uint32_t>(capacity));
  absl::StatusOr<PreparedDecode> outside = PreparedDecode::Create(*cache, bad);
  ASSERT_TRUE(outside.ok()) << outside.status();
  EXPECT_TRUE(invalid(DecodeAttention(*cache, 0, *outside, queries, two.View())));

  // A moved-from step.
  PreparedDecode taken = std::move(*step);
  EXPECT_EQ(step->batch(), 0);  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_EQ(DecodeAttention(*cache, 0, *step, queries, two.View()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DecodeAttention(*cache, 0, taken, queries, two.View()).ok());
}

// Tables (and a step) of pages that hold no block now, on the CPU backend: another cache's, or
// this one's after their sequences were released and their slabs unmapped, are refused
// (FailedPrecondition); the reference read the unmapped slabs (SIGSEGV).
TEST(PreparedDecodeTest, StaleTablesAreRefusedOnTheCpuBackend) {
  auto cache = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head"}));
  const std::vector<SequenceId> seqs = WriteBatch(*cache, {40, 20});
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables(seqs, &tables).ok());
  EXPECT_TRUE(cache->CheckTablesHeld(tables).ok());
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache, tables);
  ASSERT_TRUE(step.ok()) << step.status();
  const auto stale = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kFailedPrecondition &&
           s.message().find("holds no block") != absl::string_view::npos;
  };
  auto other = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head"}));
  EXPECT_TRUE(stale(other->CheckTablesHeld(tables)));
  for (SequenceId seq : seqs) ASSERT_TRUE(cache->Release(seq).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const std::vector<float> q = RandomFloats(2 * kQHeads * 32, 4);
  Outputs two(2);
  EXPECT_TRUE(stale(DecodeAttention(*cache, 0, tables, {q, kQHeads, 1.f}, two.View())));
  EXPECT_TRUE(stale(DecodeAttention(*cache, 0, *step, {q, kQHeads, 1.f}, two.View())));
}

// CheckTablesMapped, which the CUDA backend's attention asks at every call (O(1), where a page
// of an unmapped slab would fault the device): tables stay mapped until a slab is unmapped
// (here: every sequence released, two EndSteps, which keep one empty slab), then are refused,
// and so are their parts (adapters' PartitionByFormat); tables built afterwards are mapped
// again. (Tables of another cache pass while the two caches' unmap counts are equal.)
TEST(PreparedDecodeTest, TablesFromBeforeASlabUnmapAreNotMapped) {
  // 64 KB FP16 pages, 32 to a slab: the sequences below fill four slabs.
  auto cache =
      MustCreate(PaletteOptions(Geometry{1, 8, 128, 16}, {"fp16", "fp8_e4m3/block_head"}, 16));
  const std::vector<SequenceId> seqs = WriteBatch(*cache, {1000, 700});
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables(seqs, &tables).ok());
  EXPECT_TRUE(cache->CheckTablesMapped(tables).ok());
  const absl::StatusOr<std::vector<FormatPart>> parts =
      PartitionByFormat(cache->options(), tables);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_TRUE(cache->CheckTablesMapped(PartAsPageTables(parts->front())).ok());
  ASSERT_TRUE(cache->EndStep().ok());  // nothing released: no slab unmapped
  EXPECT_TRUE(cache->CheckTablesMapped(tables).ok());

  for (SequenceId seq : seqs) ASSERT_TRUE(cache->Release(seq).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const absl::Status stale = cache->CheckTablesMapped(tables);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("unmapped memory"), absl::string_view::npos) << stale;
  EXPECT_EQ(cache->CheckTablesMapped(PartAsPageTables(parts->front())).code(),
            absl::StatusCode::kFailedPrecondition);

  const std::vector<SequenceId> again = WriteBatch(*cache, {300});
  ASSERT_TRUE(cache->BuildPageTables(again, &tables).ok());
  EXPECT_TRUE(cache->CheckTablesMapped(tables).ok());
}

// Update: a step made with room (max_pages) takes the tables of later steps of the same
// sequences and then gives their results; tables of another batch, over max_pages, or
// inconsistent are refused and leave the step as it was.
TEST(PreparedDecodeTest, UpdateTakesLaterTablesOfTheSameBatch) {
  auto cache = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head"}));
  const std::vector<SequenceId> seqs = WriteBatch(*cache, {40, 15});
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables(seqs, &tables).ok());
  EXPECT_EQ(PreparedDecode::Create(*cache, tables, {}, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache, tables, {}, 4);
  ASSERT_TRUE(step.ok()) << step.status();
  const std::vector<float> q = RandomFloats(2 * kQHeads * 32, 5);
  const DecodeQueries queries{q, kQHeads, 0.3f};
  auto expect_equal = [&](const PageTables& t) {
    Outputs want(2), got(2);
    ASSERT_TRUE(DecodeAttention(*cache, 1, t, queries, want.View()).ok());
    ASSERT_TRUE(DecodeAttention(*cache, 1, *step, queries, got.View()).ok());
    EXPECT_EQ(got.out, want.out);
    EXPECT_EQ(got.lse, want.lse);
  };
  for (int i = 0; i < 20; ++i) {  // 40 -> 60 tokens: 3 -> 4 pages
    const Geometry& g = cache->options().geometry;
    for (const SequenceId seq : seqs) {
      std::vector<int64_t> slots;
      ASSERT_TRUE(cache->Append(seq, 1, &slots).ok());
      const size_t n = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
      const std::vector<uint16_t> k = RandomHalves(n, 100 + i), v = RandomHalves(n, 200 + i);
      for (int32_t layer = 0; layer < g.num_layers; ++layer) {
        const KVInput input{DType::kFloat16, k.data(), v.data(), 1, g.num_kv_heads, g.head_dim};
        ASSERT_TRUE(cache->WriteKV(layer, slots, input).ok());
      }
    }
    ASSERT_TRUE(cache->BuildPageTables(seqs, &tables).ok());
    ASSERT_TRUE(step->Update(tables).ok());
    expect_equal(tables);
  }
  PageTables longer = tables, fewer, bad = tables;
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seqs[0], 8, &slots).ok());  // 68 tokens: 5 pages
  ASSERT_TRUE(cache->BuildPageTables(seqs, &longer).ok());
  ASSERT_TRUE(cache->BuildPageTables({seqs[0]}, &fewer).ok());
  bad.seq_lens[1] = 200;
  for (const PageTables* t : {&longer, &fewer, &bad}) {
    EXPECT_EQ(step->Update(*t).code(), absl::StatusCode::kInvalidArgument);
  }
  expect_equal(tables);  // unchanged
  PreparedDecode taken = std::move(*step);
  EXPECT_EQ(step->Update(tables).code(),  // NOLINT(bugprone-use-after-move)
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier
