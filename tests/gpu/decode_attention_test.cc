// The fused decode kernel against the CPU reference: a CPU and a CUDA cache hold the same
// bytes (CachePair), the reference attends the CPU cache and the kernel the CUDA cache, for
// every format of the palettes below mixed within sequences, GQA groups 1 to 16, batch 1 to
// 256, contexts 1 to 128K tokens (split-KV), ragged lengths and empty sequences. Tolerances are
// the ones docs/attention.md states. Also: NaN and infinite queries (NaN where the reference is
// NaN), the page weights (DecodeOutputs::page_weight) and the logits (DecodeOutputs::logits)
// against the reference's, the LSE merge kernel against MergeStates and over many parts, and the
// kernel's refusals. Every comparison also attends the step prepared once (PreparedDecode) and
// requires the same bits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/attention/side_kind.cuh"
#include "kernels/decode_attention.cuh"
#include "kernels/page_layout.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/merge_states.h"
#include "src/relative_error.h"
#include "tests/gpu/cache_pair.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace kvtier::testing {
namespace {

constexpr double kOutTolerance = 5e-3;  // relative L2 per (sequence, head)
constexpr double kLseTolerance = 5e-3;  // absolute, natural log
// The kernel rounds Q to FP16 (half an ulp: 2^-11 of a value), which moves a logit dominated by
// one channel by up to 2^-11 of its size, and the LSE by as much as its dominant logits move; the
// LSE is at least the largest logit, so 2^-11 of |LSE| covers that where the largest logit is
// positive, as here. It is the bound where it exceeds kLseTolerance: at an LSE over 10.24, from
// large logits, or from over 28K tokens of small ones (there loose by 2^-11 log(tokens) at most).
constexpr double kQueryRounding = 1.0 / 2048;
double LseTolerance(double lse) { return std::max(kLseTolerance, kQueryRounding * std::fabs(lse)); }

Options MakeOptions(const std::vector<std::string>& palette, int64_t budget_mib) {
  return PaletteOptions(Geometry{1, 8, 128, 16}, palette, budget_mib);
}

// Adds sequences of `lengths` with random K/V, then demotes each full block to a palette
// format drawn at random (weights: index 0 stays hot). `same_pages`: as CachePair::AppendBatch
// (false once the pair has demoted: the CUDA cache reclaims pages later than the CPU one).
std::vector<SequenceId> Fill(CachePair& pair, const std::vector<int64_t>& lengths,
                             std::mt19937* rng, bool same_pages = true) {
  std::vector<SequenceId> seqs, filled;
  std::vector<int64_t> nonzero;
  for (int64_t length : lengths) {
    seqs.push_back(pair.AddSequence());
    if (length > 0) filled.push_back(seqs.back()), nonzero.push_back(length);
  }
  const absl::Status appended = pair.AppendBatch(filled, nonzero, same_pages);
  EXPECT_TRUE(appended.ok()) << appended;
  pair.WriteAllLayers(rng, /*specials=*/false);
  const int formats = static_cast<int>(pair.options().palette.size());
  std::vector<std::vector<BlockId>> to(formats);
  std::uniform_int_distribution<int> pick(0, formats - 1);
  for (SequenceId s : seqs) {
    const std::vector<BlockId> blocks = pair.gpu().SequenceBlocks(s).value();
    for (BlockId b : blocks) {
      if (pair.gpu().GetBlockInfo(b).value().num_tokens == 16) to[pick(*rng)].push_back(b);
    }
  }
  for (int f = 1; f < formats; ++f) {
    if (!to[f].empty()) {
      EXPECT_TRUE(pair.Demote(to[f], f).ok()) << "format " << f;
    }
  }
  return seqs;
}

struct Outputs {
  std::vector<float> out, lse;
};

// The reference on the CPU cache and the kernel on the CUDA cache; returns "" when they agree.
// With `specials`, some query heads hold a NaN, +inf or -inf: where the reference is NaN the
// kernel must be NaN too (output and LSE). With `misaligned`, the kernel's queries start 4 bytes
// past a 16-byte boundary (the kernel's scalar loads instead of its 16-byte ones).
std::string Compare(CachePair& pair, const std::vector<SequenceId>& seqs, int group,
                    std::mt19937* rng, bool specials = false, bool misaligned = false) {
  const Geometry& g = pair.options().geometry;
  const int q_heads = g.num_kv_heads * group;
  const size_t rows = seqs.size() * q_heads;
  std::vector<float> q(rows * g.head_dim);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : q) x = normal(*rng);
  for (size_t r = 0; specials && r < rows; ++r) {
    const float special[] = {0.f, NAN, INFINITY, -INFINITY};
    if (r % 5 >= 1 && r % 5 <= 3) q[r * g.head_dim + r % 7] = special[r % 5];
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(g.head_dim));

  PageTables ct, gt;
  if (!pair.cpu().BuildPageTables(seqs, &ct).ok() || !pair.gpu().BuildPageTables(seqs, &gt).ok()) {
    return "BuildPageTables failed";
  }
  Outputs ref{std::vector<float>(rows * g.head_dim), std::vector<float>(rows)};
  absl::Status s = DecodeAttention(pair.cpu(), 0, ct, {q, q_heads, scale},
                                   {absl::MakeSpan(ref.out), absl::MakeSpan(ref.lse), {}, 0, {}});
  if (!s.ok()) return absl::StrCat("reference: ", s.ToString());

  DeviceBuffer dq, dout(rows * g.head_dim * 4), dlse(rows * 4);
  std::vector<float> uploaded(misaligned ? 1 : 0, 0.f);  // a float before the queries
  uploaded.insert(uploaded.end(), q.begin(), q.end());
  dq.Upload(uploaded);
  auto* out = static_cast<float*>(dout.data());
  auto* lse = static_cast<float*>(dlse.data());
  const float* first_query = static_cast<const float*>(dq.data()) + (misaligned ? 1 : 0);
  const DecodeQueries device_q{absl::MakeConstSpan(first_query, q.size()), q_heads, scale};
  const DecodeOutputs device_out{absl::MakeSpan(out, rows * g.head_dim), absl::MakeSpan(lse, rows),
                                 {}, 0, {}};
  s = DecodeAttention(pair.gpu(), 0, gt, device_q, device_out, {nullptr, true});
  if (!s.ok()) return absl::StrCat("kernel: ", s.ToString());
  Outputs got{std::vector<float>(rows * g.head_dim), std::vector<float>(rows)};
  cudaMemcpy(got.out.data(), out, got.out.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(got.lse.data(), lse, got.lse.size() * 4, cudaMemcpyDeviceToHost);

  // The same step prepared once (tables on the device): the same bits.
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(pair.gpu(), gt);
  if (!step.ok()) return absl::StrCat("prepare: ", step.status().ToString());
  cudaMemset(out, 0, rows * g.head_dim * 4);
  cudaMemset(lse, 0, rows * 4);
  s = DecodeAttention(pair.gpu(), 0, *step, device_q, device_out, {nullptr, true});
  if (!s.ok()) return absl::StrCat("kernel, prepared: ", s.ToString());
  Outputs prepared{std::vector<float>(rows * g.head_dim), std::vector<float>(rows)};
  cudaMemcpy(prepared.out.data(), out, prepared.out.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(prepared.lse.data(), lse, prepared.lse.size() * 4, cudaMemcpyDeviceToHost);
  for (const std::string& diff :
       {CompareFloats(got.out, prepared.out), CompareFloats(got.lse, prepared.lse)}) {
    if (!diff.empty()) return absl::StrCat("the prepared step differs from the tables: ", diff);
  }

  double worst_out = 0, worst_lse = 0;
  int64_t tokens = 0;
  for (int64_t length : ct.seq_lens) tokens += length;
  if (tokens == 0) return "nothing to attend";
  for (size_t r = 0; r < rows; ++r) {
    const int64_t length = ct.seq_lens[r / q_heads];
    if (length == 0) {
      if (!std::isinf(got.lse[r]) || got.lse[r] > 0) {
        return absl::StrCat("row ", r, ": empty sequence, lse ", got.lse[r]);
      }
      for (int d = 0; d < g.head_dim; ++d) {
        if (got.out[r * g.head_dim + d] != 0.f) return absl::StrCat("row ", r, ": nonzero output");
      }
      continue;
    }
    const size_t first = r * g.head_dim;
    if (std::isnan(ref.lse[r])) {
      for (int d = 0; d < g.head_dim; ++d) {
        if (!std::isnan(got.out[first + d]) || !std::isnan(got.lse[r])) {
          return absl::StrCat("row ", r, ": the reference is NaN, the kernel gives lse ",
                              got.lse[r], " and output ", got.out[first + d], " at dim ", d);
        }
      }
      continue;
    }
    const double rel = RelativeError(absl::MakeConstSpan(got.out).subspan(first, g.head_dim),
                                     absl::MakeConstSpan(ref.out).subspan(first, g.head_dim));
    const double dl = std::fabs(static_cast<double>(ref.lse[r]) - got.lse[r]);
    if (!(rel <= kOutTolerance) || !(dl <= LseTolerance(ref.lse[r]))) {
      return absl::StrCat("row ", r, " (sequence ", r / q_heads, ", ", length,
                          " tokens): output rel. error ", rel, ", lse ", ref.lse[r], " vs ",
                          got.lse[r]);
    }
    worst_out = std::max(worst_out, rel);
    worst_lse = std::max(worst_lse, dl);
  }
  std::printf("    %zu sequences (%lld tokens), group %d: worst output rel. error %.2e, lse "
              "error %.2e\n",
              seqs.size(), static_cast<long long>(tokens), group, worst_out, worst_lse);
  return "";
}

// A palette without NVFP4, whose page LSEs are stored with the L2 hint (PageLsesKeptInL2).
const std::vector<std::string>& Fp16AndFp8Palette() {
  static const auto* const palette = new std::vector<std::string>{
      "fp16", "k:fp16,v:fp8_e4m3/block_head", "fp8_e4m3/block_head", "fp8_e5m2/token_head"};
  return *palette;
}

const std::vector<std::vector<std::string>>& Palettes() {
  static const auto* const palettes = new std::vector<std::vector<std::string>>{
      {"fp16", "fp8_e4m3/tensor", "fp8_e4m3/block_head", "fp8_e4m3/token_head",
       "fp8_e5m2/tensor", "fp8_e5m2/block_head", "fp8_e5m2/token_head", "nvfp4/tensor"},
      {"fp16", "k:fp16,v:fp8_e4m3/block_head", "fp8_e4m3/block_head", "nvfp4/block_head",
       "nvfp4_channel/block_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"},
      {"fp8_e4m3/token_head", "nvfp4/block_head"},  // an FP8 hot format: partial FP8 tails
      // One format of side kinds with kernels of their own (decode_launch.cu), whose page
      // loop for one format reads its plan as constants: NVFP4 tails, E4M3 per token and
      // per tensor.
      {"nvfp4/tensor"},
      {"fp8_e4m3/token_head"},
      {"fp8_e4m3/tensor"},
      // All E4M3 in three formats (the same kernels' loop for several formats) and all FP16
      // (staged, generic kernel).
      {"fp8_e4m3/token_head", "fp8_e4m3/block_head", "fp8_e4m3/tensor"},
      {"fp16"},
  };
  return *palettes;
}

TEST(DecodeAttentionTest, EveryFormatMixGroupAndRaggedLength) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (const auto& palette : Palettes()) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    auto pair = CachePair::Create(MakeOptions(palette, 512)).value();
    const std::vector<int64_t> lengths = {0, 1, 15, 16, 17, 31, 100, 256, 257, 1000, 2049, 4096,
                                          5000, 333, 48, 7};
    const std::vector<SequenceId> seqs = Fill(*pair, lengths, &rng);
    for (int group : {1, 4, 7, 8, 9, 16}) {
      EXPECT_EQ(Compare(*pair, seqs, group, &rng), "") << "group " << group;
    }
  }
}

