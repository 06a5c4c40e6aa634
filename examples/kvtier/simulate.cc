// `kvtier simulate`: replays a seeded serving workload through the cache under a precision
// policy and again under all-FP16 with the same budget, then reports how many more sequences
// the policy holds, prefix reuse, tier mix over time, demotions and evictions, with a plot.
//
// The simulation drives the real cache (allocation, prefix matching, eviction, policy aging and
// the CPU backend's requantisation of pages); it does not write K/V values, whose accuracy is
// the recall sweep's subject (`kvtier recall`). One run is simulate_replay.h.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "examples/kvtier/commands.h"
#include "examples/kvtier/output_path.h"
#include "examples/kvtier/simulate_plot.h"
#include "examples/kvtier/simulate_replay.h"
#include "kvtier/cache.h"
#include "kvtier/policy.h"
#include "prometheus/exposer.h"

namespace kvtier::tool {
namespace {

struct SimOptions {
  std::string policy = "balanced";
  ReplayOptions replay;
  std::string json_path;
  std::string plot_path = "kvtier_simulate.svg";
  int metrics_port = 0;
  double linger_seconds = 0;
  ClusterOptions cluster;  // used with --instances N > 1
  int instances = 1;
  bool remote_mac = false;  // --remote-mac: the shared tier's values signed (a random secret)
};

// Tokens found in the prefix index over tokens looked up; 0 before any lookup.
double PrefixHitRatio(const CacheStats& s) {
  return s.prefix_queried_tokens ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_queried_tokens : 0.0;
}

int64_t MigratedBlocks(const CacheStats& s) {
  int64_t migrated = 0;
  for (const MigrationStats& m : s.migrations) migrated += m.blocks;
  return migrated;
}

// The plot's view of a run.
PlotRun Plotted(const RunResult& r) {
  PlotRun p{r.policy, r.samples, r.mean_running, {}};
  for (const FormatStats& f : r.final_stats.formats) p.formats.push_back(f.name);
  return p;
}

std::string Json(const RunResult& run, const RunResult& fp16, double gain, const SimOptions& o) {
  const CacheStats& s = run.final_stats;
  const double hit = PrefixHitRatio(s);
  const int64_t migrated = MigratedBlocks(s);
  std::vector<std::string> mix;
  for (const FormatStats& f : s.formats) {
    mix.push_back(absl::StrFormat("{\"format\": \"%s\", \"blocks_in_use\": %d, \"blocks_cached\": %d}",
                                  f.name, f.blocks_in_use, f.blocks_cached));
  }
  return absl::StrFormat(
      "{\n  \"policy\": %s,\n  \"capacity_gain_vs_fp16\": %s,\n  \"mean_concurrent_sequences\": %.3f,\n"
      "  \"fp16_mean_concurrent_sequences\": %.3f,\n  \"prefix_hit_ratio\": %.4f,\n"
      "  \"effective_bits_per_element\": %.4f,\n  \"migrated_blocks\": %d,\n  \"evicted_blocks\": %d,\n"
      "  \"demotions_under_pressure\": %d,\n  \"preemptions\": %d,\n  \"completed_requests\": %d,\n"
      "  \"rejected_requests\": %d,\n  \"steps\": %d,\n  \"budget_bytes\": %d,\n  \"tier_mix\": [%s],\n  \"seconds\": %.2f\n}\n",
      JsonString(run.policy), std::isnan(gain) ? "null" : absl::StrFormat("%.4f", gain),
      run.mean_running, fp16.mean_running, hit, s.effective_bits_per_element, migrated,
      s.evicted_blocks, s.demotions_under_pressure, run.preemptions, run.completed, run.rejected,
      o.replay.steps,
      s.budget_bytes, absl::StrJoin(mix, ", "), run.seconds);
}

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: kvtier simulate [--policy NAME|FILE] [--steps N] [--budget-mib N] [--seed N]\n"
               "                       [--host-tier-mib N] [--arrivals-per-step X] [--json PATH] [--plot PATH.svg]\n"
               "                       [--metrics-port PORT [--linger SECONDS]] [--no-progress]\n"
               "                       [--instances N [--remote redis://HOST:PORT] [--remote-timeout-ms MS]\n"
               "                                      [--remote-mac]]\n"
               "  --policy        a preset (fp16, fp8, balanced, max_capacity, balanced_rot, attentive,\n"
               "                  fp8_keys) or a JSON file (a path with a '/' or ending in .json).\n"
               "                  Default: balanced\n"
               "  --steps         decode steps to simulate. Default: 1000\n"
               "  --budget-mib    memory budget of the cache, MiB. Default: 512\n"
               "  --host-tier-mib also run the policy with a host tier of N MiB below the same budget and\n"
               "                  add its column (docs/tiers.md). Default: 0 (no such run)\n"
               "  --instances     N engine instances (caches of the budget each) behind a router that sends\n"
               "                  request i to instance i mod N; reports their sum instead, as a table\n"
               "                  only (not with --json, --plot, --metrics-port, --host-tier-mib).\n"
               "                  Default: 1\n"
               "  --remote        with --instances: also run them sharing this Redis server as a remote tier\n"
               "                  (docs/tiers.md) and add its column\n"
               "  --remote-timeout-ms  Options::remote_timeout_ms of that run. Default: 20\n"
               "  --remote-mac    with --remote: the instances share a random remote_secret, every value\n"
               "                  signed and verified (docs/tiers.md, \"Trust\")\n"
               "  --metrics-port  serve the policy run's cache at http://127.0.0.1:PORT/metrics\n"
               "  --linger        keep serving that many seconds after the run\n");
}

