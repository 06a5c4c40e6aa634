// Tests of the scalar codecs against two references: an independent implementation of the
// formats' definitions (IEEE 754 / OCP FP8 / OCP MX E2M1, exact in double), and CUDA 13's own
// host conversions from <cuda_fp16.h>, <cuda_bf16.h>, <cuda_fp8.h> and <cuda_fp4.h> when
// those headers are available (they need no GPU).
//
// What CUDA 13 does, and what these codecs therefore do (each agrees with the specs wherever
// the specs define a result; no disagreement between CUDA and the specs was found):
// - Float -> FP8 with __NV_SATFINITE canonicalizes NaN to +NaN first, so every NaN, of either
//   sign, becomes 0x7F in both E4M3 and E5M2 (both valid OCP NaN codes).
// - E4M3: |x| <= 464 rounds to nearest even (464 ties down to 448); above, and +-Inf, saturate
//   to +-448. E5M2: |x| >= 61440 (the tie that would round to Inf) and +-Inf saturate to
//   +-57344.
// - -0 and negative values that round to zero keep their sign: 0x80 in FP8, 0x8 in E2M1.
// - Float -> E2M1 always saturates: |x| > 6 and +-Inf become +-6, and NaN becomes +6 (0x7).
//   OCP MX leaves NaN -> E2M1 to the implementation.
// - FP8 and FP16 NaNs decode to the canonical float NaN 0x7FFFFFFF (CUDA discards the sign);
//   float -> FP16/BF16 turns every NaN into 0x7FFF.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/codec/fp4.h"
#include "kernels/codec/fp8.h"
#include "kernels/codec/half.h"
#include "kernels/codec/nvfp4.h"

#if __has_include(<cuda_fp4.h>)
#define KVTIER_HAVE_CUDA_FP_HEADERS 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#pragma GCC diagnostic pop
#else
#define KVTIER_HAVE_CUDA_FP_HEADERS 0
#endif

namespace kvtier::codec {
namespace {

uint32_t Bits(float x) { return internal::FloatBits(x); }
float FromBits(uint32_t u) { return internal::FloatFromBits(u); }

constexpr uint32_t kCanonicalNan = 0x7FFFFFFFu;

// ---------------------------------------------------------------------------------------------
// Reference: a binary format by its definition. Non-negative finite codes are 0..max_code and
// ordered by value.
struct Format {
  const char* name;
  int mbits;
  int bias;
  uint32_t max_code;
  uint32_t sign_bit;
};
constexpr Format kFp16{"fp16", 10, 15, 0x7BFF, 0x8000};
constexpr Format kBf16{"bf16", 7, 127, 0x7F7F, 0x8000};
constexpr Format kE4M3{"e4m3", 3, 7, 0x7E, 0x80};
constexpr Format kE5M2{"e5m2", 2, 15, 0x7B, 0x80};
constexpr Format kE2M1{"e2m1", 1, 1, 0x7, 0x8};

// Exact value of the non-negative code c; c == max_code + 1 gives the first value past max.
double SpecValue(const Format& f, uint32_t c) {
  const int e = static_cast<int>(c >> f.mbits);
  const uint32_t m = c & ((1u << f.mbits) - 1);
  if (e == 0) return std::ldexp(m, 1 - f.bias - f.mbits);
  return std::ldexp((1u << f.mbits) + m, e - f.bias - f.mbits);
}

// The values of codes 0..max_code + 1, ascending.
std::vector<double> SpecValues(const Format& f) {
  std::vector<double> values;
  for (uint32_t c = 0; c <= f.max_code + 1; ++c) values.push_back(SpecValue(f, c));
  return values;
}

// Round to nearest, ties to the even code. Past max + ulp/2 (the tie included, since max is
// odd): max when saturating, else the code after max (Inf). `values` is SpecValues(f).
// REQUIRES: x is not NaN.
uint32_t SpecEncode(const Format& f, const std::vector<double>& values, double x,
                    bool saturate) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit : 0;
  const double a = std::fabs(x);
  if (a >= (values[f.max_code] + values[f.max_code + 1]) / 2) {
    return sign | (saturate ? f.max_code : f.max_code + 1);
  }
  // The largest code whose value is <= a; a < values[max_code + 1].
  const uint32_t lo = static_cast<uint32_t>(
      std::upper_bound(values.begin(), values.end(), a) - values.begin() - 1);
  const double midpoint = (values[lo] + values[lo + 1]) / 2;  // exact
  const bool up = a > midpoint || (a == midpoint && (lo & 1u));
  return sign | (lo + (up ? 1u : 0u));
}

// Every value and every midpoint between neighbours (and past max) of `f`.
std::vector<double> Anchors(const std::vector<double>& values) {
  std::vector<double> anchors;
  for (size_t c = 0; c + 1 < values.size(); ++c) {
    anchors.push_back(values[c]);
    anchors.push_back((values[c] + values[c + 1]) / 2);
  }
  return anchors;
}

// Float bit patterns of the dense sweeps: every kSweepStride-th pattern (an odd stride, so all
// residues of the low bits occur, about 4.2M patterns), and the 2 * radius + 1 patterns
// centred on each anchor and on its negative.
constexpr uint64_t kSweepStride = 1021;

template <typename Fn>
void ForEachSweepBits(const std::vector<double>& anchors, uint32_t radius, Fn fn) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += kSweepStride) fn(static_cast<uint32_t>(u));
  for (double anchor : anchors) {
    const uint32_t first = Bits(static_cast<float>(anchor)) - radius;
    for (uint32_t d = 0; d <= 2 * radius; ++d) {
      fn(first + d);
      fn((first + d) ^ 0x80000000u);
    }
  }
}

