#include "src/remote_tier.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

#include "src/remote_block_codec.h"

namespace kvtier {
namespace {

constexpr std::chrono::seconds kLogInterval{10};

const char* KindName(RemoteTier::Counter kind) {
  switch (kind) {
    case RemoteTier::kUnavailable: return "server unavailable";
    case RemoteTier::kTimeouts: return "timeout";
    case RemoteTier::kCorrupt: return "corrupt value";
    case RemoteTier::kMismatched: return "value of another model, geometry, codec or format";
    case RemoteTier::kUnauthenticated: return "value without this cache's MAC";
    case RemoteTier::kServerErrors: return "server refused";
    case RemoteTier::kDroppedWrites: return "write dropped";
    case RemoteTier::kImportFailures: return "block read but not attached";
    default: return "error";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Create(const Options& options) {
  absl::StatusOr<RedisAddress> address = ParseRedisUrl(options.remote_tier_url);
  if (!address.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote_tier_url: ", address.status().message()));
  }
  std::optional<RemoteMac> mac;
  if (!options.remote_secret.empty()) {
    absl::StatusOr<RemoteMac> made = RemoteMac::Create(options.remote_secret);
    if (!made.ok()) return made.status();
    mac.emplace(*made);
  }
  return std::unique_ptr<RemoteTier>(new RemoteTier(options, *std::move(address), mac));
}

RemoteTier::RemoteTier(const Options& options, RedisAddress address,
                       std::optional<RemoteMac> mac)
    : identity_(RemoteIdentity(options)),
      mac_(mac),
      max_value_bytes_(kRemoteHeaderBytes +
                       size_t{LargestPageBytes(options)} *
                           static_cast<size_t>(options.geometry.num_layers) +
                       TrailerBytes(mac ? &*mac : nullptr)),
      timeout_(options.remote_timeout_ms),
      queue_capacity_(static_cast<size_t>(options.remote_write_queue_blocks)),
      lookup_(address, options.remote_timeout_ms),
      lookup_seconds_(Histogram::Exponential(1e-4, 2, 12)),
      writer_(address, options.remote_timeout_ms),
      thread_([this] { WriterLoop(); }) {}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stop_ = true;
  }
  queue_cv_.notify_one();
  thread_.join();
}

bool RemoteTier::Put(uint64_t hash, std::string value) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (queue_.size() < queue_capacity_) {
      queue_.push_back(Write{hash, std::move(value)});
      queued_.fetch_add(1, std::memory_order_relaxed);
      queue_cv_.notify_one();
      return true;
    }
  }
  Report(kDroppedWrites, absl::ResourceExhaustedError(
                             absl::StrCat(queue_capacity_, " blocks are waiting to be written")));
  return false;
}

void RemoteTier::WriterLoop() {
  bool give_up = false;  // once stopping, the first failure drops what is left
  while (true) {
    Write write;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) break;
      write = std::move(queue_.front());
      queue_.pop_front();
      stopping = stop_;
    }
    if (give_up) {
      Count(kDroppedWrites);
    } else if (const absl::Status sign = mac_ ? mac_->Sign(&write.value) : absl::OkStatus();
               !sign.ok()) {
      Report(kDroppedWrites, sign);
    } else if (const absl::Status s = writer_.Set(RemoteKey(identity_, write.hash), write.value);
               s.ok()) {
      Count(kWrittenBlocks);
      Count(kBytesWritten, static_cast<int64_t>(write.value.size() - TrailerBytes(mac())));
    } else {
      CountFailure(s);
      give_up = stopping;
    }
    queued_.fetch_sub(1, std::memory_order_relaxed);
    MutexLock lock(&stats_mu_);
    reconnects_[1] = writer_.reconnects();
  }
}

