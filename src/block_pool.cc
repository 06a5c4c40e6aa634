#include "src/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "src/prefix_hash.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

absl::Status Violation(absl::string_view what) {
  return absl::InternalError(absl::StrCat("consistency: ", what));
}

}  // namespace

// Live blocks never outnumber the pages that all slabs could hold in the densest format, so
// block metadata never runs out before pages do.
// Offloaded blocks keep their metadata, so the table also covers every host page.
BlockPool::BlockPool(PageStore* pages, std::unique_ptr<PageStore> host, Backend* backend,
                     CacheMetrics* metrics, BlockEventSink* events)
    : pages_(pages),
      host_(std::move(host)),
      backend_(backend),
      metrics_(metrics),
      events_(events),
      blocks_(pages->MaxLivePages() + (host_ ? host_->MaxLivePages() : 0)),
      evictor_(blocks_.capacity()),
      host_evictor_(host_ ? blocks_.capacity() : 0),
      cached_by_format_(pages->num_formats(), 0) {
  if (events_ != nullptr) {
    event_tokens_.resize(size_t{blocks_.capacity()} * pages->options().geometry.block_tokens);
    event_origins_.resize(blocks_.capacity());
  }
}

std::vector<BlockPool::Freeable> BlockPool::FreeableWithout(const PageStore& store,
                                                            const std::vector<bool>& gone) {
  auto freeable = [&](const PagePool& pool, uint32_t page) {
    const uint32_t owner = pool.Owner(page);
    return owner == PagePool::kNone || owner == PagePool::kPending || gone[owner];
  };
  std::vector<Freeable> out(store.num_formats());
  for (int g = 0; g < store.num_formats(); ++g) {
    const PagePool& pool = store.pool(g);
    for (uint32_t slot = 0; slot < pool.num_slots(); ++slot) {
      if (!pool.IsMapped(slot)) continue;
      uint32_t n = 0;
      const uint32_t first = pool.FirstPage(slot);
      for (uint32_t page = first; page < first + pool.PagesInSlot(slot); ++page) {
        n += freeable(pool, page) ? 1 : 0;
      }
      out[g].pages += n;
      if (n == pool.PagesInSlot(slot)) {
        out[g].whole_slabs += 1;
        out[g].whole_pages += n;
      }
    }
  }
  return out;
}

std::vector<BlockPool::Freeable> BlockPool::FreeableAfterEvictingAll() const {
  // Leaf-first eviction never reaches a cached block above an indexed block in use.
  std::vector<bool> pinned(blocks_.capacity(), false);
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    if (blocks_[b].state != BlockState::kInUse || !blocks_[b].indexed) continue;
    for (uint32_t p = blocks_[b].parent; p != kNone && !pinned[p]; p = blocks_[p].parent) {
      pinned[p] = true;
    }
  }
  std::vector<bool> gone(blocks_.capacity(), false);
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    gone[b] = blocks_[b].state == BlockState::kCached && !pinned[b];
  }
  return FreeableWithout(*pages_, gone);
}

bool BlockPool::HostRoomAfterDroppingAll(int format) const {
  // An offloaded block with a reference is pinned (being brought back, or on its way down), and
  // so are its ancestors: the host tier drops leaves first.
  std::vector<bool> gone(blocks_.capacity(), false);
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    gone[b] = blocks_[b].state == BlockState::kOffloaded && blocks_[b].ref_count == 0;
  }
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    if (blocks_[b].state != BlockState::kOffloaded || blocks_[b].ref_count == 0) continue;
    for (uint32_t p = blocks_[b].parent; p != kNone && gone[p]; p = blocks_[p].parent) {
      gone[p] = false;
    }
  }
  return RoomIn(*host_, FreeableWithout(*host_, gone), format) > 0;
}

