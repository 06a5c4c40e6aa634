// Device-only fast forms of three codec conversions, for the hot loops of the migration
// kernel. Each is equal, bit for bit, to the codec function it replaces on every input it is
// given; LaunchFastCodecSelfCheck (self_check.cu) proves it on the device for all inputs, and
// the backend falls back to the codec functions if it ever fails. The codec headers stay the
// single definition of the storage rules: these are faster evaluations of the same rules.
//
//   FastHalfToFloat  the hardware conversion. Equal to codec::HalfToFloat except that a NaN
//                    keeps its payload; callers treat tiles holding NaN with the exact codec.
//   FastE4M3x4       the hardware `cvt.rn.satfinite.e4m3x2.f32`, with NaN bytes forced to
//                    0x7F as codec::FloatToE4M3 does. All 2^32 inputs.
//   FastE2M1         the E2M1 code of the exact product x * m without integer compares:
//                    three fused multiply-adds round |x| m onto the three E2M1 binades at
//                    once and the smallest result is the code. Equal to codec::ProductToE2M1
//                    for every non-NaN x and every m of E2M1Steps' range.
//                    FastPackE2M1x8 packs eight magnitudes the same way and takes the sign
//                    bits from the caller (from the source bytes, 4 instructions per 8 values).
//   FastE4M3         the same conversion of one value that is not NaN (no NaN byte results).
//   FastE4M3ToFloat  the hardware E4M3 -> FP16 conversion, then FP16 -> float. Equal to
//                    codec::E4M3ToFloat for the 254 non-NaN codes; NaN codes give a NaN
//                    (whose payload may differ). FastE4M3x2ToFloat2 converts two codes with
//                    one conversion instruction.
//   FastDivideBy6    p / 6 without a division, for the NVFP4 micro-scale e4m3(p / 6): its E4M3
//                    code equals codec::FloatToE4M3(p / 6) for every p in [+0, FLT_MAX].
//   FastDivideByE4M3 a / d for d the value of a positive E4M3 code, without the IEEE division's
//                    range checks: equal to a / d wherever the quotient is a normal float.
//                    The code's value and reciprocal come from a table (one load), and code
//                    0 gives 0.
//   FastDivideBy2688, FastDivide2688By
//                    A / 2688 and 2688 / A, the NVFP4 scope scales, for A in
//                    [kNvfp4MinAmax, 2^125]: equal to the IEEE divisions there.
#ifndef KVTIER_KERNELS_FAST_CODEC_CUH_
#define KVTIER_KERNELS_FAST_CODEC_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kvtier::gpu {

