// `kvtier recall`: the generator's statistics, the arms, the metrics and the knee search, the
// .npy loader and the command line. Small geometries so that it runs in seconds under ASan.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "examples/kvtier/commands.h"
#include "examples/kvtier/recall_arms.h"
#include "examples/kvtier/recall_device.h"
#include "examples/kvtier/recall_flags.h"
#include "examples/kvtier/recall_generator.h"
#include "examples/kvtier/recall_metrics.h"
#include "examples/kvtier/recall_npy.h"
#include "examples/kvtier/recall_svg.h"
#include "examples/kvtier/recall_sweep.h"
#include "gtest/gtest.h"
#include "kernels/codec/half.h"
#include "kvtier/policy.h"
#include "kvtier/reference_attention.h"

namespace kvtier::tool {
namespace {

GeneratorOptions SmallGenerator() {
  GeneratorOptions g;
  g.head_dim = 32;
  g.kv_heads = 2;
  g.distractors = 2;
  return g;
}

double Dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

const float* KeyAt(const Trial& t, int64_t p, int h) {
  return t.k.data() + (static_cast<size_t>(p) * t.kv_heads + h) * t.head_dim;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/recall_test_" + std::to_string(getpid()) + "_" + name;
}

// ---- Generator ----

TEST(RecallGeneratorTest, OutlierChannelsSmearOverTheirRotaryPairs) {
  GeneratorOptions g = SmallGenerator();
  g.head_dim = 64;
  g.kv_heads = 1;
  g.outlier_channels = 3;
  g.outlier_gain_min = 10;
  g.outlier_gain_max = 20;
  g.distractors = 0;
  const int64_t length = 2048;
  const int half = g.head_dim / 2;
  int smeared_pairs = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Trial t = *GenerateTrial(g, length, {0.5}, seed);
    std::vector<double> ms(g.head_dim, 0.0);
    for (int64_t p = t.sinks; p < length; ++p) {
      if (p == t.needle[0]) continue;
      for (int c = 0; c < g.head_dim; ++c) ms[c] += KeyAt(t, p, 0)[c] * KeyAt(t, p, 0)[c];
    }
    double total = 0;
    std::vector<std::pair<double, int>> pairs;
    for (int i = 0; i < half; ++i) {
      pairs.emplace_back(ms[i] + ms[i + half], i);
      total += ms[i] + ms[i + half];
    }
    std::sort(pairs.rbegin(), pairs.rend());
    // The energy sits in the outliers' rotary pairs...
    double top = 0;
    for (int n = 0; n < g.outlier_channels; ++n) top += pairs[n].first;
    EXPECT_GT(top / total, 0.8) << "seed " << seed;
    // ...and, where the pair rotates through several turns over the sequence, in both of its
    // channels: RoPE smears each outlier over (i, i + d/2).
    for (int n = 0; n < g.outlier_channels; ++n) {
      const int i = pairs[n].second;
      const double turns = length * std::pow(g.rope_base, -2.0 * i / g.head_dim) / (2 * 3.141592653589793);
      if (turns < 4) continue;
      EXPECT_GT(std::min(ms[i], ms[i + half]) / pairs[n].first, 0.3) << "seed " << seed << " pair " << i;
      ++smeared_pairs;
    }
  }
  EXPECT_GT(smeared_pairs, 0);
}

TEST(RecallGeneratorTest, NeedlesSitAtTheRequestedMarginAndDistractorsAtTheirCosines) {
  GeneratorOptions g = SmallGenerator();
  g.margin = 5.5;
  const std::vector<double> depths = {0, 0.3, 0.7, 1};
  const Trial t = *GenerateTrial(g, 1500, depths, 42);
  ASSERT_EQ(t.group, 4);
  ASSERT_EQ(t.needle.size(), 8u);
  EXPECT_EQ(t.needle[0], t.sinks);       // depth 0: first token after the sinks
  EXPECT_EQ(t.needle[3], t.length - 1);  // depth 1: the last token
  EXPECT_GE(t.sinks, 1);
  EXPECT_LE(t.sinks, 4);
  for (int i = 0; i < t.kv_heads * t.group; ++i) {
    const int h = i / t.group;
    const float* q = t.q.data() + static_cast<size_t>(i) * t.head_dim;
    const double logit = t.softmax_scale * Dot(q, KeyAt(t, t.needle[i], h), t.head_dim);
    EXPECT_NEAR((logit - t.stats[i].mean) / t.stats[i].std, g.margin, 0.05) << i;
    EXPECT_NEAR(t.stats[i].std, g.logit_std, 1e-9);
    for (int s = 0; s < t.sinks; ++s) {
      const double sink = t.softmax_scale * Dot(q, KeyAt(t, s, h), t.head_dim);
      EXPECT_NEAR((sink - t.stats[i].mean) / t.stats[i].std, g.sink_margin, 0.05) << i;
    }
    // The haystack's measured statistics match what the margin was set against.
    double sum = 0, sum2 = 0;
    int64_t n = 0;
    for (int64_t p = t.sinks; p < t.length; ++p) {
      if (p == t.needle[i]) continue;
      const double l = t.softmax_scale * Dot(q, KeyAt(t, p, h), t.head_dim);
      sum += l, sum2 += l * l, ++n;
    }
    const double mean = sum / n, sd = std::sqrt(sum2 / n - mean * mean);
    EXPECT_NEAR(mean, t.stats[i].mean, 0.15 * g.logit_std) << i;
    EXPECT_NEAR(sd, g.logit_std, 0.2 * g.logit_std) << i;
    ASSERT_EQ(t.distractor_positions[i].size(), 2u);
    // Distractors: cosine in [cos_min, cos_max] to the needle once both are centred on the
    // haystack's mean key, and a logit for the needle's query that is that fraction of the
    // needle's lift above the mean.
    std::vector<double> a(t.head_dim), b(t.head_dim);
    for (int64_t p : t.distractor_positions[i]) {
      for (int d = 0; d < t.head_dim; ++d) {
        const float m = t.key_mean[h * t.head_dim + d];
        a[d] = KeyAt(t, t.needle[i], h)[d] - m;
        b[d] = KeyAt(t, p, h)[d] - m;
      }
      double ab = 0, aa = 0, bb = 0;
      for (int d = 0; d < t.head_dim; ++d) ab += a[d] * b[d], aa += a[d] * a[d], bb += b[d] * b[d];
      const double cos = ab / std::sqrt(aa * bb);
      EXPECT_GE(cos, g.cos_min - 2e-3) << i;
      EXPECT_LE(cos, g.cos_max + 2e-3) << i;
      const double l = t.softmax_scale * Dot(q, KeyAt(t, p, h), t.head_dim);
      EXPECT_NEAR((l - t.stats[i].mean) / (g.margin * t.stats[i].std), cos, 0.01) << i;
    }
  }
  // FP16-representable, and the bits match the floats.
  for (size_t i = 0; i < t.k.size(); i += 97) {
    EXPECT_EQ(codec::HalfToFloat(t.k_half[i]), t.k[i]);
    EXPECT_EQ(codec::HalfToFloat(t.v_half[i]), t.v[i]);
  }
}

TEST(RecallGeneratorTest, IsDeterministicInItsSeed) {
  const GeneratorOptions g = SmallGenerator();
  const Trial a = *GenerateTrial(g, 600, {0.5, 1}, 7), b = *GenerateTrial(g, 600, {0.5, 1}, 7);
  const Trial c = *GenerateTrial(g, 600, {0.5, 1}, 8);
  EXPECT_EQ(a.k_half, b.k_half);
  EXPECT_EQ(a.q, b.q);
  EXPECT_NE(a.k_half, c.k_half);
  EXPECT_FALSE(GenerateTrial(g, 20, {0.5, 1}, 7).ok());   // too short for its special tokens
  EXPECT_FALSE(GenerateTrial(g, 600, {1.5}, 7).ok());     // depth out of range
}

// ---- Arms ----

TEST(RecallArmsTest, PolicyArmPlacesBlocksAsThePolicyDoes) {
  const Arm arm = PolicyArm(*PolicyPreset("balanced"));  // fp16 < 256 <= fp8 < 2048 <= nvfp4
  EXPECT_EQ(arm.name, "policy:balanced");
  EXPECT_EQ(arm.palette, PolicyPalette(*PolicyPreset("balanced")));
  const int64_t length = 8192;  // 512 blocks
  EXPECT_EQ(arm.format_of(0, length, 16), 0);    // sinks
  EXPECT_EQ(arm.format_of(1, length, 16), 2);    // age 8176: cold
  EXPECT_EQ(arm.format_of(511, length, 16), 0);  // age 0
  EXPECT_EQ(arm.format_of(496, length, 16), 0);  // age 255
  EXPECT_EQ(arm.format_of(495, length, 16), 1);  // age 256: warm
  EXPECT_EQ(arm.format_of(384, length, 16), 1);  // age 2047
  EXPECT_EQ(arm.format_of(383, length, 16), 2);  // age 2048: cold
  ASSERT_TRUE(arm.policy.has_value());  // run by the cache's policy engine
  EXPECT_EQ(arm.policy->pressure_watermark, 0);
  const std::vector<Arm> standard = StandardArms();
  EXPECT_EQ(standard.front().name, "fp16");
  std::vector<std::string> policies;
  for (const Arm& a : standard) {
    if (a.name.rfind("policy:", 0) == 0) policies.push_back(a.name);
  }
  EXPECT_EQ(policies, (std::vector<std::string>{
                          "policy:fp8", "policy:balanced", "policy:max_capacity",
                          "policy:balanced_rot", "policy:attentive", "policy:fp8_keys",
                          "policy:balanced+rot",
                          "policy:max_capacity+rot"}));
  for (const Arm& a : standard) {  // rotated: the "+rot" arms and the preset meant for it
    const bool rotated = a.name.find("+rot") != std::string::npos || a.name == "policy:balanced_rot";
    EXPECT_EQ(a.key_rotation, rotated ? KeyRotation::kHadamard : KeyRotation::kNone) << a.name;
  }
}

// The attentive preset observes the prompt: the blocks of the needles (which their queries
// single out) stay in FP8 while the haystack around them ages into NVFP4; without the rule
// (attention_keep_ratio 0) they go with it.
TEST(RecallArmsTest, AttentiveArmKeepsTheNeedlesBlocksOneTierHotter) {
  const GeneratorOptions g = SmallGenerator();
  const Trial t = *GenerateTrial(g, 3000, {0.25, 0.5}, 9);
  Policy plain = *PolicyPreset("attentive");
  plain.name = "plain";
  plain.attention_keep_ratio = 0;
  for (const Policy& p : {*PolicyPreset("attentive"), plain}) {
    const Arm arm = PolicyArm(p);
    EXPECT_EQ(arm.observe_prompt, p.attention_keep_ratio > 0);
    auto runner = ArmRunner::Create(arm, t.kv_heads, t.head_dim, 3000, 1024);
    ASSERT_TRUE(runner.ok()) << runner.status();
    ArmRunner::Result r;
    ASSERT_TRUE((*runner)->Run(t, false, &r).ok()) << arm.name;  // placement checked inside
    int cold = 0;
    for (int f : r.block_formats) cold += f == 2;
    EXPECT_GT(cold, 100) << arm.name;  // of 187 full blocks, those older than 1024 tokens
    for (int64_t needle : t.needle) {
      EXPECT_EQ(r.block_formats[needle / 16], arm.observe_prompt ? 1 : 2)
          << arm.name << ": needle at " << needle;
    }
  }
}

TEST(RecallArmsTest, Fp16ArmReproducesTheReferenceBitForBit) {
  const GeneratorOptions g = SmallGenerator();
  const Trial t = *GenerateTrial(g, 700, {0, 0.5, 1}, 3);  // 43 full blocks and a tail
  auto runner = ArmRunner::Create(SingleFormatArm(*ParseFormat("fp16")), t.kv_heads, t.head_dim, 700, 256);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ArmRunner::Result r;
  ASSERT_TRUE((*runner)->Run(t, true, &r).ok());
  const int q_heads = t.kv_heads * t.group;
  std::vector<float> logits(q_heads * t.length), out(q_heads * t.head_dim), lse(q_heads);
  ASSERT_TRUE(DenseDecodeAttention({DenseSequence{t.k, t.v, t.length}}, t.kv_heads, t.head_dim,
                                   DecodeQueries{t.q, q_heads, t.softmax_scale},
                                   DecodeOutputs{absl::MakeSpan(out), absl::MakeSpan(lse),
                                                 absl::MakeSpan(logits), t.length, {}}).ok());
  EXPECT_EQ(r.logits, logits);
  EXPECT_EQ(r.out, out);
  EXPECT_EQ(r.lse, lse);
  EXPECT_EQ(r.compute_rel_error, 0.0);
  EXPECT_DOUBLE_EQ(r.bits_per_element, 16.0);
  // The runner's cache is reused: a second trial runs in the same cache.
  ASSERT_TRUE((*runner)->Run(*GenerateTrial(g, 500, {0, 0.5, 1}, 4), false, &r).ok());
}

TEST(RecallArmsTest, ColdArmsDemoteEveryFullBlockAndKeepTheTailHot) {
  const GeneratorOptions g = SmallGenerator();
  const Trial t = *GenerateTrial(g, 1000, {0.5}, 5);
  for (const Arm& arm : StandardArms()) {
    auto runner = ArmRunner::Create(arm, t.kv_heads, t.head_dim, 1000, 512);
    ASSERT_TRUE(runner.ok()) << arm.name << ": " << runner.status();
    ArmRunner::Result r;
    ASSERT_TRUE((*runner)->Run(t, true, &r).ok()) << arm.name;
    if (arm.key_rotation == KeyRotation::kNone) {
      EXPECT_EQ(r.compute_rel_error, 0.0) << arm.name;  // CPU: paged == dense on the same pages
    } else {
      EXPECT_LT(r.compute_rel_error, 1e-5) << arm.name;  // ReadKV's un-rotation rounds in FP32
    }
    ASSERT_EQ(r.block_formats.size(), 63u) << arm.name;   // 62 full blocks and the tail
    EXPECT_EQ(r.block_formats.back(), 0) << arm.name;     // the tail stays hot
    if (arm.name != "fp16") {
      EXPECT_GT(r.block_formats[10], 0) << arm.name;
    }
    if (arm.name == "fp16") {
      EXPECT_DOUBLE_EQ(r.bits_per_element, 16.0);
    } else if (arm.name.rfind("policy:balanced", 0) == 0) {  // 1000 tokens: sinks and the last 256 hot, FP8
      EXPECT_GT(r.bits_per_element, 9.0);
      EXPECT_LT(r.bits_per_element, 12.0);
    } else {
      EXPECT_LT(r.bits_per_element, 10.0) << arm.name;  // head_dim 32: token scales cost 1 bit
    }
  }
}

// ---- Sweep: the FP16 arm equals the reference; a broken arm has a knee ----

SweepOptions SmallSweep() {
  SweepOptions o;
  o.contexts = {256, 512, 1024};
  o.depths = {0, 0.5, 1};
  o.trials = 16;
  o.threads = 2;
  o.progress = false;
  o.generator = SmallGenerator();
  o.bisect_steps = 2;
  return o;
}

TEST(RecallSweepTest, Fp16ArmRecallEqualsTheFp32ReferenceExactly) {
  SweepOptions o = SmallSweep();
  o.arms = {SingleFormatArm(*ParseFormat("fp16"))};
  const absl::StatusOr<SweepResult> r = RunSweep(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->arms.size(), 1u);
  const ArmSweep& arm = r->arms[0];
  ASSERT_EQ(arm.cells.size(), 9u);
  int64_t hits = 0;
  for (size_t i = 0; i < arm.cells.size(); ++i) {
    const CellStats& s = arm.cells[i].stats;
    EXPECT_EQ(s.top1.n, 16);
    EXPECT_EQ(s.top1.hits, r->reference[i].stats.top1.hits) << i;
    EXPECT_EQ(s.top1.hits, s.reference_top1.hits) << i;
    EXPECT_EQ(s.flips.hits, 0) << i;
    EXPECT_EQ(s.kl.sum, 0.0) << i;
    EXPECT_EQ(s.output_error.sum, 0.0) << i;
    EXPECT_DOUBLE_EQ(s.mass_ratio.mean(), 1.0) << i;
    hits += s.top1.hits;
  }
  EXPECT_GT(hits, 0);
  EXPECT_FALSE(arm.knee.knee.has_value());
}

TEST(RecallSweepTest, ABrokenArmIsDetectedAsDegrading) {
  SweepOptions o = SmallSweep();
  Arm broken = SingleFormatArm(*ParseFormat("fp8_e4m3/tensor"));
  broken.name = "broken: keys clipped by a wrong static scale";
  broken.fixed_k_amax = 0.5f;  // keys are O(10): everything saturates at +-0.5
  o.arms = {SingleFormatArm(*ParseFormat("fp16")), broken};
  const absl::StatusOr<SweepResult> r = RunSweep(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const ArmSweep& arm = r->arms[1];
  ASSERT_TRUE(arm.knee.knee.has_value());
  EXPECT_EQ(*arm.knee.knee, 256);
  EXPECT_TRUE(arm.knee.below_range);
  EXPECT_GT(arm.grid[0].flip_rate, 0.2);
  EXPECT_LT(arm.grid[0].recall, arm.grid[0].baseline_recall - 0.2);
}

TEST(RecallSweepTest, ResultsDoNotDependOnTheThreadCount) {
  SweepOptions o = SmallSweep();
  o.contexts = {300};
  o.arms = {SingleFormatArm(*ParseFormat("nvfp4/block_head"))};
  o.threads = 1;
  const SweepResult a = *RunSweep(o);
  o.threads = 3;
  const SweepResult b = *RunSweep(o);
  for (size_t i = 0; i < a.arms[0].cells.size(); ++i) {
    EXPECT_EQ(a.arms[0].cells[i].stats.top1.hits, b.arms[0].cells[i].stats.top1.hits);
    EXPECT_EQ(a.arms[0].cells[i].stats.kl.sum, b.arms[0].cells[i].stats.kl.sum);
  }
}

// Each arm's compute error is its own: on one thread the arms share a result buffer, and the FP16
// arm (both sides the reference) must not report the rotated arm's un-rotation rounding.
TEST(RecallSweepTest, EachArmReportsItsOwnComputeError) {
  SweepOptions o = SmallSweep();
  o.contexts = {300};
  o.threads = 1;
  o.arms = {SingleFormatArm(*ParseFormat("fp16")),
            RotatedArm(SingleFormatArm(*ParseFormat("nvfp4/block_head")))};
  const absl::StatusOr<SweepResult> r = RunSweep(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->arms[0].max_compute_rel_error, 0.0);
  EXPECT_GT(r->arms[1].max_compute_rel_error, 0.0);
}

// Where no CUDA backend is usable (a build without CUDA, or no device), a sweep on it is
// refused before any work, saying why.
TEST(RecallSweepTest, CudaBackendIsRefusedWhereUnavailable) {
  if (CudaSweepAvailable().ok()) GTEST_SKIP() << "a CUDA device is usable here";
  SweepOptions o = SmallSweep();
  o.arms = {SingleFormatArm(*ParseFormat("fp16"))};
  o.backend = BackendKind::kCuda;
  const absl::StatusOr<SweepResult> r = RunSweep(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("--backend cuda"), absl::string_view::npos) << r.status();
  EXPECT_FALSE(ArmRunner::Create(o.arms[0], 2, 32, 256, 4096, BackendKind::kCuda).ok());
}

// ---- Metrics and the knee ----

TEST(RecallMetricsTest, WilsonIntervals) {
  const Proportion half{50, 100};
  EXPECT_NEAR(half.lo(), 0.4038, 1e-3);
  EXPECT_NEAR(half.hi(), 0.5962, 1e-3);
  const Proportion none{0, 10};
  EXPECT_EQ(none.lo(), 0.0);
  EXPECT_NEAR(none.hi(), 0.2775, 1e-3);
  const Proportion all{20, 20};
  EXPECT_NEAR(all.lo(), 0.8389, 1e-3);
  EXPECT_EQ(all.hi(), 1.0);
}

TEST(RecallMetricsTest, NeedleRankAndMetrics) {
  const std::vector<float> ref = {0.f, 3.f, 1.f, 2.f};
  const std::vector<float> arm = {0.f, 2.f, 1.f, 2.5f};  // needle 1 loses to key 3
  const std::vector<float> out = {1.f, 0.f}, out2 = {1.f, 0.1f};
  auto lse = [](const std::vector<float>& l) {
    double s = 0;
    for (float x : l) s += std::exp(x);
    return static_cast<float>(std::log(s));
  };
  EXPECT_EQ(NeedleRank(ref, 1), 0);
  EXPECT_EQ(NeedleRank(arm, 1), 1);
  const std::vector<float> nan_needle = {0.f, std::nanf(""), 1.f};
  EXPECT_EQ(NeedleRank(nan_needle, 1), 3);  // a miss at every k (it was rank -1, a hit)
  const NeedleMetrics m = CompareNeedle(ref, lse(ref), out, arm, lse(arm), out2, 1, 2);
  EXPECT_TRUE(m.reference_top1);
  EXPECT_FALSE(m.top1);
  EXPECT_TRUE(m.topk);
  EXPECT_TRUE(m.flip);
  EXPECT_NEAR(m.output_error, 0.1, 1e-6);
  EXPECT_GT(m.kl, 0);
  EXPECT_LT(m.mass_ratio, 1);
  const NeedleMetrics same = CompareNeedle(ref, lse(ref), out, ref, lse(ref), out, 1, 1);
  EXPECT_EQ(same.kl, 0);
  EXPECT_DOUBLE_EQ(same.mass_ratio, 1);
  EXPECT_FALSE(same.flip);
  const std::vector<float> tie = {3.f, 3.f};
  EXPECT_EQ(NeedleRank(tie, 0), 1);  // a tie is not a top-1 hit
}

// A synthetic arm whose recall drops by 5 points from `knee` tokens on.
KneePoint Planted(int64_t context, int64_t knee) {
  return KneePoint{context, context < knee ? 0.95 : 0.90, 0.95, 0.0};
}

TEST(RecallKneeTest, BisectionFindsAPlantedKnee) {
  const KneeCriterion c;
  for (int64_t knee : {1500, 5000, 5001, 30000}) {
    std::vector<KneePoint> grid;
    for (int64_t ctx = 1024; ctx <= 32768; ctx *= 2) grid.push_back(Planted(ctx, knee));
    int probes = 0;
    const KneeResult r = FindKnee(grid, c, 20, 16, [&](int64_t ctx) {
      ++probes;
      return Planted(ctx, knee);
    });
    ASSERT_TRUE(r.knee.has_value());
    EXPECT_FALSE(r.below_range);
    EXPECT_GE(*r.knee, knee);
    EXPECT_LE(*r.knee, knee + 16) << "planted " << knee;
    EXPECT_EQ(static_cast<int>(r.probes.size()), probes);
  }
  // Without bisection the knee is the first degraded grid point.
  std::vector<KneePoint> grid;
  for (int64_t ctx = 1024; ctx <= 32768; ctx *= 2) grid.push_back(Planted(ctx, 5000));
  EXPECT_EQ(*FindKnee(grid, c, 0, 16, nullptr).knee, 8192);
}

TEST(RecallKneeTest, NoKneeBelowRangeAndFlipCriterion) {
  const KneeCriterion c;
  std::vector<KneePoint> grid = {{1024, 0.95, 0.95, 0.0}, {2048, 0.95, 0.955, 0.005}};
  EXPECT_FALSE(FindKnee(grid, c, 3, 16, nullptr).knee.has_value());  // 0.5 points, 0.5% flips
  grid[0].recall = 0.90;
  const KneeResult below = FindKnee(grid, c, 3, 16, nullptr);
  EXPECT_EQ(*below.knee, 1024);
  EXPECT_TRUE(below.below_range);
  grid[0].recall = 0.95;
  grid[1].flip_rate = 0.02;  // recall unchanged but 2% of the reference's hits flipped
  EXPECT_TRUE(Degraded(grid[1], c));
  const KneeResult flips = FindKnee(grid, c, 0, 16, nullptr);
  EXPECT_EQ(*flips.knee, 2048);
  // A drop of exactly 1 point, or exactly 1% of flips, is not "more than" the bound.
  EXPECT_FALSE(Degraded({1024, 99 / 100.0, 1.0, 0}, c));
  EXPECT_FALSE(Degraded({1024, 98 / 100.0, 99 / 100.0, 1 / 100.0}, c));
  EXPECT_TRUE(Degraded({1024, 97 / 100.0, 99 / 100.0, 0}, c));
}

// ---- .npy ----

// Writes a little-endian .npy (version 1.0) with `descr` and raw `data`.
void WriteNpy(const std::string& path, const std::string& descr, const std::string& shape,
              const std::string& data, const std::string& fortran = "False") {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.put(static_cast<char>(len & 0xFF));
  f.put(static_cast<char>(len >> 8));
  f << header << data;
}

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

TEST(RecallNpyTest, LoadsFloat32And16KVDumps) {
  const int layers = 2, tokens = 600, heads = 2, dim = 32;
  std::vector<float> k(layers * tokens * heads * dim), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = codec::HalfToFloat(codec::FloatToHalf(std::sin(0.01f * i) * 4));
    v[i] = codec::HalfToFloat(codec::FloatToHalf(std::cos(0.02f * i)));
  }
  const std::string kp = TempPath("k.npy"), vp = TempPath("v.npy");
  WriteNpy(kp, "<f4", "(2, 600, 2, 32)", Bytes(k.data(), k.size() * 4));
  std::vector<uint16_t> vh(v.size());
  for (size_t i = 0; i < v.size(); ++i) vh[i] = codec::FloatToHalf(v[i]);
  WriteNpy(vp, "<f2", "(2, 600, 2, 32)", Bytes(vh.data(), vh.size() * 2));
  const absl::StatusOr<KVDump> dump = LoadKVDump(kp, vp, 1);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->tokens, tokens);
  EXPECT_EQ(dump->kv_heads, heads);
  EXPECT_EQ(dump->head_dim, dim);
  const size_t per_layer = static_cast<size_t>(tokens) * heads * dim;
  EXPECT_EQ(dump->k, std::vector<float>(k.begin() + per_layer, k.end()));
  EXPECT_EQ(dump->v, std::vector<float>(v.begin() + per_layer, v.end()));
  EXPECT_FALSE(LoadKVDump(kp, vp, 2).ok());  // no layer 2

