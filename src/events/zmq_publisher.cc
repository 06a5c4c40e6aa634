#include "src/events/zmq_publisher.h"

#include <zmq_addon.hpp>

#include <array>
#include <chrono>
#include <iterator>
#include <memory>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kvtier/format.h"

namespace kvtier {
namespace {

// How long the thread sleeps (in the replay socket's poll) when nothing is queued: the most a
// batch waits before it is sent.
constexpr int kIdleWaitMs = 5;
// How long closing the PUB socket waits for a subscriber to take the last messages.
constexpr int kLingerMs = 1000;
// Replay requests answered per turn of the thread, so that a peer sending them without pause
// neither starves the publishing of new batches nor holds back the thread's stop.
constexpr int kRequestsPerTurn = 8;
// The largest message a replay peer may send: a request's frames are "" and an 8-byte sequence
// number; a larger one disconnects that peer rather than being buffered.
constexpr int64_t kMaxRequestBytes = 64;
// The largest message a subscriber may send the PUB socket: a subscription is a byte and a topic
// prefix; a larger one disconnects that subscriber rather than being buffered (a 1 GiB
// subscription was allocated whole, then copied into the subscription tree).
constexpr int64_t kMaxSubscriptionBytes = 4096;
// Replay's end marker: -1 as 8 bytes.
constexpr std::array<unsigned char, 8> kEndSeq = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

std::array<unsigned char, 8> BigEndian(uint64_t v) {
  std::array<unsigned char, 8> out;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * (7 - i)));
  return out;
}

uint64_t FromBigEndian(const zmq::message_t& m) {
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

// vLLM's rule: bind a wildcard or local transport, connect to anything else.
bool Binds(const std::string& endpoint) {
  return absl::StrContains(endpoint, "*") || absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://");
}

// A message whose data is `payload`'s, held until ZeroMQ has sent it (not a copy).
zmq::message_t SharedMessage(const std::shared_ptr<const std::string>& payload) {
  using Held = std::shared_ptr<const std::string>;
  auto held = std::make_unique<Held>(payload);
  zmq::message_t m(
      const_cast<char*>(payload->data()), payload->size(),
      [](void*, void* hint) { delete static_cast<Held*>(hint); }, held.get());
  held.release();  // the message owns it now
  return m;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> ZmqEventPublisher::Create(
    const Options& options) {
  const char* field = "kv_events_endpoint";
  const std::string* endpoint = &options.kv_events_endpoint;
  try {
    zmq::context_t context(1);
    zmq::socket_t pub(context, zmq::socket_type::pub);
    // A subscriber that stops reading holds at most this many batches here (vLLM: 100,000);
    // past them it misses the newer ones, which it can replay while they are kept.
    pub.set(zmq::sockopt::sndhwm, options.kv_events_replay_batches);
    pub.set(zmq::sockopt::linger, kLingerMs);
    pub.set(zmq::sockopt::maxmsgsize, kMaxSubscriptionBytes);
    if (Binds(*endpoint)) {
      pub.bind(*endpoint);
    } else {
      pub.connect(*endpoint);
    }
    std::optional<zmq::socket_t> replay;
    if (!options.kv_events_replay_endpoint.empty()) {
      field = "kv_events_replay_endpoint";
      endpoint = &options.kv_events_replay_endpoint;
      replay.emplace(context, zmq::socket_type::router);
      // Room for one whole replay and its end marker per peer: past its queue a ROUTER drops
      // replies silently (ZeroMQ's Default, 1000, lost most of a long replay and its marker).
      replay->set(zmq::sockopt::sndhwm, options.kv_events_replay_batches + 1);
      replay->set(zmq::sockopt::linger, 0);
      replay->set(zmq::sockopt::maxmsgsize, kMaxRequestBytes);
      replay->bind(*endpoint);
    }
    return std::unique_ptr<ZmqEventPublisher>(new ZmqEventPublisher(
        options, std::move(context), std::move(pub), std::move(replay)));
  } catch (const zmq::error_t& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("Options.", field, " '", *endpoint, "': ", e.what()));
  } catch (const std::system_error& e) {  // no thread
    return absl::ResourceExhaustedError(absl::StrCat("KV-event publisher thread: ", e.what()));
  }
}

ZmqEventPublisher::ZmqEventPublisher(const Options& options, zmq::context_t context,
                                     zmq::socket_t pub, std::optional<zmq::socket_t> replay)
    : block_size_(options.geometry.block_tokens),
      queue_limit_(static_cast<size_t>(options.kv_events_queue_batches)),
      replay_limit_(static_cast<size_t>(options.kv_events_replay_batches)),
      format_changes_(options.kv_events_format_changes),
      topic_(options.kv_events_topic),
      context_(std::move(context)),
      pub_(std::move(pub)),
      replay_(std::move(replay)) {
  for (const FormatSpec& f : options.palette) format_names_.push_back(FormatName(f));
  thread_ = std::thread([this] { Run(); });
}

ZmqEventPublisher::~ZmqEventPublisher() {
  EndStep();
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

// vLLM's BlockStored has no extra keys (they are inside its hash): `extra_key` is not sent.
void ZmqEventPublisher::Stored(Medium medium, uint64_t hash, uint64_t parent_hash,
                               uint64_t /*extra_key*/, absl::Span<const int32_t> tokens) {
  pending_.Stored(medium, hash, parent_hash, tokens);
}

void ZmqEventPublisher::Removed(Medium medium, uint64_t hash) { pending_.Removed(medium, hash); }

void ZmqEventPublisher::FormatChanged(Medium medium, uint64_t hash, int format) {
  if (format_changes_) pending_.FormatChanged(medium, hash, format);
}

void ZmqEventPublisher::AllBlocksCleared() { pending_.AllBlocksCleared(); }

void ZmqEventPublisher::EndStep() {
  if (pending_.empty()) return;
  Batch batch{next_seq_++, NowSeconds(), pending_.Take()};
  // The cache's last batch (AllBlocksCleared, at its destruction) is queued whatever the limit:
  // dropped, it would leave no gap a router could see, and no replay.
  const bool last = batch.events.back().kind == KvEvent::Kind::kAllCleared;
  MutexLock lock(&mu_);
  if (queue_.size() >= queue_limit_ && !last) {
    dropped_batches_.fetch_add(1, std::memory_order_relaxed);
    dropped_events_.fetch_add(static_cast<int64_t>(batch.events.size()),
                              std::memory_order_relaxed);
    return;
  }
  queue_.push_back(std::move(batch));
  queued_batches_.fetch_add(1, std::memory_order_relaxed);
}

EventStats ZmqEventPublisher::Stats() const {
  EventStats s;
  s.published_batches = published_batches_.load(std::memory_order_relaxed);
  s.published_events = published_events_.load(std::memory_order_relaxed);
  s.dropped_batches = dropped_batches_.load(std::memory_order_relaxed);
  s.dropped_events = dropped_events_.load(std::memory_order_relaxed);
  s.replay_requests = replay_requests_.load(std::memory_order_relaxed);
  s.queued_batches = queued_batches_.load(std::memory_order_relaxed);
  return s;
}

void ZmqEventPublisher::Run() {
  for (;;) {
    std::deque<Batch> work;
    bool stop;
    {
      MutexLock lock(&mu_);
      work.swap(queue_);
      stop = stop_;
    }
    for (Batch& batch : work) {
      Send(batch);
      queued_batches_.fetch_sub(1, std::memory_order_relaxed);  // counted as sent or dropped now
    }
    if (stop) return;  // stop_ is set after the last batch is queued: nothing is left
    if (replay_) {
      ServeReplay(work.empty() ? kIdleWaitMs : 0);
    } else if (work.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kIdleWaitMs));
    }
  }
}

