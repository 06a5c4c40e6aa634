// One run of `kvtier simulate`: the seeded serving workload (simulate_workload.h) replayed
// through a real cache under one precision policy, a scheduler that admits requests while the
// budget has headroom and preempts the newest sequence when it runs out, and what the run
// measured.
#ifndef KVTIER_EXAMPLES_KVTIER_SIMULATE_REPLAY_H_
#define KVTIER_EXAMPLES_KVTIER_SIMULATE_REPLAY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/adapters/prometheus_exporter.h"
#include "examples/kvtier/simulate_plot.h"
#include "examples/kvtier/simulate_workload.h"
#include "kvtier/cache.h"
#include "kvtier/policy.h"
#include "prometheus/exposer.h"

namespace kvtier::tool {

// A CacheCollectable registered with an Exposer until this is destroyed or reassigned: it is
// removed then, before the cache it reads goes (a scrape in progress holds its own reference to
// it, so dropping it would not be enough). Move-only.
class ExposedCollectable {
 public:
  ExposedCollectable() = default;
  ExposedCollectable(prometheus::Exposer* exposer, const Cache* cache)
      : exposer_(exposer), collectable_(std::make_shared<CacheCollectable>(cache)) {
    exposer_->RegisterCollectable(collectable_);
  }
  ExposedCollectable(ExposedCollectable&& other) noexcept { *this = std::move(other); }
  ExposedCollectable& operator=(ExposedCollectable&& other) noexcept {
    Remove();
    exposer_ = std::exchange(other.exposer_, nullptr);
    collectable_ = std::move(other.collectable_);
    return *this;
  }
  ~ExposedCollectable() { Remove(); }

 private:
  void Remove() {
    if (exposer_ != nullptr) exposer_->RemoveCollectable(collectable_);
    exposer_ = nullptr;
  }
  prometheus::Exposer* exposer_ = nullptr;
  std::shared_ptr<CacheCollectable> collectable_;
};

struct ReplayOptions {
  int64_t steps = 1000;
  int64_t budget_mib = 512;
  int64_t host_tier_mib = 0;     // Options::host_tier_bytes in MiB; 0: no host tier
  int64_t prefill_chunk = 2048;  // prompt tokens a sequence computes per step
  double admit_below = 0.95;     // admit new requests while usage is below this fraction
  WorkloadOptions workload;
  bool progress = true;          // a progress line on stderr
};

struct RunResult {
  std::string policy;
  std::unique_ptr<Cache> cache;
  ExposedCollectable collectable;  // serves `cache`; declared after it, so removed first
  std::vector<Sample> samples;
  CacheStats final_stats;
  double mean_running = 0;       // over the second half of the run
  int64_t peak_running = 0;
  double saturated_fraction = 0;  // steps of the second half with requests waiting
  int64_t completed = 0;
  int64_t preemptions = 0;
  // Requests turned away: too large for the budget even alone, or arriving when kMaxWaiting
  // requests already wait.
  int64_t rejected = 0;
  double seconds = 0;
};

// Replays `options.steps` steps of the workload through a cache of 2 layers, 2 KV heads,
// head_dim 128 on the CPU backend under `policy`. When `exposer` is not null it serves the
// cache's metrics for as long as the result lives. Deterministic in (policy, options) except
// for `seconds`. Errors: the cache's, unchanged.
absl::StatusOr<RunResult> ReplayWorkload(const Policy& policy, const ReplayOptions& options,
                                         prometheus::Exposer* exposer);

// OK when every cache a run of `policy` under `options` makes can be made: the policy's run,
// the FP16 run beside it and, with a host tier, the policy's run with it; the options' error
// otherwise (a budget or host tier past the cache's block limits), before any run.
absl::Status CheckReplayOptions(const Policy& policy, const ReplayOptions& options);

// A cluster of engine instances behind a router that sends request i to instance i mod N
// (follow-up turns of a conversation usually land elsewhere), optionally sharing a remote tier.
struct ClusterOptions {
  int instances = 2;
  std::string remote_url;       // Options::remote_tier_url; empty: no shared tier
  std::string remote_model_id;  // Options::remote_model_id (unique per run: cold start)
  int32_t remote_timeout_ms = 20;
  std::string remote_secret;    // Options::remote_secret; empty: values unsigned
};

// Replays the workload through `cluster.instances` caches stepped in lock step, each as
// ReplayWorkload's; one result per instance (`seconds` is the whole run's). Errors: the
// caches', unchanged.
absl::StatusOr<std::vector<RunResult>> ReplayCluster(const Policy& policy, const ReplayOptions& options,
                                                     const ClusterOptions& cluster);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_SIMULATE_REPLAY_H_
