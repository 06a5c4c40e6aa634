// The precision side of CacheImpl: the policy pass of EndStep, which ages the blocks of the
// sequences that grew since the last step and shrinks windows under memory pressure, and
// demotion (explicit through Demote, or planned by the pass), and the attention reports
// (RecordAttention) that keep the blocks attention singled out one tier hotter.
//
// Cost. Each sequence keeps, per tier k, a cursor: the number of its leading blocks already
// considered for tier k. A tier-k boundary is crossed by the blocks between the cursor and
// n_k = floor((length - bound_{k-1}) / block_tokens), so a step touches only the blocks that
// change tier (plus, once per pressure transition, every live sequence).
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

// Votes saturate: a block shared by more sequences moves once this many have voted.
constexpr uint32_t kMaxVotes = 0xFFFF;

}  // namespace

absl::Status CacheImpl::SetPolicy(const Policy& policy) {
  if (absl::Status valid = ValidatePolicy(policy); !valid.ok()) return valid;
  ActivePolicy active;
  active.name = policy.name;
  active.sink_tokens = policy.sink_tokens;
  active.watermark = policy.pressure_watermark;
  active.window_scale = policy.pressure_window_scale;
  active.keep_ratio = policy.attention_keep_ratio;
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
  // Every live sequence is considered again from its first block at the next step under the new
  // rules, with its sharers' votes counted afresh; demotions the old rules queued are dropped.
  MarkAllDirty();
  for (SequenceId id : dirty_) {
    if (Sequence* seq = sequences_.Find(id)) seq->tier_cursor.fill(0);
  }
  shared_votes_.clear();
  for (std::vector<BlockId>& queue : demote_queue_) queue.clear();
  return absl::OkStatus();
}

