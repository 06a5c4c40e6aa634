// OCP FP8 <-> float, bit-identical to CUDA's saturating conversions
// (__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)) on host and device. Encoding rounds to
// nearest even and saturates: overflow and +-Inf become +-max. Any NaN, whatever its sign,
// becomes 0x7F, as CUDA's host conversion does. Decoding is exact; NaN codes decode to the
// canonical float NaN 0x7FFFFFFF.
#ifndef KVTIER_KERNELS_CODEC_FP8_H_
#define KVTIER_KERNELS_CODEC_FP8_H_

#include <cstdint>

#include "kernels/codec/half.h"
#include "kernels/codec/host_device.h"

namespace kvtier::codec {

constexpr float kE4M3Max = 448.f;
constexpr float kE5M2Max = 57344.f;

// E4M3FN: bias 7, no Inf, NaN is 0x7F/0xFF. |x| <= 464 rounds (464 ties down to 448);
// beyond saturates to 0x7E/0xFE.
KVTIER_HD uint8_t FloatToE4M3(float x) {
  const uint32_t bits = internal::FloatBits(x);
  const uint32_t abs = bits & internal::kFloatAbsMask;
  const uint32_t sign = (bits >> 24) & 0x80u;
  if (abs > internal::kFloatInfBits) return 0x7F;
  if (abs > 0x43E80000u) return static_cast<uint8_t>(sign | 0x7Eu);  // > 464
  return static_cast<uint8_t>(sign | internal::EncodeMagnitude(abs, 3, 7));
}

KVTIER_HD float E4M3ToFloat(uint8_t code) {
  if ((code & 0x7Fu) == 0x7Fu) return internal::FloatFromBits(internal::kFloatNanBits);
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  return internal::FloatFromBits(
      sign | internal::DecodeMagnitude((code >> 3) & 0xFu, code & 0x7u, 3, 7));
}

// E5M2: bias 15, Inf is 0x7C/0xFC. |x| >= 61440 (the midpoint to Inf) and +-Inf saturate to
// 0x7B/0xFB.
KVTIER_HD uint8_t FloatToE5M2(float x) {
  const uint32_t bits = internal::FloatBits(x);
  const uint32_t abs = bits & internal::kFloatAbsMask;
  const uint32_t sign = (bits >> 24) & 0x80u;
  if (abs > internal::kFloatInfBits) return 0x7F;
  if (abs >= 0x47700000u) return static_cast<uint8_t>(sign | 0x7Bu);  // >= 61440
  return static_cast<uint8_t>(sign | internal::EncodeMagnitude(abs, 2, 15));
}

// E5M2 is the upper byte of an FP16.
KVTIER_HD float E5M2ToFloat(uint8_t code) {
  return HalfToFloat(static_cast<uint16_t>(code << 8));
}

}  // namespace kvtier::codec

#endif  // KVTIER_KERNELS_CODEC_FP8_H_
