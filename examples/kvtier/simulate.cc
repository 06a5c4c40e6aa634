// `kvtier simulate`: replays a seeded serving workload through the cache under a precision
// policy and again under all-FP16 with the same budget, then reports how many more sequences
// the policy holds, prefix reuse, tier mix over time, demotions and evictions, with a plot.
//
// The simulation drives the real cache (allocation, prefix matching, eviction, policy aging and
// the CPU backend's requantisation of pages); it does not write K/V values, whose accuracy is
// the recall sweep's subject (`kvtier recall`).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "adapters/prometheus_exporter.h"
#include "examples/kvtier/commands.h"
#include "examples/kvtier/recall_svg.h"
#include "examples/kvtier/simulate_workload.h"
#include "kvtier/cache.h"
#include "kvtier/policy.h"
#include "prometheus/exposer.h"

namespace kvtier::tool {
namespace {

struct SimOptions {
  std::string policy = "balanced";
  int64_t steps = 1000;
  int64_t budget_mib = 512;
  int64_t prefill_chunk = 2048;  // prompt tokens a sequence computes per step
  double admit_below = 0.95;     // admit new requests while usage is below this fraction
  WorkloadOptions workload;
  std::string json_path;
  std::string plot_path = "kvtier_simulate.svg";
  int metrics_port = 0;
  double linger_seconds = 0;
  bool progress = true;
};

struct Sample {
  int64_t step = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  std::vector<int64_t> bytes;  // [format], pages of live blocks
  double bits = 0;
};

struct RunResult {
  std::string policy;
  std::unique_ptr<Cache> cache;
  std::shared_ptr<CacheCollectable> collectable;  // serves `cache` while it lives
  std::vector<Sample> samples;
  CacheStats final_stats;
  double mean_running = 0;       // over the second half of the run
  int64_t peak_running = 0;
  double saturated_fraction = 0;  // steps of the second half with requests waiting
  int64_t completed = 0;
  int64_t preemptions = 0;
  double seconds = 0;
};

struct Active {
  Request request;
  SequenceId seq;
  int64_t prefilled = 0;  // prompt tokens in the cache
  std::vector<int32_t> generated;
};

void Progress(const SimOptions& o, const std::string& label, int64_t step, const Sample& s) {
  if (!o.progress) return;
  std::fprintf(stderr, "\r[%-12s] step %5lld/%lld  running %4lld  waiting %4lld  %5.2f bits/elem",
               label.c_str(), static_cast<long long>(step), static_cast<long long>(o.steps),
               static_cast<long long>(s.running), static_cast<long long>(s.waiting), s.bits);
  if (step == o.steps) std::fprintf(stderr, "\n");
}

absl::StatusOr<RunResult> Run(const Policy& policy, const SimOptions& o, prometheus::Exposer* exposer) {
  Options options;
  options.geometry = Geometry{/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/128, /*block_tokens=*/16};
  options.memory_budget_bytes = static_cast<size_t>(o.budget_mib) << 20;
  options.palette = PolicyPalette(policy);
  absl::StatusOr<std::unique_ptr<Cache>> created = Cache::Create(options);
  if (!created.ok()) return created.status();
  RunResult result;
  result.policy = policy.name;
  result.cache = std::move(*created);
  Cache& cache = *result.cache;
  if (absl::Status s = cache.SetPolicy(policy); !s.ok()) return s;
  if (exposer != nullptr) {
    result.collectable = std::make_shared<CacheCollectable>(&cache);
    exposer->RegisterCollectable(result.collectable);
  }
  const auto started = std::chrono::steady_clock::now();
  Workload workload(o.workload);
  std::deque<Request> waiting;
  std::vector<Active> running;
  std::vector<int64_t> slots;
  std::vector<SequenceId> batch;
  std::vector<int64_t> counts;
  std::vector<int32_t> tokens;
  int64_t saturated = 0, second_half_steps = 0;
  double running_sum = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    for (Request& r : workload.Arrivals(step)) waiting.push_back(std::move(r));
    // Admit in arrival order while the budget has headroom for what the running sequences will
    // still add (at the cache's current bits per element); matched prefixes come free.
    const CacheStats now = cache.GetStats();
    const double bytes_per_token = 2.0 * options.geometry.num_layers * options.geometry.num_kv_heads *
                                   options.geometry.head_dim *
                                   std::max(4.0, now.effective_bits_per_element) / 8;
    double reserved = 0;
    for (const Active& a : running) {
      reserved += bytes_per_token * (static_cast<double>(a.request.prompt.size()) - a.prefilled +
                                     a.request.output_tokens - static_cast<double>(a.generated.size()));
    }
    while (!waiting.empty()) {
      const double need = bytes_per_token *
                          static_cast<double>(waiting.front().prompt.size() + waiting.front().output_tokens);
      if (now.used_bytes + reserved + need > o.admit_below * now.budget_bytes && !running.empty()) break;
      reserved += need;
      SequenceOptions so;
      so.prompt = waiting.front().prompt;
      absl::StatusOr<AddResult> added = cache.AddSequence(so);
      if (!added.ok()) return added.status();
      running.push_back(Active{std::move(waiting.front()), added->id, added->cached_tokens, {}});
      waiting.pop_front();
    }
    // One step of work: a prefill chunk for prefilling sequences, one token for the others.
    // When the budget is full the newest sequence is preempted (recomputed later).
    absl::Status s = absl::ResourceExhaustedError("");
    while (!running.empty() && absl::IsResourceExhausted(s)) {
      batch.clear();
      counts.clear();
      tokens.clear();
      for (const Active& a : running) {
        const int64_t prompt = static_cast<int64_t>(a.request.prompt.size());
        const int64_t n = a.prefilled < prompt ? std::min(o.prefill_chunk, prompt - a.prefilled) : 1;
        batch.push_back(a.seq);
        counts.push_back(n);
        if (a.prefilled < prompt) {
          tokens.insert(tokens.end(), a.request.prompt.begin() + a.prefilled,
                        a.request.prompt.begin() + a.prefilled + n);
        } else {
          tokens.push_back(workload.NextToken());
        }
      }
      slots.clear();
      s = cache.AppendBatch(batch, counts, tokens, &slots);
      if (absl::IsResourceExhausted(s)) {
        if (absl::Status r = cache.Release(running.back().seq); !r.ok()) return r;
        waiting.push_front(std::move(running.back().request));
        running.pop_back();
        result.preemptions += 1;
      } else if (!s.ok()) {
        return s;
      }
    }
    size_t next_token = 0;
    for (size_t i = 0; i < running.size(); ++i) {
      Active& a = running[i];
      if (a.prefilled < static_cast<int64_t>(a.request.prompt.size())) {
        a.prefilled += counts[i];
      } else {
        a.generated.push_back(tokens[next_token]);
      }
      next_token += static_cast<size_t>(counts[i]);
    }
    for (size_t i = running.size(); i-- > 0;) {
      Active& a = running[i];
      if (static_cast<int64_t>(a.generated.size()) < a.request.output_tokens) continue;
      if (absl::Status r = cache.Release(a.seq); !r.ok()) return r;
      workload.Finished(a.request, a.generated, step);
      result.completed += 1;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (absl::Status e = cache.EndStep(); !e.ok()) return e;
    result.peak_running = std::max<int64_t>(result.peak_running, static_cast<int64_t>(running.size()));
    if (step >= o.steps / 2) {
      second_half_steps += 1;
      running_sum += static_cast<double>(running.size());
      saturated += waiting.empty() ? 0 : 1;
    }
    if (step % 10 == 0 || step + 1 == o.steps) {
      const CacheStats stats = cache.GetStats();
      Sample sample{step, static_cast<int64_t>(running.size()), static_cast<int64_t>(waiting.size()), {},
                    stats.effective_bits_per_element};
      for (const FormatStats& f : stats.formats) {
        sample.bytes.push_back((f.blocks_in_use + f.blocks_cached) * f.page_bytes * options.geometry.num_layers);
      }
      result.samples.push_back(sample);
      if (step % 50 == 0 || step + 1 == o.steps) Progress(o, policy.name, step + 1, sample);
    }
  }
  result.final_stats = cache.GetStats();
  result.mean_running = second_half_steps > 0 ? running_sum / second_half_steps : 0;
  result.saturated_fraction = second_half_steps > 0 ? static_cast<double>(saturated) / second_half_steps : 0;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

// Two panels: the policy run's bytes by format over time (stacked), and running sequences of
// both runs.
absl::Status WritePlot(const std::string& path, const RunResult& run, const RunResult& fp16,
                       const SimOptions& o) {
  constexpr int kW = 1000, kPanel = 260, kLeft = 70, kRight = 330, kTop = 40;
  Svg svg(kW, 2 * kPanel + 3 * kTop + 20);
  const double plot_w = kW - kLeft - kRight;
  const std::vector<std::string> colours = {"#d62728", "#ff7f0e", "#2ca02c", "#1f77b4",
                                            "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  const double budget = static_cast<double>(o.budget_mib) * (1 << 20);
  auto x_of = [&](int64_t step) { return kLeft + plot_w * step / std::max<int64_t>(1, o.steps); };
  // Panel 1: stacked bars of each format's share of the budget, one bar per sample.
  svg.Text(kLeft, kTop - 12, absl::StrCat("Tier occupancy under '", run.policy, "' (share of the budget)"), 14);
  const double y0 = kTop + kPanel;
  svg.Rect(kLeft, kTop, plot_w, kPanel, "none", "#999");
  const double bar = run.samples.size() > 1 ? x_of(run.samples[1].step) - x_of(run.samples[0].step) : plot_w;
  for (const Sample& sample : run.samples) {
    double below = 0;
    for (size_t f = 0; f < sample.bytes.size(); ++f) {
      const double share = sample.bytes[f] / budget;
      svg.Rect(x_of(sample.step), y0 - kPanel * (below + share), bar, kPanel * share,
               colours[f % colours.size()]);
      below += share;
    }
  }
  for (size_t f = 0; f < run.final_stats.formats.size(); ++f) {
    svg.Rect(kW - kRight + 10, kTop + 20 * f, 12, 12, colours[f % colours.size()]);
    svg.Text(kW - kRight + 28, kTop + 20 * f + 11, run.final_stats.formats[f].name, 11);
  }
  for (double frac : {0.0, 0.5, 1.0}) {
    svg.Text(kLeft - 8, y0 - kPanel * frac + 4, absl::StrFormat("%.0f%%", 100 * frac), 11, "end");
  }
  // Panel 2: running sequences.
  const double top2 = 2 * kTop + kPanel, y1 = top2 + kPanel;
  svg.Text(kLeft, top2 - 12, "Concurrent sequences held at the same budget", 14);
  svg.Rect(kLeft, top2, plot_w, kPanel, "none", "#999");
  double peak = 1;
  for (const RunResult* r : {&run, &fp16}) {
    for (const Sample& s : r->samples) peak = std::max<double>(peak, s.running);
  }
  int line = 0;
  for (const RunResult* r : {&run, &fp16}) {
    std::vector<std::pair<double, double>> points;
    for (const Sample& s : r->samples) points.push_back({x_of(s.step), y1 - kPanel * s.running / peak});
    const std::string colour = line == 0 ? "#1f77b4" : "#d62728";
    svg.Polyline(points, colour, 2);
    svg.Rect(kW - kRight + 10, top2 + 20 * line, 12, 12, colour);
    svg.Text(kW - kRight + 28, top2 + 20 * line + 11, absl::StrFormat("%s (mean %.1f)", r->policy, r->mean_running), 11);
    ++line;
  }
  svg.Text(kLeft - 8, top2 + 4, absl::StrFormat("%.0f", peak), 11, "end");
  svg.Text(kLeft - 8, y1 + 4, "0", 11, "end");
  svg.Text(kLeft, y1 + 18, "0", 11, "middle");
  svg.Text(kLeft + plot_w, y1 + 18, absl::StrCat(o.steps), 11, "middle");
  svg.Text(kLeft + plot_w / 2, y1 + 30, "decode step", 12, "middle");
  return svg.Save(path);
}

std::string Json(const RunResult& run, const RunResult& fp16, double gain, const SimOptions& o) {
  const CacheStats& s = run.final_stats;
  const double hit = s.prefix_queried_tokens > 0
                         ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_queried_tokens : 0;
  int64_t migrated = 0;
  for (const MigrationStats& m : s.migrations) migrated += m.blocks;
  std::vector<std::string> mix;
  for (const FormatStats& f : s.formats) {
    mix.push_back(absl::StrFormat("{\"format\": \"%s\", \"blocks_in_use\": %d, \"blocks_cached\": %d}",
                                  f.name, f.blocks_in_use, f.blocks_cached));
  }
  return absl::StrFormat(
      "{\n  \"policy\": \"%s\",\n  \"capacity_gain_vs_fp16\": %.4f,\n  \"mean_concurrent_sequences\": %.3f,\n"
      "  \"fp16_mean_concurrent_sequences\": %.3f,\n  \"prefix_hit_ratio\": %.4f,\n"
      "  \"effective_bits_per_element\": %.4f,\n  \"migrated_blocks\": %d,\n  \"evicted_blocks\": %d,\n"
      "  \"demotions_under_pressure\": %d,\n  \"preemptions\": %d,\n  \"completed_requests\": %d,\n"
      "  \"steps\": %d,\n  \"budget_bytes\": %d,\n  \"tier_mix\": [%s],\n  \"seconds\": %.2f\n}\n",
      run.policy, gain, run.mean_running, fp16.mean_running, hit, s.effective_bits_per_element,
      migrated, s.evicted_blocks, s.demotions_under_pressure, run.preemptions, run.completed, o.steps,
      s.budget_bytes, absl::StrJoin(mix, ", "), run.seconds);
}

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: kvtier simulate [--policy NAME|FILE] [--steps N] [--budget-mib N] [--seed N]\n"
               "                       [--arrivals-per-step X] [--json PATH] [--plot PATH.svg]\n"
               "                       [--metrics-port PORT [--linger SECONDS]] [--no-progress]\n"
               "  --policy        a preset (fp16, fp8, balanced, max_capacity) or a JSON file. Default: balanced\n"
               "  --steps         decode steps to simulate. Default: 1200\n"
               "  --budget-mib    memory budget of the cache. Default: 1024\n"
               "  --metrics-port  serve the policy run's cache at http://127.0.0.1:PORT/metrics\n"
               "  --linger        keep serving that many seconds after the run\n");
}

}  // namespace

int RunSimulate(int argc, char** argv) {
  SimOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&](std::string* v) {
      if (i + 1 >= argc) return false;
      *v = argv[++i];
      return true;
    };
    std::string v;
    bool ok = true;
    if (flag == "--help" || flag == "-h") {
      Usage(stdout);
      return 0;
    } else if (flag == "--no-progress") {
      o.progress = false;
    } else if (flag == "--policy") {
      ok = value(&o.policy);
    } else if (flag == "--json") {
      ok = value(&o.json_path);
    } else if (flag == "--plot") {
      ok = value(&o.plot_path);
    } else if (flag == "--steps") {
      ok = value(&v) && absl::SimpleAtoi(v, &o.steps) && o.steps >= 10 && o.steps <= 10000000;
    } else if (flag == "--budget-mib") {
      ok = value(&v) && absl::SimpleAtoi(v, &o.budget_mib) && o.budget_mib >= 16 && o.budget_mib <= (1 << 20);
    } else if (flag == "--seed") {
      ok = value(&v) && absl::SimpleAtoi(v, &o.workload.seed);
    } else if (flag == "--arrivals-per-step") {
      ok = value(&v) && absl::SimpleAtod(v, &o.workload.arrivals_per_step) &&
           o.workload.arrivals_per_step > 0 && o.workload.arrivals_per_step <= 100;
    } else if (flag == "--metrics-port") {
      ok = value(&v) && absl::SimpleAtoi(v, &o.metrics_port) && o.metrics_port > 0 && o.metrics_port < 65536;
    } else if (flag == "--linger") {
      ok = value(&v) && absl::SimpleAtod(v, &o.linger_seconds) && o.linger_seconds >= 0 &&
           o.linger_seconds <= 3600;
    } else {
      std::fprintf(stderr, "kvtier simulate: unknown flag '%s'\n", flag.c_str());
      Usage(stderr);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "kvtier simulate: bad or missing value for %s\n", flag.c_str());
      return 2;
    }
  }
  absl::StatusOr<Policy> policy = LoadPolicy(o.policy);
  if (!policy.ok()) {
    std::fprintf(stderr, "kvtier simulate: %s\n", policy.status().ToString().c_str());
    return 2;
  }
  if (policy->name.empty()) policy->name = o.policy;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (o.metrics_port > 0) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(absl::StrCat("127.0.0.1:", o.metrics_port));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvtier simulate: cannot serve metrics on port %d: %s\n", o.metrics_port, e.what());
      return 1;
    }
    std::fprintf(stderr, "serving metrics at http://127.0.0.1:%d/metrics\n", o.metrics_port);
  }
  std::printf("kvtier simulate: policy '%s', %lld steps, %lld MiB budget, seed %u (CPU backend)\n",
              policy->name.c_str(), static_cast<long long>(o.steps),
              static_cast<long long>(o.budget_mib), o.workload.seed);
  absl::StatusOr<RunResult> run = Run(*policy, o, exposer.get());
  absl::StatusOr<RunResult> fp16 = run.ok() ? Run(*PolicyPreset("fp16"), o, nullptr) : run.status();
  if (!run.ok() || !fp16.ok()) {
    std::fprintf(stderr, "kvtier simulate: %s\n", (run.ok() ? fp16 : run).status().ToString().c_str());
    return 1;
  }
  const double gain = fp16->mean_running > 0 ? run->mean_running / fp16->mean_running : 0;
  const CacheStats& s = run->final_stats;
  int64_t migrated = 0;
  for (const MigrationStats& m : s.migrations) migrated += m.blocks;
  std::printf("\n| metric | %s | fp16 |\n| --- | --- | --- |\n", run->policy.c_str());
  std::printf("| concurrent sequences (mean, second half) | %.1f | %.1f |\n", run->mean_running, fp16->mean_running);
  std::printf("| peak concurrent sequences | %lld | %lld |\n", static_cast<long long>(run->peak_running),
              static_cast<long long>(fp16->peak_running));
  std::printf("| steps with requests waiting (second half) | %.0f%% | %.0f%% |\n",
              100 * run->saturated_fraction, 100 * fp16->saturated_fraction);
  std::printf("| completed requests | %lld | %lld |\n", static_cast<long long>(run->completed),
              static_cast<long long>(fp16->completed));
  std::printf("| preemptions | %lld | %lld |\n", static_cast<long long>(run->preemptions),
              static_cast<long long>(fp16->preemptions));
  std::printf("| prefix hit ratio (tokens) | %.3f | %.3f |\n",
              s.prefix_queried_tokens ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_queried_tokens : 0.0,
              fp16->final_stats.prefix_queried_tokens
                  ? static_cast<double>(fp16->final_stats.prefix_hit_tokens) / fp16->final_stats.prefix_queried_tokens
                  : 0.0);
  std::printf("| effective bits per element (end) | %.2f | %.2f |\n", s.effective_bits_per_element,
              fp16->final_stats.effective_bits_per_element);
  std::printf("| demoted blocks | %lld | 0 |\n", static_cast<long long>(migrated));
  std::printf("| demotions under pressure | %lld | 0 |\n", static_cast<long long>(s.demotions_under_pressure));
  std::printf("| evicted cached blocks | %lld | %lld |\n", static_cast<long long>(s.evicted_blocks),
              static_cast<long long>(fp16->final_stats.evicted_blocks));
  std::printf("| wall time | %.1f s | %.1f s |\n", run->seconds, fp16->seconds);
  std::printf("\ntier mix at the end:");
  for (const FormatStats& f : s.formats) {
    std::printf("  %s %lld blocks", f.name.c_str(), static_cast<long long>(f.blocks_in_use + f.blocks_cached));
  }
  std::printf("\ncapacity gain vs all-FP16 at the same budget: %.2fx\n", gain);
  if (!o.plot_path.empty()) {
    if (absl::Status p = WritePlot(o.plot_path, *run, *fp16, o); !p.ok()) {
      std::fprintf(stderr, "kvtier simulate: %s\n", p.ToString().c_str());
      return 1;
    }
    std::printf("plot: %s\n", o.plot_path.c_str());
  }
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << Json(*run, *fp16, gain, o);
    if (!out) {
      std::fprintf(stderr, "kvtier simulate: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
    std::printf("json: %s\n", o.json_path.c_str());
  }
  if (exposer != nullptr && o.linger_seconds > 0) {
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.linger_seconds));
  }
  return 0;
}

}  // namespace kvtier::tool
