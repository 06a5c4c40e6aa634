// E2M1 (FP4) <-> float, bit-identical to CUDA 13's
// __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest). A code is the low nibble:
// S.EE.M, values {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives, no Inf or NaN.
// Encoding rounds to nearest even and saturates: |x| > 6 and +-Inf become +-6, NaN becomes +6
// (code 0x7), -0 and negative values that round to zero keep their sign (code 0x8).
#ifndef KVTIER_KERNELS_CODEC_FP4_H_
#define KVTIER_KERNELS_CODEC_FP4_H_

#include <cstdint>

#include "kernels/codec/half.h"
#include "kernels/codec/host_device.h"

namespace kvtier::codec {

constexpr float kE2M1Max = 6.f;

// Compare-and-round: |x| is compared, as float bits, with the midpoints between consecutive
// E2M1 values; each midpoint counts toward the even neighbour ('>' keeps it below, '>=' moves
// it above). NaN bits exceed every midpoint, so NaN lands on 6.
KVTIER_HD uint8_t FloatToE2M1(float x) {
  const uint32_t bits = internal::FloatBits(x);
  const uint32_t abs = bits & internal::kFloatAbsMask;
  const uint32_t code = (abs > 0x3E800000u ? 1u : 0u) +   // 0.25 -> 0
                        (abs >= 0x3F400000u ? 1u : 0u) +  // 0.75 -> 1
                        (abs > 0x3FA00000u ? 1u : 0u) +   // 1.25 -> 1
                        (abs >= 0x3FE00000u ? 1u : 0u) +  // 1.75 -> 2
                        (abs > 0x40200000u ? 1u : 0u) +   // 2.5 -> 2
                        (abs >= 0x40600000u ? 1u : 0u) +  // 3.5 -> 4
                        (abs > 0x40A00000u ? 1u : 0u);    // 5 -> 4
  const uint32_t sign = abs > internal::kFloatInfBits ? 0u : (bits >> 28) & 0x8u;
  return static_cast<uint8_t>(sign | code);
}

// The E2M1 code of the exact product x * m, rounded once (FloatToE2M1(x * m) rounds twice: to
// a float, then to E2M1, and can differ next to a midpoint). The product of two floats is exact
// in a double (24 + 24 significant bits, exponents in range), whose midpoint compares follow
// FloatToE2M1's; NaN (also Inf x 0) gives +6 as there. REQUIRES: m > 0.
KVTIER_HD uint8_t ProductToE2M1(float x, float m) {
  const double p = static_cast<double>(x) * m;
  const double a = p < 0 ? -p : p;
  // Each '!(a <= ...)' or '!(a < ...)' counts a NaN as above the midpoint.
  const uint32_t code = (!(a <= 0.25) ? 1u : 0u) + (!(a < 0.75) ? 1u : 0u) +
                        (!(a <= 1.25) ? 1u : 0u) + (!(a < 1.75) ? 1u : 0u) +
                        (!(a <= 2.5) ? 1u : 0u) + (!(a < 3.5) ? 1u : 0u) + (!(a <= 5.0) ? 1u : 0u);
  const uint32_t sign = a != a ? 0u : (internal::FloatBits(x) >> 28) & 0x8u;
  return static_cast<uint8_t>(sign | code);
}

// Decodes the low nibble of `code`; the high nibble is ignored.
KVTIER_HD float E2M1ToFloat(uint8_t code) {
  static constexpr float kValues[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                 -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kValues[code & 0xFu];
}

// Two values in one byte: `lo` (element 2i) in the low nibble, `hi` (2i+1) in the high one,
// as __nv_cvt_float2_to_fp4x2 packs .x and .y.
KVTIER_HD uint8_t PackE2M1x2(float lo, float hi) {
  return static_cast<uint8_t>(FloatToE2M1(lo) | (FloatToE2M1(hi) << 4));
}

KVTIER_HD void UnpackE2M1x2(uint8_t packed, float* lo, float* hi) {
  *lo = E2M1ToFloat(packed);
  *hi = E2M1ToFloat(static_cast<uint8_t>(packed >> 4));
}

}  // namespace kvtier::codec

#endif  // KVTIER_KERNELS_CODEC_FP4_H_
