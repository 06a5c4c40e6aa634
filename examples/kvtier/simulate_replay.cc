#include "examples/kvtier/simulate_replay.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <utility>

#include "src/status_macros.h"

namespace kvtier::tool {
namespace {

struct Active {
  Request request;
  SequenceId seq;
  int64_t prefilled = 0;  // prompt tokens in the cache
  std::vector<int32_t> generated;
};

// One progress line: redrawn in place on a terminal; in a log (no terminal), a line each time.
void Progress(const ReplayOptions& o, const std::string& label, int64_t step, const Sample& s) {
  if (!o.progress) return;
  static const bool tty = isatty(2);
  std::fprintf(stderr, "%s[%-12s] step %5lld/%lld  running %4lld  waiting %4lld  %5.2f bits/elem%s",
               tty ? "\r" : "", label.c_str(), static_cast<long long>(step),
               static_cast<long long>(o.steps), static_cast<long long>(s.running),
               static_cast<long long>(s.waiting), s.bits, !tty || step == o.steps ? "\n" : "");
}

// The scheduler of one run: the waiting and running requests, stepped through the cache.
// Not thread-safe.
class Replayer {
 public:
  // `workload` (which may feed other replayers too) must outlive the replayer.
  Replayer(const ReplayOptions& o, const Geometry& geometry, RunResult* result, Workload* workload)
      : o_(o), geometry_(geometry), result_(result), cache_(*result->cache), workload_(*workload) {}

  // A request routed to this replayer; it waits for admission, unless kMaxWaiting already do.
  void Enqueue(Request request) {
    if (waiting_.size() < kMaxWaiting) {
      waiting_.push_back(std::move(request));
    } else {
      Reject(request);
    }
  }

  // Decode step `step`: admission, one step of work, retirement, then the cache's EndStep and
  // the run's statistics.
  absl::Status Step(int64_t step) {
    KVTIER_RETURN_IF_ERROR(Admit());
    KVTIER_RETURN_IF_ERROR(AppendWork());
    Advance();
    KVTIER_RETURN_IF_ERROR(Retire(step));
    KVTIER_RETURN_IF_ERROR(cache_.EndStep());
    Record(step);
    return absl::OkStatus();
  }

  // The run's final statistics into the result.
  void Finish() {
    result_->final_stats = cache_.GetStats();
    result_->mean_running = second_half_steps_ > 0 ? running_sum_ / second_half_steps_ : 0;
    result_->saturated_fraction =
        second_half_steps_ > 0 ? static_cast<double>(saturated_) / second_half_steps_ : 0;
  }

 private:
  // Admits in arrival order while the budget has headroom for what the running sequences will
  // still add (at the cache's current bits per element); matched prefixes come free.
  absl::Status Admit() {
    const CacheStats now = cache_.GetStats();
    const double bytes_per_token = 2.0 * geometry_.num_layers * geometry_.num_kv_heads *
                                   geometry_.head_dim *
                                   std::max(4.0, now.effective_bits_per_element) / 8;
    double reserved = 0;
    for (const Active& a : running_) {
      reserved += bytes_per_token * (static_cast<double>(a.request.prompt.size()) - a.prefilled +
                                     a.request.output_tokens - static_cast<double>(a.generated.size()));
    }
    while (!waiting_.empty()) {
      const double need = bytes_per_token *
                          static_cast<double>(waiting_.front().prompt.size() + waiting_.front().output_tokens);
      if (now.used_bytes + reserved + need > o_.admit_below * now.budget_bytes && !running_.empty()) break;
      reserved += need;
      SequenceOptions so;
      so.prompt = waiting_.front().prompt;
      KVTIER_ASSIGN_OR_RETURN(const AddResult added, cache_.AddSequence(so));
      running_.push_back(Active{std::move(waiting_.front()), added.id, added.cached_tokens, {}});
      waiting_.pop_front();
    }
    return absl::OkStatus();
  }