// Flags that ParseFlags saw, where their defaults cannot tell.
struct GivenFlags {
  bool plot = false, remote_timeout = false, linger = false;
};

// 2 (said on stderr) for flags that do not go together or an output that cannot be written,
// before any work; nullopt when the run may start. Clears the default plot of a cluster run.
std::optional<int> RefuseCombinations(const GivenFlags& given, SimOptions* options) {
  SimOptions& o = *options;
  const auto refuse = [](const std::string& why) {
    std::fprintf(stderr, "kvtier simulate: %s\n", why.c_str());
    return 2;
  };
  if (o.remote_mac && o.cluster.remote_url.empty()) return refuse("--remote-mac needs --remote");
  if (given.remote_timeout && o.cluster.remote_url.empty()) {
    return refuse("--remote-timeout-ms needs --remote");
  }
  if (given.linger && o.metrics_port == 0) return refuse("--linger needs --metrics-port");
  if (o.instances > 1 &&
      (given.plot || !o.json_path.empty() || o.metrics_port > 0 || o.replay.host_tier_mib > 0)) {
    return refuse("--plot, --json, --metrics-port and --host-tier-mib are for one instance: "
                  "--instances reports its table alone");
  }
  if (o.instances > 1) o.plot_path.clear();  // the table only
  if (!o.cluster.remote_url.empty()) {  // the URL checked now, not after the first run
    Options remote;
    remote.remote_tier_url = o.cluster.remote_url;
    if (absl::Status s = ValidateOptions(remote); !s.ok()) {
      return refuse(absl::StrCat("--remote: ", s.message()));
    }
  }
  if (!o.plot_path.empty() && o.plot_path == o.json_path) {
    return refuse("--plot and --json name the same file: " + o.json_path);
  }
  for (const std::string* path : {&o.plot_path, &o.json_path}) {
    if (path->empty()) continue;
    if (absl::Status s = CheckOutputFile(*path); !s.ok()) return refuse(std::string(s.message()));
  }
  return std::nullopt;
}