// Counts mismatches and keeps the first one's description.
struct Mismatches {
  uint64_t count = 0;
  std::string first;

  void Check(const char* what, uint32_t input, uint32_t got, uint32_t want) {
    if (got == want) return;
    if (count++ == 0) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%s(0x%08X = %.9g): got 0x%X, want 0x%X", what, input,
                    static_cast<double>(FromBits(input)), got, want);
      first = buf;
    }
  }
};

using EncodeFn = uint32_t (*)(float);

// Compares `ours` with the definition of `f` and, when given, with CUDA over the sweep. The
// 16-bit formats have 64K anchors and take a smaller radius around each.
void CheckEncoderSweep(const Format& f, bool saturate, uint32_t nan_code, EncodeFn ours,
                       EncodeFn cuda) {
  const uint32_t radius = f.max_code > 0xFF ? 2 : 16;
  const std::vector<double> values = SpecValues(f);
  Mismatches vs_spec, vs_cuda;
  ForEachSweepBits(Anchors(values), radius, [&](uint32_t u) {
    const float x = FromBits(u);
    const uint32_t got = ours(x);
    vs_spec.Check(f.name, u, got,
                  std::isnan(x) ? nan_code : SpecEncode(f, values, x, saturate));
    if (cuda != nullptr) vs_cuda.Check(f.name, u, got, cuda(x));
  });
  EXPECT_EQ(vs_spec.count, 0u) << "vs definition: " << vs_spec.first;
  EXPECT_EQ(vs_cuda.count, 0u) << "vs CUDA: " << vs_cuda.first;
}

// Bits of the definition's value of `code` (with sign), or of Inf for the code after max.
uint32_t SpecDecodeBits(const Format& f, uint32_t code) {
  const uint32_t mag = code & ~f.sign_bit;
  const float v = mag > f.max_code ? INFINITY : static_cast<float>(SpecValue(f, mag));
  return Bits((code & f.sign_bit) ? -v : v);
}

uint32_t OursHalf(float x) { return FloatToHalf(x); }
uint32_t OursBf16(float x) { return FloatToBf16(x); }
uint32_t OursE4M3(float x) { return FloatToE4M3(x); }
uint32_t OursE5M2(float x) { return FloatToE5M2(x); }
uint32_t OursE2M1(float x) { return FloatToE2M1(x); }

#if KVTIER_HAVE_CUDA_FP_HEADERS
uint32_t CudaHalf(float x) { return static_cast<__half_raw>(__float2half_rn(x)).x; }
uint32_t CudaBf16(float x) { return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x; }
uint32_t CudaE4M3(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }
uint32_t CudaE5M2(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); }
uint32_t CudaE2M1(float x) { return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); }
float CudaHalfToFloat(uint16_t h) {
  __half_raw raw;
  raw.x = h;
  return __half2float(__half(raw));
}
float CudaBf16ToFloat(uint16_t b) {
  __nv_bfloat16_raw raw;
  raw.x = b;
  return __bfloat162float(__nv_bfloat16(raw));
}
constexpr EncodeFn kCudaHalf = CudaHalf;
constexpr EncodeFn kCudaBf16 = CudaBf16;
constexpr EncodeFn kCudaE4M3 = CudaE4M3;
constexpr EncodeFn kCudaE5M2 = CudaE5M2;
constexpr EncodeFn kCudaE2M1 = CudaE2M1;
#else
constexpr EncodeFn kCudaHalf = nullptr;
constexpr EncodeFn kCudaBf16 = nullptr;
constexpr EncodeFn kCudaE4M3 = nullptr;
constexpr EncodeFn kCudaE5M2 = nullptr;
constexpr EncodeFn kCudaE2M1 = nullptr;
#endif

