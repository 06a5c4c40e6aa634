// Every logical block and the page it owns: block metadata, the prefix index of full blocks,
// the cached (unreferenced, indexed) blocks and their leaf-first eviction, and room-making for
// new pages over the page store. What the cache asks of it is in block terms: a new block in a
// format, a reference dropped to zero, a block published under its hash, found by its hash, or
// moved to a colder page; the cache keeps sequences, sharing and policy.
//
// States (design.md): free; in use (referenced by sequences); cached (unreferenced, indexed,
// evictable once no indexed child is cached or in use on the device); offloaded (unreferenced,
// indexed, its page in the host tier, droppable once it has no indexed child in either tier).
// Each indexed block knows its indexed parent and counts its indexed children per tier, so
// eviction is leaf-first and O(1) in both tiers.
//
// Host tier (docs/tiers.md; host_tier.cc). With Options::host_tier_bytes, a cached block
// chosen for eviction is copied to a page of a second PageStore in host-tier memory (demoted
// on the way to Options::host_tier_format) and keeps its id; the host tier drops its own
// leaves by their priority and LRU when it needs room. Acquire brings offloaded blocks of a
// matched prefix back to device pages in their format.
//
// Events (block_events.h, docs/events.md). With a sink, the pool reports every indexed block
// that enters or leaves a tier, and keeps each indexed block's tokens and parent identity for
// the events of its later moves (4 x block_tokens + 16 bytes per block, only with a sink).
//
// Thread-compatible: the cache's mutex guards it.
#ifndef KVTIER_SRC_BLOCK_POOL_H_
#define KVTIER_SRC_BLOCK_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/stats.h"
#include "src/block_events.h"
#include "src/block_table.h"
#include "src/cache_metrics.h"
#include "src/evictor.h"
#include "src/page_store.h"
#include "src/prefix_index.h"

namespace kvtier {

class BlockPool {
 public:
  static constexpr uint32_t kNone = BlockTable::kNone;

  // `pages`, `backend`, `metrics` and `events` must outlive the pool. `host` is the host tier's
  // store (Memory::kHost), or null for none; `events` the event sink, or null for none.
  BlockPool(PageStore* pages, std::unique_ptr<PageStore> host, Backend* backend,
            CacheMetrics* metrics, BlockEventSink* events);

  BlockTable& blocks() { return blocks_; }
  const BlockTable& blocks() const { return blocks_; }
  BlockMeta& operator[](uint32_t block) { return blocks_[block]; }
  const BlockMeta& operator[](uint32_t block) const { return blocks_[block]; }

  // Makes `count` pages of `format` allocatable, mapping slabs from the budget, taking empty
  // slabs from other formats' pools, and, when `may_evict`, evicting cached blocks (leaf-first)
  // when neither suffices. ResourceExhausted, with nothing evicted or changed, when evicting
  // every evictable block could not make room (not counted: CacheImpl::CountRefusal counts the
  // refusals a caller sees, not those the cache absorbs).
  absl::Status EnsureFreePages(int format, uint32_t count, bool may_evict = true);
  // Pages of `format` that evicting every evictable cached block and reclaiming every retired
  // page would make allocatable (exact). Cost: O(blocks + mapped pages).
  uint64_t RoomAfterEvictingAll(int format) const;

  // A new in-use block with one reference and a page of `format`, born at `now_ms`.
  // REQUIRES: EnsureFreePages(format, 1) passed.
  uint32_t NewBlock(int format, uint32_t now_ms);
  // The last reference to `block` was dropped by a sequence of eviction level `priority`
  // whose level lapses at step `expires_at`: an indexed block becomes cached (evictable when it
  // is a leaf); any other block is freed.
  void Unreferenced(uint32_t block, int priority, int64_t expires_at);
  // Takes a reference to every block of `chain`, the blocks that a prompt matched through
  // Find, in order (each the indexed child of the one before). Offloaded blocks are first
  // brought back to device pages of their format, in one batch of copies per format and layer.
  // When that fails (no device room, a failing copy), the chain is cut before its first
  // offloaded block and the blocks from there on stay cached in their tier. Returns how many
  // leading blocks of `chain` are now referenced; adds the blocks brought back to *onloaded
  // and sets *ready_fence to the fence their copies complete by (0 when there were none).
  size_t Acquire(absl::Span<const uint32_t> chain, int64_t* onloaded, uint64_t* ready_fence);

