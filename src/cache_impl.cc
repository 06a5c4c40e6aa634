#include "src/cache_impl.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/codec/half.h"
#include "kernels/page_codec.h"
#include "src/prefix_hash.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

std::vector<PageLayout> MakeLayouts(const Options& o) {
  std::vector<PageLayout> layouts;
  const Geometry& g = o.geometry;
  for (const FormatSpec& f : o.palette) {
    layouts.push_back(MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, f));
  }
  return layouts;
}

// The ScaleScope::kTensor scale of `type` for a layer whose amax is `amax` (0: uncalibrated).
float TensorScale(ElementType type, float amax) {
  if (amax <= 0) return 1.f;
  switch (type) {
    case ElementType::kFp8E4M3: return amax / 448.f;
    case ElementType::kFp8E5M2: return amax / 57344.f;
    case ElementType::kNvfp4: return amax / 2688.f;
    default: return 1.f;
  }
}

absl::Status UnknownSequence(SequenceId id) {
  return absl::NotFoundError(
      absl::StrCat("sequence ", id.index, "/", id.generation, " is unknown or released"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheImpl>> CacheImpl::Create(const Options& options,
                                                             std::unique_ptr<Backend> backend) {
  std::unique_ptr<CacheImpl> cache(new CacheImpl(options, std::move(backend)));
  const int layers = options.geometry.num_layers;
  for (int f = 0; f < cache->num_formats(); ++f) {
    for (int l = 0; l < layers; ++l) {
      KVTIER_ASSIGN_OR_RETURN(uint8_t* base, cache->backend_->Reserve(cache->range_bytes_));
      cache->bases_.push_back(base);  // the destructor releases what was reserved so far
    }
  }
  return cache;
}

CacheImpl::CacheImpl(const Options& options, std::unique_ptr<Backend> backend)
    : options_(options),
      backend_(std::move(backend)),
      layouts_(MakeLayouts(options)),
      num_slabs_(static_cast<uint32_t>(options.memory_budget_bytes / options.slab_bytes /
                                       options.geometry.num_layers)),
      range_bytes_(num_slabs_ * options.slab_bytes),
      free_slabs_(num_slabs_),
      blocks_([&] {
        // Live blocks never outnumber the pages that all slabs could hold in the densest format.
        uint32_t densest = 0;
        for (const PageLayout& l : layouts_) {
          densest = std::max(densest, static_cast<uint32_t>(options.slab_bytes / l.page_bytes));
        }
        return num_slabs_ * densest;
      }()),
      evictor_(blocks_.capacity()),
      cached_by_format_(layouts_.size(), 0) {
  const int layers = options.geometry.num_layers;
  for (int f = 0; f < num_formats() * num_formats(); ++f) {
    migrations_.push_back(MigrationStats{f / num_formats(), f % num_formats(), 0, 0});
  }
  demote_queue_.resize(num_formats());
  for (int f = 0; f < num_formats(); ++f) {
    pools_.emplace_back(layouts_[f].page_bytes, options.slab_bytes, num_slabs_);
    const FormatSpec& spec = options.palette[f];
    for (int l = 0; l < layers; ++l) {
      k_scales_.push_back(
          TensorScale(spec.k.type, options.k_tensor_amax.empty() ? 0 : options.k_tensor_amax[l]));
      v_scales_.push_back(
          TensorScale(spec.v.type, options.v_tensor_amax.empty() ? 0 : options.v_tensor_amax[l]));
    }
  }
}

CacheImpl::~CacheImpl() {
  for (uint8_t* base : bases_) backend_->Unreserve(base, range_bytes_);
}

PoolView CacheImpl::View(int format, int layer) const {
  const size_t i = static_cast<size_t>(format) * options_.geometry.num_layers + layer;
  return PoolView{bases_[i], layouts_[format], k_scales_[i], v_scales_[i]};
}

uint8_t* CacheImpl::SlotAddress(int format, int layer, uint32_t slot) const {
  return bases_[static_cast<size_t>(format) * options_.geometry.num_layers + layer] +
         slot * options_.slab_bytes;
}

absl::Status CacheImpl::MapSlot(int format) {
  PagePool& pool = pools_[format];
  const uint32_t slot = pool.UnmappedSlot();
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    absl::Status s = backend_->Map(SlotAddress(format, l, slot), options_.slab_bytes);
    if (!s.ok()) {
      while (l-- > 0) backend_->Unmap(SlotAddress(format, l, slot), options_.slab_bytes).IgnoreError();
      return s;
    }
  }
  pool.AddSlot(slot);
  free_slabs_ -= 1;
  slab_moves_ += 1;
  return absl::OkStatus();
}

absl::Status CacheImpl::UnmapSlot(int format, uint32_t slot) {
  pools_[format].RemoveSlot(slot);
  free_slabs_ += 1;
  absl::Status status;
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    status.Update(backend_->Unmap(SlotAddress(format, l, slot), options_.slab_bytes));
  }
  return status;
}

uint32_t CacheImpl::AvailableSlabs(int format) const {
  uint32_t available = free_slabs_;
  for (int g = 0; g < num_formats(); ++g) {
    if (g != format) available += pools_[g].empty_slots();
  }
  return available;
}

uint64_t CacheImpl::RoomFor(int format) const {
  const PagePool& pool = pools_[format];
  return pool.free_pages() + uint64_t{AvailableSlabs(format)} * pool.MinPagesPerSlot();
}

absl::Status CacheImpl::EnsureFreePages(int format, uint32_t count, bool may_evict) {
  PagePool& pool = pools_[format];
  const uint32_t per_slab = pool.MinPagesPerSlot();
  auto slabs_needed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pool.free_pages() >= count ? 0u : (count - pool.free_pages() + per_slab - 1) / per_slab;
  };
  if (slabs_needed() > AvailableSlabs(format)) {
    // Fail before evicting anything when even evicting every cached block could not make room.
    uint64_t bound = uint64_t{pool.free_pages()} + cached_by_format_[format];
    uint64_t slabs = free_slabs_;
    for (int g = 0; g < num_formats(); ++g) {
      if (g != format) slabs += cached_by_format_[g] > 0 ? pools_[g].mapped_slots() : pools_[g].empty_slots();
    }
    bound += slabs * per_slab;
    int64_t evicted = 0;
    while (may_evict && bound >= count && slabs_needed() > AvailableSlabs(format) && EvictOne()) {
      evicted += 1;
      if (backend_->synchronous()) {
        RetireSynchronous();
      } else {  // wait for the device so that the evicted pages may be reused at once
        KVTIER_ASSIGN_OR_RETURN(const uint64_t fence, backend_->RecordFence());
        while (!backend_->FencePassed(fence)) {
        }
        ReclaimQueue::Entry e;
        while (reclaim_.PopAny(&e)) pools_[e.format].Free(e.page);
      }
    }
    if (slabs_needed() > AvailableSlabs(format)) {
      allocation_failures_ += 1;
      return absl::ResourceExhaustedError(absl::StrCat(
          "need ", count, " pages of ", FormatName(options_.palette[format]), " but only ",
          pool.free_pages(), " are free and ", AvailableSlabs(format), " slabs available after evicting ",
          evicted, " cached blocks"));
    }
  }
  for (uint32_t i = slabs_needed(); i > 0; --i) {
    for (int g = 0; free_slabs_ == 0 && g < num_formats(); ++g) {
      if (g != format && pools_[g].EmptySlot() != PagePool::kNone) {
        KVTIER_RETURN_IF_ERROR(UnmapSlot(g, pools_[g].EmptySlot()));
      }
    }
    KVTIER_RETURN_IF_ERROR(MapSlot(format));
  }
  return absl::OkStatus();
}