// Queries that start 4 bytes past a 16-byte boundary (a view into a larger buffer) attend as
// aligned ones: the generic kernel and the palettes' own (whose warps share the loads of the
// group's queries into shared memory), one and two tiles of query heads.
TEST(DecodeAttentionTest, MisalignedQueriesAttendAsAligned) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(29);
  for (const std::vector<std::string>& palette :
       std::vector<std::vector<std::string>>{{"nvfp4/tensor"}, {"fp8_e4m3/token_head"},
                                             Fp16AndFp8Palette()}) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    auto pair = CachePair::Create(MakeOptions(palette, 256)).value();
    const std::vector<SequenceId> seqs = Fill(*pair, {1, 17, 300, 2049}, &rng);
    for (int group : {1, 8, 12}) {
      EXPECT_EQ(Compare(*pair, seqs, group, &rng, false, /*misaligned=*/true), "")
          << "group " << group;
    }
  }
}

// Tables and a prepared step from before a slab was unmapped (every sequence released, EndStep
// after the device finished), on CUDA: each call is refused (FailedPrecondition,
// Cache::CheckTablesMapped) where the kernel would have read unmapped memory and faulted the
// device; tables built afterwards attend as before.
TEST(DecodeAttentionTest, TablesFromBeforeASlabUnmapAreRefusedNotRead) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(5);
  auto pair = CachePair::Create(MakeOptions({"fp16", "nvfp4/block_head"}, 64)).value();
  const std::vector<SequenceId> seqs = Fill(*pair, {3000, 2000, 700}, &rng);
  PageTables tables;
  ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(pair->gpu(), tables);
  ASSERT_TRUE(step.ok()) << step.status();
  for (SequenceId s : seqs) pair->Release(s);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(pair->gpu().EndStep().ok());
    ASSERT_TRUE(pair->cpu().EndStep().ok());
  }
  ASSERT_EQ(pair->gpu().CheckTablesMapped(tables).code(), absl::StatusCode::kFailedPrecondition)
      << "no slab was unmapped";
  const int q_heads = 32;
  const size_t rows = seqs.size() * q_heads;
  DeviceBuffer dq(rows * 128 * 4), dout(rows * 128 * 4), dlse(rows * 4);
  const DecodeQueries q{absl::MakeConstSpan(static_cast<const float*>(dq.data()), rows * 128),
                        q_heads, 0.1f};
  const DecodeOutputs out{absl::MakeSpan(static_cast<float*>(dout.data()), rows * 128),
                          absl::MakeSpan(static_cast<float*>(dlse.data()), rows), {}, 0, {}};
  const auto refused = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kFailedPrecondition &&
           s.message().find("unmapped memory") != absl::string_view::npos;
  };
  EXPECT_TRUE(refused(DecodeAttention(pair->gpu(), 0, tables, q, out))) << "tables";
  EXPECT_TRUE(refused(DecodeAttention(pair->gpu(), 0, *step, q, out))) << "prepared step";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing faulted
  const std::vector<SequenceId> again = Fill(*pair, {1000, 17}, &rng, /*same_pages=*/false);
  EXPECT_EQ(Compare(*pair, again, 4, &rng), "");
}

// The FP16 pages (palette format 0, its one all-FP16 format) and all pages a launch over seqs
// reads, for FavoursStagedFp16.
std::pair<int64_t, int64_t> Fp16Pages(CachePair& pair, const std::vector<SequenceId>& seqs) {
  PageTables tables;
  EXPECT_TRUE(pair.gpu().BuildPageTables(seqs, &tables).ok());
  const int64_t fp16 = std::count_if(tables.packed.begin(), tables.packed.end(),
                                     [](uint32_t e) { return PackedFormat(e) == 0; });
  return {fp16, static_cast<int64_t>(tables.packed.size())};
}

// The kernel instance a palette runs (DecodeKernelKinds), on the host: a palette kernel for all
// NVFP4 (along head_dim) or all E4M3, the generic kernel for the rest, an FP16 format beside
// them included (a kernel of their own beside direct FP16 pages ran slower: docs/benchmarks.md,
// session 31). Runs without a GPU.
TEST(DecodeAttentionTest, PalettesRunTheirKernels) {
  using gpu::attention::kAnyKinds;
  using gpu::attention::kE4M3Kinds;
  using gpu::attention::kNvfp4Kinds;
  const auto kinds = [](const std::vector<std::string>& palette, bool stage_fp16) {
    gpu::PagedDecodeParams p;
    p.num_formats = static_cast<int32_t>(palette.size());
    for (size_t f = 0; f < palette.size(); ++f) {
      p.pools[f].layout = MakePageLayout(8, 16, 128, ParseFormat(palette[f]).value());
    }
    p.stage_fp16 = stage_fp16;
    return gpu::DecodeKernelKinds(p);
  };
  EXPECT_EQ(kinds({"nvfp4/block_head"}, false), kNvfp4Kinds);
  EXPECT_EQ(kinds({"nvfp4/tensor", "nvfp4/block_head"}, false), kNvfp4Kinds);
  EXPECT_EQ(kinds({"fp8_e4m3/token_head", "fp8_e4m3/tensor"}, false), kE4M3Kinds);
  EXPECT_EQ(kinds({"fp16", "nvfp4/block_head"}, false), kAnyKinds);
  EXPECT_EQ(kinds({"fp16", "nvfp4/block_head"}, true), kAnyKinds);
  EXPECT_EQ(kinds({"fp16", "fp8_e4m3/block_head"}, false), kAnyKinds);
  EXPECT_EQ(kinds({"fp8_e4m3/block_head", "nvfp4/block_head"}, false), kAnyKinds);
  EXPECT_EQ(kinds({"nvfp4_channel/block_head"}, false), kAnyKinds);  // along tokens
  EXPECT_EQ(kinds({"fp8_e5m2/token_head"}, false), kAnyKinds);
  EXPECT_EQ(kinds({"fp16"}, false), kAnyKinds);
  EXPECT_EQ(kinds({"bf16"}, false), 0u);  // not read by the kernel
}

