// The host tier of BlockPool (block_pool.h, docs/tiers.md): offload of cached device leaves
// instead of eviction, leaf-first dropping of offloaded blocks, and onload of the offloaded
// blocks of a matched prefix. Copies go through the backend like every other page move: on an
// asynchronous backend a page a copy reads is retired, and reused once the fence after the copy
// has passed.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/block_pool.h"
#include "src/status_macros.h"

namespace kvtier {

absl::Status BlockPool::CopyBetween(const PageStore& from, int from_format,
                                    absl::Span<const uint32_t> src, const PageStore& to,
                                    int to_format, absl::Span<const uint32_t> dst) {
  std::vector<PoolView> from_views, to_views;
  for (int l = 0; l < pages_->options().geometry.num_layers; ++l) {
    from_views.push_back(from.View(from_format, l));
    to_views.push_back(to.View(to_format, l));
  }
  if (from_format == to_format) return backend_->CopyPages(from_views, to_views, src, dst);
  return backend_->Requantize(from_views, to_views, src, dst);
}

bool BlockPool::MakeHostRoom(int format) {
  bool room_checked = false;
  while (host_->SlabsNeeded(format, 1) > host_->AvailableSlabs(format)) {
    const uint32_t victim = host_evictor_.PopVictim(metrics_->steps);
    if (victim == Evictor::kNone) return false;
    // A victim of `format` frees a page of it; one of another format helps only if its slab
    // empties: before the first such drop, check that dropping all could make room at all. A
    // "no" holds for the rest of the EnsureFreePages (its offloads are pinned until it ends),
    // so it is asked once there, not once per offload.
    int8_t& no_room = host_no_room_[format];
    if (blocks_[victim].format != format && !room_checked) {
      room_checked = true;
      if (no_room == 0 && !HostRoomAfterDroppingAll(format)) no_room = 1;
      if (no_room == 1) {
        host_evictor_.AddColdest(victim, blocks_[victim].priority, blocks_[victim].expires_at);
        return false;
      }
    }
    metrics_->host.evicted_blocks += 1;
    Drop(victim);  // its host page is free at once (page_store.h)
  }
  return host_->MapSlabs(format, 1).ok();
}

bool BlockPool::Offload(uint32_t block) {
  BlockMeta& m = blocks_[block];
  // Demoted on the way down when the strictest sharer allows it.
  const int wanted = pages_->options().host_tier_format;
  const int format = wanted > m.format && wanted <= m.coldest_format ? wanted : m.format;
  const bool room = MakeHostRoom(format);
  // Dropping its offloaded descendants may have made the block a leaf again.
  if (evictor_.Contains(block)) evictor_.Remove(block);
  if (!room) {
    metrics_->host.offload_failures += 1;
    return false;
  }
  // The device page stays retired (unreused) until the copy has run: ReclaimAll waits for it.
  offloads_.push_back({block, m.format, m.page});
  EmitRemoved(m, Medium::kDevice);
  pages_->Retire(m.format, m.page);
  cached_by_format_[m.format] -= 1;
  m.format = static_cast<uint8_t>(format);
  m.page = host_->Allocate(format, block);
  m.state = BlockState::kOffloaded;
  m.ref_count = 1;  // pinned, out of the host evictor, until FlushOffloads
  if (m.parent != kNone) {
    blocks_[m.parent].children -= 1;
    blocks_[m.parent].offloaded_children += 1;
    Relink(m.parent);
  }
  EmitStored(block, Medium::kHost);
  return true;
}

void BlockPool::FlushOffloads() {
  if (offloads_.empty()) return;
  // One batch of copies per (device format, host format) pair, in offload order within it.
  std::vector<size_t> order(offloads_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto pair_of = [&](size_t i) {
    return std::make_pair(offloads_[i].from_format, uint32_t{blocks_[offloads_[i].block].format});
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return pair_of(a) < pair_of(b); });
  std::vector<bool> failed(offloads_.size(), false);
  for (size_t start = 0, end; start < order.size(); start = end) {
    std::vector<uint32_t> src, dst;
    for (end = start; end < order.size() && pair_of(order[end]) == pair_of(order[start]); ++end) {
      src.push_back(offloads_[order[end]].src_page);
      dst.push_back(blocks_[offloads_[order[end]].block].page);
    }
    const auto [from, to] = pair_of(order[start]);
    if (!CopyBetween(*pages_, static_cast<int>(from), src, *host_, static_cast<int>(to), dst).ok()) {
      for (size_t i = start; i < end; ++i) failed[order[i]] = true;
    }
  }
  const int64_t layers = pages_->options().geometry.num_layers;
  for (size_t i = 0; i < offloads_.size(); ++i) {
    const uint32_t b = offloads_[i].block;
    blocks_[b].ref_count = 0;
    MakeCached(b, BlockState::kOffloaded);
    if (failed[i]) continue;
    metrics_->host.offloaded_blocks += 1;
    metrics_->host.bytes_offloaded += int64_t{host_->layout(blocks_[b].format).page_bytes} * layers;
  }
  // A failed block leaves the index with its offloaded descendants (chains stay rooted);
  // children go down before their parents, so a failed parent finds them committed.
  for (size_t i = 0; i < offloads_.size(); ++i) {
    const uint32_t b = offloads_[i].block;
    if (!failed[i] || blocks_[b].state != BlockState::kOffloaded) continue;
    metrics_->host.offload_failures += 1;
    DropOffloadedDescendants(b);
    Drop(b);
  }
  offloads_.clear();
}

size_t BlockPool::Acquire(absl::Span<const uint32_t> chain, int64_t* onloaded,
                          uint64_t* ready_fence) {
  *ready_fence = 0;
  // Pin the whole chain first: making device room below may offload cached device blocks and
  // drop host leaves, and must touch neither the blocks matched nor those to bring back.
  std::vector<uint32_t> offloaded;
  size_t first_offloaded = chain.size();
  for (size_t i = 0; i < chain.size(); ++i) {
    const uint32_t b = chain[i];
    if (blocks_[b].state != BlockState::kOffloaded) {
      Reference(b);
      continue;
    }
    // A pinned offloaded block holds one reference, so that no tier's evictor takes it.
    first_offloaded = std::min(first_offloaded, i);
    offloaded.push_back(b);
    blocks_[b].ref_count = 1;
    if (host_evictor_.Contains(b)) host_evictor_.Remove(b);
  }
  if (offloaded.empty()) return chain.size();
  if (!Onload(offloaded).ok()) {
    metrics_->host.onload_failures += 1;
    for (size_t i = first_offloaded; i < chain.size(); ++i) Unpin(chain[i]);
    return first_offloaded;
  }
  *onloaded += static_cast<int64_t>(offloaded.size());
  if (!backend_->synchronous()) {
    const absl::StatusOr<uint64_t> fence = backend_->RecordFence();
    // Without a fence, the next one recorded (at the latest by EndStep) covers the copies.
    *ready_fence = fence.ok() ? *fence : backend_->NextFence();
  }
  return chain.size();
}

absl::Status BlockPool::Onload(absl::Span<const uint32_t> blocks) {
  // By format, then by host page: the device pages are taken in that order, so that pages
  // consecutive in the host tier usually land consecutive on the device (long copies).
  std::vector<uint32_t> sorted(blocks.begin(), blocks.end());
  std::sort(sorted.begin(), sorted.end(), [&](uint32_t a, uint32_t b) {
    return std::make_pair(blocks_[a].format, blocks_[a].page) <
           std::make_pair(blocks_[b].format, blocks_[b].page);
  });
  auto end_of_format = [&](size_t start) {
    const uint8_t format = blocks_[sorted[start]].format;
    size_t end = start;
    while (end < sorted.size() && blocks_[sorted[end]].format == format) ++end;
    return end;
  };
  // Device pages for every block before any copy, so that no room means nothing to undo but
  // untouched pages. A format's pages are taken before the next format makes room, so that its
  // new slabs are not taken back as empty. With two formats or more, a refusal is decided
  // before any of them evicts (one format's evictions would be undone by the next's refusal).
  if (blocks_[sorted.front()].format != blocks_[sorted.back()].format) {
    std::vector<uint32_t> wanted(pages_->num_formats(), 0);
    for (uint32_t b : sorted) wanted[blocks_[b].format] += 1;
    if (!RoomForAllAfterEvictingAll(wanted)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no device room for the ", sorted.size(), " offloaded blocks of a prefix hit in ",
          "several formats, even after evicting every evictable block"));
    }
  }
  std::vector<uint32_t> src, dst;
  for (size_t start = 0, end; start < sorted.size(); start = end) {
    end = end_of_format(start);
    const int f = blocks_[sorted[start]].format;
    const absl::Status room = EnsureFreePages(f, static_cast<uint32_t>(end - start));
    if (!room.ok()) {
      for (size_t i = 0; i < dst.size(); ++i) pages_->FreeNow(blocks_[sorted[i]].format, dst[i]);
      return room;
    }
    for (size_t i = start; i < end; ++i) {
      src.push_back(blocks_[sorted[i]].page);
      dst.push_back(pages_->Allocate(f, sorted[i]));
    }
  }
  // One batch of copies per format and layer.
  for (size_t start = 0, end; start < sorted.size(); start = end) {
    end = end_of_format(start);
    const int f = blocks_[sorted[start]].format;
    const absl::Status copied =
        CopyBetween(*host_, f, absl::MakeConstSpan(src).subspan(start, end - start), *pages_, f,
                    absl::MakeConstSpan(dst).subspan(start, end - start));
    if (!copied.ok()) {
      for (size_t i = 0; i < dst.size(); ++i) pages_->Retire(blocks_[sorted[i]].format, dst[i]);
      pages_->RetireSynchronous();
      return copied;
    }
  }
  // Each block's parent is the block before it in the chain, pinned too: no evictor changes.
  const int layers = pages_->options().geometry.num_layers;
  for (size_t i = 0; i < sorted.size(); ++i) {
    BlockMeta& m = blocks_[sorted[i]];
    host_->Retire(m.format, m.page);
    m.page = dst[i];
    m.state = BlockState::kInUse;  // the pin's reference is the sequence's
    if (m.parent != kNone) {
      blocks_[m.parent].offloaded_children -= 1;
      blocks_[m.parent].children += 1;
    }
    metrics_->host.onloaded_blocks += 1;
    metrics_->host.bytes_onloaded += int64_t{pages_->layout(m.format).page_bytes} * layers;
  }
  // In chain order, so that a block's parent is stored before it.
  for (uint32_t b : blocks) {
    EmitRemoved(blocks_[b], Medium::kHost);
    EmitStored(b, Medium::kDevice);
  }
  return absl::OkStatus();
}