bool CacheImpl::EvictOne() {
  const uint32_t b = evictor_.PopVictim(steps_);
  if (b == Evictor::kNone) return false;
  BlockMeta& m = blocks_[b];
  index_.Erase(m.hash);
  if (m.parent != BlockTable::kNone) {
    BlockMeta& parent = blocks_[m.parent];
    parent.children -= 1;
    if (parent.children == 0 && parent.state == BlockState::kCached) {
      // The rest of a cold chain goes next.
      evictor_.AddColdest(m.parent, parent.priority, parent.expires_at);
    }
  }
  cached_by_format_[m.format] -= 1;
  evicted_blocks_ += 1;
  idle_before_evict_seconds_.Observe((NowMs() - m.idle_since_ms) / 1e3);
  FreeBlock(b);
  return true;
}

void CacheImpl::FreeBlock(uint32_t block) {
  BlockMeta& m = blocks_[block];
  block_lifetime_seconds_.Observe((NowMs() - m.born_ms) / 1e3);
  pools_[m.format].SetOwner(m.page, PagePool::kPending);
  reclaim_.Push(m.format, m.page);
  blocks_.Free(block);
}

uint32_t CacheImpl::NowMs() const {
  return static_cast<uint32_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - created_)
                                   .count());
}

uint32_t CacheImpl::NewBlock(int format, uint32_t now_ms) {
  PagePool& pool = pools_[format];
  const uint32_t block = blocks_.Allocate(static_cast<uint8_t>(format), 0);
  blocks_[block].page = pool.Allocate(block);
  blocks_[block].born_ms = now_ms;
  return block;
}

