// The CPU reference decode attention: paged (through the cache's pools and page tables) against
// dense float attention, LSE merging, GQA head mapping and shape errors.
#include "src/attention/reference_attention.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "kvtier/merge_states.h"
#include "kvtier/reference_attention.h"
#include "src/attention/attention_contract.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::PaletteOptions;
using ::kvtier::testing::RandomFloats;
using ::kvtier::testing::RandomHalves;

struct Results {
  std::vector<float> out, lse, logits;
  DecodeOutputs View(int64_t stride) {
    return DecodeOutputs{absl::MakeSpan(out), absl::MakeSpan(lse), absl::MakeSpan(logits), stride, {}};
  }
};

Results MakeResults(int64_t batch, int q_heads, int head_dim, int64_t stride) {
  return Results{std::vector<float>(batch * q_heads * head_dim),
                 std::vector<float>(batch * q_heads),
                 std::vector<float>(batch * q_heads * stride)};
}

// A cache with `palette`, 2 KV heads, head_dim 32, 16-token blocks, one layer.
Options TestOptions(const std::vector<std::string>& palette) {
  return PaletteOptions(Geometry{1, 2, 32, 16}, palette, 8);
}

// Writes `length` random tokens into a new sequence of `cache`.
SequenceId WriteRandom(Cache& cache, int64_t length, uint32_t seed) {
  const Geometry& g = cache.options().geometry;
  const SequenceId seq = *cache.AddSequence();
  std::vector<int64_t> slots;
  EXPECT_TRUE(cache.Append(seq, length, &slots).ok());
  const size_t n = static_cast<size_t>(length) * g.num_kv_heads * g.head_dim;
  const std::vector<uint16_t> k = RandomHalves(n, seed), v = RandomHalves(n, seed + 1);
  EXPECT_TRUE(
      cache.WriteKV(0, slots, KVInput{DType::kFloat16, k.data(), v.data(), length, g.num_kv_heads, g.head_dim})
          .ok());
  return seq;
}

// Paged attention over `seqs` equals dense attention over the cache's own decoding (ReadKV) of
// the same sequences, bit for bit.
void ExpectPagedEqualsDense(Cache& cache, const std::vector<SequenceId>& seqs, int q_heads) {
  const Geometry& g = cache.options().geometry;
  PageTables tables;
  ASSERT_TRUE(cache.BuildPageTables(seqs, &tables).ok());
  const int64_t batch = static_cast<int64_t>(seqs.size());
  int64_t stride = 0;
  std::vector<std::vector<float>> k(batch), v(batch);
  std::vector<DenseSequence> dense(batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = *cache.SequenceLength(seqs[b]);
    stride = std::max(stride, len);
    k[b].resize(len * g.num_kv_heads * g.head_dim);
    v[b].resize(k[b].size());
    ASSERT_TRUE(cache.ReadKV(seqs[b], 0, absl::MakeSpan(k[b]), absl::MakeSpan(v[b])).ok());
    dense[b] = DenseSequence{k[b], v[b], len};
  }
  const std::vector<float> q = RandomFloats(batch * q_heads * g.head_dim, 7);
  const DecodeQueries queries{q, q_heads, 1.f / std::sqrt(static_cast<float>(g.head_dim))};
  Results paged = MakeResults(batch, q_heads, g.head_dim, stride);
  Results want = MakeResults(batch, q_heads, g.head_dim, stride);
  const absl::StatusOr<PagedLayer> layer = GetPagedLayer(cache, 0);
  ASSERT_TRUE(layer.ok()) << layer.status();
  ASSERT_TRUE(PagedDecodeAttention(*layer, tables, queries, paged.View(stride)).ok());
  ASSERT_TRUE(DenseDecodeAttention(dense, g.num_kv_heads, g.head_dim, queries, want.View(stride)).ok());
  EXPECT_EQ(paged.out, want.out);
  EXPECT_EQ(paged.lse, want.lse);
  EXPECT_EQ(paged.logits, want.logits);
}

