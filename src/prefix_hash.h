// Block identity for prefix sharing: a hash chain over full blocks of tokens.
//
// The hash of a block is XXH3-64 (xxHash >= 0.8.0, seed 0, whose output is frozen) of the
// byte string
//
//   le64(parent_hash) || le64(extra_key) || le32(tokens[0]) || ... || le32(tokens[n - 1])
//
// where leN is the N-bit little-endian encoding on every host. It is therefore the same in
// every process, on every machine and across restarts, and can be published to routers (unlike
// absl::Hash, which is seeded per process). A block's hash covers its whole prefix through
// `parent_hash`; `extra_key` separates otherwise identical tokens that must not share KV
// (LoRA adapter, multimodal input, cache salt); 0 means none.
//
// Thread-safe (pure functions). Never allocates for spans of at most kMaxStackTokens tokens.
#ifndef KVTIER_SRC_PREFIX_HASH_H_
#define KVTIER_SRC_PREFIX_HASH_H_

#include <cstdint>

#include "absl/types/span.h"

namespace kvtier {

// The parent hash of the first block of a sequence.
inline constexpr uint64_t kRootParentHash = 0;

// Longest span serialized into a stack buffer; longer ones (geometry.block_tokens may be up
// to 1024) go through a heap buffer, with the same result.
inline constexpr size_t kMaxStackTokens = 256;

// The identity of a block whose prefix has identity `parent_hash` (kRootParentHash for the
// first block) and whose tokens are `tokens`.
uint64_t HashBlock(uint64_t parent_hash, absl::Span<const int32_t> tokens, uint64_t extra_key);

// XXH3-64 of le32(tokens[0]) || ... alone, with no parent or extra key: the baseline cost of
// hashing tokens, through the same code as HashBlock.
uint64_t HashTokens(absl::Span<const int32_t> tokens);

}  // namespace kvtier

#endif  // KVTIER_SRC_PREFIX_HASH_H_
