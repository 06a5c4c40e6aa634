// PreparedAppend and WriteKVLayers on the CPU backend: every layer written in one call holds the
// bytes of WriteKV layer by layer (hot formats FP16 and FP8, rotated keys, BF16 inputs, NaN and
// Inf inputs counted), and Update and WriteKVLayers refuse what WriteKV refuses, changing nothing.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/codec/half.h"
#include "kvtier/cache.h"
#include "kvtier/prepared_append.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::PaletteOptions;
using ::kvtier::testing::RandomHalves;

// 3 layers, 2 KV heads, head_dim 32, 16-token blocks.
Options TestOptions(const std::vector<std::string>& palette) {
  return PaletteOptions(Geometry{3, 2, 32, 16}, palette, 16);
}

// K and V of `tokens` tokens for every layer of `o`, FP16 or BF16 bits, with a NaN and an Inf
// in each layer's K and a NaN in its V.
struct LayerInputs {
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<KVInput> inputs;
  LayerInputs(const Options& o, int64_t tokens, uint32_t seed, DType dtype) {
    const Geometry& g = o.geometry;
    const size_t n = static_cast<size_t>(tokens) * g.num_kv_heads * g.head_dim;
    for (int l = 0; l < g.num_layers; ++l) {
      k.push_back(RandomHalves(n, seed + 2 * l));
      v.push_back(RandomHalves(n, seed + 2 * l + 1));
      if (n > 3) k.back()[1] = 0x7E00, k.back()[n - 2] = 0xFC00, v.back()[2] = 0xFE01;
      if (dtype == DType::kBFloat16) {
        for (auto* side : {&k.back(), &v.back()}) {
          for (uint16_t& x : *side) x = codec::FloatToBf16(codec::HalfToFloat(x));
        }
      }
    }
    for (int l = 0; l < g.num_layers; ++l) {
      inputs.push_back({dtype, k[l].data(), v[l].data(), tokens, g.num_kv_heads, g.head_dim});
    }
  }
};

