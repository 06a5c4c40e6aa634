// `kvtier recall`: at which context length, needle depth and format does retrieval start to
// fail? Runs the recall sweep (recall_sweep.h) over the arms (recall_arms.h) on synthetic or
// user-supplied K/V and reports the knee per arm as Markdown (stdout), JSON and SVG plots.
// docs/recall.md explains the method and the results.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "examples/kvtier/commands.h"
#include "examples/kvtier/recall_report.h"
#include "examples/kvtier/recall_svg.h"
#include "examples/kvtier/recall_sweep.h"

namespace kvtier::tool {
namespace {

const char kUsage[] =
    "usage: kvtier recall [options]\n"
    "Sweeps needle retrieval over context length x depth for every arm (format or policy);\n"
    "prints Markdown tables, the knee per arm, and progress on stderr. See docs/recall.md.\n"
    "  --quick                 a short smoke sweep (contexts 1K,4K,32K; 16 trials per cell)\n"
    "  --contexts LIST         context lengths, e.g. 1k,2k,4k (k = 1024); default 1k..128k\n"
    "  --depths LIST           needle depths in percent; default 0,10,25,40,50,75,90,100\n"
    "  --trials N              needle trials per cell (default 64; quick 16)\n"
    "  --arm NAME              run this arm (repeatable); default: all; --list-arms shows them\n"
    "  --json PATH             write the results as JSON\n"
    "  --plots DIR             write SVG plots into DIR\n"
    "  --seed N                generator seed (default 1)\n"
    "  --threads N             worker threads (default: all cores)\n"
    "  --kv-heads N            KV heads (default 4)\n"
    "  --head-dim N            head_dim, a multiple of 16 (default 128)\n"
    "  --rope-base X           RoPE base (default 10000; Llama 3 uses 500000)\n"
    "  --margin X              needle logit above the haystack mean, in stds (default 5)\n"
    "  --sink-margin X         sink logits above the haystack mean, in stds (default 4)\n"
    "  --logit-std X           std of the haystack logits (default 2)\n"
    "  --distractors N         hard distractors per needle (default 4)\n"
    "  --distractor-cos LO:HI  their cosine to the needle (default 0.5:0.95)\n"
    "  --outliers N            outlier key channels per head (default 4)\n"
    "  --outlier-gain LO:HI    their gain over the other channels (default 1:20)\n"
    "  --top-k N               k of the top-k recall (default 5)\n"
    "  --bisect-steps N        bisection probes per knee (default 3; quick 1)\n"
    "  --k-npy PATH --v-npy PATH [--npy-layer N] [--queries-npy PATH]\n"
    "                          real K/V instead of the synthetic haystack (docs/recall.md)\n"
    "  --no-progress           no progress on stderr\n";

int BadFlag(const std::string& why) {
  std::fprintf(stderr, "kvtier recall: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool ParseContexts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::string p(part);
    int64_t mult = 1;
    if (!p.empty() && (p.back() == 'k' || p.back() == 'K')) {
      mult = 1024;
      p.pop_back();
    }
    int64_t v;
    if (!absl::SimpleAtoi(p, &v) || v < 1 || v > (int64_t{1} << 24) / mult) return false;
    out->push_back(v * mult);
  }
  for (size_t i = 1; i < out->size(); ++i) {
    if ((*out)[i] <= (*out)[i - 1]) return false;
  }
  return !out->empty();
}

bool ParseRange(const std::string& text, double* lo, double* hi) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  return parts.size() == 2 && absl::SimpleAtod(parts[0], lo) && absl::SimpleAtod(parts[1], hi) &&
         *lo <= *hi;
}

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

int RunRecall(int argc, char** argv) {
  SweepOptions o;
  o.arms = StandardArms();
  std::vector<std::string> arm_names;
  std::optional<std::vector<int64_t>> contexts;
  std::optional<int> trials, bisect;
  std::string json, plots, k_npy, v_npy, q_npy;
  int npy_layer = 0;
  bool quick = false;
  o.depths = {0, 0.10, 0.25, 0.40, 0.50, 0.75, 0.90, 1.0};
  RunInfo info;
  info.command = "kvtier";
  for (int i = 0; i < argc; ++i) info.command += std::string(" ") + argv[i];
  info.date = UtcNow();

  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    const size_t eq = flag.find('=');
    const bool has_eq = flag.rfind("--", 0) == 0 && eq != std::string::npos;
    if (has_eq) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto next = [&](std::string* v) {
      if (has_eq) return (*v = value, true);
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    auto int_flag = [&](int lo, int hi, int* out) {
      std::string v;
      return next(&v) && absl::SimpleAtoi(v, out) && *out >= lo && *out <= hi;
    };
    auto double_flag = [&](double* out) {
      std::string v;
      return next(&v) && absl::SimpleAtod(v, out) && std::isfinite(*out);
    };
    std::string v;
    int n = 0;
    bool ok = true;
    if (flag == "--help" || flag == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (flag == "--list-arms") {
      for (const Arm& arm : o.arms) std::printf("%s\n", arm.name.c_str());
      return 0;
    } else if (flag == "--quick" && !has_eq) {
      quick = true;
    } else if (flag == "--no-progress" && !has_eq) {
      o.progress = false;
    } else if (flag == "--contexts") {
      std::vector<int64_t> c;
      ok = next(&v) && ParseContexts(v, &c);
      contexts = c;
    } else if (flag == "--depths") {
      o.depths.clear();
      ok = next(&v);
      for (absl::string_view part : absl::StrSplit(v, ',')) {
        double d;
        ok = ok && absl::SimpleAtod(part, &d) && d >= 0 && d <= 100;
        o.depths.push_back(d / 100);
      }
      ok = ok && o.depths.size() <= 64;
    } else if (flag == "--trials") {
      ok = int_flag(1, 1 << 20, &n);
      trials = n;
    } else if (flag == "--arm") {
      ok = next(&v);
      arm_names.push_back(v);
    } else if (flag == "--json") {
      ok = next(&json);
    } else if (flag == "--plots") {
      ok = next(&plots);
    } else if (flag == "--seed") {
      ok = next(&v) && absl::SimpleAtoi(v, &o.seed);
    } else if (flag == "--threads") {
      ok = int_flag(1, 1024, &o.threads);
    } else if (flag == "--kv-heads") {
      ok = int_flag(1, 256, &o.generator.kv_heads);
    } else if (flag == "--head-dim") {
      ok = int_flag(16, 1024, &o.generator.head_dim) && o.generator.head_dim % 16 == 0;
    } else if (flag == "--rope-base") {
      ok = double_flag(&o.generator.rope_base) && o.generator.rope_base > 1;
    } else if (flag == "--margin") {
      ok = double_flag(&o.generator.margin);
    } else if (flag == "--sink-margin") {
      ok = double_flag(&o.generator.sink_margin);
    } else if (flag == "--logit-std") {
      ok = double_flag(&o.generator.logit_std) && o.generator.logit_std > 0;
    } else if (flag == "--distractors") {
      ok = int_flag(0, 1000, &o.generator.distractors);
    } else if (flag == "--distractor-cos") {
      ok = next(&v) && ParseRange(v, &o.generator.cos_min, &o.generator.cos_max) &&
           o.generator.cos_min >= -1 && o.generator.cos_max <= 1;
    } else if (flag == "--outliers") {
      ok = int_flag(0, 1024, &o.generator.outlier_channels);
    } else if (flag == "--outlier-gain") {
      ok = next(&v) && ParseRange(v, &o.generator.outlier_gain_min, &o.generator.outlier_gain_max) &&
           o.generator.outlier_gain_min > 0;
    } else if (flag == "--top-k") {
      ok = int_flag(1, 1 << 20, &o.top_k);
    } else if (flag == "--bisect-steps") {
      ok = int_flag(0, 20, &n);
      bisect = n;
    } else if (flag == "--k-npy") {
      ok = next(&k_npy);
    } else if (flag == "--v-npy") {
      ok = next(&v_npy);
    } else if (flag == "--queries-npy") {
      ok = next(&q_npy);
    } else if (flag == "--npy-layer") {
      ok = int_flag(0, 1 << 16, &npy_layer);
    } else {
      return BadFlag("unknown flag '" + std::string(argv[i]) + "'");
    }
    if (!ok) return BadFlag("bad or missing value for " + flag);
  }
  if (!arm_names.empty()) {
    std::vector<Arm> chosen;
    for (const std::string& name : arm_names) {
      bool found = false;
      for (const Arm& arm : o.arms) {
        if (arm.name == name) chosen.push_back(arm), found = true;
      }
      if (!found) return BadFlag("unknown arm '" + name + "' (--list-arms shows them)");
    }
    o.arms = chosen;
  }
  if (k_npy.empty() != v_npy.empty()) return BadFlag("--k-npy and --v-npy go together");
  if (k_npy.empty() && (!q_npy.empty() || npy_layer != 0)) {
    return BadFlag("--queries-npy and --npy-layer need --k-npy and --v-npy");
  }

  KVDump dump;
  NpyArray queries;
  const std::vector<int64_t> full_grid = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
  o.contexts = contexts ? *contexts
                        : quick ? std::vector<int64_t>{1024, 4096, 32768} : full_grid;
  o.trials = trials ? *trials : quick ? 16 : 64;
  o.bisect_steps = bisect ? *bisect : quick ? 1 : 3;
  if (!k_npy.empty()) {
    absl::StatusOr<KVDump> loaded = LoadKVDump(k_npy, v_npy, npy_layer);
    if (!loaded.ok()) return BadFlag(std::string(loaded.status().message()));
    dump = std::move(*loaded);
    o.generator.dump = &dump;
    if (!q_npy.empty()) {
      absl::StatusOr<NpyArray> q = LoadQueries(q_npy, dump.head_dim);
      if (!q.ok()) return BadFlag(std::string(q.status().message()));
      queries = std::move(*q);
      o.generator.queries = &queries;
    }
    if (!contexts) {
      std::vector<int64_t> fit;
      for (int64_t c : o.contexts) {
        if (c <= dump.tokens) fit.push_back(c);
      }
      if (fit.empty()) fit.push_back(dump.tokens);
      o.contexts = fit;
    } else if (o.contexts.back() > dump.tokens) {
      return BadFlag("a context is longer than the dump's " + std::to_string(dump.tokens) + " tokens");
    }
  }
  const int64_t specials = 2 * (4 + static_cast<int64_t>(o.depths.size()) * (1 + o.generator.distractors)) + 16;
  if (o.depths.empty() || o.contexts.front() < specials) {
    return BadFlag("the smallest context must hold every needle, sink and distractor (>= " +
                   std::to_string(specials) + " tokens)");
  }

  absl::StatusOr<SweepResult> result = RunSweep(o);
  if (!result.ok()) {
    std::fprintf(stderr, "kvtier recall: %s\n", result.status().ToString().c_str());
    return 1;
  }
  PrintMarkdown(o, *result, info, stdout);
  if (!json.empty()) {
    const absl::Status s = WriteJson(o, *result, info, json);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier recall: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (!plots.empty()) {
    const absl::Status s = WritePlots(o, *result, plots);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier recall: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvtier::tool
