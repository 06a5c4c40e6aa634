// Two caches with the same options, one on the CPU backend and one on the CUDA backend, driven
// through the public API with identical calls and compared byte for byte.
#ifndef KVTIER_TESTS_GPU_CACHE_PAIR_H_
#define KVTIER_TESTS_GPU_CACHE_PAIR_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/page_layout.h"
#include "kvtier/cache.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier::testing {

class CachePair {
 public:
  // Both caches, or the CPU cache's error (the CUDA cache must fail with the same code).
  static absl::StatusOr<std::unique_ptr<CachePair>> Create(Options o) {
    o.backend = BackendKind::kCpu;
    absl::StatusOr<std::unique_ptr<Cache>> cpu = Cache::Create(o);
    o.backend = BackendKind::kCuda;
    absl::StatusOr<std::unique_ptr<Cache>> gpu = Cache::Create(o);
    if (!cpu.ok()) {
      EXPECT_EQ(cpu.status().code(), gpu.status().code()) << gpu.status();
      return cpu.status();
    }
    if (!gpu.ok()) return gpu.status();
    auto pair = std::unique_ptr<CachePair>(new CachePair);
    pair->cpu_ = std::move(*cpu);
    pair->gpu_ = std::move(*gpu);
    pair->options_ = o;
    return pair;
  }

  Cache& cpu() { return *cpu_; }
  Cache& gpu() { return *gpu_; }
  const Options& options() const { return options_; }

  // A new sequence in both; the ids agree (both caches are deterministic).
  SequenceId AddSequence() {
    const SequenceId a = cpu_->AddSequence().value();
    const SequenceId b = gpu_->AddSequence().value();
    EXPECT_EQ(a, b);
    return a;
  }

  // The same call on both; returns the CUDA cache's status after checking that the CPU cache
  // gave the same code. The slots are kept for WriteAllLayers; with `same_pages` they must be
  // equal (caches in lockstep), otherwise pages may differ (the CUDA cache reclaims later).
  absl::Status AppendBatch(const std::vector<SequenceId>& batch,
                           const std::vector<int64_t>& tokens, bool same_pages = true) {
    cpu_slots_.clear();
    gpu_slots_.clear();
    const absl::Status g = gpu_->AppendBatch(batch, tokens, {}, &gpu_slots_);
    const absl::Status c = cpu_->AppendBatch(batch, tokens, {}, &cpu_slots_);
    EXPECT_EQ(c.code(), g.code()) << "cpu: " << c << " gpu: " << g;
    if (same_pages) {
      EXPECT_EQ(cpu_slots_, gpu_slots_);
    }
    return g;
  }

  // K/V of every layer, FP16 (or BF16) bits [tokens, heads, head_dim] each.
  struct Layers {
    std::vector<std::vector<uint16_t>> k, v;
    DType dtype = DType::kFloat16;
  };

  // Random K/V (with specials when asked) for the slots of the last AppendBatch, every layer;
  // BF16 bits (the FP16 values rounded) when `bf16`.
  Layers RandomLayers(std::mt19937* rng, bool specials, bool bf16 = false) const {
    const Geometry& g = options_.geometry;
    const int64_t n = static_cast<int64_t>(cpu_slots_.size());
    Layers layers;
    layers.dtype = bf16 ? DType::kBFloat16 : DType::kFloat16;
    for (int layer = 0; layer < g.num_layers; ++layer) {
      std::vector<uint16_t> k = RandomKV(n, g.num_kv_heads, g.head_dim, true, rng);
      std::vector<uint16_t> v = RandomKV(n, g.num_kv_heads, g.head_dim, false, rng);
      if (specials) {
        AddSpecials(&k, rng);
        AddSpecials(&v, rng);
      }
      for (auto* side : {&k, &v}) {
        for (uint16_t& x : *side) x = bf16 ? codec::FloatToBf16(codec::HalfToFloat(x)) : x;
      }
      layers.k.push_back(std::move(k));
      layers.v.push_back(std::move(v));
    }
    return layers;
  }

  // Writes `layers` into the last AppendBatch's slots of the CPU cache, WriteKV layer by layer.
  void WriteCpu(const Layers& layers) {
    const Geometry& g = options_.geometry;
    const int64_t n = static_cast<int64_t>(cpu_slots_.size());
    for (int layer = 0; layer < g.num_layers; ++layer) {
      const KVInput in{layers.dtype, layers.k[layer].data(), layers.v[layer].data(), n,
                       g.num_kv_heads, g.head_dim};
      ASSERT_TRUE(cpu_->WriteKV(layer, cpu_slots_, in).ok());
    }
  }