// An engine's palette once most pages have aged: FP16 tails (and sinks) read directly beside
// pages of one or two smaller formats of one kind (every full block demoted, so that the FP16
// pages are few and read directly), against the reference.
TEST(DecodeAttentionTest, Fp16TailsBesideOneSmallerKind) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (const std::vector<std::string>& palette :
       {std::vector<std::string>{"fp16", "nvfp4/block_head"},
        std::vector<std::string>{"fp16", "nvfp4/block_head", "nvfp4/tensor"},
        std::vector<std::string>{"fp16", "fp8_e4m3/block_head"},
        std::vector<std::string>{"fp16", "fp8_e4m3/token_head", "fp8_e4m3/tensor"}}) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    auto pair = CachePair::Create(MakeOptions(palette, 512)).value();
    const std::vector<int64_t> lengths = {0, 1, 15, 16, 17, 31, 100, 256, 257, 1000, 2049,
                                          TestScale(5000), 333, 48, 7};
    std::vector<SequenceId> seqs, filled;
    std::vector<int64_t> nonzero;
    for (int64_t length : lengths) {
      seqs.push_back(pair->AddSequence());
      if (length > 0) filled.push_back(seqs.back()), nonzero.push_back(length);
    }
    ASSERT_TRUE(pair->AppendBatch(filled, nonzero, /*same_pages=*/true).ok());
    pair->WriteAllLayers(&rng, /*specials=*/false);
    std::uniform_int_distribution<int> smaller(1, static_cast<int>(palette.size()) - 1);
    std::vector<std::vector<BlockId>> to(palette.size());
    for (SequenceId s : seqs) {
      const std::vector<BlockId> blocks = pair->gpu().SequenceBlocks(s).value();
      for (BlockId b : blocks) {
        if (pair->gpu().GetBlockInfo(b).value().num_tokens == 16) to[smaller(rng)].push_back(b);
      }
    }
    for (size_t f = 1; f < palette.size(); ++f) {
      if (!to[f].empty()) {
        ASSERT_TRUE(pair->Demote(to[f], static_cast<int>(f)).ok());
      }
    }
    const auto [fp16, all] = Fp16Pages(*pair, seqs);
    ASSERT_FALSE(gpu::FavoursStagedFp16(fp16, all)) << fp16 << " of " << all << " pages FP16";
    for (int group : {1, 4, 7, 8, 9, 16}) {
      EXPECT_EQ(Compare(*pair, seqs, group, &rng), "") << "group " << group;
    }
  }
}

// A mixed palette whose pages are mostly FP16, as a young cache's: the launch stages its FP16
// pages (PagedDecodeParams::stage_fp16, FavoursStagedFp16) next to the others, every fourth
// full block demoted to a smaller format, where EveryFormatMixGroupAndRaggedLength (a few FP16
// pages) reads them directly; both against the reference.
TEST(DecodeAttentionTest, MostlyFp16PagesOfAMixedPaletteAreStaged) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(43);
  const std::vector<std::string>& palette = Palettes()[1];
  auto pair = CachePair::Create(MakeOptions(palette, 512)).value();
  const std::vector<int64_t> lengths = {1, 15, 17, 256, 1000, 2049, TestScale(5000)};
  std::vector<SequenceId> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(pair->AddSequence());
  ASSERT_TRUE(pair->AppendBatch(seqs, lengths, /*same_pages=*/true).ok());
  pair->WriteAllLayers(&rng, /*specials=*/false);
  std::uniform_int_distribution<int> smaller(2, static_cast<int>(palette.size()) - 1);
  int64_t full = 0;
  for (SequenceId s : seqs) {
    const std::vector<BlockId> blocks = pair->gpu().SequenceBlocks(s).value();
    for (BlockId b : blocks) {
      if (pair->gpu().GetBlockInfo(b).value().num_tokens == 16 && full++ % 4 == 3) {
        ASSERT_TRUE(pair->Demote({b}, smaller(rng)).ok());
      }
    }
  }
  // The batch is the staged case (palette format 0 is the one all-FP16 format).
  const auto [fp16, all] = Fp16Pages(*pair, seqs);
  ASSERT_TRUE(gpu::FavoursStagedFp16(fp16, all)) << fp16 << " of " << all << " pages FP16";
  for (int group : {1, 4, 8, 16}) {
    EXPECT_EQ(Compare(*pair, seqs, group, &rng), "") << "group " << group;
  }
}

// Page weights (DecodeOutputs::page_weight): a page's weight is exp(page LSE - LSE), where the
// kernel's LSE and its page LSE each carry the LSE error above (<= kLseTolerance; the part from
// Q's rounding, LseTolerance, moves the dominant logit of both alike and cancels), so it agrees
// with the reference within a relative e^(2 kLseTolerance) - 1 ~ 1e-2; kWeightAbsTolerance covers
// the weights too small for that to matter (FP32 rounding, the hardware exp2 and log2).
constexpr double kWeightRelTolerance = 1e-2;
constexpr double kWeightAbsTolerance = 1e-4;

std::vector<float> Download(const DeviceBuffer& buffer, size_t floats) {
  std::vector<float> host(floats);
  cudaMemcpy(host.data(), buffer.data(), floats * sizeof(float), cudaMemcpyDeviceToHost);
  return host;
}

// The shapes of attending `seqs` with GQA groups of `group`, and both caches' page tables.
struct BatchShape {
  BatchShape(CachePair& pair, const std::vector<SequenceId>& seqs, int group) {
    const Geometry& g = pair.options().geometry;
    q_heads = g.num_kv_heads * group;
    rows = seqs.size() * q_heads;
    n = rows * g.head_dim;
    scale = 1.f / std::sqrt(static_cast<float>(g.head_dim));
    built = pair.cpu().BuildPageTables(seqs, &ct).ok() && pair.gpu().BuildPageTables(seqs, &gt).ok();
  }
  int q_heads;
  size_t rows, n;  // query rows, and their floats
  float scale;     // the softmax scale, 1 / sqrt(head_dim)
  PageTables ct, gt;  // the CPU cache's and the CUDA cache's
  bool built;
};

// Attends every layer of the pair's caches, each with its own queries, collecting the layers'
// page weights in one buffer per path: the reference on the CPU cache, the kernel over the tables and over a
// prepared step on the CUDA cache. Returns "" when the kernel's weights agree with the
// reference's, both paths give the same bits, and the outputs' bits are those of the same calls
// without page weights. With `nan_heads`, every head of the first sequence and every fifth other
// head hold a NaN query: the first sequence's pages must weigh exactly 0.
std::string ComparePageWeights(CachePair& pair, const std::vector<SequenceId>& seqs, int group,
                               std::mt19937* rng, bool nan_heads) {
  const Geometry& g = pair.options().geometry;
  const BatchShape shape(pair, seqs, group);
  const auto& [q_heads, rows, n, scale, ct, gt, built] = shape;
  if (!built) return "BuildPageTables failed";
  const size_t entries = ct.packed.size();
  if (gt.packed.size() != entries) return "the caches' tables differ in size";
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(pair.gpu(), gt);
  if (!step.ok()) return absl::StrCat("prepare: ", step.status().ToString());
  std::vector<float> want(entries, 0.f), ref_out(n), ref_lse(rows), q(n);
  DeviceBuffer dq(n * 4), dout(n * 4), dlse(rows * 4), dw(entries * 4 + 4),
      dw_step(entries * 4 + 4);
  cudaMemset(dw.data(), 0, entries * 4);
  cudaMemset(dw_step.data(), 0, entries * 4);
  const DecodeQueries queries{absl::MakeConstSpan(static_cast<const float*>(dq.data()), n), q_heads,
                              scale};
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int layer = 0; layer < g.num_layers; ++layer) {
    for (float& x : q) x = normal(*rng);
    for (size_t r = 0; nan_heads && r < rows; ++r) {
      if (r < static_cast<size_t>(q_heads) || r % 5 == 2) q[r * g.head_dim + r % 7] = NAN;
    }
    const DecodeOutputs ref{absl::MakeSpan(ref_out), absl::MakeSpan(ref_lse), {}, 0,
                            absl::MakeSpan(want)};
    absl::Status s = DecodeAttention(pair.cpu(), layer, ct, {q, q_heads, scale}, ref);
    if (!s.ok()) return absl::StrCat("reference: ", s.ToString());
    cudaMemcpy(dq.data(), q.data(), n * 4, cudaMemcpyHostToDevice);
    DecodeOutputs out{absl::MakeSpan(static_cast<float*>(dout.data()), n),
                      absl::MakeSpan(static_cast<float*>(dlse.data()), rows), {}, 0, {}};
    std::vector<float> plain[2], weighted[2];
    for (int with_weights = 0; with_weights < 2; ++with_weights) {
      if (with_weights) out.page_weight = absl::MakeSpan(static_cast<float*>(dw.data()), entries);
      s = DecodeAttention(pair.gpu(), layer, gt, queries, out, {nullptr, true});
      if (!s.ok()) return absl::StrCat("kernel: ", s.ToString());
      std::vector<float>* got = with_weights ? weighted : plain;
      got[0] = Download(dout, n), got[1] = Download(dlse, rows);
    }
    for (int i = 0; i < 2; ++i) {
      const std::string diff = CompareFloats(plain[i], weighted[i]);
      if (!diff.empty()) return absl::StrCat("layer ", layer, ": page weights change ", diff);
    }
    out.page_weight = absl::MakeSpan(static_cast<float*>(dw_step.data()), entries);
    s = DecodeAttention(pair.gpu(), layer, *step, queries, out, {nullptr, true});
    if (!s.ok()) return absl::StrCat("kernel, prepared: ", s.ToString());
  }
  const std::vector<float> got = Download(dw, entries);
  const std::string diff = CompareFloats(got, Download(dw_step, entries));
  if (!diff.empty()) return absl::StrCat("the prepared step's weights differ: ", diff);
  double worst_abs = 0, worst_rel = 0;
  for (size_t e = 0; e < entries; ++e) {
    const double err = std::fabs(static_cast<double>(got[e]) - want[e]);
    if (!(got[e] >= 0.f && got[e] <= 1.f) ||
        !(err <= kWeightAbsTolerance + kWeightRelTolerance * want[e])) {
      return absl::StrCat("entry ", e, ": weight ", got[e], ", reference ", want[e]);
    }
    worst_abs = std::max(worst_abs, err);
    if (want[e] > 1e-3) worst_rel = std::max(worst_rel, err / want[e]);
  }
  for (int32_t e = ct.packed_indptr[0]; nan_heads && e < ct.packed_indptr[1]; ++e) {
    if (got[e] != 0.f || want[e] != 0.f) {
      return absl::StrCat("entry ", e, " of an all-NaN sequence weighs ", got[e], " (reference ",
                          want[e], ")");
    }
  }
  std::printf("    %zu pages, group %d: worst page weight error %.2e (relative %.2e above 1e-3)\n",
              entries, group, worst_abs, worst_rel);
  return "";
}

