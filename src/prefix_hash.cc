#include "src/prefix_hash.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

#include "absl/base/config.h"

namespace kvtier {
namespace {

void StoreLE64(uint64_t v, unsigned char* out) {
#if defined(ABSL_IS_LITTLE_ENDIAN)
  std::memcpy(out, &v, 8);
#else
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
#endif
}

}  // namespace

uint64_t HashTokens(absl::Span<const int32_t> tokens) {
#if defined(ABSL_IS_LITTLE_ENDIAN)
  // The in-memory representation is already le32(tokens[0]) || ...: hash it in place.
  return XXH3_64bits(tokens.data(), 4 * tokens.size());
#else
  std::vector<unsigned char> bytes(4 * tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(tokens[i]);
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<unsigned char>(u >> (8 * b));
  }
  return XXH3_64bits(bytes.data(), bytes.size());
#endif
}

uint64_t HashBlock(uint64_t parent_hash, absl::Span<const int32_t> tokens, uint64_t extra_key) {
  unsigned char bytes[24];
  StoreLE64(parent_hash, bytes);
  StoreLE64(HashTokens(tokens), bytes + 8);
  StoreLE64(extra_key, bytes + 16);
  return XXH3_64bits(bytes, sizeof(bytes));
}

}  // namespace kvtier
