#include "examples/kvtier/simulate_plot.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "examples/kvtier/recall_svg.h"

namespace kvtier::tool {
namespace {

// The x position of a step.
struct XAxis {
  double left, width;
  int64_t steps;
  double operator()(int64_t step) const {
    const double span = static_cast<double>(std::max<int64_t>(1, steps));
    return left + width * static_cast<double>(step) / span;
  }
};

constexpr int kW = 1000, kPanel = 260, kLeft = 70, kRight = 330, kTop = 40;
const char* const kColours[] = {"#d62728", "#ff7f0e", "#2ca02c", "#1f77b4",
                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
constexpr size_t kNumColours = sizeof(kColours) / sizeof(kColours[0]);
// At most about this many points a line (every sample up to it, then every k-th and the last).
constexpr size_t kMaxLinePoints = 2000;

// Panel 1: stacked bars of each format's share of the budget, each bar the mean of consecutive
// samples (at most kMaxOccupancyBars bars).
void OccupancyPanel(Svg& svg, const PlotRun& run, const XAxis& x_of, double budget) {
  const double plot_w = kW - kLeft - kRight, y0 = kTop + kPanel;
  svg.Text(kLeft, kTop - 12,
           absl::StrCat("Tier occupancy under '", run.policy, "' (share of the budget)"), 14);
  svg.Rect(kLeft, kTop, plot_w, kPanel, "none", "#999");
  const size_t n = run.samples.size();
  const size_t per = std::max<size_t>(1, (n + kMaxOccupancyBars - 1) / kMaxOccupancyBars);
  // The mean distance of two samples: how far the last sample's bar reaches past it.
  const double spacing =
      n > 1 ? (x_of(run.samples[n - 1].step) - x_of(run.samples[0].step)) / (n - 1) : plot_w;
  for (size_t first = 0; first < n; first += per) {
    const size_t last = std::min(n, first + per);  // this bar's samples: [first, last)
    const double x = x_of(run.samples[first].step);
    const double end =
        last < n ? x_of(run.samples[last].step) : x_of(run.samples[n - 1].step) + spacing;
    const double width = end - x;
    double below = 0;
    for (size_t f = 0; f < run.samples[first].bytes.size(); ++f) {
      double bytes = 0;
      for (size_t i = first; i < last; ++i) bytes += static_cast<double>(run.samples[i].bytes[f]);
      const double share = bytes / static_cast<double>(last - first) / budget;
      svg.Rect(x, y0 - kPanel * (below + share), width, kPanel * share, kColours[f % kNumColours]);
      below += share;
    }
  }
  for (size_t f = 0; f < run.formats.size(); ++f) {
    svg.Rect(kW - kRight + 10, kTop + 20 * f, 12, 12, kColours[f % kNumColours]);
    svg.Text(kW - kRight + 28, kTop + 20 * f + 11, run.formats[f], 11);
  }
  for (double frac : {0.0, 0.5, 1.0}) {
    svg.Text(kLeft - 8, y0 - kPanel * frac + 4, absl::StrFormat("%.0f%%", 100 * frac), 11, "end");
  }
}

// Panel 2: the concurrent sequences of both runs.
void SequencesPanel(Svg& svg, const PlotRun& run, const PlotRun& fp16, const XAxis& x_of) {
  const double plot_w = kW - kLeft - kRight, top = 2 * kTop + kPanel, y1 = top + kPanel;
  svg.Text(kLeft, top - 12, "Concurrent sequences held at the same budget", 14);
  svg.Rect(kLeft, top, plot_w, kPanel, "none", "#999");
  double peak = 1;
  for (const PlotRun* r : {&run, &fp16}) {
    for (const Sample& s : r->samples) peak = std::max<double>(peak, s.running);
  }
  int line = 0;
  for (const PlotRun* r : {&run, &fp16}) {
    std::vector<std::pair<double, double>> points;
    const auto add = [&](const Sample& s) {
      points.push_back({x_of(s.step), y1 - kPanel * s.running / peak});
    };
    const size_t n = r->samples.size(), every = std::max<size_t>(1, n / kMaxLinePoints);
    for (size_t i = 0; i < n; i += every) add(r->samples[i]);
    if (n > 0 && (n - 1) % every != 0) add(r->samples[n - 1]);
    const std::string colour = line == 0 ? "#1f77b4" : "#d62728";
    svg.Polyline(points, colour, 2);
    svg.Rect(kW - kRight + 10, top + 20 * line, 12, 12, colour);
    svg.Text(kW - kRight + 28, top + 20 * line + 11,
             absl::StrFormat("%s (mean %.1f)", r->policy, r->mean_running), 11);
    ++line;
  }
  svg.Text(kLeft - 8, top + 4, absl::StrFormat("%.0f", peak), 11, "end");
  svg.Text(kLeft - 8, y1 + 4, "0", 11, "end");
  svg.Text(kLeft, y1 + 18, "0", 11, "middle");
  svg.Text(kLeft + plot_w, y1 + 18, absl::StrCat(x_of.steps), 11, "middle");
  svg.Text(kLeft + plot_w / 2, y1 + 30, "decode step", 12, "middle");
}

}  // namespace

absl::Status WriteSimulatePlot(const std::string& path, const PlotRun& run, const PlotRun& fp16,
                               int64_t steps, int64_t budget_mib) {
  Svg svg(kW, 2 * kPanel + 3 * kTop + 20);
  const XAxis x_of{kLeft, kW - kLeft - kRight, steps};
  OccupancyPanel(svg, run, x_of, static_cast<double>(budget_mib) * (1 << 20));
  SequencesPanel(svg, run, fp16, x_of);
  return svg.Save(path);
}

}  // namespace kvtier::tool