uint64_t BlockPool::RoomIn(const PageStore& store, const std::vector<Freeable>& freeable,
                           int format) {
  uint64_t slabs = store.free_slabs();  // and every other format's slabs that would empty
  for (int g = 0; g < store.num_formats(); ++g) {
    if (g != format) slabs += freeable[g].whole_slabs;
  }
  return freeable[format].pages + slabs * store.pool(format).MinPagesPerSlot();
}

uint64_t BlockPool::RoomAfterEvictingAll(int format) const {
  return RoomIn(*pages_, FreeableAfterEvictingAll(), format);
}

bool BlockPool::RoomForAllAfterEvictingAll(absl::Span<const uint32_t> pages_by_format) const {
  const std::vector<Freeable> freeable = FreeableAfterEvictingAll();
  uint64_t slabs = pages_->free_slabs(), needed = 0;
  for (int f = 0; f < pages_->num_formats(); ++f) {
    slabs += freeable[f].whole_slabs;  // each slab that would empty serves any format
    const uint64_t in_partial_slabs = freeable[f].pages - freeable[f].whole_pages;
    if (pages_by_format[f] > in_partial_slabs) {
      const uint64_t per_slab = pages_->pool(f).MinPagesPerSlot();
      needed += (pages_by_format[f] - in_partial_slabs + per_slab - 1) / per_slab;
    }
  }
  return needed <= slabs;
}

absl::Status BlockPool::EnsureFreePages(int format, uint32_t count, bool may_evict) {
  auto short_of_slabs = [&](bool after_reclaim) {
    return pages_->SlabsNeeded(format, count, after_reclaim) >
           pages_->AvailableSlabs(format, after_reclaim);
  };
  if (!short_of_slabs(false)) return pages_->MapSlabs(format, count);
  if (host_ != nullptr) host_no_room_.assign(host_->num_formats(), 0);
  // Fail before evicting anything when even evicting every evictable block could not make
  // room (an exact count, so a refusal never evicts).
  int64_t evicted = 0;
  if (RoomAfterEvictingAll(format) >= count) {
    // Victims until the retired pages would make room; their copies to the host tier go in
    // one batch, then one wait for the device returns the pages.
    while (may_evict && short_of_slabs(true) && EvictOne()) evicted += 1;
    FlushOffloads();
    if (!short_of_slabs(true)) KVTIER_RETURN_IF_ERROR(pages_->ReclaimAll());
  }
  if (short_of_slabs(false)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "need ", count, " pages of ", FormatName(pages_->options().palette[format]),
        " but only ", pages_->pool(format).free_pages(), " are free and ",
        pages_->AvailableSlabs(format), " slabs available after evicting ", evicted,
        " cached blocks"));
  }
  return pages_->MapSlabs(format, count);
}

bool BlockPool::EvictOne() {
  const uint32_t b = evictor_.PopVictim(metrics_->steps);
  if (b == Evictor::kNone) return false;
  if (host_ == nullptr || !Offload(b)) {
    if (blocks_[b].offloaded_children > 0) {
      FlushOffloads();  // its offloaded children may still be on their way down
      DropOffloadedDescendants(b);
    }
    Drop(b);
  }
  return true;
}

void BlockPool::Unlink(uint32_t block) {
  BlockMeta& m = blocks_[block];
  EmitRemoved(m, MediumOf(m));
  if (evictor_.Contains(block)) evictor_.Remove(block);
  if (host_ != nullptr && host_evictor_.Contains(block)) host_evictor_.Remove(block);
  index_.Erase(m.hash);
  if (m.parent != BlockTable::kNone) {
    BlockMeta& parent = blocks_[m.parent];
    (m.state == BlockState::kOffloaded ? parent.offloaded_children : parent.children) -= 1;
    Relink(m.parent);
  }
  if (m.state == BlockState::kCached) cached_by_format_[m.format] -= 1;
}

void BlockPool::Drop(uint32_t block) {
  Unlink(block);
  const BlockMeta& m = blocks_[block];
  metrics_->evicted_blocks += 1;
  metrics_->idle_before_evict_seconds.Observe((metrics_->NowMs() - m.idle_since_ms) / 1e3);
  FreeBlock(block);
}

