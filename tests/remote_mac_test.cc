// The keyed MAC of remote values (remote_mac.h): what it accepts and refuses, and that its
// trailer is AES-256-GCM's standard tag (a vector computed by another implementation).
#include "src/remote_mac.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace kvtier {
namespace {

constexpr absl::string_view kSecret = "0123456789abcdef0123456789abcdef";

RemoteMac Mac(absl::string_view secret = kSecret) {
  absl::StatusOr<RemoteMac> mac = RemoteMac::Create(secret);
  EXPECT_TRUE(mac.ok()) << mac.status();
  return *mac;
}

TEST(RemoteMacTest, ASecretShorterThan16BytesIsRefused) {
  EXPECT_EQ(RemoteMac::Create("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RemoteMac::Create(std::string(15, 's')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(RemoteMac::Create(std::string(16, 's')).ok());
}

// With Python's hashlib, hmac and `cryptography`: key = SHA-256(b"kvtier remote MAC v1\0" +
// secret), value_key = HMAC-SHA-256(key, b"kvtier remote value key\0" + nonce), the tag
// AESGCM(value_key).encrypt(bytes(12), b"", data); the key id the first 8 bytes of
// SHA-256(b"kvtier remote key id\0" + secret), little-endian. Engines in other languages can
// sign and verify alike.
TEST(RemoteMacTest, TheTrailerAndKeyIdAreTheSpecifiedOnes) {
  const std::string value =
      "kvtier remote value" +
      absl::HexStringToBytes("000102030405060708090a0b0c0d0e0f1011121314151617"  // nonce
                             "6380470a064b877535b906b3c27bd3fe");                // tag
  EXPECT_TRUE(Mac().Verify(value));
  EXPECT_EQ(RemoteMac::KeyId(kSecret), uint64_t{0x2c53fc229fe14a3e});
}

TEST(RemoteMacTest, ASignedValueVerifiesAndAnyChangedBitFails) {
  const RemoteMac mac = Mac();
  std::string value(4096 + 13, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 31 + 7);
  std::string signed_value = value;
  ASSERT_TRUE(mac.Sign(&signed_value).ok());
  ASSERT_EQ(signed_value.size(), value.size() + RemoteMac::kTrailerBytes);
  EXPECT_EQ(signed_value.substr(0, value.size()), value);
  EXPECT_TRUE(mac.Verify(signed_value));
  // Every byte: data, nonce and tag.
  for (size_t at = 0; at < signed_value.size(); ++at) {
    std::string changed = signed_value;
    changed[at] ^= static_cast<char>(1 << (at % 8));
    ASSERT_FALSE(mac.Verify(changed)) << "byte " << at;
  }
  EXPECT_FALSE(mac.Verify(signed_value.substr(0, signed_value.size() - 1)));
  EXPECT_FALSE(mac.Verify(signed_value + "x"));
  EXPECT_FALSE(mac.Verify(signed_value.substr(0, RemoteMac::kTrailerBytes - 1)));
  EXPECT_FALSE(Mac("another secret of 32 bytes......").Verify(signed_value));
}

// Fresh nonces: the same bytes signed twice give two trailers, both valid; an empty value too.
TEST(RemoteMacTest, EachSignatureHasItsOwnNonce) {
  const RemoteMac mac = Mac();
  std::string a = "block", b = "block", empty;
  ASSERT_TRUE(mac.Sign(&a).ok());
  ASSERT_TRUE(mac.Sign(&b).ok());
  ASSERT_TRUE(mac.Sign(&empty).ok());
  EXPECT_NE(a, b);
  EXPECT_TRUE(mac.Verify(a));
  EXPECT_TRUE(mac.Verify(b));
  EXPECT_TRUE(mac.Verify(empty));
}

}  // namespace
}  // namespace kvtier