// Parses argv[1..argc) into `o`. Returns the exit code when the command ends here: 0 after
// --help, 2 after a bad flag (said on stderr); nullopt when the simulation should run.
std::optional<int> ParseFlags(int argc, char** argv, SimOptions* options) {
  SimOptions& o = *options;
  ReplayOptions& r = o.replay;
  GivenFlags given;
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
      r.progress = false;
    } else if (flag == "--remote-mac") {
      o.remote_mac = true;
    } else if (flag == "--policy") {
      ok = value(&o.policy);
    } else if (flag == "--json") {
      ok = value(&o.json_path);
    } else if (flag == "--plot") {
      ok = value(&o.plot_path);
      given.plot = true;
    } else if (flag == "--steps") {
      ok = value(&v) && absl::SimpleAtoi(v, &r.steps) && r.steps >= 10 && r.steps <= 10000000;
    } else if (flag == "--budget-mib") {
      ok = value(&v) && absl::SimpleAtoi(v, &r.budget_mib) && r.budget_mib >= 16 && r.budget_mib <= (1 << 20);
    } else if (flag == "--host-tier-mib") {
      ok = value(&v) && absl::SimpleAtoi(v, &r.host_tier_mib) && r.host_tier_mib >= 4 &&
           r.host_tier_mib <= (1 << 20);
    } else if (flag == "--instances") {
      ok = value(&v) && absl::SimpleAtoi(v, &o.instances) && o.instances >= 1 && o.instances <= 64;
    } else if (flag == "--remote") {
      ok = value(&o.cluster.remote_url);
    } else if (flag == "--remote-timeout-ms") {
      given.remote_timeout = true;
      ok = value(&v) && absl::SimpleAtoi(v, &o.cluster.remote_timeout_ms) &&
           o.cluster.remote_timeout_ms >= 1 && o.cluster.remote_timeout_ms <= 10000;
    } else if (flag == "--seed") {
      ok = value(&v) && absl::SimpleAtoi(v, &r.workload.seed);
    } else if (flag == "--arrivals-per-step") {
      ok = value(&v) && absl::SimpleAtod(v, &r.workload.arrivals_per_step) &&
           r.workload.arrivals_per_step > 0 && r.workload.arrivals_per_step <= 100;
    } else if (flag == "--metrics-port") {
      ok = value(&v) && absl::SimpleAtoi(v, &o.metrics_port) && o.metrics_port > 0 && o.metrics_port < 65536;
    } else if (flag == "--linger") {
      given.linger = true;
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
  if (!o.cluster.remote_url.empty() && o.instances < 2) {
    std::fprintf(stderr, "kvtier simulate: --remote needs --instances 2 or more\n");
    return 2;
  }
  return RefuseCombinations(given, options);
}

// The Markdown table comparing the policy run with the FP16 run, the tier mix and the gain.
void PrintReport(const RunResult& run, const RunResult& fp16, double gain) {
  const CacheStats& s = run.final_stats;
  const int64_t migrated = MigratedBlocks(s);
  std::printf("\n| metric | %s | fp16 |\n| --- | --- | --- |\n", run.policy.c_str());
  std::printf("| concurrent sequences (mean, second half) | %.1f | %.1f |\n", run.mean_running, fp16.mean_running);
  std::printf("| peak concurrent sequences | %lld | %lld |\n", static_cast<long long>(run.peak_running),
              static_cast<long long>(fp16.peak_running));
  std::printf("| steps with requests waiting (second half) | %.0f%% | %.0f%% |\n",
              100 * run.saturated_fraction, 100 * fp16.saturated_fraction);
  std::printf("| completed requests | %lld | %lld |\n", static_cast<long long>(run.completed),
              static_cast<long long>(fp16.completed));
  std::printf("| preemptions | %lld | %lld |\n", static_cast<long long>(run.preemptions),
              static_cast<long long>(fp16.preemptions));
  std::printf("| rejected requests | %lld | %lld |\n", static_cast<long long>(run.rejected),
              static_cast<long long>(fp16.rejected));
  std::printf("| prefix hit ratio (tokens) | %.3f | %.3f |\n", PrefixHitRatio(s),
              PrefixHitRatio(fp16.final_stats));
  std::printf("| effective bits per element (end) | %.2f | %.2f |\n", s.effective_bits_per_element,
              fp16.final_stats.effective_bits_per_element);
  std::printf("| demoted blocks | %lld | 0 |\n", static_cast<long long>(migrated));
  std::printf("| demotions under pressure | %lld | 0 |\n", static_cast<long long>(s.demotions_under_pressure));
  std::printf("| evicted cached blocks | %lld | %lld |\n", static_cast<long long>(s.evicted_blocks),
              static_cast<long long>(fp16.final_stats.evicted_blocks));
  std::printf("| wall time | %.1f s | %.1f s |\n", run.seconds, fp16.seconds);
  std::printf("\ntier mix at the end:");
  for (const FormatStats& f : s.formats) {
    std::printf("  %s %lld blocks", f.name.c_str(), static_cast<long long>(f.blocks_in_use + f.blocks_cached));
  }
  if (std::isnan(gain)) {
    std::printf("\ncapacity gain vs all-FP16 at the same budget: n/a (all-FP16 held no sequence)\n");
  } else {
    std::printf("\ncapacity gain vs all-FP16 at the same budget: %.2fx\n", gain);
  }
}

