#include "src/prefix_hash.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

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

// XXH3-64 of le64(header[0]) || ... || le32(tokens[0]) || ...
uint64_t HashChain(absl::Span<const uint64_t> header, absl::Span<const int32_t> tokens) {
  const size_t bytes = 8 * header.size() + 4 * tokens.size();
  unsigned char stack_buffer[kBufferBytes];
  std::vector<unsigned char> heap_buffer;
  unsigned char* buffer = stack_buffer;
  if (bytes > kBufferBytes) {
    heap_buffer.resize(bytes);
    buffer = heap_buffer.data();
  }
  size_t n = 0;
  for (const uint64_t word : header) {
    StoreLE64(word, buffer + n);
    n += 8;
  }
  StoreLE32(tokens, buffer + n);
  return XXH3_64bits(buffer, bytes);
}

}  // namespace

uint64_t HashBlock(uint64_t parent_hash, absl::Span<const int32_t> tokens, uint64_t extra_key) {
  const uint64_t header[2] = {parent_hash, extra_key};
  return HashChain(header, tokens);
}

uint64_t HashTokens(absl::Span<const int32_t> tokens) { return HashChain({}, tokens); }

}  // namespace kvtier
