#include "examples/kvtier/recall_svg.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "examples/kvtier/output_path.h"
#include "examples/kvtier/recall_report.h"

namespace kvtier::tool {
namespace {

std::string N(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", x);
  return buf;
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                         "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000080", "#b8860b",
                         "#008080", "#800000", "#ff1493", "#556b2f"};

CellStats PoolAt(const std::vector<CellResult>& cells, int64_t context) {
  CellStats all;
  for (const CellResult& c : cells) {
    if (c.context == context) all.Merge(c.stats);
  }
  return all;
}

// One line chart over log2(context): `value` of the pooled stats per arm.
Svg LineChart(const SweepOptions& o, const SweepResult& r, const std::string& title,
              const std::string& y_label, bool recall) {
  const double W = 1100, H = 560, left = 70, right = 450, top = 50, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  auto value = [&](const CellStats& s) { return recall ? s.top1.value() : s.flips.value(); };
  double lo = recall ? 1.0 : 0.0, hi = recall ? 1.0 : 0.0;
  auto extend = [&](const std::vector<CellResult>& cells) {
    for (int64_t c : o.contexts) {
      const double v = value(PoolAt(cells, c));
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  };
  for (const ArmSweep& a : r.arms) extend(a.cells);
  if (recall) {
    extend(r.reference);
    lo = std::max(0.0, std::floor((lo - 0.02) * 20) / 20);
    hi = 1.0;
  } else {
    hi = std::max(0.02, std::ceil(hi * 100 + 0.5) / 100);
  }
  if (hi - lo < 1e-9) hi = lo + 0.05;
  const double x0 = std::log2(static_cast<double>(o.contexts.front()));
  const double x1 = std::max(x0 + 1, std::log2(static_cast<double>(o.contexts.back())));
  auto X = [&](int64_t c) { return left + pw * (std::log2(static_cast<double>(c)) - x0) / (x1 - x0); };
  auto Y = [&](double v) { return top + ph * (hi - v) / (hi - lo); };

  Svg svg(static_cast<int>(W), static_cast<int>(H));
  svg.Rect(0, 0, W, H, "white");
  svg.Text(W / 2 - right / 2, 28, title, 16, "middle");
  for (int i = 0; i <= 5; ++i) {  // y grid
    const double v = lo + (hi - lo) * i / 5;
    svg.Line(left, Y(v), left + pw, Y(v), "#ddd");
    svg.Text(left - 8, Y(v) + 4, N(100 * v), 11, "end");
  }
  for (int64_t c : o.contexts) {
    svg.Line(X(c), top, X(c), top + ph, "#eee");
    svg.Text(X(c), top + ph + 18, ContextLabel(c), 11, "middle");
  }
  svg.Rect(left, top, pw, ph, "none", "#444");
  svg.Text(left + pw / 2, H - 18, "context length (tokens, log scale)", 12, "middle");
  svg.Text(18, top + ph / 2, y_label, 12, "middle", "#222", -90);
  double ly = top + 10;
  auto series = [&](const std::vector<CellResult>& cells, const std::string& name,
                    const std::string& color, const std::string& dash) {
    std::vector<std::pair<double, double>> pts;
    for (int64_t c : o.contexts) pts.emplace_back(X(c), Y(value(PoolAt(cells, c))));
    svg.Polyline(pts, color, 2, dash);
    for (const auto& [x, y] : pts) svg.Circle(x, y, 2.5, color);
    svg.Line(left + pw + 16, ly, left + pw + 40, ly, color, 2.5, dash);
    svg.Text(left + pw + 46, ly + 4, name, 11);
    ly += 18;
  };
  if (recall) series(r.reference, "FP32 reference", "#000", "5,3");
  for (size_t a = 0; a < r.arms.size(); ++a) {
    const ArmSweep& arm = r.arms[a];
    // Past the 16 colours, each comes again dashed, so that no two arms' lines look alike.
    constexpr size_t kNumColors = sizeof(kColors) / sizeof(kColors[0]);
    series(arm.cells, arm.name + "  (knee " + KneeLabel(arm, o.contexts.back()) + ")",
           kColors[a % kNumColors], a / kNumColors % 2 == 0 ? "" : "6,3");
  }
  if (!recall) {
    const double t = o.criterion.max_flip_rate;
    if (t >= lo && t <= hi) {
      svg.Line(left, Y(t), left + pw, Y(t), "#d62728", 1, "2,3");
      svg.Text(left + 6, Y(t) - 4, "knee threshold", 10, "start", "#d62728");
    }
  }
  return svg;
}

// Heat map of one arm: colour = recall drop against the FP32 reference (points), text = recall.
Svg HeatMap(const SweepOptions& o, const SweepResult& r, const ArmSweep& arm) {
  const double cw = 78, ch = 30, left = 90, top = 70;
  const double W = std::max(560.0, left + cw * o.contexts.size() + 150);
  const double H = top + ch * o.depths.size() + 70;
  Svg svg(static_cast<int>(W), static_cast<int>(H));
  svg.Rect(0, 0, W, H, "white");
  svg.Text(left, 22, "top-1 recall %, " + arm.name + " (knee " + KneeLabel(arm, o.contexts.back()) + ")", 14);
  svg.Text(left, 42, "colour: recall drop vs the FP32 reference on the same trials (points)", 11,
           "start", "#555");
  const size_t depths = o.depths.size();
  for (size_t ci = 0; ci < o.contexts.size(); ++ci) {
    svg.Text(left + cw * (ci + 0.5), top + ch * depths + 18, ContextLabel(o.contexts[ci]), 11, "middle");
    for (size_t d = 0; d < depths; ++d) {
      const CellStats& s = arm.cells[ci * depths + d].stats;
      const CellStats& ref = r.reference[ci * depths + d].stats;
      const double drop = 100 * (ref.top1.value() - s.top1.value());
      const double t = std::min(1.0, std::max(0.0, drop / 10));
      char fill[16];
      if (drop >= 0) {  // white -> red
        std::snprintf(fill, sizeof(fill), "#%02x%02x%02x", 255, static_cast<int>(255 * (1 - 0.8 * t)),
                      static_cast<int>(255 * (1 - 0.8 * t)));
      } else {  // better than the reference by chance: pale blue
        std::snprintf(fill, sizeof(fill), "#dde8f6");
      }
      const double x = left + cw * ci, y = top + ch * d;
      svg.Rect(x, y, cw, ch, fill, "#fff");
      svg.Text(x + cw / 2, y + ch / 2 + 4, N(100 * s.top1.value()), 11, "middle",
               t > 0.6 ? "#fff" : "#222");
    }
  }
  for (size_t d = 0; d < depths; ++d) {
    svg.Text(left - 8, top + ch * (d + 0.5) + 4, N(100 * o.depths[d]) + "%", 11, "end");
  }
  svg.Text(left + cw * o.contexts.size() / 2, top + ch * depths + 40, "context length (tokens)", 12, "middle");
  svg.Text(20, top + ch * depths / 2, "needle depth", 12, "middle", "#222", -90);
  const double lx = left + cw * o.contexts.size() + 20;  // colour legend
  for (int i = 0; i <= 5; ++i) {
    char fill[16];
    const double t = i / 5.0;
    std::snprintf(fill, sizeof(fill), "#%02x%02x%02x", 255, static_cast<int>(255 * (1 - 0.8 * t)),
                  static_cast<int>(255 * (1 - 0.8 * t)));
    svg.Rect(lx, top + i * 22, 22, 22, fill, "#ccc");
    svg.Text(lx + 28, top + i * 22 + 15, (i == 5 ? ">= " : "") + N(2.0 * i) + " pts", 10);
  }
  return svg;
}

}  // namespace

Svg::Svg(int width, int height) : width_(width), height_(height) {}

void Svg::Rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& stroke) {
  absl::StrAppend(&body_, "<rect x=\"", N(x), "\" y=\"", N(y), "\" width=\"", N(w), "\" height=\"",
                  N(h), "\" fill=\"", fill, "\" stroke=\"", stroke, "\"/>\n");
}

void Svg::Line(double x1, double y1, double x2, double y2, const std::string& stroke,
               double width, const std::string& dash) {
  absl::StrAppend(&body_, "<line x1=\"", N(x1), "\" y1=\"", N(y1), "\" x2=\"", N(x2), "\" y2=\"",
                  N(y2), "\" stroke=\"", stroke, "\" stroke-width=\"", N(width), "\"",
                  dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"", "/>\n");
}

void Svg::Polyline(const std::vector<std::pair<double, double>>& points,
                   const std::string& stroke, double width, const std::string& dash) {
  std::string p;
  for (const auto& [x, y] : points) absl::StrAppend(&p, p.empty() ? "" : " ", N(x), ",", N(y));
  absl::StrAppend(&body_, "<polyline points=\"", p, "\" fill=\"none\" stroke=\"", stroke,
                  "\" stroke-width=\"", N(width), "\"",
                  dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"", "/>\n");
}

void Svg::Circle(double x, double y, double r, const std::string& fill) {
  absl::StrAppend(&body_, "<circle cx=\"", N(x), "\" cy=\"", N(y), "\" r=\"", N(r), "\" fill=\"",
                  fill, "\"/>\n");
}

void Svg::Text(double x, double y, const std::string& text, int size, const std::string& anchor,
               const std::string& fill, double rotate) {
  absl::StrAppend(&body_, "<text x=\"", N(x), "\" y=\"", N(y), "\" font-size=\"", size,
                  "\" text-anchor=\"", anchor, "\" fill=\"", fill, "\"",
                  rotate != 0 ? absl::StrCat(" transform=\"rotate(", N(rotate), " ", N(x), " ", N(y), ")\"") : "",
                  ">", XmlEscape(text), "</text>\n");
}

std::string Svg::str() const {
  return absl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width_, "\" height=\"",
                      height_, "\" viewBox=\"0 0 ", width_, " ", height_,
                      "\" font-family=\"Helvetica, Arial, sans-serif\">\n", body_, "</svg>\n");
}

absl::Status Svg::Save(const std::string& path) const {
  return WriteOutputFile(path, str());
}

std::string Slug(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '+';  // '+': "x+rot" and "x_rot" are different arms
    out += ok ? c : '_';
  }
  return out;
}

absl::Status WritePlots(const SweepOptions& o, const SweepResult& r, const std::string& dir,
                        std::vector<std::string>* files) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create directory ", dir));
  }
  std::vector<std::pair<std::string, Svg>> plots;
  plots.emplace_back("recall_vs_context.svg",
                     LineChart(o, r, "Needle top-1 recall vs context (pooled over depths)",
                               "top-1 recall (%)", true));
  plots.emplace_back("flip_rate_vs_context.svg",
                     LineChart(o, r, "Flip rate vs context (reference hit, arm miss)",
                               "flip rate (%)", false));
  for (const ArmSweep& arm : r.arms) {
    plots.emplace_back("heatmap_" + Slug(arm.name) + ".svg", HeatMap(o, r, arm));
  }
  for (const auto& [name, svg] : plots) {
    const std::string path = dir + "/" + name;
    const absl::Status s = svg.Save(path);
    if (!s.ok()) return s;
    if (files != nullptr) files->push_back(path);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::tool