// The policy run against the same policy with a host tier of `host_mib` below the same budget.
void PrintHostTierReport(const RunResult& run, const RunResult& host, int64_t host_mib) {
  const CacheStats& s = run.final_stats;
  const CacheStats& h = host.final_stats;
  std::printf("\n| metric | %s | %s + %lld MiB host tier |\n| --- | --- | --- |\n", run.policy.c_str(),
              run.policy.c_str(), static_cast<long long>(host_mib));
  std::printf("| prefix hit ratio (tokens) | %.3f | %.3f |\n", PrefixHitRatio(s), PrefixHitRatio(h));
  std::printf("| hit tokens from the host tier | 0 | %lld |\n", static_cast<long long>(h.host.hit_tokens));
  std::printf("| completed requests | %lld | %lld |\n", static_cast<long long>(run.completed),
              static_cast<long long>(host.completed));
  std::printf("| concurrent sequences (mean, second half) | %.1f | %.1f |\n", run.mean_running, host.mean_running);
  std::printf("| evicted cached blocks | %lld | %lld |\n", static_cast<long long>(s.evicted_blocks),
              static_cast<long long>(h.evicted_blocks));
  std::printf("| offloaded / onloaded blocks | 0 / 0 | %lld / %lld |\n",
              static_cast<long long>(h.host.offloaded_blocks), static_cast<long long>(h.host.onloaded_blocks));
  std::printf("| MiB moved down / up | 0 / 0 | %.1f / %.1f |\n", h.host.bytes_offloaded / 1048576.0,
              h.host.bytes_onloaded / 1048576.0);
  std::printf("| wall time | %.1f s | %.1f s |\n", run.seconds, host.seconds);
}

// Hit ratio, completed requests and remote-tier figures summed over a cluster's instances.
struct ClusterSum {
  int64_t queried = 0, hit = 0, remote_hit = 0, completed = 0, preemptions = 0;
  RemoteTierStats remote;
  double seconds = 0;

  explicit ClusterSum(const std::vector<RunResult>& runs) {
    for (const RunResult& r : runs) {
      const CacheStats& s = r.final_stats;
      queried += s.prefix_queried_tokens;
      hit += s.prefix_hit_tokens;
      remote_hit += s.remote.hit_tokens;
      completed += r.completed;
      preemptions += r.preemptions;
      remote.hit_blocks += s.remote.hit_blocks;
      remote.written_blocks += s.remote.written_blocks;
      remote.bytes_read += s.remote.bytes_read;
      remote.bytes_written += s.remote.bytes_written;
      remote.dropped_writes += s.remote.dropped_writes;
      remote.timeouts += s.remote.timeouts;
      remote.unavailable += s.remote.unavailable;
      remote.import_failures += s.remote.import_failures;
      remote.corrupt_values +=
          s.remote.corrupt_values + s.remote.mismatched_values + s.remote.unauthenticated_values;
      seconds = r.seconds;
    }
  }
  double ratio() const { return queried > 0 ? static_cast<double>(hit) / queried : 0; }
};

