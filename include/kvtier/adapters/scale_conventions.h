// Conversions between kvtier's per-tensor scale and the conventions of other libraries, in one
// place. kvtier stores, for every scaled codec, the multiplier that decodes: real = stored x s.
// For FP8 per tensor s = amax / 448 (E4M3) or amax / 57344 (E5M2); for NVFP4 the second level
// is d = amax / 2688 (= amax / (6 x 448)).
//
//   convention                 FP8 value     NVFP4 value    meaning
//   kKvtier                    s             d              decode multiplier
//   kModelOpt                  s             d              ModelOpt's exported k/v scale
//   kFlashInferKVScale         s             d              FlashInfer's k_scale / v_scale
//   kFlashInferGlobalSf        1 / s         1 / (6 d)      FlashInfer quantiser's global_sf
//
// FlashInfer's NVFP4 decode computes E2M1 x E4M3 micro-scale x k_scale. kvtier's micro-scales
// span up to 448, so the k_scale that reads kvtier's pages is d itself (checked against the
// real kernel on the H200: tests/gpu/python/validate_external.py). FlashInfer's own quantiser
// makes micro-scales six times smaller and passes A/448 = 6 d; its global_sf is 448/A.
//   kTensorRtLlmQuantOrig      s             d              kv_scale_quant_orig
//   kTensorRtLlmOrigQuant      1 / s         1 / d          kv_scale_orig_quant
//   kAmaxOver6                 (none)        448 d = A/6    some toolkits' NVFP4 global scale
#ifndef KVTIER_ADAPTERS_SCALE_CONVENTIONS_H_
#define KVTIER_ADAPTERS_SCALE_CONVENTIONS_H_

#include "absl/status/statusor.h"
#include "kvtier/export.h"
#include "kvtier/format.h"

namespace kvtier {

enum class ScaleConvention {
  kKvtier,
  kModelOpt,
  kFlashInferKVScale,
  kFlashInferGlobalSf,
  kTensorRtLlmQuantOrig,
  kTensorRtLlmOrigQuant,
  kAmaxOver6,
};

// kvtier's scale `s` of a codec of `type` expressed in `convention`. InvalidArgument for
// FP16/BF16 (no scale), for kAmaxOver6 with FP8, and for a non-finite or non-positive s.
KVTIER_EXPORT absl::StatusOr<float> ToConvention(float s, ElementType type,
                                                ScaleConvention convention);

// The inverse: kvtier's scale from a value in `convention`. Same errors.
KVTIER_EXPORT absl::StatusOr<float> FromConvention(float value, ElementType type,
                                                  ScaleConvention convention);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_SCALE_CONVENTIONS_H_
