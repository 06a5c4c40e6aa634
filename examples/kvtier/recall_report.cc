#include "examples/kvtier/recall_report.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "examples/kvtier/output_path.h"

namespace kvtier::tool {
namespace {

template <typename... Args>
std::string Fmt(const char* format, Args... args) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, args...);
  return buf;
}

std::string Num(double x) {
  if (!std::isfinite(x)) return "null";
  return Fmt("%.6g", x);
}

std::string Ci(double lo, double hi) { return absl::StrCat("[", Num(lo), ", ", Num(hi), "]"); }
std::string MeanCi(const MeanCI& m) {
  return Ci(m.mean() - m.half_width(), m.mean() + m.half_width());
}

CellStats PoolContext(const std::vector<CellResult>& cells, int64_t context) {
  CellStats all;
  for (const CellResult& c : cells) {
    if (c.context == context) all.Merge(c.stats);
  }
  return all;
}

std::string Percent(double x) { return Fmt("%.1f", 100 * x); }

std::string CellJson(const CellResult& c) {
  const CellStats& s = c.stats;
  return absl::StrCat(
      "{\"context_tokens\": ", c.context, ", \"depth\": ", Num(c.depth), ", \"trials\": ", s.top1.n,
      ", \"recall_top1\": ", Num(s.top1.value()), ", \"ci95\": ", Ci(s.top1.lo(), s.top1.hi()),
      ", \"flip_rate\": ", Num(s.flips.value()), ", \"flip_ci95\": ", Ci(s.flips.lo(), s.flips.hi()),
      ", \"recall_topk\": ", Num(s.topk.value()), ", \"topk_ci95\": ", Ci(s.topk.lo(), s.topk.hi()),
      ", \"reference_recall_top1\": ", Num(s.reference_top1.value()),
      ", \"needle_mass_ratio\": ", Num(s.mass_ratio.mean()), ", \"needle_mass_ratio_ci95\": ", MeanCi(s.mass_ratio),
      ", \"kl\": ", Num(s.kl.mean()), ", \"kl_ci95\": ", MeanCi(s.kl),
      ", \"rel_output_error\": ", Num(s.output_error.mean()),
      ", \"rel_output_error_ci95\": ", MeanCi(s.output_error), "}");
}

std::string PointJson(const KneePoint& p, const KneeCriterion& c) {
  return absl::StrCat("{\"context_tokens\": ", p.context, ", \"recall_top1\": ", Num(p.recall),
                      ", \"baseline_recall_top1\": ", Num(p.baseline_recall),
                      ", \"flip_rate\": ", Num(p.flip_rate),
                      ", \"degraded\": ", Degraded(p, c) ? "true" : "false", "}");
}

}  // namespace

std::string ContextLabel(int64_t tokens) {
  if (tokens < 1024) return absl::StrCat(tokens);
  if (tokens % 1024 == 0) return absl::StrCat(tokens / 1024, "K");
  return Fmt("%.1fK", tokens / 1024.0);
}

std::string KneeLabel(const ArmSweep& arm, int64_t largest_context) {
  if (!arm.knee.knee) return "none up to " + ContextLabel(largest_context);
  if (arm.knee.below_range) return "<= " + ContextLabel(*arm.knee.knee);
  return ContextLabel(*arm.knee.knee);
}

