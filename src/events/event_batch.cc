#include "src/events/event_batch.h"

#include <msgpack.hpp>

#include <cstring>
#include <utility>

#include "src/prefix_hash.h"

namespace kvtier {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackString(Packer& pk, const char* s, size_t n) {
  pk.pack_str(static_cast<uint32_t>(n));
  pk.pack_str_body(s, static_cast<uint32_t>(n));
}

void PackString(Packer& pk, const char* s) { PackString(pk, s, std::strlen(s)); }

void PackHashes(Packer& pk, const std::vector<uint64_t>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) pk.pack_uint64(h);
}

void PackEvent(Packer& pk, const KvEvent& e, int32_t block_size,
               absl::Span<const std::string> format_names) {
  switch (e.kind) {
    case KvEvent::Kind::kStored:
      pk.pack_array(7);
      PackString(pk, "BlockStored");
      PackHashes(pk, e.hashes);
      if (e.parent_hash == kRootParentHash) {
        pk.pack_nil();
      } else {
        pk.pack_uint64(e.parent_hash);
      }
      pk.pack_array(static_cast<uint32_t>(e.tokens.size()));
      for (int32_t t : e.tokens) pk.pack_int32(t);
      pk.pack_int32(block_size);
      pk.pack_nil();  // lora_id: adapters are in the hash's extra key
      PackString(pk, MediumName(e.medium));
      return;
    case KvEvent::Kind::kRemoved:
      pk.pack_array(3);
      PackString(pk, "BlockRemoved");
      PackHashes(pk, e.hashes);
      PackString(pk, MediumName(e.medium));
      return;
    case KvEvent::Kind::kFormatChanged: {
      pk.pack_array(4);
      PackString(pk, "BlockFormatChanged");
      PackHashes(pk, e.hashes);
      PackString(pk, MediumName(e.medium));
      const std::string& name = format_names[e.format];
      PackString(pk, name.data(), name.size());
      return;
    }
    case KvEvent::Kind::kAllCleared:
      pk.pack_array(1);
      PackString(pk, "AllBlocksCleared");
      return;
  }
}

}  // namespace

KvEvent* EventBatchBuilder::Extend(KvEvent::Kind kind, Medium medium, bool mergeable) {
  if (mergeable && !events_.empty() && events_.back().kind == kind &&
      events_.back().medium == medium) {
    return &events_.back();
  }
  events_.emplace_back();
  events_.back().kind = kind;
  events_.back().medium = medium;
  return &events_.back();
}

void EventBatchBuilder::Stored(Medium medium, uint64_t hash, uint64_t parent_hash,
                               absl::Span<const int32_t> tokens) {
  const bool chains = !events_.empty() && !events_.back().hashes.empty() &&
                      events_.back().hashes.back() == parent_hash;
  KvEvent* e = Extend(KvEvent::Kind::kStored, medium, chains);
  if (e->hashes.empty()) e->parent_hash = parent_hash;
  e->hashes.push_back(hash);
  e->tokens.insert(e->tokens.end(), tokens.begin(), tokens.end());
}

void EventBatchBuilder::Removed(Medium medium, uint64_t hash) {
  Extend(KvEvent::Kind::kRemoved, medium, true)->hashes.push_back(hash);
}

void EventBatchBuilder::FormatChanged(Medium medium, uint64_t hash, int format) {
  const bool same = !events_.empty() && events_.back().format == format;
  KvEvent* e = Extend(KvEvent::Kind::kFormatChanged, medium, same);
  e->format = format;
  e->hashes.push_back(hash);
}

void EventBatchBuilder::AllBlocksCleared() {
  Extend(KvEvent::Kind::kAllCleared, Medium::kDevice, false);
}

std::vector<KvEvent> EventBatchBuilder::Take() {
  std::vector<KvEvent> out = std::move(events_);
  events_.clear();
  return out;
}

std::string EncodeBatch(double ts, absl::Span<const KvEvent> events, int32_t block_size,
                        absl::Span<const std::string> format_names) {
  msgpack::sbuffer buffer;
  Packer pk(&buffer);
  pk.pack_array(2);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) PackEvent(pk, e, block_size, format_names);
  return std::string(buffer.data(), buffer.size());
}

}  // namespace kvtier
