// The recall sweep: for every context length of a grid, trial sequences from the generator go
// through every arm and through the FP32 reference; per (context, depth) cell the needle
// metrics are aggregated, per arm the knee is searched (grid, then bisection).
//
// Work is split over threads by trial sequence; each thread owns one ArmRunner (one cache) per
// arm, reused across its sequences. Results do not depend on the thread count: every trial
// sequence's seed is MixSeed(MixSeed(seed, context), index) and aggregation runs in index order.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_SWEEP_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_SWEEP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/kvtier/recall_arms.h"
#include "examples/kvtier/recall_generator.h"
#include "examples/kvtier/recall_metrics.h"

namespace kvtier::tool {

struct SweepOptions {
  std::vector<int64_t> contexts;  // ascending, tokens
  std::vector<double> depths;     // in [0, 1]; one query head per depth in each GQA group
  // Needle trials per cell; rounded up to whole trial sequences (each gives one per KV head).
  int32_t trials = 64;
  int32_t top_k = 5;
  int32_t threads = 0;  // 0: the hardware's
  uint64_t seed = 1;
  int32_t bisect_steps = 3;
  int64_t chunk_tokens = 4096;  // tokens appended (then demoted) per step
  KneeCriterion criterion;
  GeneratorOptions generator;
  std::vector<Arm> arms;  // the baseline for the knee is the arm named "fp16" when present
  // Where the arms run: the CPU reference on CPU caches, or the fused kernel on CUDA caches
  // (`--backend cuda`; RunSweep returns Unavailable when that is not possible here). The
  // generator, the FP32 reference and the metrics run on the host either way.
  BackendKind backend = BackendKind::kCpu;
  bool progress = true;   // progress lines on stderr
};

struct CellResult {
  int64_t context = 0;
  double depth = 0;
  CellStats stats;
};

struct ArmSweep {
  std::string name;
  std::vector<std::string> palette;  // format names, hot first
  double bits_per_element = 0;       // at the largest context
  std::vector<CellResult> cells;     // [contexts][depths], context-major
  std::vector<KneePoint> grid;       // pooled over depths, one per context
  KneeResult knee;
  double max_compute_rel_error = 0;  // over the first trial of each context
};

struct SweepResult {
  std::vector<CellResult> reference;  // the FP32 reference's own recall per cell
  std::vector<ArmSweep> arms;
  int32_t sequences_per_cell = 0;
  int32_t trials_per_cell = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  double seconds = 0;
};

// About the bytes one thread's trials take at the longest context (REQUIRES: contexts and arms
// given). A sweep runs on at most as many threads as three quarters of this machine's memory
// holds, with a note on stderr when that is fewer than asked for.
double ThreadBytes(const SweepOptions& options);

// OK when RunSweep can run `options`: InvalidArgument for options no sweep can run,
// ResourceExhausted when one thread's trials need more than three quarters of this machine's
// memory, Unavailable for a backend not usable here.
absl::Status CheckSweep(const SweepOptions& options);

// The sweep (CheckSweep's errors first).
absl::StatusOr<SweepResult> RunSweep(const SweepOptions& options);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_SWEEP_H_