// ---------------------------------------------------------------------------------------------
// FP16 and BF16

TEST(HalfTest, DecodesEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const bool nan = (h & 0x7FFF) > 0x7C00;
    const uint32_t got = Bits(HalfToFloat(static_cast<uint16_t>(h)));
    ASSERT_EQ(got, nan ? kCanonicalNan : SpecDecodeBits(kFp16, h)) << std::hex << h;
#if KVTIER_HAVE_CUDA_FP_HEADERS
    ASSERT_EQ(got, Bits(CudaHalfToFloat(static_cast<uint16_t>(h)))) << std::hex << h;
#endif
  }
}

TEST(HalfTest, RoundTripsEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const bool nan = (h & 0x7FFF) > 0x7C00;
    ASSERT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), nan ? 0x7FFFu : h)
        << std::hex << h;
  }
}

TEST(HalfTest, EncodesFloatSweep) {
  CheckEncoderSweep(kFp16, /*saturate=*/false, 0x7FFF, OursHalf, kCudaHalf);
}

TEST(HalfTest, OverflowAndUnderflow) {
  EXPECT_EQ(FloatToHalf(65504.f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.f), 0x7C00);  // the tie past max rounds to Inf (max is odd)
  EXPECT_EQ(FloatToHalf(-INFINITY), 0xFC00);
  EXPECT_EQ(FloatToHalf(-NAN), 0x7FFF);
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(FloatToHalf(0x1.000002p-25f), 0x0001);
  EXPECT_EQ(FloatToHalf(-0x1p-30f), 0x8000);
}

TEST(Bf16Test, DecodesEveryPattern) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const uint32_t got = Bits(Bf16ToFloat(static_cast<uint16_t>(b)));
    ASSERT_EQ(got, b << 16) << std::hex << b;
#if KVTIER_HAVE_CUDA_FP_HEADERS
    ASSERT_EQ(got, Bits(CudaBf16ToFloat(static_cast<uint16_t>(b)))) << std::hex << b;
#endif
  }
}

TEST(Bf16Test, RoundTripsEveryPattern) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const bool nan = (b & 0x7FFF) > 0x7F80;
    ASSERT_EQ(FloatToBf16(Bf16ToFloat(static_cast<uint16_t>(b))), nan ? 0x7FFFu : b)
        << std::hex << b;
  }
}

TEST(Bf16Test, EncodesFloatSweep) {
  CheckEncoderSweep(kBf16, /*saturate=*/false, 0x7FFF, OursBf16, kCudaBf16);
}

// ---------------------------------------------------------------------------------------------
// FP8

TEST(Fp8Test, DecodesEveryCode) {
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const uint32_t e4m3 = Bits(E4M3ToFloat(code));
    const uint32_t e5m2 = Bits(E5M2ToFloat(code));
    const bool e4m3_nan = (c & 0x7F) == 0x7F;
    const bool e5m2_nan = (c & 0x7F) > 0x7C;
    EXPECT_EQ(e4m3, e4m3_nan ? kCanonicalNan : SpecDecodeBits(kE4M3, c)) << c;
    EXPECT_EQ(e5m2, e5m2_nan ? kCanonicalNan : SpecDecodeBits(kE5M2, c)) << c;
#if KVTIER_HAVE_CUDA_FP_HEADERS
    EXPECT_EQ(e4m3, Bits(CudaHalfToFloat(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3).x))) << c;
    EXPECT_EQ(e5m2, Bits(CudaHalfToFloat(__nv_cvt_fp8_to_halfraw(code, __NV_E5M2).x))) << c;
