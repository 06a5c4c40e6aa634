#include "src/prefix_hash.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/config.h"

namespace kvtier {
namespace {

constexpr size_t kMaxHeaderBytes = 16;
constexpr size_t kBufferBytes = kMaxHeaderBytes + 4 * kMaxStackTokens;

void StoreLE64(uint64_t v, unsigned char* out) {
#if defined(ABSL_IS_LITTLE_ENDIAN)
  std::memcpy(out, &v, 8);
#else
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
#endif
}

void StoreLE32(absl::Span<const int32_t> tokens, unsigned char* out) {
#if defined(ABSL_IS_LITTLE_ENDIAN)
  if (!tokens.empty()) std::memcpy(out, tokens.data(), 4 * tokens.size());
#else
  for (const int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) *out++ = static_cast<unsigned char>(u >> (8 * i));
  }
#endif
}

// Writes le64(header[0]) || ... || le32(tokens[0]) || ... to `out`.
void Serialize(absl::Span<const uint64_t> header, absl::Span<const int32_t> tokens,
               unsigned char* out) {
  for (const uint64_t word : header) {
    StoreLE64(word, out);
    out += 8;
  }
  StoreLE32(tokens, out);
}

ABSL_ATTRIBUTE_NOINLINE uint64_t HashLong(absl::Span<const uint64_t> header,
                                          absl::Span<const int32_t> tokens) {
  std::vector<unsigned char> buffer(8 * header.size() + 4 * tokens.size());
  Serialize(header, tokens, buffer.data());
  return XXH3_64bits(buffer.data(), buffer.size());
}

// XXH3-64 of the serialized header and tokens.
uint64_t HashChain(absl::Span<const uint64_t> header, absl::Span<const int32_t> tokens) {
  if (tokens.size() > kMaxStackTokens) return HashLong(header, tokens);
  unsigned char buffer[kBufferBytes];
  Serialize(header, tokens, buffer);
  return XXH3_64bits(buffer, 8 * header.size() + 4 * tokens.size());
}

}  // namespace

uint64_t HashBlock(uint64_t parent_hash, absl::Span<const int32_t> tokens, uint64_t extra_key) {
  const uint64_t header[2] = {parent_hash, extra_key};
  return HashChain(header, tokens);
}

uint64_t HashTokens(absl::Span<const int32_t> tokens) { return HashChain({}, tokens); }

}  // namespace kvtier