TEST(ReferenceAttentionTest, PagedOnFp16CacheEqualsDenseOnTheSameData) {
  auto cache = MustCreate(TestOptions({"fp16"}));
  const std::vector<SequenceId> seqs = {WriteRandom(*cache, 45, 1), WriteRandom(*cache, 16, 3),
                                        WriteRandom(*cache, 1, 5)};
  ExpectPagedEqualsDense(*cache, seqs, 8);
}

TEST(ReferenceAttentionTest, PagedOnMixedFormatsEqualsDenseOnTheDecodedData) {
  auto cache = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head", "nvfp4/block_head",
                                       "k:nvfp4_channel/block_head,v:nvfp4/block_head"}));
  const SequenceId a = WriteRandom(*cache, 80, 11), b = WriteRandom(*cache, 37, 13);
  const std::vector<BlockId> blocks = *cache->SequenceBlocks(a);
  ASSERT_TRUE(cache->Demote({blocks[0], blocks[3]}, 1).ok());
  ASSERT_TRUE(cache->Demote({blocks[1]}, 2).ok());
  ASSERT_TRUE(cache->Demote({blocks[2], (*cache->SequenceBlocks(b))[0]}, 3).ok());
  ExpectPagedEqualsDense(*cache, {a, b}, 4);
}

TEST(ReferenceAttentionTest, DenseMatchesANaiveSoftmax) {
  const int len = 5, dim = 16;
  const std::vector<float> k = RandomFloats(len * dim, 21), v = RandomFloats(len * dim, 22);
  const std::vector<float> q = RandomFloats(dim, 23);
  const float scale = 0.25f;
  Results r = MakeResults(1, 1, dim, len);
  const DenseSequence seq{k, v, len};
  ASSERT_TRUE(DenseDecodeAttention({seq}, 1, dim, DecodeQueries{q, 1, scale}, r.View(len)).ok());
  double l[len], m = -INFINITY, sum = 0;
  for (int t = 0; t < len; ++t) {
    l[t] = 0;
    for (int d = 0; d < dim; ++d) l[t] += static_cast<double>(q[d]) * k[t * dim + d];
    l[t] *= scale;
    m = std::max(m, l[t]);
    EXPECT_NEAR(r.logits[t], l[t], 1e-5);
  }
  for (int t = 0; t < len; ++t) sum += std::exp(l[t] - m);
  EXPECT_NEAR(r.lse[0], m + std::log(sum), 1e-5);
  for (int d = 0; d < dim; ++d) {
    double o = 0;
    for (int t = 0; t < len; ++t) o += std::exp(l[t] - m) / sum * v[t * dim + d];
    EXPECT_NEAR(r.out[d], o, 1e-5);
  }
}

TEST(ReferenceAttentionTest, MergingTwoHalvesEqualsTheWhole) {
  const int heads = 2, q_heads = 6, dim = 32;
  const int64_t len = 301, cut = 123;
  const std::vector<float> k = RandomFloats(len * heads * dim, 31);
  const std::vector<float> v = RandomFloats(len * heads * dim, 32);
  const std::vector<float> q = RandomFloats(q_heads * dim, 33);
  const DecodeQueries queries{q, q_heads, 0.3f};
  const size_t row = heads * dim;
  const absl::Span<const float> ks(k), vs(v);
  Results whole = MakeResults(1, q_heads, dim, 0), a = whole, b = whole, merged = whole;
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{ks, vs, len}}, heads, dim, queries, whole.View(0)).ok());
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{ks.subspan(0, cut * row), vs.subspan(0, cut * row), cut}},
                                   heads, dim, queries, a.View(0)).ok());
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{ks.subspan(cut * row), vs.subspan(cut * row), len - cut}},
                                   heads, dim, queries, b.View(0)).ok());
  ASSERT_TRUE(MergeStates(a.out, a.lse, b.out, b.lse, q_heads, dim, absl::MakeSpan(merged.out),
                          absl::MakeSpan(merged.lse)).ok());
  for (size_t i = 0; i < whole.out.size(); ++i) EXPECT_NEAR(merged.out[i], whole.out[i], 1e-5) << i;
  for (size_t i = 0; i < whole.lse.size(); ++i) EXPECT_NEAR(merged.lse[i], whole.lse[i], 1e-5) << i;

  // In place, into the first part's buffers.
  ASSERT_TRUE(MergeStates(a.out, a.lse, b.out, b.lse, q_heads, dim, absl::MakeSpan(a.out),
                          absl::MakeSpan(a.lse)).ok());
  EXPECT_EQ(a.out, merged.out);
}

