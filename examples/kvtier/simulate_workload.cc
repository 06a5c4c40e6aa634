#include "examples/kvtier/simulate_workload.h"

#include <algorithm>
#include <cmath>

namespace kvtier::tool {

Workload::Workload(const WorkloadOptions& options) : options_(options), rng_(options.seed) {
  for (int p = 0; p < options_.system_prompts; ++p) {
    std::vector<int32_t> prompt(options_.system_prompt_tokens);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng_() % 50000);
    system_prompts_.push_back(std::move(prompt));
  }
}

int64_t Workload::LogNormal(double median, int64_t lo, int64_t hi) {
  std::lognormal_distribution<double> dist(std::log(median), 0.6);
  return std::clamp<int64_t>(static_cast<int64_t>(dist(rng_)), lo, hi);
}

Request Workload::Turn(int64_t conversation, int64_t step) {
  Conversation& c = conversations_[conversation];
  const int64_t user = LogNormal(options_.user_tokens_median, 16, options_.max_context_tokens / 4);
  for (int64_t i = 0; i < user; ++i) c.history.push_back(static_cast<int32_t>(rng_() % 50000));
  c.turns += 1;
  Request r;
  r.conversation = conversation;
  r.prompt = c.history;
  r.output_tokens = LogNormal(options_.output_tokens_median, 8, 2048);
  r.arrival_step = step;
  return r;
}

std::vector<Request> Workload::Arrivals(int64_t step) {
  std::vector<Request> out;
  while (!follow_ups_.empty() && follow_ups_.front().step <= step) {
    out.push_back(Turn(follow_ups_.front().conversation, step));
    follow_ups_.pop_front();
  }
  const int fresh = std::poisson_distribution<int>(options_.arrivals_per_step)(rng_);
  for (int i = 0; i < fresh; ++i) {
    Conversation c;
    c.history = system_prompts_[rng_() % system_prompts_.size()];
    conversations_.push_back(std::move(c));
    out.push_back(Turn(static_cast<int64_t>(conversations_.size()) - 1, step));
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
  }
}

}  // namespace kvtier::tool
