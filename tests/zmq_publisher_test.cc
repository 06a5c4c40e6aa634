// The KV-event publisher behind Options::kv_events_endpoint (src/events/zmq_publisher.h):
// refused endpoints, the PUB wire format [topic, seq, payload], the replay socket and its end
// marker, the event counters, and the bound on what a stalled subscriber is queued.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Tokens;

std::string Ipc(const std::string& name) {
  return "ipc:///tmp/kvtier-test-" + std::to_string(getpid()) + "-" + name;
}

uint64_t BigEndian(const zmq::message_t& m) {
  uint64_t v = 0;
  for (size_t i = 0; i < m.size(); ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return v;
}

// The tag of each event of a batch's payload.
std::vector<std::string> Tags(const zmq::message_t& payload) {
  const msgpack::object_handle h =
      msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
  std::vector<std::string> tags;
  const msgpack::object& events = h.get().via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    tags.push_back(events.via.array.ptr[i].via.array.ptr[0].as<std::string>());
  }
  return tags;
}

Options EventOptions(const std::string& name) {
  Options o = testing::SmallOptions();
  o.kv_events_endpoint = Ipc(name);
  o.kv_events_replay_endpoint = Ipc(name + "-replay");
  o.kv_events_topic = "kv@test";
  return o;
}

// A SUB socket of `context` on the events of `o` (topic "kv@test"), waiting at most
// `timeout_ms` for each message.
zmq::socket_t Subscriber(zmq::context_t& context, const Options& o, int timeout_ms) {
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@test");
  sub.set(zmq::sockopt::rcvtimeo, timeout_ms);
  sub.connect(o.kv_events_endpoint);
  return sub;
}

TEST(ZmqPublisherTest, RefusedEndpointsAreInvalidArgumentsNamingThem) {
  Options o = testing::SmallOptions();
  o.kv_events_endpoint = "nonsense://x";
  absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
  ASSERT_TRUE(absl::IsInvalidArgument(cache.status())) << cache.status();
  EXPECT_NE(cache.status().message().find("Options.kv_events_endpoint 'nonsense://x'"),
            std::string::npos);
  o.kv_events_endpoint = Ipc("refused");
  o.kv_events_replay_endpoint = "tcp://no-such-interface-name:1";
  cache = Cache::Create(o);
  ASSERT_TRUE(absl::IsInvalidArgument(cache.status())) << cache.status();
  EXPECT_NE(cache.status().message().find("kv_events_replay_endpoint"), std::string::npos);
  o.kv_events_endpoint.clear();  // replay without events
  EXPECT_TRUE(absl::IsInvalidArgument(Cache::Create(o).status()));
  o.kv_events_replay_endpoint.clear();  // vLLM's hashes without events
  o.kv_events_vllm_hash_seed = "0";
  cache = Cache::Create(o);
  ASSERT_TRUE(absl::IsInvalidArgument(cache.status())) << cache.status();
  EXPECT_NE(cache.status().message().find("kv_events_vllm_hash_seed"), std::string::npos);
  o = testing::SmallOptions();
  o.kv_events_endpoint = Ipc("refused");
  o.kv_events_queue_batches = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(Cache::Create(o).status()));
  // The endpoint that failed was released: a cache can bind it now.
  o.kv_events_queue_batches = 8;
  EXPECT_TRUE(Cache::Create(o).ok());
}

TEST(ZmqPublisherTest, PublishesOneBatchPerStepAndReplaysFromASequenceNumber) {
  const Options o = EventOptions("publish");
  zmq::context_t context(1);
  zmq::socket_t sub = Subscriber(context, o, 5000);
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription arrives
  const SequenceId id = cache->AddSequence().value();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->AppendTokens(id, Tokens(40, 1), &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  ASSERT_TRUE(cache->EndStep().ok());  // nothing happened: no batch
  ASSERT_TRUE(cache->Release(id).ok());
  ASSERT_TRUE(cache->AppendTokens(cache->AddSequence().value(), Tokens(20, 9), &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());

  std::vector<zmq::message_t> parts;
  for (uint64_t seq = 0; seq < 2; ++seq) {
    parts.clear();
    ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(parts)));
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[0].to_string(), "kv@test");
    ASSERT_EQ(parts[1].size(), 8u);
    EXPECT_EQ(BigEndian(parts[1]), seq);
    EXPECT_EQ(Tags(parts[2]), std::vector<std::string>{"BlockStored"});
  }

  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect(o.kv_events_replay_endpoint);
  const unsigned char start[8] = {0, 0, 0, 0, 0, 0, 0, 1};
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  parts.clear();
  ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(parts)));
  ASSERT_EQ(parts.size(), 3u);  // "", seq, payload
  EXPECT_EQ(BigEndian(parts[1]), 1u);
  parts.clear();
  ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(parts)));
  ASSERT_EQ(parts.size(), 3u);  // the end marker: -1, ""
  EXPECT_EQ(BigEndian(parts[1]), UINT64_MAX);
  EXPECT_EQ(parts[2].size(), 0u);

  const EventStats s = cache->GetStats().events;
  EXPECT_EQ(s.published_batches, 2);
  EXPECT_EQ(s.published_events, 2);
  EXPECT_EQ(s.dropped_batches, 0);
  EXPECT_EQ(s.replay_requests, 1);

  cache.reset();  // the last batch: AllBlocksCleared
  parts.clear();
  ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(parts)));
  EXPECT_EQ(BigEndian(parts[1]), 2u);
  EXPECT_EQ(Tags(parts[2]), std::vector<std::string>{"AllBlocksCleared"});
}