  // The dump is the haystack: outside the planted tokens, a trial is a window of it.
  GeneratorOptions g;
  g.dump = &*dump;
  g.distractors = 1;
  const Trial t = *GenerateTrial(g, 400, {0.5}, 9);
  EXPECT_EQ(t.sinks, 0);
  EXPECT_EQ(t.kv_heads, heads);
  int64_t start = -1;
  for (int64_t s = 0; s + 400 <= tokens && start < 0; ++s) {
    if (std::memcmp(&dump->k[(s + 1) * heads * dim], &t.k[heads * dim], 4 * heads * dim) == 0 &&
        std::memcmp(&dump->k[(s + 2) * heads * dim], &t.k[2 * heads * dim], 4 * heads * dim) == 0) {
      start = s;
    }
  }
  EXPECT_GE(start, 0);

  // And a sweep runs on it.
  SweepOptions o = SmallSweep();
  o.contexts = {300};
  o.generator = g;
  o.arms = {SingleFormatArm(*ParseFormat("fp16"))};
  const absl::StatusOr<SweepResult> r = RunSweep(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kv_heads, heads);
  std::remove(kp.c_str());
  std::remove(vp.c_str());
}

TEST(RecallNpyTest, RefusesWhatItDoesNotSupport) {
  const std::vector<float> x(2 * 16 * 16, 1.f);
  const std::string p = TempPath("bad.npy");
  auto invalid = [&](const std::string& descr, const std::string& shape, size_t bytes,
                     const std::string& fortran = "False") {
    WriteNpy(p, descr, shape, Bytes(x.data(), bytes), fortran);
    return ReadNpy(p).status().code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(ReadNpy(p + ".missing").status().code() == absl::StatusCode::kNotFound);
  EXPECT_TRUE(invalid(">f4", "(2, 16, 16)", x.size() * 4));           // big endian
  EXPECT_TRUE(invalid("<f8", "(2, 16, 16)", x.size() * 4));           // float64
  EXPECT_TRUE(invalid("<f4", "(2, 16, 16)", x.size() * 4, "True"));   // Fortran order
  EXPECT_TRUE(invalid("<f4", "(2, 16, 16)", x.size() * 4 - 4));       // truncated
  EXPECT_TRUE(invalid("<f4", "(1, 1, 2, 16, 16)", x.size() * 4));     // 5-D
  WriteNpy(p, "<f4", "(2, 16, 16)", Bytes(x.data(), x.size() * 4) + std::string(4, '\0'));
  EXPECT_EQ(ReadNpy(p).status().code(), absl::StatusCode::kInvalidArgument);  // longer than declared
  EXPECT_TRUE(invalid("<f4", "(2 0, 16, 16)", x.size() * 4));         // a space inside a number
  // A shape whose element count wraps to 0 in 64 bits (it passed the size check with no data,
  // then LoadKVDump copied 2^37 elements out of nothing), and one of 2^64 elements.
  EXPECT_TRUE(invalid("<f2", "(549755813888, 33554432, 1, 16)", 0));
  EXPECT_TRUE(invalid("<f2", "(4294967296, 4294967296, 1, 16)", 0));
  EXPECT_TRUE(invalid("<f4", "(2, 16, 16)" + std::string(70000, ' '), x.size() * 4));  // header
  // A stream that is not a .npy file is refused at its first bytes, not read to the end.
  EXPECT_EQ(ReadNpy("/dev/zero").status().code(), absl::StatusCode::kInvalidArgument);
  WriteNpy(p, "<f4", "(32,)", Bytes(x.data(), 32 * 4));
  EXPECT_TRUE(ReadNpy(p).ok());
  WriteNpy(p, "<f4", "(1, 512, 16)", Bytes(x.data(), x.size() * 4));
  EXPECT_FALSE(LoadKVDump(p, p, 0).ok());  // 512 KV heads: more than a cache holds
  WriteNpy(p, "<f4", "(2, 16, 16)", Bytes(x.data(), x.size() * 4));
  const absl::StatusOr<NpyArray> ok = ReadNpy(p);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->shape, (std::vector<int64_t>{2, 16, 16}));
  EXPECT_TRUE(LoadKVDump(p, p, 0).ok());
  WriteNpy(p, "<f4", "(2, 16, 12)", Bytes(x.data(), 2 * 16 * 12 * 4));
  EXPECT_FALSE(LoadKVDump(p, p, 0).ok());  // head_dim not a multiple of 16
  std::remove(p.c_str());
}