void BlockPool::Withdraw(uint32_t block) {
  Unlink(block);
  metrics_->abandoned_blocks += 1;
  BlockMeta& m = blocks_[block];
  if (m.ref_count == 0) {
    FreeBlock(block);
    return;
  }
  m.indexed = false;
  m.parent = BlockTable::kNone;
}

void BlockPool::Relink(uint32_t block) {
  // The rest of a cold chain goes next: a parent that just became a leaf is evicted first.
  const BlockMeta& m = blocks_[block];
  if (m.state == BlockState::kCached && m.children == 0 && !evictor_.Contains(block)) {
    evictor_.AddColdest(block, m.priority, m.expires_at);
  }
  if (m.state == BlockState::kOffloaded && m.ref_count == 0 && m.children == 0 &&
      m.offloaded_children == 0 && !host_evictor_.Contains(block)) {
    host_evictor_.AddColdest(block, m.priority, m.expires_at);
  }
}

void BlockPool::FreeBlock(uint32_t block) {
  BlockMeta& m = blocks_[block];
  metrics_->block_lifetime_seconds.Observe((metrics_->NowMs() - m.born_ms) / 1e3);
  StoreOf(m).Retire(m.format, m.page);
  blocks_.Free(block);
}

uint32_t BlockPool::NewBlock(int format, uint32_t now_ms) {
  const uint32_t block = blocks_.Allocate(static_cast<uint8_t>(format), 0);
  blocks_[block].page = pages_->Allocate(format, block);
  blocks_[block].born_ms = now_ms;
  return block;
}

void BlockPool::Unreferenced(uint32_t block, int priority, int64_t expires_at) {
  BlockMeta& m = blocks_[block];
  if (!m.indexed) {
    FreeBlock(block);
    return;
  }
  m.idle_since_ms = metrics_->NowMs();
  m.priority = static_cast<uint8_t>(priority);
  m.expires_at = expires_at;
  MakeCached(block, BlockState::kCached);
}

void BlockPool::MakeCached(uint32_t block, BlockState state) {
  BlockMeta& m = blocks_[block];
  m.state = state;
  if (state == BlockState::kCached) {
    cached_by_format_[m.format] += 1;
    if (m.children == 0) evictor_.Add(block, m.priority, metrics_->steps, m.expires_at);
  } else if (m.children == 0 && m.offloaded_children == 0) {
    host_evictor_.Add(block, m.priority, metrics_->steps, m.expires_at);
  }
}

void BlockPool::Reference(uint32_t block) {
  BlockMeta& m = blocks_[block];
  if (m.state == BlockState::kCached) {
    if (evictor_.Contains(block)) evictor_.Remove(block);
    m.state = BlockState::kInUse;
    cached_by_format_[m.format] -= 1;
  }
  m.ref_count += 1;
}

void BlockPool::Unpin(uint32_t block) {
  BlockMeta& m = blocks_[block];
  if (m.state == BlockState::kOffloaded) {
    m.ref_count = 0;
    MakeCached(block, BlockState::kOffloaded);
  } else if (--m.ref_count == 0) {
    MakeCached(block, BlockState::kCached);
  }
}

bool BlockPool::Publish(uint32_t block, uint64_t hash, uint64_t parent_hash, uint64_t extra_key,
                        absl::Span<const int32_t> tokens) {
  const uint32_t parent = parent_hash == kRootParentHash ? kNone : index_.Find(parent_hash);
  // A block whose parent is not indexed (this sequence's copy of it was private, and the indexed
  // one has gone since) stays private: matching walks from the root and could not reach it, and
  // routers would drop a block stored under a parent they no longer hold.
  if (parent_hash != kRootParentHash && parent == kNone) return false;
  // Children of offloaded blocks are offloaded too (a prefix hit brings a chain back from its
  // root), so a block computed again over an offloaded prefix stays private.
  if (parent != kNone && blocks_[parent].state == BlockState::kOffloaded) return false;
  if (!index_.Insert(hash, block)) return false;
  BlockMeta& m = blocks_[block];
  m.indexed = true;
  m.hash = hash;
  m.parent = parent;
  if (parent != kNone) {
    // The parent may be cached (this block's sequence may hold a private copy of it); it is
    // no longer a leaf.
    if (blocks_[parent].children++ == 0 && evictor_.Contains(parent)) evictor_.Remove(parent);
  }
  if (events_ != nullptr) {
    std::copy(tokens.begin(), tokens.end(), event_tokens_.begin() + block * tokens.size());
    event_origins_[block] = {parent_hash, extra_key};
    EmitStored(block, Medium::kDevice);
  }
  return true;
}