void PrintMarkdown(const SweepOptions& o, const SweepResult& r, const RunInfo& info, FILE* out) {
  const int64_t largest = o.contexts.back();
  const std::string at = ContextLabel(largest);
  std::fprintf(out, "# kvtier recall\n\n`%s` (%s; %d trials per cell = %d trial sequences x %d KV heads; "
               "head_dim %d; %zu depths; arms on the %s; %.0f s)\n\n",
               info.command.c_str(), info.date.c_str(), r.trials_per_cell, r.sequences_per_cell,
               r.kv_heads, r.head_dim, o.depths.size(),
               o.backend == BackendKind::kCuda ? "GPU (fused kernel)" : "CPU (reference)", r.seconds);
  std::fprintf(out,
               "Knee: smallest context where top-1 recall (pooled over depths) falls more than %.1f "
               "points below the %s, or the flip rate exceeds %.1f%%. Metrics at %s tokens, pooled "
               "over depths, with 95%% intervals.\n\n",
               100 * o.criterion.max_recall_drop,
               std::none_of(r.arms.begin(), r.arms.end(),
                            [](const ArmSweep& a) { return a.name == "fp16"; })
                   ? "FP32 reference"
                   : "FP16 arm",  // as RunSweep chooses the baseline: "fp16" wherever it is
               100 * o.criterion.max_flip_rate, at.c_str());
  std::fprintf(out, "| arm | bits/elem | knee (tokens) | top-1 recall %% | flip rate %% | top-%d %% | "
               "needle mass ratio | KL (nats) | output rel. error |\n", o.top_k);
  std::fprintf(out, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const CellStats ref = PoolContext(r.reference, largest);
  std::fprintf(out, "| FP32 reference | 32 | — | %s [%s, %s] | — | — | 1 | 0 | 0 |\n",
               Percent(ref.top1.value()).c_str(), Percent(ref.top1.lo()).c_str(),
               Percent(ref.top1.hi()).c_str());
  for (const ArmSweep& arm : r.arms) {
    const CellStats s = PoolContext(arm.cells, largest);
    std::fprintf(out, "| %s | %.2f | %s | %s [%s, %s] | %s [%s, %s] | %s | %.3f | %.2e | %.2e |\n",
                 arm.name.c_str(), arm.bits_per_element, KneeLabel(arm, largest).c_str(),
                 Percent(s.top1.value()).c_str(), Percent(s.top1.lo()).c_str(),
                 Percent(s.top1.hi()).c_str(), Percent(s.flips.value()).c_str(),
                 Percent(s.flips.lo()).c_str(), Percent(s.flips.hi()).c_str(),
                 Percent(s.topk.value()).c_str(), s.mass_ratio.mean(), s.kl.mean(),
                 s.output_error.mean());
  }
  for (int table = 0; table < 2; ++table) {
    std::fprintf(out, "\n%s per context (pooled over depths, %%):\n\n| arm |",
                 table == 0 ? "Top-1 recall" : "Flip rate");
    for (int64_t c : o.contexts) std::fprintf(out, " %s |", ContextLabel(c).c_str());
    std::fprintf(out, "\n| --- |");
    for (size_t i = 0; i < o.contexts.size(); ++i) std::fprintf(out, " --- |");
    std::fprintf(out, "\n");
    if (table == 0) {
      std::fprintf(out, "| FP32 reference |");
      for (int64_t c : o.contexts) {
        std::fprintf(out, " %s |", Percent(PoolContext(r.reference, c).top1.value()).c_str());
      }
      std::fprintf(out, "\n");
    }
    for (const ArmSweep& arm : r.arms) {
      std::fprintf(out, "| %s |", arm.name.c_str());
      for (int64_t c : o.contexts) {
        const CellStats s = PoolContext(arm.cells, c);
        std::fprintf(out, " %s |", Percent(table == 0 ? s.top1.value() : s.flips.value()).c_str());
      }
      std::fprintf(out, "\n");
    }
  }
}

absl::Status WriteJson(const SweepOptions& o, const SweepResult& r, const RunInfo& info,
                       const std::string& path) {
  std::ostringstream f;
  const GeneratorOptions& g = o.generator;
  std::string contexts, depths;
  for (int64_t c : o.contexts) absl::StrAppend(&contexts, contexts.empty() ? "" : ", ", c);
  for (double d : o.depths) absl::StrAppend(&depths, depths.empty() ? "" : ", ", Num(d));
  f << "{\n  \"command\": " << JsonString(info.command) << ",\n  \"date\": " << JsonString(info.date)
    << ",\n  \"seconds\": " << Num(r.seconds) << ",\n  \"settings\": {\"contexts\": [" << contexts
    << "], \"depths\": [" << depths << "], \"trials_per_cell\": " << r.trials_per_cell
    << ", \"sequences_per_cell\": " << r.sequences_per_cell << ", \"kv_heads\": " << r.kv_heads
    << ", \"head_dim\": " << r.head_dim << ", \"top_k\": " << o.top_k << ", \"seed\": " << o.seed
    << ", \"backend\": " << (o.backend == BackendKind::kCuda ? "\"cuda\"" : "\"cpu\"")
    << ", \"source\": " << (g.dump ? "\"npy\"" : "\"synthetic\"") << ", \"rope_base\": " << Num(g.rope_base)
    << ", \"margin\": " << Num(g.margin) << ", \"sink_margin\": " << Num(g.sink_margin)
    << ", \"logit_std\": " << Num(g.logit_std) << ", \"distractors\": " << g.distractors
    << ", \"distractor_cosine\": " << Ci(g.cos_min, g.cos_max)
    << ", \"outlier_channels\": " << g.outlier_channels
    << ", \"outlier_gain\": " << Ci(g.outlier_gain_min, g.outlier_gain_max)
    << ", \"knee_max_recall_drop\": " << Num(o.criterion.max_recall_drop)
    << ", \"knee_max_flip_rate\": " << Num(o.criterion.max_flip_rate)
    << ", \"bisect_steps\": " << o.bisect_steps << "},\n";
  f << "  \"reference\": {\"name\": \"fp32-reference\", \"cells\": [";
  for (size_t i = 0; i < r.reference.size(); ++i) {
    f << (i ? ",\n    " : "\n    ") << CellJson(r.reference[i]);
  }
  f << "]},\n  \"arms\": [";
  for (size_t a = 0; a < r.arms.size(); ++a) {
    const ArmSweep& arm = r.arms[a];
    std::string palette;
    for (const std::string& p : arm.palette) absl::StrAppend(&palette, palette.empty() ? "" : ", ", JsonString(p));
    f << (a ? ",\n" : "\n") << "   {\"name\": " << JsonString(arm.name) << ", \"palette\": [" << palette
      << "], \"bits_per_element\": " << Num(arm.bits_per_element) << ", \"knee_context_tokens\": "
      << (arm.knee.knee ? absl::StrCat(*arm.knee.knee) : "null")
      << ", \"knee_below_range\": " << (arm.knee.below_range ? "true" : "false")
      << ", \"max_compute_rel_error\": " << Num(arm.max_compute_rel_error) << ",\n    \"knee_probes\": [";
    for (size_t i = 0; i < arm.knee.probes.size(); ++i) {
      f << (i ? ", " : "") << PointJson(arm.knee.probes[i], o.criterion);
    }
    f << "],\n    \"contexts\": [";
    for (size_t i = 0; i < arm.grid.size(); ++i) {
      f << (i ? ",\n     " : "\n     ") << PointJson(arm.grid[i], o.criterion);
    }
    f << "],\n    \"cells\": [";
    for (size_t i = 0; i < arm.cells.size(); ++i) {
      f << (i ? ",\n     " : "\n     ") << CellJson(arm.cells[i]);
    }
    f << "]}";
  }
  f << "\n  ]\n}\n";
  return WriteOutputFile(path, f.str());
}

}  // namespace kvtier::tool
