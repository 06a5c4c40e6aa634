// The remote tier side of CacheImpl (remote_tier.h, docs/tiers.md).
//
// Pages pass through the staging slots (remote_staging.h): host memory that the backend's
// copies reach on every backend.
//
// Writes: a block that fills and is indexed (IndexFullTail) is queued; at the next EndStep,
// when the engine has written its K/V, its page of every layer is copied into a staging slot
// (a batch of them, then one wait for the device), from there behind the value header, and
// handed to the writer thread. A block freed, offloaded or re-indexed by then is skipped.
//
// Reads: AddSequence first (FetchRemote, without the mutex but for a brief look at the
// index) hashes the prompt, finds where the local match ends and looks the next blocks up in
// Redis, decoding each value against this cache's spec. Then, under the mutex, ImportRemote
// continues the local chain with them: a device page per block, its bytes copied in, the
// block published under its hash and attached like a hit. Whatever changed in between (a
// longer or shorter local match, a block now indexed, new per-tensor scales) only shortens
// the remote part.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/cache_impl.h"
#include "src/prefix_hash.h"
#include "xxhash.h"

namespace kvtier {
namespace {

bool HasTensorScale(const FormatSpec& f) {
  return f.k.scope == ScaleScope::kTensor || f.v.scope == ScaleScope::kTensor;
}

}  // namespace

RemoteBlockSpec CacheImpl::RemoteSpec() const {
  RemoteBlockSpec spec;
  spec.identity = remote_->identity();
  spec.mac = remote_->mac();
  spec.geometry = options_.geometry;
  spec.palette = options_.palette;
  for (int f = 0; f < num_formats(); ++f) {
    spec.page_bytes.push_back(pages_->layout(f).page_bytes);
    std::vector<float> scales;
    if (HasTensorScale(options_.palette[f])) {
      for (int l = 0; l < options_.geometry.num_layers; ++l) {
        const PoolView view = pages_->View(f, l);
        scales.push_back(view.k_tensor_scale);
        scales.push_back(view.v_tensor_scale);
      }
    }
    spec.scales_digest.push_back(
        scales.empty() ? 0 : XXH3_64bits(scales.data(), scales.size() * sizeof(float)));
  }
  return spec;
}

CacheImpl::RemoteFetch CacheImpl::FetchRemote(const SequenceOptions& options) {
  RemoteFetch f;
  if (remote_ == nullptr) return f;
  f.prompt = options.prompt;
  const int64_t s = options_.geometry.block_tokens;
  const int64_t n = static_cast<int64_t>(options.prompt.size());
  const int64_t matchable = n > 0 ? (n - 1) / s : 0;
  uint64_t parent = kRootParentHash;
  for (int64_t i = 0; i < matchable; ++i) {
    parent = HashBlock(parent, options.prompt.subspan(i * s, s), options.extra_key);
    f.hashes.push_back(parent);
  }
  RemoteBlockSpec spec;
  {
    MutexLock lock(&mu_);
    while (f.first < matchable && pool_.Find(f.hashes[f.first]) != BlockPool::kNone) ++f.first;
    if (f.first == matchable) return f;
    spec = RemoteSpec();
  }
  const size_t count =
      std::min<size_t>(matchable - f.first, static_cast<size_t>(options_.remote_max_fetch_blocks));
  f.values = remote_->Lookup(absl::MakeConstSpan(f.hashes).subspan(f.first, count));
  for (size_t i = 0; i < f.values.size(); ++i) {
    absl::StatusOr<DecodedBlock> block =
        DecodeRemoteBlock(spec, f.hashes[f.first + i], f.values[i]);
    if (!block.ok()) {
      remote_->Report(absl::IsDataLoss(block.status())          ? RemoteTier::kCorrupt
                      : absl::IsUnauthenticated(block.status()) ? RemoteTier::kUnauthenticated
                                                                : RemoteTier::kMismatched,
                      block.status());
      break;
    }
    f.blocks.push_back(*block);
  }
  if (f.blocks.size() < count) remote_->Count(RemoteTier::kMissedBlocks);
  f.scales_digest = std::move(spec.scales_digest);
  return f;
}

int64_t CacheImpl::ImportRemote(Sequence& seq, const RemoteFetch& fetched, int64_t matched) {
  // A local chain now shorter than when the lookup began leaves a gap before the values.
  if (remote_ == nullptr || matched < fetched.first || fetched.blocks.empty()) return 0;
  const std::vector<uint64_t> digest = RemoteSpec().scales_digest;
  int64_t imported = 0;
  for (size_t i = matched - fetched.first; i < fetched.blocks.size(); ++i) {
    const uint64_t hash = fetched.hashes[fetched.first + i];
    const DecodedBlock& block = fetched.blocks[i];
    if (block.format > seq.coldest_format || pool_.Find(hash) != BlockPool::kNone ||
        digest[block.format] != fetched.scales_digest[block.format] ||
        !ImportBlock(seq, hash, block,
                     fetched.prompt.subspan((fetched.first + i) * options_.geometry.block_tokens,
                                            options_.geometry.block_tokens))) {
      break;
    }
    imported += 1;
  }
  const int64_t s = options_.geometry.block_tokens;
  remote_->Count(RemoteTier::kHitBlocks, imported);
  remote_->Count(RemoteTier::kHitTokens, imported * s);
  return imported;
}

bool CacheImpl::ImportBlock(Sequence& seq, uint64_t hash, const DecodedBlock& block,
                            absl::Span<const int32_t> tokens) {
  const int f = block.format;
  const absl::StatusOr<uint32_t> slot = staging_->Acquire();
  absl::Status room = slot.status();
  if (room.ok()) room = pool_.EnsureFreePages(f, 1);
  if (!room.ok()) {
    remote_->Report(RemoteTier::kImportFailures, room);
    return false;
  }
  const uint32_t b = pool_.NewBlock(f, metrics_.NowMs());
  const PageLayout& layout = pages_->layout(f);
  std::vector<PoolView> from, to;
  for (int l = 0; l < options_.geometry.num_layers; ++l) {
    from.push_back(staging_->View(*slot, l, layout));
    to.push_back(pages_->View(f, l));
    std::memcpy(from.back().base, block.payload.data() + size_t{layout.page_bytes} * l,
                layout.page_bytes);
  }
  const uint32_t zero = 0;
  const absl::Status copied = backend_->CopyPages(from, to, {&zero, 1}, {&pool_[b].page, 1});
  if (!copied.ok()) {
    pool_.Unreferenced(b, 0, 0);  // not indexed: freed, its page retired
    pages_->RetireSynchronous();
    remote_->Report(RemoteTier::kImportFailures, copied);
    return false;
  }
  BlockMeta& m = pool_[b];
  m.num_tokens = static_cast<uint16_t>(options_.geometry.block_tokens);
  m.coldest_format = static_cast<uint8_t>(seq.coldest_format);
  // Cannot fail: nothing is indexed under `hash`, and the parent is in use by `seq`.
  pool_.Publish(b, hash, seq.chain_hash, seq.extra_key, tokens);
  Attach(seq, b);
  seq.chain_hash = hash;
  remote_->Count(RemoteTier::kBytesRead,
                 static_cast<int64_t>(kRemoteHeaderBytes + block.payload.size()));
  return true;
}

void CacheImpl::QueueRemoteWrite(uint32_t block, uint64_t hash) {
  if (remote_pending_.size() >= static_cast<size_t>(options_.remote_write_queue_blocks)) {
    remote_->Report(RemoteTier::kDroppedWrites,
                    absl::ResourceExhaustedError("blocks indexed in one step fill the queue"));
    return;
  }
  remote_pending_.push_back(PendingWrite{pool_.blocks().IdOf(block), hash});
}

void CacheImpl::StageRemoteWrites() {
  if (remote_pending_.empty()) return;
  // Blocks whose pages are copied into staging slots, read out once the copies are done.
  struct Staged {
    uint64_t hash;
    int format;
    uint32_t slot;
  };
  std::vector<Staged> batch;
  const RemoteBlockSpec spec = RemoteSpec();
  const int layers = options_.geometry.num_layers;
  // The lambda runs under mu_, held here; the thread-safety analysis cannot see into it.
  auto* const staging = staging_.get();
  auto* const pages = pages_.get();
  auto flush = [&](absl::Status status) {
    if (status.ok()) status = staging->Drain();
    for (const Staged& st : batch) {
      if (!status.ok()) {
        remote_->Report(RemoteTier::kDroppedWrites, status);
        continue;
      }
      const uint32_t page_bytes = pages->layout(st.format).page_bytes;
      // Room for the MAC trailer from the start: appended later, it would copy the value.
      const size_t bytes = kRemoteHeaderBytes + size_t{page_bytes} * layers;
      std::string value;
      value.reserve(bytes + TrailerBytes(spec.mac));
      value.resize(bytes);
      for (int l = 0; l < layers; ++l) {
        std::memcpy(value.data() + kRemoteHeaderBytes + size_t{page_bytes} * l,
                    staging->View(st.slot, l, pages->layout(st.format)).base, page_bytes);
      }
      SealRemoteBlock(spec, st.hash, st.format, &value);
      remote_->Put(st.hash, std::move(value));
    }
    batch.clear();
  };
  absl::Status status = staging_->Drain();  // the imports' copies, long done in practice
  for (const PendingWrite& w : remote_pending_) {
    if (!pool_.blocks().IsLive(w.id)) continue;
    const BlockMeta& m = pool_[w.id.index];
    if (!m.indexed || m.hash != w.hash || m.state == BlockState::kOffloaded) continue;
    if (batch.size() == staging_->slots()) flush(status);  // frees every slot
    uint32_t slot = 0;
    if (status.ok()) {
      const absl::StatusOr<uint32_t> acquired = staging_->Acquire();
      status = acquired.status();
      slot = acquired.value_or(0);
    }
    if (status.ok()) {
      std::vector<PoolView> from, to;
      for (int l = 0; l < layers; ++l) {
        from.push_back(pages_->View(m.format, l));
        to.push_back(staging_->View(slot, l, pages_->layout(m.format)));
      }
      const uint32_t zero = 0;
      status = backend_->CopyPages(from, to, {&m.page, 1}, {&zero, 1});
    }
    batch.push_back(Staged{w.hash, m.format, slot});
  }
  flush(status);
  remote_pending_.clear();
}

}  // namespace kvtier
