#include "src/remote_block_codec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/page_layout.h"
#include "xxhash.h"

namespace kvtier {
namespace {

constexpr uint32_t kMagic = 0x5254564B;  // "KVTR" little-endian
constexpr size_t kChecksumAt = 72;

void Put(std::string* out, size_t at, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) (*out)[at + i] = static_cast<char>(value >> (8 * i));
}

uint64_t Get(absl::string_view in, size_t at, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  }
  return value;
}

void PutCodec(std::string* out, size_t at, const CodecSpec& c) {
  Put(out, at, static_cast<uint8_t>(c.type), 1);
  Put(out, at + 1, static_cast<uint8_t>(c.scope), 1);
  Put(out, at + 2, static_cast<uint8_t>(c.axis), 1);
}

bool SameCodec(absl::string_view in, size_t at, const CodecSpec& c) {
  return Get(in, at, 1) == static_cast<uint8_t>(c.type) &&
         Get(in, at + 1, 1) == static_cast<uint8_t>(c.scope) &&
         Get(in, at + 2, 1) == static_cast<uint8_t>(c.axis);
}

uint64_t Checksum(absl::string_view header, absl::string_view payload) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header.data(), kChecksumAt);
  XXH3_64bits_update(state, payload.data(), payload.size());
  const uint64_t sum = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return sum;
}

absl::Status Mismatch(absl::string_view field, uint64_t got, uint64_t want) {
  return absl::FailedPreconditionError(
      absl::StrCat("remote block of another ", field, ": ", got, ", this cache has ", want));
}

// The geometry, page size and payload length of a value whose format is palette entry f.
absl::Status CheckShape(const RemoteBlockSpec& spec, int f, absl::string_view value) {
  const Geometry& g = spec.geometry;
  const int64_t fields[4] = {g.num_layers, g.num_kv_heads, g.head_dim, g.block_tokens};
  const char* names[4] = {"layer count", "kv head count", "head_dim", "block_tokens"};
  for (int i = 0; i < 4; ++i) {
    const uint64_t got = Get(value, 32 + 4 * i, 4);
    if (got != static_cast<uint64_t>(fields[i])) return Mismatch(names[i], got, fields[i]);
  }
  if (Get(value, 48, 4) != spec.page_bytes[f]) {
    return Mismatch("page size", Get(value, 48, 4), spec.page_bytes[f]);
  }
  if (Get(value, 56, 8) != spec.scales_digest[f]) {
    return absl::FailedPreconditionError("remote block written under other per-tensor scales");
  }
  const uint64_t payload = uint64_t{spec.page_bytes[f]} * g.num_layers;
  if (Get(value, 64, 8) != payload) return Mismatch("payload length", Get(value, 64, 8), payload);
  return absl::OkStatus();
}

}  // namespace

