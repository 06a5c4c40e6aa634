// One connection to a Redis server through hiredis, for the remote tier: every wait for the
// server is bounded by a timeout, a lost connection is made again on a later call (after a
// backoff that doubles from 50 ms to 2 s while the server stays unreachable), and failures are
// Status codes that the remote tier counts by kind:
//   Unavailable       the server cannot be reached, its name has no address, or it closed the
//                     connection (also during a backoff, without trying)
//   DeadlineExceeded  a host name's lookup ran past the timeout (it goes on alone, and a later
//                     connect takes its answer; src/host_lookup.h), or the connects to its
//                     addresses past the timeout after it, or a call's commands were not all
//                     sent, or its replies not all in, within the timeout plus the bytes moved
//                     so far at 100 MB/s (a silent server is cut at the timeout, one reading or
//                     writing a byte at a time soon after)
//   ResourceExhausted the server refused a write for its maxmemory (an "OOM" error reply)
//   Internal          any other error reply, a reply outside Redis's protocol, an aggregate
//                     reply, or more bytes than the call asked for (the connection dropped)
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
#include "src/host_lookup.h"

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
  // The values of every key, pipelined, into *values in order: nullopt where a key holds none
  // or an empty string, and at most max_bytes + 1 bytes of each (GETRANGE), so that a value
  // longer than max_bytes is known as such without being transferred. Another type under a key:
  // Internal. On an error *values holds the replies that did arrive, a prefix of the keys'.
  absl::Status Get(absl::Span<const std::string> keys, size_t max_bytes,
                   std::vector<std::optional<std::string>>* values);

  bool connected() const { return context_ != nullptr; }
  // Connections made after the first.
  int64_t reconnects() const { return reconnects_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Connects unless connected; Unavailable during a backoff.
  absl::Status Connect();
  // "redis://HOST:PORT", for messages.
  std::string Url() const;
  // The error of context_ (and errno) during `during` as a Status: DeadlineExceeded for a
  // timeout, else Unavailable.
  absl::Status Error(absl::string_view during) const;
  // Drops the connection after Error(during) and returns it.
  absl::Status Fail(absl::string_view during);
  // Drops the connection, if any (backing off before the next), and returns `why`.
  absl::Status Drop(absl::Status why);
  // The timeout plus `bytes` at 100 MB/s.
  std::chrono::milliseconds Budget(size_t bytes) const;
  // The deadline a transfer begun at `start` has earned once `bytes` have moved: start +
  // Budget(bytes), and never past `not_after`. Time is granted for bytes that arrive, not for
  // bytes asked for: a silent server is cut at the timeout however large the values asked for.
  Clock::time_point Earned(Clock::time_point start, size_t bytes,
                           Clock::time_point not_after) const;
  // Drops the connection, its replies out of step: DeadlineExceeded for `during`.
  absl::Status TimedOut(absl::string_view during);
  // Sets the socket's timeout to what is left until `deadline`; TimedOut when nothing is.
  absl::Status Arm(Clock::time_point deadline, absl::string_view during);
  // The commands in Redis's protocol, one after the other (pipelined).
  static absl::StatusOr<std::string> Request(
      const std::vector<std::vector<absl::string_view>>& commands);
  // Writes `request` with send(MSG_NOSIGNAL) (a write to a connection the server closed is an
  // error, never SIGPIPE, whose default action ends the process), each byte within the time the
  // bytes before it earned (Earned), and before `not_after`.
  absl::Status Send(absl::string_view request, Clock::time_point not_after);
  // Reads until one whole reply is buffered: *reply; past Earned(start, *received, not_after),
  // TimedOut. *received counts the bytes read in, over the exchange's replies. Internal, the
  // connection dropped, when it passes `max_bytes` (and an error text's allowance), or when a
  // reply is an aggregate (no command sent asks for one), refused at its first byte, before
  // hiredis allocates its elements or parses them as they come: a server that sends more than
  // was asked for is cut there, not buffered whole.
  absl::Status NextReply(Clock::time_point start, Clock::time_point not_after, size_t max_bytes,
                         size_t* received, void** reply);
  // Sends `commands` and reads one entry per reply into *values (a string's value, else
  // nullopt); replies of more than `reply_bytes` in all are cut. Retries once on a fresh
  // connection when a connection that had worked before turns out closed, within
  // Budget(request bytes + reply_bytes) of the first try's start.
  absl::Status Exchange(const std::vector<std::vector<absl::string_view>>& commands,
                        size_t reply_bytes, std::vector<std::optional<std::string>>* values);
  // One try of Exchange: `request` holds `num_replies` commands; done before `not_after`
  // (Clock::time_point::max(): no bound but its own).
  absl::Status ExchangeOnce(absl::string_view request, size_t num_replies, size_t reply_bytes,
                            Clock::time_point not_after,
                            std::vector<std::optional<std::string>>* values);

  const RedisAddress address_;
  const int timeout_ms_;
  HostLookup lookup_;
  redisContext* context_ = nullptr;
  bool ever_connected_ = false;
  int64_t reconnects_ = 0;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
};

}  // namespace kvtier

#endif  // KVTIER_SRC_REDIS_CONNECTION_H_
