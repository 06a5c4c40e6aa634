#include "src/remote_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

struct CipherContextDeleter {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};

// Labels (each with its NUL) that bind what is derived from the secret to its use here.
constexpr absl::string_view kKeyLabel("kvtier remote MAC v1", 21);
constexpr absl::string_view kKeyIdLabel("kvtier remote key id", 21);
constexpr absl::string_view kValueKeyLabel("kvtier remote value key", 24);

// SHA-256 of `label` followed by `secret` into out[32]; false when it fails.
bool LabelledHash(absl::string_view label, absl::string_view secret, uint8_t* out) {
  std::string input(label);
  input.append(secret.data(), secret.size());
  unsigned int length = 0;
  const bool hashed =
      EVP_Digest(input.data(), input.size(), out, &length, EVP_sha256(), nullptr) == 1 &&
      length == 32;
  OPENSSL_cleanse(input.data(), input.size());
  return hashed;
}

}  // namespace

absl::StatusOr<RemoteMac> RemoteMac::Create(absl::string_view secret) {
  if (secret.size() < kMinSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a secret of ", secret.size(),
                                                   " bytes; at least ", kMinSecretBytes,
                                                   " random bytes are needed"));
  }
  std::array<uint8_t, 32> key;
  if (!LabelledHash(kKeyLabel, secret, key.data())) {
    return absl::InternalError("SHA-256 of the remote secret failed");
  }
  RemoteMac mac(key);
  OPENSSL_cleanse(key.data(), key.size());
  return mac;
}

uint64_t RemoteMac::KeyId(absl::string_view secret) {
  uint8_t hash[32] = {};
  LabelledHash(kKeyIdLabel, secret, hash);  // all zero if it failed: still one id per cache
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id |= uint64_t{hash[i]} << (8 * i);  // little-endian
  return id;
}

RemoteMac::~RemoteMac() { OPENSSL_cleanse(key_.data(), key_.size()); }

bool RemoteMac::Tag(absl::string_view data, const uint8_t* nonce, uint8_t* tag) const {
  // The value's own key: HMAC-SHA-256 of the label and the nonce under the secret's key.
  uint8_t input[kValueKeyLabel.size() + kNonceBytes];
  std::memcpy(input, kValueKeyLabel.data(), kValueKeyLabel.size());
  std::memcpy(input + kValueKeyLabel.size(), nonce, kNonceBytes);
  uint8_t value_key[32];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), input, sizeof(input),
           value_key, &length) == nullptr ||
      length != sizeof(value_key)) {
    return false;
  }
  // Each key tags one value: the GCM nonce can be fixed.
  static constexpr uint8_t kGcmNonce[12] = {};
  std::unique_ptr<EVP_CIPHER_CTX, CipherContextDeleter> ctx(EVP_CIPHER_CTX_new());
  bool ok = ctx != nullptr &&
            EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, sizeof(kGcmNonce),
                                nullptr) == 1 &&
            EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, value_key, kGcmNonce) == 1;
  OPENSSL_cleanse(value_key, sizeof(value_key));
  // All of it associated data, in pieces that fit the API's int lengths.
  for (size_t at = 0; ok && at < data.size();) {
    const int piece = static_cast<int>(std::min<size_t>(data.size() - at, INT_MAX / 2));
    int out = 0;
    ok = EVP_EncryptUpdate(ctx.get(), nullptr, &out,
                           reinterpret_cast<const uint8_t*>(data.data()) + at, piece) == 1;
    at += piece;
  }
  uint8_t none[16];
  int out = 0;
  return ok && EVP_EncryptFinal_ex(ctx.get(), none, &out) == 1 && out == 0 &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) == 1;
}

absl::Status RemoteMac::Sign(std::string* value) const {
  uint8_t trailer[kTrailerBytes];
  if (RAND_bytes(trailer, kNonceBytes) != 1) {
    return absl::InternalError("no random nonce for a remote value's MAC");
  }
  if (!Tag(*value, trailer, trailer + kNonceBytes)) {
    return absl::InternalError("AES-256-GCM failed on a remote value's MAC");
  }
  value->append(reinterpret_cast<const char*>(trailer), kTrailerBytes);
  return absl::OkStatus();
}

bool RemoteMac::Verify(absl::string_view value) const {
  if (value.size() < kTrailerBytes) return false;
  const absl::string_view data = value.substr(0, value.size() - kTrailerBytes);
  const auto* trailer = reinterpret_cast<const uint8_t*>(value.data() + data.size());
  uint8_t tag[kTagBytes];
  return Tag(data, trailer, tag) && CRYPTO_memcmp(tag, trailer + kNonceBytes, kTagBytes) == 0;
}

}  // namespace kvtier