// `steps` steps that each store one new block (a batch of one event), then the event counters
// once every batch is published or dropped (or after 10 s).
EventStats StepsOfOneStoredBlock(Cache& cache, int steps) {
  std::vector<int64_t> slots;
  for (int i = 0; i < steps; ++i) {
    const SequenceId id = cache.AddSequence().value();
    EXPECT_TRUE(cache.AppendTokens(id, Tokens(16, 1000 * i), &slots).ok());
    EXPECT_TRUE(cache.Release(id).ok());
    EXPECT_TRUE(cache.EndStep().ok());
  }
  EventStats s;
  for (int wait = 0; wait < 1000; ++wait) {
    s = cache.GetStats().events;
    if (s.published_batches + s.dropped_batches == steps) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

TEST(ZmqPublisherTest, EveryBatchIsPublishedOrCountedAsDropped) {
  Options o = EventOptions("drops");
  o.kv_events_queue_batches = 1;
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  constexpr int kSteps = 300;
  const EventStats s = StepsOfOneStoredBlock(*cache, kSteps);
  EXPECT_EQ(s.published_batches + s.dropped_batches, kSteps);
  EXPECT_EQ(s.published_events + s.dropped_events, kSteps);
  EXPECT_EQ(s.queued_batches, 0);
}

// A subscriber that connects and never reads: the PUB socket queues at most
// kv_events_replay_batches batches for it (then drops the newer ones), not vLLM's 100,000. Of
// 20,000 published batches it can later read at most that many plus what the socket buffers of
// the transport hold (a few thousand of these small messages), far fewer than were published.
TEST(ZmqPublisherTest, AStalledSubscriberIsQueuedAtMostTheReplayBatches) {
  Options o = EventOptions("stalled");
  o.kv_events_replay_batches = 16;
  o.kv_events_queue_batches = 1 << 16;
  zmq::context_t context(1);
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::rcvhwm, 16);
  sub.set(zmq::sockopt::subscribe, "kv@test");
  sub.connect(o.kv_events_endpoint);
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription arrives
  constexpr int kSteps = 20000;
  const EventStats s = StepsOfOneStoredBlock(*cache, kSteps);
  ASSERT_EQ(s.published_batches + s.dropped_batches, kSteps);
  ASSERT_GT(s.published_batches, kSteps / 2);
  sub.set(zmq::sockopt::rcvtimeo, 300);
  int64_t received = 0;
  std::vector<zmq::message_t> parts;
  while (zmq::recv_multipart(sub, std::back_inserter(parts))) {
    ++received;
    parts.clear();
  }
  EXPECT_GT(received, 0);
  EXPECT_LT(received, s.published_batches / 2)
      << "of " << s.published_batches << " published, a stalled subscriber still got "
      << received;
}

// The cache's last batch (AllBlocksCleared, at its destruction) is queued whatever
// kv_events_queue_batches allows: dropped, it left no gap a router could see. Here the queue of
// one still holds the step before when the cache is destroyed.
TEST(ZmqPublisherTest, TheLastBatchIsNeverDropped) {
  for (int round = 0; round < 5; ++round) {
    Options o = EventOptions("last-" + std::to_string(round));
    o.kv_events_queue_batches = 1;
    zmq::context_t context(1);
    zmq::socket_t sub = Subscriber(context, o, 2000);
    {
      std::unique_ptr<Cache> cache = testing::MustCreate(o);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription arrives
      std::vector<int64_t> slots;
      ASSERT_TRUE(cache->AppendTokens(*cache->AddSequence(), Tokens(16, 1), &slots).ok());
      ASSERT_TRUE(cache->EndStep().ok());
    }
    std::vector<std::string> tags;
    std::vector<zmq::message_t> parts;
    while ((tags.empty() || tags.back() != "AllBlocksCleared") &&
           zmq::recv_multipart(sub, std::back_inserter(parts))) {
      for (const std::string& tag : Tags(parts[2])) tags.push_back(tag);
      parts.clear();
    }
    ASSERT_FALSE(tags.empty()) << "round " << round;
    EXPECT_EQ(tags.back(), "AllBlocksCleared") << "round " << round;
  }
}

// The memory this process holds, from /proc/self/statm.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Peers that ask for a replay and never read it are each queued the whole replay, but the
// batches' payloads are shared by those messages, not copied for each peer: 16 stalled peers of
// a replay of about 10 MB add a fraction of one copy (they added 16 copies).
TEST(ZmqPublisherTest, StalledReplayPeersShareThePayloadsNotCopyThem) {
  Options o = EventOptions("shared");
  o.kv_events_replay_batches = 256;
  o.kv_events_queue_batches = 1 << 16;
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  std::vector<int64_t> slots;
  for (int i = 0; i < o.kv_events_replay_batches; ++i) {  // 600 blocks stored a batch
    const SequenceId id = cache->AddSequence().value();
    ASSERT_TRUE(cache->AppendTokens(id, Tokens(16 * 600, 1'000'000 * (i + 1)), &slots).ok());
    ASSERT_TRUE(cache->Release(id).ok());
    ASSERT_TRUE(cache->EndStep().ok());
  }
  zmq::context_t context(1);
  const auto ask = [&](zmq::socket_t& peer) {
    peer.set(zmq::sockopt::linger, 0);
    peer.connect(o.kv_events_replay_endpoint);
    const unsigned char start[8] = {};
    peer.send(zmq::message_t(), zmq::send_flags::sndmore);
    peer.send(zmq::buffer(start), zmq::send_flags::none);
  };
  zmq::socket_t reader(context, zmq::socket_type::dealer);
  reader.set(zmq::sockopt::rcvtimeo, 5000);
  ask(reader);
  int64_t replay_bytes = 0;
  std::vector<zmq::message_t> parts;
  while (zmq::recv_multipart(reader, std::back_inserter(parts)) && BigEndian(parts[1]) != UINT64_MAX) {
    replay_bytes += static_cast<int64_t>(parts[2].size());
    parts.clear();
  }
  ASSERT_GT(replay_bytes, 8 << 20);

  const int64_t before = ResidentBytes();
  constexpr int kPeers = 16;
  std::vector<zmq::socket_t> stalled;
  for (int i = 0; i < kPeers; ++i) {
    stalled.emplace_back(context, zmq::socket_type::dealer);
    stalled.back().set(zmq::sockopt::rcvhwm, 1);  // the replay stays queued at the publisher
    stalled.back().set(zmq::sockopt::rcvbuf, 4096);
    ask(stalled.back());
  }
  for (int wait = 0; wait < 500 && cache->GetStats().events.replay_requests < kPeers + 1; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(cache->GetStats().events.replay_requests, kPeers + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the replies are queued
  const int64_t grown = ResidentBytes() - before;
  EXPECT_LT(grown, replay_bytes * 2) << "replay of " << replay_bytes << " bytes; " << kPeers
                                     << " stalled peers added " << grown;
}

// A peer on the PUB socket's ipc:// endpoint, speaking ZeroMQ's wire protocol (ZMTP 3.0) by
// hand as a SUB, which announces a subscription of 64 MiB and sends its first bytes: the socket
// closes the connection at the frame's header (a subscription is a byte and a topic prefix),
// and a subscriber beside it still receives. Was: the 64 MiB allocated and taken in, then copied
// into the subscription tree (the process grew by 55 MB for seconds).
TEST(ZmqPublisherTest, AnOversizeSubscriptionClosesItsConnection) {
  const Options o = EventOptions("oversize");
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  const absl::Cleanup close_fd = [fd] { close(fd); };
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = o.kv_events_endpoint.substr(std::string("ipc://").size());
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  std::string greeting(64, '\0');  // signature, version 3.0, mechanism NULL, as client
  greeting[0] = '\xFF';
  greeting[9] = '\x7F';
  greeting[10] = 3;
  greeting.replace(12, 4, "NULL");
  const std::string ready = std::string("\x05READY\x0BSocket-Type", 18) +
                            std::string("\0\0\0\x03SUB", 7);
  std::string request = greeting + '\x04' + static_cast<char>(ready.size()) + ready;
  request += '\x02';  // a long frame, the message's last: 8 bytes of size, then the data
  constexpr uint64_t kAnnounced = uint64_t{64} << 20;
  for (int i = 7; i >= 0; --i) request += static_cast<char>((kAnnounced >> (8 * i)) & 0xFF);
  request += '\x01' + std::string(4096, 'x');  // "subscribe", then the prefix's first bytes
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  // Read what the socket sends (its greeting and READY) until it closes, for at most 3 s.
  timeval timeout{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
  }
  EXPECT_TRUE(n == 0 || errno == ECONNRESET) << "still connected after 3 s (errno " << errno << ")";

  zmq::context_t context(1);
  zmq::socket_t sub = Subscriber(context, o, 5000);
  std::vector<int64_t> slots;
  for (int step = 0; step < 20; ++step) {  // the subscription reaches the socket meanwhile
    const SequenceId id = cache->AddSequence().value();
    ASSERT_TRUE(cache->AppendTokens(id, Tokens(16, 16 * step), &slots).ok());
    ASSERT_TRUE(cache->Release(id).ok());
    ASSERT_TRUE(cache->EndStep().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<zmq::message_t> parts;
  EXPECT_TRUE(zmq::recv_multipart(sub, std::back_inserter(parts)));
}

// A replay of more batches than ZeroMQ queues for a peer by Default (1000) arrives whole, its
// end marker last, though the peer reads it only once it has all been sent.
TEST(ZmqPublisherTest, AReplayLongerThanZeroMQsDefaultQueueArrivesWhole) {
  Options o = EventOptions("long-replay");
  o.kv_events_queue_batches = 1 << 16;  // every batch published
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  constexpr int kSteps = 6000;
  ASSERT_EQ(StepsOfOneStoredBlock(*cache, kSteps).published_batches, kSteps);
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect(o.kv_events_replay_endpoint);
  const unsigned char start[8] = {};
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the replay is all sent
  std::vector<zmq::message_t> parts;
  uint64_t next = 0;
  while (zmq::recv_multipart(dealer, std::back_inserter(parts))) {
    ASSERT_EQ(parts.size(), 3u);
    if (BigEndian(parts[1]) == UINT64_MAX) break;  // the end marker
    ASSERT_EQ(BigEndian(parts[1]), next) << "a replayed batch was lost";
    ++next;
    parts.clear();
  }
  EXPECT_EQ(next, static_cast<uint64_t>(kSteps));
  ASSERT_FALSE(parts.empty()) << "no end marker within 5 s";
  EXPECT_EQ(BigEndian(parts[1]), UINT64_MAX);
}

// A replay peer that sends requests without pause and never reads the replies, and one that
// sends a 1 MiB frame (over the replay socket's message limit: that peer is dropped): batches are
// still published, another peer's replay is still answered, and the cache is destroyed promptly
// (the thread answers at most 8 requests a turn, then publishes and checks for its stop).
TEST(ZmqPublisherTest, AReplayFloodStallsNeitherPublishingNorShutdown) {
  const Options o = EventOptions("flood");
  std::unique_ptr<Cache> cache = testing::MustCreate(o);
  zmq::context_t context(1);
  std::atomic<bool> flooding{true};
  std::thread flood([&] {
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(o.kv_events_replay_endpoint);
    const unsigned char start[8] = {};
    while (flooding.load()) {
      dealer.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      dealer.send(zmq::buffer(start), zmq::send_flags::dontwait);
    }
  });
  absl::Cleanup stop_flood = [&] {
    flooding.store(false);
    flood.join();
  };
  zmq::socket_t big(context, zmq::socket_type::dealer);
  big.set(zmq::sockopt::linger, 0);
  big.connect(o.kv_events_replay_endpoint);
  big.send(zmq::message_t(), zmq::send_flags::sndmore);
  big.send(zmq::message_t(size_t{1} << 20), zmq::send_flags::none);

  std::vector<int64_t> slots;
  constexpr int kSteps = 40;
  for (int i = 0; i < kSteps; ++i) {
    const SequenceId id = cache->AddSequence().value();
    ASSERT_TRUE(cache->AppendTokens(id, Tokens(16, 100 * i), &slots).ok());
    ASSERT_TRUE(cache->EndStep().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EventStats s;
  for (int wait = 0; wait < 300 && s.published_batches < kSteps; ++wait) {
    s = cache->GetStats().events;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.published_batches, kSteps);
  EXPECT_GT(s.replay_requests, kSteps);  // the flood was being served meanwhile

  zmq::socket_t polite(context, zmq::socket_type::dealer);
  polite.set(zmq::sockopt::rcvtimeo, 5000);
  polite.connect(o.kv_events_replay_endpoint);
  const unsigned char from_last[8] = {0, 0, 0, 0, 0, 0, 0, kSteps - 1};
  polite.send(zmq::message_t(), zmq::send_flags::sndmore);
  polite.send(zmq::buffer(from_last), zmq::send_flags::none);
  std::vector<zmq::message_t> parts;
  ASSERT_TRUE(zmq::recv_multipart(polite, std::back_inserter(parts)));
  EXPECT_EQ(BigEndian(parts[1]), static_cast<uint64_t>(kSteps - 1));

  const auto before = std::chrono::steady_clock::now();
  cache.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(3));
}

}  // namespace
}  // namespace kvtier
