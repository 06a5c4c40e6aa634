// One connection to a Redis server through hiredis, for the remote tier: every wait for the
// server is bounded by a timeout, a lost connection is made again on a later call (after a
// backoff that doubles from 50 ms to 2 s while the server stays unreachable), and failures are
// Status codes that the remote tier counts by kind:
//   Unavailable       the server cannot be reached, its name has no address, or it closed the
//                     connection (also during a backoff, without trying)
//   DeadlineExceeded  a host name's lookup ran past the timeout (it goes on alone, and a later
//                     connect takes its answer; src/host_lookup.h), or the connects to its
//                     addresses past the timeout after it, or a call's commands were not all
//                     sent, or its replies not all in, within the timeout plus the transfer's
//                     bytes at 100 MB/s (a server reading or writing a byte at a time is cut)
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
  // The time a call moving `bytes` one way may take: the timeout plus the bytes at 100 MB/s.
  std::chrono::milliseconds Budget(size_t bytes) const;
  // Drops the connection, its replies out of step: DeadlineExceeded for `during`.
  absl::Status TimedOut(absl::string_view during);
  // Sets the socket's timeout to what is left until `deadline`; TimedOut when nothing is.
  absl::Status Arm(Clock::time_point deadline, absl::string_view during);
  // Writes the queued commands, `bytes` of arguments, within Budget(bytes) and before
  // `not_after` (a server reading a byte at a time never trips a per-write timeout).
  absl::Status Send(size_t bytes, Clock::time_point not_after);
  // Reads until one whole reply is buffered: *reply; past `deadline`, TimedOut. *received
  // counts the bytes read in, over the exchange's replies. Internal, the connection dropped, when
  // it passes `max_bytes` (and an error text's allowance), or when a reply is an aggregate (no
  // command sent asks for one): a server that sends more than was asked for is cut there, not
  // buffered whole (hiredis parses an array's elements as they come, so the unparsed bytes alone
  // would not bound it).
  absl::Status NextReply(Clock::time_point deadline, size_t max_bytes, size_t* received,
                         void** reply);
  // Sends `commands` and reads one entry per reply into *values (a string's value, else
  // nullopt), all within Budget(reply_bytes) of the sending; retries once on a fresh connection
  // when a connection that had worked before turns out closed, within what is left of the first
  // try's Budget(reply_bytes).
  absl::Status Exchange(const std::vector<std::vector<absl::string_view>>& commands,
                        size_t reply_bytes, std::vector<std::optional<std::string>>* values);
  // One try of Exchange, done before `not_after` (Clock::time_point::max(): no bound but its own).
  absl::Status ExchangeOnce(const std::vector<std::vector<absl::string_view>>& commands,
                            size_t reply_bytes, Clock::time_point not_after,
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