// ---- Command line ----

int RunTool(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return RunRecall(static_cast<int>(argv.size()), argv.data());
}

TEST(RecallCommandTest, BadFlagsExitWith2) {
  EXPECT_EQ(RunTool({"recall", "--bogus"}), 2);
  EXPECT_EQ(RunTool({"recall", "--contexts", "1k,abc"}), 2);
  EXPECT_EQ(RunTool({"recall", "--contexts", "4k,1k"}), 2);
  EXPECT_EQ(RunTool({"recall", "--contexts", "16"}), 2);  // too short for the needles
  EXPECT_EQ(RunTool({"recall", "--arm", "no-such-arm"}), 2);
  EXPECT_EQ(RunTool({"recall", "--policy", "/nonexistent/policy.json"}), 2);
  EXPECT_EQ(RunTool({"recall", "--policy", "no-such-preset"}), 2);
  EXPECT_EQ(RunTool({"recall", "--trials"}), 2);
  EXPECT_EQ(RunTool({"recall", "--depths", "0,150"}), 2);
  EXPECT_EQ(RunTool({"recall", "--head-dim", "40"}), 2);
  EXPECT_EQ(RunTool({"recall", "--k-npy", "x.npy"}), 2);
  EXPECT_EQ(RunTool({"recall", "--k-npy", "/nonexistent/k.npy", "--v-npy", "/nonexistent/v.npy"}), 2);
  // Arms whose cache refuses the geometry are refused before the sweep (exit 1 after the first
  // trial before); the same arm twice would be one row and one plot.
  EXPECT_EQ(RunTool({"recall", "--head-dim", "96", "--arm", "nvfp4/block_head+rot"}), 2);
  EXPECT_EQ(RunTool({"recall", "--kv-heads", "128", "--head-dim", "1024", "--arm", "fp16"}), 2);
  EXPECT_EQ(RunTool({"recall", "--arm", "fp16", "--arm", "fp16"}), 2);
  EXPECT_EQ(RunTool({"recall", "--policy", "balanced", "--policy", "balanced"}), 2);
  // A context whose one thread needs more than the machine has (16M tokens of 8 KV heads: about
  // 430 GB): refused before any trial. Was: allocations of tens of GB a thread, then an abort.
  EXPECT_EQ(RunTool({"recall", "--contexts", "16384k", "--kv-heads", "8", "--arm", "fp16"}), 2);
  // Two names with one plot file name: one heatmap overwrote the other, with exit 0.
  const std::string a = TempPath("a.json"), b = TempPath("b.json");
  for (const auto& [path, name] : {std::pair{a, "fp8 long"}, std::pair{b, "fp8_long"}}) {
    std::ofstream(path) << "{\"name\": \"" << name << "\", \"tiers\": [{\"format\": \"fp16\"}]}";
  }
  EXPECT_EQ(RunTool({"recall", "--policy", a, "--policy", b}), 2);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(RecallCommandTest, GeometryAndGeneratorLimits) {
  const std::vector<std::string> small = {"--contexts", "1k", "--trials", "1", "--bisect-steps", "0"};
  const auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "recall");
    args.insert(args.end(), small.begin(), small.end());
    return RunTool(args);
  };
  EXPECT_EQ(run({"--head-dim", "96", "--arm", "fp16"}), 0);
  // A generator whose keys overflow FP16 is an error, not a sweep of garbage (it reported
  // FP16 less exact than NVFP4, and a KL of NaN, with exit 0).
  EXPECT_EQ(run({"--arm", "fp16", "--outlier-gain", "1:1e6"}), 1);
}