void CacheImpl::DropRef(uint32_t block, const Sequence& seq) {
  BlockMeta& m = blocks_[block];
  if (--m.ref_count > 0) return;
  if (!m.indexed) {
    FreeBlock(block);
    return;
  }
  m.state = BlockState::kCached;
  m.idle_since_ms = NowMs();
  m.priority = static_cast<uint8_t>(seq.priority);
  m.expires_at = seq.priority_ttl_steps < 0 ? Evictor::kNever : steps_ + seq.priority_ttl_steps;
  cached_by_format_[m.format] += 1;
  if (m.children == 0) evictor_.Add(block, m.priority, steps_, m.expires_at);
}

void CacheImpl::Attach(Sequence& seq, uint32_t block) {
  BlockMeta& m = blocks_[block];
  if (m.state == BlockState::kCached) {
    if (evictor_.Contains(block)) evictor_.Remove(block);
    m.state = BlockState::kInUse;
    cached_by_format_[m.format] -= 1;
  }
  m.ref_count += 1;
  m.coldest_format = std::min<uint8_t>(m.coldest_format, static_cast<uint8_t>(seq.coldest_format));
  seq.blocks.push_back(block);
}

void CacheImpl::IndexFullTail(Sequence& seq) {
  const uint32_t tail = seq.blocks.back();
  const uint64_t hash = HashBlock(seq.chain_hash, seq.tail_tokens, seq.extra_key);
  const uint32_t parent =
      seq.chain_hash == kRootParentHash ? PrefixIndex::kNone : index_.Find(seq.chain_hash);
  seq.chain_hash = hash;
  seq.tail_tokens.clear();
  if (!index_.Insert(hash, tail)) return;  // equal content is already indexed: stay private
  BlockMeta& m = blocks_[tail];
  m.indexed = true;
  m.hash = hash;
  m.parent = parent;
  if (parent != PrefixIndex::kNone) {
    BlockMeta& p = blocks_[parent];
    if (p.children++ == 0 && evictor_.Contains(parent)) evictor_.Remove(parent);
  }
}

void CacheImpl::RetireSynchronous() {
  if (!backend_->synchronous()) return;
  ReclaimQueue::Entry e;
  while (reclaim_.PopAny(&e)) pools_[e.format].Free(e.page);
}