// Rotated keys (Options::key_rotation): the append kernel stores the CPU backend's bits (the
// rotation included, and through demotion), and the kernel, which rotates the queries, agrees
// with the reference.
TEST(DecodeAttentionTest, RotatedKeys) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(17);
  for (int palette : {1, 2, 3, 4}) {  // 3, 4: all NVFP4, all E4M3 (Q^T in shared memory)
    SCOPED_TRACE(absl::StrJoin(Palettes()[palette], " "));
    Options o = MakeOptions(Palettes()[palette], 512);
    o.key_rotation = KeyRotation::kHadamard;
    auto pair = CachePair::Create(o).value();
    const std::vector<SequenceId> seqs = Fill(*pair, {1, 16, 100, 1000, 5000, 33}, &rng);
    for (SequenceId s : seqs) EXPECT_EQ(pair->CompareSequence(s), "");
    for (int group : {1, 4, 8}) {
      EXPECT_EQ(Compare(*pair, seqs, group, &rng), "") << "group " << group;
    }
    EXPECT_EQ(ComparePageWeights(*pair, seqs, 4, &rng, /*nan_heads=*/false), "");
  }
}

// Logits (DecodeOutputs::logits): the kernel decodes the keys the reference decodes (the page
// codec's values, bit for bit) and sums q . k in FP32, so per logit it differs from the
// reference's double sum by the FP32 rounding of 128 products: at most 128 x 2^-24 of
// scale x sum |q_i k_i| <= scale x ||q|| ||k|| (Cauchy-Schwarz, whatever the rotation), which
// kLogitTolerance bounds with room. Past a sequence's length, up to the stride, both are -inf.
constexpr double kLogitTolerance = 1e-5;

// Attends `seqs` with logits on both caches (stride: the longest plus 37) and returns "" when
// the kernel's logits agree with the reference's and its output and LSE bits are those of the
// same call without logits.
std::string CompareLogits(CachePair& pair, const std::vector<SequenceId>& seqs, int group,
                          std::mt19937* rng) {
  const Geometry& g = pair.options().geometry;
  const BatchShape shape(pair, seqs, group);
  const auto& [q_heads, rows, n, scale, ct, gt, built] = shape;
  if (!built) return "BuildPageTables failed";
  const int64_t stride = *std::max_element(ct.seq_lens.begin(), ct.seq_lens.end()) + 37;
  std::vector<float> q(n), ref_out(n), ref_lse(rows), want(rows * stride);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : q) x = normal(*rng);
  absl::Status s = DecodeAttention(pair.cpu(), 0, ct, {q, q_heads, scale},
                                   {absl::MakeSpan(ref_out), absl::MakeSpan(ref_lse),
                                    absl::MakeSpan(want), stride, {}});
  if (!s.ok()) return absl::StrCat("reference: ", s.ToString());
  DeviceBuffer dq, dout(n * 4), dlse(rows * 4), dlogits(rows * stride * 4);
  dq.Upload(q);
  const DecodeQueries queries{absl::MakeConstSpan(static_cast<const float*>(dq.data()), n), q_heads,
                              scale};
  DecodeOutputs out{absl::MakeSpan(static_cast<float*>(dout.data()), n),
                    absl::MakeSpan(static_cast<float*>(dlse.data()), rows), {}, 0, {}};
  std::vector<float> plain[2], with_logits[2];
  for (int logits = 0; logits < 2; ++logits) {
    if (logits) out.logits = absl::MakeSpan(static_cast<float*>(dlogits.data()), rows * stride);
    out.logits_stride = logits ? stride : 0;
    s = DecodeAttention(pair.gpu(), 0, gt, queries, out, {nullptr, true});
    if (!s.ok()) return absl::StrCat("kernel: ", s.ToString());
    std::vector<float>* got = logits ? with_logits : plain;
    got[0] = Download(dout, n), got[1] = Download(dlse, rows);
  }
  for (int i = 0; i < 2; ++i) {
    const std::string diff = CompareFloats(plain[i], with_logits[i]);
    if (!diff.empty()) return absl::StrCat("logits change the output or LSE: ", diff);
  }
  const std::vector<float> got = Download(dlogits, rows * stride);
  double worst = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t length = ct.seq_lens[b];
    std::vector<float> k(static_cast<size_t>(length) * g.num_kv_heads * g.head_dim), v(k.size());
    s = pair.cpu().ReadKV(seqs[b], 0, absl::MakeSpan(k), absl::MakeSpan(v));
    if (!s.ok()) return absl::StrCat("ReadKV: ", s.ToString());
    std::vector<double> k_norm(static_cast<size_t>(length) * g.num_kv_heads);  // [token][head]
    for (size_t i = 0; i < k_norm.size(); ++i) {
      const float* ki = k.data() + i * g.head_dim;
      k_norm[i] = std::sqrt(std::inner_product(ki, ki + g.head_dim, ki, 0.0));
    }
    for (int h = 0; h < q_heads; ++h) {
      const size_t r = b * q_heads + h;
      const float* qr = q.data() + r * g.head_dim;
      const double q_norm = std::sqrt(std::inner_product(qr, qr + g.head_dim, qr, 0.0));
      for (int64_t t = 0; t < stride; ++t) {
        const float a = got[r * stride + t], e = want[r * stride + t];
        if (t >= length) {
          if (a != -INFINITY) return absl::StrCat("row ", r, " token ", t, ": ", a, " past the end");
          continue;
        }
        const double bound =
            kLogitTolerance * scale * q_norm * k_norm[t * g.num_kv_heads + h / group];
        const double err = std::fabs(static_cast<double>(a) - e);
        if (!(err <= bound + 1e-30)) {
          return absl::StrCat("row ", r, " token ", t, " of ", length, ": logit ", a,
                              ", reference ", e, " (bound ", bound, ")");
        }
        worst = std::max(worst, err / std::max(bound / kLogitTolerance, 1e-30));
      }
    }
  }
  std::printf("    %zu sequences, group %d: worst logit error %.2e of scale x |q| |k|\n",
              seqs.size(), group, worst);
  return "";
}

// Mixed palettes (FP8 every scope, NVFP4 along head_dim and tokens, split K/V), plain and
// rotated keys, GQA groups, ragged lengths with an empty sequence and partial tails.
TEST(DecodeAttentionTest, LogitsMatchTheReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(23);
  for (int palette : {0, 1, 2}) {
    for (KeyRotation rotation : {KeyRotation::kNone, KeyRotation::kHadamard}) {
      SCOPED_TRACE(absl::StrCat(absl::StrJoin(Palettes()[palette], " "),
                                rotation == KeyRotation::kNone ? "" : ", rotated keys"));
      Options o = MakeOptions(Palettes()[palette], 512);
      o.key_rotation = rotation;
      auto pair = CachePair::Create(o).value();
      const std::vector<SequenceId> seqs =
          Fill(*pair, {1, 0, 15, 16, 17, 100, 1000, TestScale(5000)}, &rng);
      for (int group : {1, 8, 16}) {
        EXPECT_EQ(CompareLogits(*pair, seqs, group, &rng), "") << "group " << group;
      }
    }
  }
}

TEST(DecodeAttentionTest, Batch256Ragged) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(11);
  auto pair = CachePair::Create(MakeOptions(Palettes()[1], 2048)).value();
  std::vector<int64_t> lengths;
  std::uniform_int_distribution<int64_t> len(1, 2048);
  for (int i = 0; i < TestScale(256); ++i) lengths.push_back(len(rng));
  const std::vector<SequenceId> seqs = Fill(*pair, lengths, &rng);
  EXPECT_EQ(Compare(*pair, seqs, 4, &rng), "");
}

// The policy's shape (NVFP4 old, FP8 middle, FP16 recent and sink) in `layers` layers.
Options PolicyShapeOptions(int layers, int64_t budget_mib) {
  return PaletteOptions(Geometry{layers, 8, 128, 16},
                        {"fp16", "fp8_e4m3/block_head",
                         "k:nvfp4_channel/block_head,v:nvfp4/block_head"},
                        budget_mib);
}

