// The KV-event publisher (Options::kv_events_endpoint, docs/events.md): a BlockEventSink that
// gathers each step's events into one batch and hands it to its own thread, which encodes it
// (event_batch.h) and sends it on a ZeroMQ PUB socket as vLLM's ZmqEventPublisher does: the
// multipart message [topic, sequence number (8 bytes, big-endian), msgpack payload].
//
// Sequence numbers are given as a batch is queued, so a batch dropped because the queue was full
// (Options::kv_events_queue_batches) is a gap a subscriber sees. With a replay endpoint the
// thread also serves a ROUTER socket: a request [identity, "", start (8 bytes, big-endian)] is
// answered with one message [identity, "", seq, payload] per buffered batch from `start` on,
// then the end marker [identity, "", -1 (8 bytes), ""].
//
// Thread-safety: the BlockEventSink calls are thread-compatible (the cache calls them under its
// mutex) and never block: queueing takes a short lock the publisher thread holds only to swap
// the queue out. Stats is thread-safe.
#ifndef KVTIER_SRC_EVENTS_ZMQ_PUBLISHER_H_
#define KVTIER_SRC_EVENTS_ZMQ_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zmq.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "kvtier/options.h"
#include "src/block_events.h"
#include "src/events/event_batch.h"
#include "src/mutex.h"

namespace kvtier {

class ZmqEventPublisher final : public BlockEventSink {
 public:
  // Binds (or connects) the sockets of `options` and starts the thread. InvalidArgument naming
  // the endpoint that ZeroMQ refuses, with nothing left open.
  static absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> Create(const Options& options);
  // Queues the current batch, lets the thread send everything queued, and closes the sockets
  // (giving a slow subscriber up to a second for the last messages).
  ~ZmqEventPublisher() override;

  void Stored(Medium medium, uint64_t hash, uint64_t parent_hash, uint64_t extra_key,
              absl::Span<const int32_t> tokens) override;
  void Removed(Medium medium, uint64_t hash) override;
  void FormatChanged(Medium medium, uint64_t hash, int format) override;
  void AllBlocksCleared() override;
  void EndStep() override;
  EventStats Stats() const override;

 private:
  struct Batch {
    uint64_t seq = 0;
    double ts = 0;
    std::vector<KvEvent> events;
  };

  ZmqEventPublisher(const Options& options, zmq::context_t context, zmq::socket_t pub,
                    std::optional<zmq::socket_t> replay);

  // The thread: sends queued batches, serves replay requests, until stopped and drained.
  void Run();
  void Send(Batch& batch);
  // Answers every replay request waiting (or arriving within `wait_ms`).
  void ServeReplay(int wait_ms);

  const int32_t block_size_;
  const size_t queue_limit_;
  const size_t replay_limit_;
  const bool format_changes_;
  const std::string topic_;
  std::vector<std::string> format_names_;  // [palette index]

  // The cache's side (under the cache's mutex).
  EventBatchBuilder pending_;
  uint64_t next_seq_ = 0;

  Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // The thread's side.
  zmq::context_t context_;
  zmq::socket_t pub_;
  std::optional<zmq::socket_t> replay_;
  // Kept payloads, shared by the messages of every replay that sends them: a peer that stops
  // reading is queued a replay's messages, not copies of its payloads.
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> replay_buffer_;

  std::atomic<int64_t> published_batches_{0};
  std::atomic<int64_t> published_events_{0};
  std::atomic<int64_t> dropped_batches_{0};
  std::atomic<int64_t> dropped_events_{0};
  std::atomic<int64_t> replay_requests_{0};
  std::atomic<int64_t> queued_batches_{0};

  std::thread thread_;  // last: started once everything above exists
};

// Create, as the sink Cache::Create hands to the cache.
absl::StatusOr<std::unique_ptr<BlockEventSink>> MakeZmqEventPublisher(const Options& options);

}  // namespace kvtier

#endif  // KVTIER_SRC_EVENTS_ZMQ_PUBLISHER_H_