// ReadKV of every sequence and layer, bit patterns.
std::vector<uint32_t> Contents(const Cache& cache, const std::vector<SequenceId>& seqs) {
  const Geometry& g = cache.options().geometry;
  std::vector<uint32_t> bits;
  for (SequenceId s : seqs) {
    const size_t n = static_cast<size_t>(*cache.SequenceLength(s)) * g.num_kv_heads * g.head_dim;
    std::vector<float> k(n), v(n);
    for (int l = 0; l < g.num_layers; ++l) {
      EXPECT_TRUE(cache.ReadKV(s, l, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
      for (const auto* side : {&k, &v}) {
        for (float x : *side) {
          uint32_t b;
          std::memcpy(&b, &x, sizeof(b));
          bits.push_back(b);
        }
      }
    }
  }
  return bits;
}

// Two caches of `o` fed the same steps (prompts of 1 to 40 tokens, then decode steps of one
// token per sequence): one written with WriteKV per layer, one with WriteKVLayers over one
// prepared step updated each step. Their contents and non-finite counts must agree.
void ExpectSameAsWriteKV(const Options& o, DType dtype) {
  auto want = MustCreate(o), got = MustCreate(o);
  const std::vector<int64_t> prompt = {1, 16, 40, 7};
  std::vector<SequenceId> seqs;
  for (size_t i = 0; i < prompt.size(); ++i) {
    seqs.push_back(*want->AddSequence());
    ASSERT_EQ(*got->AddSequence(), seqs.back());
  }
  absl::StatusOr<PreparedAppend> step = PreparedAppend::Create(*got, 64);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->rows(), 0);
  EXPECT_EQ(step->max_rows(), 64);
  for (int i = 0; i < 5; ++i) {
    const std::vector<int64_t> tokens = i == 0 ? prompt : std::vector<int64_t>(seqs.size(), 1);
    std::vector<int64_t> slots, same;
    ASSERT_TRUE(want->AppendBatch(seqs, tokens, {}, &slots).ok());
    ASSERT_TRUE(got->AppendBatch(seqs, tokens, {}, &same).ok());
    ASSERT_EQ(slots, same);
    const LayerInputs in(o, static_cast<int64_t>(slots.size()), 100 * i, dtype);
    for (int l = 0; l < o.geometry.num_layers; ++l) {
      ASSERT_TRUE(want->WriteKV(l, slots, in.inputs[l]).ok());
    }
    ASSERT_TRUE(step->Update(slots).ok());
    EXPECT_EQ(step->rows(), static_cast<int64_t>(slots.size()));
    const absl::Status s = WriteKVLayers(*got, *step, in.inputs);
    ASSERT_TRUE(s.ok()) << s;
  }
  EXPECT_EQ(Contents(*got, seqs), Contents(*want, seqs));
  EXPECT_EQ(got->GetStats().nonfinite_values, want->GetStats().nonfinite_values);
  EXPECT_GT(got->GetStats().nonfinite_values, 0);
  EXPECT_TRUE(got->CheckConsistency().ok());
}

TEST(PreparedAppendTest, EqualsWriteKVPerLayer) {
  for (const char* hot : {"fp16", "fp8_e4m3/token_head", "bf16"}) {
    SCOPED_TRACE(hot);
    ExpectSameAsWriteKV(TestOptions({hot, "nvfp4/block_head"}), DType::kFloat16);
  }
  ExpectSameAsWriteKV(TestOptions({"fp16"}), DType::kBFloat16);
  Options rotated = TestOptions({"fp16", "fp8_e4m3/block_head"});
  rotated.key_rotation = KeyRotation::kHadamard;
  ExpectSameAsWriteKV(rotated, DType::kFloat16);
}

// A cache of TestOptions({"fp16"}) with sequence 0 of 20 tokens written, its slots in *slots.
std::unique_ptr<Cache> OneSequence(std::vector<int64_t>* slots, SequenceId* seq) {
  auto cache = MustCreate(TestOptions({"fp16"}));
  *seq = *cache->AddSequence();
  EXPECT_TRUE(cache->Append(*seq, 20, slots).ok());
  const LayerInputs in(cache->options(), 20, 1, DType::kFloat16);
  for (int l = 0; l < 3; ++l) EXPECT_TRUE(cache->WriteKV(l, *slots, in.inputs[l]).ok());
  return cache;
}

TEST(PreparedAppendTest, UpdateRefusesWhatWriteKVRefuses) {
  std::vector<int64_t> slots;
  SequenceId seq;
  auto cache = OneSequence(&slots, &seq);
  absl::StatusOr<PreparedAppend> step = PreparedAppend::Create(*cache, 4);
  ASSERT_TRUE(step.ok());
  const std::vector<int64_t> good = {slots[16], slots[19]};
  ASSERT_TRUE(step->Update(good).ok());
  const auto expect_refused = [&](const std::vector<int64_t>& bad, absl::StatusCode code,
                                  const std::string& what) {
    const absl::Status s = step->Update(bad);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
    EXPECT_EQ(step->rows(), 2);  // unchanged
  };
  const int64_t unreserved = slots[19] + 1;  // offset 4 of a block with 4 tokens
  expect_refused({slots[16], unreserved}, absl::StatusCode::kInvalidArgument, "slots[1]: slot");
  expect_refused({-1}, absl::StatusCode::kInvalidArgument, "slots[0]");
  expect_refused({slots[0], slots[1], slots[2], slots[3], slots[4]},
                 absl::StatusCode::kInvalidArgument, "at most 4");
  ASSERT_TRUE(cache->Fork(seq).ok());  // every block is shared now
  expect_refused({slots[17]}, absl::StatusCode::kFailedPrecondition, "slots[0]: slot");
  // As WriteKV: the same slot, the same code.
  const LayerInputs in(cache->options(), 1, 2, DType::kFloat16);
  EXPECT_EQ(cache->WriteKV(0, {slots[17]}, in.inputs[0]).code(),
            absl::StatusCode::kFailedPrecondition);
  // The step still holds `good`, whose tail slots are shared now: WriteKV's error, nothing written.
  const std::vector<uint32_t> before = Contents(*cache, {seq});
  const LayerInputs two(cache->options(), 2, 3, DType::kFloat16);
  EXPECT_EQ(WriteKVLayers(*cache, *step, two.inputs).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Contents(*cache, {seq}), before);
}

TEST(PreparedAppendTest, WriteKVLayersRefusesBadInputsWritingNothing) {
  std::vector<int64_t> slots;
  SequenceId seq;
  auto cache = OneSequence(&slots, &seq);
  absl::StatusOr<PreparedAppend> step = PreparedAppend::Create(*cache, 2);
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE(step->Update({slots[3], slots[18]}).ok());
  const std::vector<uint32_t> before = Contents(*cache, {seq});
  const auto expect_refused = [&](absl::Span<const KVInput> layers, const std::string& what) {
    const absl::Status s = WriteKVLayers(*cache, *step, layers);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
    EXPECT_EQ(Contents(*cache, {seq}), before);
  };
  const LayerInputs in(cache->options(), 2, 4, DType::kFloat16);
  expect_refused(absl::MakeConstSpan(in.inputs).first(2), "2 layer inputs");
  std::vector<KVInput> bad = in.inputs;
  bad[2].num_tokens = 3;
  expect_refused(bad, "layers[2]: K/V shape");
  bad = in.inputs;
  bad[1].v = nullptr;
  expect_refused(bad, "layers[1]");
  bad = in.inputs;
  bad[2].dtype = DType::kBFloat16;
  expect_refused(bad, "another dtype");
  bad[2].dtype = DType::kFloat32;
  expect_refused(bad, "FP16 or BF16");
  auto other = MustCreate(TestOptions({"fp16"}));
  EXPECT_EQ(WriteKVLayers(*other, *step, in.inputs).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteKVLayers(*cache, *step, in.inputs).ok());
  EXPECT_NE(Contents(*cache, {seq}), before);

  PreparedAppend moved = std::move(*step);
  EXPECT_EQ(WriteKVLayers(*cache, *step, in.inputs).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(step->Update({}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(step->AfterGraphLaunch().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(step->max_rows(), 0);
  EXPECT_EQ(moved.rows(), 2);
  EXPECT_TRUE(moved.AfterGraphLaunch().ok());
  for (int64_t max_rows : {int64_t{0}, int64_t{-1}, (int64_t{1} << 31) + 1}) {
    EXPECT_EQ(PreparedAppend::Create(*cache, max_rows).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kvtier