// Adds sequences of `lengths` with random K/V to a pair of PolicyShapeOptions and demotes them
// to that shape: the first block and the last 16 stay FP16, the 128 before them FP8, the rest
// NVFP4. Returns the sequences (none after a failure, which it reports).
std::vector<SequenceId> FillPolicyShape(CachePair& pair, const std::vector<int64_t>& lengths,
                                        std::mt19937* rng) {
  std::vector<SequenceId> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(pair.AddSequence());
  const absl::Status appended = pair.AppendBatch(seqs, lengths);
  if (!appended.ok()) {
    ADD_FAILURE() << appended;
    return {};
  }
  pair.WriteAllLayers(rng, false);
  std::vector<BlockId> warm, cold;
  for (SequenceId s : seqs) {
    const std::vector<BlockId> blocks = pair.gpu().SequenceBlocks(s).value();
    const int64_t n = static_cast<int64_t>(blocks.size());
    for (int64_t j = 1; j + 16 < n; ++j) (j + 128 < n ? cold : warm).push_back(blocks[j]);
  }
  if (!pair.Demote(warm, 1).ok() || !pair.Demote(cold, 2).ok()) {
    ADD_FAILURE() << "Demote failed";
    return {};
  }
  return seqs;
}

// Batch 1 and 3 at long context: split-KV with its merge, the policy shape (NVFP4 old, FP8
// middle, FP16 recent and sink).
TEST(DecodeAttentionTest, LongContextSplitKv) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(13);
  const int64_t context = TestScale(131072);
  auto pair = CachePair::Create(PolicyShapeOptions(1, 2048)).value();
  for (int batch : {1, 3}) {
    std::vector<int64_t> lengths(batch, context);
    lengths.back() = context - 5;
    const std::vector<SequenceId> seqs = FillPolicyShape(*pair, lengths, &rng);
    if (seqs.empty()) return;
    EXPECT_EQ(Compare(*pair, seqs, 4, &rng), "") << "batch " << batch;
    for (SequenceId s : seqs) pair->Release(s);
    ASSERT_TRUE(pair->gpu().EndStep().ok());
    ASSERT_TRUE(pair->cpu().EndStep().ok());
  }
}

// NaN and infinite queries, staged and directly read FP16 pages, split and unsplit sequences:
// a head the reference makes NaN is NaN, never empty (0, -inf); the other heads still agree.
TEST(DecodeAttentionTest, NanOrInfiniteQueriesGiveNanAsTheReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(19);
  for (const auto& palette : {Palettes()[1], std::vector<std::string>{"fp16"}}) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    auto pair = CachePair::Create(MakeOptions(palette, 512)).value();
    const std::vector<SequenceId> seqs = Fill(*pair, {1, 17, 300, TestScale(16384)}, &rng);
    for (int group : {1, 4, 16}) {
      EXPECT_EQ(Compare(*pair, seqs, group, &rng, /*specials=*/true), "") << "group " << group;
    }
  }
}

// A cache of `o` on `backend` holding one sequence of `tokens` tokens (K/V not written), and
// its page tables.
std::unique_ptr<Cache> OneSequence(Options o, BackendKind backend, int64_t tokens,
                                   PageTables* tables) {
  o.backend = backend;
  std::unique_ptr<Cache> cache = Cache::Create(o).value();
  const SequenceId seq = cache->AddSequence().value();
  std::vector<int64_t> slots;
  EXPECT_TRUE(cache->Append(seq, tokens, &slots).ok());
  EXPECT_TRUE(cache->BuildPageTables({seq}, tables).ok());
  return cache;
}

// A prepared step keeps the FP16 staging its first tables chose (TableExtent::entries_of): made
// over all-FP16 tables of a mixed palette (staged), captured, then updated to tables whose
// sequences have more than doubled and whose full blocks were all demoted (FP16 now only the
// partial tails of more entries, which a fresh call would read directly, with another split),
// its graph replays with the bits of the same call uncaptured.
TEST(DecodeAttentionTest, PreparedStepKeepsItsFp16Staging) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(47);
  auto pair = CachePair::Create(MakeOptions(Palettes()[1], 512)).value();
  const std::vector<int64_t> lengths = {100, 1000, TestScale(3000)};
  // Each sequence grows by its length and 48 tokens: at least twice its pages and one more.
  std::vector<int64_t> added;
  for (int64_t length : lengths) added.push_back(length + 48);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int32_t max_pages = static_cast<int32_t>((2 * longest + 48 + 15) / 16);
  std::vector<SequenceId> seqs;
  for (size_t i = 0; i < lengths.size(); ++i) seqs.push_back(pair->AddSequence());
  ASSERT_TRUE(pair->AppendBatch(seqs, lengths).ok());
  pair->WriteAllLayers(&rng, /*specials=*/false);
  PageTables tables;
  ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  absl::StatusOr<PreparedDecode> step =
      PreparedDecode::Create(pair->gpu(), tables, {stream}, max_pages);
  ASSERT_TRUE(step.ok()) << step.status();
  const int q_heads = 8 * 4;
  const size_t rows = seqs.size() * q_heads, n = rows * 128;
  std::vector<float> q(n);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : q) x = normal(rng);
  DeviceBuffer dq, out(n * 4), lse(rows * 4);
  dq.Upload(q);
  const DecodeQueries queries{absl::MakeConstSpan(static_cast<const float*>(dq.data()), n),
                              q_heads, 0.088f};
  const DecodeOutputs outputs{absl::MakeSpan(static_cast<float*>(out.data()), n),
                              absl::MakeSpan(static_cast<float*>(lse.data()), rows), {}, 0, {}};
  auto enqueue = [&] {
    return DecodeAttention(pair->gpu(), 0, *step, queries, outputs, {stream});
  };
  auto results = [&] {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> r = Download(out, n), l = Download(lse, rows);
    r.insert(r.end(), l.begin(), l.end());
    return r;
  };
  ASSERT_TRUE(enqueue().ok());  // one-time setup (the kernels' shared memory limit)
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = enqueue();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_TRUE(pair->AppendBatch(seqs, added).ok());
  pair->WriteAllLayers(&rng, /*specials=*/false);
  std::vector<BlockId> full;
  for (SequenceId s : seqs) {
    const std::vector<BlockId> blocks = pair->gpu().SequenceBlocks(s).value();
    for (BlockId b : blocks) {
      if (pair->gpu().GetBlockInfo(b).value().num_tokens == 16) full.push_back(b);
    }
  }
  ASSERT_TRUE(pair->Demote(full, 3).ok());
  ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
  ASSERT_TRUE(step->Update(tables).ok());
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  const std::vector<float> replayed = results();
  ASSERT_TRUE(enqueue().ok());
  EXPECT_EQ(CompareFloats(replayed, results()), "");
  for (float x : replayed) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(Compare(*pair, seqs, 4, &rng), "");  // a fresh call: read directly, right too
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  step = absl::CancelledError("destroyed before its stream");
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

// Mixed-format palettes (with NVFP4, and without: page LSEs kept in L2) an all-NVFP4 and an all-E4M3
// one (kernels of their own), GQA groups (rows of page LSEs padded to even, PageLseRow: groups 4, 7 (a row of 8
// with its padding) 8 and 16 load a page's LSEs of 4 heads at once, 1 (a row of 2) and 6 one by
// one, 6 in a partial second load), ragged lengths (short, long enough to split), both layers
// max-accumulated into one buffer, with and without NaN query heads.
TEST(DecodeAttentionTest, PageWeightsMatchTheReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(31);
  for (const auto& palette :
       {Palettes()[0], Palettes()[1], Palettes()[3], Palettes()[4], Fp16AndFp8Palette()}) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    auto pair = CachePair::Create(PaletteOptions(Geometry{2, 8, 128, 16}, palette, 512)).value();
    const std::vector<SequenceId> seqs =
        Fill(*pair, {300, 1, 17, 16, 100, 0, 2049, 5000, TestScale(16384)}, &rng);
    for (int group : {1, 4, 6, 7, 8, 16}) {
      for (bool nan_heads : {false, true}) {
        EXPECT_EQ(ComparePageWeights(*pair, seqs, group, &rng, nan_heads), "")
            << "group " << group << (nan_heads ? ", NaN heads" : "");
      }
    }
  }
}

// A batch large enough to fill the GPU without splitting (80 sequences x 8 KV heads): the
// weights kernel after the attention (a split launch weighs its pages in the merge's grid), with
// NVFP4 in the palette and without (page LSEs kept in L2).
TEST(DecodeAttentionTest, PageWeightsUnsplit) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(41);
  for (const auto& palette : {Palettes()[1], Fp16AndFp8Palette()}) {
    SCOPED_TRACE(absl::StrJoin(palette, " "));
    auto pair = CachePair::Create(PaletteOptions(Geometry{2, 8, 128, 16}, palette, 512)).value();
    std::vector<int64_t> lengths(80);
    for (size_t i = 0; i < lengths.size(); ++i) {
      lengths[i] = 1 + static_cast<int64_t>(i * 37 % 700);
    }
    const std::vector<SequenceId> seqs = Fill(*pair, lengths, &rng);
    for (int group : {4, 8}) {
      EXPECT_EQ(ComparePageWeights(*pair, seqs, group, &rng, /*nan_heads=*/group == 8), "")
          << "group " << group;
    }
  }
}

