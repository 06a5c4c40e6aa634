// Host-name resolution bounded by a time limit, for clients of servers named by URL (the remote
// tier's Redis). getaddrinfo has no timeout of its own: a resolver that does not answer holds
// its caller for the resolver's own retries (seconds). So a name is looked up on a thread of its
// own, and its caller waits at most the limit; a lookup past the limit goes on alone, and the
// next call takes its answer (a resolver slower than the limit still gets through, a call
// later) or waits for it again. Each answer serves one call: a reconnect resolves anew.
//
// Thread-compatible; the lookup threads synchronise with it internally.
#ifndef KVTIER_SRC_HOST_LOOKUP_H_
#define KVTIER_SRC_HOST_LOOKUP_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier {

// Resolves a host name to its numeric addresses, blocking. NotFound when the name has no
// address, Unavailable when the resolver failed.
using HostResolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;

// The system's resolver (getaddrinfo): IPv4 addresses first (as hiredis prefers them), each
// once; empty for a name with addresses of no IP family (HostLookup::Addresses: NotFound).
absl::StatusOr<std::vector<std::string>> ResolveHost(const std::string& host);

class HostLookup {
 public:
  explicit HostLookup(std::string host, HostResolver resolve = ResolveHost);
  HostLookup(const HostLookup&) = delete;
  HostLookup& operator=(const HostLookup&) = delete;

  // The numeric addresses of the host: a numeric IPv4 or IPv6 address as it is, at once; a name
  // from the lookup in flight (started now if none is) within `limit`, else DeadlineExceeded,
  // the lookup left in flight for the next call. Errors of the resolver as they are; NotFound
  // for an empty answer. Never an empty list.
  absl::StatusOr<std::vector<std::string>> Addresses(std::chrono::milliseconds limit);

 private:
  struct Lookup;  // one lookup's answer, shared with its thread

  const std::string host_;
  const HostResolver resolve_;
  const bool numeric_;
  std::shared_ptr<Lookup> in_flight_;  // null when none
};

}  // namespace kvtier

#endif  // KVTIER_SRC_HOST_LOOKUP_H_
