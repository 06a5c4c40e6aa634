// FP16 and BF16 <-> float conversions in integer arithmetic, bit-identical on host and device,
// plus the bit helpers the narrower codecs share. Rounding is to nearest, ties to even.
// Every NaN result is canonical: 0x7FFF for FP16/BF16, 0x7FFFFFFF for float (what CUDA's
// host conversions return).
#ifndef KVTIER_KERNELS_CODEC_HALF_H_
#define KVTIER_KERNELS_CODEC_HALF_H_

#include <cstdint>
#include <cstring>

#include "kernels/codec/host_device.h"

namespace kvtier::codec {
namespace internal {

constexpr uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInfBits = 0x7F800000u;
constexpr uint32_t kFloatNanBits = 0x7FFFFFFFu;

KVTIER_HD uint32_t FloatBits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

KVTIER_HD float FloatFromBits(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// REQUIRES: x != 0.
KVTIER_HD int CountLeadingZeros(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __clz(static_cast<int>(x));
#else
  return __builtin_clz(x);
#endif
}

// m >> shift, rounded to nearest, ties to even. REQUIRES: 1 <= shift <= 31.
KVTIER_HD uint32_t ShiftRightRne(uint32_t m, int shift) {
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = m & ((half << 1) - 1);
  const uint32_t q = m >> shift;
  return q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
}

// Unsigned code of |x| in a format with `mbits` mantissa bits and exponent bias `bias`
// (subnormals included), rounded to nearest even; a carry may reach the exponent field.
// `abs` is the float's bits without sign. REQUIRES: |x| is finite and below the format's
// overflow threshold.
KVTIER_HD uint32_t EncodeMagnitude(uint32_t abs, int mbits, int bias) {
  const int drop = 23 - mbits;
  if (abs >= static_cast<uint32_t>(128 - bias) << 23) {  // normal in the target format
    return ((abs + (1u << (drop - 1)) - 1u + ((abs >> drop) & 1u)) >> drop) -
           (static_cast<uint32_t>(127 - bias) << mbits);
  }
  // Count units of the smallest subnormal, 2^(1 - bias - mbits). Shifts past 25 give 0 as
  // 25 does (the 24-bit mantissa is below the half point).
  const int shift = 151 - bias - mbits - static_cast<int>(abs >> 23);
  return ShiftRightRne((abs & 0x7FFFFFu) | 0x800000u, shift < 25 ? shift : 25);
}

// Float bits of the finite magnitude with exponent field `e` and mantissa field `m` in a
// format with `mbits` mantissa bits and exponent bias `bias`. Exact.
KVTIER_HD uint32_t DecodeMagnitude(uint32_t e, uint32_t m, int mbits, int bias) {
  if (e != 0) return ((e + static_cast<uint32_t>(127 - bias)) << 23) | (m << (23 - mbits));
  if (m == 0) return 0;
  // Subnormal m * 2^(1 - bias - mbits): normalize on m's top bit.
  const int top = 31 - CountLeadingZeros(m);
  return (static_cast<uint32_t>(top + 128 - bias - mbits) << 23) |
         ((m << (23 - top)) & 0x7FFFFFu);
}

}  // namespace internal

// Exact. NaNs become the canonical float NaN.
KVTIER_HD float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t e = (bits >> 10) & 0x1Fu;
  const uint32_t m = bits & 0x3FFu;
  if (e == 0x1Fu) {
    return internal::FloatFromBits(m != 0 ? internal::kFloatNanBits
                                          : sign | internal::kFloatInfBits);
  }
  return internal::FloatFromBits(sign | internal::DecodeMagnitude(e, m, 10, 15));
}

// Round to nearest even; |x| >= 65520 becomes +-Inf; NaN becomes 0x7FFF.
KVTIER_HD uint16_t FloatToHalf(float x) {
  const uint32_t bits = internal::FloatBits(x);
  const uint32_t abs = bits & internal::kFloatAbsMask;
  const uint32_t sign = (bits >> 16) & 0x8000u;
  if (abs > internal::kFloatInfBits) return 0x7FFF;
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  return static_cast<uint16_t>(sign | internal::EncodeMagnitude(abs, 10, 15));
}

// Exact (BF16 is the upper half of a float).
KVTIER_HD float Bf16ToFloat(uint16_t bits) {
  return internal::FloatFromBits(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest even; overflow becomes +-Inf; NaN becomes the quiet NaN 0x7FFF.
KVTIER_HD uint16_t FloatToBf16(float x) {
  const uint32_t bits = internal::FloatBits(x);
  if ((bits & internal::kFloatAbsMask) > internal::kFloatInfBits) return 0x7FFF;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace kvtier::codec

#endif  // KVTIER_KERNELS_CODEC_HALF_H_