absl::StatusOr<AddResult> CacheImpl::AddSequence(const SequenceOptions& options) {
  if (options.coldest_format < -1 || options.coldest_format >= num_formats()) {
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
  const int64_t s = options_.geometry.block_tokens;
  MutexLock lock(&mu_);
  const SequenceId id = sequences_.Add();
  Sequence& seq = *sequences_.Find(id);
  seq.extra_key = options.extra_key;
  seq.coldest_format = options.coldest_format < 0 ? num_formats() - 1 : options.coldest_format;
  seq.priority = options.priority;
  seq.priority_ttl_steps = options.priority_ttl_steps;
  const int64_t n = static_cast<int64_t>(options.prompt.size());
  const int64_t matchable = n > 0 ? (n - 1) / s : 0;  // leave one token to compute
  int64_t matched = 0;
  for (; matched < matchable; ++matched) {
    const uint64_t hash =
        HashBlock(seq.chain_hash, options.prompt.subspan(matched * s, s), seq.extra_key);
    const uint32_t block = index_.Find(hash);
    if (block == PrefixIndex::kNone || blocks_[block].format > seq.coldest_format) break;
    Attach(seq, block);
    seq.chain_hash = hash;
  }
  seq.num_tokens = matched * s;
  tokens_ += seq.num_tokens;
  prefix_queried_tokens_ += n;
  prefix_hit_tokens_ += matched * s;
  prefix_hit_blocks_ += matched;
  prefix_missed_blocks_ += n / s - matched;
  return AddResult{id, matched * s};
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
  int64_t total = 0;
  for (int64_t n : num_tokens) {
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("num_tokens ", n, " is not positive"));
    total += n;
  }
  if (!tokens.empty() && static_cast<int64_t>(tokens.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat("tokens holds ", tokens.size(), " ids for ",
                                                   total, " new tokens"));
  }
  const int64_t s = options_.geometry.block_tokens;
  MutexLock lock(&mu_);
  // Plan: count the pages the whole batch needs, so that it fails before changing anything.
  int64_t pages = 0;
  batch_sequences_.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence* seq = sequences_.Find(batch[i]);
    if (seq == nullptr) return UnknownSequence(batch[i]);
    batch_sequences_.push_back(seq);
    const int64_t room = TailRoom(*seq);
    if (num_tokens[i] > room) pages += (num_tokens[i] - room + s - 1) / s;
    // A shared partial tail is copied before the write. (A sequence named twice in the batch
    // is counted twice: an upper bound.)
    if (room > 0 && blocks_[seq->blocks.back()].ref_count > 1) pages += 1;
  }
  // Block metadata never runs out before pages do (see the BlockTable's capacity).
  if (pages > 0) KVTIER_RETURN_IF_ERROR(EnsureFreePages(0, static_cast<uint32_t>(pages)));
  size_t next_token = 0;
  uint32_t now_ms = kNoTime;  // read once, at the first new block
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence* seq = batch_sequences_[i];  // no sequence is added or removed in between
    if (TailRoom(*seq) > 0 && blocks_[seq->blocks.back()].ref_count > 1) {
      KVTIER_RETURN_IF_ERROR(CopyTail(*seq));
    }
    seq->hashing = seq->hashing && !tokens.empty();
    for (int64_t t = 0; t < num_tokens[i]; ++t) {
      if (TailRoom(*seq) == 0) {
        if (now_ms == kNoTime) now_ms = NowMs();
        seq->blocks.push_back(NewBlock(0, now_ms));
        blocks_[seq->blocks.back()].coldest_format = static_cast<uint8_t>(seq->coldest_format);
      }
      BlockMeta& tail = blocks_[seq->blocks.back()];
      slots->push_back(static_cast<int64_t>(tail.page) * s + tail.num_tokens);
      tail.num_tokens += 1;
      if (seq->hashing) {
        seq->tail_tokens.push_back(tokens[next_token++]);
        if (tail.num_tokens == s) IndexFullTail(*seq);
      }
    }
    seq->num_tokens += num_tokens[i];
    tokens_ += num_tokens[i];
    MarkDirty(batch[i], *seq);
  }
  return absl::OkStatus();
}

