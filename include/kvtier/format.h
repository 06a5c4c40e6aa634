// Formats: how one block's keys and values are encoded.
//
// A format is a (K codec, V codec) pair. A cache declares a palette of 1 to 8 formats; each
// block records its palette index. Convention everywhere: stored value x scale = real value.
//
// Formats are named in text as `<codec>` when K and V share a codec, or `k:<codec>,v:<codec>`.
// Codec names:
//   fp16, bf16
//   fp8_e4m3/tensor, fp8_e4m3/block_head, fp8_e4m3/token_head   (and fp8_e5m2/...)
//   nvfp4/tensor, nvfp4/block_head        micro-blocks of 16 along head_dim, second level scope
//   nvfp4_channel/block_head              micro-blocks of 16 along tokens (per channel)
#ifndef KVTIER_FORMAT_H_
#define KVTIER_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtier/export.h"

namespace kvtier {

enum class ElementType : uint8_t { kFp16, kBf16, kFp8E4M3, kFp8E5M2, kNvfp4 };

// Where a codec's fp32 scale lives. kNone for FP16/BF16. For NVFP4 this is the second level.
enum class ScaleScope : uint8_t { kNone, kTensor, kBlockHead, kTokenHead };

// NVFP4 only: the axis of the 16-value micro-blocks that share one E4M3 scale.
enum class MicroAxis : uint8_t { kHeadDim, kTokens };

struct CodecSpec {
  ElementType type = ElementType::kFp16;
  ScaleScope scope = ScaleScope::kNone;
  MicroAxis axis = MicroAxis::kHeadDim;

  friend bool operator==(const CodecSpec& a, const CodecSpec& b) {
    return a.type == b.type && a.scope == b.scope && a.axis == b.axis;
  }
  friend bool operator!=(const CodecSpec& a, const CodecSpec& b) { return !(a == b); }
};

struct FormatSpec {
  CodecSpec k;
  CodecSpec v;

  friend bool operator==(const FormatSpec& a, const FormatSpec& b) {
    return a.k == b.k && a.v == b.v;
  }
  friend bool operator!=(const FormatSpec& a, const FormatSpec& b) { return !(a == b); }
};

// Payload bits per element of a codec's element type (16, 8 or 4).
KVTIER_EXPORT int PayloadBits(ElementType type);

// OK when the codec is a combination kvtier implements (e.g. FP16 has no scale; NVFP4 along
// tokens needs a per-(block, head) second level). The message names what is wrong.
KVTIER_EXPORT absl::Status ValidateCodec(const CodecSpec& codec);

// True when tokens can be encoded one at a time (no scale computed over a whole block), which
// the hot format needs because new tokens are written into it as they arrive.
KVTIER_EXPORT bool IsTokenWise(const FormatSpec& format);

KVTIER_EXPORT std::string CodecName(const CodecSpec& codec);
KVTIER_EXPORT std::string FormatName(const FormatSpec& format);
KVTIER_EXPORT absl::StatusOr<CodecSpec> ParseCodec(absl::string_view name);
KVTIER_EXPORT absl::StatusOr<FormatSpec> ParseFormat(absl::string_view name);

}  // namespace kvtier

#endif  // KVTIER_FORMAT_H_
