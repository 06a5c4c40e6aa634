// vLLM's prefix-caching block hash with `--prefix-caching-hash-algo sha256_cbor`, so that KV
// events can name blocks as a vLLM instance does (docs/events.md, "Block hashes").
//
// vLLM chains  hash(block) = sha256(canonical CBOR of (parent hash, tuple(token ids),
// extra_keys)), from the root NONE_HASH = sha256(canonical CBOR of the string PYTHONHASHSEED).
// The events carry the uint64 that vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
// the digest's last 8 bytes, big-endian.
//
// Thread-safe (immutable after construction).
#ifndef KVTIER_SRC_EVENTS_VLLM_BLOCK_HASH_H_
#define KVTIER_SRC_EVENTS_VLLM_BLOCK_HASH_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "src/events/sha256.h"

namespace kvtier {

class VllmBlockHasher {
 public:
  // `seed`: the PYTHONHASHSEED of the vLLM processes to match.
  explicit VllmBlockHasher(const std::string& seed);

  // NONE_HASH, the parent of a first block.
  const Sha256Digest& root() const { return root_; }

  // The hash of a block of `tokens` chained from `parent`. `extra_key` 0 hashes as vLLM's
  // extra_keys None; another value as the one-element tuple (extra_key,).
  Sha256Digest Block(const Sha256Digest& parent, absl::Span<const int32_t> tokens,
                     uint64_t extra_key) const;

 private:
  Sha256Digest root_;
};

// The uint64 vLLM's events carry for `hash` (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
uint64_t VllmEventHash(const Sha256Digest& hash);

}  // namespace kvtier

#endif  // KVTIER_SRC_EVENTS_VLLM_BLOCK_HASH_H_