void ZmqEventPublisher::Send(Batch& batch) {
  auto payload = std::make_shared<const std::string>(
      EncodeBatch(batch.ts, batch.events, block_size_, format_names_));
  const std::array<unsigned char, 8> seq = BigEndian(batch.seq);
  std::array<zmq::message_t, 3> parts = {zmq::message_t(topic_.data(), topic_.size()),
                                         zmq::message_t(seq.data(), seq.size()),
                                         SharedMessage(payload)};
  try {
    zmq::send_multipart(pub_, parts);  // a PUB socket drops rather than block
  } catch (const zmq::error_t&) {
    dropped_batches_.fetch_add(1, std::memory_order_relaxed);
    dropped_events_.fetch_add(static_cast<int64_t>(batch.events.size()),
                              std::memory_order_relaxed);
    return;
  }
  published_batches_.fetch_add(1, std::memory_order_relaxed);
  published_events_.fetch_add(static_cast<int64_t>(batch.events.size()),
                              std::memory_order_relaxed);
  if (replay_) {
    if (replay_buffer_.size() == replay_limit_) replay_buffer_.pop_front();
    replay_buffer_.emplace_back(batch.seq, std::move(payload));
  }
}

void ZmqEventPublisher::ServeReplay(int wait_ms) {
  try {
    std::array<zmq::pollitem_t, 1> items = {{{replay_->handle(), 0, ZMQ_POLLIN, 0}}};
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
    std::vector<zmq::message_t> request;
    for (int served = 0; served < kRequestsPerTurn &&
                         zmq::recv_multipart(*replay_, std::back_inserter(request),
                                             zmq::recv_flags::dontwait);
         ++served) {
      // [identity, "", start]; anything else is ignored, as by vLLM.
      if (request.size() == 3 && request[2].size() == 8) {
        replay_requests_.fetch_add(1, std::memory_order_relaxed);
        const uint64_t start = FromBigEndian(request[2]);
        for (const auto& [seq, payload] : replay_buffer_) {
          if (seq < start) continue;
          const std::array<unsigned char, 8> seq_bytes = BigEndian(seq);
          std::array<zmq::message_t, 4> reply = {
              zmq::message_t(request[0].data(), request[0].size()), zmq::message_t(),
              zmq::message_t(seq_bytes.data(), seq_bytes.size()), SharedMessage(payload)};
          zmq::send_multipart(*replay_, reply);  // a ROUTER drops rather than block
        }
        const std::array<zmq::const_buffer, 4> end = {
            zmq::buffer(request[0].data(), request[0].size()), zmq::const_buffer(),
            zmq::buffer(kEndSeq), zmq::const_buffer()};
        zmq::send_multipart(*replay_, end);
      }
      request.clear();
    }
  } catch (const zmq::error_t&) {
    // A failed reply only costs that subscriber its replay; the events go on.
  }
}

absl::StatusOr<std::unique_ptr<BlockEventSink>> MakeZmqEventPublisher(const Options& options) {
  absl::StatusOr<std::unique_ptr<ZmqEventPublisher>> publisher =
      ZmqEventPublisher::Create(options);
  if (!publisher.ok()) return publisher.status();
  return std::unique_ptr<BlockEventSink>(std::move(*publisher));
}

}  // namespace kvtier
