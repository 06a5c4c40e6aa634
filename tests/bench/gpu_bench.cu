// GPU benchmarks of the CUDA data plane, reported against the device-to-device copy roof
// measured in the same run (bytes read + written over time, CUDA events, median of many runs
// after warm-up, random data several times larger than L2):
//   - copy roof: cudaMemcpyAsync of 4 GiB;
//   - migration: FP16 -> FP8 (fp8_e4m3/block_head) and FP16 -> NVFP4 (nvfp4/block_head), and
//     a few other pairs, over 32 layers x 1024 blocks x 8 heads x 128 x 16 tokens (2 GiB of
//     FP16 pages), one launch each;
//   - append: batch 256 x 1 token (decode) and 256 x 512 tokens (prefill) into FP16 pages, the
//     kernel alone and through CudaBackend::WriteRows (with slot staging); and 256 x 1 token into
//     each of 32 layers in one launch (LaunchWriteLayers), alone, through a cache's
//     PreparedAppend (Update + WriteKVLayers) and replayed from a CUDA graph;
//   - decode attention: the streaming read roof (4 GiB), and the fused decode kernel for FP16,
//     FP8, NVFP4 and the balanced mix over batch {1, 8, 64, 256} x context {1K, 8K, 32K, 128K},
//     8 KV / 32 query heads, head_dim 128, 16-token pages in shuffled order, reported as bytes
//     read (K/V rows, micro-scales, scales) over time against the read roof; at batch 64 x 32K
//     and batch 1 x 128K also with page weights (`..._page_weight`; `..._page_weight_zeroed`
//     zeroes them before each call), as a cache with rotated keys runs it (`..._rotated`), and
//     both (`..._rotated_page_weight`), timed in turns (a call of each variant per round, so
//     that the variants compare); batch 1 also 32 calls back to back (`..._back_to_back`) and
//     32 calls captured in a CUDA graph, replayed (`..._graph`), and batch 8 x 32K and 128K 32
//     calls back to back.
// Usage: kvtier_gpu_bench OUT.json [--decode-only | --data-plane-only |
//                                  --only CASE BATCH CONTEXT [--shared-pages N]]
//   --decode-only skips migration and append; --data-plane-only runs the copy roof, migration
//   and append alone; --only times one decode shape and the read roof alone (for profilers),
//   e.g. `--only fp8_e4m3_block_head 64 8192`. --shared-pages N draws every sequence's pages of
//   a format, each sequence in its own order, from N pages (as sequences sharing a prefix do;
//   the rows gain `_sharedN`). With N small enough for the pages to stay in L2 (a page of 8
//   heads is 18 KB in NVFP4, 64 KB in FP16), the kernel runs its grid and pages per warp as
//   from memory, but its loads hit L2: the row times its instruction issue rather than the
//   memory's bandwidth, which bounds NVFP4 on the H200 (docs/benchmarks.md, session 24) and can
//   be measured so on an H100, whose slower memory hides it.
// Beside each row, the mean SM clock while it was timed and the share of that time the board's
// power or thermal limits held the clock down (SmClockSampler, from the driver's NVML): rows bound
// by instruction issue slow down with the clock, which long runs of heavy rows lower.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/data_plane.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/page_layout.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/page_tables.h"
#include "kvtier/prepared_append.h"
#include "src/cuda/cuda_backend.h"
#include "tests/bench/sm_clock_sampler.h"

namespace kvtier {
namespace {

#define CHECK_CUDA(call)                                                               \
  do {                                                                                 \
    const cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(e_));                                            \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// Random FP16 values (never zero), keys with outlier channels 10x; `channels` is head_dim.
__global__ void FillHalves(uint16_t* out, size_t n, uint32_t seed, int channels) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    // Sum of four uniforms: roughly normal, in [-2, 2).
    float x = ((h & 0xFF) + ((h >> 8) & 0xFF) + ((h >> 16) & 0xFF) + (h >> 24)) / 255.f - 2.f;
    if (x == 0.f) x = 0.25f;
    if ((i % channels) % 29 == 3) x *= 10.f;
    out[i] = __half_as_ushort(__float2half_rn(x));
  }
}

void Fill(void* p, size_t bytes, uint32_t seed, int channels) {
  FillHalves<<<4096, 256>>>(static_cast<uint16_t*>(p), bytes / 2, seed, channels);
  CHECK_CUDA(cudaGetLastError());
}

// The SM clock while rows are timed (set by Main; null: not sampled), and what it saw while the
// last rows were (a Result made after their timing takes it).
SmClockSampler* g_clocks = nullptr;
ClockWindow g_last_clocks;

// Median milliseconds per invocation of each of `fns` on `stream`: `runs` rounds, each timing
// one call of every fn in turn (inner[i] back-to-back invocations of fns[i] between two events),
// after `warmup` untimed rounds. Taking turns puts a slow spell of the GPU (clocks, heat after
// the rows before) on every fn alike, not on the first: rows timed together compare. The SM
// clock over the timed rounds goes to g_last_clocks.
std::vector<double> MedianMsInTurns(cudaStream_t stream, int warmup, int runs,
                                    const std::vector<int>& inner,
                                    const std::vector<std::function<void()>>& fns) {
  for (int i = 0; i < warmup; ++i) {
    for (const auto& fn : fns) fn();
  }
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<std::vector<double>> ms(fns.size());
  if (g_clocks != nullptr) g_clocks->Start();
  for (int r = 0; r < runs; ++r) {
    for (size_t f = 0; f < fns.size(); ++f) {
      CHECK_CUDA(cudaEventRecord(a, stream));
      for (int i = 0; i < inner[f]; ++i) fns[f]();
      CHECK_CUDA(cudaEventRecord(b, stream));
      CHECK_CUDA(cudaEventSynchronize(b));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
      ms[f].push_back(static_cast<double>(t) / inner[f]);
    }
  }
  if (g_clocks != nullptr) g_last_clocks = g_clocks->Stop();
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::vector<double> medians;
  for (std::vector<double>& m : ms) {
    std::sort(m.begin(), m.end());
    medians.push_back(m[m.size() / 2]);
  }
  return medians;
}