__device__ __forceinline__ float FastHalfToFloat(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// Four E4M3 codes, a in the lowest byte.
__device__ __forceinline__ uint32_t FastE4M3x4(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  const uint32_t w = lo | (hi << 16);
  // A byte whose low seven bits are all set is NaN (0x7F or 0xFF): clear its sign bit.
  const uint32_t nan = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
  return w & ~nan;
}

// The E4M3 code of x. REQUIRES: x is not NaN (satfinite turns no other input into a NaN byte, so
// this is FastE4M3x4 without its NaN fix-up).
__device__ __forceinline__ uint32_t FastE4M3(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float FastE4M3ToFloat(uint32_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// The two E4M3 codes in 16-bit half kHalf of `codes` (0: the low half; .x: the lower byte) as
// floats. The conversion reads either half in place (no shift).
template <int kHalf>
__device__ __forceinline__ float2 FastE4M3x2ToFloat2(uint32_t codes) {
  static_assert(kHalf == 0 || kHalf == 1);
  uint32_t h;
  if (kHalf == 0) {
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;}"
        : "=r"(h) : "r"(codes));
  } else {
    asm("{.reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;}"
        : "=r"(h) : "r"(codes));
  }
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// The steps of E2M1's three binades as multipliers of x, for one micro-block's multiplier m:
// |x| m rounds to unit steps as 2 |x| m on [0, 2), |x| m on [2, 4) and |x| m / 2 on [4, 6].
// REQUIRES: m in [kE2M1StepsMin, 2^126], so that 2m and m / 2 are exact.
constexpr float kE2M1StepsMin = 0x1p-125f;
struct E2M1Steps {
  float twice, once, half;
  __device__ explicit E2M1Steps(float m) : twice(2.f * m), once(m), half(0.5f * m) {}
};

// The E2M1 code of the exact product |x| m plus kE2M1Bias (2^23 as float bits).
// REQUIRES: x is not NaN.
// y = |x| m lies in one of three binades of E2M1 spacing: [0, 2) with step 0.5, [2, 4) with
// step 1 and [4, 6] with step 2. Adding 2^23 (+ the binade's first code) to y scaled to unit
// steps rounds it, in one IEEE rounding of one fused multiply-add, to the nearest code with ties
// to even, exactly as the codec's midpoint compares do. The scaling that belongs to y's binade
// gives the smallest of the three candidates, so no compare or select is needed; above 6 the
// smallest is at least code 7, to which kSaturate clamps it. The sign bit (bit 3 of the code) is
// left clear: callers packing eight codes add the biased values shifted onto the sign bits
// (SignNibbles8) less the biases.
// kSaturate false skips the clamp. REQUIRES then: |x| m < 7 (below 7 the [4, 6] candidate still
// rounds to code 7). The candidates are positive floats, which order as their bits do: one
// three-way integer min takes the smallest.
constexpr uint32_t kE2M1Bias = 0x4B000000u;
template <bool kSaturate = true>
__device__ __forceinline__ uint32_t FastE2M1MagnitudeBiased(float x, const E2M1Steps& k) {
  const float c1 = __fmaf_rn(fabsf(x), k.twice, 0x1p23f);
  const float c2 = __fmaf_rn(fabsf(x), k.once, 0x1p23f + 2.f);
  const float c3 = __fmaf_rn(fabsf(x), k.half, 0x1p23f + 4.f);
  const uint32_t c = __vimin3_u32(__float_as_uint(c1), __float_as_uint(c2), __float_as_uint(c3));
  return kSaturate ? min(c, kE2M1Bias + 7u) : c;
}

// The E2M1 code of the exact product x * m: the magnitude code and x's sign bit.
// REQUIRES: x is not NaN.
__device__ __forceinline__ uint32_t FastE2M1(float x, const E2M1Steps& k) {
  return (FastE2M1MagnitudeBiased(x, k) - kE2M1Bias) | ((__float_as_uint(x) >> 28) & 8u);
}

// The bytes of {b1, b0} that kSelector names (as __byte_perm's), each filled with its sign bit:
// prmt.b32's selector nibbles with bit 3 set (which __byte_perm ignores).
template <uint32_t kSelector>
__device__ __forceinline__ uint32_t SignBytes(uint32_t b0, uint32_t b1) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(b0), "r"(b1), "n"(kSelector | 0x8888u));
  return r;
}

// Bit 4i + 3 set where the sign bit (bit 7) of byte i of the eight bytes b0 (0-3, low byte
// first) and b1 (4-7) is set: the sign bits of eight packed E2M1 codes.
__device__ __forceinline__ uint32_t SignNibbles8(uint32_t b0, uint32_t b1) {
  const uint32_t even = SignBytes<0x6420>(b0, b1);  // bytes 0, 2, 4, 6
  const uint32_t odd = SignBytes<0x7531>(b0, b1);   // bytes 1, 3, 5, 7
  return (even & 0x08080808u) | (odd & 0x80808080u);
}

// Eight E2M1 codes of the exact products x[i] * m packed as codec::PackE2M1x2 does (x[0] in the
// low nibble), with the sign bits `signs` (SignNibbles8: bit 4i + 3 set iff x[i] is negative),
// k = E2M1Steps(m). REQUIRES: no x[i] is NaN; with kSaturate false, every |x[i] m| < 7.
// The biased codes are summed onto the sign bits less the eight biases: magnitude codes fill bits
// 4i..4i+2, so the sum is their OR.
template <bool kSaturate>
__device__ __forceinline__ uint32_t FastPackE2M1x8(const float* x, const E2M1Steps& k,
                                                   uint32_t signs) {
  uint32_t w = signs - kE2M1Bias * 0x11111111u;  // mod 2^32, as the sums below
#pragma unroll
  for (int i = 0; i < 8; ++i) w += FastE2M1MagnitudeBiased<kSaturate>(x[i], k) << (4 * i);
  return w;
}