  // The indexed block whose prefix hash is `hash`, or kNone.
  uint32_t Find(uint64_t hash) const { return index_.Find(hash); }
  // PrefixIndex::Prefetch: before hashing the next block of a prompt, for the lookup after.
  void PrefetchIndex(uint64_t hash) const { index_.Prefetch(hash); }
  // Takes `block`, indexed and without indexed children, out of the prefix index (a Removed
  // event), so that no prompt matches it again: unreferenced, it is freed; in use, it stays
  // with its sequences as a private block. Cache::Abandon's, for blocks whose K/V was never
  // written.
  void Withdraw(uint32_t block);
  // Indexes the full block `block`, whose token ids are `tokens`, under `hash`, child of the
  // block indexed under `parent_hash` (kRootParentHash for the first block); `extra_key` is
  // its sequence's (part of `hash`, kept for the events). False, with nothing changed, when
  // equal content is already indexed: the block stays private.
  bool Publish(uint32_t block, uint64_t hash, uint64_t parent_hash, uint64_t extra_key,
               absl::Span<const int32_t> tokens);

  // Points `block` at `page` of `format` (colder, or its own when compaction moves it) and
  // retires its old page.
  void MoveToPage(uint32_t block, int format, uint32_t page);

  // Closes the host tier's step (PageStore::EndStep); OK without a host tier.
  absl::Status EndStep();
  // Sets the per-tensor scales of `layer` in both tiers. FailedPrecondition, with nothing
  // changed, when either tier holds pages of a format with a per-tensor scale.
  absl::Status SetTensorScales(int layer, float k_amax, float v_amax);

  // Every indexed block: its identity, tier and format (Cache::IndexedBlocks).
  std::vector<IndexedBlock> IndexedBlocks() const;

  // Writes the block, eviction, index and host-tier gauge fields of `stats` (after
  // PageStore::Fill and CacheMetrics::Fill).
  void Fill(CacheStats* stats) const;
  // Checks block states against `refs` (references from sequences, per block), the index, the
  // leaf-first evictor and the pages each block owns.
  absl::Status CheckConsistency(absl::Span<const uint32_t> refs) const;

 private:
  // Offloads, or else drops, one cached device leaf; false when none is evictable.
  bool EvictOne();
  // Takes a reference to `block`; a cached block is in use again.
  void Reference(uint32_t block);
  // Undoes Reference, or the pinning of an offloaded block; a block that becomes unreferenced
  // again keeps its priority and expiry and is the most recent of its level.
  void Unpin(uint32_t block);
  // Makes an unreferenced indexed block cached (or offloaded when `state` says so) and
  // evictable in its tier when it is a leaf there.
  void MakeCached(uint32_t block, BlockState state);
  // Removes an unreferenced block from the index and frees it (either tier).
  void Drop(uint32_t block);
  // Drop's and Withdraw's first half: `block` leaves the index, its tier's evictor and its
  // parent's children (a Removed event).
  void Unlink(uint32_t block);
  // Puts `block` into the evictor of its tier when its counts just made it a leaf there.
  void Relink(uint32_t block);
  // Retires a block's page (in its tier) and frees its metadata.
  void FreeBlock(uint32_t block);
  // Events (block_events.h): a Stored event for `block` in `medium` (and FormatChanged when it
  // is not in palette[0]); a Removed event. Nothing without a sink.
  void EmitStored(uint32_t block, Medium medium);
  void EmitRemoved(const BlockMeta& m, Medium medium) {
    if (events_ != nullptr) events_->Removed(medium, m.hash);
  }
  static Medium MediumOf(const BlockMeta& m) {
    return m.state == BlockState::kOffloaded ? Medium::kHost : Medium::kDevice;
  }
  PageStore& StoreOf(const BlockMeta& m) {
    return m.state == BlockState::kOffloaded ? *host_ : *pages_;
  }

