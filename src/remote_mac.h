// The keyed MAC of remote values (Options::remote_secret, docs/tiers.md "Trust"): AES-256-GCM's
// tag over a value as associated data (GMAC, nothing encrypted) under a key of the value's own,
// HMAC-SHA-256 of a random 192-bit nonce under the secret's key (SHA-256 of a label and the
// secret). A signed value ends with a trailer of the nonce and the tag; only a holder of the
// secret can make one that verifies. A key per value keeps GMAC's one weakness, a nonce used
// twice under one key (which gives its hash key away), out of reach: 192-bit nonces repeat
// with a chance under 2^-96 even after 2^48 values.
//
// Thread-safe (the key is immutable; each call uses contexts of its own).
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
  static constexpr size_t kNonceBytes = 24;
  static constexpr size_t kTagBytes = 16;
  static constexpr size_t kTrailerBytes = kNonceBytes + kTagBytes;  // nonce, then tag
  static constexpr size_t kMinSecretBytes = 16;

  // InvalidArgument for a secret shorter than kMinSecretBytes.
  static absl::StatusOr<RemoteMac> Create(absl::string_view secret);
  // Names the secret without saying it (8 bytes of SHA-256 of another label and the secret),
  // so that caches of different secrets use different Redis keys (RemoteIdentity).
  static uint64_t KeyId(absl::string_view secret);

  RemoteMac(const RemoteMac&) = default;
  RemoteMac& operator=(const RemoteMac&) = default;
  ~RemoteMac();  // wipes the key

  // Appends a trailer that authenticates every byte of *value. Internal when the random
  // source or the cipher fails, *value then unchanged.
  absl::Status Sign(std::string* value) const;
  // Whether `value` ends with a trailer this secret made over the bytes before it. Compares the
  // tag in constant time.
  bool Verify(absl::string_view value) const;

 private:
  explicit RemoteMac(const std::array<uint8_t, 32>& key) : key_(key) {}
  // The tag of `data` under `nonce` (kNonceBytes); false when a primitive fails.
  bool Tag(absl::string_view data, const uint8_t* nonce, uint8_t* tag) const;

  std::array<uint8_t, 32> key_;
};

// Bytes a value signed by `mac` carries after its payload: its trailer, none without a MAC.
inline size_t TrailerBytes(const RemoteMac* mac) {
  return mac != nullptr ? RemoteMac::kTrailerBytes : 0;
}

}  // namespace kvtier

#endif  // KVTIER_SRC_REMOTE_MAC_H_
