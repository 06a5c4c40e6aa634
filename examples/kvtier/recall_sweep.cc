#include "examples/kvtier/recall_sweep.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/kvtier/recall_device.h"
#include "kvtier/reference_attention.h"

namespace kvtier::tool {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The metrics of one context for a set of arms.
struct ContextResult {
  std::vector<CellStats> reference;          // [depth]
  std::vector<std::vector<CellStats>> arms;  // [arm][depth]; empty for arms not evaluated
  std::vector<double> bits;                  // [arm]
  std::vector<double> compute_error;         // [arm]
};

// One trial sequence's outcome.
struct SequenceOutcome {
  std::vector<NeedleMetrics> reference;          // [q_heads]
  std::vector<std::vector<NeedleMetrics>> arms;  // [arm][q_heads]
  std::vector<double> bits, compute_error;       // [arm]
};

class Evaluator {
 public:
  Evaluator(const SweepOptions& o, int32_t sequences, int threads)
      : o_(o), sequences_(sequences), threads_(threads), runners_(threads) {
    for (auto& r : runners_) r.resize(o.arms.size());
    max_length_ = o.contexts.empty() ? 0 : o.contexts.back();
  }

  absl::Status Evaluate(int64_t context, const std::vector<int>& arms, const std::string& label,
                        ContextResult* out) {
    std::vector<SequenceOutcome> outcomes(sequences_);
    std::atomic<int> next{0};
    std::mutex mu;
    absl::Status first_error;
    int done = 0;
    const double start = Now();
    const bool tty = isatty(2);
    auto work = [&](int thread) {
      Trial trial;
      std::vector<float> ref_logits, ref_out, ref_lse;
      ArmRunner::Result result;
      for (int s; (s = next.fetch_add(1)) < sequences_;) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first_error.ok()) return;
        }
        const absl::Status status = RunSequence(thread, context, s, arms, &trial, &ref_logits,
                                                &ref_out, &ref_lse, &result, &outcomes[s]);
        std::lock_guard<std::mutex> lock(mu);
        if (!status.ok() && first_error.ok()) first_error = status;
        ++done;
        if (o_.progress && (tty || done % std::max(1, sequences_ / 4) == 0 || done == sequences_)) {
          std::fprintf(stderr, "%s[recall] %s %lld tokens: %d/%d trial sequences, %.0f s%s",
                       tty ? "\r" : "", label.c_str(), static_cast<long long>(context), done,
                       sequences_, Now() - start, tty ? "   " : "\n");
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads_; ++t) pool.emplace_back(work, t);
    work(0);
    for (std::thread& t : pool) t.join();
    if (o_.progress && tty) std::fprintf(stderr, "\n");
    if (!first_error.ok()) return first_error;