absl::Status CacheImpl::RecordAttention(SequenceId id, absl::Span<const float> block_weight) {
  for (size_t i = 0; i < block_weight.size(); ++i) {
    if (!(block_weight[i] >= 0 && block_weight[i] <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("block_weight[", i, "] = ", block_weight[i], " is outside [0, 1]"));
    }
  }
  MutexLock lock(&mu_);
  const Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  if (block_weight.size() != seq->blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("block_weight holds ", block_weight.size(),
                                                   " weights; the sequence has ",
                                                   seq->blocks.size(), " blocks"));
  }
  const float blocks = static_cast<float>(block_weight.size());
  for (size_t i = 0; i < block_weight.size(); ++i) {
    BlockMeta& m = pool_[seq->blocks[i]];
    // + 0: -0 (accepted as 0) packs above every positive weight.
    m.attention = std::max(m.attention, PackAttention(block_weight[i] * blocks + 0.f));
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::EndStep() {
  MutexLock lock(&mu_);
  if (remote_ != nullptr) StageRemoteWrites();
  indexed_this_step_.clear();
  RunPolicy();
  metrics_.steps += 1;
  if (events_ != nullptr) events_->EndStep();
  KVTIER_RETURN_IF_ERROR(pages_->EndStep());
  CompactPools();
  return pool_.EndStep();
}

absl::StatusOr<bool> CacheImpl::FencePassed(uint64_t fence) {
  MutexLock lock(&mu_);
  if (fence == 0) return true;
  return backend_->FencePassed(fence);
}

absl::StatusOr<uint64_t> CacheImpl::RecordFence() {
  MutexLock lock(&mu_);
  return backend_->RecordFence();
}

void CacheImpl::MarkDirty(SequenceId id, Sequence& seq) {
  // Without a policy nothing empties the list (SetPolicy considers every live sequence anyway).
  if (!policy_ || seq.dirty) return;
  seq.dirty = true;
  dirty_.push_back(id);
}

void CacheImpl::MarkAllDirty() {
  for (uint32_t i = 0; i < sequences_.num_slots(); ++i) {
    const uint32_t generation = sequences_.slot(i).generation;
    if (generation != 0) MarkDirty(SequenceId{i, generation}, *sequences_.Find({i, generation}));
  }
}

void CacheImpl::AgeSequence(Sequence& seq) {
  const ActivePolicy& p = *policy_;
  const int tiers = static_cast<int>(p.tier_format.size());
  const int64_t s = options_.geometry.block_tokens;
  const int64_t full = seq.num_tokens / s;
  const double scale = under_pressure_ ? p.window_scale : 1.0;
  // Blocks voted for before this step.
  const std::array<int64_t, kMaxPolicyTiers> before = seq.tier_cursor;
  // n[k]: leading blocks old enough for tier k (n[0] = all full blocks, n[tiers] = 0).
  int64_t n[kMaxPolicyTiers + 1] = {};
  n[0] = full;
  for (int k = 1; k < tiers; ++k) {
    const int64_t bound = static_cast<int64_t>(static_cast<double>(p.bounds[k - 1]) * scale);
    n[k] = std::clamp<int64_t>((seq.num_tokens - bound) / s, 0, full);
  }
  for (int k = 1; k < tiers; ++k) {
    for (int64_t i = std::max(seq.tier_cursor[k], n[k + 1]); i < n[k]; ++i) {
      if (i * s < p.sink_tokens) continue;  // sinks stay hot
      const uint32_t b = seq.blocks[i];
      const BlockMeta& m = pool_[b];
      // A block attention singled out stays one tier hotter (in palette[0] out of tier 1).
      const bool kept = p.keep_ratio > 0 && UnpackAttention(m.attention) >= p.keep_ratio;
      int tier = kept ? k - 1 : k;
      if (m.ref_count > 1) {
        // Shared: it gets no further votes once singled out (a sharer that voted before would
        // vote twice); else this sequence votes for the tiers it crossed since its last step.
        if (kept) continue;
        int from = 0;
        for (int j = k - 1; j > 0 && from == 0; --j) from = before[j] > i ? j : 0;
        tier = VoteCrossed(b, from, k);
      }
      if (tier == 0) continue;
      const int target = std::min<int>(p.tier_format[tier], m.coldest_format);
      if (target > m.format) demote_queue_[target].push_back(pool_.blocks().IdOf(b));
    }
    seq.tier_cursor[k] = std::max(seq.tier_cursor[k], n[k]);
  }
}

int CacheImpl::VoteCrossed(uint32_t b, int from, int k) {
  std::array<uint16_t, kMaxPolicyTiers>& crossed = shared_votes_[b];
  for (int j = from + 1; j <= k; ++j) {
    if (crossed[j] < kMaxVotes) crossed[j] += 1;
  }
  const uint32_t all = std::min<uint32_t>(pool_[b].ref_count, kMaxVotes);
  for (int j = k; j > 0; --j) {
    if (crossed[j] >= all) return j;
  }
  return 0;
}

void CacheImpl::LeaveVote(const Sequence& seq, size_t position) {
  const uint32_t b = seq.blocks[position];
  const auto it = shared_votes_.find(b);
  if (it == shared_votes_.end()) return;
  std::array<uint16_t, kMaxPolicyTiers>& crossed = it->second;
  // Its cursor for tier k passed the block, so it counted for k (unless it crossed k while it
  // held the block alone, which moved the block then, or attention kept the block: one vote
  // fewer, at worst a later move).
  for (size_t k = 1; k < crossed.size(); ++k) {
    if (crossed[k] > 0 && static_cast<int64_t>(position) < seq.tier_cursor[k]) crossed[k] -= 1;
  }
  const BlockMeta& m = pool_[b];
  const uint32_t remaining = std::min<uint32_t>(m.ref_count - 1, kMaxVotes);
  int tier = 0;  // the coldest every remaining sharer has crossed
  if (policy_ && remaining > 0) {
    for (int k = 1; k < static_cast<int>(policy_->tier_format.size()); ++k) {
      if (crossed[k] >= remaining) tier = k;
    }
  }
  if (remaining <= 1) shared_votes_.erase(it);  // one holder left: it ages the block alone
  if (tier == 0) return;
  const int target = std::min<int>(policy_->tier_format[tier], m.coldest_format);
  if (target > m.format) demote_queue_[target].push_back(pool_.blocks().IdOf(b));
}

void CacheImpl::UpdatePressure() {
  // Below the watermark windows shrink; they grow back above twice the watermark.
  const double free_fraction =
      1.0 - static_cast<double>(pages_->UsedBytes()) / options_.memory_budget_bytes;
  const bool pressure = under_pressure_ ? free_fraction < 2 * policy_->watermark
                                        : free_fraction < policy_->watermark;
  if (pressure != under_pressure_) {
    under_pressure_ = pressure;
    MarkAllDirty();
  }
}

void CacheImpl::DrainDemoteQueue(int format) {
  std::vector<BlockId>& queue = demote_queue_[format];
  const auto by_index = [](BlockId a, BlockId b) {
    return a.index != b.index ? a.index < b.index : a.generation < b.generation;
  };
  std::sort(queue.begin(), queue.end(), by_index);
  queue.erase(std::unique(queue.begin(), queue.end()), queue.end());
  // Skipped: a block queued twice, freed (or evicted below) since, offloaded, already there, or
  // held since by a request whose minimum precision is hotter than `format`.
  auto drop_stale = [&](size_t from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queue.erase(std::remove_if(queue.begin() + static_cast<std::ptrdiff_t>(from), queue.end(),
                               [&](BlockId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                 if (!pool_.blocks().IsLive(id)) return true;
                                 const BlockMeta& m = pool_[id.index];
                                 return m.state == BlockState::kOffloaded ||
                                        m.format >= format || format > m.coldest_format;
                               }),
                queue.end());
  };
  drop_stale(0);
  // Demote what fits, in chunks: each chunk's old pages free room for the next (at once on a
  // synchronous backend). When the colder pool has no room at all, cached blocks are evicted to
  // make room, as an allocation for a sequence would: blocks in use come before cached prefixes,
  // and a hot pool that cannot drain starves every prefill, since slabs full of cached pages of
  // another format come free only by eviction (docs/design.md). What still finds no room stays
  // queued for the next step.
  size_t done = 0;
  while (done < queue.size()) {
    // Decided on the room once every retired page is back, so that every backend evicts alike.
    if (pages_->RoomFor(format, /*after_reclaim=*/true) == 0) {
      // Room for as much of the queue as evicting could give (asking for all of it would be
      // refused whenever the queue is longer, and nothing would ever move).
      const uint32_t wanted = static_cast<uint32_t>(
          std::min<uint64_t>(queue.size() - done, pool_.RoomAfterEvictingAll(format)));
      if (wanted == 0 || !pool_.EnsureFreePages(format, wanted, /*may_evict=*/true).ok()) break;
      drop_stale(done);  // queued blocks that were cached may have gone
    }
    const size_t chunk = std::min<uint64_t>(queue.size() - done, pages_->RoomFor(format));
    std::vector<uint32_t> indices;
    for (size_t i = done; i < done + chunk; ++i) indices.push_back(queue[i].index);
    if (chunk == 0 || !DemoteLocked(indices, format).ok()) break;
    done += chunk;
  }
  queue.erase(queue.begin(), queue.begin() + done);
  metrics_.policy_demotion_failures += static_cast<int64_t>(queue.size());
}

void CacheImpl::RunPolicy() {
  if (!policy_) return;
  UpdatePressure();
  for (SequenceId id : dirty_) {
    Sequence* seq = sequences_.Find(id);
    if (seq == nullptr) continue;  // released since
    seq->dirty = false;
    AgeSequence(*seq);
  }
  dirty_.clear();
  for (int f = num_formats() - 1; f > 0; --f) DrainDemoteQueue(f);  // coldest target first
}

absl::Status CacheImpl::Demote(absl::Span<const BlockId> ids, int32_t format) {
  if (format < 0 || format >= num_formats()) {
    return absl::InvalidArgumentError(absl::StrCat("format ", format, " is outside the palette"));
  }
  MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!pool_.blocks().IsLive(ids[i])) {
      return absl::NotFoundError(absl::StrCat("block ", ids[i].index, "/", ids[i].generation,
                                              " is unknown or stale"));
    }
    const BlockMeta& b = pool_[ids[i].index];
    if (b.state == BlockState::kOffloaded) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block ", ids[i].index, " is in the host tier; a prefix hit brings it back first"));
    }
    if (b.format >= format) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block ", ids[i].index, " is in palette format ", int{b.format},
          "; demotion moves blocks to a colder (higher) format, not ", format));
    }
    if (b.num_tokens != options_.geometry.block_tokens) {
      return absl::FailedPreconditionError(
          absl::StrCat("block ", ids[i].index, " is partial; a sequence's tail stays hot"));
    }
    if (format > b.coldest_format) {
      return absl::FailedPreconditionError(absl::StrCat(
          "block ", ids[i].index, " is held by a request whose minimum precision is palette format ",
          int{b.coldest_format}));
    }
  }
  std::vector<uint32_t> indices;
  indices.reserve(ids.size());
  for (BlockId id : ids) indices.push_back(id.index);
  std::vector<uint32_t> sorted = indices;
  std::sort(sorted.begin(), sorted.end());
  if (const auto twice = std::adjacent_find(sorted.begin(), sorted.end()); twice != sorted.end()) {
    return absl::InvalidArgumentError(absl::StrCat("block ", *twice, " is listed twice"));
  }
  return CountRefusal(DemoteLocked(indices, format));
}

