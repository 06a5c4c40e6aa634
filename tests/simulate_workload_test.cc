// The workload `kvtier simulate` replays (examples/kvtier/simulate_workload.h): two runs of one
// seed whose replies finish at different steps (a policy that holds more sequences finishes
// sooner) see the same conversations with the same contents, so that their capacity and hit
// ratios compare like with like.
#include "examples/kvtier/simulate_workload.h"

#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier::tool {
namespace {

// Every request of `steps` steps, by (conversation, turn), with each reply finishing `delay`
// steps after its request arrives.
std::map<std::pair<int64_t, int>, Request> Replay(int64_t steps, int64_t delay,
                                                 std::vector<size_t>* fresh_per_step) {
  WorkloadOptions o;
  o.arrivals_per_step = 0.5;
  o.user_tokens_median = 64;
  o.output_tokens_median = 8;
  o.system_prompt_tokens = 32;
  o.max_turns = 4;
  o.think_steps = 3;
  Workload w(o);
  std::map<std::pair<int64_t, int>, Request> seen;
  std::vector<std::pair<int64_t, Request>> pending;  // finish step, request
  for (int64_t step = 0; step < steps; ++step) {
    for (size_t i = 0; i < pending.size();) {
      if (pending[i].first > step) {
        ++i;
        continue;
      }
      const Request& r = pending[i].second;
      std::vector<int32_t> reply;
      for (int64_t t = 0; t < r.output_tokens; ++t) reply.push_back(w.GeneratedToken(r, t));
      w.Finished(r, reply, step);
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    size_t fresh = 0;
    for (Request& r : w.Arrivals(step)) {
      fresh += r.turn == 0 ? 1 : 0;
      pending.emplace_back(step + delay, r);
      seen.emplace(std::make_pair(r.conversation, r.turn), std::move(r));
    }
    fresh_per_step->push_back(fresh);
  }
  return seen;
}

TEST(SimulateWorkloadTest, RunsOfOneSeedSeeTheSameConversationsWhateverTheFinishTimes) {
  std::vector<size_t> fresh_fast, fresh_slow;
  const auto fast = Replay(400, 1, &fresh_fast);
  const auto slow = Replay(400, 9, &fresh_slow);
  EXPECT_EQ(fresh_fast, fresh_slow);
  int follow_ups = 0;
  for (const auto& [key, r] : slow) {
    const auto it = fast.find(key);
    ASSERT_NE(it, fast.end()) << "conversation " << key.first << " turn " << key.second;
    EXPECT_EQ(it->second.prompt, r.prompt) << "conversation " << key.first << " turn " << key.second;
    EXPECT_EQ(it->second.output_tokens, r.output_tokens);
    follow_ups += key.second > 0 ? 1 : 0;
  }
  EXPECT_GT(follow_ups, 50);  // the follow-up turns, with their replies in the history, compared
}

}  // namespace
}  // namespace kvtier::tool
