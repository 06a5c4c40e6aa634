// PreparedAppend on the CUDA backend: WriteKVLayers (every layer in one launch) stores the bytes
// that WriteKV stores layer by layer (checked against the CPU cache of a CachePair, whose WriteKV
// the parity tests hold equal to the CUDA one) for an FP16 and an FP8 hot format, BF16 inputs,
// rotated keys and NaN/Inf inputs, with the same non-finite count; and a whole decode step (the
// append of every layer, attention over every layer with page weights, a merge) captured in a
// CUDA graph on an engine stream replays over 32 steps of new slots, tables, K/V and queries
// with the bits of the same calls uncaptured and of steps freshly made.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/merge_states.h"
#include "kvtier/prepared_append.h"
#include "src/status_macros.h"
#include "tests/gpu/cache_pair.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace kvtier::testing {
namespace {

constexpr int kLayers = 4;

Options LayersOptions(const std::vector<std::string>& palette) {
  return PaletteOptions(Geometry{kLayers, 8, 128, 16}, palette, 512);
}

// Every layer's K and V in one device buffer each, [layer][tokens, heads, head_dim], at fixed
// addresses (the engine's buffers), and the KVInputs over them.
class EngineKV {
 public:
  EngineKV(const Geometry& g, int64_t max_tokens)
      : g_(g),
        layer_elems_(static_cast<size_t>(max_tokens) * g.num_kv_heads * g.head_dim),
        k_(layer_elems_ * g.num_layers * 2),
        v_(layer_elems_ * g.num_layers * 2) {}

  // Copies `layers` in on `stream` and returns the inputs over them.
  std::vector<KVInput> Set(const CachePair::Layers& layers, cudaStream_t stream) {
    std::vector<KVInput> inputs;
    for (int l = 0; l < g_.num_layers; ++l) {
      const size_t elems = layers.k[l].size();
      EXPECT_LE(elems, layer_elems_);
      uint16_t* k = static_cast<uint16_t*>(k_.data()) + l * layer_elems_;
      uint16_t* v = static_cast<uint16_t*>(v_.data()) + l * layer_elems_;
      EXPECT_EQ(cudaMemcpyAsync(k, layers.k[l].data(), elems * 2, cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(v, layers.v[l].data(), elems * 2, cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      const int64_t tokens = static_cast<int64_t>(elems) / (g_.num_kv_heads * g_.head_dim);
      inputs.push_back({layers.dtype, k, v, tokens, g_.num_kv_heads, g_.head_dim});
    }
    return inputs;
  }

 private:
  Geometry g_;
  size_t layer_elems_;
  DeviceBuffer k_, v_;
};

// Prompts of `lengths` then `steps` decode steps of one token per sequence, the CPU cache written
// with WriteKV per layer and the CUDA cache with WriteKVLayers over one prepared step on a
// non-blocking stream; then every sequence compared byte for byte, and the non-finite counts.
std::string CompareWithWriteKV(const Options& o, bool bf16, const std::vector<int64_t>& lengths,
                               int steps, std::mt19937* rng) {
  auto pair = CachePair::Create(o).value();
  std::vector<SequenceId> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(pair->AddSequence());
  int64_t prompt = 0;
  for (int64_t n : lengths) prompt += n;
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return "stream";
  std::string error;
  {
    EngineKV kv(o.geometry, prompt);
    absl::StatusOr<PreparedAppend> step = PreparedAppend::Create(pair->gpu(), prompt, {stream});
    if (!step.ok()) return absl::StrCat("Create: ", step.status().ToString());
    for (int i = 0; i <= steps && error.empty(); ++i) {
      const std::vector<int64_t> tokens = i == 0 ? lengths : std::vector<int64_t>(seqs.size(), 1);
      if (!pair->AppendBatch(seqs, tokens).ok()) return "AppendBatch";
      const CachePair::Layers layers = pair->RandomLayers(rng, /*specials=*/true, bf16);
      pair->WriteCpu(layers);
      const std::vector<KVInput> inputs = kv.Set(layers, stream);
      absl::Status s = step->Update(pair->gpu_slots());
      if (s.ok()) s = WriteKVLayers(pair->gpu(), *step, inputs, {stream, true});
      if (!s.ok()) error = absl::StrCat("step ", i, ": ", s.ToString());
    }
  }
  cudaStreamDestroy(stream);
  for (size_t i = 0; i < seqs.size() && error.empty(); ++i) {
    error = pair->CompareSequence(seqs[i]);  // its ReadKV folds the device counter too
    if (!error.empty()) error = absl::StrCat("sequence ", i, ": ", error);
  }
  if (!error.empty()) return error;
  const int64_t want = pair->cpu().GetStats().nonfinite_values;
  const int64_t got = pair->gpu().GetStats().nonfinite_values;
  if (want != got || want == 0) return absl::StrCat("non-finite inputs: cpu ", want, ", gpu ", got);
  return "";
}

TEST(PreparedAppendGpuTest, OneLaunchEqualsWriteKV) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(41);
  const std::vector<int64_t> lengths = {1, 16, 17, 100, 255, 3};
  for (const auto& palette : std::vector<std::vector<std::string>>{
           {"fp16", "fp8_e4m3/block_head"}, {"fp8_e4m3/token_head", "nvfp4/block_head"}}) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    EXPECT_EQ(CompareWithWriteKV(LayersOptions(palette), false, lengths, 5, &rng), "");
  }
  EXPECT_EQ(CompareWithWriteKV(LayersOptions({"fp16"}), /*bf16=*/true, lengths, 3, &rng), "")
      << "BF16 inputs";
  for (const char* hot : {"fp16", "fp8_e4m3/token_head"}) {
    Options o = LayersOptions({hot});
    o.key_rotation = KeyRotation::kHadamard;
    EXPECT_EQ(CompareWithWriteKV(o, false, lengths, 5, &rng), "") << "rotated keys, " << hot;
  }
  // More layers than one launch takes: the launcher splits them.
  Options many = PaletteOptions(Geometry{130, 1, 128, 16}, {"fp16"}, 1040);
  EXPECT_EQ(CompareWithWriteKV(many, false, {5, 20}, 2, &rng), "") << "130 layers";
}

// A step on the CUDA cache of an engine: the append of every layer, attention over every layer
// (its own queries, the page weights of all layers in one buffer, zeroed by the step), then the
// last layer's output merged with a second state. Results are copied back by Results().
class EngineStep {
 public:
  EngineStep(CachePair& pair, int64_t batch, int32_t max_pages, cudaStream_t stream)
      : pair_(pair),
        g_(pair.options().geometry),
        rows_(batch * kQHeads),
        n_(rows_ * g_.head_dim),
        most_entries_(static_cast<size_t>(batch) * max_pages),
        stream_(stream),
        kv_(g_, batch),
        q_(n_ * g_.num_layers * 4),
        out_(n_ * g_.num_layers * 4),
        lse_(rows_ * g_.num_layers * 4),
        other_(n_ * 4),
        other_lse_(rows_ * 4),
        merged_(n_ * 4),
        merged_lse_(rows_ * 4),
        weights_(most_entries_ * 4) {}