int64_t CacheImpl::TailRoom(const Sequence& seq) const {
  if (seq.blocks.empty()) return 0;
  return options_.geometry.block_tokens - blocks_[seq.blocks.back()].num_tokens;
}

absl::Status CacheImpl::CopyTail(Sequence& seq) {
  const uint32_t shared = seq.blocks.back();
  const uint32_t copy = NewBlock(0, NowMs());
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    const absl::Status s = backend_->CopyPage(View(0, l), blocks_[shared].page, blocks_[copy].page);
    if (!s.ok()) {
      DropRef(copy, seq);
      RetireSynchronous();
      return s;
    }
  }
  blocks_[copy].num_tokens = blocks_[shared].num_tokens;
  blocks_[copy].coldest_format = blocks_[shared].coldest_format;
  DropRef(shared, seq);
  seq.blocks.back() = copy;
  copy_on_write_blocks_ += 1;
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
  c->generation = child.generation;
  c->dirty = false;
  MarkDirty(child, *c);
  for (uint32_t b : c->blocks) blocks_[b].ref_count += 1;
  tokens_ += c->num_tokens;
  return child;
}

absl::Status CacheImpl::Release(SequenceId id) {
  MutexLock lock(&mu_);
  Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  for (uint32_t b : seq->blocks) DropRef(b, *seq);
  tokens_ -= seq->num_tokens;
  sequences_.Remove(id);
  RetireSynchronous();
  return absl::OkStatus();
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
  for (uint32_t b : seq->blocks) ids.push_back(blocks_.IdOf(b));
  return ids;
}

absl::StatusOr<BlockInfo> CacheImpl::GetBlockInfo(BlockId id) const {
  MutexLock lock(&mu_);
  if (!blocks_.IsLive(id)) {
    return absl::NotFoundError(
        absl::StrCat("block ", id.index, "/", id.generation, " is unknown or stale"));
  }
  const BlockMeta& b = blocks_[id.index];
  return BlockInfo{b.state, b.format, static_cast<int32_t>(b.page),
                   static_cast<int32_t>(b.ref_count), b.num_tokens};
}

