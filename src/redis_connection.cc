#include "src/redis_connection.h"

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "src/echo.h"
#include "src/host_lookup.h"

namespace kvtier {
namespace {

constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr std::chrono::milliseconds kMaxBackoff{2000};
// A call earns, beyond the timeout, the time of the bytes it has moved at this rate (100 MB/s, a
// loaded 1 GbE link): a large value moving steadily completes, a server trickling bytes is cut.
constexpr size_t kFloorBytesPerMs = 100'000;
// The bytes of a reply's framing, or of a whole short reply ("+OK").
constexpr size_t kShortReplyBytes = 64;
// What an error reply's text may add to the bytes an exchange asked for (Redis's MISCONF text
// is over 300 bytes), so that the server's own message is read and reported.
constexpr size_t kErrorTextBytes = 4096;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval Timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

}  // namespace

absl::StatusOr<RedisAddress> ParseRedisUrl(absl::string_view url) {
  constexpr absl::string_view kScheme = "redis://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat(Echo(url), " does not start with redis://"));
  }
  absl::string_view rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  RedisAddress address;
  absl::string_view port;
  bool has_port = false;
  if (absl::ConsumePrefix(&rest, "[")) {  // an IPv6 address: redis://[::1]:6379
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(Echo(url), " has no ']' after its '['"));
    }
    address.host = std::string(rest.substr(0, close));
    rest.remove_prefix(close + 1);
    has_port = !rest.empty();
    if (has_port && !absl::ConsumePrefix(&rest, ":")) {
      return absl::InvalidArgumentError(absl::StrCat(Echo(url), ": expected ':PORT' after ']'"));
    }
    port = rest;
  } else {
    const size_t colon = rest.find(':');
    if (colon != absl::string_view::npos && rest.find(':', colon + 1) != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(Echo(url), ": an IPv6 address goes in brackets, redis://[ADDRESS]:PORT"));
    }
    address.host = std::string(rest.substr(0, colon));
    has_port = colon != absl::string_view::npos;
    if (has_port) port = rest.substr(colon + 1);
  }
  if (has_port &&
      (!absl::SimpleAtoi(port, &address.port) || address.port < 1 || address.port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat(Echo(url), " has no port in [1, 65535]"));
  }
  if (address.host.empty() || absl::StrContains(address.host, '/') ||
      absl::StrContains(address.host, '@')) {
    return absl::InvalidArgumentError(
        absl::StrCat(Echo(url), " is not redis://HOST[:PORT] (no user, password or database)"));
  }
  return address;
}

RedisConnection::RedisConnection(RedisAddress address, int timeout_ms)
    : address_(std::move(address)), timeout_ms_(timeout_ms), lookup_(address_.host) {}

RedisConnection::~RedisConnection() {
  if (context_ != nullptr) redisFree(context_);
}

absl::Status RedisConnection::Connect() {
  if (context_ != nullptr) return absl::OkStatus();
  const Clock::time_point now = Clock::now();
  if (now < retry_at_) {
    return absl::UnavailableError(absl::StrCat(Url(), " unreachable; retrying later"));
  }
  // The name's lookup, then the connects to its addresses, each within the timeout.
  const absl::StatusOr<std::vector<std::string>> addresses =
      lookup_.Addresses(std::chrono::milliseconds(timeout_ms_));
  if (!addresses.ok()) {
    const absl::Status& s = addresses.status();
    const absl::StatusCode code =
        absl::IsDeadlineExceeded(s) ? s.code() : absl::StatusCode::kUnavailable;
    return Drop(absl::Status(code, absl::StrCat(Url(), ": ", s.message())));
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  absl::Status why;
  for (const std::string& address : *addresses) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      why = absl::DeadlineExceededError(absl::StrCat(Url(), " connect: timed out"));
      break;
    }
    context_ = redisConnectWithTimeout(address.c_str(), address_.port,
                                       Timeval(static_cast<int>(left)));
    if (context_ == nullptr) {
      retry_at_ = now + kMaxBackoff;
      return absl::UnavailableError("hiredis could not allocate a context");
    }
    if (context_->err == 0 && redisSetTimeout(context_, Timeval(timeout_ms_)) == REDIS_OK) {
      reconnects_ += ever_connected_ ? 1 : 0;
      ever_connected_ = true;
      backoff_ = std::chrono::milliseconds{0};
      return absl::OkStatus();
    }
    why = Error("connect");  // the next address, if any
    redisFree(context_);
    context_ = nullptr;
  }
  return Drop(why);
}

