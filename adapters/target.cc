// Adapter targets and which palette formats each reads.
#include "kvtier/adapters/target.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

const char* Reads(AdapterTarget target) {
  switch (target) {
    case AdapterTarget::kFlashInfer:
      return "fp16, bf16, fp8_e4m3/tensor, fp8_e5m2/tensor, nvfp4/tensor";
    case AdapterTarget::kFlashAttention2: return "fp16, bf16 with block_tokens a multiple of 256";
    case AdapterTarget::kFlashAttention3: return "fp16, bf16, fp8_e4m3/tensor";
    case AdapterTarget::kVllm:
      return "fp16, bf16, fp8_e4m3/tensor, fp8_e5m2/tensor with block_tokens a multiple of 16";
    case AdapterTarget::kFlexAttention: return "fp16, bf16";
    case AdapterTarget::kTensorRtLlm:
      return "fp16, bf16, fp8_e4m3/tensor with block_tokens a power of two";
  }
  return "";
}

bool TypeReadable(AdapterTarget target, ElementType type) {
  switch (type) {
    case ElementType::kFp16:
    case ElementType::kBf16: return true;
    case ElementType::kFp8E4M3:
      return target != AdapterTarget::kFlashAttention2 && target != AdapterTarget::kFlexAttention;
    case ElementType::kFp8E5M2:
      return target == AdapterTarget::kFlashInfer || target == AdapterTarget::kVllm;
    case ElementType::kNvfp4: return target == AdapterTarget::kFlashInfer;
  }
  return false;
}

const char* TypeName(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return "FP16";
    case ElementType::kBf16: return "BF16";
    case ElementType::kFp8E4M3: return "FP8 E4M3";
    case ElementType::kFp8E5M2: return "FP8 E5M2";
    case ElementType::kNvfp4: return "NVFP4";
  }
  return "?";
}

}  // namespace

const char* AdapterTargetName(AdapterTarget target) {
  switch (target) {
    case AdapterTarget::kFlashInfer: return "FlashInfer";
    case AdapterTarget::kFlashAttention2: return "FlashAttention-2";
    case AdapterTarget::kFlashAttention3: return "FlashAttention-3";
    case AdapterTarget::kVllm: return "vLLM";
    case AdapterTarget::kFlexAttention: return "FlexAttention";
    case AdapterTarget::kTensorRtLlm: return "TensorRT-LLM";
  }
  return "?";
}

absl::StatusOr<AdapterTarget> ParseAdapterTarget(absl::string_view name) {
  if (name == "flashinfer") return AdapterTarget::kFlashInfer;
  if (name == "flash_attention2") return AdapterTarget::kFlashAttention2;
  if (name == "flash_attention3") return AdapterTarget::kFlashAttention3;
  if (name == "vllm") return AdapterTarget::kVllm;
  if (name == "flex_attention") return AdapterTarget::kFlexAttention;
  if (name == "tensorrt_llm") return AdapterTarget::kTensorRtLlm;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown adapter target '", name,
      "' (flashinfer, flash_attention2, flash_attention3, vllm, flex_attention, tensorrt_llm)"));
}

absl::Status CheckReadable(AdapterTarget target, const FormatSpec& format,
                           const Geometry& geometry) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(AdapterTargetName(target),
                                                   " cannot read format ", FormatName(format),
                                                   ": ", why, " (", AdapterTargetName(target),
                                                   " reads ", Reads(target), ")"));
  };
  if (format.k != format.v) {
    return refuse("K and V use different codecs; the kernel reads one element type for both");
  }
  const CodecSpec& c = format.k;
  if (c.type == ElementType::kNvfp4 && c.axis == MicroAxis::kTokens) {
    return refuse("its NVFP4 micro-blocks run along tokens (one scale per channel); external "
                  "kernels read micro-blocks along head_dim");
  }
  if (c.scope == ScaleScope::kBlockHead) {
    return refuse("its fp32 scales are per (block, head); the kernel takes one scale per layer");
  }
  if (c.scope == ScaleScope::kTokenHead) {
    return refuse("its fp32 scales are per (token, head); the kernel takes one scale per layer");
  }
  if (!TypeReadable(target, c.type)) {
    return refuse(absl::StrCat("the kernel has no ", TypeName(c.type), " path"));
  }
  const int s = geometry.block_tokens;
  if (target == AdapterTarget::kFlashAttention2 && s % 256 != 0) {
    return refuse(absl::StrCat("block_tokens ", s, " is not a multiple of 256"));
  }
  if (target == AdapterTarget::kVllm && s % 16 != 0) {
    return refuse(absl::StrCat("block_tokens ", s, " is not a multiple of 16"));
  }
  if (target == AdapterTarget::kTensorRtLlm && (s & (s - 1)) != 0) {
    return refuse(absl::StrCat("block_tokens ", s, " is not a power of two"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeysUnrotated(AdapterTarget target, const Options& options) {
  if (options.key_rotation == KeyRotation::kNone) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      AdapterTargetName(target), " cannot attend this cache: its keys are stored rotated "
      "(Options::key_rotation = kHadamard) and the external kernel does not rotate queries; "
      "use kvtier's DecodeAttention, or a cache with key_rotation = kNone"));
}

absl::Status CheckPaletteReadable(AdapterTarget target, const Options& options) {
  KVTIER_RETURN_IF_ERROR(CheckKeysUnrotated(target, options));
  for (const FormatSpec& f : options.palette) {
    KVTIER_RETURN_IF_ERROR(CheckReadable(target, f, options.geometry));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