void PrintClusterReport(const SimOptions& o, const ClusterSum& alone, const ClusterSum* shared) {
  auto col = [&](auto f) { return shared ? absl::StrCat(" ", f(*shared), " |") : std::string(); };
  std::printf("\n| metric (sum of %d instances) | separate caches |%s\n| --- | --- |%s\n", o.instances,
              shared ? " sharing the Redis tier |" : "", shared ? " --- |" : "");
  std::printf("| prefix hit ratio (tokens) | %.3f |%s\n", alone.ratio(),
              col([](const ClusterSum& c) { return absl::StrFormat("%.3f", c.ratio()); }).c_str());
  std::printf("| completed requests | %lld |%s\n", static_cast<long long>(alone.completed),
              col([](const ClusterSum& c) { return absl::StrCat(c.completed); }).c_str());
  std::printf("| preemptions | %lld |%s\n", static_cast<long long>(alone.preemptions),
              col([](const ClusterSum& c) { return absl::StrCat(c.preemptions); }).c_str());
  std::printf("| hit tokens from the remote tier | 0 |%s\n",
              col([](const ClusterSum& c) { return absl::StrCat(c.remote_hit); }).c_str());
  std::printf("| remote blocks written / read | 0 / 0 |%s\n", col([](const ClusterSum& c) {
                return absl::StrCat(c.remote.written_blocks, " / ", c.remote.hit_blocks);
              }).c_str());
  std::printf("| remote MiB written / read | 0 / 0 |%s\n", col([](const ClusterSum& c) {
                return absl::StrFormat("%.0f / %.0f", c.remote.bytes_written / 1048576.0,
                                       c.remote.bytes_read / 1048576.0);
              }).c_str());
  std::printf("| remote writes dropped, timeouts, unavailable, bad values, import failures | - |%s\n",
              col([](const ClusterSum& c) {
                const RemoteTierStats& r = c.remote;
                return absl::StrCat(r.dropped_writes, ", ", r.timeouts, ", ", r.unavailable, ", ",
                                    r.corrupt_values, ", ", r.import_failures);
              }).c_str());
  std::printf("| wall time | %.1f s |%s\n", alone.seconds,
              col([](const ClusterSum& c) { return absl::StrFormat("%.1f s", c.seconds); }).c_str());
}

// 32 random bytes from the system's random device, the run's remote secret.
std::string RandomSecret() {
  std::random_device device;
  std::string secret(32, '\0');
  for (char& c : secret) c = static_cast<char>(device());
  return secret;
}

// --instances N: the cluster without, then (with --remote) with the shared tier.
int RunCluster(const SimOptions& o, const Policy& policy) {
  std::printf("kvtier simulate: %d instances, policy '%s', %lld steps, %lld MiB budget each, seed %u\n",
              o.instances, policy.name.c_str(), static_cast<long long>(o.replay.steps),
              static_cast<long long>(o.replay.budget_mib), o.replay.workload.seed);
  ClusterOptions cluster = o.cluster;
  cluster.instances = o.instances;
  cluster.remote_url.clear();
  absl::StatusOr<std::vector<RunResult>> alone = ReplayCluster(policy, o.replay, cluster);
  absl::StatusOr<std::vector<RunResult>> shared = std::vector<RunResult>{};
  if (alone.ok() && !o.cluster.remote_url.empty()) {
    cluster.remote_url = o.cluster.remote_url;
    // A model id of its own: the run starts from a cold remote tier.
    cluster.remote_model_id = absl::StrCat("kvtier-simulate-", std::chrono::system_clock::now().time_since_epoch().count());
    if (o.remote_mac) cluster.remote_secret = RandomSecret();
    shared = ReplayCluster(policy, o.replay, cluster);
  }
  if (!alone.ok() || !shared.ok()) {
    std::fprintf(stderr, "kvtier simulate: %s\n", (alone.ok() ? shared : alone).status().ToString().c_str());
    return 1;
  }
  const ClusterSum a(*alone);
  const std::optional<ClusterSum> s =
      o.cluster.remote_url.empty() ? std::nullopt : std::optional<ClusterSum>(ClusterSum(*shared));
  PrintClusterReport(o, a, s ? &*s : nullptr);
  return 0;
}

