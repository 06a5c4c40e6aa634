// CacheImpl::CheckConsistency: the invariants that tests run after every operation.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

absl::Status Violation(absl::string_view what) {
  return absl::InternalError(absl::StrCat("consistency: ", what));
}

}  // namespace

absl::Status CacheImpl::CheckConsistency() const {
  MutexLock lock(&mu_);
  const int64_t s = options_.geometry.block_tokens;

  // Reference counts equal references from sequences; sequences are well formed.
  std::vector<uint32_t> refs(blocks_.capacity(), 0);
  int64_t tokens = 0;
  for (uint32_t index = 0; index < sequences_.num_slots(); ++index) {
    const Sequence& seq = sequences_.slot(index);
    if (seq.generation == 0) continue;
    tokens += seq.num_tokens;
    const int64_t want_blocks = (seq.num_tokens + s - 1) / s;
    if (static_cast<int64_t>(seq.blocks.size()) != want_blocks) {
      return Violation(absl::StrCat("sequence ", index, " has ", seq.blocks.size(),
                                    " blocks for ", seq.num_tokens, " tokens"));
    }
    for (size_t i = 0; i < seq.blocks.size(); ++i) {
      const uint32_t b = seq.blocks[i];
      refs[b] += 1;
      const BlockMeta& m = blocks_[b];
      const int64_t want_tokens = std::min<int64_t>(s, seq.num_tokens - static_cast<int64_t>(i) * s);
      if (m.state != BlockState::kInUse || m.num_tokens != want_tokens) {
        return Violation(absl::StrCat("sequence ", index, " block ", i, " (", b,
                                      ") is not in use with ", want_tokens, " tokens"));
      }
      if (m.num_tokens < s && m.format != 0) {
        return Violation(absl::StrCat("partial block ", b, " is not in the hot format"));
      }
    }
  }
  if (tokens != tokens_) return Violation(absl::StrCat("token count ", tokens_, " != ", tokens));

  // Every block in exactly one state; live blocks own exactly their page.
  uint32_t free_blocks = 0, indexed = 0;
  std::vector<uint32_t> owned(num_formats(), 0), cached(num_formats(), 0);
  std::vector<uint32_t> children(blocks_.capacity(), 0);
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    const BlockMeta& m = blocks_[b];
    switch (m.state) {
      case BlockState::kFree:
        free_blocks += 1;
        if (refs[b] != 0) return Violation(absl::StrCat("free block ", b, " is referenced"));
        continue;
      case BlockState::kInUse:
        if (m.ref_count == 0 || m.ref_count != refs[b]) {
          return Violation(absl::StrCat("block ", b, " ref_count ", m.ref_count, " but ", refs[b],
                                        " references"));
        }
        break;
      case BlockState::kCached:
        if (m.ref_count != 0 || refs[b] != 0 || !m.indexed) {
          return Violation(absl::StrCat("cached block ", b, " is referenced or not indexed"));
        }
        cached[m.format] += 1;
        break;
    }
    // Prefix index: an indexed block is found under its hash; its parent counts it.
    if (m.indexed) {
      indexed += 1;
      if (index_.Find(m.hash) != b) return Violation(absl::StrCat("block ", b, " is not in the index"));
      if (m.parent != BlockTable::kNone) {
        if (!blocks_[m.parent].indexed) {
          return Violation(absl::StrCat("block ", b, "'s parent is not indexed"));
        }
        children[m.parent] += 1;
      }
    }
    if (m.format >= num_formats()) return Violation(absl::StrCat("block ", b, " has no format"));
    const PagePool& pool = pools_[m.format];
    if (m.page >= pool.capacity_pages() || pool.Owner(m.page) != b ||
        !pool.IsMapped(pool.SlotOfPage(m.page))) {
      return Violation(absl::StrCat("block ", b, " does not own page ", m.page, " in a mapped slab"));
    }
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
  for (int f = 0; f < num_formats(); ++f) {
    if (cached[f] != cached_by_format_[f]) return Violation(absl::StrCat("format ", f, " cached count"));
  }

  // Per pool: free + owned + pending = mapped capacity, and slabs add up to the budget.
  std::vector<uint32_t> pending(num_formats(), 0);
  for (const ReclaimQueue::Entry& e : reclaim_.entries()) {
    pending[e.format] += 1;
    if (pools_[e.format].Owner(e.page) != PagePool::kPending) {
      return Violation(absl::StrCat("page ", e.page, " awaits reclamation but is owned"));
    }
  }
  uint32_t slabs = free_slabs_;
  for (int f = 0; f < num_formats(); ++f) {
    const PagePool& pool = pools_[f];
    KVTIER_RETURN_IF_ERROR(pool.CheckConsistency());
    if (pool.free_pages() + owned[f] + pending[f] != pool.mapped_pages()) {
      return Violation(absl::StrCat("format ", f, ": free ", pool.free_pages(), " + owned ",
                                    owned[f], " + pending ", pending[f], " != mapped ",
                                    pool.mapped_pages()));
    }
    slabs += pool.mapped_slots();
  }
  if (slabs != num_slabs_) {
    return Violation(absl::StrCat("slabs: ", slabs, " accounted of ", num_slabs_));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