// Batch 1 and 2 at long context, the policy's shape: split-KV (page LSEs from many splits,
// weights in the merge's grid).
TEST(DecodeAttentionTest, PageWeightsSplitKv) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(37);
  auto pair = CachePair::Create(PolicyShapeOptions(2, 3072)).value();
  const int64_t context = TestScale(131072);
  for (int batch : {1, 2}) {
    std::vector<int64_t> lengths(batch, context);
    lengths.back() = context - 9;
    const std::vector<SequenceId> seqs = FillPolicyShape(*pair, lengths, &rng);
    if (seqs.empty()) return;
    for (int group : {4, 8}) {
      EXPECT_EQ(ComparePageWeights(*pair, seqs, group, &rng, /*nan_heads=*/batch == 2), "")
          << "batch " << batch << ", group " << group;
    }
    for (SequenceId s : seqs) pair->Release(s);
    ASSERT_TRUE(pair->gpu().EndStep().ok());
    ASSERT_TRUE(pair->cpu().EndStep().ok());
  }
}

// Launch parameters whose pools have the page layouts of `palette` (8 KV heads, 16-token pages,
// head_dim 128) and nothing else: for the host-side choices of a launch's kernel.
gpu::PagedDecodeParams PaletteParams(const std::vector<const char*>& palette) {
  gpu::PagedDecodeParams p;
  p.num_formats = static_cast<int32_t>(palette.size());
  for (size_t f = 0; f < palette.size(); ++f) {
    p.pools[f].layout = MakePageLayout(8, 16, 128, ParseFormat(palette[f]).value());
  }
  return p;
}

// The page LSEs are stored with an L2 evict_last hint exactly for palettes without an NVFP4
// side (PageLsesKeptInL2: faster for FP16 and FP8, slower with NVFP4, on the H200). Host only.
TEST(DecodeAttentionTest, PageLsesKeptInL2OnlyWithoutNvfp4) {
  const auto kept = [](const std::vector<const char*>& palette) {
    return gpu::PageLsesKeptInL2(PaletteParams(palette));
  };
  EXPECT_TRUE(kept({"fp16"}));
  EXPECT_TRUE(kept({"fp8_e4m3/block_head"}));
  EXPECT_TRUE(kept({"fp16", "fp8_e5m2/token_head"}));
  EXPECT_FALSE(kept({"nvfp4/block_head"}));
  EXPECT_FALSE(kept({"k:fp8_e4m3/block_head,v:nvfp4/block_head"}));
  EXPECT_FALSE(
      kept({"fp16", "fp8_e4m3/block_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"}));
}

// The kernel multiplies a page's probabilities by one V ratio exactly for palettes whose every
// format has at most one V scale per page (ValueScalesUniform; K's scales do not matter). Host
// only.
TEST(DecodeAttentionTest, UniformValueScalesOnlyWithoutPerTokenVScales) {
  const auto uniform = [](const std::vector<const char*>& palette) {
    return gpu::ValueScalesUniform(PaletteParams(palette));
  };
  EXPECT_TRUE(uniform({"fp16"}));
  EXPECT_TRUE(uniform({"fp16", "fp8_e4m3/block_head", "nvfp4/block_head"}));
  EXPECT_TRUE(uniform({"fp8_e5m2/tensor", "nvfp4/tensor", "nvfp4_channel/block_head"}));
  EXPECT_TRUE(uniform({"k:fp8_e4m3/token_head,v:fp8_e4m3/block_head"}));
  EXPECT_FALSE(uniform({"fp8_e4m3/token_head"}));
  EXPECT_FALSE(uniform({"fp16", "fp8_e4m3/block_head", "k:fp16,v:fp8_e5m2/token_head"}));
}

// The split of a batch's pages (ChooseDecodeSplit): one wave of blocks on the multiprocessors
// given, every page in a split, at least 8 pages per split, and over 32 splits (the parts the
// merge loads in one round) only one per 64 pages; 8 warps a block for NVFP4 pages split or of
// at least 512 pages, 4 for shorter unsplit ones and staged FP16 pages (one 8-warp block an
// SM). Host choices over the device's occupancy.
TEST(DecodeAttentionTest, SplitsFillOneWaveWithoutLongMerges) {
  KVTIER_REQUIRE_GPU();
  for (const char* format : {"fp16", "nvfp4/block_head"}) {
    for (int batch : {1, 4, 64}) {
      for (int32_t pages : {1, 64, 512, 1024, 3072, 8192}) {
        gpu::PagedDecodeParams p = PaletteParams({format});
        p.batch = batch, p.num_q_heads = 32, p.num_kv_heads = 8;
        gpu::DecodeSplit split{};
        ASSERT_EQ(gpu::ChooseDecodeSplit(p, pages, 132, &split), cudaSuccess);
        const std::string where = absl::StrCat(format, ", batch ", batch, ", ", pages, " pages: ",
                                               split.num_splits, " x ", split.pages_per_split);
        EXPECT_GE(static_cast<int64_t>(split.num_splits) * split.pages_per_split, pages) << where;
        EXPECT_LT(static_cast<int64_t>(split.num_splits - 1) * split.pages_per_split, pages)
            << where;
        if (split.num_splits > 1) {  // a split launch fits one wave of 16 warps an SM
          EXPECT_LE(split.num_splits * batch * 8 * split.warps_per_block, 16 * 132) << where;
          EXPECT_GE(split.pages_per_split, 8) << where;
        }
        const bool eight =
            (split.num_splits > 1 || pages >= 512) && std::string(format) != "fp16";
        EXPECT_EQ(split.warps_per_block, eight ? 8 : 4) << where;
        EXPECT_LE(split.num_splits, std::max(32, (pages + 63) / 64)) << where;
      }
    }
  }
  gpu::PagedDecodeParams p = PaletteParams({"nvfp4/block_head"});
  p.batch = 1, p.num_q_heads = 32, p.num_kv_heads = 8;
  gpu::DecodeSplit split{};
  ASSERT_EQ(gpu::ChooseDecodeSplit(p, 512, 132, &split), cudaSuccess);  // batch 1 x 8K
  EXPECT_EQ(split.num_splits, 32);
  EXPECT_EQ(split.pages_per_split, 16);
  ASSERT_EQ(gpu::ChooseDecodeSplit(p, 1024, 132, &split), cudaSuccess);  // batch 1 x 16K
  EXPECT_EQ(split.num_splits, 32);
  EXPECT_EQ(split.pages_per_split, 32);
  ASSERT_EQ(gpu::ChooseDecodeSplit(p, 3072, 132, &split), cudaSuccess);  // batch 1 x 48K
  EXPECT_EQ(split.num_splits, 33);  // one wave of 2 x 132 blocks of 8 warps over 8 KV heads
  ASSERT_EQ(gpu::ChooseDecodeSplit(p, 64, 132, &split), cudaSuccess);  // batch 1 x 1K
  EXPECT_EQ(split.num_splits, 8);
  p = PaletteParams({"fp16"});
  p.batch = 1, p.num_q_heads = 32, p.num_kv_heads = 8;
  ASSERT_EQ(gpu::ChooseDecodeSplit(p, 3072, 132, &split), cudaSuccess);  // 2 blocks an SM
  EXPECT_EQ(split.num_splits, 33);
  EXPECT_EQ(split.warps_per_block, 4);
}

// A launch with other than 4 or 8 warps a block is refused before anything runs.
TEST(DecodeAttentionTest, LaunchRefusesOtherWarpCounts) {
  KVTIER_REQUIRE_GPU();
  gpu::PagedDecodeParams p = PaletteParams({"nvfp4/block_head"});
  p.batch = 0, p.num_q_heads = 32, p.num_kv_heads = 8, p.pages_per_split = 1;
  for (int warps : {0, 2, 6, 16}) {
    p.warps_per_block = warps;
    EXPECT_EQ(gpu::LaunchPagedDecode(p, nullptr), cudaErrorInvalidValue) << warps;
  }
  for (int warps : {4, 8}) {  // an empty batch launches nothing
    p.warps_per_block = warps;
    EXPECT_EQ(gpu::LaunchPagedDecode(p, nullptr), cudaSuccess) << warps;
  }
}

// A page_weight span of other than one float per packed entry: InvalidArgument on both
// backends, over the tables and over a prepared step (the CPU backend runs without a GPU).
TEST(DecodeAttentionTest, PageWeightOfTheWrongSizeIsRefused) {
  std::vector<BackendKind> backends = {BackendKind::kCpu};
  if (GpuStatus().ok()) backends.push_back(BackendKind::kCuda);
  for (BackendKind backend : backends) {
    PageTables t;
    const std::unique_ptr<Cache> cache = OneSequence(MakeOptions({"fp16"}, 64), backend, 40, &t);
    const int q_heads = 8, d = 128;
    const size_t entries = t.packed.size();  // 3
    DeviceBuffer device(backend == BackendKind::kCuda ? (q_heads * d * 3 + q_heads + 8) * 4 : 0);
    std::vector<float> host(backend == BackendKind::kCpu ? q_heads * d * 3 + q_heads + 8 : 0, 0.f);
    float* base = backend == BackendKind::kCuda ? static_cast<float*>(device.data()) : host.data();
    const DecodeQueries queries{absl::MakeConstSpan(base, q_heads * d), q_heads, 0.088f};
    for (size_t size : {entries - 1, entries + 1}) {
      const DecodeOutputs out{absl::MakeSpan(base + q_heads * d, q_heads * d),
                              absl::MakeSpan(base + 2 * q_heads * d, q_heads), {}, 0,
                              absl::MakeSpan(base + 2 * q_heads * d + q_heads, size)};
      const absl::Status s = DecodeAttention(*cache, 0, t, queries, out);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
          << (backend == BackendKind::kCpu ? "cpu" : "cuda") << ", " << size << ": " << s;
      absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache, t);
      ASSERT_TRUE(step.ok()) << step.status();
      const absl::Status prepared = DecodeAttention(*cache, 0, *step, queries, out);
      EXPECT_EQ(prepared.code(), absl::StatusCode::kInvalidArgument) << prepared;
    }
  }
}

