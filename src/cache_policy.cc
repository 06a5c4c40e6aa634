// The policy pass of CacheImpl::EndStep: ages the blocks of the sequences that grew since the
// last step, and shrinks windows under memory pressure.
//
// Cost. Each sequence keeps, per tier k, a cursor: the number of its leading blocks already
// considered for tier k. A tier-k boundary is crossed by the blocks between the cursor and
// n_k = floor((length - bound_{k-1}) / block_tokens), so a step touches only the blocks that
// change tier (plus, once per pressure transition, every live sequence).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "src/cache_impl.h"

namespace kvtier {

absl::Status CacheImpl::SetPolicy(const Policy& policy) {
  if (absl::Status valid = ValidatePolicy(policy); !valid.ok()) return valid;
  ActivePolicy active;
  active.name = policy.name;
  active.sink_tokens = policy.sink_tokens;
  active.watermark = policy.pressure_watermark;
  active.window_scale = policy.pressure_window_scale;
  int previous = -1;
  for (size_t t = 0; t < policy.tiers.size(); ++t) {
    const auto it = std::find(options_.palette.begin(), options_.palette.end(), policy.tiers[t].format);
    const int index = static_cast<int>(it - options_.palette.begin());
    if (it == options_.palette.end() || index <= previous || (t == 0 && index != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy.tiers[", t, "].format ", FormatName(policy.tiers[t].format),
          " is not in the palette after the previous tier's (tier 0 must be palette[0])"));
    }
    previous = index;
    active.tier_format.push_back(index);
    active.bounds.push_back(policy.tiers[t].max_age_tokens);
  }
  MutexLock lock(&mu_);
  policy_ = std::move(active);
  // Every live sequence is considered at the next step under the new rules.
  for (uint32_t i = 0; i < sequences_.num_slots(); ++i) {
    const Sequence& seq = sequences_.slot(i);
    if (seq.generation != 0) MarkDirty(SequenceId{i, seq.generation}, *sequences_.Find({i, seq.generation}));
  }
  return absl::OkStatus();
}

void CacheImpl::MarkDirty(SequenceId id, Sequence& seq) {
  if (seq.dirty) return;
  seq.dirty = true;
  dirty_.push_back(id);
}

void CacheImpl::AgeSequence(Sequence& seq) {
  const ActivePolicy& p = *policy_;
  const int tiers = static_cast<int>(p.tier_format.size());
  const int64_t s = options_.geometry.block_tokens;
  const int64_t full = seq.num_tokens / s;
  const double scale = under_pressure_ ? p.window_scale : 1.0;
  // n[k]: leading blocks old enough for tier k (n[0] = all full blocks, n[tiers] = 0).
  int64_t n[9] = {};
  n[0] = full;
  for (int k = 1; k < tiers; ++k) {
    const int64_t bound = static_cast<int64_t>(static_cast<double>(p.bounds[k - 1]) * scale);
    n[k] = std::clamp<int64_t>((seq.num_tokens - bound) / s, 0, full);
  }
  for (int k = 1; k < tiers; ++k) {
    for (int64_t i = std::max(seq.tier_cursor[k], n[k + 1]); i < n[k]; ++i) {
      if (i * s < p.sink_tokens) continue;  // sinks stay hot
      const uint32_t b = seq.blocks[i];
      BlockMeta& m = blocks_[b];
      const int target = std::min<int>(p.tier_format[k], m.coldest_format);
      if (target <= m.format) continue;
      if (m.ref_count > 1) {  // shared: move once every sharer's age has crossed
        if (m.vote_tier != k) {
          m.vote_tier = static_cast<uint8_t>(k);
          m.votes = 0;
        }
        if (++m.votes < m.ref_count) continue;
      }
      demote_queue_[target].push_back(b);
    }
    seq.tier_cursor[k] = std::max(seq.tier_cursor[k], n[k]);
  }
}

void CacheImpl::RunPolicy() {
  if (!policy_) return;
  // Pressure: below the watermark windows shrink; they grow back above twice the watermark.
  int64_t used = 0;
  for (int f = 0; f < num_formats(); ++f) {
    used += static_cast<int64_t>(pools_[f].used_pages()) * layouts_[f].page_bytes;
  }
  const double free_fraction =
      1.0 - static_cast<double>(used) * options_.geometry.num_layers / options_.memory_budget_bytes;
  const bool pressure = under_pressure_ ? free_fraction < 2 * policy_->watermark
                                        : free_fraction < policy_->watermark;
  if (pressure != under_pressure_) {
    under_pressure_ = pressure;
    for (uint32_t i = 0; i < sequences_.num_slots(); ++i) {
      const uint32_t generation = sequences_.slot(i).generation;
      if (generation != 0) MarkDirty(SequenceId{i, generation}, *sequences_.Find({i, generation}));
    }
  }
  for (SequenceId id : dirty_) {
    Sequence* seq = sequences_.Find(id);
    if (seq == nullptr) continue;  // released since
    seq->dirty = false;
    AgeSequence(*seq);
  }
  dirty_.clear();
  // Coldest target first; a block queued twice, or already there, is skipped.
  for (int f = num_formats() - 1; f > 0; --f) {
    std::vector<uint32_t>& queue = demote_queue_[f];
    std::sort(queue.begin(), queue.end());
    queue.erase(std::unique(queue.begin(), queue.end()), queue.end());
    queue.erase(std::remove_if(queue.begin(), queue.end(),
                               [&](uint32_t b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                 return blocks_[b].state == BlockState::kFree ||
                                        blocks_[b].format >= f;
                               }),
                queue.end());
    // Demote what fits, in chunks: each chunk's old pages free room for the next (at once on
    // a synchronous backend). What finds no room stays queued for the next step.
    size_t done = 0;
    while (done < queue.size()) {
      const size_t chunk = std::min<uint64_t>(queue.size() - done, RoomFor(f));
      if (chunk == 0 || !DemoteLocked(absl::MakeConstSpan(queue).subspan(done, chunk), f).ok()) break;
      done += chunk;
    }
    queue.erase(queue.begin(), queue.begin() + done);
    policy_demotion_failures_ += static_cast<int64_t>(queue.size());
  }
}

}  // namespace kvtier
