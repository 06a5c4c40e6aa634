// `kvtier formats`: measures, through the library's own write and demotion paths, the
// relative error of every palette format on synthetic keys with outlier channels and on
// heavy-tailed values, and prints a Markdown table with bits per element (docs/formats.md).
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "examples/kvtier/commands.h"
#include "kernels/codec/half.h"
#include "kvtier/cache.h"
#include "src/relative_error.h"

namespace kvtier::tool {
namespace {

constexpr int kTokens = 16 * 64;

// Keys: per-head channel means, 4 outlier channels ~10x; values: Student-t-like tails.
void Synthesize(const Geometry& g, uint32_t seed, std::vector<uint16_t>* k, std::vector<uint16_t>* v) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  std::chi_squared_distribution<float> chi(3.f);
  const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
  k->resize(kTokens * row);
  v->resize(kTokens * row);
  std::vector<float> mean(row), gain(row, 1.f);
  for (size_t c = 0; c < row; ++c) mean[c] = 0.5f * n(rng);
  for (int h = 0; h < g.num_kv_heads; ++h) {
    for (int o = 0; o < 4; ++o) gain[h * g.head_dim + (rng() % g.head_dim)] = 10.f;
  }
  for (size_t i = 0; i < k->size(); ++i) {
    const size_t c = i % row;
    (*k)[i] = codec::FloatToHalf(gain[c] * (mean[c] + n(rng)));
    (*v)[i] = codec::FloatToHalf(n(rng) / std::sqrt(chi(rng) / 3.f));
  }
}

struct Measured {
  double k_error = 0, v_error = 0, bits = 0;
  bool ok = false;
};

// Writes the data in FP16 and demotes every block through `chain` (palette indices 1..).
Measured Measure(const std::vector<std::string>& chain, const std::vector<uint16_t>& k,
                 const std::vector<uint16_t>& v, const Geometry& g) {
  Options o;
  o.geometry = g;
  o.memory_budget_bytes = size_t{64} << 20;
  o.palette = {*ParseFormat("fp16")};
  for (const std::string& name : chain) o.palette.push_back(*ParseFormat(name));
  Measured m;
  auto cache = Cache::Create(o);
  if (!cache.ok()) return m;
  const KVInput kv{DType::kFloat16, k.data(), v.data(), kTokens, g.num_kv_heads, g.head_dim};
  if (!(*cache)->CalibrateTensorScales(0, kv).ok()) return m;
  const SequenceId seq = *(*cache)->AddSequence();
  std::vector<int64_t> slots;
  if (!(*cache)->Append(seq, kTokens, &slots).ok() || !(*cache)->WriteKV(0, slots, kv).ok()) return m;
  const std::vector<BlockId> blocks = *(*cache)->SequenceBlocks(seq);
  for (size_t f = 1; f < o.palette.size(); ++f) {
    if (!(*cache)->Demote(blocks, static_cast<int32_t>(f)).ok()) return m;
  }
  std::vector<float> gk(k.size()), gv(v.size());
  if (!(*cache)->ReadKV(seq, 0, absl::MakeSpan(gk), absl::MakeSpan(gv)).ok()) return m;
  m.k_error = RelativeErrorToHalf(gk, k);
  m.v_error = RelativeErrorToHalf(gv, v);
  m.bits = (*cache)->GetStats().effective_bits_per_element;
  m.ok = true;
  return m;
}

}  // namespace

int RunFormats(int argc, char** argv) {
  if (std::optional<int> code = RefuseOptions(
          "formats", "measured error and bits per element of every format (Markdown)", argc,
          argv)) {
    return *code;
  }
  const Geometry g{/*num_layers=*/1, /*num_kv_heads=*/8, /*head_dim=*/128, /*block_tokens=*/16};
  std::vector<uint16_t> k, v;
  Synthesize(g, 2026, &k, &v);
  std::printf("Relative L2 error of %d tokens x %d heads x head_dim %d (keys: 4 outlier channels "
              "per head at 10x; values: heavy-tailed), written as FP16 and demoted by kvtier.\n\n",
              kTokens, g.num_kv_heads, g.head_dim);
  std::printf("| format | bits/element | key error | value error |\n| --- | --- | --- | --- |\n");
  const std::vector<std::vector<std::string>> rows = {
      {}, {"bf16"},
      {"fp8_e4m3/tensor"}, {"fp8_e4m3/block_head"}, {"fp8_e4m3/token_head"},
      {"fp8_e5m2/tensor"}, {"fp8_e5m2/block_head"}, {"fp8_e5m2/token_head"},
      {"nvfp4/tensor"}, {"nvfp4/block_head"}, {"nvfp4_channel/block_head"},
      {"k:nvfp4_channel/block_head,v:nvfp4/block_head"},
      {"fp8_e4m3/block_head", "nvfp4/block_head"},
      {"fp8_e4m3/block_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"},
  };
  for (const auto& chain : rows) {
    std::string name = chain.empty() ? "fp16" : "";
    for (size_t i = 0; i < chain.size(); ++i) name += (i ? " -> " : "") + chain[i];
    const Measured m = Measure(chain, k, v, g);
    if (!m.ok) {
      std::fprintf(stderr, "kvtier formats: %s failed\n", name.c_str());
      return 1;
    }
    std::printf("| %s | %.3f | %.5f | %.5f |\n", name.c_str(), m.bits, m.k_error, m.v_error);
  }
  return 0;
}

}  // namespace kvtier::tool