// The same for one fn.
double MedianMs(cudaStream_t stream, int warmup, int runs, int inner, std::function<void()> fn) {
  return MedianMsInTurns(stream, warmup, runs, {inner}, {std::move(fn)})[0];
}

struct Result {
  std::string name;
  double bytes;  // read + written per invocation
  double ms;     // median per invocation
  ClockWindow clocks = g_last_clocks;  // while it was timed: made right after its timing
  double tbs() const { return bytes / (ms * 1e-3) / 1e12; }
};

std::string Json(const std::vector<Result>& rs, double roof, const char* roof_name = "copy") {
  std::string s = "[";
  for (size_t i = 0; i < rs.size(); ++i) {
    char line[512];
    std::snprintf(line, sizeof(line),
                  "%s\n    {\"name\": \"%s\", \"bytes\": %.0f, \"median_ms\": %.6f, "
                  "\"tb_per_s\": %.4f, \"pct_of_%s_roof\": %.2f, \"sm_mhz\": %.0f, "
                  "\"clock_capped_pct\": %.1f}",
                  i ? "," : "", rs[i].name.c_str(), rs[i].bytes, rs[i].ms, rs[i].tbs(), roof_name,
                  100.0 * rs[i].tbs() / roof, rs[i].clocks.mean_sm_mhz,
                  100.0 * rs[i].clocks.capped_fraction);
    s += line;
  }
  return s + "\n  ]";
}