absl::Status CacheImpl::CheckLayer(int32_t layer) const {
  if (layer < 0 || layer >= options_.geometry.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is outside [0, ", options_.geometry.num_layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::CheckInput(const KVInput& kv, int64_t num_tokens) const {
  const Geometry& g = options_.geometry;
  if (kv.dtype != DType::kFloat16 && kv.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError("K/V input must be FP16 or BF16");
  }
  if (kv.num_tokens != num_tokens || kv.num_heads != g.num_kv_heads || kv.head_dim != g.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "K/V shape [", kv.num_tokens, ", ", kv.num_heads, ", ", kv.head_dim, "] != [", num_tokens,
        ", ", g.num_kv_heads, ", ", g.head_dim, "]"));
  }
  if (kv.num_tokens > 0 && (kv.k == nullptr || kv.v == nullptr)) {
    return absl::InvalidArgumentError("K/V data pointer is null");
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::CheckSlots(int32_t layer, absl::Span<const int64_t> slots,
                                   const KVInput& kv) const {
  const Geometry& g = options_.geometry;
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  KVTIER_RETURN_IF_ERROR(CheckInput(kv, static_cast<int64_t>(slots.size())));
  const PagePool& hot = pools_[0];
  for (int64_t slot : slots) {
    const int64_t page = slot / g.block_tokens;
    const uint32_t owner =
        slot >= 0 && page < hot.capacity_pages() ? hot.Owner(static_cast<uint32_t>(page)) : PagePool::kNone;
    if (owner >= blocks_.capacity()) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is not reserved"));
    }
    const BlockMeta& b = blocks_[owner];
    if (slot % g.block_tokens >= b.num_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", slot, " is not reserved"));
    }
    if (b.ref_count > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", slot, " is in a block shared by ", b.ref_count,
          " sequences; append to the sequence again to get a private copy"));
    }
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::WriteKV(int32_t layer, absl::Span<const int64_t> slots, const KVInput& kv) {
  MutexLock lock(&mu_);
  KVTIER_RETURN_IF_ERROR(CheckSlots(layer, slots, kv));
  if (slots.empty()) return absl::OkStatus();
  return backend_->WriteRows(View(0, layer), slots, kv, &nonfinite_values_);
}

absl::Status CacheImpl::ReadKV(SequenceId id, int32_t layer, absl::Span<float> k,
                               absl::Span<float> v) const {
  MutexLock lock(&mu_);
  const Sequence* seq = sequences_.Find(id);
  if (seq == nullptr) return UnknownSequence(id);
  const Geometry& g = options_.geometry;
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
  const size_t want = static_cast<size_t>(seq->num_tokens) * row;
  if (k.size() != want || v.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("ReadKV spans hold ", k.size(), " and ", v.size(),
                                                   " floats; the sequence needs ", want, " each"));
  }
  for (size_t i = 0; i < seq->blocks.size(); ++i) {
    const BlockMeta& b = blocks_[seq->blocks[i]];
    const size_t at = i * g.block_tokens * row;
    KVTIER_RETURN_IF_ERROR(
        backend_->ReadPage(View(b.format, layer), b.page, b.num_tokens, k.data() + at, v.data() + at));
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolInfo> CacheImpl::GetPool(int32_t format, int32_t layer) const {
  if (format < 0 || format >= num_formats() || layer < 0 || layer >= options_.geometry.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("no pool for format ", format, ", layer ", layer));
  }
  MutexLock lock(&mu_);
  const PoolView view = View(format, layer);
  const PageLayout& l = view.layout;
  PoolInfo info;
  info.base = view.base;
  info.page_bytes = l.page_bytes;
  info.capacity_pages = pools_[format].capacity_pages();
  info.k_offset = l.k.payload_offset;
  info.v_offset = l.v.payload_offset;
  info.row_bytes = l.k.row_bytes;
  info.k_micro_offset = l.k.micro_offset;
  info.v_micro_offset = l.v.micro_offset;
  info.k_scale_offset = l.k.scale_offset;
  info.v_scale_offset = l.v.scale_offset;
  info.k_tensor_scale = view.k_tensor_scale;
  info.v_tensor_scale = view.v_tensor_scale;
  return info;
}

absl::Status CacheImpl::BuildPageTables(absl::Span<const SequenceId> batch,
                                        PageTables* tables) const {
  if (tables == nullptr) return absl::InvalidArgumentError("tables is null");
  MutexLock lock(&mu_);
  for (SequenceId id : batch) {
    if (sequences_.Find(id) == nullptr) return UnknownSequence(id);
  }
  tables->per_format.resize(num_formats());
  for (FormatPageTable& t : tables->per_format) {
    t.indptr.assign(1, 0);
    t.indices.clear();
    t.last_page_len.clear();
  }
  tables->packed_indptr.assign(1, 0);
  tables->packed.clear();
  tables->seq_lens.clear();
  for (SequenceId id : batch) {
    const Sequence& seq = *sequences_.Find(id);
    for (FormatPageTable& t : tables->per_format) t.last_page_len.push_back(0);
    for (uint32_t index : seq.blocks) {
      const BlockMeta& b = blocks_[index];
      FormatPageTable& t = tables->per_format[b.format];
      t.indices.push_back(static_cast<int32_t>(b.page));
      t.last_page_len.back() = b.num_tokens;
      tables->packed.push_back(PackPage(b.format, b.page));
    }
    for (FormatPageTable& t : tables->per_format) {
      t.indptr.push_back(static_cast<int32_t>(t.indices.size()));
    }
    tables->packed_indptr.push_back(static_cast<int32_t>(tables->packed.size()));
    tables->seq_lens.push_back(static_cast<int32_t>(seq.num_tokens));
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::Demote(absl::Span<const BlockId> ids, int32_t format) {
  if (format < 0 || format >= num_formats()) {
    return absl::InvalidArgumentError(absl::StrCat("format ", format, " is outside the palette"));
  }
  MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!blocks_.IsLive(ids[i])) {
      return absl::NotFoundError(absl::StrCat("block ", ids[i].index, "/", ids[i].generation,
                                              " is unknown or stale"));
    }
    const BlockMeta& b = blocks_[ids[i].index];
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
  return DemoteLocked(indices, format);
}

absl::Status CacheImpl::DemoteLocked(absl::Span<const uint32_t> ids, int format) {
  if (ids.empty()) return absl::OkStatus();
  // Demotion never evicts cached prefixes to make room: it is what pressure does first.
  KVTIER_RETURN_IF_ERROR(EnsureFreePages(format, static_cast<uint32_t>(ids.size()), false));
  const auto started = std::chrono::steady_clock::now();
  const int layers = options_.geometry.num_layers;
  std::vector<PoolView> from, to;
  std::vector<uint32_t> src, dst;
  // One backend call per source format, so that each call reads one pool per layer.
  for (int f = 0; f < format; ++f) {
    src.clear();
    dst.clear();
    for (uint32_t id : ids) {
      if (blocks_[id].format != f) continue;
      src.push_back(blocks_[id].page);
      dst.push_back(pools_[format].Allocate(id));
    }
    if (src.empty()) continue;
    from.clear();
    to.clear();
    for (int l = 0; l < layers; ++l) {
      from.push_back(View(f, l));
      to.push_back(View(format, l));
    }
    const absl::Status s = backend_->Requantize(from, to, src, dst);
    if (!s.ok()) {  // blocks of earlier source formats are already demoted; these are not
      for (uint32_t page : dst) pools_[format].Free(page);
      return s;
    }
    MigrationStats& m = migrations_[f * num_formats() + format];
    m.blocks += static_cast<int64_t>(src.size());
    m.bytes += static_cast<int64_t>(src.size()) * layers *
               (layouts_[f].page_bytes + layouts_[format].page_bytes);
    if (under_pressure_) demotions_under_pressure_ += static_cast<int64_t>(src.size());
    size_t next = 0;
    for (uint32_t id : ids) {
      BlockMeta& b = blocks_[id];
      if (b.format != f) continue;
      pools_[f].SetOwner(b.page, PagePool::kPending);
      reclaim_.Push(b.format, b.page);
      if (b.state == BlockState::kCached) {
        cached_by_format_[f] -= 1;
        cached_by_format_[format] += 1;
      }
      b.format = static_cast<uint8_t>(format);
      b.page = dst[next++];
    }
  }
  migration_seconds_.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  RetireSynchronous();
  return absl::OkStatus();
}

absl::Status CacheImpl::CalibrateTensorScales(int32_t layer, const KVInput& kv) {
  KVTIER_RETURN_IF_ERROR(CheckLayer(layer));
  KVTIER_RETURN_IF_ERROR(CheckInput(kv, kv.num_tokens));
  MutexLock lock(&mu_);
  for (int f = 0; f < num_formats(); ++f) {
    const FormatSpec& spec = options_.palette[f];
    const bool per_tensor = spec.k.scope == ScaleScope::kTensor || spec.v.scope == ScaleScope::kTensor;
    if (per_tensor && pools_[f].used_pages() > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          FormatName(spec), " already holds blocks encoded with the current per-tensor scale"));
    }
  }
  const int64_t n = kv.num_tokens * kv.num_heads * kv.head_dim;
  float k_amax = 0, v_amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t kb = static_cast<const uint16_t*>(kv.k)[i];
    const uint16_t vb = static_cast<const uint16_t*>(kv.v)[i];
    const bool half = kv.dtype == DType::kFloat16;
    k_amax = std::max(k_amax, FiniteAbs(half ? codec::HalfToFloat(kb) : codec::Bf16ToFloat(kb)));
    v_amax = std::max(v_amax, FiniteAbs(half ? codec::HalfToFloat(vb) : codec::Bf16ToFloat(vb)));
  }
  for (int f = 0; f < num_formats(); ++f) {
    const size_t i = static_cast<size_t>(f) * options_.geometry.num_layers + layer;
    k_scales_[i] = TensorScale(options_.palette[f].k.type, k_amax);
    v_scales_[i] = TensorScale(options_.palette[f].v.type, v_amax);
  }
  return absl::OkStatus();
}

