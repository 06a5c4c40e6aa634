#include "src/block_pool.h"

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
BlockPool::BlockPool(PageStore* pages, CacheMetrics* metrics)
    : pages_(pages),
      metrics_(metrics),
      blocks_(pages->MaxLivePages()),
      evictor_(blocks_.capacity()),
      cached_by_format_(pages->num_formats(), 0) {}

uint64_t BlockPool::RoomAfterEvictingAll(int format) const {
  // Leaf-first eviction never reaches a cached block above an indexed block in use.
  std::vector<bool> pinned(blocks_.capacity(), false);
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    if (blocks_[b].state != BlockState::kInUse || !blocks_[b].indexed) continue;
    for (uint32_t p = blocks_[b].parent; p != kNone && !pinned[p]; p = blocks_[p].parent) {
      pinned[p] = true;
    }
  }
  // A page comes free when it is free, retired (reclaimed after a fence) or an evictable block's.
  auto freeable = [&](const PagePool& pool, uint32_t page) {
    const uint32_t owner = pool.Owner(page);
    return owner == PagePool::kNone || owner == PagePool::kPending ||
           (blocks_[owner].state == BlockState::kCached && !pinned[owner]);
  };
  uint64_t room = 0;
  uint64_t slabs = pages_->free_slabs();
  for (int g = 0; g < pages_->num_formats(); ++g) {
    const PagePool& pool = pages_->pool(g);
    for (uint32_t slot = 0; slot < pool.num_slots(); ++slot) {
      if (!pool.IsMapped(slot)) continue;
      uint32_t n = 0;
      const uint32_t first = pool.FirstPage(slot);
      for (uint32_t page = first; page < first + pool.PagesInSlot(slot); ++page) {
        n += freeable(pool, page) ? 1 : 0;
      }
      if (g == format) {
        room += n;
      } else if (n == pool.PagesInSlot(slot)) {
        slabs += 1;
      }
    }
  }
  return room + slabs * pages_->pool(format).MinPagesPerSlot();
}

absl::Status BlockPool::EnsureFreePages(int format, uint32_t count, bool may_evict) {
  auto short_of_slabs = [&] {
    return pages_->SlabsNeeded(format, count) > pages_->AvailableSlabs(format);
  };
  if (short_of_slabs()) {
    // Fail before evicting anything when even evicting every evictable block could not make
    // room (an exact count, so a refusal never evicts).
    const bool could_fit = RoomAfterEvictingAll(format) >= count;
    int64_t evicted = 0;
    while (may_evict && could_fit && short_of_slabs() && EvictOne()) {
      evicted += 1;
      KVTIER_RETURN_IF_ERROR(pages_->ReclaimAll());
    }
    if (short_of_slabs()) {
      metrics_->allocation_failures += 1;
      return absl::ResourceExhaustedError(absl::StrCat(
          "need ", count, " pages of ", FormatName(pages_->options().palette[format]),
          " but only ", pages_->pool(format).free_pages(), " are free and ",
          pages_->AvailableSlabs(format), " slabs available after evicting ", evicted,
          " cached blocks"));
    }
  }
  return pages_->MapSlabs(format, count);
}

bool BlockPool::EvictOne() {
  const uint32_t b = evictor_.PopVictim(metrics_->steps);
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
  metrics_->evicted_blocks += 1;
  metrics_->idle_before_evict_seconds.Observe((metrics_->NowMs() - m.idle_since_ms) / 1e3);
  FreeBlock(b);
  return true;
}