  // New K/V (also written into the CPU cache) and queries in the engine's buffers, on the stream.
  void NewInputs(std::mt19937* rng) {
    const CachePair::Layers layers = pair_.RandomLayers(rng, /*specials=*/false);
    pair_.WriteCpu(layers);
    inputs_ = kv_.Set(layers, stream_);
    std::normal_distribution<float> normal(0.f, 1.f);
    host_.resize(n_ * g_.num_layers);
    for (float& x : host_) x = normal(*rng);
    ASSERT_EQ(cudaMemcpyAsync(q_.data(), host_.data(), host_.size() * 4, cudaMemcpyHostToDevice,
                              stream_),
              cudaSuccess);
  }
  void NewOtherState(std::mt19937* rng) {
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> host(n_);
    for (float& x : host) x = normal(*rng);
    other_.Upload(host);
    host.resize(rows_);
    for (float& x : host) x = normal(*rng);
    other_lse_.Upload(host);
  }

  // Enqueues the step over `append` and `decode` on the stream (capturable).
  absl::Status Enqueue(const PreparedAppend& append, const PreparedDecode& decode,
                       size_t entries) {
    KVTIER_RETURN_IF_ERROR(WriteKVLayers(pair_.gpu(), append, inputs_, {stream_}));
    if (cudaMemsetAsync(weights_.data(), 0, most_entries_ * 4, stream_) != cudaSuccess) {
      return absl::InternalError("cudaMemsetAsync");
    }
    for (int l = 0; l < g_.num_layers; ++l) {
      const DecodeQueries queries{Span(q_, n_, l), kQHeads, 0.088f};
      const DecodeOutputs outputs{Span(out_, n_, l), Span(lse_, rows_, l), {}, 0,
                                  Span(weights_, entries, 0)};
      KVTIER_RETURN_IF_ERROR(DecodeAttention(pair_.gpu(), l, decode, queries, outputs, {stream_}));
    }
    const int last = g_.num_layers - 1;
    return MergeStatesOn(BackendKind::kCuda, Span(out_, n_, last), Span(lse_, rows_, last),
                         Span(other_, n_, 0), Span(other_lse_, rows_, 0),
                         static_cast<int64_t>(rows_), g_.head_dim, Span(merged_, n_, 0),
                         Span(merged_lse_, rows_, 0), {stream_});
  }