TEST(ReferenceAttentionTest, AnEmptyPartIsMinusInfinityAndContributesNothing) {
  const int dim = 16;
  const std::vector<float> k = RandomFloats(4 * dim, 41), v = RandomFloats(4 * dim, 42);
  const std::vector<float> q = RandomFloats(dim, 43);
  Results full = MakeResults(1, 1, dim, 0), empty = full, merged = full;
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{k, v, 4}}, 1, dim, DecodeQueries{q, 1, 1.f}, full.View(0)).ok());
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{{}, {}, 0}}, 1, dim, DecodeQueries{q, 1, 1.f}, empty.View(0)).ok());
  EXPECT_EQ(empty.lse[0], -INFINITY);
  EXPECT_EQ(empty.out, std::vector<float>(dim, 0.f));
  ASSERT_TRUE(MergeStates(empty.out, empty.lse, full.out, full.lse, 1, dim, absl::MakeSpan(merged.out),
                          absl::MakeSpan(merged.lse)).ok());
  EXPECT_EQ(merged.out, full.out);
  EXPECT_EQ(merged.lse, full.lse);
  ASSERT_TRUE(MergeStates(empty.out, empty.lse, empty.out, empty.lse, 1, dim, absl::MakeSpan(merged.out),
                          absl::MakeSpan(merged.lse)).ok());
  EXPECT_EQ(merged.lse[0], -INFINITY);
  EXPECT_EQ(merged.out, std::vector<float>(dim, 0.f));
}

// The contract the fused kernel and the merge kernel follow (tests/gpu/decode_attention_test.cc
// checks them against it): a NaN or +inf logit, or only -inf logits, make a head NaN, not empty.
TEST(ReferenceAttentionTest, NanOrInfiniteLogitsGiveNan) {
  const int dim = 16, len = 5, q_heads = 4;
  std::vector<float> k = RandomFloats(len * dim, 61);
  const std::vector<float> v = RandomFloats(len * dim, 62);
  std::vector<float> q = RandomFloats(q_heads * dim, 63);
  for (int t = 0; t < len; ++t) k[t * dim] = 1.f;
  q[0 * dim + 3] = NAN;                                       // head 0: every logit NaN
  q[1 * dim + 0] = INFINITY;                                  // head 1: every logit +inf
  for (int d = 0; d < dim; ++d) q[2 * dim + d] = d == 0 ? -INFINITY : 0.f;  // 2: all -inf
  Results r = MakeResults(1, q_heads, dim, 0);
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{k, v, len}}, 1, dim,
                                   DecodeQueries{q, q_heads, 1.f}, r.View(0)).ok());
  for (int h = 0; h < 3; ++h) {
    EXPECT_TRUE(std::isnan(r.lse[h])) << h;
    for (int d = 0; d < dim; ++d) EXPECT_TRUE(std::isnan(r.out[h * dim + d])) << h << " " << d;
  }
  EXPECT_TRUE(std::isfinite(r.lse[3]));  // head 3 is untouched

  // Merging: a NaN or +inf LSE in either part makes the row NaN, beside an empty part too;
  // -inf in both stays empty.
  const std::vector<float> a = RandomFloats(6 * dim, 64), b = RandomFloats(6 * dim, 65);
  const std::vector<float> sa = {NAN, 1.f, INFINITY, -INFINITY, NAN, -INFINITY};
  const std::vector<float> sb = {2.f, NAN, 0.5f, NAN, -INFINITY, -INFINITY};
  std::vector<float> out(6 * dim), lse(6);
  ASSERT_TRUE(MergeStates(a, sa, b, sb, 6, dim, absl::MakeSpan(out), absl::MakeSpan(lse)).ok());
  for (int row = 0; row < 5; ++row) {
    EXPECT_TRUE(std::isnan(lse[row])) << row;
    for (int d = 0; d < dim; ++d) EXPECT_TRUE(std::isnan(out[row * dim + d])) << row;
  }
  EXPECT_EQ(lse[5], -INFINITY);
  EXPECT_EQ(std::vector<float>(out.begin() + 5 * dim, out.end()), std::vector<float>(dim, 0.f));
}

