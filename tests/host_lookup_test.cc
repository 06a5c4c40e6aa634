#include "src/host_lookup.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

using std::chrono::milliseconds;
using Answer = absl::StatusOr<std::vector<std::string>>;

// A resolver that answers `address` once released, as one whose DNS server is slow or gone.
class HeldResolver {
 public:
  HostResolver resolver() {
    return [this](const std::string&) -> Answer {
      {
        std::unique_lock<std::mutex> lock(mu_);
        released_cv_.wait(lock, [&] { return released_; });
      }
      answered_ += 1;  // last: the test may end once it sees it
      return std::vector<std::string>{"192.0.2.1"};
    };
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    released_cv_.notify_all();
  }
  void WaitUntilAnswered() const {
    while (answered_.load() == 0) std::this_thread::sleep_for(milliseconds(1));
  }
  int lookups_answered() const { return answered_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable released_cv_;
  bool released_ = false;
  std::atomic<int> answered_{0};
};

TEST(HostLookupTest, NumericAddressesAreTheirOwnAnswerWithoutALookup) {
  const HostResolver never = [](const std::string& host) -> Answer {
    ADD_FAILURE() << "looked up " << host;
    return absl::InternalError("looked up");
  };
  for (const std::string host : {"127.0.0.1", "10.1.2.3", "::1", "fe80::1"}) {
    HostLookup lookup(host, never);
    const Answer found = lookup.Addresses(milliseconds(100));
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(*found, std::vector<std::string>{host});
  }
}

TEST(HostLookupTest, LocalhostResolvesIPv4First) {
  HostLookup lookup("localhost");
  const Answer found = lookup.Addresses(milliseconds(5000));
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_FALSE(found->empty());
  EXPECT_EQ(found->front(), "127.0.0.1");  // /etc/hosts on Debian; IPv6 (::1) after, if listed
}

TEST(HostLookupTest, ResolverErrorsComeBackAsTheyAreAndAnEmptyAnswerIsNotFound) {
  HostLookup lookup("db.example", [](const std::string&) -> Answer {
    return absl::UnavailableError("resolver down");
  });
  EXPECT_TRUE(absl::IsUnavailable(lookup.Addresses(milliseconds(1000)).status()));
  HostLookup empty("db.example", [](const std::string&) -> Answer {
    return std::vector<std::string>{};
  });
  EXPECT_TRUE(absl::IsNotFound(empty.Addresses(milliseconds(1000)).status()));
}

TEST(HostLookupTest, AResolverThatDoesNotAnswerIsCutAtTheLimitAndAnswersALaterCall) {
  HeldResolver held;
  HostLookup lookup("redis.internal", held.resolver());
  for (int call = 0; call < 2; ++call) {  // the second call waits for the same lookup
    const auto start = std::chrono::steady_clock::now();
    const Answer found = lookup.Addresses(milliseconds(100));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(absl::IsDeadlineExceeded(found.status())) << found.status();
    EXPECT_GE(took, milliseconds(90));
    EXPECT_LT(took, milliseconds(2000));
  }
  held.Release();
  held.WaitUntilAnswered();
  const auto start = std::chrono::steady_clock::now();
  const Answer found = lookup.Addresses(milliseconds(5000));  // answered meanwhile
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, std::vector<std::string>{"192.0.2.1"});
  EXPECT_EQ(held.lookups_answered(), 1);  // one lookup served all three calls
}

TEST(HostLookupTest, EachAnswerServesOneCall) {
  std::atomic<int> lookups{0};
  HostLookup lookup("redis.internal", [&](const std::string&) -> Answer {
    lookups += 1;
    return std::vector<std::string>{"192.0.2.1"};
  });
  ASSERT_TRUE(lookup.Addresses(milliseconds(5000)).ok());
  ASSERT_TRUE(lookup.Addresses(milliseconds(5000)).ok());
  EXPECT_EQ(lookups.load(), 2);  // a reconnect resolves anew: the name may have moved
}

TEST(HostLookupTest, ANameWithNoAddressIsNeverAnAddress) {
  // RFC 2606 reserves .invalid: no resolver has an address for it (fully qualified: no search
  // domain is tried). Without a DNS server the lookup may fail otherwise (Unavailable) or
  // outlast the limit, but it never succeeds.
  HostLookup lookup("kvtier-no-such-host.invalid.");
  const Answer found = lookup.Addresses(milliseconds(3000));
  ASSERT_FALSE(found.ok());
  EXPECT_TRUE(absl::IsNotFound(found.status()) || absl::IsUnavailable(found.status()) ||
              absl::IsDeadlineExceeded(found.status()))
      << found.status();
}

}  // namespace
}  // namespace kvtier