absl::Status CacheImpl::DemoteLocked(absl::Span<const uint32_t> ids, int format) {
  if (ids.empty()) return absl::OkStatus();
  // Explicit demotion never evicts cached prefixes to make room (the policy's does, above, only
  // when the colder pool is full).
  KVTIER_RETURN_IF_ERROR(pool_.EnsureFreePages(format, static_cast<uint32_t>(ids.size()), false));
  const auto started = std::chrono::steady_clock::now();
  // One backend call per source format, so that each call reads one pool per layer. No block
  // moves before every call has succeeded: a failure frees the new pages and leaves every block
  // where it was.
  std::vector<Requantized> done;
  for (int f = 0; f < format; ++f) {
    absl::StatusOr<Requantized> r = RequantizeFrom(f, ids, format);
    if (!r.ok()) {
      for (const Requantized& d : done) {
        for (uint32_t page : d.dst) pages_->FreeNow(format, page);
      }
      return r.status();
    }
    done.push_back(*std::move(r));
  }
  for (const Requantized& d : done) {
    const int64_t n = static_cast<int64_t>(d.blocks.size());
    const int64_t page_pair = pages_->layout(d.from).page_bytes + pages_->layout(format).page_bytes;
    metrics_.CountMigration(d.from, format, n, n * options_.geometry.num_layers * page_pair);
    if (under_pressure_) metrics_.demotions_under_pressure += n;
    for (size_t i = 0; i < d.blocks.size(); ++i) pool_.MoveToPage(d.blocks[i], format, d.dst[i]);
  }
  metrics_.migration_seconds.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  pages_->RetireSynchronous();
  return absl::OkStatus();
}

absl::StatusOr<CacheImpl::Requantized> CacheImpl::RequantizeFrom(int from,
                                                                 absl::Span<const uint32_t> ids,
                                                                 int format) {
  Requantized r{from, {}, {}};
  std::vector<uint32_t> src;
  for (uint32_t id : ids) {
    if (pool_[id].format != from) continue;
    r.blocks.push_back(id);
    src.push_back(pool_[id].page);
    r.dst.push_back(pages_->Allocate(format, id));
  }
  if (src.empty()) return r;
  std::vector<PoolView> from_views, to_views;
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    from_views.push_back(pages_->View(from, l));
    to_views.push_back(pages_->View(format, l));
  }
  const absl::Status s = backend_->Requantize(from_views, to_views, src, r.dst);
  if (!s.ok()) {
    for (uint32_t page : r.dst) pages_->FreeNow(format, page);
    return s;
  }
  return r;
}

}  // namespace kvtier
