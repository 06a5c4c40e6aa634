// The seeded serving workload that `kvtier simulate` replays: multi-turn conversations that
// share system prompts, arriving as a Poisson process, with log-normal user-turn and output
// lengths. Token ids are synthetic but consistent, so shared prefixes hash alike. Every draw is
// keyed (the arrivals of a step, a conversation's turn, a generated token's index), not taken
// from one stream, so that runs of one seed under different policies replay the same
// conversations with the same contents; only when a follow-up turn arrives depends on when its
// reply finished.
#ifndef KVTIER_EXAMPLES_KVTIER_SIMULATE_WORKLOAD_H_
#define KVTIER_EXAMPLES_KVTIER_SIMULATE_WORKLOAD_H_

#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace kvtier::tool {

struct WorkloadOptions {
  uint32_t seed = 1;
  int system_prompts = 4;              // distinct system prompts that conversations share
  int system_prompt_tokens = 4096;
  double arrivals_per_step = 0.1;      // new conversations, Poisson
  double user_tokens_median = 16000;   // per turn, log-normal (documents pasted into chat)
  double output_tokens_median = 200;   // per turn, log-normal
  int max_turns = 2;
  int think_steps = 40;                // between a reply and the next user turn
  int64_t max_context_tokens = 65536;  // a conversation ends before its history exceeds this
};

// One request: a turn of a conversation.
struct Request {
  int64_t conversation = 0;
  int turn = 0;                 // 0 for a conversation's first

  std::vector<int32_t> prompt;  // system prompt + history + this turn's user tokens
  int64_t output_tokens = 0;
  int64_t arrival_step = 0;
};

class Workload {
 public:
  explicit Workload(const WorkloadOptions& options);

  // Requests arriving at `step`: new conversations and follow-up turns whose think time ended.
  std::vector<Request> Arrivals(int64_t step);
  // Reports that `request` finished with `generated` output tokens, so its conversation may go
  // on (the reply joins the history).
  void Finished(const Request& request, const std::vector<int32_t>& generated, int64_t step);
  // Reports that `request` was turned away: its conversation ends.
  void Abandoned(const Request& request);
  // The id of output token `index` of `request`.
  int32_t GeneratedToken(const Request& request, int64_t index) const;

 private:
  struct Conversation {
    std::vector<int32_t> history;
    int turns = 0;
  };
  struct FollowUp {
    int64_t step;
    int64_t conversation;
  };

  // The seed's well-mixed value for one key, e.g. {kTurn, conversation, turn}, and a generator
  // for the draws of that key.
  uint64_t Key(uint64_t kind, uint64_t a, uint64_t b = 0) const;
  std::mt19937_64 Stream(uint64_t kind, uint64_t a, uint64_t b = 0) const;
  static int64_t LogNormal(std::mt19937_64& rng, double median, int64_t lo, int64_t hi);
  Request Turn(int64_t conversation, int64_t step);

  WorkloadOptions options_;
  std::vector<std::vector<int32_t>> system_prompts_;
  std::vector<Conversation> conversations_;
  std::deque<FollowUp> follow_ups_;  // in step order
};

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_SIMULATE_WORKLOAD_H_