std::string RedisConnection::Url() const {
  return absl::StrCat("redis://", address_.host, ":", address_.port);
}

absl::Status RedisConnection::Error(absl::string_view during) const {
  const int saved_errno = errno;
  const std::string what = absl::StrCat(Url(), " ", during, ": ", context_->errstr);
  const bool timed_out = context_->err == REDIS_ERR_IO &&
                         (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
                          saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS ||
                          absl::StrContains(context_->errstr, "timed out"));
  if (timed_out) return absl::DeadlineExceededError(what);
  // A reply that is not Redis's protocol, or one hiredis could not hold, is the server's fault,
  // not a connection lost (which a fresh connection is tried for).
  const bool malformed = context_->err == REDIS_ERR_PROTOCOL || context_->err == REDIS_ERR_OOM;
  return malformed ? absl::InternalError(what) : absl::UnavailableError(what);
}

absl::Status RedisConnection::Fail(absl::string_view during) {
  return Drop(Error(during));
}

absl::Status RedisConnection::Drop(absl::Status why) {
  redisFree(context_);
  context_ = nullptr;
  backoff_ = std::min(kMaxBackoff, std::max(kFirstBackoff, 2 * backoff_));
  retry_at_ = Clock::now() + backoff_;
  return why;
}

std::chrono::milliseconds RedisConnection::Budget(size_t bytes) const {
  return std::chrono::milliseconds(timeout_ms_) +
         std::chrono::milliseconds(bytes / kFloorBytesPerMs);
}

RedisConnection::Clock::time_point RedisConnection::Earned(Clock::time_point start, size_t bytes,
                                                           Clock::time_point not_after) const {
  return std::min(not_after, start + Budget(bytes));
}

absl::Status RedisConnection::TimedOut(absl::string_view during) {
  return Drop(absl::DeadlineExceededError(absl::StrCat(
      Url(), " ", during, ": not done within ", timeout_ms_, " ms and the transfer's allowance")));
}

absl::Status RedisConnection::Arm(Clock::time_point deadline, absl::string_view during) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return TimedOut(during);
  redisSetTimeout(context_, Timeval(static_cast<int>(left.count())));
  return absl::OkStatus();
}

absl::Status RedisConnection::Send(absl::string_view request, Clock::time_point not_after) {
  const Clock::time_point start = Clock::now();
  for (size_t sent = 0; sent < request.size();) {
    if (absl::Status s = Arm(Earned(start, sent, not_after), "send"); !s.ok()) return s;
    const ssize_t n =
        send(context_->fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      // EAGAIN: the socket's timeout, after which Arm decides whether time is left.
      return Drop(absl::UnavailableError(absl::StrCat(Url(), " send: ", std::strerror(errno))));
    }
  }
  return absl::OkStatus();
}

absl::Status RedisConnection::NextReply(Clock::time_point start, Clock::time_point not_after,
                                        size_t max_bytes, size_t* received, void** reply) {
  const redisReader& reader = *context_->reader;
  for (;;) {
    // A reply's first byte is looked at before hiredis parses it: an aggregate's header would
    // have it allocate a pointer per element announced (16 GiB for 2^31).
    const bool at_reply_start =
        reader.ridx == -1 || (reader.ridx == 0 && reader.rstack[0].type < 0);
    if (at_reply_start && reader.pos < reader.len &&
        absl::string_view("*%~>").find(reader.buf[reader.pos]) != absl::string_view::npos) {
      return Drop(absl::InternalError(absl::StrCat(
          Url(), " reply: an aggregate (array, map, set or push), which no command asks for")));
    }
    if (redisGetReplyFromReader(context_, reply) != REDIS_OK) return Fail("reply");
    if (*reply != nullptr) return absl::OkStatus();
    if (absl::Status s = Arm(Earned(start, *received, not_after), "reply"); !s.ok()) return s;
    const size_t before = reader.len;  // hiredis discards parsed bytes only when parsing
    if (redisBufferRead(context_) != REDIS_OK) return Fail("reply");
    *received += reader.len - before;
    if (*received > max_bytes + kErrorTextBytes) {
      return Drop(absl::InternalError(absl::StrCat(Url(), " reply: ", *received,
                                                   " bytes read in, over the ", max_bytes,
                                                   " asked for")));
    }
  }
}

