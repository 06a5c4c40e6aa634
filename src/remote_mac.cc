#include "src/remote_mac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <memory>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

struct CipherContextDeleter {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};

// Binds the key to this use: the same secret used elsewhere gives another key.
constexpr absl::string_view kKeyLabel("kvtier remote MAC v1", 21);  // with its NUL

}  // namespace

absl::StatusOr<RemoteMac> RemoteMac::Create(absl::string_view secret) {
  if (secret.size() < kMinSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("remote_secret is ", secret.size(),
                                                   " bytes; at least ", kMinSecretBytes,
                                                   " random bytes are needed"));
  }
  std::string input(kKeyLabel);
  input.append(secret.data(), secret.size());
  std::array<uint8_t, 32> key;
  unsigned int length = 0;
  const bool hashed = EVP_Digest(input.data(), input.size(), key.data(), &length, EVP_sha256(),
                                 nullptr) == 1 &&
                      length == key.size();
  OPENSSL_cleanse(input.data(), input.size());
  if (!hashed) return absl::InternalError("SHA-256 of the remote secret failed");
  return RemoteMac(key);
}

bool RemoteMac::Tag(absl::string_view data, const uint8_t* nonce, uint8_t* tag) const {
  std::unique_ptr<EVP_CIPHER_CTX, CipherContextDeleter> ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) != 1 ||
      EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, key_.data(), nonce) != 1) {
    return false;
  }
  // All of it associated data, in pieces that fit the API's int lengths.
  for (size_t at = 0; at < data.size();) {
    const int piece = static_cast<int>(std::min<size_t>(data.size() - at, INT_MAX / 2));
    int out = 0;
    if (EVP_EncryptUpdate(ctx.get(), nullptr, &out,
                          reinterpret_cast<const uint8_t*>(data.data()) + at, piece) != 1) {
      return false;
    }
    at += piece;
  }
  uint8_t none[16];
  int out = 0;
  return EVP_EncryptFinal_ex(ctx.get(), none, &out) == 1 && out == 0 &&
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
