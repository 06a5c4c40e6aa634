// Host-tier bandwidth on the GPU (docs/tiers.md): offload (device -> pinned host, as eviction
// makes room) and onload (a prefix hit brings blocks back, until AddResult::ready_fence passes)
// of 256 blocks of a 32-layer, 8-head, 128-dim model, for FP16, FP8 and NVFP4 blocks, against
// the measured pinned host <-> device copy roof. A swap each (a prefix hit into a full
// device: blocks come up while others of the same format go down). Two cycles each: "cold" pins the host tier's slabs on first use
// (cudaHostRegister) and maps device slabs for the onload (the step settled, its empty slabs
// returned); "warm" repeats it with the host slabs pinned and brings the blocks back at once,
// into the device slabs that the released filler leaves mapped (a full device, as in serving).
// Writes JSON.
// Usage: kvtier_tier_bench OUT.json
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "kvtier/cache.h"
#include "kvtier/format.h"

namespace kvtier {
namespace {

constexpr int kBlocks = 256;
constexpr int kBlockTokens = 16;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Median GB/s of `runs` pinned copies of `bytes` in `kind`.
double RoofGbs(size_t bytes, cudaMemcpyKind kind) {
  void *host = nullptr, *device = nullptr;
  if (cudaMallocHost(&host, bytes) != cudaSuccess || cudaMalloc(&device, bytes) != cudaSuccess) return 0;
  std::vector<double> gbs;
  for (int i = 0; i < 12; ++i) {
    const auto t = std::chrono::steady_clock::now();
    if (kind == cudaMemcpyHostToDevice) {
      cudaMemcpyAsync(device, host, bytes, kind, nullptr);
    } else {
      cudaMemcpyAsync(host, device, bytes, kind, nullptr);
    }
    cudaStreamSynchronize(nullptr);
    if (i >= 2) gbs.push_back(bytes / Seconds(t) / 1e9);
  }
  cudaFreeHost(host);
  cudaFree(device);
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

// One offload and onload of the prompt's blocks.
struct Cycle {
  double offload_s = 0, onload_s = 0;
  int64_t blocks_down = 0, bytes_down = 0, bytes_up = 0, tokens_up = 0;
};

// A prefix hit into a full device: the hit's blocks come up while other cached blocks of the
// same format go down for their pages (no slab moves), both in one AddSequence.
struct Swap {
  double seconds = 0;
  int64_t blocks_down = 0, blocks_up = 0, bytes_down = 0, bytes_up = 0;
};

struct TierResult {
  std::string format;
  int64_t block_bytes = 0;  // all layers
  Cycle cold, warm;  // first cycle (host slabs pinned on first use), then the same again
  Swap swap;
};

// Exits with `what` and the status when it is not OK: a bench that measured nothing says so.
void Check(const absl::Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "tier_bench: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

// A private sequence (no token ids: never cached) of `pages` hot pages.
SequenceId Private(Cache& cache, int64_t pages) {
  const SequenceId id = cache.AddSequence().value();
  std::vector<int64_t> slots;
  if (pages > 0) Check(cache.Append(id, pages * kBlockTokens, &slots), "a filler's append");
  return id;
}

// Closes a step and waits for the device, so that every retired page is back in its pool.
void Settle(Cache& cache) {
  Check(cache.EndStep(), "EndStep");
  cudaDeviceSynchronize();
  Check(cache.EndStep(), "EndStep");
}

// F2 (a private sequence of `f2_pages`) pushes the cached prompt down; a prefix hit brings
// it back, until its ready fence passes (after settling the step when `settle`).
Cycle RunCycle(Cache& cache, const std::vector<int32_t>& prompt, int64_t f2_pages, bool settle) {
  Cycle c;
  const CacheStats before = cache.GetStats();
  cudaDeviceSynchronize();
  auto t = std::chrono::steady_clock::now();
  const SequenceId f2 = Private(cache, f2_pages);
  cudaDeviceSynchronize();
  c.offload_s = Seconds(t);
  const CacheStats down = cache.GetStats();
  c.blocks_down = down.host.offloaded_blocks - before.host.offloaded_blocks;
  c.bytes_down = down.host.bytes_offloaded - before.host.bytes_offloaded;
  if (c.blocks_down != kBlocks) {
    std::fprintf(stderr, "tier_bench: %lld blocks offloaded, not %d\n",
                 static_cast<long long>(c.blocks_down), kBlocks);
  }
  Check(cache.Release(f2), "Release");
  if (settle) Settle(cache);
  SequenceOptions options;
  options.prompt = prompt;
  t = std::chrono::steady_clock::now();
  absl::StatusOr<AddResult> added = cache.AddSequence(options);
  Check(added.status(), "the prefix hit");
  while (!cache.FencePassed(added->ready_fence).value()) {
  }
  c.onload_s = Seconds(t);
  c.bytes_up = cache.GetStats().host.bytes_onloaded - down.host.bytes_onloaded;
  c.tokens_up = added->host_tokens;
  Check(cache.Release(added->id), "Release");
  Settle(cache);
  return c;
}

// Prompt tokens first, first + 1, ...: kBlocks full blocks and one token more.
std::vector<int32_t> Prompt(int32_t first) {
  std::vector<int32_t> prompt(kBlocks * kBlockTokens + 1);
  std::iota(prompt.begin(), prompt.end(), first);
  return prompt;
}

// Computes `prompt` and leaves its full blocks cached in `format`.
void CachePrompt(Cache& cache, const std::vector<int32_t>& prompt, int format) {
  const SequenceId id = cache.AddSequence().value();
  std::vector<int64_t> slots;
  Check(cache.AppendTokens(id, prompt, &slots), "the prompt's append");
  std::vector<BlockId> blocks = cache.SequenceBlocks(id).value();
  blocks.pop_back();
  if (format > 0) Check(cache.Demote(blocks, format), "Demote");
  Check(cache.Release(id), "Release");
}

// A private filler of every free page of the hot format.
SequenceId FillDevice(Cache& cache) {
  const CacheStats s = cache.GetStats();
  const int64_t per_slab = s.slab_bytes / s.formats[0].page_bytes;
  return Private(cache, s.slabs_free * per_slab + s.formats[0].pages_mapped - s.formats[0].pages_used);
}

// A prefix hit on `prompt`, timed until its ready fence passes, then released.
Swap TimedHit(Cache& cache, const std::vector<int32_t>& prompt) {
  const CacheStats before = cache.GetStats();
  SequenceOptions options;
  options.prompt = prompt;
  const auto t = std::chrono::steady_clock::now();
  absl::StatusOr<AddResult> added = cache.AddSequence(options);
  Check(added.status(), "the prefix hit");
  while (!cache.FencePassed(added->ready_fence).value()) {
  }
  Swap w;
  w.seconds = Seconds(t);
  const CacheStats after = cache.GetStats();
  w.blocks_down = after.host.offloaded_blocks - before.host.offloaded_blocks;
  w.blocks_up = after.host.onloaded_blocks - before.host.onloaded_blocks;
  w.bytes_down = after.host.bytes_offloaded - before.host.bytes_offloaded;
  w.bytes_up = after.host.bytes_onloaded - before.host.bytes_onloaded;
  Check(cache.Release(added->id), "Release");
  Settle(cache);
  return w;
}

// P and Q cached in `format`, both pushed down; P brought back and the device filled; then
// the measured swap: a hit on Q brings it up and sends P down.
Swap MeasureSwap(const Options& base, int format) {
  std::unique_ptr<Cache> cache = Cache::Create(base).value();
  const std::vector<int32_t> p = Prompt(1), q = Prompt(1 << 20);
  CachePrompt(*cache, p, format);
  CachePrompt(*cache, q, format);
  Settle(*cache);
  const SequenceId f1 = FillDevice(*cache);
  Settle(*cache);
  const CacheStats s = cache->GetStats();
  const int64_t per_slab = s.slab_bytes / s.formats[0].page_bytes;
  const SequenceId f2 =
      Private(*cache, format == 0 ? 2 * kBlocks : s.formats[format].slabs_mapped * per_slab);
  Check(cache->Release(f2), "Release");
  Settle(*cache);
  TimedHit(*cache, p);
  const SequenceId f3 = FillDevice(*cache);
  Settle(*cache);
  const Swap swap = TimedHit(*cache, q);
  Check(cache->Release(f3), "Release");
  Check(cache->Release(f1), "Release");
  return swap;
}

TierResult Measure(const Options& base, int format) {
  TierResult r;
  r.format = FormatName(base.palette[format]);
  std::unique_ptr<Cache> cache = Cache::Create(base).value();
  // P: kBlocks cached blocks of `format` (the bytes they hold do not change the copy). F1
  // takes every free page; F2 needs P's pages (FP16) or the slabs P holds (colder formats), so
  // all of P goes down.
  const std::vector<int32_t> prompt = Prompt(1);
  CachePrompt(*cache, prompt, format);
  Settle(*cache);
  const SequenceId f1 = FillDevice(*cache);
  Settle(*cache);
  const CacheStats s = cache->GetStats();
  const int64_t per_slab = s.slab_bytes / s.formats[0].page_bytes;
  const int64_t f2_pages = format == 0 ? kBlocks : s.formats[format].slabs_mapped * per_slab;
  r.cold = RunCycle(*cache, prompt, f2_pages, /*settle=*/true);
  r.warm = RunCycle(*cache, prompt, f2_pages, /*settle=*/false);
  r.block_bytes = r.cold.bytes_down / std::max<int64_t>(1, r.cold.blocks_down);
  for (const Cycle* c : {&r.cold, &r.warm}) {
    std::fprintf(stderr, "%s %s: offloaded %lld blocks in %.2f ms, onloaded %lld tokens in %.2f ms\n",
                 r.format.c_str(), c == &r.cold ? "cold" : "warm", static_cast<long long>(c->blocks_down),
                 c->offload_s * 1e3, static_cast<long long>(c->tokens_up), c->onload_s * 1e3);
  }
  Check(cache->Release(f1), "Release");
  cache.reset();
  r.swap = MeasureSwap(base, format);
  std::fprintf(stderr, "%s swap: %lld blocks down, %lld up in %.2f ms\n", r.format.c_str(),
               static_cast<long long>(r.swap.blocks_down), static_cast<long long>(r.swap.blocks_up),
               r.swap.seconds * 1e3);
  return r;
}

// A swap as JSON: its time against the roofs' time for its bytes, and tokens moved per second
// (both ways) against FP16's.
void PrintSwap(FILE* out, const Swap& w, double h2d, double d2h, const Swap& fp16) {
  const double roof_s = w.bytes_down / (d2h * 1e9) + w.bytes_up / (h2d * 1e9);
  auto tokens_per_s = [](const Swap& x) { return (x.blocks_down + x.blocks_up) * kBlockTokens / x.seconds; };
  std::fprintf(out,
               "\"swap\": {\"blocks_down\": %lld, \"blocks_up\": %lld, \"ms\": %.2f, "
               "\"pct_of_roof\": %.1f, \"tokens_per_s\": %.0f, \"tokens_per_s_vs_fp16\": %.2f}",
               static_cast<long long>(w.blocks_down), static_cast<long long>(w.blocks_up),
               w.seconds * 1e3, 100 * roof_s / w.seconds, tokens_per_s(w),
               tokens_per_s(w) / tokens_per_s(fp16));
}

// One cycle as JSON, its rates against the roofs and FP16's onload tokens/s.
void PrintCycle(FILE* out, const char* name, const Cycle& c, double h2d, double d2h, const Cycle& fp16) {
  const double down_gbs = c.bytes_down / c.offload_s / 1e9, up_gbs = c.bytes_up / c.onload_s / 1e9;
  const double down_tps = c.blocks_down * kBlockTokens / c.offload_s, up_tps = c.tokens_up / c.onload_s;
  std::fprintf(out,
               "\"%s\": {\"offloaded_blocks\": %lld, \"offload_ms\": %.2f, \"offload_gb_per_s\": %.2f, "
               "\"offload_pct_of_roof\": %.1f, \"onload_ms\": %.2f, \"onload_gb_per_s\": %.2f, "
               "\"onload_pct_of_roof\": %.1f, \"offload_tokens_per_s\": %.0f, \"onload_tokens_per_s\": %.0f, "
               "\"offload_tokens_per_s_vs_fp16\": %.2f, \"onload_tokens_per_s_vs_fp16\": %.2f}",
               name, static_cast<long long>(c.blocks_down), c.offload_s * 1e3, down_gbs, 100 * down_gbs / d2h,
               c.onload_s * 1e3, up_gbs, 100 * up_gbs / h2d, down_tps, up_tps,
               down_tps / (fp16.blocks_down * kBlockTokens / fp16.offload_s),
               up_tps / (fp16.tokens_up / fp16.onload_s));
}

int Main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.json\n", argv[0]);
    return 2;
  }
  Options o;
  o.geometry = Geometry{32, 8, 128, kBlockTokens};  // 2 MiB per FP16 block, all layers
  o.palette = {ParseFormat("fp16").value(), ParseFormat("fp8_e4m3/block_head").value(),
               ParseFormat("k:nvfp4_channel/block_head,v:nvfp4/block_head").value()};
  o.memory_budget_bytes = size_t{2} << 30;
  o.host_tier_bytes = size_t{2} << 30;  // room for two prompts of FP16 blocks (the swap)
  o.backend = BackendKind::kCuda;
  const double h2d = RoofGbs(size_t{512} << 20, cudaMemcpyHostToDevice);
  const double d2h = RoofGbs(size_t{512} << 20, cudaMemcpyDeviceToHost);
  std::vector<TierResult> results;
  for (int f = 0; f < 3; ++f) results.push_back(Measure(o, f));
  FILE* out = std::fopen(argv[1], "w");
  if (out == nullptr) return 1;
  std::fprintf(out, "{\n  \"pinned_roof_gb_per_s\": {\"h2d\": %.2f, \"d2h\": %.2f},\n  \"blocks\": %d,\n  \"tiers\": [",
               h2d, d2h, kBlocks);
  for (size_t i = 0; i < results.size(); ++i) {
    const TierResult& r = results[i];
    std::fprintf(out, "%s\n    {\"format\": \"%s\", \"block_bytes\": %lld,\n     ", i ? "," : "",
                 r.format.c_str(), static_cast<long long>(r.block_bytes));
    PrintCycle(out, "cold", r.cold, h2d, d2h, results[0].cold);
    std::fprintf(out, ",\n     ");
    PrintCycle(out, "warm", r.warm, h2d, d2h, results[0].warm);
    std::fprintf(out, ",\n     ");
    PrintSwap(out, r.swap, h2d, d2h, results[0].swap);
    std::fprintf(out, "}");
  }
  std::fprintf(out, "\n  ]\n}\n");
  std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) { return kvtier::Main(argc, argv); }