// --backend picks where the arms run; the CPU unless asked.
TEST(RecallCommandTest, BackendFlag) {
  const auto parse = [](std::vector<std::string> args, RecallFlags* f) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return ParseRecallFlags(static_cast<int>(argv.size()), argv.data(), f);
  };
  RecallFlags f;
  EXPECT_EQ(parse({"recall"}, &f), std::nullopt);
  EXPECT_EQ(f.sweep.backend, BackendKind::kCpu);
  RecallFlags cuda;
  EXPECT_EQ(parse({"recall", "--backend", "cuda"}, &cuda), std::nullopt);
  EXPECT_EQ(cuda.sweep.backend, BackendKind::kCuda);
  RecallFlags cpu;
  EXPECT_EQ(parse({"recall", "--backend=cpu"}, &cpu), std::nullopt);
  EXPECT_EQ(cpu.sweep.backend, BackendKind::kCpu);
  RecallFlags bad;
  EXPECT_EQ(parse({"recall", "--backend", "gpu"}, &bad), 2);
  EXPECT_EQ(parse({"recall", "--backend"}, &bad), 2);
  if (!CudaSweepAvailable().ok()) {  // refused with exit status 1, before any trial runs
    const std::string dir = TempPath("cuda_plots");
    EXPECT_EQ(RunTool({"recall", "--backend", "cuda", "--contexts", "256", "--trials", "2",
                       "--head-dim", "32", "--kv-heads", "2", "--arm", "fp16", "--no-progress",
                       "--plots", dir}),
              1);
    EXPECT_FALSE(std::filesystem::exists(dir)) << "a refused command leaves no folder behind";
  }
}

