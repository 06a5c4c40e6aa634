// `kvtier demo`: creates a cache, serves a few sequences that share a prompt through Fork,
// writes and reads K/V, builds page tables, and prints what happened at each step.
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <vector>

#include "examples/kvtier/commands.h"
#include "kernels/codec/half.h"
#include "kvtier/cache.h"

namespace kvtier::tool {
namespace {

void PrintStats(const Cache& cache) {
  const CacheStats s = cache.GetStats();
  std::printf("  stats: %lld sequences, %lld tokens, %.2f%% of %lld MiB used, %lld/%lld slabs free\n",
              static_cast<long long>(s.sequences), static_cast<long long>(s.tokens),
              100 * s.usage_ratio, static_cast<long long>(s.budget_bytes >> 20),
              static_cast<long long>(s.slabs_free), static_cast<long long>(s.slabs_total));
  for (const FormatStats& f : s.formats) {
    std::printf("    %-12s %6lld blocks in use, %4lld slabs, %.3f bits/element\n", f.name.c_str(),
                static_cast<long long>(f.blocks_in_use), static_cast<long long>(f.slabs_mapped),
                f.bits_per_element);
  }
}

// Writes random K/V for `slots` into every layer.
bool WriteRandom(Cache& cache, const std::vector<int64_t>& slots, std::mt19937& rng) {
  const Geometry& g = cache.options().geometry;
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> k(slots.size() * g.num_kv_heads * g.head_dim), v(k.size());
  for (int l = 0; l < g.num_layers; ++l) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = codec::FloatToHalf(dist(rng));
      v[i] = codec::FloatToHalf(dist(rng));
    }
    const KVInput kv{DType::kFloat16, k.data(), v.data(), static_cast<int64_t>(slots.size()),
                     g.num_kv_heads, g.head_dim};
    const absl::Status s = cache.WriteKV(l, slots, kv);
    if (!s.ok()) {
      std::fprintf(stderr, "WriteKV: %s\n", s.ToString().c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int RunDemo(int argc, char** argv) {
  if (std::optional<int> code = RefuseOptions(
          "demo", "an end-to-end tour of the public API on the CPU backend", argc, argv)) {
    return *code;
  }
  Options options;
  options.geometry = Geometry{/*num_layers=*/4, /*num_kv_heads=*/8, /*head_dim=*/128,
                              /*block_tokens=*/16};
  options.memory_budget_bytes = size_t{64} << 20;
  std::printf("kvtier demo: CPU backend, %d layers x %d KV heads x head_dim %d, %d-token blocks, "
              "%zu MiB budget\n",
              options.geometry.num_layers, options.geometry.num_kv_heads, options.geometry.head_dim,
              options.geometry.block_tokens, options.memory_budget_bytes >> 20);
  absl::StatusOr<std::unique_ptr<Cache>> created = Cache::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "Cache::Create: %s\n", created.status().ToString().c_str());
    return 1;
  }
  Cache& cache = **created;
  std::mt19937 rng(7);
  std::vector<int64_t> slots;

  std::printf("1. a request with a 100-token prompt\n");
  const SequenceId prompt = *cache.AddSequence();
  if (!cache.Append(prompt, 100, &slots).ok() || !WriteRandom(cache, slots, rng)) return 1;
  PrintStats(cache);

  std::printf("2. three samples fork the prompt: full blocks are shared, the tail is copied on write\n");
  std::vector<SequenceId> samples;
  for (int i = 0; i < 3; ++i) samples.push_back(*cache.Fork(prompt));
  PrintStats(cache);

  std::printf("3. 40 decode steps: each sample appends one token per step\n");
  for (int step = 0; step < 40; ++step) {
    for (SequenceId s : samples) {
      slots.clear();
      const absl::Status st = cache.Append(s, 1, &slots);
      if (!st.ok() || !WriteRandom(cache, slots, rng)) {
        std::fprintf(stderr, "Append: %s\n", st.ToString().c_str());
        return 1;
      }
    }
    PageTables tables;
    if (!cache.BuildPageTables(samples, &tables).ok() || !cache.EndStep().ok()) return 1;
    if (step == 39) {
      std::printf("  page tables of the last step: seq_lens");
      for (int32_t n : tables.seq_lens) std::printf(" %d", n);
      std::printf(", %zu pages, last_page_len", tables.packed.size());
      for (int32_t n : tables.per_format[0].last_page_len) std::printf(" %d", n);
      std::printf("\n");
    }
  }
  std::printf("  copy-on-write tail blocks: %lld\n",
              static_cast<long long>(cache.GetStats().copy_on_write_blocks));
  PrintStats(cache);

  std::printf("4. read back sample 0, layer 0, decoded to FP32\n");
  const Geometry& g = options.geometry;
  const size_t n = 140 * static_cast<size_t>(g.num_kv_heads) * g.head_dim;
  std::vector<float> k(n), v(n);
  if (!cache.ReadKV(samples[0], 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok()) return 1;
  double sum = 0;
  for (float x : k) sum += x * x;
  std::printf("  140 tokens read, RMS of keys %.3f\n", std::sqrt(sum / n));

  std::printf("5. release everything and end the step: slabs return to the budget\n");
  for (SequenceId s : samples) (void)cache.Release(s);
  (void)cache.Release(prompt);
  if (!cache.EndStep().ok()) return 1;
  PrintStats(cache);
  const absl::Status check = cache.CheckConsistency();
  std::printf("consistency check: %s\n", check.ok() ? "OK" : check.ToString().c_str());
  return check.ok() ? 0 : 1;
}

}  // namespace kvtier::tool
