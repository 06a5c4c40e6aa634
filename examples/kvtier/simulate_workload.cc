#include "examples/kvtier/simulate_workload.h"

#include <algorithm>
#include <cmath>

namespace kvtier::tool {
namespace {

// The kinds of keyed draws.
enum : uint64_t { kSystemPrompt, kArrivals, kConversation, kTurn, kOutput };

// SplitMix64's finaliser: a well-mixed 64-bit value of x.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Workload::Workload(const WorkloadOptions& options) : options_(options) {
  for (int p = 0; p < options_.system_prompts; ++p) {
    std::mt19937_64 rng = Stream(kSystemPrompt, static_cast<uint64_t>(p));
    std::vector<int32_t> prompt(options_.system_prompt_tokens);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 50000);
    system_prompts_.push_back(std::move(prompt));
  }
}

uint64_t Workload::Key(uint64_t kind, uint64_t a, uint64_t b) const {
  return Mix(Mix(Mix(options_.seed ^ (kind << 32)) ^ a) ^ b);
}

std::mt19937_64 Workload::Stream(uint64_t kind, uint64_t a, uint64_t b) const {
  return std::mt19937_64(Key(kind, a, b));
}

int32_t Workload::GeneratedToken(const Request& request, int64_t index) const {
  const uint64_t key = Key(kOutput, static_cast<uint64_t>(request.conversation),
                           static_cast<uint64_t>(request.turn) << 40 ^ static_cast<uint64_t>(index));
  return static_cast<int32_t>(key % 100000) + 100000;
}

int64_t Workload::LogNormal(std::mt19937_64& rng, double median, int64_t lo, int64_t hi) {
  std::lognormal_distribution<double> dist(std::log(median), 0.6);
  return std::clamp<int64_t>(static_cast<int64_t>(dist(rng)), lo, hi);
}

Request Workload::Turn(int64_t conversation, int64_t step) {
  Conversation& c = conversations_[conversation];
  std::mt19937_64 rng =
      Stream(kTurn, static_cast<uint64_t>(conversation), static_cast<uint64_t>(c.turns));
  const int64_t user =
      LogNormal(rng, options_.user_tokens_median, 16, options_.max_context_tokens / 4);
  for (int64_t i = 0; i < user; ++i) c.history.push_back(static_cast<int32_t>(rng() % 50000));
  Request r;
  r.conversation = conversation;
  r.turn = c.turns;
  r.prompt = c.history;
  r.output_tokens = LogNormal(rng, options_.output_tokens_median, 8, 2048);
  r.arrival_step = step;
  c.turns += 1;
  return r;
}

std::vector<Request> Workload::Arrivals(int64_t step) {
  std::vector<Request> out;
  while (!follow_ups_.empty() && follow_ups_.front().step <= step) {
    out.push_back(Turn(follow_ups_.front().conversation, step));
    follow_ups_.pop_front();
  }
  std::mt19937_64 rng = Stream(kArrivals, static_cast<uint64_t>(step));
  const int fresh = std::poisson_distribution<int>(options_.arrivals_per_step)(rng);
  for (int i = 0; i < fresh; ++i) {
    const int64_t id = static_cast<int64_t>(conversations_.size());
    Conversation c;
    c.history = system_prompts_[Stream(kConversation, static_cast<uint64_t>(id))() %
                                system_prompts_.size()];
    conversations_.push_back(std::move(c));
    out.push_back(Turn(id, step));
  }
  return out;
}

void Workload::Finished(const Request& request, const std::vector<int32_t>& generated,
                        int64_t step) {
  Conversation& c = conversations_[request.conversation];
  c.history.insert(c.history.end(), generated.begin(), generated.end());
  const bool room = static_cast<int64_t>(c.history.size()) +
                        2 * static_cast<int64_t>(options_.user_tokens_median) <
                    options_.max_context_tokens;
  if (c.turns < options_.max_turns && room) {
    follow_ups_.push_back({step + options_.think_steps, request.conversation});
  } else {
    Abandoned(request);
  }
}

void Workload::Abandoned(const Request& request) {
  std::vector<int32_t>().swap(conversations_[request.conversation].history);  // its memory too
}

}  // namespace kvtier::tool