#endif
  }
  EXPECT_EQ(E4M3ToFloat(0x7E), kE4M3Max);
  EXPECT_EQ(E4M3ToFloat(0x01), 0x1p-9f);
  EXPECT_EQ(E5M2ToFloat(0x7B), kE5M2Max);
  EXPECT_EQ(E5M2ToFloat(0x7C), INFINITY);
  EXPECT_EQ(E5M2ToFloat(0xFC), -INFINITY);
  EXPECT_EQ(E5M2ToFloat(0x01), 0x1p-16f);
}

// Every FP16 and every BF16 value, through our exact decoders, encodes as CUDA encodes the
// 16-bit value itself.
TEST(Fp8Test, EncodesEveryHalfAndBf16Pattern) {
  const std::vector<double> e4m3_values = SpecValues(kE4M3);
  const std::vector<double> e5m2_values = SpecValues(kE5M2);
  Mismatches mismatches;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t p = static_cast<uint16_t>(h);
    for (const float x : {HalfToFloat(p), Bf16ToFloat(p)}) {
      const bool nan = std::isnan(x);
      mismatches.Check("e4m3 spec", Bits(x), FloatToE4M3(x),
                       nan ? 0x7Fu : SpecEncode(kE4M3, e4m3_values, x, /*saturate=*/true));
      mismatches.Check("e5m2 spec", Bits(x), FloatToE5M2(x),
                       nan ? 0x7Fu : SpecEncode(kE5M2, e5m2_values, x, /*saturate=*/true));
    }
#if KVTIER_HAVE_CUDA_FP_HEADERS
    __half_raw half;
    half.x = p;
    __nv_bfloat16_raw bf16;
    bf16.x = p;
    mismatches.Check("e4m3 from fp16", h, FloatToE4M3(HalfToFloat(p)),
                     __nv_cvt_halfraw_to_fp8(half, __NV_SATFINITE, __NV_E4M3));
    mismatches.Check("e5m2 from fp16", h, FloatToE5M2(HalfToFloat(p)),
                     __nv_cvt_halfraw_to_fp8(half, __NV_SATFINITE, __NV_E5M2));
    mismatches.Check("e4m3 from bf16", h, FloatToE4M3(Bf16ToFloat(p)),
                     __nv_cvt_bfloat16raw_to_fp8(bf16, __NV_SATFINITE, __NV_E4M3));
    mismatches.Check("e5m2 from bf16", h, FloatToE5M2(Bf16ToFloat(p)),
                     __nv_cvt_bfloat16raw_to_fp8(bf16, __NV_SATFINITE, __NV_E5M2));
#endif
  }
  EXPECT_EQ(mismatches.count, 0u) << mismatches.first;
}

TEST(Fp8Test, EncodesE4M3FloatSweep) {
  CheckEncoderSweep(kE4M3, /*saturate=*/true, 0x7F, OursE4M3, kCudaE4M3);
}

TEST(Fp8Test, EncodesE5M2FloatSweep) {
  CheckEncoderSweep(kE5M2, /*saturate=*/true, 0x7F, OursE5M2, kCudaE5M2);
}

// The behaviours CUDA defines (checked against CUDA by the sweeps above), spelled out.
TEST(Fp8Test, SaturationNanAndSignedZero) {
  EXPECT_EQ(FloatToE4M3(448.f), 0x7E);
  EXPECT_EQ(FloatToE4M3(464.f), 0x7E);  // tie between 448 and 480 -> 448 (even mantissa)
  EXPECT_EQ(FloatToE4M3(464.00003f), 0x7E);
  EXPECT_EQ(FloatToE4M3(1e30f), 0x7E);
  EXPECT_EQ(FloatToE4M3(INFINITY), 0x7E);
  EXPECT_EQ(FloatToE4M3(-INFINITY), 0xFE);
  EXPECT_EQ(FloatToE4M3(NAN), 0x7F);
  EXPECT_EQ(FloatToE4M3(-NAN), 0x7F);  // CUDA drops a NaN's sign
  EXPECT_EQ(FloatToE4M3(-0.f), 0x80);
  EXPECT_EQ(FloatToE4M3(-1e-30f), 0x80);
  EXPECT_EQ(FloatToE4M3(0x1p-10f), 0x00);  // tie between 0 and 2^-9 -> 0
  EXPECT_EQ(FloatToE4M3(0x1.000002p-10f), 0x01);
  EXPECT_EQ(FloatToE4M3(0x1.ep-7f), 0x08);  // 15 * 2^-10 rounds up into the normal range

  EXPECT_EQ(FloatToE5M2(57344.f), 0x7B);
  EXPECT_EQ(FloatToE5M2(61439.996f), 0x7B);
  EXPECT_EQ(FloatToE5M2(61440.f), 0x7B);  // would round to Inf without saturation
  EXPECT_EQ(FloatToE5M2(INFINITY), 0x7B);
  EXPECT_EQ(FloatToE5M2(-INFINITY), 0xFB);
  EXPECT_EQ(FloatToE5M2(NAN), 0x7F);
  EXPECT_EQ(FloatToE5M2(-NAN), 0x7F);
  EXPECT_EQ(FloatToE5M2(-0.f), 0x80);
  EXPECT_EQ(FloatToE5M2(0x1p-17f), 0x00);
  EXPECT_EQ(FloatToE5M2(-0x1.000002p-17f), 0x81);
}

