// One connection to a Redis server through hiredis, for the remote tier: every wait for the
// server is bounded by a timeout, a lost connection is made again on a later call (after a
// backoff that doubles from 50 ms to 2 s while the server stays unreachable), and failures are
// Status codes that the remote tier counts by kind:
//   Unavailable       the server cannot be reached, or closed the connection (also during a
//                     backoff, without trying)
//   DeadlineExceeded  a connect or send wait ran past the timeout, or a call's replies were not
//                     all in by the timeout after its commands were sent
//   ResourceExhausted the server refused a write for its maxmemory (an "OOM" error reply)
//   Internal          any other error reply
//
// Thread-compatible: each user (the lookup path, the writer thread) owns its connection.
#ifndef KVTIER_SRC_REDIS_CONNECTION_H_
#define KVTIER_SRC_REDIS_CONNECTION_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

struct redisContext;

namespace kvtier {

struct RedisAddress {
  std::string host;
  int port = 6379;
};

// "redis://HOST[:PORT]" with PORT in [1, 65535] (an IPv6 HOST in brackets); InvalidArgument
// naming what is wrong.
absl::StatusOr<RedisAddress> ParseRedisUrl(absl::string_view url);

class RedisConnection {
 public:
  RedisConnection(RedisAddress address, int timeout_ms);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // SET key value. OK when stored.
  absl::Status Set(absl::string_view key, absl::string_view value);
  // The values of every key, pipelined, in order: nullopt where a key holds none or an empty
  // string, and at most max_bytes + 1 bytes of each (GETRANGE), so that a value longer than
  // max_bytes is known as such without being transferred. Another type under a key: Internal.
  absl::StatusOr<std::vector<std::optional<std::string>>> Get(absl::Span<const std::string> keys,
                                                              size_t max_bytes);

  bool connected() const { return context_ != nullptr; }
  // Connections made after the first.
  int64_t reconnects() const { return reconnects_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Connects unless connected; Unavailable during a backoff.
  absl::Status Connect();
  // Drops the connection after `error` (from context_) and returns it as a Status.
  absl::Status Fail(absl::string_view during);
  // Drops the connection (backing off before the next) and returns `why`.
  absl::Status Drop(absl::Status why);
  // Reads until one whole reply is buffered: *reply. Past `deadline` (a server sending a byte
  // at a time never trips a per-read timeout) the connection is dropped, its replies out of
  // step: DeadlineExceeded.
  absl::Status NextReply(Clock::time_point deadline, void** reply);
  // Sends the queued commands of `count` replies and reads them; retries once on a fresh
  // connection when a connection that had worked before turns out closed.
  absl::Status Exchange(const std::vector<std::vector<absl::string_view>>& commands,
                        std::vector<std::optional<std::string>>* values);
  absl::Status ExchangeOnce(const std::vector<std::vector<absl::string_view>>& commands,
                            std::vector<std::optional<std::string>>* values);

  const RedisAddress address_;
  const int timeout_ms_;
  redisContext* context_ = nullptr;
  bool ever_connected_ = false;
  int64_t reconnects_ = 0;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
};

}  // namespace kvtier

#endif  // KVTIER_SRC_REDIS_CONNECTION_H_