void BlockPool::DropOffloadedDescendants(uint32_t block) {
  // A rare path (a failing copy, or no host room): one scan finds the descendants and their
  // depths (each block's answer memoised, so O(blocks)), then the deepest go first, so that each
  // is a leaf when dropped. Offloaded blocks have only offloaded children, and none is pinned (a
  // pinned block's ancestors are in use).
  constexpr int32_t kUnknown = -2, kOutside = -1;
  std::vector<int32_t> depth(blocks_.capacity(), kUnknown);  // below `block`, or kOutside
  depth[block] = 0;
  std::vector<uint32_t> path, found;
  for (uint32_t b = 0; b < blocks_.capacity(); ++b) {
    if (blocks_[b].state != BlockState::kOffloaded || depth[b] != kUnknown) continue;
    uint32_t p = b;
    while (p != kNone && depth[p] == kUnknown && blocks_[p].state == BlockState::kOffloaded) {
      path.push_back(p);
      p = blocks_[p].parent;
    }
    int32_t d = p != kNone && depth[p] >= 0 ? depth[p] : kOutside;
    while (!path.empty()) {  // from the nearest the known answer down to b
      if (d != kOutside) {
        d += 1;
        found.push_back(path.back());
      }
      depth[path.back()] = d;
      path.pop_back();
    }
  }
  std::sort(found.begin(), found.end(),
            [&](uint32_t x, uint32_t y) { return depth[x] > depth[y]; });
  for (uint32_t b : found) {
    metrics_->host.evicted_blocks += 1;
    Drop(b);
  }
}

absl::Status BlockPool::EndStep() { return host_ != nullptr ? host_->EndStep() : absl::OkStatus(); }

absl::Status BlockPool::SetTensorScales(int layer, float k_amax, float v_amax) {
  if (host_ != nullptr) KVTIER_RETURN_IF_ERROR(host_->CheckTensorScalesFree());
  KVTIER_RETURN_IF_ERROR(pages_->SetTensorScales(layer, k_amax, v_amax));
  return host_ != nullptr ? host_->SetTensorScales(layer, k_amax, v_amax) : absl::OkStatus();
}

void BlockPool::FillHost(CacheStats* s) const {
  const int layers = pages_->options().geometry.num_layers;
  HostTierStats& h = s->host;
  h.budget_bytes = static_cast<int64_t>(pages_->options().host_tier_bytes);
  h.slabs_free = host_->free_slabs();
  h.evictable_blocks = host_evictor_.size();
  for (uint32_t i = 0; i < blocks_.capacity(); ++i) {
    const BlockMeta& b = blocks_[i];
    if (b.state != BlockState::kOffloaded) continue;
    h.blocks += 1;
    h.bytes += int64_t{host_->layout(b.format).page_bytes} * layers;
  }
}

}  // namespace kvtier