void BlockPool::EmitStored(uint32_t block, Medium medium) {
  if (events_ == nullptr) return;
  const BlockMeta& m = blocks_[block];
  const size_t n = static_cast<size_t>(pages_->options().geometry.block_tokens);
  const EventOrigin& origin = event_origins_[block];
  events_->Stored(medium, m.hash, origin.parent_hash, origin.extra_key,
                  absl::MakeConstSpan(event_tokens_).subspan(block * n, n));
  if (m.format != 0) events_->FormatChanged(medium, m.hash, m.format);
}

void BlockPool::MoveToPage(uint32_t block, int format, uint32_t page) {
  BlockMeta& b = blocks_[block];
  const int old_format = b.format;
  pages_->Retire(b.format, b.page);
  if (b.state == BlockState::kCached) {
    cached_by_format_[b.format] -= 1;
    cached_by_format_[format] += 1;
  }
  b.format = static_cast<uint8_t>(format);
  b.page = page;
  if (events_ != nullptr && b.indexed && format != old_format) {
    events_->FormatChanged(Medium::kDevice, b.hash, format);
  }
}

std::vector<IndexedBlock> BlockPool::IndexedBlocks() const {
  std::vector<IndexedBlock> out;
  out.reserve(index_.size());
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.state != BlockState::kFree && m.indexed) out.push_back({m.hash, m.state, m.format});
  }
  return out;
}

void BlockPool::Fill(CacheStats* s) const {
  s->evictable_blocks = evictor_.size();
  s->indexed_blocks = static_cast<int64_t>(index_.size());
  for (uint32_t i = 0; i < blocks_.capacity(); ++i) {
    const BlockMeta& b = blocks_[i];
    if (b.state == BlockState::kInUse) s->formats[b.format].blocks_in_use += 1;
    if (b.state == BlockState::kCached) s->formats[b.format].blocks_cached += 1;
  }
  if (host_ != nullptr) FillHost(s);
}

absl::Status BlockPool::CheckBlock(uint32_t b, absl::Span<const uint32_t> refs,
                                   std::vector<uint32_t>* children) const {
  const BlockMeta& m = blocks_[b];
  if (m.state == BlockState::kInUse && (m.ref_count == 0 || m.ref_count != refs[b])) {
    return Violation(
        absl::StrCat("block ", b, " ref_count ", m.ref_count, " but ", refs[b], " references"));
  }
  if (m.state != BlockState::kInUse && (m.ref_count != 0 || refs[b] != 0 || !m.indexed)) {
    return Violation(absl::StrCat("cached block ", b, " is referenced or not indexed"));
  }
  // Prefix index: an indexed block is found under its hash; its parent counts it in its tier.
  const bool offloaded = m.state == BlockState::kOffloaded;
  if (m.indexed) {
    if (index_.Find(m.hash) != b) return Violation(absl::StrCat("block ", b, " is not in the index"));
    if (m.parent != kNone) {
      if (!blocks_[m.parent].indexed) {
        return Violation(absl::StrCat("block ", b, "'s parent is not indexed"));
      }
      (*children)[2 * m.parent + (offloaded ? 1 : 0)] += 1;
    }
  }
  if (m.format >= pages_->num_formats()) return Violation(absl::StrCat("block ", b, " has no format"));
  const PagePool& pool = (offloaded ? *host_ : *pages_).pool(m.format);
  if (m.page >= pool.capacity_pages() || pool.Owner(m.page) != b ||
      !pool.IsMapped(pool.SlotOfPage(m.page))) {
    return Violation(absl::StrCat("block ", b, " does not own page ", m.page, " in a mapped slab",
                                  offloaded ? " of the host tier" : ""));
  }
  return absl::OkStatus();
}

