#include "src/cache_impl.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "src/evictor.h"
#include "src/prefix_hash.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

// Tokens one sequence may hold: page tables give lengths as int32.
constexpr int64_t kMaxSequenceTokens = INT32_MAX;

absl::Status CheckSequenceOptions(const SequenceOptions& options, int num_formats) {
  if (options.coldest_format < -1 || options.coldest_format >= num_formats) {
    return absl::InvalidArgumentError(
        absl::StrCat("coldest_format ", options.coldest_format, " is outside the palette"));
  }
  if (options.priority < 0 || options.priority >= Evictor::kLevels) {
    return absl::InvalidArgumentError(
        absl::StrCat("priority ", options.priority, " is outside [0, ", Evictor::kLevels, ")"));
  }
  if (options.priority_ttl_steps < -1) {
    return absl::InvalidArgumentError("priority_ttl_steps must be -1 (forever) or >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheImpl>> CacheImpl::Create(
    const Options& options, std::unique_ptr<Backend> backend,
    std::unique_ptr<BlockEventSink> events) {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<PageStore> pages,
                          PageStore::Create(options, backend.get()));
  std::unique_ptr<PageStore> host;
  if (options.host_tier_bytes > 0) {
    KVTIER_ASSIGN_OR_RETURN(host,
                            PageStore::Create(options, backend.get(), PageStore::Memory::kHost));
  }
  std::unique_ptr<RemoteTier> remote;
  std::unique_ptr<RemoteStaging> staging;
  if (!options.remote_tier_url.empty()) {
    KVTIER_ASSIGN_OR_RETURN(staging, RemoteStaging::Create(options, backend.get()));
    KVTIER_ASSIGN_OR_RETURN(remote, RemoteTier::Create(options));
  }
  return std::unique_ptr<CacheImpl>(new CacheImpl(options, std::move(backend), std::move(pages),
                                                  std::move(host), std::move(events),
                                                  std::move(remote), std::move(staging)));
}

CacheImpl::CacheImpl(const Options& options, std::unique_ptr<Backend> backend,
                     std::unique_ptr<PageStore> pages, std::unique_ptr<PageStore> host,
                     std::unique_ptr<BlockEventSink> events,
                     std::unique_ptr<RemoteTier> remote,
                     std::unique_ptr<RemoteStaging> staging)
    : options_(options),
      backend_(std::move(backend)),
      metrics_(static_cast<int>(options.palette.size())),
      events_(std::move(events)),
      pages_(std::move(pages)),
      pool_(pages_.get(), std::move(host), backend_.get(), &metrics_, events_.get()),
      demote_queue_(options.palette.size()),
      remote_(std::move(remote)),
      staging_(std::move(staging)) {}

CacheImpl::~CacheImpl() {
  MutexLock lock(&mu_);
  if (events_ == nullptr) return;
  events_->AllBlocksCleared();
  events_->EndStep();
}

void CacheImpl::DropRef(uint32_t block, const Sequence& seq) {
  if (--pool_[block].ref_count > 0) return;
  // A TTL that would pass kNever (the caller's count may be up to INT64_MAX) never lapses.
  const int64_t expires_at =
      seq.priority_ttl_steps < 0 || seq.priority_ttl_steps >= Evictor::kNever - metrics_.steps
          ? Evictor::kNever
          : metrics_.steps + seq.priority_ttl_steps;
  pool_.Unreferenced(block, seq.priority, expires_at);
}

void CacheImpl::Attach(Sequence& seq, uint32_t block) {
  BlockMeta& m = pool_[block];
  // Its only holder now (a cached block taken up again): the limit of the requests that left
  // goes with them; else the strictest holder's.
  const uint8_t limit = static_cast<uint8_t>(seq.coldest_format);
  m.coldest_format = m.ref_count == 1 ? limit : std::min(m.coldest_format, limit);
  seq.blocks.push_back(block);
}

void CacheImpl::IndexFullTail(Sequence& seq) {
  const uint64_t hash = HashBlock(seq.chain_hash, seq.tail_tokens, seq.extra_key);
  const uint32_t block = seq.blocks.back();
  if (pool_.Publish(block, hash, seq.chain_hash, seq.extra_key, seq.tail_tokens)) {
    indexed_this_step_.insert_or_assign(BlockKey(pool_.blocks().IdOf(block)), SequenceKey(seq));
    if (remote_ != nullptr) QueueRemoteWrite(block, hash);
  }
  seq.chain_hash = hash;
  seq.tail_tokens.clear();
}

absl::StatusOr<AddResult> CacheImpl::AddSequence(const SequenceOptions& options) {
  KVTIER_RETURN_IF_ERROR(CheckSequenceOptions(options, num_formats()));
  const int64_t s = options_.geometry.block_tokens;
  // Before the mutex: other threads' steps never wait for Redis.
  const RemoteFetch fetched = FetchRemote(options);
  MutexLock lock(&mu_);
  const SequenceId id = sequences_.Add();
  Sequence& seq = *sequences_.Find(id);
  seq.extra_key = options.extra_key;
  seq.coldest_format = options.coldest_format < 0 ? num_formats() - 1 : options.coldest_format;
  seq.priority = options.priority;
  seq.priority_ttl_steps = options.priority_ttl_steps;
  const int64_t n = static_cast<int64_t>(options.prompt.size());
  const int64_t matchable = n > 0 ? (n - 1) / s : 0;  // leave one token to compute
  // The chain of blocks found, in either tier; the pool references them (bringing offloaded
  // ones back) and may cut the chain at the first offloaded block.
  std::vector<uint32_t> chain;
  std::vector<uint64_t> hashes;
  const auto hash_of = [&](uint64_t parent, int64_t i) {
    return i < matchable ? HashBlock(parent, options.prompt.subspan(i * s, s), seq.extra_key) : 0;
  };
  uint64_t hash = hash_of(seq.chain_hash, 0);
  for (int64_t i = 0; i < matchable; ++i) {
    pool_.PrefetchIndex(hash);  // its lookup loads while the next block is hashed
    const uint64_t next = hash_of(hash, i + 1);
    const uint32_t block = pool_.Find(hash);
    if (block == BlockPool::kNone || pool_[block].format > seq.coldest_format) break;
    chain.push_back(block);
    hashes.push_back(hash);
    hash = next;
  }
  int64_t onloaded = 0;
  uint64_t ready_fence = 0;
  const int64_t local = static_cast<int64_t>(pool_.Acquire(chain, &onloaded, &ready_fence));
  for (int64_t i = 0; i < local; ++i) Attach(seq, chain[i]);
  if (local > 0) seq.chain_hash = hashes[local - 1];
  // Remote blocks continue an unbroken local chain only.
  const int64_t remote =
      local == static_cast<int64_t>(chain.size()) ? ImportRemote(seq, fetched, local) : 0;
  if (remote > 0 && !backend_->synchronous()) {
    const absl::StatusOr<uint64_t> fence = backend_->RecordFence();
    ready_fence = fence.ok() ? *fence : backend_->NextFence();  // as in BlockPool::Acquire
  }
  const int64_t matched = local + remote;
  seq.num_tokens = matched * s;
  metrics_.tokens += seq.num_tokens;
  metrics_.prefix_queried_tokens += n;
  metrics_.prefix_hit_tokens += matched * s;
  metrics_.prefix_hit_blocks += matched;
  metrics_.prefix_missed_blocks += n / s - matched;
  metrics_.host.hit_tokens += onloaded * s;
  return AddResult{id, matched * s, onloaded * s, remote * s, ready_fence};
}

absl::Status CacheImpl::CountRefusal(absl::Status s) {
  if (absl::IsResourceExhausted(s)) metrics_.allocation_failures += 1;
  return s;
}

absl::StatusOr<CacheImpl::AppendPlan> CacheImpl::PlanAppend(
    absl::Span<const SequenceId> batch, absl::Span<const int64_t> num_tokens) {
  const int64_t s = options_.geometry.block_tokens;
  AppendPlan plan;
  absl::flat_hash_map<uint32_t, uint32_t> tail_copies;  // [shared tail] its holders so far
  batch_sequences_.clear();
  batch_number_ += 1;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence* seq = sequences_.Find(batch[i]);
    if (seq == nullptr) return UnknownSequence(batch[i]);
    batch_sequences_.push_back(seq);
    if (seq->planned_by != batch_number_) {  // the sequence's first count in this batch
      seq->planned_by = batch_number_;
      seq->planned = 0;
    }
    int64_t& before = seq->planned;
    const int64_t length = seq->num_tokens + before;
    if (num_tokens[i] > kMaxSequenceTokens - length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", batch[i].index, " holds ", length, " tokens; ", num_tokens[i],
          " more pass the ", kMaxSequenceTokens, " a page table's int32 length can describe"));
    }
    // Room left in its tail page after the tokens planned before.
    const int64_t room = TailRoom(*seq) >= before ? TailRoom(*seq) - before
                                                  : (s - (before - TailRoom(*seq)) % s) % s;
    if (num_tokens[i] > room) plan.pages += (num_tokens[i] - room + s - 1) / s;
    // A shared partial tail is copied before the write, by each of its holders in the batch
    // but the last one left holding it.
    if (before == 0 && TailRoom(*seq) > 0) {
      const uint32_t tail = seq->blocks.back();
      if (pool_[tail].ref_count > 1 && ++tail_copies[tail] < pool_[tail].ref_count) {
        plan.pages += 1;
        plan.shared_tails += 1;
      }
    }
    before += num_tokens[i];
  }
  return plan;
}

