// SHA-256 (FIPS 180-4), for block hashes that must equal another engine's (vLLM's sha256_cbor).
// Not for secrets: no constant-time guarantees are needed or given.
//
// Thread-safe (a pure function).
#ifndef KVTIER_SRC_EVENTS_SHA256_H_
#define KVTIER_SRC_EVENTS_SHA256_H_

#include <array>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace kvtier {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(absl::string_view data);

}  // namespace kvtier

#endif  // KVTIER_SRC_EVENTS_SHA256_H_