absl::Status CacheImpl::EndStep() {
  MutexLock lock(&mu_);
  RunPolicy();
  steps_ += 1;
  if (backend_->synchronous()) {
    RetireSynchronous();
  } else {
    KVTIER_ASSIGN_OR_RETURN(const uint64_t fence, backend_->RecordFence());
    reclaim_.CloseStep(fence);
    ReclaimQueue::Entry e;
    while (reclaim_.PopPassed([this](uint64_t f) { return backend_->FencePassed(f); }, &e)) {
      pools_[e.format].Free(e.page);
    }
  }
  // Each pool keeps one empty slab for the next step; the others return to the budget.
  absl::Status status;
  for (int f = 0; f < num_formats(); ++f) {
    while (pools_[f].empty_slots() > 1) status.Update(UnmapSlot(f, pools_[f].EmptySlot()));
  }
  return status;
}

CacheStats CacheImpl::GetStats() const {
  MutexLock lock(&mu_);
  const Geometry& g = options_.geometry;
  CacheStats s;
  s.budget_bytes = static_cast<int64_t>(options_.memory_budget_bytes);
  s.slab_bytes = static_cast<int64_t>(options_.slab_bytes);
  s.slabs_total = num_slabs_;
  s.slabs_free = free_slabs_;
  s.sequences = sequences_.live_count();
  s.tokens = tokens_;
  s.pages_pending_reclaim = static_cast<int64_t>(reclaim_.size());
  s.steps = steps_;
  s.allocation_failures = allocation_failures_;
  s.copy_on_write_blocks = copy_on_write_blocks_;
  s.slab_moves = slab_moves_;
  s.nonfinite_values = nonfinite_values_;
  s.prefix_queried_tokens = prefix_queried_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.prefix_hit_blocks = prefix_hit_blocks_;
  s.prefix_missed_blocks = prefix_missed_blocks_;
  s.evicted_blocks = evicted_blocks_;
  s.evictable_blocks = evictor_.size();
  s.indexed_blocks = static_cast<int64_t>(index_.size());
  s.policy = policy_ ? policy_->name : "";
  s.under_pressure = under_pressure_;
  s.demotions_under_pressure = demotions_under_pressure_;
  s.policy_demotion_failures = policy_demotion_failures_;
  s.migration_seconds = migration_seconds_.stats();
  s.block_lifetime_seconds = block_lifetime_seconds_.stats();
  s.block_idle_before_evict_seconds = idle_before_evict_seconds_.stats();
  for (const MigrationStats& m : migrations_) {
    if (m.blocks > 0) s.migrations.push_back(m);
  }
  s.formats.resize(num_formats());
  for (int f = 0; f < num_formats(); ++f) {
    FormatStats& fs = s.formats[f];
    const PagePool& pool = pools_[f];
    fs.name = FormatName(options_.palette[f]);
    fs.page_bytes = layouts_[f].page_bytes;
    fs.slabs_mapped = pool.mapped_slots();
    fs.pages_mapped = pool.mapped_pages();
    fs.pages_used = pool.used_pages();
    fs.bytes = fs.slabs_mapped * s.slab_bytes * g.num_layers;
    const double elements = 2.0 * g.num_kv_heads * g.block_tokens * g.head_dim;
    fs.bits_per_element = layouts_[f].data_bytes * 8.0 / elements;
  }
  for (uint32_t i = 0; i < blocks_.capacity(); ++i) {
    const BlockMeta& b = blocks_[i];
    if (b.state == BlockState::kInUse) s.formats[b.format].blocks_in_use += 1;
    if (b.state == BlockState::kCached) s.formats[b.format].blocks_cached += 1;
  }
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