void BlockPool::FreeBlock(uint32_t block) {
  BlockMeta& m = blocks_[block];
  metrics_->block_lifetime_seconds.Observe((metrics_->NowMs() - m.born_ms) / 1e3);
  pages_->Retire(m.format, m.page);
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
  m.state = BlockState::kCached;
  m.idle_since_ms = metrics_->NowMs();
  m.priority = static_cast<uint8_t>(priority);
  m.expires_at = expires_at;
  cached_by_format_[m.format] += 1;
  if (m.children == 0) evictor_.Add(block, m.priority, metrics_->steps, m.expires_at);
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

bool BlockPool::Publish(uint32_t block, uint64_t hash, uint64_t parent_hash) {
  const uint32_t parent = parent_hash == kRootParentHash ? kNone : index_.Find(parent_hash);
  if (!index_.Insert(hash, block)) return false;
  BlockMeta& m = blocks_[block];
  m.indexed = true;
  m.hash = hash;
  m.parent = parent;
  if (parent != kNone) {
    BlockMeta& p = blocks_[parent];
    if (p.children++ == 0 && evictor_.Contains(parent)) evictor_.Remove(parent);
  }
  return true;
}

void BlockPool::MoveToPage(uint32_t block, int format, uint32_t page) {
  BlockMeta& b = blocks_[block];
  pages_->Retire(b.format, b.page);
  if (b.state == BlockState::kCached) {
    cached_by_format_[b.format] -= 1;
    cached_by_format_[format] += 1;
  }
  b.format = static_cast<uint8_t>(format);
  b.page = page;
}

void BlockPool::Fill(CacheStats* s) const {
  s->evictable_blocks = evictor_.size();
  s->indexed_blocks = static_cast<int64_t>(index_.size());
  for (uint32_t i = 0; i < blocks_.capacity(); ++i) {
    const BlockMeta& b = blocks_[i];
    if (b.state == BlockState::kInUse) s->formats[b.format].blocks_in_use += 1;
    if (b.state == BlockState::kCached) s->formats[b.format].blocks_cached += 1;
  }
}

absl::Status BlockPool::CheckBlock(uint32_t b, absl::Span<const uint32_t> refs,
                                   std::vector<uint32_t>* children) const {
  const BlockMeta& m = blocks_[b];
  if (m.state == BlockState::kInUse && (m.ref_count == 0 || m.ref_count != refs[b])) {
    return Violation(
        absl::StrCat("block ", b, " ref_count ", m.ref_count, " but ", refs[b], " references"));
  }
  if (m.state == BlockState::kCached && (m.ref_count != 0 || refs[b] != 0 || !m.indexed)) {
    return Violation(absl::StrCat("cached block ", b, " is referenced or not indexed"));
  }
  // Prefix index: an indexed block is found under its hash; its parent counts it.
  if (m.indexed) {
    if (index_.Find(m.hash) != b) return Violation(absl::StrCat("block ", b, " is not in the index"));
    if (m.parent != kNone) {
      if (!blocks_[m.parent].indexed) {
        return Violation(absl::StrCat("block ", b, "'s parent is not indexed"));
      }
      (*children)[m.parent] += 1;
    }
  }
  if (m.format >= pages_->num_formats()) return Violation(absl::StrCat("block ", b, " has no format"));
  const PagePool& pool = pages_->pool(m.format);
  if (m.page >= pool.capacity_pages() || pool.Owner(m.page) != b ||
      !pool.IsMapped(pool.SlotOfPage(m.page))) {
    return Violation(absl::StrCat("block ", b, " does not own page ", m.page, " in a mapped slab"));
  }
  return absl::OkStatus();
}

absl::Status BlockPool::CheckConsistency(absl::Span<const uint32_t> refs) const {
  // Every block in exactly one state; live blocks own exactly their page.
  const int formats = pages_->num_formats();
  uint32_t free_blocks = 0, indexed = 0;
  std::vector<uint32_t> owned(formats, 0), cached(formats, 0);
  std::vector<uint32_t> children(blocks_.capacity(), 0);
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.state == BlockState::kFree) {
      free_blocks += 1;
      if (refs[b] != 0) return Violation(absl::StrCat("free block ", b, " is referenced"));
      continue;
    }
    KVTIER_RETURN_IF_ERROR(CheckBlock(b, refs, &children));
    if (m.state == BlockState::kCached) cached[m.format] += 1;
    indexed += m.indexed ? 1 : 0;
    owned[m.format] += 1;
  }
  if (free_blocks != blocks_.free_count() || blocks_.CountFreeList() != free_blocks) {
    return Violation("the block free list disagrees with block states");
  }
  if (indexed != index_.size()) {
    return Violation(absl::StrCat("index holds ", index_.size(), " blocks, ", indexed, " indexed"));
  }
  // Leaf-first: exactly the cached blocks without indexed children are evictable.
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.state != BlockState::kFree && m.children != children[b]) {
      return Violation(absl::StrCat("block ", b, " counts ", m.children, " children, has ", children[b]));
    }
    const bool leaf = m.state == BlockState::kCached && m.children == 0;
    if (evictor_.Contains(b) != leaf) {
      return Violation(absl::StrCat("block ", b, (leaf ? " is a cached leaf but not evictable"
                                                       : " is evictable but not a cached leaf")));
    }
  }
  KVTIER_RETURN_IF_ERROR(evictor_.CheckConsistency());
  for (int f = 0; f < formats; ++f) {
    if (cached[f] != cached_by_format_[f]) return Violation(absl::StrCat("format ", f, " cached count"));
  }
  return pages_->CheckConsistency(owned);
}

}  // namespace kvtier