// ---------------------------------------------------------------------------------------------
// E2M1

TEST(Fp4Test, DecodesEveryCode) {
  constexpr float kSpec[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                               -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  for (uint32_t c = 0; c < 16; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    EXPECT_EQ(Bits(E2M1ToFloat(code)), Bits(kSpec[c])) << c;
    EXPECT_EQ(Bits(E2M1ToFloat(code)), SpecDecodeBits(kE2M1, c)) << c;
    EXPECT_EQ(Bits(E2M1ToFloat(static_cast<uint8_t>(code | 0xA0))), Bits(kSpec[c])) << c;
#if KVTIER_HAVE_CUDA_FP_HEADERS
    EXPECT_EQ(Bits(E2M1ToFloat(code)),
              Bits(CudaHalfToFloat(__nv_cvt_fp4_to_halfraw(code, __NV_E2M1).x)))
        << c;
#endif
  }
}

TEST(Fp4Test, TiesRoundToEven) {
  struct Case {
    float x;
    uint8_t code;
  };
  const Case kCases[] = {{0.25f, 0x0}, {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4},
                         {2.5f, 0x4},  {3.5f, 0x6},  {5.f, 0x6},   {0.2500001f, 0x1},
                         {5.0000005f, 0x7}};
  for (const Case& c : kCases) {
    EXPECT_EQ(FloatToE2M1(c.x), c.code) << c.x;
    EXPECT_EQ(FloatToE2M1(-c.x), c.code | 0x8) << -c.x;
  }
}

TEST(Fp4Test, EncodesFloatSweep) {
  CheckEncoderSweep(kE2M1, /*saturate=*/true, 0x7, OursE2M1, kCudaE2M1);
}

TEST(Fp4Test, SaturationNanAndSignedZero) {
  for (const float x : {6.f, 6.5f, 7.f, 1e6f, 1e30f, FLT_MAX, INFINITY}) {
    EXPECT_EQ(FloatToE2M1(x), 0x7) << x;
    EXPECT_EQ(FloatToE2M1(-x), 0xF) << -x;
  }
  EXPECT_EQ(FloatToE2M1(NAN), 0x7);   // NaN -> +6, whatever the sign, as CUDA 13 does
  EXPECT_EQ(FloatToE2M1(-NAN), 0x7);
  EXPECT_EQ(FloatToE2M1(0.f), 0x0);
  EXPECT_EQ(FloatToE2M1(-0.f), 0x8);
  EXPECT_EQ(FloatToE2M1(-0.1f), 0x8);
  EXPECT_EQ(FloatToE2M1(0x1p-149f), 0x0);  // float subnormals
  EXPECT_EQ(FloatToE2M1(-0x1p-149f), 0x8);
  EXPECT_EQ(FloatToE2M1(-0x1.fffffcp-127f), 0x8);
}

TEST(Fp4Test, ProductRoundsOnce) {
  // Where x * m is exact (m a power of two), the product's code is the float's.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-8.f, 8.f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng), m = std::ldexp(1.f, static_cast<int>(rng() % 9) - 4);
    EXPECT_EQ(ProductToE2M1(x / m, m), FloatToE2M1(x)) << x << " " << m;
  }
  // x m = 0.25 (1 + 2^-24 - 2^-47) is above the midpoint 0.25 and rounds to 0.5; as a float it
  // rounds to 0.25, a tie that FloatToE2M1 sends to 0.
  const float x = 0.25f * 0x1.fffffep-1f, m = 0x1.000002p0f;
  EXPECT_EQ(FloatToE2M1(x * m), 0x0);
  EXPECT_EQ(ProductToE2M1(x, m), 0x1);
  EXPECT_EQ(ProductToE2M1(-x, m), 0x9);
  // Below a midpoint: 0.75 (1 - 2^-44) rounds to 0.5 as a product, to the tie 0.75 (and so to
  // 1) as a float.
  const float y = 0.75f * 0x1.000004p0f, n = 0x1.fffff8p-1f;
  EXPECT_EQ(FloatToE2M1(y * n), 0x2);
  EXPECT_EQ(ProductToE2M1(y, n), 0x1);
  // Saturation, NaN, infinities and signed zeros as FloatToE2M1; no overflow to a float.
  EXPECT_EQ(ProductToE2M1(FLT_MAX, 4.f), 0x7);
  EXPECT_EQ(ProductToE2M1(-FLT_MAX, 4.f), 0xF);
  EXPECT_EQ(ProductToE2M1(INFINITY, 0x1p-100f), 0x7);
  EXPECT_EQ(ProductToE2M1(-INFINITY, 1.f), 0xF);
  EXPECT_EQ(ProductToE2M1(NAN, 1.f), 0x7);
  EXPECT_EQ(ProductToE2M1(-NAN, 1.f), 0x7);
  EXPECT_EQ(ProductToE2M1(-0.f, 3.f), 0x8);
  EXPECT_EQ(ProductToE2M1(-0x1p-149f, 0x1p-20f), 0x8);  // the product underflows a float
}