void CacheImpl::AppendTokensLocked(Sequence& seq, int64_t n, absl::Span<const int32_t> tokens,
                                   size_t* next_token, uint32_t* now_ms,
                                   std::vector<int64_t>* slots) {
  const int64_t s = options_.geometry.block_tokens;
  seq.hashing = seq.hashing && !tokens.empty();
  const size_t first_token = *next_token;  // this sequence's ids, hashed or not
  if (!tokens.empty()) *next_token += static_cast<size_t>(n);
  for (int64_t t = 0; t < n; ++t) {
    if (TailRoom(seq) == 0) {
      if (*now_ms == CacheMetrics::kNoTime) *now_ms = metrics_.NowMs();
      seq.blocks.push_back(pool_.NewBlock(0, *now_ms));
      pool_[seq.blocks.back()].coldest_format = static_cast<uint8_t>(seq.coldest_format);
    }
    BlockMeta& tail = pool_[seq.blocks.back()];
    slots->push_back(static_cast<int64_t>(tail.page) * s + tail.num_tokens);
    tail.num_tokens += 1;
    if (seq.hashing) {
      seq.tail_tokens.push_back(tokens[first_token + static_cast<size_t>(t)]);
      if (tail.num_tokens == s) IndexFullTail(seq);
    }
  }
  seq.num_tokens += n;
  metrics_.tokens += n;
}