// The kernel indexes its page-LSE scratch with 32 bits: page weights over a prepared step whose
// capacity (max_pages x sequences) times the query heads (an even group: no padding) passes
// 2^32 - 1 are refused, with the reason, before anything is launched; the same step without
// page weights attends.
TEST(DecodeAttentionTest, PageWeightsOverTooManyEntriesAreRefused) {
  KVTIER_REQUIRE_GPU();
  PageTables t;
  const std::unique_ptr<Cache> cache =
      OneSequence(MakeOptions({"fp16"}, 64), BackendKind::kCuda, 40, &t);
  const int q_heads = 8 * 16, d = 128;  // groups of 16: the smallest capacity that passes
  const auto max_pages = static_cast<int32_t>((int64_t{1} << 32) / q_heads + 1);  // 128 MiB
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache, t, {}, max_pages);
  ASSERT_TRUE(step.ok()) << step.status();
  const size_t entries = t.packed.size();
  DeviceBuffer q(q_heads * d * 4), out(q_heads * d * 4), lse(q_heads * 4), weight(entries * 4);
  cudaMemset(q.data(), 0, q_heads * d * 4);
  const DecodeQueries queries{
      absl::MakeConstSpan(static_cast<const float*>(q.data()), q_heads * d), q_heads, 0.088f};
  DecodeOutputs outputs{absl::MakeSpan(static_cast<float*>(out.data()), q_heads * d),
                        absl::MakeSpan(static_cast<float*>(lse.data()), q_heads), {}, 0,
                        absl::MakeSpan(static_cast<float*>(weight.data()), entries)};
  const absl::Status refused = DecodeAttention(*cache, 0, *step, queries, outputs);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("2^32"), std::string::npos) << refused;
  outputs.page_weight = {};
  EXPECT_TRUE(DecodeAttention(*cache, 0, *step, queries, outputs, {nullptr, true}).ok());
}

// Holds back the work enqueued on `stream` after it by 100 ms (a host function that sleeps).
void HoldBack(cudaStream_t stream) {
  const cudaError_t e = cudaLaunchHostFunc(
      stream, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); },
      nullptr);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

// A step prepared on one stream and read on two others: the reads must wait for the upload
// (held back), and destroying the step right after the calls must free its tables only after
// the readers' kernels (held back too) have run: a step made next on the upload stream reuses
// the freed memory for other tables, so an early free would change the results.
TEST(DecodeAttentionTest, PreparedStepReadFromOtherStreams) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(23);
  auto pair = CachePair::Create(MakeOptions(Palettes()[1], 512)).value();
  const std::vector<SequenceId> seqs = Fill(*pair, {5, 300, 2000, 4096}, &rng);
  const std::vector<SequenceId> others =
      Fill(*pair, {4000, 1, 33, 700}, &rng, /*same_pages=*/false);
  PageTables tables, other_tables;
  ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
  ASSERT_TRUE(pair->gpu().BuildPageTables(others, &other_tables).ok());
  const int q_heads = 8 * 4, dim = 128;
  const size_t rows = seqs.size() * q_heads;
  std::vector<float> q(rows * dim);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : q) x = normal(rng);
  DeviceBuffer dq;
  dq.Upload(q);
  const DecodeQueries queries{absl::MakeConstSpan(static_cast<const float*>(dq.data()), q.size()),
                              q_heads, 0.088f};
  struct Result {
    DeviceBuffer out, lse;
    explicit Result(size_t rows) : out(rows * 128 * 4), lse(rows * 4) {}
    DecodeOutputs View(size_t rows) {
      return {absl::MakeSpan(static_cast<float*>(out.data()), rows * 128),
              absl::MakeSpan(static_cast<float*>(lse.data()), rows), {}, 0, {}};
    }
    std::vector<float> Get(size_t rows) const {
      std::vector<float> host(rows * 129);
      cudaMemcpy(host.data(), out.data(), rows * 128 * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(host.data() + rows * 128, lse.data(), rows * 4, cudaMemcpyDeviceToHost);
      return host;
    }
  };
  Result want(rows), got0(rows), got1(rows);
  ASSERT_TRUE(DecodeAttention(pair->gpu(), 0, tables, queries, want.View(rows), {nullptr, true})
                  .ok());
  cudaStream_t upload, readers[2];
  for (cudaStream_t* s : {&upload, &readers[0], &readers[1]}) {
    ASSERT_EQ(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), cudaSuccess);
  }
  {
    HoldBack(upload);
    absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(pair->gpu(), tables, {upload});
    ASSERT_TRUE(step.ok()) << step.status();
    Result* got[2] = {&got0, &got1};
    for (int i = 0; i < 2; ++i) {
      HoldBack(readers[i]);
      const absl::Status s =
          DecodeAttention(pair->gpu(), 0, *step, queries, got[i]->View(rows), {readers[i]});
      ASSERT_TRUE(s.ok()) << s;
    }
  }  // destroyed while its readers are held back
  {
    absl::StatusOr<PreparedDecode> other =
        PreparedDecode::Create(pair->gpu(), other_tables, {upload});
    ASSERT_TRUE(other.ok()) << other.status();
    for (cudaStream_t s : {upload, readers[0], readers[1]}) {
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    }
    EXPECT_EQ(CompareFloats(got0.Get(rows), want.Get(rows)), "");
    EXPECT_EQ(CompareFloats(got1.Get(rows), want.Get(rows)), "");
  }
  ASSERT_EQ(cudaStreamSynchronize(upload), cudaSuccess);
  for (cudaStream_t s : {upload, readers[0], readers[1]}) cudaStreamDestroy(s);
}

