// One batch of KV events in vLLM's schema, built from the block events of one step, and its
// msgpack encoding (docs/events.md has the exact layout).
//
// vLLM's KVEventBatch is a msgspec Struct with array_like=True: a batch is the array
// [ts, events], and each event a tagged array_like Struct: an array whose first element is the
// class name:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
//   ["BlockFormatChanged", block_hashes, medium, format]   kvtier's extension (opt-in)
// Consecutive events of one kind and medium merge as vLLM's do: a BlockStored run whose each
// block chains from the one before, a BlockRemoved run, a BlockFormatChanged run to one format.
//
// Thread-compatible.
#ifndef KVTIER_SRC_EVENTS_EVENT_BATCH_H_
#define KVTIER_SRC_EVENTS_EVENT_BATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "src/block_events.h"

namespace kvtier {

struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kFormatChanged, kAllCleared };
  Kind kind = Kind::kAllCleared;
  Medium medium = Medium::kDevice;
  std::vector<uint64_t> hashes;
  uint64_t parent_hash = 0;     // kStored: the parent of hashes[0] (kRootParentHash: none)
  std::vector<int32_t> tokens;  // kStored: block_size token ids per hash, in order
  int32_t format = 0;           // kFormatChanged: palette index
};

// Collects the events of one batch, merging runs.
class EventBatchBuilder {
 public:
  void Stored(Medium medium, uint64_t hash, uint64_t parent_hash,
              absl::Span<const int32_t> tokens);
  void Removed(Medium medium, uint64_t hash);
  void FormatChanged(Medium medium, uint64_t hash, int format);
  void AllBlocksCleared();

  bool empty() const { return events_.empty(); }
  // The events so far; the builder is empty after.
  std::vector<KvEvent> Take();

 private:
  // The last event when it is of `kind` and `medium`, else a new one.
  KvEvent* Extend(KvEvent::Kind kind, Medium medium, bool mergeable);

  std::vector<KvEvent> events_;
};

// The msgpack bytes of the KVEventBatch [ts, events] (ts: seconds since the Unix epoch).
// `format_names` names each palette index for BlockFormatChanged.
std::string EncodeBatch(double ts, absl::Span<const KvEvent> events, int32_t block_size,
                        absl::Span<const std::string> format_names);

}  // namespace kvtier

#endif  // KVTIER_SRC_EVENTS_EVENT_BATCH_H_
