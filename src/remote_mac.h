// The keyed MAC of remote values (Options::remote_secret, docs/tiers.md "Trust"): AES-256-GCM's
// tag over a value as associated data (GMAC, nothing encrypted), under a key derived from the
// secret by SHA-256, with a fresh random 96-bit nonce per value. A signed value ends with a
// trailer of the nonce and the tag; only a holder of the secret can make one that verifies.
// Random nonces bound the values one secret may sign: 2^32 keeps the chance of a repeated
// nonce under 2^-32 (rotate the secret before that many blocks are written under it).
//
// Thread-safe (the key is immutable; each call uses a cipher context of its own).
#ifndef KVTIER_SRC_REMOTE_MAC_H_
#define KVTIER_SRC_REMOTE_MAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier {

class RemoteMac {
 public:
  static constexpr size_t kNonceBytes = 12;
  static constexpr size_t kTagBytes = 16;
  static constexpr size_t kTrailerBytes = kNonceBytes + kTagBytes;  // nonce, then tag
  static constexpr size_t kMinSecretBytes = 16;

  // InvalidArgument for a secret shorter than kMinSecretBytes.
  static absl::StatusOr<RemoteMac> Create(absl::string_view secret);

  // Appends a trailer that authenticates every byte of *value. Internal when the random
  // source or the cipher fails, *value then unchanged.
  absl::Status Sign(std::string* value) const;
  // Whether `value` ends with a trailer this secret made over the bytes before it. Compares the
  // tag in constant time.
  bool Verify(absl::string_view value) const;

 private:
  explicit RemoteMac(const std::array<uint8_t, 32>& key) : key_(key) {}
  // The tag of `data` under `nonce`; false when the cipher fails.
  bool Tag(absl::string_view data, const uint8_t* nonce, uint8_t* tag) const;

  std::array<uint8_t, 32> key_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_REMOTE_MAC_H_