absl::Status BlockPool::CheckLeaves(absl::Span<const uint32_t> children) const {
  // Leaf-first in each tier: exactly the cached blocks without indexed children on the device
  // are evictable, and exactly the offloaded blocks without indexed children anywhere.
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.state != BlockState::kFree &&
        (m.children != children[2 * b] || m.offloaded_children != children[2 * b + 1])) {
      return Violation(absl::StrCat("block ", b, " counts ", m.children, "+",
                                    m.offloaded_children, " children, has ", children[2 * b],
                                    "+", children[2 * b + 1]));
    }
    if (m.state == BlockState::kOffloaded && m.children != 0) {
      return Violation(absl::StrCat("offloaded block ", b, " has children on the device"));
    }
    const bool leaf = m.state == BlockState::kCached && m.children == 0;
    if (evictor_.Contains(b) != leaf) {
      return Violation(absl::StrCat("block ", b, (leaf ? " is a cached leaf but not evictable"
                                                       : " is evictable but not a cached leaf")));
    }
    const bool host_leaf = m.state == BlockState::kOffloaded && m.offloaded_children == 0;
    if (host_ != nullptr && host_evictor_.Contains(b) != host_leaf) {
      return Violation(absl::StrCat("block ", b, " is ", host_leaf ? "" : "not ",
                                    "an offloaded leaf but is ", host_leaf ? "not " : "",
                                    "evictable in the host tier"));
    }
  }
  KVTIER_RETURN_IF_ERROR(evictor_.CheckConsistency());
  return host_ != nullptr ? host_evictor_.CheckConsistency() : absl::OkStatus();
}

absl::Status BlockPool::CheckConsistency(absl::Span<const uint32_t> refs) const {
  // Every block in exactly one state; live blocks own exactly their page in their tier.
  const int formats = pages_->num_formats();
  uint32_t free_blocks = 0, indexed = 0;
  std::vector<uint32_t> owned(formats, 0), host_owned(formats, 0), cached(formats, 0);
  std::vector<uint32_t> children(2 * size_t{blocks_.capacity()}, 0);  // [block][tier]
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.state == BlockState::kFree) {
      free_blocks += 1;
      if (refs[b] != 0) return Violation(absl::StrCat("free block ", b, " is referenced"));
      continue;
    }
    if (m.state == BlockState::kOffloaded && host_ == nullptr) {
      return Violation(absl::StrCat("block ", b, " is offloaded without a host tier"));
    }
    KVTIER_RETURN_IF_ERROR(CheckBlock(b, refs, &children));
    if (m.state == BlockState::kCached) cached[m.format] += 1;
    indexed += m.indexed ? 1 : 0;
    (m.state == BlockState::kOffloaded ? host_owned : owned)[m.format] += 1;
  }
  if (free_blocks != blocks_.free_count() || blocks_.CountFreeList() != free_blocks) {
    return Violation("the block free list disagrees with block states");
  }
  if (indexed != index_.size()) {
    return Violation(absl::StrCat("index holds ", index_.size(), " blocks, ", indexed, " indexed"));
  }
  KVTIER_RETURN_IF_ERROR(CheckLeaves(children));
  for (int f = 0; f < formats; ++f) {
    if (cached[f] != cached_by_format_[f]) return Violation(absl::StrCat("format ", f, " cached count"));
  }
  if (host_ != nullptr) KVTIER_RETURN_IF_ERROR(host_->CheckConsistency(host_owned));
  return pages_->CheckConsistency(owned);
}

}  // namespace kvtier
