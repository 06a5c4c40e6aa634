// Every logical block and the page it owns: block metadata, the prefix index of full blocks,
// the cached (unreferenced, indexed) blocks and their leaf-first eviction, and room-making for
// new pages over the page store. What the cache asks of it is in block terms: a new block in a
// format, a reference dropped to zero, a block published under its hash, found by its hash, or
// moved to a colder page; the cache keeps sequences, sharing and policy.
//
// States (design.md): free; in use (referenced by sequences); cached (unreferenced, indexed,
// evictable once no indexed child is cached or in use). Each indexed block knows its indexed
// parent and counts its indexed children, so eviction is leaf-first and O(1).
//
// Thread-compatible: the cache's mutex guards it.
#ifndef KVTIER_SRC_BLOCK_POOL_H_
#define KVTIER_SRC_BLOCK_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/stats.h"
#include "src/block_table.h"
#include "src/cache_metrics.h"
#include "src/evictor.h"
#include "src/page_store.h"
#include "src/prefix_index.h"

namespace kvtier {

class BlockPool {
 public:
  static constexpr uint32_t kNone = BlockTable::kNone;

  // `pages` and `metrics` must outlive the pool.
  BlockPool(PageStore* pages, CacheMetrics* metrics);

  BlockTable& blocks() { return blocks_; }
  const BlockTable& blocks() const { return blocks_; }
  BlockMeta& operator[](uint32_t block) { return blocks_[block]; }
  const BlockMeta& operator[](uint32_t block) const { return blocks_[block]; }

  // Makes `count` pages of `format` allocatable, mapping slabs from the budget, taking empty
  // slabs from other formats' pools, and, when `may_evict`, evicting cached blocks (leaf-first)
  // when neither suffices. ResourceExhausted, with nothing evicted or changed, when evicting
  // every evictable block could not make room.
  absl::Status EnsureFreePages(int format, uint32_t count, bool may_evict = true);

  // A new in-use block with one reference and a page of `format`, born at `now_ms`.
  // REQUIRES: EnsureFreePages(format, 1) passed.
  uint32_t NewBlock(int format, uint32_t now_ms);
  // The last reference to `block` was dropped by a sequence of eviction level `priority`
  // whose level lapses at step `expires_at`: an indexed block becomes cached (evictable when it
  // is a leaf); any other block is freed.
  void Unreferenced(uint32_t block, int priority, int64_t expires_at);
  // Takes a reference to `block`, found in the index; a cached block is in use again.
  void Reference(uint32_t block);

  // The indexed block whose prefix hash is `hash`, or kNone.
  uint32_t Find(uint64_t hash) const { return index_.Find(hash); }
  // Indexes the full block `block` under `hash`, child of the block indexed under
  // `parent_hash` (kRootParentHash for the first block). False, with nothing changed, when equal
  // content is already indexed: the block stays private.
  bool Publish(uint32_t block, uint64_t hash, uint64_t parent_hash);

  // Points `block` at `page` of the colder `format` and retires its old page.
  void MoveToPage(uint32_t block, int format, uint32_t page);

  // Writes the block, eviction and index fields of `stats` (after PageStore::Fill).
  void Fill(CacheStats* stats) const;
  // Checks block states against `refs` (references from sequences, per block), the index, the
  // leaf-first evictor and the pages each block owns.
  absl::Status CheckConsistency(absl::Span<const uint32_t> refs) const;

 private:
  // Evicts one cached leaf; false when none is evictable.
  bool EvictOne();
  // Retires a block's page and frees its metadata.
  void FreeBlock(uint32_t block);
  // Pages of `format` that evicting every evictable cached block and reclaiming every retired
  // page would make allocatable (exact). Cost: O(blocks + mapped pages); only on the way to
  // eviction.
  uint64_t RoomAfterEvictingAll(int format) const;
  absl::Status CheckBlock(uint32_t b, absl::Span<const uint32_t> refs,
                          std::vector<uint32_t>* children) const;

  PageStore* const pages_;
  CacheMetrics* const metrics_;
  BlockTable blocks_;
  PrefixIndex index_;
  Evictor evictor_;
  std::vector<uint32_t> cached_by_format_;  // [format]
};

}  // namespace kvtier

#endif  // KVTIER_SRC_BLOCK_POOL_H_