uint64_t RemoteIdentity(const Options& options) {
  const Geometry& g = options.geometry;
  std::string bytes = "kvtier-remote";
  const size_t at = bytes.size();
  bytes.resize(at + 20);
  Put(&bytes, at, kRemoteCodecVersion, 4);
  Put(&bytes, at + 4, static_cast<uint32_t>(g.num_layers), 4);
  Put(&bytes, at + 8, static_cast<uint32_t>(g.num_kv_heads), 4);
  Put(&bytes, at + 12, static_cast<uint32_t>(g.head_dim), 4);
  Put(&bytes, at + 16, static_cast<uint32_t>(g.block_tokens), 4);
  bytes += options.remote_model_id;
  if (options.key_rotation == KeyRotation::kHadamard) {  // rotated keys are other bytes
    const size_t end = bytes.size();
    bytes += std::string("\0key_rotation=hadamard:", 23);
    bytes.resize(bytes.size() + 8);
    Put(&bytes, end + 23, options.key_rotation_seed, 8);
  }
  if (!options.remote_secret.empty()) {  // the secret's id, not the secret
    const size_t end = bytes.size();
    bytes += std::string("\0authenticated:", 15);
    bytes.resize(bytes.size() + 8);
    Put(&bytes, end + 15, RemoteMac::KeyId(options.remote_secret), 8);
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint32_t LargestPageBytes(const Options& options) {
  const Geometry& g = options.geometry;
  uint32_t page_bytes = 0;
  for (const FormatSpec& f : options.palette) {
    page_bytes = std::max(
        page_bytes, MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, f).page_bytes);
  }
  return page_bytes;
}

std::string RemoteKey(uint64_t identity, uint64_t block_hash) {
  return absl::StrFormat("kvtier:%016x:%016x", identity, block_hash);
}

void SealRemoteBlock(const RemoteBlockSpec& spec, uint64_t block_hash, int format,
                     std::string* value) {
  const Geometry& g = spec.geometry;
  std::string& out = *value;
  const absl::string_view payload = absl::string_view(out).substr(kRemoteHeaderBytes);
  std::fill(out.begin(), out.begin() + kRemoteHeaderBytes, '\0');
  Put(&out, 0, kMagic, 4);
  Put(&out, 4, kRemoteCodecVersion, 2);
  Put(&out, 6, kRemoteHeaderBytes, 2);
  Put(&out, 8, spec.identity, 8);
  Put(&out, 16, block_hash, 8);
  PutCodec(&out, 24, spec.palette[format].k);
  PutCodec(&out, 27, spec.palette[format].v);
  Put(&out, 30, spec.mac != nullptr ? 1 : 0, 1);
  Put(&out, 32, static_cast<uint32_t>(g.num_layers), 4);
  Put(&out, 36, static_cast<uint32_t>(g.num_kv_heads), 4);
  Put(&out, 40, static_cast<uint32_t>(g.head_dim), 4);
  Put(&out, 44, static_cast<uint32_t>(g.block_tokens), 4);
  Put(&out, 48, spec.page_bytes[format], 4);
  Put(&out, 56, spec.scales_digest[format], 8);
  Put(&out, 64, payload.size(), 8);
  Put(&out, kChecksumAt, Checksum(out, payload), 8);
}

absl::StatusOr<DecodedBlock> DecodeRemoteBlock(const RemoteBlockSpec& spec, uint64_t block_hash,
                                               absl::string_view value) {
  if (value.size() < kRemoteHeaderBytes) {
    return absl::DataLossError(absl::StrCat("remote value of ", value.size(),
                                            " bytes is shorter than a block header"));
  }
  if (Get(value, 0, 4) != kMagic) return absl::DataLossError("remote value is not a kvtier block");
  // Another codec version may lay its header out differently: refused before reading on.
  if (Get(value, 4, 2) != kRemoteCodecVersion) {
    return Mismatch("codec version", Get(value, 4, 2), kRemoteCodecVersion);
  }
  if (Get(value, 6, 2) != kRemoteHeaderBytes) {
    return absl::DataLossError("remote value has a wrong header size");
  }
  // Whether a MAC trailer follows the payload, before any length is read.
  if (spec.mac != nullptr && Get(value, 30, 1) != 1) {
    return absl::UnauthenticatedError(
        "remote value carries no MAC, and this cache has a remote_secret");
  }
  if (spec.mac == nullptr && Get(value, 30, 1) != 0) {
    return absl::FailedPreconditionError(
        "remote block signed with a remote_secret, which this cache lacks");
  }
  const size_t trailer = TrailerBytes(spec.mac);
  if (value.size() < kRemoteHeaderBytes + trailer) {
    return absl::DataLossError("remote value is too short for its MAC trailer");
  }
  const absl::string_view payload =
      value.substr(kRemoteHeaderBytes, value.size() - kRemoteHeaderBytes - trailer);
  if (Get(value, 64, 8) != payload.size()) {
    return absl::DataLossError(absl::StrCat("remote value holds ", payload.size(),
                                            " payload bytes, its header says ", Get(value, 64, 8)));
  }
  if (Get(value, kChecksumAt, 8) != Checksum(value, payload)) {
    return absl::DataLossError("remote value fails its checksum");
  }
  // Bytes the writer sets to zero: another layout of this version would not be read as this one.
  if (Get(value, 31, 1) != 0 || Get(value, 52, 4) != 0) {
    return absl::DataLossError("remote value has non-zero reserved header bytes");
  }
  if (spec.mac != nullptr && !spec.mac->Verify(value)) {
    return absl::UnauthenticatedError(
        "remote value fails its MAC: written without this cache's remote_secret, or altered");
  }
  if (Get(value, 8, 8) != spec.identity) {
    return Mismatch("model identity", Get(value, 8, 8), spec.identity);
  }
  if (Get(value, 16, 8) != block_hash) return Mismatch("block hash", Get(value, 16, 8), block_hash);
  for (size_t f = 0; f < spec.palette.size(); ++f) {
    if (!SameCodec(value, 24, spec.palette[f].k) || !SameCodec(value, 27, spec.palette[f].v)) {
      continue;
    }
    if (absl::Status shape = CheckShape(spec, static_cast<int>(f), value); !shape.ok()) {
      return shape;
    }
    return DecodedBlock{static_cast<int>(f), payload};
  }
  return absl::FailedPreconditionError("remote block of a format outside this cache's palette");
}

}  // namespace kvtier