TEST(ReferenceAttentionTest, QueryHeadsMapToTheirKvHeadGroup) {
  const int kv_heads = 2, q_heads = 8, dim = 16;  // group of 4
  const int64_t len = 50;
  const std::vector<float> k = RandomFloats(len * kv_heads * dim, 51);
  const std::vector<float> v = RandomFloats(len * kv_heads * dim, 52);
  const std::vector<float> q = RandomFloats(q_heads * dim, 53);
  Results all = MakeResults(1, q_heads, dim, len);
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{k, v, len}}, kv_heads, dim,
                                   DecodeQueries{q, q_heads, 0.5f}, all.View(len)).ok());
  for (int h = 0; h < q_heads; ++h) {
    const int kv = h / (q_heads / kv_heads);
    std::vector<float> k1(len * dim), v1(len * dim);
    for (int64_t t = 0; t < len; ++t) {
      for (int d = 0; d < dim; ++d) {
        k1[t * dim + d] = k[(t * kv_heads + kv) * dim + d];
        v1[t * dim + d] = v[(t * kv_heads + kv) * dim + d];
      }
    }
    Results one = MakeResults(1, 1, dim, len);
    const absl::Span<const float> qh = absl::MakeConstSpan(q).subspan(h * dim, dim);
    ASSERT_TRUE(DenseDecodeAttention({DenseSequence{k1, v1, len}}, 1, dim, DecodeQueries{qh, 1, 0.5f},
                                     one.View(len)).ok());
    for (int d = 0; d < dim; ++d) EXPECT_EQ(all.out[h * dim + d], one.out[d]) << h;
    EXPECT_EQ(all.lse[h], one.lse[0]) << h;
  }
}

// page_weight: per page, the largest softmax weight any query head gives its tokens, taken as
// a max with what the buffer holds; heads whose LSE is not finite add nothing.
TEST(ReferenceAttentionTest, PageWeightIsEachPagesLargestHeadWeight) {
  auto cache = MustCreate(TestOptions({"fp16", "nvfp4/block_head"}));
  const SequenceId a = WriteRandom(*cache, 45, 71), b = WriteRandom(*cache, 16, 73);
  ASSERT_TRUE(cache->Demote({cache->SequenceBlocks(a)->at(1)}, 1).ok());
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables({a, b}, &tables).ok());
  const PagedLayer layer = *GetPagedLayer(*cache, 0);
  const int q_heads = 4, dim = 32;
  std::vector<float> q = RandomFloats(2 * q_heads * dim, 74);
  q[3 * dim] = NAN;  // sequence a, query head 3: NaN output, no page weight
  Results r = MakeResults(2, q_heads, dim, 45);
  std::vector<float> weight(4, 0.f);  // a: 3 pages, b: 1
  weight[1] = 0.999f;                 // kept: the call takes the max
  DecodeOutputs o = r.View(45);
  o.page_weight = absl::MakeSpan(weight);
  ASSERT_TRUE(PagedDecodeAttention(layer, tables, DecodeQueries{q, q_heads, 0.5f}, o).ok());
  std::vector<float> want(4, 0.f);
  want[1] = 0.999f;
  for (int s = 0; s < 2; ++s) {
    const int64_t len = tables.seq_lens[s];
    for (int h = 0; h < q_heads; ++h) {
      const size_t row = static_cast<size_t>(s) * q_heads + h;
      if (!std::isfinite(r.lse[row])) continue;
      for (int64_t first = 0; first < len; first += 16) {
        double mass = 0;
        for (int64_t t = first; t < std::min<int64_t>(first + 16, len); ++t) {
          mass += std::exp(static_cast<double>(r.logits[row * 45 + t]) - r.lse[row]);
        }
        float& w = want[tables.packed_indptr[s] + first / 16];
        w = std::max(w, static_cast<float>(mass));
      }
    }
  }
  ASSERT_FALSE(std::isfinite(r.lse[3]));
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(weight[e], want[e], 1e-5) << "page " << e;
  EXPECT_GT(weight[3], 0.99f);  // b has one page: every head puts all its weight there
  std::vector<float> short_weight(3);
  o.page_weight = absl::MakeSpan(short_weight);
  const absl::Status s = PagedDecodeAttention(layer, tables, DecodeQueries{q, q_heads, 0.5f}, o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("page_weight holds 3"), absl::string_view::npos) << s;
  const std::vector<float> kv(2 * dim, 0.5f);  // one token, 2 KV heads
  std::vector<float> dense_weight(1);
  Results one = MakeResults(1, q_heads, dim, 1);
  DecodeOutputs dense = one.View(1);
  dense.page_weight = absl::MakeSpan(dense_weight);
  const absl::Status d =
      DenseDecodeAttention({DenseSequence{kv, kv, 1}}, 2, dim,
                           DecodeQueries{absl::MakeConstSpan(q).subspan(0, q_heads * dim), q_heads, 1.f},
                           dense);
  EXPECT_EQ(d.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.message().find("page_weight"), absl::string_view::npos) << d;
}

