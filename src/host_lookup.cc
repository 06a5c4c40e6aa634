#include "src/host_lookup.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "src/echo.h"

namespace kvtier {
namespace {

bool IsNumericAddress(const std::string& host) {
  unsigned char buffer[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

}  // namespace

struct HostLookup::Lookup {
  std::mutex mu;
  std::condition_variable answered;
  // Guarded by mu. The resolver's status as its code and message: an absl::Status shared
  // between threads has its reference count in Abseil's library, which ThreadSanitizer does not
  // see (src/mutex.h).
  bool done = false;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  std::vector<std::string> addresses;
};

absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc == EAI_NONAME || rc == EAI_NODATA) {
    return absl::NotFoundError(absl::StrCat("host ", Echo(host), " has no address"));
  }
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolving host ", Echo(host), ": ", gai_strerror(rc)));
  }
  std::vector<std::string> ipv4, ipv6;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[NI_MAXHOST] = "";
    if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) &&
        getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) ==
            0) {
      std::vector<std::string>& family = a->ai_family == AF_INET ? ipv4 : ipv6;
      if (std::find(family.begin(), family.end(), text) == family.end()) family.push_back(text);
    }
  }
  freeaddrinfo(found);
  ipv4.insert(ipv4.end(), ipv6.begin(), ipv6.end());
  return ipv4;  // HostLookup::Addresses makes an empty answer NotFound
}

HostLookup::HostLookup(std::string host, HostResolver resolve)
    : host_(std::move(host)), resolve_(std::move(resolve)), numeric_(IsNumericAddress(host_)) {}

absl::StatusOr<std::vector<std::string>> HostLookup::Addresses(std::chrono::milliseconds limit) {
  if (numeric_) return std::vector<std::string>{host_};
  if (in_flight_ == nullptr) {
    auto lookup = std::make_shared<Lookup>();
    try {
      std::thread([lookup, host = host_, resolve = resolve_] {
        absl::StatusOr<std::vector<std::string>> result = resolve(host);
        std::lock_guard<std::mutex> lock(lookup->mu);
        lookup->code = result.status().code();
        lookup->message = std::string(result.status().message());
        if (result.ok()) lookup->addresses = *std::move(result);
        lookup->done = true;
        lookup->answered.notify_all();
      }).detach();
    } catch (const std::system_error& e) {  // no thread could be started
      return absl::UnavailableError(absl::StrCat("resolving host ", Echo(host_), ": ", e.what()));
    }
    in_flight_ = std::move(lookup);
  }
  std::unique_lock<std::mutex> lock(in_flight_->mu);
  if (!in_flight_->answered.wait_for(lock, limit, [&] { return in_flight_->done; })) {
    return absl::DeadlineExceededError(absl::StrCat("resolving host ", Echo(host_), " took over ",
                                                    limit.count(), " ms; still trying"));
  }
  const absl::Status status(in_flight_->code, in_flight_->message);
  std::vector<std::string> addresses = std::move(in_flight_->addresses);
  lock.unlock();
  in_flight_.reset();
  if (!status.ok()) return status;
  if (addresses.empty()) {
    return absl::NotFoundError(absl::StrCat("host ", Echo(host_), " has no address"));
  }
  return addresses;
}

}  // namespace kvtier