// Each standard arm's heatmap has a file of its own ("policy:balanced_rot" and
// "policy:balanced+rot" are both standard arms).
TEST(RecallCommandTest, StandardArmsHaveDistinctPlotNames) {
  std::set<std::string> slugs;
  for (const Arm& arm : StandardArms()) EXPECT_TRUE(slugs.insert(Slug(arm.name)).second) << arm.name;
}

TEST(RecallCommandTest, WritesJsonAndPlots) {
  const std::string json = TempPath("out.json"), dir = TempPath("plots");
  ASSERT_EQ(RunTool({"recall", "--contexts=256,512", "--trials", "4", "--depths", "0,50,100",
                 "--head-dim", "32", "--kv-heads", "2", "--arm", "fp16", "--arm",
                 "k:nvfp4_channel/block_head,v:nvfp4/block_head", "--no-progress", "--json", json,
                 "--plots", dir}),
            0);
  std::ifstream f(json);
  std::stringstream text;
  text << f.rdbuf();
  for (const char* key : {"\"arms\"", "\"knee_context_tokens\"", "\"cells\"", "\"recall_top1\"",
                          "\"ci95\"", "\"flip_rate\"", "\"context_tokens\"", "\"depth\""}) {
    EXPECT_NE(text.str().find(key), std::string::npos) << key;
  }
  for (const std::string& name : std::vector<std::string>{"recall_vs_context.svg", "flip_rate_vs_context.svg", "heatmap_fp16.svg",
        "heatmap_" + Slug("k:nvfp4_channel/block_head,v:nvfp4/block_head") + ".svg"}) {
    std::ifstream svg(dir + "/" + name);
    std::string first;
    std::getline(svg, first);
    EXPECT_EQ(first.rfind("<svg", 0), 0u) << name;
    std::remove((dir + "/" + name).c_str());
  }
  rmdir(dir.c_str());
  std::remove(json.c_str());
}

}  // namespace
}  // namespace kvtier::tool
