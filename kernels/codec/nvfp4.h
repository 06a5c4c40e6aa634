// The two-level NVFP4 recipe (design/FORMATS.md): E2M1 values, one E4M3 micro-scale `sf` per
// 16 values, and one fp32 second-level scale per scope (tensor or (block, head)) derived from
// the scope's amax A. Stored value x scale = real value.
//
// Every step below is one IEEE fp32 operation rounded to nearest even (q: one rounding of the
// exact product), in this order, so the host and the device produce identical codes (device
// code: no fast-math, so that division is IEEE; the recipe has no additions, so FMA contraction
// cannot change it):
//   A'    = A >= kNvfp4MinAmax ? min(A, FLT_MAX) : 0   (NaN, 0, tiny -> 0; +Inf -> FLT_MAX)
//   S_enc = A' > 0 ? 2688 / A' : 0                      (2688 = 448 * 6)
//   d     = A' / 2688                                   (the stored decode multiplier)
//   sf    = t > 0 ? e4m3(t) : 0,  t = (S_enc * a) / 6   (a: the micro-block's amax)
//   m     = S_enc / float(sf)
//   q     = 0 < m <= FLT_MAX ? e2m1(x * m) : 0          (sf == 0 or S_enc == 0: zeros; the
//                                                        product exact, rounded once to E2M1)
//   x'    = (float(q) * float(sf)) * d                  (the first product is exact)
//
// Amax arguments should be the largest |x| over the finite values of their scope; then +-Inf
// and NaN elements encode by the E2M1 rule as +-6 and +6, which decode to about +-a and +a.
// An infinite A saturates: S_enc becomes 2688 / FLT_MAX, so ordinary values encode as zeros
// and Inf elements decode to about FLT_MAX; a NaN A zeros the scope.
// kNvfp4MinAmax = 2^-96 keeps S_enc, m, d and every nonzero decoded value normal floats, so
// results do not depend on flush-to-zero and m cannot overflow.
#ifndef KVTIER_KERNELS_CODEC_NVFP4_H_
#define KVTIER_KERNELS_CODEC_NVFP4_H_

#include <cfloat>
#include <cstdint>

#include "kernels/codec/fp4.h"
#include "kernels/codec/fp8.h"
#include "kernels/codec/host_device.h"

namespace kvtier::codec {

constexpr float kNvfp4ScaleRange = kE4M3Max * kE2M1Max;  // 2688
constexpr float kNvfp4MinAmax = 0x1p-96f;

namespace internal {

// A' of the recipe.
KVTIER_HD float Nvfp4ScopeAmax(float amax) {
  if (!(amax >= kNvfp4MinAmax)) return 0.f;
  return amax < FLT_MAX ? amax : FLT_MAX;
}

}  // namespace internal

// S_enc = 2688 / A, or 0 (the scope encodes as zeros) when A is NaN or below kNvfp4MinAmax.
KVTIER_HD float Nvfp4EncodeScale(float amax) {
  const float a = internal::Nvfp4ScopeAmax(amax);
  return a > 0.f ? kNvfp4ScaleRange / a : 0.f;
}

// The stored decode multiplier A / 2688, with A sanitized as in Nvfp4EncodeScale.
KVTIER_HD float Nvfp4DecodeScale(float amax) {
  return internal::Nvfp4ScopeAmax(amax) / kNvfp4ScaleRange;
}

// The E4M3 micro-scale of a micro-block with amax `micro_amax` (saturates at 448; 0 when the
// block is all zeros, underflows against S_enc, or S_enc is 0).
KVTIER_HD uint8_t Nvfp4MicroScale(float s_enc, float micro_amax) {
  const float t = (s_enc * micro_amax) / kE2M1Max;
  return t > 0.f ? FloatToE4M3(t) : 0;
}

// The E2M1 nibble of x. REQUIRES: s_enc from Nvfp4EncodeScale and `micro_scale_e4m3` from
// Nvfp4MicroScale (anything else that is not a positive finite multiple encodes as 0).
// The per-micro-block multiplier S_enc / sf of the value step, or 0 when the micro-block
// encodes as zeros (sf == 0, S_enc == 0, or an overflowing ratio). Computing it once per
// micro-block gives the same codes as Nvfp4EncodeValue.
KVTIER_HD float Nvfp4EncodeMultiplier(float s_enc, uint8_t micro_scale_e4m3) {
  const float m = s_enc / E4M3ToFloat(micro_scale_e4m3);
  return m > 0.f && m <= FLT_MAX ? m : 0.f;
}

// e2m1(x * m), the product exact (ProductToE2M1), for a multiplier from
// Nvfp4EncodeMultiplier; 0 when m is 0.
KVTIER_HD uint8_t Nvfp4EncodeScaled(float x, float m) { return m > 0.f ? ProductToE2M1(x, m) : 0; }

KVTIER_HD uint8_t Nvfp4EncodeValue(float x, float s_enc, uint8_t micro_scale_e4m3) {
  return Nvfp4EncodeScaled(x, Nvfp4EncodeMultiplier(s_enc, micro_scale_e4m3));
}

KVTIER_HD float Nvfp4DecodeValue(uint8_t nibble, uint8_t micro_scale_e4m3,
                                 float decode_scale) {
  return (E2M1ToFloat(nibble) * E4M3ToFloat(micro_scale_e4m3)) * decode_scale;
}

}  // namespace kvtier::codec

#endif  // KVTIER_KERNELS_CODEC_NVFP4_H_