  // Every layer's outputs and LSEs, the merge's, the page weights.
  std::vector<float> Results() {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<float> r;
    for (const DeviceBuffer* b : {&out_, &lse_, &merged_, &merged_lse_, &weights_}) {
      const size_t floats = b == &out_       ? n_ * g_.num_layers
                            : b == &lse_     ? rows_ * g_.num_layers
                            : b == &merged_  ? n_
                            : b == &weights_ ? most_entries_
                                             : rows_;
      const size_t at = r.size();
      r.resize(at + floats);
      EXPECT_EQ(cudaMemcpy(r.data() + at, b->data(), floats * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return r;
  }

  static constexpr int kQHeads = 32;  // GQA group 4 over 8 KV heads

 private:
  static absl::Span<float> Span(const DeviceBuffer& b, size_t size, int index) {
    return absl::MakeSpan(static_cast<float*>(b.data()) + size * index, size);
  }

  CachePair& pair_;
  const Geometry g_;
  const size_t rows_, n_, most_entries_;
  cudaStream_t stream_;
  EngineKV kv_;
  std::vector<KVInput> inputs_;
  std::vector<float> host_;
  DeviceBuffer q_, out_, lse_, other_, other_lse_, merged_, merged_lse_, weights_;
};

// The whole step captured once and replayed for 32 steps (AppendBatch, Update of both prepared
// steps and new inputs between replays): the same bits as the step enqueued uncaptured (which
// rewrites the same K/V) and as steps freshly made, for a mixed palette and for rotated keys;
// the CUDA cache ends with the CPU cache's bytes.
TEST(PreparedAppendGpuTest, CapturedStepWithAppendReplaysWithNewTokens) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(43);
  for (bool rotated : {false, true}) {
    SCOPED_TRACE(rotated ? "rotated keys" : "plain keys");
    Options o = LayersOptions({"fp16", "k:fp16,v:fp8_e4m3/block_head", "nvfp4/block_head"});
    if (rotated) o.key_rotation = KeyRotation::kHadamard;
    auto pair = CachePair::Create(o).value();
    const std::vector<int64_t> lengths = {3, 100, 1000, 2999};
    std::vector<SequenceId> seqs;
    for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(pair->AddSequence());
    ASSERT_TRUE(pair->AppendBatch(seqs, lengths).ok());
    pair->WriteAllLayers(&rng, false);
    std::vector<BlockId> cold;  // the first block of each long sequence, as NVFP4
    for (size_t i = 1; i < seqs.size(); ++i) {
      cold.push_back(pair->gpu().SequenceBlocks(seqs[i])->at(0));
    }
    ASSERT_TRUE(pair->Demote(cold, 2).ok());
    constexpr int kSteps = 32;
    const int64_t batch = static_cast<int64_t>(seqs.size());
    const int32_t max_pages = (3000 + kSteps + 15) / 16;
    cudaStream_t stream;
    KVTIER_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    EngineStep engine(*pair, batch, max_pages, stream);
    engine.NewOtherState(&rng);
    // The first decode step uncaptured: the kernels' one-time setup happens outside the capture.
    const std::vector<int64_t> ones(seqs.size(), 1);
    ASSERT_TRUE(pair->AppendBatch(seqs, ones, /*same_pages=*/false).ok());
    PageTables tables;
    ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
    absl::StatusOr<PreparedAppend> append = PreparedAppend::Create(pair->gpu(), batch, {stream});
    ASSERT_TRUE(append.ok()) << append.status();
    ASSERT_TRUE(append->Update(pair->gpu_slots()).ok());
    absl::StatusOr<PreparedDecode> decode =
        PreparedDecode::Create(pair->gpu(), tables, {stream}, max_pages);
    ASSERT_TRUE(decode.ok()) << decode.status();
    engine.NewInputs(&rng);
    ASSERT_TRUE(engine.Enqueue(*append, *decode, tables.packed.size()).ok());
    KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    KVTIER_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status captured = engine.Enqueue(*append, *decode, tables.packed.size());
    KVTIER_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
    ASSERT_TRUE(captured.ok()) << captured;
    KVTIER_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<float> previous;
    for (int i = 0; i < kSteps; ++i) {
      ASSERT_TRUE(pair->gpu().EndStep().ok());
      ASSERT_TRUE(pair->cpu().EndStep().ok());
      ASSERT_TRUE(pair->AppendBatch(seqs, ones, /*same_pages=*/false).ok());
      ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
      ASSERT_TRUE(append->Update(pair->gpu_slots()).ok());
      ASSERT_TRUE(decode->Update(tables).ok());
      engine.NewInputs(&rng);
      KVTIER_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
      ASSERT_TRUE(append->AfterGraphLaunch().ok());
      const std::vector<float> replayed = engine.Results();
      ASSERT_TRUE(engine.Enqueue(*append, *decode, tables.packed.size()).ok());
      ASSERT_EQ(CompareFloats(replayed, engine.Results()), "") << "step " << i;
      {
        absl::StatusOr<PreparedAppend> fresh_append =
            PreparedAppend::Create(pair->gpu(), batch, {stream});
        ASSERT_TRUE(fresh_append.ok()) << fresh_append.status();
        ASSERT_TRUE(fresh_append->Update(pair->gpu_slots()).ok());
        absl::StatusOr<PreparedDecode> fresh =
            PreparedDecode::Create(pair->gpu(), tables, {stream}, max_pages);
        ASSERT_TRUE(fresh.ok()) << fresh.status();
        ASSERT_TRUE(engine.Enqueue(*fresh_append, *fresh, tables.packed.size()).ok());
        ASSERT_EQ(CompareFloats(replayed, engine.Results()), "") << "step " << i << ", fresh";
      }
      EXPECT_NE(replayed, previous) << "step " << i;
      previous = replayed;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    append = absl::CancelledError("destroyed before its stream");
    decode = absl::CancelledError("destroyed before its stream");
    KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream));
    cudaStreamDestroy(stream);
    for (SequenceId s : seqs) EXPECT_EQ(pair->CompareSequence(s), "");
  }
}

// What the CUDA path refuses on top of the CPU path's checks (tests/prepared_append_test.cc):
// a stream other than Create's; and a call before any Update writes nothing.
// WriteKVLayers refuses, nothing written: a stream other than Create's; a step updated before a
// slab was unmapped (another sequence released, two EndSteps), whose slots may have lain in
// unmapped memory where the write would have faulted the device. Updated again with the same
// (still held) slots, the step writes.
TEST(PreparedAppendGpuTest, RefusesAnotherStreamAndSlotsFromBeforeASlabUnmap) {
  KVTIER_REQUIRE_GPU();
  auto pair = CachePair::Create(LayersOptions({"fp16"})).value();
  const SequenceId gone = pair->AddSequence(), seq = pair->AddSequence();
  ASSERT_TRUE(pair->AppendBatch({gone}, {4000}).ok());  // 250 pages of 64 KB: 8 slabs a layer
  ASSERT_TRUE(pair->AppendBatch({seq}, {3}).ok());
  std::mt19937 rng(47);
  const CachePair::Layers layers = pair->RandomLayers(&rng, false);
  cudaStream_t stream;
  KVTIER_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    EngineKV kv(pair->options().geometry, 3);
    const std::vector<KVInput> inputs = kv.Set(layers, stream);
    absl::StatusOr<PreparedAppend> step = PreparedAppend::Create(pair->gpu(), 3, {stream});
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_TRUE(step->Update(pair->gpu_slots()).ok());
    const absl::Status s = WriteKVLayers(pair->gpu(), *step, inputs, {nullptr, true});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

    pair->Release(gone);
    for (int i = 0; i < 2; ++i) {
      KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());
      ASSERT_TRUE(pair->gpu().EndStep().ok());
      ASSERT_TRUE(pair->cpu().EndStep().ok());
    }
    const absl::Status stale = WriteKVLayers(pair->gpu(), *step, inputs, {stream, true});
    EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
    EXPECT_NE(stale.message().find("unmapped memory"), absl::string_view::npos) << stale;
    ASSERT_TRUE(step->Update(pair->gpu_slots()).ok());
    EXPECT_TRUE(WriteKVLayers(pair->gpu(), *step, inputs, {stream, true}).ok());
    pair->WriteCpu(layers);
  }
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  EXPECT_EQ(pair->CompareSequence(seq), "");
}

}  // namespace
}  // namespace kvtier::testing
