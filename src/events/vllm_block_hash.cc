#include "src/events/vllm_block_hash.h"

namespace kvtier {
namespace {

// Canonical CBOR (RFC 8949 4.2.1: the shortest head) of the few types vLLM's tuple holds.
class CborWriter {
 public:
  // The head of an item of `major` type (0 unsigned, 1 negative, 2 bytes, 3 text, 4 array)
  // whose argument is `value`.
  void Head(uint8_t major, uint64_t value) {
    const uint8_t type = static_cast<uint8_t>(major << 5);
    if (value < 24) {
      out_.push_back(static_cast<char>(type | value));
      return;
    }
    const int bytes = value <= 0xFF ? 1 : value <= 0xFFFF ? 2 : value <= 0xFFFFFFFF ? 4 : 8;
    out_.push_back(static_cast<char>(type | (bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27)));
    for (int i = bytes - 1; i >= 0; --i) out_.push_back(static_cast<char>(value >> (8 * i)));
  }
  void Int(int64_t value) {
    if (value >= 0) {
      Head(0, static_cast<uint64_t>(value));
    } else {
      Head(1, static_cast<uint64_t>(-(value + 1)));
    }
  }
  void Bytes(const Sha256Digest& digest) {
    Head(2, digest.size());
    out_.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  }
  void Text(const std::string& text) {
    Head(3, text.size());
    out_ += text;
  }
  void None() { out_.push_back(static_cast<char>(0xF6)); }

  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

}  // namespace

VllmBlockHasher::VllmBlockHasher(const std::string& seed) {
  CborWriter cbor;
  cbor.Text(seed);
  root_ = Sha256(cbor.bytes());
}

Sha256Digest VllmBlockHasher::Block(const Sha256Digest& parent,
                                    absl::Span<const int32_t> tokens, uint64_t extra_key) const {
  CborWriter cbor;
  cbor.Head(4, 3);
  cbor.Bytes(parent);
  cbor.Head(4, tokens.size());
  for (int32_t token : tokens) cbor.Int(token);
  if (extra_key == 0) {
    cbor.None();
  } else {
    cbor.Head(4, 1);
    cbor.Head(0, extra_key);
  }
  return Sha256(cbor.bytes());
}

uint64_t VllmEventHash(const Sha256Digest& hash) {
  uint64_t value = 0;
  for (int i = 24; i < 32; ++i) value = (value << 8) | hash[i];
  return value;
}

}  // namespace kvtier
