// The client side of the remote tier (docs/tiers.md): a Redis server shared by caches on many
// machines, below the host tier. The cache hands it encoded blocks to write (remote_block_codec.h)
// and asks it for the values under the keys of the blocks after a local prefix match; it never
// decides what a value means.
//
// Writes go through a bounded queue to one writer thread with its own connection, so the step
// never waits for Redis; a full queue drops the write. A lookup runs on the caller's thread
// over a second connection, pipelined in windows of kLookupWindow keys, and gives up at the
// first missing key, on any error, and once the timeout has passed since it began. Every
// failure is counted by kind (RemoteTierStats) and logged to stderr at most once per kind
// every 10 s; none is returned to the cache's caller. With Options::remote_secret the writer
// signs each value (remote_mac.h) before storing it, off the step's thread.
//
// Thread-safe.
#ifndef KVTIER_SRC_REMOTE_TIER_H_
#define KVTIER_SRC_REMOTE_TIER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/options.h"
#include "kvtier/stats.h"
#include "src/histogram.h"
#include "src/mutex.h"
#include "src/redis_connection.h"
#include "src/remote_mac.h"

namespace kvtier {

class RemoteTier {
 public:
  enum Counter {
    kHitBlocks, kHitTokens, kMissedBlocks, kWrittenBlocks, kBytesRead, kBytesWritten,
    kUnavailable, kTimeouts, kCorrupt, kMismatched, kUnauthenticated, kServerErrors,
    kDroppedWrites, kImportFailures, kNumCounters
  };
  static constexpr size_t kLookupWindow = 8;

  // Starts the writer. Connects lazily: a server that is down costs misses, not an error.
  // InvalidArgument for a remote_tier_url that is not redis://HOST[:PORT] or a remote_secret
  // shorter than RemoteMac::kMinSecretBytes.
  static absl::StatusOr<std::unique_ptr<RemoteTier>> Create(const Options& options);
  // Stops the writer after the writes still queued, giving up on them at the first failure.
  ~RemoteTier();

  uint64_t identity() const { return identity_; }
  // The MAC that values carry, from Options::remote_secret; null without one.
  const RemoteMac* mac() const { return mac_ ? &*mac_ : nullptr; }

  // Queues `value` to be stored under block `hash`, signed first with a secret (mac()). False,
  // counted, when the queue is full.
  bool Put(uint64_t hash, std::string value);
  // The values under the keys of `hashes`, in order, up to the first key without one; fewer
  // when the server is unreachable, slow or errs (counted). Takes about remote_timeout_ms at
  // most (one window's reply wait past it), the wait for other threads' lookups included: one
  // that has waited past it for its turn misses at once.
  std::vector<std::string> Lookup(absl::Span<const uint64_t> hashes);

  void Count(Counter counter, int64_t n = 1) {
    counters_[counter].fetch_add(n, std::memory_order_relaxed);
  }
  // Counts a failed call under the kind its code names, and logs it (rate-limited).
  void CountFailure(const absl::Status& status);
  // Counts `kind` and logs `status` once per kind every 10 s.
  void Report(Counter kind, const absl::Status& status);
  void Fill(RemoteTierStats* stats) const;

 private:
  struct Write {
    uint64_t hash;
    std::string value;
  };
  RemoteTier(const Options& options, RedisAddress address, std::optional<RemoteMac> mac);
  void WriterLoop();

  const uint64_t identity_;
  const std::optional<RemoteMac> mac_;
  // The longest value this cache writes (its largest format's block); a longer one is read only
  // that far, one byte past, and refused.
  const size_t max_value_bytes_;
  const std::chrono::milliseconds timeout_;
  const size_t queue_capacity_;
  std::atomic<int64_t> counters_[kNumCounters] = {};
  std::atomic<int64_t> queued_{0};  // queued or being written
  std::atomic<bool> lookup_connected_{false};

  Mutex lookup_mu_;  // one lookup at a time on its connection
  RedisConnection lookup_ ABSL_GUARDED_BY(lookup_mu_);

  mutable Mutex stats_mu_;
  Histogram lookup_seconds_ ABSL_GUARDED_BY(stats_mu_);
  int64_t reconnects_[2] ABSL_GUARDED_BY(stats_mu_) = {0, 0};  // lookup, writer
  std::chrono::steady_clock::time_point logged_at_[kNumCounters] ABSL_GUARDED_BY(stats_mu_);
  int64_t unlogged_[kNumCounters] ABSL_GUARDED_BY(stats_mu_) = {};

  std::mutex queue_mu_;  // guards queue_ and stop_
  std::condition_variable queue_cv_;
  std::deque<Write> queue_;
  bool stop_ = false;
  RedisConnection writer_;  // the writer thread's only
  std::thread thread_;      // last: started once everything above exists
};

}  // namespace kvtier

#endif  // KVTIER_SRC_REMOTE_TIER_H_