absl::Status CacheImpl::AppendBatch(absl::Span<const SequenceId> batch,
                                    absl::Span<const int64_t> num_tokens,
                                    absl::Span<const int32_t> tokens,
                                    std::vector<int64_t>* slots) {
  if (batch.size() != num_tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("batch has ", batch.size(), " sequences but ",
                                                   num_tokens.size(), " token counts"));
  }
  if (slots == nullptr) return absl::InvalidArgumentError("slots is null");
  // Checked counts: each below kMaxSequenceTokens, so that neither their sum nor a sequence's
  // length can overflow (a batch holds far fewer than 2^32 sequences).
  int64_t total = 0;
  for (size_t i = 0; i < num_tokens.size(); ++i) {
    const int64_t n = num_tokens[i];
    if (n < 1 || n > kMaxSequenceTokens) {
      return absl::InvalidArgumentError(absl::StrCat("num_tokens[", i, "] ", n, " is outside [1, ",
                                                     kMaxSequenceTokens, "]"));
    }
    total += n;
  }
  if (!tokens.empty() && static_cast<int64_t>(tokens.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat("tokens holds ", tokens.size(), " ids for ",
                                                   total, " new tokens"));
  }
  MutexLock lock(&mu_);
  // Plan: count the pages the whole batch needs, so that it fails before changing anything.
  KVTIER_ASSIGN_OR_RETURN(const AppendPlan plan, PlanAppend(batch, num_tokens));
  if (plan.pages > 0) {
    KVTIER_RETURN_IF_ERROR(CountRefusal(pool_.EnsureFreePages(
        0, static_cast<uint32_t>(std::min<int64_t>(plan.pages, UINT32_MAX)))));
  }
  // Shared tails are copied before any token is appended: a failed copy leaves every sequence
  // with its tokens (a copy already made changes no sequence's content).
  if (plan.shared_tails > 0) {
    for (Sequence* seq : batch_sequences_) {
      if (TailRoom(*seq) > 0 && pool_[seq->blocks.back()].ref_count > 1) {
        KVTIER_RETURN_IF_ERROR(CopyTail(*seq));
      }
    }
  }
  size_t next_token = 0;
  uint32_t now_ms = CacheMetrics::kNoTime;  // read once, at the first new block
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& seq = *batch_sequences_[i];  // no sequence is added or removed in between
    AppendTokensLocked(seq, num_tokens[i], tokens, &next_token, &now_ms, slots);
    MarkDirty(batch[i], seq);
  }
  return absl::OkStatus();
}

int64_t CacheImpl::TailRoom(const Sequence& seq) const {
  if (seq.blocks.empty()) return 0;
  return options_.geometry.block_tokens - pool_[seq.blocks.back()].num_tokens;
}

