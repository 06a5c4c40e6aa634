#include "examples/kvtier/recall_flags.h"

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "examples/kvtier/recall_svg.h"

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
    "  --policy NAME|FILE      run a policy preset or JSON policy file as an arm (repeatable;\n"
    "                          with --arm or alone, instead of all arms; a FILE path holds\n"
    "                          a '/' or ends in .json)\n"
    "  --json PATH             write the results as JSON\n"
    "  --plots DIR             write SVG plots into DIR\n"
    "  --seed N                generator seed (default 1)\n"
    "  --threads N             worker threads (default: all cores)\n"
    "  --backend cpu|cuda      where the arms' caches live and attend: the CPU reference\n"
    "                          (default) or the GPU's fused kernel (a kvtier built with CUDA)\n"
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

// Walks argv: each flag, with its value either inline ("--flag=value") or as the next argument.
class FlagReader {
 public:
  FlagReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next flag; false when none is left.
  bool Next() {
    if (++i_ >= argc_) return false;
    arg_ = argv_[i_];
    flag_ = arg_;
    const size_t eq = flag_.find('=');
    has_eq_ = flag_.rfind("--", 0) == 0 && eq != std::string::npos;
    if (has_eq_) {
      value_ = flag_.substr(eq + 1);
      flag_ = flag_.substr(0, eq);
    }
    return true;
  }
  const std::string& arg() const { return arg_; }    // as written
  const std::string& flag() const { return flag_; }  // without "=value"
  bool has_eq() const { return has_eq_; }

  // The flag's value: inline, else the next argument (consumed); false when there is none.
  bool Value(std::string* v) {
    if (has_eq_) return (*v = value_, true);
    if (i_ + 1 >= argc_) return false;
    *v = argv_[++i_];
    return true;
  }
  bool Int(int lo, int hi, int* out) {
    std::string v;
    return Value(&v) && absl::SimpleAtoi(v, out) && *out >= lo && *out <= hi;
  }
  bool Double(double* out) {
    std::string v;
    return Value(&v) && absl::SimpleAtod(v, out) && std::isfinite(*out);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;  // argv[0] is the command's name
  std::string arg_, flag_, value_;
  bool has_eq_ = false;
};

enum class FlagResult { kUnknown, kOk, kBad };

FlagResult Check(bool ok) { return ok ? FlagResult::kOk : FlagResult::kBad; }

// What the flags ask for before the defaults apply.
struct Requested {
  std::vector<std::string> arm_names;
  std::vector<std::string> policies;  // --policy: preset names or JSON files
  std::optional<std::vector<int64_t>> contexts;
  std::optional<int> trials, bisect;
  bool quick = false;
};

// The flags of the haystack, needle and distractor generator.
FlagResult ParseGeneratorFlag(FlagReader& r, GeneratorOptions* g) {
  const std::string& flag = r.flag();
  std::string v;
  if (flag == "--kv-heads") return Check(r.Int(1, 256, &g->kv_heads));
  if (flag == "--head-dim") return Check(r.Int(16, 1024, &g->head_dim) && g->head_dim % 16 == 0);
  if (flag == "--rope-base") return Check(r.Double(&g->rope_base) && g->rope_base > 1);
  if (flag == "--margin") return Check(r.Double(&g->margin));
  if (flag == "--sink-margin") return Check(r.Double(&g->sink_margin));
  if (flag == "--logit-std") return Check(r.Double(&g->logit_std) && g->logit_std > 0);
  if (flag == "--distractors") return Check(r.Int(0, 1000, &g->distractors));
  if (flag == "--distractor-cos") {
    return Check(r.Value(&v) && ParseRange(v, &g->cos_min, &g->cos_max) && g->cos_min >= -1 &&
                 g->cos_max <= 1);
  }
  if (flag == "--outliers") return Check(r.Int(0, 1024, &g->outlier_channels));
  if (flag == "--outlier-gain") {
    return Check(r.Value(&v) && ParseRange(v, &g->outlier_gain_min, &g->outlier_gain_max) &&
                 g->outlier_gain_min > 0);
  }
  return FlagResult::kUnknown;
}

// The flags of the sweep (grid, arms, threads) and of its inputs and outputs.
FlagResult ParseSweepFlag(FlagReader& r, Requested* req, RecallFlags* f) {
  const std::string& flag = r.flag();
  SweepOptions& o = f->sweep;
  std::string v;
  int n = 0;
  if (flag == "--quick" && !r.has_eq()) {
    req->quick = true;
    return FlagResult::kOk;
  }
  if (flag == "--no-progress" && !r.has_eq()) {
    o.progress = false;
    return FlagResult::kOk;
  }
  if (flag == "--contexts") {
    std::vector<int64_t> c;
    const bool ok = r.Value(&v) && ParseContexts(v, &c);
    req->contexts = c;
    return Check(ok);
  }
  if (flag == "--depths") {
    o.depths.clear();
    bool ok = r.Value(&v);
    for (absl::string_view part : absl::StrSplit(v, ',')) {
      double d = 0;
      ok = ok && absl::SimpleAtod(part, &d) && d >= 0 && d <= 100;
      o.depths.push_back(d / 100);
    }
    return Check(ok && o.depths.size() <= 64);
  }
  if (flag == "--trials") {
    const bool ok = r.Int(1, 1 << 20, &n);
    req->trials = n;
    return Check(ok);
  }
  if (flag == "--arm") {
    const bool ok = r.Value(&v);
    req->arm_names.push_back(v);
    return Check(ok);
  }
  if (flag == "--policy") {
    const bool ok = r.Value(&v);
    req->policies.push_back(v);
    return Check(ok);
  }
  if (flag == "--json") return Check(r.Value(&f->json_path));
  if (flag == "--plots") return Check(r.Value(&f->plots_dir));
  if (flag == "--seed") return Check(r.Value(&v) && absl::SimpleAtoi(v, &o.seed));
  if (flag == "--threads") return Check(r.Int(1, 1024, &o.threads));
  if (flag == "--backend") {
    const bool ok = r.Value(&v) && (v == "cpu" || v == "cuda");
    o.backend = v == "cuda" ? BackendKind::kCuda : BackendKind::kCpu;
    return Check(ok);
  }
  if (flag == "--top-k") return Check(r.Int(1, 1 << 20, &o.top_k));
  if (flag == "--bisect-steps") {
    const bool ok = r.Int(0, 20, &n);
    req->bisect = n;
    return Check(ok);
  }
  if (flag == "--k-npy") return Check(r.Value(&f->k_npy));
  if (flag == "--v-npy") return Check(r.Value(&f->v_npy));
  if (flag == "--queries-npy") return Check(r.Value(&f->queries_npy));
  if (flag == "--npy-layer") return Check(r.Int(0, 1 << 16, &f->npy_layer));
  return FlagResult::kUnknown;
}

// The arms named by --arm, in the order given, then one per --policy; an error message when
// one is unknown or a policy does not load.
std::optional<std::string> ChooseArms(const std::vector<std::string>& names,
                                      const std::vector<std::string>& policies,
                                      std::vector<Arm>* arms) {
  if (names.empty() && policies.empty()) return std::nullopt;
  std::vector<Arm> chosen;
  for (const std::string& name : names) {
    bool found = false;
    for (const Arm& arm : *arms) {
      if (arm.name == name) chosen.push_back(arm), found = true;
    }
    if (!found) return "unknown arm '" + name + "' (--list-arms shows them)";
  }
  for (const std::string& policy : policies) {
    absl::StatusOr<Policy> p = LoadPolicy(policy);
    if (!p.ok()) return absl::StrCat("--policy ", policy, ": ", p.status().message());
    if (p->name.empty()) p->name = policy;  // a file without a "name": its path
    chosen.push_back(PolicyArm(*p));
  }
  for (size_t i = 0; i < chosen.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (chosen[i].name == chosen[j].name) {
        return "arm '" + chosen[i].name + "' is given twice (its rows and plots would be one)";
      }
      if (Slug(chosen[i].name) == Slug(chosen[j].name)) {
        return absl::StrCat("arms '", chosen[j].name, "' and '", chosen[i].name,
                            "' would write one plot file (heatmap_", Slug(chosen[i].name),
                            ".svg): rename one");
      }
    }
  }
  *arms = chosen;
  return std::nullopt;
}

}  // namespace