    const size_t depths = o_.depths.size();
    out->reference.assign(depths, CellStats{});
    out->arms.assign(o_.arms.size(), {});
    out->bits.assign(o_.arms.size(), 0);
    out->compute_error.assign(o_.arms.size(), 0);
    for (int a : arms) out->arms[a].assign(depths, CellStats{});
    for (const SequenceOutcome& so : outcomes) {  // index order: deterministic sums
      for (size_t i = 0; i < so.reference.size(); ++i) out->reference[i % depths].Add(so.reference[i]);
      for (int a : arms) {
        for (size_t i = 0; i < so.arms[a].size(); ++i) out->arms[a][i % depths].Add(so.arms[a][i]);
        out->bits[a] = so.bits[a];
        out->compute_error[a] = std::max(out->compute_error[a], so.compute_error[a]);
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status RunSequence(int thread, int64_t context, int s, const std::vector<int>& arms,
                           Trial* trial, std::vector<float>* ref_logits,
                           std::vector<float>* ref_out, std::vector<float>* ref_lse,
                           ArmRunner::Result* result, SequenceOutcome* outcome) {
    absl::StatusOr<Trial> generated =
        GenerateTrial(o_.generator, context, o_.depths, MixSeed(MixSeed(o_.seed, context), s));
    if (!generated.ok()) return generated.status();
    *trial = std::move(*generated);
    const int q_heads = trial->kv_heads * trial->group;
    const int64_t len = trial->length;
    const int dim = trial->head_dim;
    ref_logits->resize(static_cast<size_t>(q_heads) * len);
    ref_out->resize(static_cast<size_t>(q_heads) * dim);
    ref_lse->resize(q_heads);
    const DecodeQueries queries{trial->q, q_heads, trial->softmax_scale};
    absl::Status status = DenseDecodeAttention(
        {DenseSequence{trial->k, trial->v, len}}, trial->kv_heads, dim, queries,
        DecodeOutputs{absl::MakeSpan(*ref_out), absl::MakeSpan(*ref_lse), absl::MakeSpan(*ref_logits), len, {}});
    if (!status.ok()) return status;
    auto row = [&](const std::vector<float>& x, int i, int64_t n) {
      return absl::MakeConstSpan(x).subspan(static_cast<size_t>(i) * n, n);
    };
    outcome->reference.resize(q_heads);
    for (int i = 0; i < q_heads; ++i) {
      outcome->reference[i] = CompareNeedle(row(*ref_logits, i, len), (*ref_lse)[i], row(*ref_out, i, dim),
                                            row(*ref_logits, i, len), (*ref_lse)[i], row(*ref_out, i, dim),
                                            trial->needle[i], o_.top_k);
    }
    outcome->arms.assign(o_.arms.size(), {});
    outcome->bits.assign(o_.arms.size(), 0);
    outcome->compute_error.assign(o_.arms.size(), 0);
    for (int a : arms) {
      std::unique_ptr<ArmRunner>& runner = runners_[thread][a];
      if (runner == nullptr) {
        absl::StatusOr<std::unique_ptr<ArmRunner>> created = ArmRunner::Create(
            o_.arms[a], trial->kv_heads, dim, max_length_, o_.chunk_tokens, o_.backend);
        if (!created.ok()) return created.status();
        runner = std::move(*created);
      }
      status = runner->Run(*trial, /*measure_compute_error=*/s == 0, result);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("arm ", o_.arms[a].name, ": ", status.message()));
      }
      outcome->arms[a].resize(q_heads);
      for (int i = 0; i < q_heads; ++i) {
        outcome->arms[a][i] = CompareNeedle(row(*ref_logits, i, len), (*ref_lse)[i], row(*ref_out, i, dim),
                                            row(result->logits, i, len), result->lse[i],
                                            row(result->out, i, dim), trial->needle[i], o_.top_k);
      }
      outcome->bits[a] = result->bits_per_element;
      outcome->compute_error[a] = std::max(result->compute_rel_error, 0.0);
    }
    return absl::OkStatus();
  }

  const SweepOptions& o_;
  int32_t sequences_;
  int threads_;
  int64_t max_length_ = 0;
  std::vector<std::vector<std::unique_ptr<ArmRunner>>> runners_;  // [thread][arm]
};

CellStats Pool(const std::vector<CellStats>& cells) {
  CellStats all;
  for (const CellStats& c : cells) all.Merge(c);
  return all;
}

KneePoint PointOf(int64_t context, const ContextResult& r, int arm, int baseline) {
  const CellStats a = Pool(r.arms[arm]);
  const CellStats b = baseline >= 0 ? Pool(r.arms[baseline]) : Pool(r.reference);
  return KneePoint{context, a.top1.value(), b.top1.value(), a.flips.value()};
}

// The memory of this machine that a sweep's threads may take: three quarters of it.
double UsableMemoryBytes() {
  return 0.75 * static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<double>(sysconf(_SC_PAGESIZE));
}

constexpr double kGiB = 1024.0 * 1024 * 1024;

// The threads of a sweep of `sequences` trial sequences a cell: SweepOptions::threads (0: the
// cores), at most one a sequence, and no more than the usable memory holds (a note on stderr
// when that cuts them). REQUIRES: CheckSweep(o) is OK (one thread fits).
int Threads(const SweepOptions& o, int32_t sequences) {
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min(threads, sequences));
  const int fit = std::max(1, static_cast<int>(UsableMemoryBytes() / ThreadBytes(o)));
  if (fit >= threads) return threads;
  if (o.progress) {
    std::fprintf(stderr, "kvtier recall: %d threads, not %d: a thread's trials of %lld tokens take "
                 "about %.1f GiB\n", fit, threads, static_cast<long long>(o.contexts.back()),
                 ThreadBytes(o) / kGiB);
  }
  return fit;
}

}  // namespace

double ThreadBytes(const SweepOptions& o) {
  const GeneratorOptions& g = o.generator;
  const double kv_heads = g.dump ? g.dump->kv_heads : g.kv_heads;
  const double head_dim = g.dump ? g.dump->head_dim : g.head_dim;
  const double row = kv_heads * head_dim, q_heads = kv_heads * o.depths.size();
  const double rope = g.dump ? 0 : 4 * head_dim;
  // Per token: K and V as floats and as FP16 bits, the arm's cache that runs (at most FP16),
  // their read-back as floats (the compute error), the RoPE table, and the logits of the
  // reference and of the arm. The arms run one after the other, each releasing its sequence.
  return static_cast<double>(o.contexts.back()) * (row * (8 + 4 + 4 + 8) + rope + q_heads * 8);
}