TEST(Fp4Test, PackOrderMatchesCuda) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-8.f, 8.f);
  for (int i = 0; i < 10000; ++i) {
    const float lo = dist(rng), hi = dist(rng);
    const uint8_t packed = PackE2M1x2(lo, hi);
    EXPECT_EQ(packed, FloatToE2M1(lo) | (FloatToE2M1(hi) << 4));
#if KVTIER_HAVE_CUDA_FP_HEADERS
    EXPECT_EQ(packed, __nv_cvt_float2_to_fp4x2(make_float2(lo, hi), __NV_E2M1,
                                               cudaRoundNearest));
#endif
    float out_lo, out_hi;
    UnpackE2M1x2(packed, &out_lo, &out_hi);
    EXPECT_EQ(out_lo, E2M1ToFloat(FloatToE2M1(lo)));
    EXPECT_EQ(out_hi, E2M1ToFloat(FloatToE2M1(hi)));
  }
  EXPECT_EQ(PackE2M1x2(0.5f, -6.f), 0xF1);  // element 2i in the low nibble
}

// ---------------------------------------------------------------------------------------------
// NVFP4 recipe

// Encodes a scope of micro-blocks of 16 with second-level amax `amax` and decodes it back.
std::vector<float> RoundTrip(const std::vector<float>& x, float amax) {
  const float s_enc = Nvfp4EncodeScale(amax);
  const float d = Nvfp4DecodeScale(amax);
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += 16) {
    float micro_amax = 0.f;
    for (size_t i = b; i < b + 16; ++i) micro_amax = std::fmax(micro_amax, std::fabs(x[i]));
    const uint8_t sf = Nvfp4MicroScale(s_enc, micro_amax);
    for (size_t i = b; i < b + 16; ++i) {
      out[i] = Nvfp4DecodeValue(Nvfp4EncodeValue(x[i], s_enc, sf), sf, d);
    }
  }
  return out;
}

TEST(Nvfp4Test, AllZeroScope) {
  EXPECT_EQ(Nvfp4EncodeScale(0.f), 0.f);
  EXPECT_EQ(Nvfp4DecodeScale(0.f), 0.f);
  EXPECT_EQ(Nvfp4MicroScale(0.f, 0.f), 0);
  EXPECT_EQ(Nvfp4MicroScale(0.f, INFINITY), 0);  // 0 * Inf must not become a NaN scale
  for (const float x : {0.f, -0.f, 1.f, -3.f, INFINITY, -INFINITY, NAN}) {
    EXPECT_EQ(Nvfp4EncodeValue(x, 0.f, 0), 0) << x;
    EXPECT_EQ(Nvfp4EncodeValue(x, 1.f, 0), 0) << x;  // sf == 0: the micro-block is zeros
    EXPECT_EQ(Nvfp4EncodeValue(x, 0.f, 0x38), 0) << x;
  }
  EXPECT_EQ(Nvfp4DecodeValue(0, 0, 0.f), 0.f);
  for (float v : RoundTrip(std::vector<float>(32, 0.f), 0.f)) EXPECT_EQ(Bits(v), 0u);
}

