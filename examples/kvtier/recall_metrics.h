// Metrics of the recall sweep, their confidence intervals, and the knee search.
//
// Per needle trial (one query head of one trial sequence), comparing the arm's attention over
// the cache pages with the FP32 reference attention over the unquantised (FP16-input) data:
//   top-1 hit   the needle's logit is strictly larger than every other key's logit (after
//               storage, for the arm; ties are misses);
//   top-k hit   fewer than k other keys have a logit >= the needle's;
//   flip        the reference has a top-1 hit and the arm does not;
//   mass ratio  the needle's attention weight under the arm / under the reference;
//   KL          KL(reference attention || arm attention) over all keys, in nats;
//   output err  |o_arm - o_ref| / |o_ref| (L2 over head_dim).
// The flip rate is flips / reference top-1 hits.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_METRICS_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_METRICS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/types/span.h"

namespace kvtier::tool {

struct NeedleMetrics {
  bool top1 = false;
  bool topk = false;
  bool reference_top1 = false;
  bool flip = false;
  double mass_ratio = 0;
  double kl = 0;
  double output_error = 0;
};

// `ref_logits`/`logits`: one query's logits over `length` keys; `ref_lse`/`lse` their natural
// log-sum-exp; `ref_out`/`out` the outputs [head_dim].
NeedleMetrics CompareNeedle(absl::Span<const float> ref_logits, float ref_lse,
                            absl::Span<const float> ref_out, absl::Span<const float> logits,
                            float lse, absl::Span<const float> out, int64_t needle, int top_k);

// Keys other than `needle` whose logit is >= the needle's (0 means a strict top-1); every key
// when the needle's logit is NaN (a miss at any k).
int64_t NeedleRank(absl::Span<const float> logits, int64_t needle);

// A proportion with its 95% Wilson score interval.
struct Proportion {
  int64_t hits = 0;
  int64_t n = 0;
  double value() const { return n > 0 ? static_cast<double>(hits) / n : 0; }
  double lo() const;
  double hi() const;
};

// A mean with a normal-approximation 95% interval (mean +- 1.96 sd / sqrt(n)).
struct MeanCI {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void Add(double x) { sum += x, sum2 += x * x, ++n; }
  double mean() const { return n > 0 ? sum / n : 0; }
  double half_width() const;
};

// Aggregates of the needle trials of one cell (or pooled over cells).
struct CellStats {
  Proportion top1, topk, reference_top1, flips;  // flips.n = reference top-1 hits
  MeanCI mass_ratio, kl, output_error;
  void Add(const NeedleMetrics& m);
  void Merge(const CellStats& other);
};

// ---- The knee ----

// An arm's pooled statistics at one context length.
struct KneePoint {
  int64_t context = 0;
  double recall = 0;           // arm top-1 recall
  double baseline_recall = 0;  // the FP16 arm's (or the FP32 reference's)
  double flip_rate = 0;
};

struct KneeCriterion {
  double max_recall_drop = 0.01;  // recall more than 1 point below the baseline...
  double max_flip_rate = 0.01;    // ... or a flip rate above 1%
};

bool Degraded(const KneePoint& p, const KneeCriterion& c);

struct KneeResult {
  std::optional<int64_t> knee;  // the smallest degraded context found; none in range: nullopt
  bool below_range = false;     // already degraded at the smallest grid context
  std::vector<KneePoint> probes;  // contexts evaluated by the bisection, in order
};

// The knee search as a state machine, so that a sweep can advance many arms' searches in
// lockstep and evaluate arms that probe the same context on the same trials.
// `grid`: the arm's points at the grid contexts, ascending. The search finds the first
// degraded grid point; when a passing grid point precedes it, it bisects between the two
// (geometric midpoints rounded to a multiple of `granularity`) for up to `steps` probes.
class KneeSearch {
 public:
  KneeSearch(const std::vector<KneePoint>& grid, const KneeCriterion& criterion, int steps,
             int64_t granularity);
  // The context to evaluate next, or nullopt when the search is over.
  std::optional<int64_t> NextProbe() const;
  // The evaluation of NextProbe().
  void Report(const KneePoint& point);
  const KneeResult& result() const { return result_; }

 private:
  void Advance();
  KneeCriterion criterion_;
  int steps_left_;
  int64_t granularity_;
  int64_t lo_ = 0, hi_ = 0;
  std::optional<int64_t> next_;
  KneeResult result_;
};

// Runs a KneeSearch to the end, evaluating each probe with `probe`.
KneeResult FindKnee(const std::vector<KneePoint>& grid, const KneeCriterion& criterion,
                    int steps, int64_t granularity,
                    const std::function<KneePoint(int64_t context)>& probe);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_METRICS_H_
