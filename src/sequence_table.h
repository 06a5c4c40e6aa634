// The live sequences: each an ordered list of block indices and a token count. Slots are
// reused through a free list; generations make stale SequenceIds fail.
//
// Thread-compatible.
#ifndef KVTIER_SRC_SEQUENCE_TABLE_H_
#define KVTIER_SRC_SEQUENCE_TABLE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kvtier/ids.h"
#include "kvtier/policy.h"

namespace kvtier {

struct Sequence {
  uint32_t generation = 0;  // 0 while the slot is free
  uint32_t index = 0;       // its slot: SequenceId{index, generation} names it
  int64_t num_tokens = 0;
  std::vector<uint32_t> blocks;  // block indices, in order; the last may be partial
  // Prefix identity: while `hashing`, the ids of the tail block's tokens are kept so that the
  // block can be indexed when it fills; `chain_hash` is the hash of the last full block.
  bool hashing = true;
  uint64_t chain_hash = 0;
  std::vector<int32_t> tail_tokens;
  uint64_t extra_key = 0;
  int32_t coldest_format = 0;  // per-request minimum precision (palette index)
  int32_t priority = 0;
  int64_t priority_ttl_steps = -1;
  // Policy: tier_cursor[k] blocks from the start have been considered for tier k; `dirty` while
  // the sequence is listed for the next step's policy pass.
  std::array<int64_t, kMaxPolicyTiers> tier_cursor{};
  bool dirty = false;
  // AppendBatch's plan: the tokens that batch number `planned_by` has planned for this
  // sequence so far (a sequence named twice in a batch appends after itself).
  uint64_t planned_by = 0;
  int64_t planned = 0;
};

// NotFound naming `id`: the error of every call given an unknown or released sequence.
absl::Status UnknownSequence(SequenceId id);

class SequenceTable {
 public:
  SequenceId Add();
  // The live sequence named by `id`, or nullptr when unknown or stale.
  Sequence* Find(SequenceId id);
  const Sequence* Find(SequenceId id) const;
  // REQUIRES: Find(id) != nullptr.
  void Remove(SequenceId id);

  int64_t live_count() const { return live_; }
  // Slots are numbered [0, num_slots()); a free slot has generation 0.
  uint32_t num_slots() const { return static_cast<uint32_t>(slots_.size()); }
  const Sequence& slot(uint32_t index) const { return slots_[index]; }

 private:
  std::vector<Sequence> slots_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> next_generation_;
  int64_t live_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_SEQUENCE_TABLE_H_
