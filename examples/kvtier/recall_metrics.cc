#include "examples/kvtier/recall_metrics.h"

#include <algorithm>
#include <cmath>

namespace kvtier::tool {
namespace {

constexpr double kZ = 1.959963984540054;  // two-sided 95%

}  // namespace

int64_t NeedleRank(absl::Span<const float> logits, int64_t needle) {
  const float x = logits[needle];
  if (std::isnan(x)) return static_cast<int64_t>(logits.size());  // a miss at every k
  int64_t rank = 0;
  for (size_t i = 0; i < logits.size(); ++i) rank += logits[i] >= x ? 1 : 0;
  return rank - 1;  // the needle itself
}

NeedleMetrics CompareNeedle(absl::Span<const float> ref_logits, float ref_lse,
                            absl::Span<const float> ref_out, absl::Span<const float> logits,
                            float lse, absl::Span<const float> out, int64_t needle, int top_k) {
  NeedleMetrics m;
  const int64_t rank = NeedleRank(logits, needle);
  m.top1 = rank == 0;
  m.topk = rank < top_k;
  m.reference_top1 = NeedleRank(ref_logits, needle) == 0;
  m.flip = m.reference_top1 && !m.top1;
  const double p_ref = std::exp(static_cast<double>(ref_logits[needle]) - ref_lse);
  const double p = std::exp(static_cast<double>(logits[needle]) - lse);
  m.mass_ratio = p_ref > 0 ? p / p_ref : 0;
  double kl = 0;
  for (size_t i = 0; i < ref_logits.size(); ++i) {
    const double lr = static_cast<double>(ref_logits[i]) - ref_lse;
    const double la = static_cast<double>(logits[i]) - lse;
    kl += std::exp(lr) * (lr - la);
  }
  m.kl = std::max(kl, 0.0);
  double num = 0, den = 0;
  for (size_t d = 0; d < ref_out.size(); ++d) {
    const double e = static_cast<double>(out[d]) - ref_out[d];
    num += e * e;
    den += static_cast<double>(ref_out[d]) * ref_out[d];
  }
  m.output_error = den > 0 ? std::sqrt(num / den) : 0;
  return m;
}

double Proportion::lo() const {
  if (n == 0) return 0;
  const double p = value(), z2 = kZ * kZ, nn = static_cast<double>(n);
  const double center = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = kZ * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  return std::max(0.0, center - half);
}

double Proportion::hi() const {
  if (n == 0) return 1;
  const double p = value(), z2 = kZ * kZ, nn = static_cast<double>(n);
  const double center = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = kZ * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn)) / (1 + z2 / nn);
  return std::min(1.0, center + half);
}

double MeanCI::half_width() const {
  if (n < 2) return 0;
  const double m = mean();
  const double var = std::max(0.0, (sum2 - n * m * m) / (n - 1));
  return kZ * std::sqrt(var / n);
}

void CellStats::Add(const NeedleMetrics& m) {
  top1.hits += m.top1, ++top1.n;
  topk.hits += m.topk, ++topk.n;
  reference_top1.hits += m.reference_top1, ++reference_top1.n;
  if (m.reference_top1) flips.hits += m.flip, ++flips.n;
  mass_ratio.Add(m.mass_ratio);
  kl.Add(m.kl);
  output_error.Add(m.output_error);
}

void CellStats::Merge(const CellStats& o) {
  auto add = [](Proportion& a, const Proportion& b) {
    a.hits += b.hits;
    a.n += b.n;
  };
  auto add_mean = [](MeanCI& a, const MeanCI& b) {
    a.sum += b.sum;
    a.sum2 += b.sum2;
    a.n += b.n;
  };
  add(top1, o.top1);
  add(topk, o.topk);
  add(reference_top1, o.reference_top1);
  add(flips, o.flips);
  add_mean(mass_ratio, o.mass_ratio);
  add_mean(kl, o.kl);
  add_mean(output_error, o.output_error);
}

bool Degraded(const KneePoint& p, const KneeCriterion& c) {
  // Rates are ratios of counts: a drop of exactly the bound (1.0 - 0.99 is 0.01000000000000000888
  // in double) is within it.
  constexpr double kRounding = 1e-12;
  return p.baseline_recall - p.recall > c.max_recall_drop + kRounding ||
         p.flip_rate > c.max_flip_rate + kRounding;
}

KneeSearch::KneeSearch(const std::vector<KneePoint>& grid, const KneeCriterion& criterion,
                       int steps, int64_t granularity)
    : criterion_(criterion), steps_left_(steps), granularity_(std::max<int64_t>(granularity, 1)) {
  size_t first = 0;
  while (first < grid.size() && !Degraded(grid[first], criterion)) ++first;
  if (first == grid.size()) return;
  result_.knee = grid[first].context;
  if (first == 0) {
    result_.below_range = true;
    return;
  }
  lo_ = grid[first - 1].context;
  hi_ = grid[first].context;
  Advance();
}

void KneeSearch::Advance() {
  next_.reset();
  if (steps_left_ <= 0) return;
  const double mid_exact = std::sqrt(static_cast<double>(lo_) * static_cast<double>(hi_));
  const int64_t mid = static_cast<int64_t>(std::llround(mid_exact / granularity_)) * granularity_;
  if (mid > lo_ && mid < hi_) next_ = mid;
}

std::optional<int64_t> KneeSearch::NextProbe() const { return next_; }

void KneeSearch::Report(const KneePoint& point) {
  if (!next_) return;
  result_.probes.push_back(point);
  if (Degraded(point, criterion_)) {
    hi_ = *next_;
  } else {
    lo_ = *next_;
  }
  result_.knee = hi_;
  --steps_left_;
  Advance();
}

KneeResult FindKnee(const std::vector<KneePoint>& grid, const KneeCriterion& criterion,
                    int steps, int64_t granularity,
                    const std::function<KneePoint(int64_t context)>& probe) {
  KneeSearch search(grid, criterion, steps, granularity);
  while (std::optional<int64_t> next = search.NextProbe()) {
    KneePoint p = probe(*next);
    p.context = *next;
    search.Report(p);
  }
  return search.result();
}

}  // namespace kvtier::tool