absl::Status CheckSweep(const SweepOptions& o) {
  if (o.contexts.empty() || o.depths.empty() || o.arms.empty() || o.trials < 1 || o.top_k < 1) {
    return absl::InvalidArgumentError("a sweep needs contexts, depths, arms, trials and top_k >= 1");
  }
  if (!std::is_sorted(o.contexts.begin(), o.contexts.end())) {
    return absl::InvalidArgumentError("contexts must be ascending");
  }
  if (ThreadBytes(o) > UsableMemoryBytes()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a trial of %d tokens needs about %.1f GiB, more than 3/4 of this machine's memory "
        "(%.1f GiB usable): shorten --contexts", o.contexts.back(), ThreadBytes(o) / kGiB,
        UsableMemoryBytes() / kGiB));
  }
  return o.backend == BackendKind::kCuda ? CudaSweepAvailable() : absl::OkStatus();
}

absl::StatusOr<SweepResult> RunSweep(const SweepOptions& o) {
  if (absl::Status s = CheckSweep(o); !s.ok()) return s;
  const double start = Now();
  SweepResult result;
  result.kv_heads = o.generator.dump ? o.generator.dump->kv_heads : o.generator.kv_heads;
  result.head_dim = o.generator.dump ? o.generator.dump->head_dim : o.generator.head_dim;
  result.sequences_per_cell = (o.trials + result.kv_heads - 1) / result.kv_heads;
  result.trials_per_cell = result.sequences_per_cell * result.kv_heads;
  Evaluator evaluator(o, result.sequences_per_cell, Threads(o, result.sequences_per_cell));

  int baseline = -1;
  std::vector<int> all(o.arms.size());
  for (size_t a = 0; a < o.arms.size(); ++a) {
    all[a] = static_cast<int>(a);
    if (o.arms[a].name == "fp16") baseline = static_cast<int>(a);
  }
  result.arms.resize(o.arms.size());
  for (size_t a = 0; a < o.arms.size(); ++a) {
    result.arms[a].name = o.arms[a].name;
    for (const FormatSpec& f : o.arms[a].palette) result.arms[a].palette.push_back(FormatName(f));
  }
  for (int64_t context : o.contexts) {
    const double t0 = Now();
    ContextResult r;
    absl::Status s = evaluator.Evaluate(context, all, "grid", &r);
    if (!s.ok()) return s;
    for (size_t d = 0; d < o.depths.size(); ++d) {
      result.reference.push_back(CellResult{context, o.depths[d], r.reference[d]});
    }
    std::string degraded;
    for (size_t a = 0; a < o.arms.size(); ++a) {
      ArmSweep& arm = result.arms[a];
      for (size_t d = 0; d < o.depths.size(); ++d) {
        arm.cells.push_back(CellResult{context, o.depths[d], r.arms[a][d]});
      }
      arm.grid.push_back(PointOf(context, r, static_cast<int>(a), baseline));
      arm.bits_per_element = r.bits[a];
      arm.max_compute_rel_error = std::max(arm.max_compute_rel_error, r.compute_error[a]);
      if (Degraded(arm.grid.back(), o.criterion)) degraded += (degraded.empty() ? "" : ", ") + arm.name;
    }
    if (o.progress) {
      std::fprintf(stderr, "[recall] %lld tokens done in %.0f s: reference top-1 recall %.3f; degraded: %s\n",
                   static_cast<long long>(context), Now() - t0, Pool(r.reference).top1.value(),
                   degraded.empty() ? "none" : degraded.c_str());
    }
  }

  // Knees: every arm's search advances in lockstep; arms probing the same context share trials.
  std::vector<KneeSearch> searches;
  for (const ArmSweep& arm : result.arms) {
    searches.emplace_back(arm.grid, o.criterion, o.bisect_steps, 16);
  }
  for (;;) {
    std::map<int64_t, std::vector<int>> probes;
    for (size_t a = 0; a < searches.size(); ++a) {
      if (std::optional<int64_t> c = searches[a].NextProbe()) probes[*c].push_back(static_cast<int>(a));
    }
    if (probes.empty()) break;
    for (auto& [context, arms] : probes) {
      std::vector<int> run = arms;
      if (baseline >= 0 && std::find(run.begin(), run.end(), baseline) == run.end()) run.push_back(baseline);
      ContextResult r;
      absl::Status s = evaluator.Evaluate(context, run, "bisect", &r);
      if (!s.ok()) return s;
      for (int a : arms) searches[a].Report(PointOf(context, r, a, baseline));
    }
  }
  for (size_t a = 0; a < searches.size(); ++a) result.arms[a].knee = searches[a].result();
  result.seconds = Now() - start;
  return result;
}

}  // namespace kvtier::tool