std::vector<std::string> RemoteTier::Lookup(absl::Span<const uint64_t> hashes) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> found;
  MutexLock lock(&lookup_mu_);  // one lookup at a time: the time waited here counts
  for (size_t at = 0; at < hashes.size(); at += kLookupWindow) {
    if (std::chrono::steady_clock::now() - start > timeout_) {
      Report(kTimeouts, absl::DeadlineExceededError(
                            at == 0 ? "lookup waited past its timeout for the one before it"
                                    : "lookup cut at its timeout"));
      break;
    }
    std::vector<std::string> keys;
    for (size_t i = at; i < std::min(hashes.size(), at + kLookupWindow); ++i) {
      keys.push_back(RemoteKey(identity_, hashes[i]));
    }
    std::vector<std::optional<std::string>> values;
    const absl::Status s = lookup_.Get(keys, max_value_bytes_, &values);
    size_t hits = 0;  // the whole replies before a miss, an error or a cut
    while (hits < values.size() && values[hits].has_value()) {
      found.push_back(*std::move(values[hits++]));
    }
    if (!s.ok()) {
      CountFailure(s);
      break;
    }
    if (hits < keys.size()) break;
  }
  lookup_connected_.store(lookup_.connected(), std::memory_order_relaxed);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  MutexLock stats(&stats_mu_);
  lookup_seconds_.Observe(took.count());
  reconnects_[0] = lookup_.reconnects();
  return found;
}

void RemoteTier::CountFailure(const absl::Status& status) {
  if (absl::IsUnavailable(status)) {
    Report(kUnavailable, status);
  } else if (absl::IsDeadlineExceeded(status)) {
    Report(kTimeouts, status);
  } else {
    Report(kServerErrors, status);
  }
}

void RemoteTier::Report(Counter kind, const absl::Status& status) {
  Count(kind);
  const auto now = std::chrono::steady_clock::now();
  int64_t unlogged;
  {
    MutexLock lock(&stats_mu_);
    if (logged_at_[kind].time_since_epoch().count() != 0 && now - logged_at_[kind] < kLogInterval) {
      unlogged_[kind] += 1;
      return;
    }
    logged_at_[kind] = now;
    unlogged = std::exchange(unlogged_[kind], 0);
  }
  std::fprintf(stderr, "kvtier remote tier: %s: %s (%lld more since the last such line)\n",
               KindName(kind), std::string(status.message()).c_str(),
               static_cast<long long>(unlogged));
}

void RemoteTier::Fill(RemoteTierStats* s) const {
  static constexpr std::pair<Counter, int64_t RemoteTierStats::*> kFields[] = {
      {kHitBlocks, &RemoteTierStats::hit_blocks},
      {kHitTokens, &RemoteTierStats::hit_tokens},
      {kMissedBlocks, &RemoteTierStats::missed_blocks},
      {kWrittenBlocks, &RemoteTierStats::written_blocks},
      {kBytesRead, &RemoteTierStats::bytes_read},
      {kBytesWritten, &RemoteTierStats::bytes_written},
      {kUnavailable, &RemoteTierStats::unavailable},
      {kTimeouts, &RemoteTierStats::timeouts},
      {kCorrupt, &RemoteTierStats::corrupt_values},
      {kMismatched, &RemoteTierStats::mismatched_values},
      {kUnauthenticated, &RemoteTierStats::unauthenticated_values},
      {kServerErrors, &RemoteTierStats::server_errors},
      {kDroppedWrites, &RemoteTierStats::dropped_writes},
      {kImportFailures, &RemoteTierStats::import_failures}};
  for (const auto& [counter, field] : kFields) {
    s->*field = counters_[counter].load(std::memory_order_relaxed);
  }
  s->enabled = true;
  s->connected = lookup_connected_.load(std::memory_order_relaxed);
  s->queued_blocks = queued_.load(std::memory_order_relaxed);
  MutexLock lock(&stats_mu_);
  s->reconnects = reconnects_[0] + reconnects_[1];
  s->lookup_seconds = lookup_seconds_.stats();
}

}  // namespace kvtier