absl::Status CacheImpl::CopyTail(Sequence& seq) {
  const uint32_t shared = seq.blocks.back();
  const uint32_t copy = pool_.NewBlock(0, metrics_.NowMs());
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    const absl::Status s =
        backend_->CopyPage(pages_->View(0, l), pool_[shared].page, pool_[copy].page);
    if (!s.ok()) {
      DropRef(copy, seq);
      pages_->RetireSynchronous();
      return s;
    }
  }
  pool_[copy].num_tokens = pool_[shared].num_tokens;
  pool_[copy].coldest_format = pool_[shared].coldest_format;
  DropRef(shared, seq);
  seq.blocks.back() = copy;
  metrics_.copy_on_write_blocks += 1;
  return absl::OkStatus();
}

absl::StatusOr<SequenceId> CacheImpl::Fork(SequenceId parent) {
  MutexLock lock(&mu_);
  const Sequence* p = sequences_.Find(parent);
  if (p == nullptr) return UnknownSequence(parent);
  const Sequence copy = *p;  // Add may move the parent's slot
  const SequenceId child = sequences_.Add();
  Sequence* c = sequences_.Find(child);
  *c = copy;
  c->index = child.index;
  c->generation = child.generation;
  c->dirty = false;
  c->tier_cursor.fill(0);  // it votes for its blocks at the next step, as its parent did
  MarkDirty(child, *c);
  for (uint32_t b : c->blocks) pool_[b].ref_count += 1;
  metrics_.tokens += c->num_tokens;
  return child;
}

absl::Status CacheImpl::Release(SequenceId id) {
  MutexLock lock(&mu_);
  Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  ReleaseLocked(*seq);
  return absl::OkStatus();
}

void CacheImpl::ReleaseLocked(Sequence& seq) {
  for (size_t i = 0; i < seq.blocks.size(); ++i) {
    LeaveVote(seq, i);
    DropRef(seq.blocks[i], seq);
  }
  metrics_.tokens -= seq.num_tokens;
  sequences_.Remove(SequenceId{seq.index, seq.generation});
  pages_->RetireSynchronous();
}

absl::StatusOr<int64_t> CacheImpl::SequenceLength(SequenceId id) const {
  MutexLock lock(&mu_);
  const Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  return seq->num_tokens;
}

absl::StatusOr<std::vector<BlockId>> CacheImpl::SequenceBlocks(SequenceId id) const {
  MutexLock lock(&mu_);
  const Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  std::vector<BlockId> ids;
  ids.reserve(seq->blocks.size());
  for (uint32_t b : seq->blocks) ids.push_back(pool_.blocks().IdOf(b));
  return ids;
}

absl::StatusOr<BlockInfo> CacheImpl::GetBlockInfo(BlockId id) const {
  MutexLock lock(&mu_);
  if (!pool_.blocks().IsLive(id)) {
    return absl::NotFoundError(
        absl::StrCat("block ", id.index, "/", id.generation, " is unknown or stale"));
  }
  const BlockMeta& b = pool_[id.index];
  return BlockInfo{b.state, b.format, static_cast<int32_t>(b.page),
                   static_cast<int32_t>(b.ref_count), b.num_tokens, UnpackAttention(b.attention)};
}

std::vector<IndexedBlock> CacheImpl::IndexedBlocks() const {
  MutexLock lock(&mu_);
  return pool_.IndexedBlocks();
}

CacheStats CacheImpl::GetStats() const {
  MutexLock lock(&mu_);
  const Geometry& g = options_.geometry;
  CacheStats s;
  pages_->Fill(&s);
  metrics_.Fill(&s);
  pool_.Fill(&s);
  if (remote_ != nullptr) remote_->Fill(&s.remote);
  s.sequences = sequences_.live_count();
  s.policy = policy_ ? policy_->name : "";
  s.under_pressure = under_pressure_;
  if (events_ != nullptr) s.events = events_->Stats();
  double bits = 0, blocks = 0;
  for (const FormatStats& fs : s.formats) {
    s.used_bytes += fs.blocks_in_use * fs.page_bytes * g.num_layers;
    s.cached_bytes += fs.blocks_cached * fs.page_bytes * g.num_layers;
    const int64_t live = fs.blocks_in_use + fs.blocks_cached;
    bits += live * fs.bits_per_element;
    blocks += live;
  }
  s.usage_ratio = static_cast<double>(s.used_bytes) / s.budget_bytes;
  s.effective_bits_per_element = blocks > 0 ? bits / blocks : 0;
  return s;
}

}  // namespace kvtier