TEST(ReferenceAttentionTest, BadShapesAreInvalidArgument) {
  auto cache = MustCreate(TestOptions({"fp16", "fp8_e4m3/block_head"}));
  const SequenceId seq = WriteRandom(*cache, 40, 61);
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables({seq}, &tables).ok());
  const PagedLayer layer = *GetPagedLayer(*cache, 0);
  const std::vector<float> q = RandomFloats(4 * 32, 62);
  Results r = MakeResults(1, 4, 32, 40);
  EXPECT_TRUE(PagedDecodeAttention(layer, tables, DecodeQueries{q, 4, 1.f}, r.View(40)).ok());

  auto invalid = [](const absl::Status& s) { return s.code() == absl::StatusCode::kInvalidArgument; };
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, tables, DecodeQueries{q, 3, 1.f}, r.View(40))));  // 3 % 2
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, tables, DecodeQueries{absl::MakeConstSpan(q).subspan(1), 4, 1.f},
                                           r.View(40))));
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, tables, DecodeQueries{q, 4, 1.f}, r.View(39))));  // stride
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, tables, DecodeQueries{q, 4, NAN}, r.View(40))));
  PageTables bad = tables;
  bad.seq_lens[0] = 60;  // 4 pages for 3
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, bad, DecodeQueries{q, 4, 1.f}, r.View(60))));
  bad = tables;
  bad.packed[1] = PackPage(5, 0);  // format outside the palette
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, bad, DecodeQueries{q, 4, 1.f}, r.View(40))));
  bad = tables;
  bad.packed[1] = PackPage(0, static_cast<uint32_t>(layer.formats[0].capacity_pages));
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, bad, DecodeQueries{q, 4, 1.f}, r.View(40))));
  bad = tables;
  bad.packed_indptr.push_back(3);
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, bad, DecodeQueries{q, 4, 1.f}, r.View(40))));
  EXPECT_TRUE(invalid(DenseDecodeAttention({DenseSequence{q, q, 3}}, 2, 32, DecodeQueries{q, 4, 1.f},
                                           r.View(40))));
  EXPECT_TRUE(invalid(MergeStates(r.out, r.lse, r.out, r.lse, 3, 32, absl::MakeSpan(r.out),
                                  absl::MakeSpan(r.lse))));
  EXPECT_FALSE(GetPagedLayer(*cache, 1).ok());
  // Sizes whose products wrap: 4 rows x a stride of 2^62 + 2 is 8 floats mod 2^64, and a
  // length of 2^57 x 1 head x 128 dims is 0.
  Results w = MakeResults(1, 4, 32, 2);
  EXPECT_TRUE(invalid(PagedDecodeAttention(layer, tables, DecodeQueries{q, 4, 1.f},
                                           w.View((int64_t{1} << 62) + 2))));
  Results d = MakeResults(1, 1, 128, 0);
  const std::vector<float> q1(128, 1.f);
  EXPECT_TRUE(invalid(DenseDecodeAttention({DenseSequence{{}, {}, int64_t{1} << 57}}, 1, 128,
                                           DecodeQueries{q1, 1, 1.f}, d.View(0))));
}

}  // namespace
}  // namespace kvtier