  // One step of work: a prefill chunk for prefilling sequences, one token for the others.
  // When the budget is full the newest sequence is preempted (recomputed later).
  absl::Status AppendWork() {
    absl::Status s = absl::ResourceExhaustedError("");
    while (!running_.empty() && absl::IsResourceExhausted(s)) {
      batch_.clear();
      counts_.clear();
      tokens_.clear();
      for (const Active& a : running_) {
        const int64_t prompt = static_cast<int64_t>(a.request.prompt.size());
        const int64_t n = a.prefilled < prompt ? std::min(o_.prefill_chunk, prompt - a.prefilled) : 1;
        batch_.push_back(a.seq);
        counts_.push_back(n);
        if (a.prefilled < prompt) {
          tokens_.insert(tokens_.end(), a.request.prompt.begin() + a.prefilled,
                         a.request.prompt.begin() + a.prefilled + n);
        } else {
          tokens_.push_back(workload_.GeneratedToken(
              a.request, static_cast<int64_t>(a.generated.size())));
        }
      }
      slots_.clear();
      s = cache_.AppendBatch(batch_, counts_, tokens_, &slots_);
      if (absl::IsResourceExhausted(s)) {
        KVTIER_RETURN_IF_ERROR(cache_.Release(running_.back().seq));
        if (running_.size() == 1) {
          Reject(running_.back().request);  // alone, it does not fit: it never would
        } else {
          waiting_.push_front(std::move(running_.back().request));
          result_->preemptions += 1;
        }
        running_.pop_back();
      } else if (!s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  void Reject(const Request& request) {
    workload_.Abandoned(request);
    result_->rejected += 1;
  }

  // What the appended batch did to each running sequence.
  void Advance() {
    size_t next_token = 0;
    for (size_t i = 0; i < running_.size(); ++i) {
      Active& a = running_[i];
      if (a.prefilled < static_cast<int64_t>(a.request.prompt.size())) {
        a.prefilled += counts_[i];
      } else {
        a.generated.push_back(tokens_[next_token]);
      }
      next_token += static_cast<size_t>(counts_[i]);
    }
  }

  // Releases the sequences that produced all their output and reports them to the workload.
  absl::Status Retire(int64_t step) {
    for (size_t i = running_.size(); i-- > 0;) {
      Active& a = running_[i];
      if (static_cast<int64_t>(a.generated.size()) < a.request.output_tokens) continue;
      KVTIER_RETURN_IF_ERROR(cache_.Release(a.seq));
      workload_.Finished(a.request, a.generated, step);
      result_->completed += 1;
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return absl::OkStatus();
  }

  // Peak and second-half statistics; a Sample every 10 steps, progress every 50.
  void Record(int64_t step) {
    result_->peak_running = std::max<int64_t>(result_->peak_running, static_cast<int64_t>(running_.size()));
    if (step >= o_.steps / 2) {
      second_half_steps_ += 1;
      running_sum_ += static_cast<double>(running_.size());
      saturated_ += waiting_.empty() ? 0 : 1;
    }
    if (step % 10 == 0 || step + 1 == o_.steps) {
      const CacheStats stats = cache_.GetStats();
      Sample sample{step, static_cast<int64_t>(running_.size()), static_cast<int64_t>(waiting_.size()), {},
                    stats.effective_bits_per_element};
      for (const FormatStats& f : stats.formats) {
        sample.bytes.push_back((f.blocks_in_use + f.blocks_cached) * f.page_bytes * geometry_.num_layers);
      }
      result_->samples.push_back(sample);
      if (step % 50 == 0 || step + 1 == o_.steps) Progress(o_, result_->policy, step + 1, sample);
    }
  }

  // Requests a replayer lets wait; more arriving are turned away (a workload arriving faster
  // than the budget serves it would otherwise hold every prompt).
  static constexpr size_t kMaxWaiting = 4096;

  const ReplayOptions& o_;
  const Geometry geometry_;
  RunResult* result_;
  Cache& cache_;
  Workload& workload_;
  std::deque<Request> waiting_;
  std::vector<Active> running_;
  // The batch of the current step (kept to reuse their memory).
  std::vector<int64_t> slots_;
  std::vector<SequenceId> batch_;
  std::vector<int64_t> counts_;
  std::vector<int32_t> tokens_;
  int64_t saturated_ = 0, second_half_steps_ = 0;
  double running_sum_ = 0;
};

Options CacheOptions(const Policy& policy, const ReplayOptions& o) {
  Options options;
  options.geometry = Geometry{/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/128, /*block_tokens=*/16};
  options.memory_budget_bytes = static_cast<size_t>(o.budget_mib) << 20;
  options.host_tier_bytes = static_cast<size_t>(o.host_tier_mib) << 20;
  options.palette = PolicyPalette(policy);
  options.key_rotation = PresetKeyRotation(policy.name);  // simulate moves no K/V: capacity only
  return options;
}

absl::Status StartRun(const Policy& policy, const Options& options, RunResult* result) {
  KVTIER_ASSIGN_OR_RETURN(result->cache, Cache::Create(options));
  result->policy = policy.name;
  return result->cache->SetPolicy(policy);
}

}  // namespace

absl::Status CheckReplayOptions(const Policy& policy, const ReplayOptions& o) {
  ReplayOptions device_only = o;
  device_only.host_tier_mib = 0;
  KVTIER_RETURN_IF_ERROR(ValidateOptions(CacheOptions(policy, device_only)));
  KVTIER_RETURN_IF_ERROR(ValidateOptions(CacheOptions(*PolicyPreset("fp16"), device_only)));
  return ValidateOptions(CacheOptions(policy, o));
}

absl::StatusOr<RunResult> ReplayWorkload(const Policy& policy, const ReplayOptions& o,
                                         prometheus::Exposer* exposer) {
  RunResult result;
  const Options options = CacheOptions(policy, o);
  KVTIER_RETURN_IF_ERROR(StartRun(policy, options, &result));
  if (exposer != nullptr) result.collectable = ExposedCollectable(exposer, result.cache.get());
  const auto started = std::chrono::steady_clock::now();
  Workload workload(o.workload);
  Replayer replayer(o, options.geometry, &result, &workload);
  for (int64_t step = 0; step < o.steps; ++step) {
    for (Request& r : workload.Arrivals(step)) replayer.Enqueue(std::move(r));
    KVTIER_RETURN_IF_ERROR(replayer.Step(step));
  }
  replayer.Finish();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

absl::StatusOr<std::vector<RunResult>> ReplayCluster(const Policy& policy, const ReplayOptions& o,
                                                     const ClusterOptions& cluster) {
  Options options = CacheOptions(policy, o);
  options.remote_tier_url = cluster.remote_url;
  options.remote_model_id = cluster.remote_model_id;
  options.remote_timeout_ms = cluster.remote_timeout_ms;
  options.remote_secret = cluster.remote_secret;
  options.remote_max_fetch_blocks = 4096;
  options.remote_write_queue_blocks = 4096;
  std::vector<RunResult> results(cluster.instances);
  std::vector<std::unique_ptr<Replayer>> replayers;
  Workload workload(o.workload);
  for (RunResult& result : results) {
    KVTIER_RETURN_IF_ERROR(StartRun(policy, options, &result));
    replayers.push_back(std::make_unique<Replayer>(o, options.geometry, &result, &workload));
  }
  const auto started = std::chrono::steady_clock::now();
  size_t next = 0;  // the router: request i goes to instance i mod N
  for (int64_t step = 0; step < o.steps; ++step) {
    for (Request& r : workload.Arrivals(step)) replayers[next++ % replayers.size()]->Enqueue(std::move(r));
    for (auto& replayer : replayers) KVTIER_RETURN_IF_ERROR(replayer->Step(step));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (size_t i = 0; i < replayers.size(); ++i) {
    replayers[i]->Finish();
    results[i].seconds = seconds;
  }
  return results;
}

}  // namespace kvtier::tool
