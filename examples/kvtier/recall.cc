// `kvtier recall`: at which context length, needle depth and format does retrieval start to
// fail? Runs the recall sweep (recall_sweep.h) over the arms (recall_arms.h) on synthetic or
// user-supplied K/V and reports the knee per arm as Markdown (stdout), JSON and SVG plots.
// docs/recall.md explains the method and the results.
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>
#include <vector>

#include "examples/kvtier/commands.h"
#include "examples/kvtier/output_path.h"
#include "examples/kvtier/recall_flags.h"
#include "examples/kvtier/recall_report.h"
#include "examples/kvtier/recall_svg.h"
#include "examples/kvtier/recall_sweep.h"
#include "src/status_macros.h"

namespace kvtier::tool {
namespace {

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Loads the K/V dump (and queries) that the flags name into `dump` (and `queries`), points the
// generator at them and keeps the contexts within the dump: the default grid is cut to the
// dump's length, given contexts must fit. The error's message says why.
absl::Status UseDump(RecallFlags* f, KVDump* dump, NpyArray* queries) {
  SweepOptions& o = f->sweep;
  KVTIER_ASSIGN_OR_RETURN(*dump, LoadKVDump(f->k_npy, f->v_npy, f->npy_layer));
  o.generator.dump = dump;
  if (!f->queries_npy.empty()) {
    KVTIER_ASSIGN_OR_RETURN(*queries, LoadQueries(f->queries_npy, dump->head_dim));
    o.generator.queries = queries;
  }
  if (!f->contexts_given) {
    std::vector<int64_t> fit;
    for (int64_t c : o.contexts) {
      if (c <= dump->tokens) fit.push_back(c);
    }
    if (fit.empty()) fit.push_back(dump->tokens);
    o.contexts = fit;
  } else if (o.contexts.back() > dump->tokens) {
    return absl::InvalidArgumentError("a context is longer than the dump's " +
                                      std::to_string(dump->tokens) + " tokens");
  }
  return absl::OkStatus();
}

// The sweep, then its Markdown on stdout and the JSON and plots the flags ask for.
int SweepAndReport(const RecallFlags& f, const RunInfo& info) {
  const SweepOptions& o = f.sweep;
  absl::StatusOr<SweepResult> result = RunSweep(o);
  if (!result.ok()) {
    std::fprintf(stderr, "kvtier recall: %s\n", result.status().ToString().c_str());
    return 1;
  }
  PrintMarkdown(o, *result, info, stdout);
  if (!f.json_path.empty()) {
    const absl::Status s = WriteJson(o, *result, info, f.json_path);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier recall: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  if (!f.plots_dir.empty()) {
    const absl::Status s = WritePlots(o, *result, f.plots_dir);
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier recall: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

// Checks every arm against the heads of the sweep (the dump's, else the generator's) before it
// runs: the standard arms whose cache refuses them (the rotated ones when head_dim is not a
// power of two) are left out, with a note on stderr; a chosen arm refused is the error.
absl::Status FitArms(RecallFlags* f) {
  SweepOptions& o = f->sweep;
  const GeneratorOptions& g = o.generator;
  const int32_t kv_heads = g.dump ? g.dump->kv_heads : g.kv_heads;
  const int32_t head_dim = g.dump ? g.dump->head_dim : g.head_dim;
  std::vector<Arm> fit;
  for (Arm& arm : o.arms) {
    const absl::Status s = CheckArmGeometry(arm, kv_heads, head_dim);
    if (s.ok()) {
      fit.push_back(std::move(arm));
    } else if (f->arms_given) {
      return s;
    } else {
      std::fprintf(stderr, "kvtier recall: leaving out %s\n", std::string(s.message()).c_str());
    }
  }
  if (fit.empty()) return absl::InvalidArgumentError("no arm can hold heads of this geometry");
  o.arms = std::move(fit);
  return absl::OkStatus();
}

int RunRecall(int argc, char** argv) {
  RunInfo info;
  info.command = "kvtier";
  for (int i = 0; i < argc; ++i) info.command += std::string(" ") + argv[i];
  info.date = UtcNow();
  RecallFlags f;
  if (std::optional<int> exit_code = ParseRecallFlags(argc, argv, &f)) return *exit_code;
  // The outputs before the sweep, which may take half an hour.
  if (!f.json_path.empty()) {
    if (absl::Status s = CheckOutputFile(f.json_path); !s.ok()) {
      return RecallBadFlag(std::string(s.message()));
    }
  }
  KVDump dump;
  NpyArray queries;
  if (!f.k_npy.empty()) {
    if (absl::Status s = UseDump(&f, &dump, &queries); !s.ok()) {
      return RecallBadFlag(std::string(s.message()));
    }
  }
  if (absl::Status s = FitArms(&f); !s.ok()) return RecallBadFlag(std::string(s.message()));
  const SweepOptions& o = f.sweep;
  const int64_t specials =
      2 * (4 + static_cast<int64_t>(o.depths.size()) * (1 + o.generator.distractors)) + 16;
  if (o.depths.empty() || o.contexts.front() < specials) {
    return RecallBadFlag("the smallest context must hold every needle, sink and distractor (>= " +
                         std::to_string(specials) + " tokens)");
  }
  if (absl::Status s = CheckSweep(o); !s.ok()) {  // a backend not here: exit 1 (docs/recall.md)
    if (!absl::IsUnavailable(s)) return RecallBadFlag(std::string(s.message()));
    std::fprintf(stderr, "kvtier recall: %s\n", s.ToString().c_str());
    return 1;
  }
  // Made last, so that a refused command leaves no directory behind.
  if (!f.plots_dir.empty()) {
    if (absl::Status s = MakeOutputDir(f.plots_dir); !s.ok()) {
      return RecallBadFlag(std::string(s.message()));
    }
  }
  return SweepAndReport(f, info);
}

}  // namespace kvtier::tool