// A micro-block tiny against the tensor-wide amax underflows its E4M3 scale and decodes as
// zeros; the same block under its own (block, head) amax survives.
TEST(Nvfp4Test, MicroScaleUnderflow) {
  std::vector<float> x(32, 1e-3f);
  x[16] = 1e4f;
  const float s_enc = Nvfp4EncodeScale(1e4f);
  EXPECT_EQ(Nvfp4MicroScale(s_enc, 1e-3f), 0);  // 0.2688 * 1e-3 / 6 < 2^-10
  const std::vector<float> y = RoundTrip(x, 1e4f);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(y[i], 0.f) << i;
  EXPECT_NEAR(y[16], 1e4f, 1e4f * 0.07f);
  const std::vector<float> own = RoundTrip(std::vector<float>(x.begin(), x.begin() + 16), 1e-3f);
  for (float v : own) EXPECT_NEAR(v, 1e-3f, 1e-4f);
}

// With A = 2688, S_enc = 1 and d = 1, so the micro-scale path sees t = a / 6 exactly.
TEST(Nvfp4Test, MicroScaleSaturatesAt448) {
  EXPECT_EQ(Nvfp4EncodeScale(2688.f), 1.f);
  EXPECT_EQ(Nvfp4DecodeScale(2688.f), 1.f);
  EXPECT_EQ(Nvfp4MicroScale(1.f, 2688.f), 0x7E);  // t = 448
  EXPECT_EQ(Nvfp4MicroScale(1.f, 2784.f), 0x7E);  // t = 464: the tie rounds down to 448
  EXPECT_EQ(Nvfp4MicroScale(1.f, 2880.f), 0x7E);  // t = 480 saturates
  EXPECT_EQ(Nvfp4MicroScale(1.f, INFINITY), 0x7E);
  EXPECT_EQ(Nvfp4MicroScale(1.f, NAN), 0);
  EXPECT_EQ(Nvfp4MicroScale(1.f, 2496.f), 0x7D);  // t = 416
  // x = A encodes as 6 * 448 and decodes to A exactly.
  EXPECT_EQ(Nvfp4EncodeValue(2688.f, 1.f, 0x7E), 0x7);
  EXPECT_EQ(Nvfp4DecodeValue(0x7, 0x7E, 1.f), 2688.f);
  EXPECT_EQ(Nvfp4DecodeValue(0xF, 0x7E, 1.f), -2688.f);
}

// NaN and Inf elements (the scope amax being that of the finite values) encode by the E2M1
// rule; -0 keeps its sign.
TEST(Nvfp4Test, NonFiniteElementsAndNegativeZero) {
  const float s_enc = Nvfp4EncodeScale(10.5f);  // 256, exactly
  const float d = Nvfp4DecodeScale(10.5f);       // 1 / 256
  const uint8_t sf = Nvfp4MicroScale(s_enc, 10.5f);
  EXPECT_EQ(sf, 0x7E);
  EXPECT_EQ(Nvfp4EncodeValue(INFINITY, s_enc, sf), 0x7);
  EXPECT_EQ(Nvfp4EncodeValue(-INFINITY, s_enc, sf), 0xF);
  EXPECT_EQ(Nvfp4EncodeValue(NAN, s_enc, sf), 0x7);
  EXPECT_EQ(Nvfp4EncodeValue(-NAN, s_enc, sf), 0x7);
  EXPECT_EQ(Nvfp4DecodeValue(0x7, sf, d), 10.5f);
  EXPECT_EQ(Nvfp4EncodeValue(-0.f, s_enc, sf), 0x8);
  const float neg_zero = Nvfp4DecodeValue(0x8, sf, d);
  EXPECT_EQ(neg_zero, 0.f);
  EXPECT_TRUE(std::signbit(neg_zero));
}

