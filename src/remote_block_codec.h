// The wire format of one block in the remote tier (docs/tiers.md): its Redis key and value.
//
// Key:   "kvtier:" hex16(identity) ":" hex16(block hash), where identity is
//        XXH3("kvtier-remote" || le32(codec version) || le32 geometry (layers, kv heads,
//        head_dim, block_tokens) || model id [|| "\0key_rotation=hadamard:" || le64(seed)
//        when keys are rotated] [|| "\0authenticated:" || le64(RemoteMac::KeyId(secret)) with
//        Options::remote_secret]), so that blocks of another model, geometry, codec version,
//        key rotation or secret are never even looked up.
// Value: an 80-byte little-endian header, then the block's page bytes of every layer in
//        layer order (layers x page_bytes), exactly as they lie in a page of the format, then,
//        with a secret, RemoteMac's trailer over all of that (40 bytes, remote_mac.h):
//
//   off size field
//     0    4 magic "KVTR"
//     4    2 codec version (kRemoteCodecVersion)
//     6    2 header bytes (80)
//     8    8 identity
//    16    8 block hash (the key's): a value stored under another key is refused
//    24    6 format: K (element type, scale scope, micro axis), then V
//    30    1 flags: 1 when the value ends with a MAC trailer, else 0; 1 byte zero
//    32   16 geometry: layers, kv heads, head_dim, block_tokens (le32 each)
//    48    4 page bytes; 4 bytes zero
//    56    8 scales digest: XXH3 of the per-tensor scales of every layer for a format with a
//            per-tensor scale (the page alone does not say them), 0 otherwise
//    64    8 payload bytes
//    72    8 checksum: XXH3 of bytes [0, 72) followed by the payload
//
// A value is accepted only when every field matches what the reading cache would write itself,
// zero bytes included. The checksum guards against corruption, not against a writer; the MAC,
// with a secret, against writers without it (docs/tiers.md, "Trust").
//
// Thread-safe (pure functions).
#ifndef KVTIER_SRC_REMOTE_BLOCK_CODEC_H_
#define KVTIER_SRC_REMOTE_BLOCK_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtier/options.h"
#include "src/remote_mac.h"

namespace kvtier {

inline constexpr uint16_t kRemoteCodecVersion = 1;
inline constexpr size_t kRemoteHeaderBytes = 80;

// What one cache writes and accepts.
struct RemoteBlockSpec {
  uint64_t identity = 0;               // RemoteIdentity(options)
  Geometry geometry;
  std::vector<FormatSpec> palette;
  std::vector<uint32_t> page_bytes;    // [format]
  std::vector<uint64_t> scales_digest;  // [format], now (per-tensor scales may change)
  // With Options::remote_secret (RemoteTier::mac()): values end with its trailer, which
  // RemoteTier signs and DecodeRemoteBlock verifies. Default: null (no trailer).
  const RemoteMac* mac = nullptr;
};

uint64_t RemoteIdentity(const Options& options);

// The largest page of the palette's formats: a staging slot, and per layer the longest payload
// a value of this cache holds.
uint32_t LargestPageBytes(const Options& options);
std::string RemoteKey(uint64_t identity, uint64_t block_hash);

// Makes `value`, whose bytes from kRemoteHeaderBytes on hold the payload of block
// `block_hash` in palette format `format` (staged there without a copy), a whole value by
// writing its header (with spec.mac, a value to sign: RemoteMac::Sign appends the trailer).
// REQUIRES: value->size() == kRemoteHeaderBytes + layers x spec.page_bytes[format].
void SealRemoteBlock(const RemoteBlockSpec& spec, uint64_t block_hash, int format,
                     std::string* value);

struct DecodedBlock {
  int format = 0;             // palette index
  absl::string_view payload;  // into the value: layers x page_bytes
};
// The block in `value`, read under the key of `block_hash`. DataLoss when the value is not a
// whole, intact kvtier block (short, bad magic, lengths, checksum); Unauthenticated, with
// spec.mac, when it has no trailer or one that fails to verify; FailedPrecondition when it is
// one of another identity, key, codec version, geometry, format, page size or scales, or, without
// spec.mac, a signed one.
absl::StatusOr<DecodedBlock> DecodeRemoteBlock(const RemoteBlockSpec& spec, uint64_t block_hash,
                                               absl::string_view value);

}  // namespace kvtier

#endif  // KVTIER_SRC_REMOTE_BLOCK_CODEC_H_