// The plot and the JSON the options ask for; the exit code (1 when one cannot be written).
int WriteFiles(const SimOptions& o, const RunResult& run, const RunResult& fp16, double gain) {
  if (!o.plot_path.empty()) {
    if (absl::Status p = WriteSimulatePlot(o.plot_path, Plotted(run), Plotted(fp16), o.replay.steps,
                                           o.replay.budget_mib);
        !p.ok()) {
      std::fprintf(stderr, "kvtier simulate: %s\n", p.ToString().c_str());
      return 1;
    }
    std::printf("plot: %s\n", o.plot_path.c_str());
  }
  if (!o.json_path.empty()) {
    if (absl::Status j = WriteOutputFile(o.json_path, Json(run, fp16, gain, o)); !j.ok()) {
      std::fprintf(stderr, "kvtier simulate: %s\n", j.ToString().c_str());
      return 1;
    }
    std::printf("json: %s\n", o.json_path.c_str());
  }
  return 0;
}

}  // namespace

int RunSimulate(int argc, char** argv) {
  SimOptions o;
  if (std::optional<int> exit_code = ParseFlags(argc, argv, &o)) return *exit_code;
  absl::StatusOr<Policy> policy = LoadPolicy(o.policy);
  if (!policy.ok()) {
    std::fprintf(stderr, "kvtier simulate: %s\n", policy.status().ToString().c_str());
    return 2;
  }
  if (policy->name.empty()) policy->name = o.policy;
  if (absl::Status s = CheckReplayOptions(*policy, o.replay); !s.ok()) {
    std::fprintf(stderr, "kvtier simulate: %s\n", s.ToString().c_str());
    return 2;
  }
  if (o.instances > 1) return RunCluster(o, *policy);
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
              policy->name.c_str(), static_cast<long long>(o.replay.steps),
              static_cast<long long>(o.replay.budget_mib), o.replay.workload.seed);
  ReplayOptions device_only = o.replay;  // the host tier has its own run
  device_only.host_tier_mib = 0;
  absl::StatusOr<RunResult> run = ReplayWorkload(*policy, device_only, exposer.get());
  absl::StatusOr<RunResult> fp16 =
      run.ok() ? ReplayWorkload(*PolicyPreset("fp16"), device_only, nullptr) : run.status();
  if (!run.ok() || !fp16.ok()) {
    std::fprintf(stderr, "kvtier simulate: %s\n", (run.ok() ? fp16 : run).status().ToString().c_str());
    return 1;
  }
  // Undefined (NaN: "n/a", JSON null) when all-FP16 held no sequence.
  const double gain = fp16->mean_running > 0 ? run->mean_running / fp16->mean_running : NAN;
  PrintReport(*run, *fp16, gain);
  if (o.replay.host_tier_mib > 0) {
    absl::StatusOr<RunResult> host = ReplayWorkload(*policy, o.replay, nullptr);
    if (!host.ok()) {
      std::fprintf(stderr, "kvtier simulate: %s\n", host.status().ToString().c_str());
      return 1;
    }
    PrintHostTierReport(*run, *host, o.replay.host_tier_mib);
  }
  if (int code = WriteFiles(o, *run, *fp16, gain); code != 0) return code;
  if (exposer != nullptr && o.linger_seconds > 0) {
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.linger_seconds));
  }
  return 0;
}

}  // namespace kvtier::tool