  // Host tier (host_tier.cc).
  // Moves the cached device leaf `block` to a page of the host tier; false, with nothing
  // changed, when the host tier has no room for it. Its copy waits in `offloads_` (the block
  // pinned, outside both evictors) until FlushOffloads.
  bool Offload(uint32_t block);
  // Issues the waiting offload copies, one batch per pair of formats, and makes their blocks
  // evictable in the host tier; a block whose copy fails is dropped with its offloaded
  // descendants.
  void FlushOffloads();
  // Drops the offloaded blocks below the cached device block `block`, for dropping it.
  void DropOffloadedDescendants(uint32_t block);
  // Makes one page of `format` allocatable in the host tier, dropping offloaded leaves.
  bool MakeHostRoom(int format);
  // Brings the offloaded blocks `blocks` (pinned) back to device pages, batched by format.
  absl::Status Onload(absl::Span<const uint32_t> blocks);
  // Copies page `src[i]` of `from` to page `dst[i]` of `to` in every layer, requantising when
  // the formats differ.
  absl::Status CopyBetween(const PageStore& from, int from_format, absl::Span<const uint32_t> src,
                           const PageStore& to, int to_format, absl::Span<const uint32_t> dst);
  void FillHost(CacheStats* stats) const;
  // What one format's mapped slabs of a store would hold free once some blocks were gone.
  struct Freeable {
    uint64_t pages = 0;        // in all its mapped slabs
    uint64_t whole_slabs = 0;  // its mapped slabs every page of which would be free
    uint64_t whole_pages = 0;  // the pages of those slabs
  };
  // Per format of `store`, once the blocks `gone` marks had left it and every retired page were
  // reclaimed. Cost: O(mapped pages).
  static std::vector<Freeable> FreeableWithout(const PageStore& store,
                                               const std::vector<bool>& gone);
  // Pages of `format` that `store` could allocate once `freeable` (per format) were free: those
  // in its own slabs, and a slab's worth for each free slab or other format's slab that would
  // empty.
  static uint64_t RoomIn(const PageStore& store, const std::vector<Freeable>& freeable,
                         int format);
  // Per format of the device, once every evictable cached block were evicted. Cost: O(blocks +
  // mapped pages); only on the way to eviction.
  std::vector<Freeable> FreeableAfterEvictingAll() const;
  // Whether dropping every offloaded block that can be dropped (leaf-first; none pinned, nor
  // above a pinned one) would give the host tier room for a page of `format`. O(blocks + mapped
  // host pages).
  bool HostRoomAfterDroppingAll(int format) const;
  // Whether evicting every evictable block could give each format f of `pages_by_format`
  // (indexed by format) its count of pages at once. Sufficient, not exact: a slab is counted
  // for its format's fewest pages per slab.
  bool RoomForAllAfterEvictingAll(absl::Span<const uint32_t> pages_by_format) const;
  absl::Status CheckBlock(uint32_t b, absl::Span<const uint32_t> refs,
                          std::vector<uint32_t>* children) const;
  // Checks child counts ([2 * block + tier], counted from the blocks) and both evictors.
  absl::Status CheckLeaves(absl::Span<const uint32_t> children) const;

  PageStore* const pages_;
  const std::unique_ptr<PageStore> host_;  // null without a host tier
  Backend* const backend_;
  CacheMetrics* const metrics_;
  BlockEventSink* const events_;  // null without events
  BlockTable blocks_;
  PrefixIndex index_;
  Evictor evictor_;       // cached device leaves
  Evictor host_evictor_;  // offloaded leaves
  std::vector<uint32_t> cached_by_format_;  // [format]
  struct PendingOffload {
    uint32_t block, from_format, src_page;
  };
  std::vector<PendingOffload> offloads_;  // in order of offload; empty outside EnsureFreePages
  // [format] 1 once HostRoomAfterDroppingAll said no in the EnsureFreePages in progress.
  std::vector<int8_t> host_no_room_;
  // With events: each indexed block's tokens ([block * block_tokens]) and parent identity.
  std::vector<int32_t> event_tokens_;
  // Per block, with events on: the parent hash and extra key its Stored events carry.
  struct EventOrigin {
    uint64_t parent_hash = 0;
    uint64_t extra_key = 0;
  };
  std::vector<EventOrigin> event_origins_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_BLOCK_POOL_H_
