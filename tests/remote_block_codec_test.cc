// The remote tier's wire format (remote_block_codec.h) and URL parsing, without a server.
#include "src/remote_block_codec.h"

#include <xxhash.h>

#include <string>

#include "gtest/gtest.h"
#include "src/redis_connection.h"
#include "src/remote_mac.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

RemoteBlockSpec Spec() {
  Options o = testing::PaletteOptions(Geometry{2, 2, 64, 16}, {"fp16", "fp8_e4m3/tensor"}, 8);
  o.remote_model_id = "m";
  RemoteBlockSpec spec;
  spec.identity = RemoteIdentity(o);
  spec.geometry = o.geometry;
  spec.palette = o.palette;
  spec.page_bytes = {8192, 4096};
  spec.scales_digest = {0, 42};
  return spec;
}

std::string Value(const RemoteBlockSpec& spec, uint64_t hash, int format) {
  std::string value(kRemoteHeaderBytes + 2 * spec.page_bytes[format], '\0');
  for (size_t i = kRemoteHeaderBytes; i < value.size(); ++i) value[i] = static_cast<char>(i * 7);
  SealRemoteBlock(spec, hash, format, &value);
  return value;
}

TEST(RemoteBlockCodecTest, AValueDecodesToItsFormatAndPayload) {
  const RemoteBlockSpec spec = Spec();
  for (int f : {0, 1}) {
    const std::string value = Value(spec, 77, f);
    absl::StatusOr<DecodedBlock> block = DecodeRemoteBlock(spec, 77, value);
    ASSERT_TRUE(block.ok()) << block.status();
    EXPECT_EQ(block->format, f);
    EXPECT_EQ(block->payload, absl::string_view(value).substr(kRemoteHeaderBytes));
  }
}