// The scope amax rule: NaN, negative and below 2^-96 zero the scope; +Inf saturates to FLT_MAX.
TEST(Nvfp4Test, NonFiniteAndTinyScopeAmax) {
  for (const float a : {NAN, -NAN, -1.f, -INFINITY, 0x1p-97f, 1e-35f, 0x1p-149f}) {
    EXPECT_EQ(Nvfp4EncodeScale(a), 0.f) << a;
    EXPECT_EQ(Nvfp4DecodeScale(a), 0.f) << a;
  }
  EXPECT_EQ(Nvfp4EncodeScale(INFINITY), kNvfp4ScaleRange / FLT_MAX);
  EXPECT_EQ(Nvfp4DecodeScale(INFINITY), FLT_MAX / kNvfp4ScaleRange);
  // Under an infinite scope amax ordinary micro-blocks underflow to zeros, and an Inf element
  // (micro amax Inf) decodes to a finite value near FLT_MAX.
  const float s_enc = Nvfp4EncodeScale(INFINITY), d = Nvfp4DecodeScale(INFINITY);
  EXPECT_EQ(Nvfp4MicroScale(s_enc, 1e30f), 0);
  const uint8_t sf = Nvfp4MicroScale(s_enc, INFINITY);
  EXPECT_EQ(sf, 0x7E);
  EXPECT_EQ(Nvfp4EncodeValue(1e30f, s_enc, sf), 0);
  EXPECT_EQ(Nvfp4EncodeValue(INFINITY, s_enc, sf), 0x7);
  const float inf_decoded = Nvfp4DecodeValue(0x7, sf, d);
  EXPECT_TRUE(std::isfinite(inf_decoded));
  EXPECT_GT(inf_decoded, 0.99f * FLT_MAX);
  // The extremes of the accepted range round-trip with every intermediate a normal float.
  for (const float a : {0x1p-96f, FLT_MAX}) {
    std::vector<float> x(16);
    for (int i = 0; i < 16; ++i) x[i] = a * (static_cast<float>(i - 8) / 8.f);
    const std::vector<float> y = RoundTrip(x, a);
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(y[i], x[i], a / 5.f) << a << " " << i;
    EXPECT_FLOAT_EQ(y[0], -a) << a;
  }
}

// Random activations with outlier channels, per-tensor second level. The codes equal the
// recipe evaluated with CUDA's conversions, and each error is at most one E2M1 step of its
// micro-block: |x - x'| <= (sf * d) * 1, where sf * d ~ micro_amax / 6.
TEST(Nvfp4Test, RandomRoundTripErrorIsBounded) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(16 * 4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * (i % 128 == 3 ? 20.f : 1.f);
  float amax = 0.f;
  for (float v : x) amax = std::fmax(amax, std::fabs(v));
  const float s_enc = Nvfp4EncodeScale(amax);
  const float d = Nvfp4DecodeScale(amax);
  EXPECT_EQ(s_enc, 2688.f / amax);
  EXPECT_EQ(d, amax / 2688.f);
  double err2 = 0, ref2 = 0;
  for (size_t b = 0; b < x.size(); b += 16) {
    float micro_amax = 0.f;
    for (size_t i = b; i < b + 16; ++i) micro_amax = std::fmax(micro_amax, std::fabs(x[i]));
    const uint8_t sf = Nvfp4MicroScale(s_enc, micro_amax);
    ASSERT_NE(sf, 0);
    const float step = E4M3ToFloat(sf) * d;
    EXPECT_LE(step, micro_amax / 6.f * 1.07f);
#if KVTIER_HAVE_CUDA_FP_HEADERS
    ASSERT_EQ(sf, __nv_cvt_float_to_fp8((s_enc * micro_amax) / 6.f, __NV_SATFINITE, __NV_E4M3));
    const float m = s_enc / CudaHalfToFloat(__nv_cvt_fp8_to_halfraw(sf, __NV_E4M3).x);
#endif
    for (size_t i = b; i < b + 16; ++i) {
      const uint8_t q = Nvfp4EncodeValue(x[i], s_enc, sf);
#if KVTIER_HAVE_CUDA_FP_HEADERS
      ASSERT_EQ(q, __nv_cvt_float_to_fp4(x[i] * m, __NV_E2M1, cudaRoundNearest));
#endif
      const float y = Nvfp4DecodeValue(q, sf, d);
      ASSERT_LE(std::fabs(y - x[i]), step * 1.0001f) << i;
      err2 += static_cast<double>(y - x[i]) * (y - x[i]);
      ref2 += static_cast<double>(x[i]) * x[i];
    }
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 0.15);  // NVFP4 on Gaussian data: about 0.1
}

}  // namespace
}  // namespace kvtier::codec