double CopyRoof(cudaStream_t stream, std::vector<Result>* out) {
  const size_t bytes = size_t{4} << 30;
  void *src, *dst;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  Fill(src, bytes, 1, 128);
  CHECK_CUDA(cudaDeviceSynchronize());
  const double ms = MedianMs(stream, 3, 25, 1, [&] {
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
  out->push_back({"copy_4GiB_d2d", 2.0 * bytes, ms});
  return out->back().tbs();
}

// Requantises `blocks` full blocks of every layer from `from` to `to` (pages in shuffled
// order, as a cache's would be) and times the single launch.
Result Migration(cudaStream_t stream, const char* from, const char* to, bool fast,
                 const char* name,
                 gpu::RequantizeVariant variant = gpu::RequantizeVariant::kAuto) {
  constexpr int kLayers = 32, kHeads = 8, kDim = 128, kTokens = 16, kBlocks = 1024;
  const PageLayout src = MakePageLayout(kHeads, kTokens, kDim, ParseFormat(from).value());
  const PageLayout dst = MakePageLayout(kHeads, kTokens, kDim, ParseFormat(to).value());
  const size_t src_layer = size_t{src.page_bytes} * kBlocks;
  const size_t dst_layer = size_t{dst.page_bytes} * kBlocks;
  uint8_t *src_pool, *dst_pool;
  CHECK_CUDA(cudaMalloc(&src_pool, src_layer * kLayers));
  CHECK_CUDA(cudaMalloc(&dst_pool, dst_layer * kLayers));
  // Source pages: FP16 random data, or (for a quantised source) FP16 data demoted first.
  std::vector<gpu::LayerPools> layers(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    layers[l].src = src_pool + l * src_layer;
    layers[l].dst = dst_pool + l * dst_layer;
  }
  std::vector<uint32_t> pages(kBlocks), order(kBlocks);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::iota(pages.begin(), pages.end(), 0u);
  gpu::LayerPools* d_layers;
  uint32_t *d_src, *d_dst;
  CHECK_CUDA(cudaMalloc(&d_layers, sizeof(gpu::LayerPools) * kLayers));
  CHECK_CUDA(cudaMalloc(&d_src, sizeof(uint32_t) * kBlocks));
  CHECK_CUDA(cudaMalloc(&d_dst, sizeof(uint32_t) * kBlocks));
  CHECK_CUDA(cudaMemcpy(d_layers, layers.data(), sizeof(gpu::LayerPools) * kLayers,
                        cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_src, order.data(), sizeof(uint32_t) * kBlocks, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_dst, pages.data(), sizeof(uint32_t) * kBlocks, cudaMemcpyHostToDevice));
  gpu::RequantizeParams p;
  p.src = src;
  p.dst = dst;
  p.layers = d_layers;
  p.src_pages = d_src;
  p.dst_pages = d_dst;
  p.num_layers = kLayers;
  p.num_blocks = kBlocks;
  p.fast = fast;
  p.variant = variant;
  if (src.k.type == ElementType::kFp16) {
    Fill(src_pool, src_layer * kLayers, 2, kDim);
  } else {
    // Build real pages of the source format from FP16 data through the kernel itself.
    const PageLayout fp16 = MakePageLayout(kHeads, kTokens, kDim, ParseFormat("fp16").value());
    uint8_t* tmp;
    CHECK_CUDA(cudaMalloc(&tmp, size_t{fp16.page_bytes} * kBlocks * kLayers));
    Fill(tmp, size_t{fp16.page_bytes} * kBlocks * kLayers, 3, kDim);
    std::vector<gpu::LayerPools> pre(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      pre[l].src = tmp + l * size_t{fp16.page_bytes} * kBlocks;
      pre[l].dst = src_pool + l * src_layer;
    }
    CHECK_CUDA(cudaMemcpy(d_layers, pre.data(), sizeof(gpu::LayerPools) * kLayers,
                          cudaMemcpyHostToDevice));
    gpu::RequantizeParams q = p;
    q.src = fp16;
    q.dst = src;
    CHECK_CUDA(gpu::LaunchRequantize(q, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaFree(tmp));
    CHECK_CUDA(cudaMemcpy(d_layers, layers.data(), sizeof(gpu::LayerPools) * kLayers,
                          cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  const double ms =
      MedianMs(stream, 2, 15, 1, [&] { CHECK_CUDA(gpu::LaunchRequantize(p, stream)); });
  CHECK_CUDA(cudaFree(src_pool));
  CHECK_CUDA(cudaFree(dst_pool));
  CHECK_CUDA(cudaFree(d_layers));
  CHECK_CUDA(cudaFree(d_src));
  CHECK_CUDA(cudaFree(d_dst));
  return {name, double(src.page_bytes + dst.page_bytes) * kBlocks * kLayers, ms};
}

// Appends `seqs` x `tokens` rows into an FP16 pool (8 heads x 128, 16-token pages): each
// sequence owns tokens / 16 (at least one) pages spread over the pool; decode (tokens == 1)
// writes at a random offset of its page.
void Append(cudaStream_t stream, CudaBackend* backend, int seqs, int tokens, const char* name,
            std::vector<Result>* out) {
  constexpr int kHeads = 8, kDim = 128, kTokens = 16;
  const PageLayout l = MakePageLayout(kHeads, kTokens, kDim, ParseFormat("fp16").value());
  const int pages_per_seq = std::max(1, tokens / kTokens);
  const int pages = seqs * pages_per_seq * 2;  // half of the pool stays unused
  const int64_t rows = int64_t{seqs} * tokens;
  std::vector<uint32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0u);
  std::mt19937 rng(11);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<gpu::RowSlot> slots(rows);
  std::vector<int64_t> cache_slots(rows);
  for (int s = 0; s < seqs; ++s) {
    for (int t = 0; t < tokens; ++t) {
      const uint32_t page = perm[s * pages_per_seq + t / kTokens];
      const uint32_t token = tokens == 1 ? rng() % kTokens : t % kTokens;
      slots[int64_t{s} * tokens + t] = {page, token};
      cache_slots[int64_t{s} * tokens + t] = int64_t{page} * kTokens + token;
    }
  }
  uint8_t* pool;
  void *k, *v, *d_slots;
  const size_t in_bytes = size_t(rows) * kHeads * kDim * 2;
  CHECK_CUDA(cudaMalloc(&pool, size_t{l.page_bytes} * pages));
  CHECK_CUDA(cudaMalloc(&k, in_bytes));
  CHECK_CUDA(cudaMalloc(&v, in_bytes));
  CHECK_CUDA(cudaMalloc(&d_slots, sizeof(gpu::RowSlot) * rows));
  Fill(k, in_bytes, 4, kDim);
  Fill(v, in_bytes, 5, kDim);
  CHECK_CUDA(cudaMemcpy(d_slots, slots.data(), sizeof(gpu::RowSlot) * rows,
                        cudaMemcpyHostToDevice));
  unsigned long long* nonfinite;
  CHECK_CUDA(cudaMalloc(&nonfinite, sizeof(*nonfinite)));
  CHECK_CUDA(cudaDeviceSynchronize());
  gpu::WriteRowsParams p;
  p.base = pool;
  p.layout = l;
  p.slots = static_cast<const gpu::RowSlot*>(d_slots);
  p.num_rows = rows;
  p.k = k;
  p.v = v;
  p.nonfinite = nonfinite;
  const double bytes = 4.0 * in_bytes;  // K and V read, then written
  const int inner = rows < 4096 ? 100 : 1;
  const double kernel_ms =
      MedianMs(stream, 3, 25, inner, [&] { CHECK_CUDA(gpu::LaunchWriteRows(p, stream)); });
  out->push_back({std::string(name) + "_kernel", bytes, kernel_ms});
  // Through the backend: host slot conversion, staging and upload included.
  PoolView view{pool, l, 1.f, 1.f};
  KVInput in{DType::kFloat16, k, v, rows, kHeads, kDim};
  static int64_t count = 0;  // the backend keeps the pointer
  const double backend_ms = MedianMs(backend->stream(), 3, 25, inner, [&] {
    const absl::Status s = backend->WriteRows(view, cache_slots, in, &count);
    if (!s.ok()) {
      std::fprintf(stderr, "WriteRows: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  });
  out->push_back({std::string(name) + "_backend", bytes, backend_ms});
  CHECK_CUDA(cudaFree(pool));
  CHECK_CUDA(cudaFree(k));
  CHECK_CUDA(cudaFree(v));
  CHECK_CUDA(cudaFree(d_slots));
  CHECK_CUDA(cudaFree(nonfinite));
}


// Appends 256 sequences x 1 token to each of 32 layers (Append's decode case in every layer):
// one launch of LaunchWriteLayers over 32 FP16 pools ("_kernel"); and through a 32-layer CUDA
// cache's PreparedAppend on `stream`, Update + WriteKVLayers per step ("_backend": slot checks,
// pool table, upload and the stream joins included) and WriteKVLayers captured in a CUDA graph
// and replayed ("_graph").
void AppendLayers(cudaStream_t stream, int sms, std::vector<Result>* out) {
  constexpr int kLayers = 32, kSeqs = 256, kHeads = 8, kDim = 128, kTokens = 16;
  const PageLayout l = MakePageLayout(kHeads, kTokens, kDim, ParseFormat("fp16").value());
  const int pages = kSeqs * 2;  // per layer; half of each pool stays unused
  std::vector<uint32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0u);
  std::mt19937 rng(13);
  std::shuffle(perm.begin(), perm.end(), rng);
  // The device buffer of the kernel: the row count, the slots, the pools.
  const size_t pools_at = sizeof(int64_t) + kSeqs * sizeof(gpu::RowSlot);
  std::vector<uint8_t> host(pools_at + kLayers * sizeof(gpu::AppendPool));
  const int64_t rows = kSeqs;
  std::memcpy(host.data(), &rows, sizeof(rows));
  auto* slots = reinterpret_cast<gpu::RowSlot*>(host.data() + sizeof(int64_t));
  for (int s = 0; s < kSeqs; ++s) slots[s] = {perm[s], static_cast<uint32_t>(rng() % kTokens)};
  uint8_t *pool, *buffer;
  void *k, *v;
  unsigned long long* nonfinite;
  const size_t layer_in = size_t{kSeqs} * kHeads * kDim * 2;
  CHECK_CUDA(cudaMalloc(&pool, size_t{l.page_bytes} * pages * kLayers));
  CHECK_CUDA(cudaMalloc(&buffer, host.size()));
  CHECK_CUDA(cudaMalloc(&k, layer_in * kLayers));
  CHECK_CUDA(cudaMalloc(&v, layer_in * kLayers));
  CHECK_CUDA(cudaMalloc(&nonfinite, sizeof(*nonfinite)));
  Fill(k, layer_in * kLayers, 6, kDim);
  Fill(v, layer_in * kLayers, 7, kDim);
  auto* pools = reinterpret_cast<gpu::AppendPool*>(host.data() + pools_at);
  for (int i = 0; i < kLayers; ++i) pools[i] = {pool + size_t{l.page_bytes} * pages * i, 1.f, 1.f};
  CHECK_CUDA(cudaMemcpy(buffer, host.data(), host.size(), cudaMemcpyHostToDevice));
  gpu::WriteLayersParams p;
  p.layout = l;
  p.pools = reinterpret_cast<const gpu::AppendPool*>(buffer + pools_at);
  p.slots = reinterpret_cast<const gpu::RowSlot*>(buffer + sizeof(int64_t));
  p.num_rows = reinterpret_cast<const int64_t*>(buffer);
  p.max_rows = kSeqs;
  p.num_layers = kLayers;
  p.nonfinite = nonfinite;
  p.num_sms = sms;
  std::vector<KVInput> inputs;
  for (int i = 0; i < kLayers; ++i) {
    p.k[i] = static_cast<const uint8_t*>(k) + layer_in * i;
    p.v[i] = static_cast<const uint8_t*>(v) + layer_in * i;
    inputs.push_back({DType::kFloat16, p.k[i], p.v[i], kSeqs, kHeads, kDim});
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  const double bytes = 4.0 * layer_in * kLayers;  // K and V read, then written
  const std::string name = "append_fp16_batch256x1x32layers";
  out->push_back({name + "_kernel", bytes, MedianMs(stream, 3, 25, 100, [&] {
                    CHECK_CUDA(gpu::LaunchWriteLayers(p, stream));
                  })});
  CHECK_CUDA(cudaFree(pool));

  Options o;
  o.geometry = Geometry{kLayers, kHeads, kDim, kTokens};
  o.backend = BackendKind::kCuda;
  o.memory_budget_bytes = size_t{1} << 30;
  const auto check = [](const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "append through PreparedAppend: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  };
  absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
  check(cache.status());
  std::vector<int64_t> last, slots_of_seq;  // each sequence's last token
  for (int s = 0; s < kSeqs; ++s) {
    const SequenceId seq = (*cache)->AddSequence().value();
    slots_of_seq.clear();
    check((*cache)->Append(seq, 1 + rng() % kTokens, &slots_of_seq));
    last.push_back(slots_of_seq.back());
  }
  {
    absl::StatusOr<PreparedAppend> step = PreparedAppend::Create(**cache, kSeqs, {stream});
    check(step.status());
    out->push_back({name + "_backend", bytes, MedianMs(stream, 3, 25, 100, [&] {
                      check(step->Update(last));
                      check(WriteKVLayers(**cache, *step, inputs, {stream}));
                    })});
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status captured = WriteKVLayers(**cache, *step, inputs, {stream});
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    check(captured);
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    out->push_back({name + "_graph", bytes, MedianMs(stream, 3, 25, 100, [&] {
                      CHECK_CUDA(cudaGraphLaunch(exec, stream));
                    })});
    check(step->AfterGraphLaunch());
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaGraphExecDestroy(exec));
    CHECK_CUDA(cudaGraphDestroy(graph));
  }  // the step frees its buffers on the stream
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (void* ptr : {static_cast<void*>(buffer), k, v, static_cast<void*>(nonfinite)}) {
    CHECK_CUDA(cudaFree(ptr));
  }
}

// Streaming read roof: 4 GiB read once with 16-byte loads (the ceiling of decode attention).
__global__ void ReadAll(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t x = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x12345678u) *sink = x;  // keeps the loads
}

double ReadRoof(cudaStream_t stream, int sms, std::vector<Result>* out) {
  const size_t bytes = size_t{4} << 30;
  void* src;
  uint32_t* sink;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  Fill(src, bytes, 2, 128);
  CHECK_CUDA(cudaDeviceSynchronize());
  const double ms = MedianMs(stream, 3, 25, 1, [&] {
    ReadAll<<<sms * 8, 512, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  });
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(sink));
  out->push_back({"read_4GiB", static_cast<double>(bytes), ms});
  return out->back().tbs();
}

// Random bytes with bit 6 of each cleared: finite in every format (no FP16 or FP32 Inf/NaN
// exponent, no E4M3 NaN code).
__global__ void FillPageBytes(uint32_t* out, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    out[i] = h & 0xBFBFBFBFu;
  }
}

// Overwrites the FP32 scales of every page (`count` floats at `offset`) with values in
// [2^-7, 2^-6), as amax / 448 of activations would be: random bits would spread them over 2^127
// and make every page look like an outlier to the decode kernel.
__global__ void FillPageScales(uint8_t* pool, size_t pages, uint32_t page_bytes, uint32_t offset,
                               uint32_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < pages * count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = (static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed) >> 8;
    float* scale = reinterpret_cast<float*>(pool + (i / count) * page_bytes + offset) + i % count;
    *scale = 0.0078125f * (1.f + static_cast<float>(h & 0xFFFF) / 65536.f);
  }
}

// Bytes the decode kernel reads from one page for one KV head: K and V rows, micro-scales,
// FP32 scales.
double PageHeadBytes(const PageLayout& l) {
  double bytes = 0;
  for (const CodecLayout* c : {&l.k, &l.v}) {
    bytes += static_cast<double>(l.tokens) * c->row_bytes;
    if (c->type == ElementType::kNvfp4) bytes += static_cast<double>(l.tokens) * l.head_dim / 16;
    if (c->scope == ScaleScope::kBlockHead) bytes += 4;
    if (c->scope == ScaleScope::kTokenHead) bytes += 4.0 * l.tokens;
  }
  return bytes;
}

// A decode palette and the format of page i of a sequence of n pages.
struct DecodeCase {
  const char* name;
  std::vector<const char*> palette;
  int (*format_of)(int64_t page, int64_t pages);
};

// The shape of the balanced policy: the first page and the last 256 tokens FP16, the 2048
// tokens before them FP8, everything older NVFP4.
int BalancedFormat(int64_t page, int64_t pages) {
  if (page == 0 || page >= pages - 16) return 0;
  return page >= pages - 16 - 128 ? 1 : 2;
}

// An engine's palette of FP16 and one smaller format: the first page and the last 16 FP16,
// everything between in format 1.
int Fp16TailFormat(int64_t page, int64_t pages) { return page == 0 || page >= pages - 16 ? 0 : 1; }

// How a decode row runs: as a cache with rotated keys (Options::key_rotation) runs it, the
// kernel rotating the queries as it loads them (PagedDecodeParams::rotate_queries), as
// CudaDecodeAttention does; and with page weights (PagedDecodeParams::page_weight: the page
// LSEs, then the weights kernel). The library also takes the page LSEs' buffer from the
// stream-ordered allocator per call; that host work is not timed here. The page weights are
// max-accumulated over the runs, as the layers of a step; `zero_weights` zeroes them before each
// call, the memset timed too, as an engine does once per step. A row times one call between two
// events, launch latency included; `back_to_back` calls between them give the time per call of
// a stream kept busy, as an engine's steps (the host enqueues ahead of the GPU); `graph` captures
// the back-to-back calls in a CUDA graph once and times its replay, as an engine that captures
// its decode step (the rows give the time per call).
struct DecodeVariant {
  const char* suffix;  // of the row's name
  bool rotated;
  bool page_weight;
  int back_to_back = 1;
  bool zero_weights = false;
  bool graph = false;
};
constexpr DecodeVariant kPlain = {"", false, false};
constexpr DecodeVariant kBackToBack = {"_back_to_back", false, false, 32};
constexpr DecodeVariant kGraph = {"_graph", false, false, 32, false, true};

// Median milliseconds of each variant of launch p (prepared by Decode; `entries` packed pages),
// timed in turns (MedianMsInTurns).
std::vector<double> TimeDecode(cudaStream_t stream, const gpu::PagedDecodeParams& p,
                               const std::vector<DecodeVariant>& variants, int64_t entries,
                               int runs) {
  std::vector<void*> buffers;
  std::vector<cudaGraphExec_t> graphs;
  std::vector<int> inner;
  std::vector<std::function<void()>> calls;
  for (const DecodeVariant& v : variants) {
    gpu::PagedDecodeParams q = p;
    q.rotate_queries = v.rotated;
    q.key_rotation_seed = 0x5EED;
    if (v.page_weight) {
      void *d_page_lse = nullptr, *d_weight = nullptr;
      const int64_t lse_floats = gpu::PageLseFloats(entries, p.num_q_heads, p.num_kv_heads);
      CHECK_CUDA(cudaMalloc(&d_page_lse, lse_floats * 4));
      CHECK_CUDA(cudaMalloc(&d_weight, entries * 4));
      CHECK_CUDA(cudaMemsetAsync(d_weight, 0, entries * 4, stream));
      buffers.push_back(d_page_lse);
      buffers.push_back(d_weight);
      q.page_lse = static_cast<float*>(d_page_lse);
      q.page_weight = static_cast<float*>(d_weight);
    }
    auto call = [stream, q, entries, zero = v.zero_weights] {
      if (zero) CHECK_CUDA(cudaMemsetAsync(q.page_weight, 0, entries * 4, stream));
      CHECK_CUDA(gpu::LaunchPagedDecode(q, stream));
    };
    if (!v.graph) {
      inner.push_back(v.back_to_back);
      calls.push_back(std::move(call));
      continue;
    }
    call();  // the launcher's one-time setup (the kernels' shared-memory limit) uncaptured
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < v.back_to_back; ++i) call();
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
    graphs.push_back(exec);
    inner.push_back(1);
    calls.push_back([stream, exec] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms = MedianMsInTurns(stream, 3, runs, inner, calls);
  for (size_t i = 0; i < variants.size(); ++i) {
    if (variants[i].graph) ms[i] /= variants[i].back_to_back;  // per call
  }
  for (cudaGraphExec_t exec : graphs) CHECK_CUDA(cudaGraphExecDestroy(exec));
  for (void* ptr : buffers) CHECK_CUDA(cudaFree(ptr));
  return ms;
}

// One device allocation that the decode cases' pools are carved from, allocated again (larger)
// only when a case needs more: a case's pages then lie in memory that has held pages all along,
// as an engine's long-lived cache, rather than in a fresh allocation made where the previous
// case's larger pools were just freed, where FP8 b256 x 32K ran 18% slower in the full bench
// than alone (H100: 6747.5 us, 5705.8 us from the arena, 5703.9 alone; docs/benchmarks.md).
class PoolArena {
 public:
  ~PoolArena() {
    if (base_ != nullptr) cudaFree(base_);
  }
  // `bytes` bytes, valid until the next call.
  uint8_t* Reserve(size_t bytes) {
    if (bytes > size_) {
      if (base_ != nullptr) CHECK_CUDA(cudaFree(base_));
      base_ = nullptr;
      CHECK_CUDA(cudaMalloc(&base_, bytes));
      size_ = bytes;
    }
    return static_cast<uint8_t*>(base_);
  }

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
};

// Times one launch of the fused decode kernel (with its split merge) over `batch` sequences of
// `context` tokens, 32 query and 8 KV heads, head_dim 128, pages in shuffled order, once per
// variant (same pages and queries; the row's bytes are the K/V bytes read). With
// `shared_pages` > 0 every format's pages are drawn, in turn, from at most that many pages of
// its pool (--shared-pages). Returns false (and times nothing) when the pools would exceed
// `max_bytes`.
bool Decode(cudaStream_t stream, int sms, const DecodeCase& dc, int batch, int64_t context,
            int64_t shared_pages, size_t max_bytes, PoolArena* arena,
            const std::vector<DecodeVariant>& variants, std::vector<Result>* out) {
  constexpr int kKvHeads = 8, kQHeads = 32, kD = 128, kTokens = 16;
  const int64_t pages = (context + kTokens - 1) / kTokens;
  const size_t formats = dc.palette.size();
  std::vector<PageLayout> layouts;
  std::vector<int64_t> count(formats, 0);
  for (const char* name : dc.palette) {
    layouts.push_back(MakePageLayout(kKvHeads, kTokens, kD, ParseFormat(name).value()));
  }
  for (int64_t i = 0; i < pages; ++i) count[dc.format_of(i, pages)] += batch;
  std::vector<int64_t> physical = count;  // pages in each pool
  if (shared_pages > 0) {
    for (int64_t& n : physical) n = std::min(n, shared_pages);
  }
  size_t total = 0;
  double read = 0;
  for (size_t f = 0; f < formats; ++f) {
    total += static_cast<size_t>(physical[f]) * layouts[f].page_bytes;
    read += static_cast<double>(count[f]) * kKvHeads * PageHeadBytes(layouts[f]);
  }
  if (total > max_bytes) return false;

  std::mt19937 rng(static_cast<uint32_t>(batch * 131 + pages));
  gpu::PagedDecodeParams p;
  std::vector<std::vector<uint32_t>> pool_pages(formats);  // each pool's pages, shuffled
  std::vector<void*> pools(formats, nullptr);
  std::vector<size_t> pool_bytes(formats), offsets(formats + 1, 0);  // offsets 256-aligned
  for (size_t f = 0; f < formats; ++f) {
    pool_bytes[f] = std::max<size_t>(static_cast<size_t>(physical[f]) * layouts[f].page_bytes, 256);
    offsets[f + 1] = offsets[f] + (pool_bytes[f] + 255) / 256 * 256;
  }
  uint8_t* const base = arena->Reserve(offsets[formats]);
  for (size_t f = 0; f < formats; ++f) {
    const size_t bytes = pool_bytes[f];
    pools[f] = base + offsets[f];
    FillPageBytes<<<4096, 256, 0, stream>>>(static_cast<uint32_t*>(pools[f]), bytes / 4,
                                            static_cast<uint32_t>(f + 1));
    CHECK_CUDA(cudaGetLastError());
    const PageLayout& l = layouts[f];
    const uint32_t scales = (l.page_bytes - l.k.scale_offset) / 4;  // K and V scales, padding
    FillPageScales<<<4096, 256, 0, stream>>>(static_cast<uint8_t*>(pools[f]), physical[f], l.page_bytes,
                                              l.k.scale_offset, scales, static_cast<uint32_t>(f + 7));
    CHECK_CUDA(cudaGetLastError());
    p.pools[f] = {static_cast<const uint8_t*>(pools[f]), layouts[f], 0.05f, 0.05f};
    pool_pages[f].resize(physical[f]);
    std::iota(pool_pages[f].begin(), pool_pages[f].end(), 0u);
    std::shuffle(pool_pages[f].begin(), pool_pages[f].end(), rng);
  }
  std::vector<size_t> drawn(formats, 0);  // pages of each format handed out so far
  std::vector<int32_t> indptr(batch + 1, 0), lens(batch, static_cast<int32_t>(context));
  std::vector<uint32_t> packed;
  packed.reserve(static_cast<size_t>(batch) * pages);
  for (int b = 0; b < batch; ++b) {
    if (shared_pages > 0) {  // each sequence its own order of the shared pages
      for (size_t f = 0; f < formats; ++f) {
        std::shuffle(pool_pages[f].begin(), pool_pages[f].end(), rng);
        drawn[f] = 0;
      }
    }
    for (int64_t i = 0; i < pages; ++i) {
      const int f = dc.format_of(i, pages);
      packed.push_back(PackPage(f, pool_pages[f][drawn[f]++ % pool_pages[f].size()]));
    }
    indptr[b + 1] = static_cast<int32_t>(packed.size());
  }
  const size_t rows = static_cast<size_t>(batch) * kQHeads;
  p.num_formats = static_cast<int32_t>(formats);
  p.stage_fp16 = gpu::FavoursStagedFp16(p, count.data());  // as the library decides it
  p.batch = batch;
  p.num_q_heads = kQHeads;
  p.num_kv_heads = kKvHeads;
  gpu::DecodeSplit split;
  CHECK_CUDA(gpu::ChooseDecodeSplit(p, static_cast<int32_t>(pages), sms, &split));
  const int64_t workspace = gpu::DecodeWorkspaceFloats(batch, kQHeads, split.num_splits);
  void *d_indptr, *d_packed, *d_lens, *d_q, *d_out, *d_lse, *d_work = nullptr;
  CHECK_CUDA(cudaMalloc(&d_indptr, indptr.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_packed, packed.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_lens, lens.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_q, rows * kD * 4));
  CHECK_CUDA(cudaMalloc(&d_out, rows * kD * 4));
  CHECK_CUDA(cudaMalloc(&d_lse, rows * 4));
  if (workspace > 0) CHECK_CUDA(cudaMalloc(&d_work, workspace * 4));
  CHECK_CUDA(cudaMemcpy(d_indptr, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_packed, packed.data(), packed.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  Fill(d_q, rows * kD * 4, 3, kD);  // FP16 bit patterns read as floats: finite, varied
  FillPageBytes<<<256, 256, 0, stream>>>(static_cast<uint32_t*>(d_q), rows * kD, 9);
  p.packed_indptr = static_cast<const int32_t*>(d_indptr);
  p.packed = static_cast<const uint32_t*>(d_packed);
  p.seq_lens = static_cast<const int32_t*>(d_lens);
  p.softmax_scale = 1e-20f;  // q holds random float bits; keep the logits small
  p.q = static_cast<const float*>(d_q);
  p.out = static_cast<float*>(d_out);
  p.lse = static_cast<float*>(d_lse);
  p.num_splits = split.num_splits;
  p.pages_per_split = split.pages_per_split;
  p.warps_per_block = split.warps_per_block;
  p.workspace = static_cast<float*>(d_work);
  const int runs = read > 4e9 ? 10 : 30;
  const std::vector<double> ms =
      TimeDecode(stream, p, variants, static_cast<int64_t>(packed.size()), runs);
  for (size_t v = 0; v < variants.size(); ++v) {
    char shared[32] = "";
    if (shared_pages > 0) {
      std::snprintf(shared, sizeof(shared), "_shared%lld", static_cast<long long>(shared_pages));
    }
    char name[192];
    std::snprintf(name, sizeof(name), "decode_%s_b%d_ctx%lldk_splits%d%s%s", dc.name, batch,
                  static_cast<long long>(context / 1024), split.num_splits, variants[v].suffix,
                  shared);
    out->push_back({name, read, ms[v]});
  }
  for (void* ptr : {d_indptr, d_packed, d_lens, d_q, d_out, d_lse, d_work}) CHECK_CUDA(cudaFree(ptr));
  return true;
}

// Migration and append benchmarks (the data plane), appended to `migrations` and `appends`.
void RunDataPlane(cudaStream_t stream, CudaBackend* backend, std::vector<Result>* migrations,
                  std::vector<Result>* appends) {
  migrations->push_back(Migration(stream, "fp16", "fp8_e4m3/block_head", true, "fp16_to_fp8_e4m3_block_head"));
  migrations->push_back(Migration(stream, "fp16", "nvfp4/block_head", true, "fp16_to_nvfp4_block_head"));
  migrations->push_back(Migration(stream, "fp16", "k:nvfp4_channel/block_head,v:nvfp4/block_head", true,
                                  "fp16_to_nvfp4_channel_k_nvfp4_v"));
  migrations->push_back(Migration(stream, "fp8_e4m3/block_head", "nvfp4/block_head", true,
                                  "fp8_e4m3_block_head_to_nvfp4_block_head"));
  // The default occupancies above are the automatic ones (migrate_occupancy.h); each forced.
  for (const auto& [variant, suffix] :
       {std::pair{gpu::RequantizeVariant::kTwoBlocksPerSm, "_2_blocks_per_sm"},
        std::pair{gpu::RequantizeVariant::kThreeBlocksPerSm, "_3_blocks_per_sm"},
        std::pair{gpu::RequantizeVariant::kFourBlocksPerSm, "_4_blocks_per_sm"},
        std::pair{gpu::RequantizeVariant::kFiveBlocksPerSm, "_5_blocks_per_sm"}}) {
    for (const auto& [from, to, name] :
         {std::tuple{"fp16", "fp8_e4m3/block_head", "fp16_to_fp8_e4m3_block_head"},
          std::tuple{"fp16", "nvfp4/block_head", "fp16_to_nvfp4_block_head"},
          std::tuple{"fp8_e4m3/block_head", "nvfp4/block_head",
                     "fp8_e4m3_block_head_to_nvfp4_block_head"}}) {
      migrations->push_back(
          Migration(stream, from, to, true, (std::string(name) + suffix).c_str(), variant));
    }
  }
  migrations->push_back(Migration(stream, "fp16", "fp8_e4m3/block_head", false,
                                  "fp16_to_fp8_e4m3_block_head_codec_only"));
  migrations->push_back(Migration(stream, "fp16", "nvfp4/block_head", false,
                                  "fp16_to_nvfp4_block_head_codec_only"));
  Append(stream, backend, 256, 1, "append_fp16_batch256x1", appends);
  Append(stream, backend, 256, 512, "append_fp16_batch256x512", appends);
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, backend->device_id()));
  AppendLayers(stream, sms, appends);
}

int Main(int argc, char** argv) {
  const bool decode_only = argc == 3 && std::string(argv[2]) == "--decode-only";
  const bool data_plane_only = argc == 3 && std::string(argv[2]) == "--data-plane-only";
  const bool only = (argc == 6 || (argc == 8 && std::string(argv[6]) == "--shared-pages")) &&
                    std::string(argv[2]) == "--only";
  const int64_t shared_pages = argc == 8 ? std::atoll(argv[7]) : 0;
  if ((argc != 2 && !decode_only && !data_plane_only && !only) || (argc == 8 && shared_pages < 1)) {
    std::fprintf(stderr,
                 "usage: %s OUT.json [--decode-only | --data-plane-only |\n"
                 "       --only CASE BATCH CONTEXT [--shared-pages N (N >= 1)]]\n",
                 argv[0]);
    return 2;
  }
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create();
  if (!backend.ok()) {
    std::fprintf(stderr, "no CUDA backend: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  const FastCodecCheck check = CudaBackend::fast_codec_check();
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, (*backend)->device_id()));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  char bus_id[32];
  CHECK_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), (*backend)->device_id()));
  SmClockSampler clocks(bus_id);
  if (clocks.available()) g_clocks = &clocks;

  std::vector<Result> roof_runs, migrations, appends, read_runs, decodes;
  const double roof = only ? 0 : CopyRoof(stream, &roof_runs);
  if (!decode_only && !only) RunDataPlane(stream, backend->get(), &migrations, &appends);
  const double read_roof =
      data_plane_only ? 0 : ReadRoof(stream, prop.multiProcessorCount, &read_runs);
  const std::vector<DecodeCase> cases = {
      {"fp16", {"fp16"}, [](int64_t, int64_t) { return 0; }},
      {"fp8_e4m3_block_head", {"fp8_e4m3/block_head"}, [](int64_t, int64_t) { return 0; }},
      {"nvfp4_block_head", {"nvfp4/block_head"}, [](int64_t, int64_t) { return 0; }},
      {"balanced_mix",
       {"fp16", "fp8_e4m3/block_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"},
       BalancedFormat},
      // A young cache under the mix's palette: every page still FP16.
      {"fp16_in_mix_palette",
       {"fp16", "fp8_e4m3/block_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"},
       [](int64_t, int64_t) { return 0; }},
      {"fp16_tail_nvfp4", {"fp16", "nvfp4/block_head"}, Fp16TailFormat},
      {"fp16_tail_fp8", {"fp16", "fp8_e4m3/block_head"}, Fp16TailFormat},
  };
  std::vector<int> batches = {1, 8, 64, 256};
  std::vector<int64_t> contexts = {1024, 8192, 32768, 131072};
  if (data_plane_only) batches.clear();
  if (only) {
    batches = {std::atoi(argv[4])};
    contexts = {std::atoll(argv[5])};
    if (batches[0] < 1 || contexts[0] < 1 ||
        std::none_of(cases.begin(), cases.end(), [&](const DecodeCase& c) { return argv[3] == std::string(c.name); })) {
      std::fprintf(stderr, "--only: unknown case %s or bad batch/context\n", argv[3]);
      return 2;
    }
  }
  // At batch 64 x 32K and batch 1 x 128K, each case also as a cache with rotated keys and with
  // page weights would run it, next to the plain row; at batch 1, where a call's launch latency
  // is a part of its time, also back to back and from a CUDA graph (at 128K, with page weights
  // back to back too); at batch 8 x 32K and 128K, where it is still several percent, back to
  // back.
  const std::vector<DecodeVariant> all_variants = {kPlain,
                                                   {"_page_weight", false, true},
                                                   {"_page_weight_zeroed", false, true, 1, true},
                                                   {"_rotated", true, false},
                                                   {"_rotated_page_weight", true, true}};
  PoolArena arena;
  for (int batch : batches) {
    for (int64_t context : contexts) {
      std::vector<DecodeVariant> variants = {kPlain};
      if ((batch == 64 && context == 32768) || (batch == 1 && context == 131072)) {
        variants = all_variants;
      }
      if (batch == 1) variants.insert(variants.end(), {kBackToBack, kGraph});
      if (batch == 8 && context >= 32768) variants.push_back(kBackToBack);
      if (batch == 1 && context == 131072) {
        variants.push_back({"_page_weight_back_to_back", false, true, kBackToBack.back_to_back});
      }
      for (const DecodeCase& dc : cases) {
        if (only && argv[3] != std::string(dc.name)) continue;
        if (!Decode(stream, prop.multiProcessorCount, dc, batch, context, shared_pages,
                    size_t{48} << 30, &arena, variants, &decodes)) {
          std::printf("skipped decode %s batch %d x %lld tokens: over 48 GiB of pages\n", dc.name,
                      batch, static_cast<long long>(context));
        }
      }
    }
  }

  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  FILE* f = std::fopen(argv[1], "w");
  if (f == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(f,
               "{\n  \"gpu\": \"%s\",\n  \"sms\": %d,\n  \"l2_bytes\": %d,\n  \"date\": \"%s\",\n"
               "  \"fast_codec_self_check\": %s,\n  \"copy_roof_tb_per_s\": %.4f,\n"
               "  \"roof\": %s,\n  \"migration\": %s,\n  \"append\": %s,\n"
               "  \"read_roof_tb_per_s\": %.4f,\n  \"read_roof\": %s,\n  \"decode\": %s\n}\n",
               prop.name, prop.multiProcessorCount, prop.l2CacheSize, date,
               check.passed ? "true" : "false", roof, Json(roof_runs, roof).c_str(),
               Json(migrations, roof).c_str(), Json(appends, roof).c_str(), read_roof,
               Json(read_runs, read_roof, "read").c_str(), Json(decodes, read_roof, "read").c_str());
  std::fclose(f);

  // SM MHz: the mean SM clock while the row was timed; capped: the share of that time under a
  // power or thermal limit (SmClockSampler; "-" without NVML).
  const auto print = [](const char* title, const char* unit, double base,
                        std::initializer_list<const std::vector<Result>*> groups) {
    std::printf("%-44s %10s %9s %8s %7s %7s\n", title, "median_us", "TB/s", unit, "SM MHz",
                "capped");
    for (const std::vector<Result>* rs : groups) {
      for (const Result& r : *rs) {
        std::printf("%-44s %10.1f %9.3f %7.1f%%", r.name.c_str(), r.ms * 1e3, r.tbs(),
                    100.0 * r.tbs() / base);
        if (r.clocks.samples > 0) {
          std::printf(" %7.0f %6.0f%%\n", r.clocks.mean_sm_mhz, 100.0 * r.clocks.capped_fraction);
        } else {
          std::printf(" %7s %7s\n", "-", "-");
        }
      }
    }
  };
  print("benchmark", "% roof", roof, {&roof_runs, &migrations, &appends});
  print("decode (bytes read)", "% read", read_roof, {&read_runs, &decodes});
  std::printf("fast codec self-check: %s\n", check.passed ? "passed" : "FAILED");
  g_clocks = nullptr;
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) { return kvtier::Main(argc, argv); }
