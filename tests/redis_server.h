// A real redis-server for tests: started as a child process on a free loopback port, with no
// persistence, and stopped, paused or restarted on that port on demand.
#ifndef KVTIER_TESTS_REDIS_SERVER_H_
#define KVTIER_TESTS_REDIS_SERVER_H_

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace kvtier::testing {

class RedisServer {
 public:
  // True when redis-server is on the PATH.
  static bool Installed() {
    const char* path = std::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(path ? path : "", ':')) {
      if (access(absl::StrCat(dir, "/redis-server").c_str(), X_OK) == 0) return true;
    }
    return false;
  }

  RedisServer() : port_(FreePort()) {}
  ~RedisServer() { Stop(); }

  int port() const { return port_; }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

  // Starts the server and waits until it answers PING (5 s at most).
  bool Start() {
    const std::string port = absl::StrCat(port_);
    std::vector<std::string> args = {"redis-server", "--port", port, "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--daemonize", "no",
                                      "--logfile", "/dev/null"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      return false;
    }
    for (int i = 0; i < 500; ++i) {
      if (Command({"PING"}) == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void Pause() { kill(pid_, SIGSTOP); }
  void Resume() { kill(pid_, SIGCONT); }

  // Runs one command on a fresh connection: a string, status or error reply's text, an
  // integer in decimal, "(nil)", or "(no connection)".
  std::string Command(const std::vector<std::string>& args) const {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, timeval{1, 0});
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      return "(no connection)";
    }
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lengths.data()));
    std::string out = "(no connection)";
    if (r != nullptr) {
      if (r->type == REDIS_REPLY_INTEGER) {
        out = absl::StrCat(r->integer);
      } else if (r->type == REDIS_REPLY_NIL) {
        out = "(nil)";
      } else if (r->str != nullptr) {
        out.assign(r->str, r->len);
      }
      freeReplyObject(r);
    }
    redisFree(c);
    return out;
  }

 private:
  static int FreePort() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    close(fd);
    return ntohs(addr.sin_port);
  }

  const int port_;
  pid_t pid_ = -1;
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_REDIS_SERVER_H_