int RecallBadFlag(const std::string& why) {
  std::fprintf(stderr, "kvtier recall: %s\n%s", why.c_str(), kUsage);
  return 2;
}

std::optional<int> ParseRecallFlags(int argc, char** argv, RecallFlags* flags) {
  RecallFlags& f = *flags;
  SweepOptions& o = f.sweep;
  o.arms = StandardArms();
  o.depths = {0, 0.10, 0.25, 0.40, 0.50, 0.75, 0.90, 1.0};
  Requested req;
  for (FlagReader r(argc, argv); r.Next();) {
    if (r.flag() == "--help" || r.flag() == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (r.flag() == "--list-arms") {
      for (const Arm& arm : o.arms) std::printf("%s\n", arm.name.c_str());
      return 0;
    }
    FlagResult result = ParseSweepFlag(r, &req, &f);
    if (result == FlagResult::kUnknown) result = ParseGeneratorFlag(r, &o.generator);
    if (result == FlagResult::kUnknown) return RecallBadFlag("unknown flag '" + r.arg() + "'");
    if (result == FlagResult::kBad) return RecallBadFlag("bad or missing value for " + r.flag());
  }
  if (std::optional<std::string> bad = ChooseArms(req.arm_names, req.policies, &o.arms)) {
    return RecallBadFlag(*bad);
  }
  if (f.k_npy.empty() != f.v_npy.empty()) return RecallBadFlag("--k-npy and --v-npy go together");
  if (f.k_npy.empty() && (!f.queries_npy.empty() || f.npy_layer != 0)) {
    return RecallBadFlag("--queries-npy and --npy-layer need --k-npy and --v-npy");
  }
  const std::vector<int64_t> full_grid = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
  f.contexts_given = req.contexts.has_value();
  f.arms_given = !req.arm_names.empty() || !req.policies.empty();
  o.contexts = req.contexts ? *req.contexts
                            : req.quick ? std::vector<int64_t>{1024, 4096, 32768} : full_grid;
  o.trials = req.trials ? *req.trials : req.quick ? 16 : 64;
  o.bisect_steps = req.bisect ? *req.bisect : req.quick ? 1 : 3;
  return std::nullopt;
}

}  // namespace kvtier::tool
