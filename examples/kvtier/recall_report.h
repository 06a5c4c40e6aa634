// Output of the recall sweep: Markdown tables for people, JSON for machines.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_REPORT_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_REPORT_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "examples/kvtier/recall_sweep.h"

namespace kvtier::tool {

// What produced a result, for the record.
struct RunInfo {
  std::string command;  // the command line
  std::string date;     // UTC, ISO 8601
};

// "1K", "128K", "5.8K", "900".
std::string ContextLabel(int64_t tokens);

// The knee as text: "none up to 128K", "<= 1K", "5.8K".
std::string KneeLabel(const ArmSweep& arm, int64_t largest_context);

// Markdown: the knee per arm with the metrics at the largest context, then top-1 recall and
// flip rate per context (pooled over depths).
void PrintMarkdown(const SweepOptions& options, const SweepResult& result, const RunInfo& info,
                   FILE* out);

// JSON (schema in docs/recall.md): {command, date, settings, seconds, reference: {cells},
// arms: [{name, palette, bits_per_element, knee_context_tokens (null when none in range),
// knee_below_range, knee_probes, contexts, cells: [{context_tokens, depth, recall_top1, ci95,
// flip_rate, ...}]}]}.
absl::Status WriteJson(const SweepOptions& options, const SweepResult& result,
                       const RunInfo& info, const std::string& path);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_REPORT_H_