absl::StatusOr<std::string> RedisConnection::Request(
    const std::vector<std::vector<absl::string_view>>& commands) {
  std::string request;
  for (const std::vector<absl::string_view>& args : commands) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (absl::string_view a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    char* command = nullptr;
    const int length = redisFormatCommandArgv(&command, static_cast<int>(argv.size()),
                                              argv.data(), lengths.data());
    if (length < 0) return absl::InternalError("hiredis could not format a command");
    request.append(command, static_cast<size_t>(length));
    redisFreeCommand(command);
  }
  return request;
}

absl::Status RedisConnection::ExchangeOnce(absl::string_view request, size_t num_replies,
                                           size_t reply_bytes, Clock::time_point not_after,
                                           std::vector<std::optional<std::string>>* values) {
  if (absl::Status s = Send(request, not_after); !s.ok()) return s;
  const Clock::time_point sent = Clock::now();
  absl::Status refused;
  size_t received = 0;
  for (size_t i = 0; i < num_replies; ++i) {
    void* raw = nullptr;
    if (absl::Status s = NextReply(sent, not_after, reply_bytes, &received, &raw); !s.ok()) {
      return s;
    }
    const Reply reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_STRING) {
      values->emplace_back(std::string(reply->str, reply->len));
      continue;
    }
    values->emplace_back(std::nullopt);  // one entry per command, its value or none
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string message(reply->str, reply->len);
      refused = absl::StartsWith(message, "OOM") ? absl::ResourceExhaustedError(message)
                                                 : absl::InternalError(message);
    } else if (reply->type != REDIS_REPLY_NIL && reply->type != REDIS_REPLY_STATUS) {
      refused = absl::InternalError(absl::StrCat("unexpected reply type ", reply->type));
    }
  }
  return refused;
}

absl::Status RedisConnection::Exchange(const std::vector<std::vector<absl::string_view>>& commands,
                                       size_t reply_bytes,
                                       std::vector<std::optional<std::string>>* values) {
  const absl::StatusOr<std::string> request = Request(commands);
  if (!request.ok()) return request.status();
  const bool reused = context_ != nullptr;
  if (absl::Status s = Connect(); !s.ok()) return s;
  const Clock::time_point started = Clock::now();
  absl::Status s =
      ExchangeOnce(*request, commands.size(), reply_bytes, Clock::time_point::max(), values);
  if (reused && absl::IsUnavailable(s)) {
    // A connection idle across a server restart is found closed only now: one fresh try, within
    // the timeout and both ways' bytes at the floor rate from the first try's start (a server
    // that stalls, then closes, gets no second budget; a large value can still be sent again).
    values->clear();
    retry_at_ = Clock::time_point{};
    if (s = Connect(); s.ok()) {
      s = ExchangeOnce(*request, commands.size(), reply_bytes,
                       started + Budget(request->size() + reply_bytes), values);
    }
  }
  return s;
}

absl::Status RedisConnection::Set(absl::string_view key, absl::string_view value) {
  std::vector<std::optional<std::string>> values;
  return Exchange({{"SET", key, value}}, kShortReplyBytes, &values);
}

absl::Status RedisConnection::Get(absl::Span<const std::string> keys, size_t max_bytes,
                                  std::vector<std::optional<std::string>>* values) {
  // GETRANGE's end is inclusive: a longer value comes back max_bytes + 1 bytes long.
  const std::string last = absl::StrCat(max_bytes);
  std::vector<std::vector<absl::string_view>> commands;
  for (const std::string& key : keys) commands.push_back({"GETRANGE", key, "0", last});
  values->clear();
  const absl::Status s =
      Exchange(commands, keys.size() * (max_bytes + 1 + kShortReplyBytes), values);
  for (std::optional<std::string>& v : *values) {
    if (v.has_value() && v->empty()) v.reset();  // a missing key reads as ""
  }
  if (s.ok() && values->size() != keys.size()) {
    return absl::InternalError("GETRANGE replies missing");
  }
  return s;
}

}  // namespace kvtier