// A decode step captured in a CUDA graph on the engine's stream (attention over a prepared step
// made with room to grow, with page weights, then a merge with a second state), replayed for 32
// steps with a new token per sequence (Append and WriteKV outside the graph,
// PreparedDecode::Update before each replay): the same bits as the same calls uncaptured, and as
// a step freshly made.
TEST(DecodeAttentionTest, CapturedStepReplaysWithNewTokens) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(29);
  auto pair = CachePair::Create(MakeOptions(Palettes()[1], 512)).value();
  const std::vector<SequenceId> seqs = Fill(*pair, {3, 100, 1000, 3000}, &rng);
  constexpr int kSteps = 32;
  const int q_heads = 8 * 4, dim = 128;
  const size_t rows = seqs.size() * q_heads, n = rows * dim;
  const int32_t max_pages = (3000 + kSteps + 15) / 16;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  PageTables tables;
  ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
  absl::StatusOr<PreparedDecode> step =
      PreparedDecode::Create(pair->gpu(), tables, {stream}, max_pages);
  ASSERT_TRUE(step.ok()) << step.status();
  DeviceBuffer dq(n * 4), out(n * 4), lse(rows * 4), other, other_lse, merged(n * 4),
      merged_lse(rows * 4);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> host(n);
  for (float& x : host) x = normal(rng);
  other.Upload(host);
  host.resize(rows);
  for (float& x : host) x = normal(rng);
  other_lse.Upload(host);
  auto span = [](DeviceBuffer& b, size_t size) {
    return absl::MakeSpan(static_cast<float*>(b.data()), size);
  };
  const DecodeQueries queries{span(dq, n), q_heads, 0.088f};
  // Page weights, zeroed by each step (captured too); room for the tables' growth.
  const size_t most_entries = seqs.size() * max_pages;
  DeviceBuffer weights(most_entries * 4);
  auto enqueue = [&](const PreparedDecode& s) {
    const DecodeOutputs outputs{span(out, n), span(lse, rows), {}, 0,
                                span(weights, tables.packed.size())};
    if (cudaMemsetAsync(weights.data(), 0, most_entries * 4, stream) != cudaSuccess) {
      return absl::InternalError("cudaMemsetAsync");
    }
    const absl::Status attended = DecodeAttention(pair->gpu(), 0, s, queries, outputs, {stream});
    if (!attended.ok()) return attended;
    return MergeStatesOn(BackendKind::kCuda, span(out, n), span(lse, rows), span(other, n),
                         span(other_lse, rows), static_cast<int64_t>(rows), dim,
                         span(merged, n), span(merged_lse, rows), {stream});
  };
  auto results = [&] {  // the attention's and the merge's outputs and LSEs, the page weights
    std::vector<float> r(2 * (n + rows) + most_entries);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaMemcpy(r.data(), out.data(), n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r.data() + n, lse.data(), rows * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r.data() + n + rows, merged.data(), n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r.data() + 2 * n + rows, merged_lse.data(), rows * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(r.data() + 2 * (n + rows), weights.data(), most_entries * 4,
               cudaMemcpyDeviceToHost);
    return r;
  };
  ASSERT_TRUE(enqueue(*step).ok());  // one-time setup (the kernels' shared memory limit)
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured = enqueue(*step);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<float> previous;
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_TRUE(
        pair->AppendBatch(seqs, std::vector<int64_t>(seqs.size(), 1), /*same_pages=*/false).ok());
    pair->WriteAllLayers(&rng, false);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_TRUE(pair->gpu().BuildPageTables(seqs, &tables).ok());
    ASSERT_TRUE(step->Update(tables).ok());
    host.resize(n);
    for (float& x : host) x = normal(rng);
    ASSERT_EQ(cudaMemcpyAsync(dq.data(), host.data(), n * 4, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    const std::vector<float> replayed = results();
    ASSERT_TRUE(enqueue(*step).ok());
    ASSERT_EQ(CompareFloats(replayed, results()), "") << "step " << i;
    {
      absl::StatusOr<PreparedDecode> fresh =
          PreparedDecode::Create(pair->gpu(), tables, {stream}, max_pages);
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      ASSERT_TRUE(enqueue(*fresh).ok());
      ASSERT_EQ(CompareFloats(replayed, results()), "") << "step " << i << ", fresh";
    }
    EXPECT_NE(replayed, previous) << "step " << i;
    previous = replayed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  step = absl::CancelledError("destroyed before its stream");
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST(DecodeAttentionTest, MergeKernelMatchesMergeStates) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int64_t rows = 1000;
  const int dim = 96;
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> a(rows * dim), b(rows * dim), sa(rows), sb(rows);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  for (int64_t r = 0; r < rows; ++r) {
    sa[r] = r % 7 == 0 ? -INFINITY : r % 11 == 3 ? NAN : r % 13 == 4 ? INFINITY : normal(rng);
    sb[r] = r % 5 == 0 ? -INFINITY : r % 17 == 6 ? INFINITY : normal(rng);
  }
  std::vector<float> want(rows * dim), want_lse(rows);
  ASSERT_TRUE(MergeStatesOn(BackendKind::kCpu, a, sa, b, sb, rows, dim, absl::MakeSpan(want),
                            absl::MakeSpan(want_lse))
                  .ok());
  DeviceBuffer da, db, dsa, dsb, dout(rows * dim * 4), dlse(rows * 4);
  da.Upload(a), db.Upload(b), dsa.Upload(sa), dsb.Upload(sb);
  auto span = [](const DeviceBuffer& d, size_t n) {
    return absl::MakeConstSpan(static_cast<const float*>(d.data()), n);
  };
  const absl::Status s = MergeStatesOn(
      BackendKind::kCuda, span(da, a.size()), span(dsa, rows), span(db, b.size()),
      span(dsb, rows), rows, dim, absl::MakeSpan(static_cast<float*>(dout.data()), a.size()),
      absl::MakeSpan(static_cast<float*>(dlse.data()), rows), {nullptr, true});
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> got(rows * dim), got_lse(rows);
  cudaMemcpy(got.data(), dout.data(), got.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(got_lse.data(), dlse.data(), rows * 4, cudaMemcpyDeviceToHost);
  for (int64_t r = 0; r < rows; ++r) {
    if (std::isnan(want_lse[r])) {  // a NaN or +inf part: the whole row is NaN
      ASSERT_TRUE(std::isnan(got_lse[r])) << r << ": " << got_lse[r];
      for (int d = 0; d < dim; ++d) ASSERT_TRUE(std::isnan(got[r * dim + d])) << r;
      continue;
    }
    if (std::isinf(want_lse[r])) {
      ASSERT_EQ(got_lse[r], want_lse[r]) << r;
    } else {
      ASSERT_NEAR(got_lse[r], want_lse[r], 1e-5) << r;
    }
    for (int d = 0; d < dim; ++d) {
      ASSERT_NEAR(got[r * dim + d], want[r * dim + d], 1e-5 * (1 + std::fabs(want[r * dim + d])));
    }
  }
}

// The split merge's kernel over as many parts as the decode's split rule allows (128 at 128K
// tokens) and more, head_dims below, at and over a block's threads, against the merge
// worked out in double: empty parts (LSE -inf) among live ones, a row of empty parts, a NaN part
// and a +inf part (the whole row NaN); a part's values where its LSE is -inf are NaN, which must
// not reach the output.
TEST(DecodeAttentionTest, MergeKernelOfManyParts) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.f, 2.f);
  const int64_t rows = 37;
  for (int parts : {1, 5, 32, 33, 70, 130}) {
    for (int dim : {96, 128, 200}) {
      std::vector<float> v(static_cast<size_t>(parts) * rows * dim), s(parts * rows);
      for (float& x : v) x = normal(rng);
      for (int k = 0; k < parts; ++k) {
        for (int64_t r = 0; r < rows; ++r) {
          float& lse = s[k * rows + r];
          lse = r == 3 || (k + r) % 4 == 1 ? -INFINITY : normal(rng);
          if (r == 5 && k == parts / 2) lse = NAN;
          if (r == 6 && k == parts - 1) lse = INFINITY;
          if (lse == -INFINITY) {
            for (int d = 0; d < dim; ++d) v[(k * rows + r) * dim + d] = NAN;
          }
        }
      }
      DeviceBuffer dv, ds, dout(rows * dim * 4), dlse(rows * 4);
      dv.Upload(v), ds.Upload(s);
      gpu::MergeStatesParams p;
      p.v = static_cast<const float*>(dv.data());
      p.s = static_cast<const float*>(ds.data());
      p.v_part_stride = rows * dim;
      p.s_part_stride = rows;
      p.parts = parts;
      p.rows = rows;
      p.head_dim = dim;
      p.out = static_cast<float*>(dout.data());
      p.lse = static_cast<float*>(dlse.data());
      ASSERT_EQ(gpu::LaunchMergeStates(p, nullptr), cudaSuccess);
      std::vector<float> got(rows * dim), got_lse(rows);
      ASSERT_EQ(cudaMemcpy(got.data(), dout.data(), got.size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got_lse.data(), dlse.data(), rows * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      const std::string at = absl::StrCat(parts, " parts, head_dim ", dim, ", row ");
      for (int64_t r = 0; r < rows; ++r) {
        double m = -INFINITY;
        bool nan = false;
        for (int k = 0; k < parts; ++k) {
          nan |= std::isnan(s[k * rows + r]);
          m = std::max(m, static_cast<double>(s[k * rows + r]));
        }
        if (nan || m == INFINITY) {
          ASSERT_TRUE(std::isnan(got_lse[r])) << at << r;
          for (int d = 0; d < dim; ++d) ASSERT_TRUE(std::isnan(got[r * dim + d])) << at << r;
          continue;
        }
        if (m == -INFINITY) {
          ASSERT_EQ(got_lse[r], -INFINITY) << at << r;
          for (int d = 0; d < dim; ++d) ASSERT_EQ(got[r * dim + d], 0.f) << at << r;
          continue;
        }
        std::vector<double> w(parts);
        double total = 0;
        for (int k = 0; k < parts; ++k) total += w[k] = std::exp(s[k * rows + r] - m);
        ASSERT_NEAR(got_lse[r], m + std::log(total), 1e-5 * (1 + std::fabs(m))) << at << r;
        for (int d = 0; d < dim; ++d) {
          double acc = 0;
          for (int k = 0; k < parts; ++k) {
            if (w[k] > 0) acc += w[k] * v[(k * rows + r) * dim + d];
          }
          ASSERT_NEAR(got[r * dim + d], acc / total, 1e-4 * (1 + std::fabs(acc / total)))
              << at << r << ", dim " << d;
        }
      }
    }
  }
}

TEST(DecodeAttentionTest, RefusesWhatItCannotRead) {
  KVTIER_REQUIRE_GPU();
  auto expect_refused = [](const Options& o, int q_heads, const std::string& why) {
    PageTables t;
    const std::unique_ptr<Cache> cache = OneSequence(o, BackendKind::kCuda, 20, &t);
    const int d = o.geometry.head_dim;
    DeviceBuffer q(q_heads * d * 4), out(q_heads * d * 4), lse(q_heads * 4);
    const absl::Status st = DecodeAttention(
        *cache, 0, t, {absl::MakeConstSpan(static_cast<const float*>(q.data()), q_heads * d), q_heads, 1.f},
        {absl::MakeSpan(static_cast<float*>(out.data()), q_heads * d),
         absl::MakeSpan(static_cast<float*>(lse.data()), q_heads), {}, 0, {}});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(why), std::string::npos) << st;
  };
  Options o = MakeOptions({"fp16"}, 64);
  o.geometry.head_dim = 64;
  expect_refused(o, 8, "head_dim");
  expect_refused(MakeOptions({"fp16"}, 64), 8 * 17, "group");
  expect_refused(MakeOptions({"bf16"}, 64), 8, "BF16");
  expect_refused(MakeOptions({"fp16"}, 64), 12, "multiple");
}

}  // namespace
}  // namespace kvtier::testing
