// The external attention kernels kvtier's adapters serve, and which palette formats each reads
// (docs/adapters.md). Every table builder of kvtier/adapters/ refuses a format its target cannot
// read with InvalidArgument naming the format and the target.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_TARGET_H_
#define KVTIER_ADAPTERS_TARGET_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtier/export.h"
#include "kvtier/format.h"
#include "kvtier/options.h"

namespace kvtier {

enum class AdapterTarget : uint8_t {
  // FlashInfer BatchDecode/BatchPrefillWithPagedKVCacheWrapper, kv_layout "HND".
  // Reads: fp16, bf16, fp8_e4m3/tensor, fp8_e5m2/tensor, nvfp4/tensor (K and V alike).
  kFlashInfer,
  // Upstream flash-attention 2 flash_attn_with_kvcache. Reads: fp16, bf16; block_tokens % 256.
  kFlashAttention2,
  // flash-attention 3 (hopper/). Reads: fp16, bf16, fp8_e4m3/tensor (descales [B, Hk]).
  kFlashAttention3,
  // vLLM's attention backends and reshape_and_cache (slot_mapping). Reads: fp16, bf16,
  // fp8_e4m3/tensor, fp8_e5m2/tensor (k_scale/v_scale [1]); block_tokens % 16.
  kVllm,
  // PyTorch FlexAttention's PagedAttention. Reads: fp16, bf16.
  kFlexAttention,
  // TensorRT-LLM kv_cache_block_offsets. Reads: fp16, bf16, fp8_e4m3/tensor; block_tokens a
  // power of two.
  kTensorRtLlm,
};

KVTIER_EXPORT const char* AdapterTargetName(AdapterTarget target);
// "flashinfer", "flash_attention2", "flash_attention3", "vllm", "flex_attention", "tensorrt_llm".
KVTIER_EXPORT absl::StatusOr<AdapterTarget> ParseAdapterTarget(absl::string_view name);

// OK when `target` can read palette format `format` with this geometry; otherwise
// InvalidArgument naming the format, the target, the reason and what the target reads.
KVTIER_EXPORT absl::Status CheckReadable(AdapterTarget target, const FormatSpec& format,
                                         const Geometry& geometry);
// OK when the cache's keys are stored as written. FailedPrecondition when
// options.key_rotation rotates them: `target`'s kernel would take q . (R k) for q . k, since it
// does not rotate queries (and a kernel that writes K itself would store unrotated keys).
// Every adapter entry point that hands out pools, parts or slots checks this first.
KVTIER_EXPORT absl::Status CheckKeysUnrotated(AdapterTarget target, const Options& options);
// CheckReadable for every palette format: for an engine that will send every block to `target`.
KVTIER_EXPORT absl::Status CheckPaletteReadable(AdapterTarget target, const Options& options);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_TARGET_H_
