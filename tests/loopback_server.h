// A server on a loopback port, for tests of clients against servers that misbehave at the
// socket (tests/redis_connection_test.cc, tests/remote_tier_test.cc).
#ifndef KVTIER_TESTS_LOOPBACK_SERVER_H_
#define KVTIER_TESTS_LOOPBACK_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "gtest/gtest.h"
#include "src/redis_connection.h"

namespace kvtier::testing {

// A server on a loopback port that accepts `connections` connections one after the other: for
// each, `serve` runs on the server's thread with the accepted socket (or -1), which is closed when
// it returns; the destructor joins the thread. Default: one connection.
class LoopbackServer {
 public:
  explicit LoopbackServer(std::function<void(int client)> serve, int connections = 1) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(listen(listener_, 1), 0);
    EXPECT_EQ(getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length), 0);
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this, serve = std::move(serve), connections] {
      for (int i = 0; i < connections; ++i) {
        const int client = accept(listener_, nullptr, nullptr);
        serve(client);
        if (client >= 0) close(client);
      }
    });
  }
  ~LoopbackServer() {
    Join();
    close(listener_);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  RedisAddress address() const { return RedisAddress{"127.0.0.1", port_}; }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_LOOPBACK_SERVER_H_