  // Writes random K/V (with specials when asked) into the slots of the last AppendBatch, in
  // every layer of both caches.
  void WriteAllLayers(std::mt19937* rng, bool specials) {
    const Geometry& g = options_.geometry;
    const int64_t n = static_cast<int64_t>(cpu_slots_.size());
    const Layers layers = RandomLayers(rng, specials);
    WriteCpu(layers);
    for (int layer = 0; layer < g.num_layers; ++layer) {
      dk_.Upload(layers.k[layer]);
      dv_.Upload(layers.v[layer]);
      const KVInput in{DType::kFloat16, dk_.data(), dv_.data(), n, g.num_kv_heads, g.head_dim};
      const absl::Status s = gpu_->WriteKV(layer, gpu_slots_, in);
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  // The slots of the last AppendBatch in each cache.
  const std::vector<int64_t>& cpu_slots() const { return cpu_slots_; }
  const std::vector<int64_t>& gpu_slots() const { return gpu_slots_; }

  absl::Status Demote(const std::vector<BlockId>& blocks, int format) {
    const absl::Status g = gpu_->Demote(blocks, format);
    const absl::Status c = cpu_->Demote(blocks, format);
    EXPECT_EQ(c.code(), g.code()) << "cpu: " << c << " gpu: " << g;
    return g;
  }

  void Release(SequenceId seq) {
    EXPECT_TRUE(cpu_->Release(seq).ok());
    EXPECT_TRUE(gpu_->Release(seq).ok());
  }

  // Compares the block metadata of `seq`, its pages (defined bytes) when `pages`, and its
  // ReadKV output bitwise. Returns "" when all agree.
  std::string CompareSequence(SequenceId seq, bool pages = true) {
    const Geometry& g = options_.geometry;
    const std::vector<BlockId> blocks = cpu_->SequenceBlocks(seq).value();
    if (blocks != gpu_->SequenceBlocks(seq).value()) return "block lists differ";
    for (size_t i = 0; i < blocks.size(); ++i) {
      const BlockInfo a = cpu_->GetBlockInfo(blocks[i]).value();
      const BlockInfo b = gpu_->GetBlockInfo(blocks[i]).value();
      if (a.format != b.format || a.num_tokens != b.num_tokens) {
        return absl::StrCat("block ", i, ": format/tokens ", a.format, "/", a.num_tokens,
                            " vs ", b.format, "/", b.num_tokens);
      }
      if (!pages) continue;
      const PageLayout l = MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim,
                                          options_.palette[a.format]);
      for (int layer = 0; layer < g.num_layers; ++layer) {
        const PoolInfo pa = cpu_->GetPool(a.format, layer).value();
        const PoolInfo pb = gpu_->GetPool(b.format, layer).value();
        const std::string diff = ComparePage(
            l, a.num_tokens, static_cast<const uint8_t*>(pa.base) + int64_t{a.page} * l.page_bytes,
            static_cast<const uint8_t*>(pb.base) + int64_t{b.page} * l.page_bytes);
        if (!diff.empty()) {
          return absl::StrCat("block ", i, " (", FormatName(options_.palette[a.format]),
                              ", ", a.num_tokens, " tokens) layer ", layer, ": ", diff);
        }
      }
    }
    const int64_t length = cpu_->SequenceLength(seq).value();
    if (length != gpu_->SequenceLength(seq).value()) return "lengths differ";
    const size_t floats = static_cast<size_t>(length) * g.num_kv_heads * g.head_dim;
    std::vector<float> ck(floats), cv(floats), gk(floats), gv(floats);
    for (int layer = 0; layer < g.num_layers; ++layer) {
      absl::Status s = cpu_->ReadKV(seq, layer, absl::MakeSpan(ck), absl::MakeSpan(cv));
      if (!s.ok()) return absl::StrCat("cpu ReadKV: ", s.ToString());
      s = gpu_->ReadKV(seq, layer, absl::MakeSpan(gk), absl::MakeSpan(gv));
      if (!s.ok()) return absl::StrCat("gpu ReadKV: ", s.ToString());
      std::string diff = CompareFloats(ck, gk);
      if (diff.empty()) diff = CompareFloats(cv, gv);
      if (!diff.empty()) return absl::StrCat("ReadKV layer ", layer, ": ", diff);
    }
    return "";
  }

 private:
  CachePair() = default;

  Options options_;
  std::unique_ptr<Cache> cpu_;
  std::unique_ptr<Cache> gpu_;
  DeviceBuffer dk_, dv_;
  std::vector<int64_t> cpu_slots_, gpu_slots_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_GPU_CACHE_PAIR_H_