TEST(RemoteBlockCodecTest, DamagedValuesAreDataLossAndForeignOnesFailedPrecondition) {
  const RemoteBlockSpec spec = Spec();
  const std::string good = Value(spec, 77, 0);
  auto code = [&](const std::string& v, uint64_t hash = 77) {
    return DecodeRemoteBlock(spec, hash, v).status().code();
  };
  std::string flipped = good;
  flipped[100] ^= 4;
  std::string version = good;
  version[4] = 9;
  EXPECT_EQ(code(""), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(good.substr(0, 79)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(good.substr(0, good.size() - 1)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(good + "x"), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(flipped), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(version), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(good, 78), absl::StatusCode::kFailedPrecondition);  // under another key
  RemoteBlockSpec other = spec;
  other.identity += 1;
  EXPECT_EQ(DecodeRemoteBlock(other, 77, good).status().code(), absl::StatusCode::kFailedPrecondition);
  other = spec;
  other.geometry.head_dim = 32;
  EXPECT_EQ(DecodeRemoteBlock(other, 77, good).status().code(), absl::StatusCode::kFailedPrecondition);
  other = spec;
  other.palette = {other.palette[1]};
  EXPECT_EQ(DecodeRemoteBlock(other, 77, good).status().code(), absl::StatusCode::kFailedPrecondition);
  // A format with per-tensor scales written under other scales.
  other = spec;
  other.scales_digest[1] = 43;
  EXPECT_EQ(DecodeRemoteBlock(other, 77, Value(spec, 77, 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A value whose reserved header bytes are not zero, its checksum made right again (as a writer of
// another layout of this version would): refused, not read as this layout.
TEST(RemoteBlockCodecTest, ReservedHeaderBytesMustBeZero) {
  const RemoteBlockSpec spec = Spec();
  for (const size_t at : {31, 52, 55}) {
    std::string v = Value(spec, 77, 0);
    v[at] = 1;
    const std::string checked = v.substr(0, 72) + v.substr(kRemoteHeaderBytes);
    const uint64_t sum = XXH3_64bits(checked.data(), checked.size());
    for (int i = 0; i < 8; ++i) v[72 + i] = static_cast<char>(sum >> (8 * i));
    const absl::Status s = DecodeRemoteBlock(spec, 77, v).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << at << ": " << s;
    EXPECT_NE(s.message().find("reserved"), absl::string_view::npos) << s;
  }
}

// With a secret (Options::remote_secret), a value decodes only when its MAC trailer verifies:
// not one unsigned, signed under another secret, or altered with its checksum made right again
// (as a writer without the secret could); and a cache without the secret refuses signed ones.
TEST(RemoteBlockCodecTest, WithASecretOnlyIntactValuesSignedWithItDecode) {
  const RemoteBlockSpec plain = Spec();
  const RemoteMac mac = RemoteMac::Create("0123456789abcdef0123456789abcdef").value();
  const RemoteMac other_mac = RemoteMac::Create("fedcba9876543210fedcba9876543210").value();
  RemoteBlockSpec spec = plain;
  spec.mac = &mac;
  const std::string unsigned_value = Value(spec, 77, 1);
  std::string good = unsigned_value, other = unsigned_value;
  ASSERT_TRUE(mac.Sign(&good).ok());
  ASSERT_TRUE(other_mac.Sign(&other).ok());
  absl::StatusOr<DecodedBlock> block = DecodeRemoteBlock(spec, 77, good);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->format, 1);
  EXPECT_EQ(block->payload, absl::string_view(unsigned_value).substr(kRemoteHeaderBytes));
  // A payload byte changed and the checksum recomputed over header and payload.
  std::string forged = good;
  forged[kRemoteHeaderBytes + 5] ^= 1;
  const std::string checked =
      forged.substr(0, 72) + forged.substr(kRemoteHeaderBytes, unsigned_value.size() -
                                                                   kRemoteHeaderBytes);
  const uint64_t sum = XXH3_64bits(checked.data(), checked.size());
  for (int i = 0; i < 8; ++i) forged[72 + i] = static_cast<char>(sum >> (8 * i));
  auto code = [&](const RemoteBlockSpec& s, const std::string& v) {
    return DecodeRemoteBlock(s, 77, v).status().code();
  };
  EXPECT_EQ(code(spec, forged), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code(spec, other), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code(spec, Value(plain, 77, 1)), absl::StatusCode::kUnauthenticated);
  std::string tag_flipped = good;
  tag_flipped.back() ^= 1;
  EXPECT_EQ(code(spec, tag_flipped), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code(spec, good.substr(0, good.size() - 1)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(plain, good), absl::StatusCode::kFailedPrecondition);
  // Flags other than "signed" (byte 30): not a value of this layout, with a secret or without.
  for (const char flags : {2, 3}) {
    std::string v = good;
    v[30] = flags;
    EXPECT_EQ(code(spec, v), absl::StatusCode::kUnauthenticated) << int{flags};
    EXPECT_EQ(code(plain, v), absl::StatusCode::kFailedPrecondition) << int{flags};
  }
}

TEST(RemoteBlockCodecTest, KeysSeparateModelsAndGeometries) {
  Options a = testing::SmallOptions();
  a.remote_model_id = "llama";
  Options b = a;
  b.remote_model_id = "qwen";
  Options c = a;
  c.geometry.block_tokens = 32;
  EXPECT_NE(RemoteIdentity(a), RemoteIdentity(b));
  EXPECT_NE(RemoteIdentity(a), RemoteIdentity(c));
  // Caches with a secret keep to keys of their own, one set per secret.
  Options d = a, e = a, f = a;
  d.remote_secret = std::string(16, 'd');
  e.remote_secret = std::string(32, 'e');
  f.remote_secret = d.remote_secret;
  EXPECT_NE(RemoteIdentity(a), RemoteIdentity(d));
  EXPECT_NE(RemoteIdentity(d), RemoteIdentity(e));
  EXPECT_EQ(RemoteIdentity(d), RemoteIdentity(f));
  EXPECT_EQ(RemoteKey(0x1234, 0xabc), "kvtier:0000000000001234:0000000000000abc");
}

TEST(RedisUrlTest, HostAndPortOrTheDefaultPort) {
  EXPECT_EQ(ParseRedisUrl("redis://10.0.0.1:7000")->port, 7000);
  EXPECT_EQ(ParseRedisUrl("redis://cache.local")->port, 6379);
  EXPECT_EQ(ParseRedisUrl("redis://cache.local/")->host, "cache.local");
  EXPECT_EQ(ParseRedisUrl("redis://[::1]:7001")->host, "::1");
  EXPECT_EQ(ParseRedisUrl("redis://[::1]:7001")->port, 7001);
  EXPECT_EQ(ParseRedisUrl("redis://[fe80::2]/")->port, 6379);
  for (const char* bad : {"redis://", "redis://:80", "redis://h:0", "redis://h:x", "tcp://h:1",
                          "redis://user@h:1", "redis://h:1/2", "redis://h:", "redis://::1",
                          "redis://::1:6379", "redis://[::1", "redis://[::1]6379",
                          "redis://[::1]:", "redis://[]:1"}) {
    EXPECT_EQ(ParseRedisUrl(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace kvtier