// p / 6 for p in [+0, FLT_MAX]: the product by RN(1/6), corrected once by its exact residual
// (Markstein's theorem: correctly rounded wherever the quotient is a normal float). Below
// p = 2^-125, where the IEEE quotient is subnormal, it may differ by an ulp; E4M3 rounds both to
// 0 there.
__device__ __forceinline__ float FastDivideBy6(float p) {
  constexpr float kSixth = 1.f / 6.f;
  const float q = __fmul_rn(p, kSixth);
  return __fmaf_rn(__fmaf_rn(-q, 6.f, p), kSixth, q);
}

// The value d of each E4M3 code c < 128 and RN(1 / d), for FastDivideByE4M3; code 0 holds
// {1, 0}, so that its quotient is 0. Computed by the compiler: d is (8 + mantissa) x 2^(exp - 10)
// for exp > 0 and mantissa x 2^-9 for exp 0, exactly, and a constant division rounds as IEEE.
// (codec::E4M3ToFloat, the definition, is not constexpr; the self-check divides by each code's
// value from it, which pins the table to it.)
struct E4M3Step {
  float value, reciprocal;
};
struct E4M3Steps {
  E4M3Step code[128];
  constexpr E4M3Steps() : code{} {
    for (int c = 1; c < 128; ++c) {
      const int exp = c >> 3, mantissa = c & 7;
      float d = exp == 0 ? mantissa * 0x1p-9f : (8 + mantissa) * 0x1p-10f;
      for (int e = 0; e < exp; ++e) d *= 2.f;
      code[c] = {d, 1.f / d};
    }
    code[0] = {1.f, 0.f};
  }
};
static __device__ const E4M3Steps kE4M3Steps;

// a / d, correctly rounded, for d = E4M3ToFloat(code) with code in [1, 0x7E] and a / d a normal
// float; 0 for code 0. The table's RN(1 / d) makes the product a x RN(1 / d), corrected once by
// its exact residual, RN(a / d) (Markstein's theorem, as FastDivideBy6).
__device__ __forceinline__ float FastDivideByE4M3(float a, uint32_t code) {
  const float2 step = __ldg(reinterpret_cast<const float2*>(&kE4M3Steps.code[code]));
  const float q = __fmul_rn(a, step.y);
  return __fmaf_rn(__fmaf_rn(-q, step.x, a), step.y, q);
}

// A / 2688 for A in [2^-96, FLT_MAX]: RN(1 / 2688) and one correction (Markstein's theorem:
// the quotient is a normal float). The self-check compares the range the migration uses, A up
// to kFastDivide2688ByMax.
__device__ __forceinline__ float FastDivideBy2688(float a) {
  constexpr float kInverse = 1.f / 2688.f;
  const float q = __fmul_rn(a, kInverse);
  return __fmaf_rn(__fmaf_rn(-q, 2688.f, a), kInverse, q);
}

// 2688 / A for A in [2^-96, kFastDivide2688ByMax]: the hardware reciprocal refined by one Newton
// step, the quotient corrected once by its residual, without the IEEE division's range checks.
// Equal to the IEEE division on every such A (self-check); above 2^126 the reciprocal would be
// subnormal, which the approximation flushes to zero.
constexpr float kFastDivide2688ByMax = 0x1p125f;
__device__ __forceinline__ float FastDivide2688By(float a) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  r = __fmaf_rn(r, __fmaf_rn(-a, r, 1.f), r);
  const float q = __fmul_rn(2688.f, r);
  return __fmaf_rn(__fmaf_rn(-q, a, 2688.f), r, q);
}

// max(a, |x|) where a NaN x makes the result NaN (PTX max.NaN): an amax that also flags NaN.
__device__ __forceinline__ float MaxAbsNan(float a, float x) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(fabsf(x)));
  return r;
}

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_FAST_CODEC_CUH_
