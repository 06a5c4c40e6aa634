// Plots of the recall sweep as standalone SVG files (no dependencies): recall and flip rate
// against context length with a line per arm, and a context x depth heat map per arm.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_SVG_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_SVG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/kvtier/recall_sweep.h"

namespace kvtier::tool {

// A minimal SVG document builder.
class Svg {
 public:
  Svg(int width, int height);
  void Rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& stroke = "none");
  void Line(double x1, double y1, double x2, double y2, const std::string& stroke,
            double width = 1, const std::string& dash = "");
  void Polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                double width = 2, const std::string& dash = "");
  void Circle(double x, double y, double r, const std::string& fill);
  // anchor: "start", "middle" or "end".
  void Text(double x, double y, const std::string& text, int size = 12,
            const std::string& anchor = "start", const std::string& fill = "#222",
            double rotate = 0);
  std::string str() const;
  absl::Status Save(const std::string& path) const;

 private:
  int width_, height_;
  std::string body_;
};

// A file-name-safe form of an arm name ("k:nvfp4_channel/block_head,v:..." -> "k_nvfp4_...";
// '+' is kept), distinct for the standard arms.
std::string Slug(const std::string& name);

// Writes recall_vs_context.svg, flip_rate_vs_context.svg and heatmap_<slug>.svg per arm into
// `dir` (created if missing). Returns the files written through `files` when not null.
absl::Status WritePlots(const SweepOptions& options, const SweepResult& result,
                        const std::string& dir, std::vector<std::string>* files = nullptr);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_SVG_H_
