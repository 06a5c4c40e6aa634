// The decode kernel's exact format conversions to FP16 pairs (kernels/attention/): FP8 codes by
// the hardware conversion, NVFP4 by placing the E2M1 bits in an FP16 (the value times 2^-14)
// and multiplying by the E4M3 micro-scale times 2^7, and the byte permutes that put a row's dims
// in the kernel's canonical K order. Every conversion here is exact.
#ifndef KVTIER_KERNELS_ATTENTION_CONVERT_CUH_
#define KVTIER_KERNELS_ATTENTION_CONVERT_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace kvtier::gpu::attention {

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  return __byte_perm(a, b, sel);
}

__device__ __forceinline__ uint32_t HalfBits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 AsHalf2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

__device__ __forceinline__ uint32_t Hmul2(uint32_t a, uint32_t b) {
  return HalfBits(__hmul2(AsHalf2(a), AsHalf2(b)));
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  return HalfBits(__floats2half2_rn(lo, hi));
}

// Two E4M3 codes (lo byte first) as an FP16 pair: exact.
__device__ __forceinline__ uint32_t E4M3x2ToHalf2(uint32_t codes16) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes16), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The four FP8 codes of w as two FP16 pairs (bytes 0-1 in lo, 2-3 in hi): exact, and each
// conversion reads its half of w in place.
template <bool kE5M2>
__device__ __forceinline__ void Fp8x4ToHalf2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (kE5M2) {
    asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e5m2x2 %0, a;\n"
        " cvt.rn.f16x2.e5m2x2 %1, b;\n}" : "=r"(lo), "=r"(hi) : "r"(w));
  } else {
    asm("{.reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n"
        " cvt.rn.f16x2.e4m3x2 %1, b;\n}" : "=r"(lo), "=r"(hi) : "r"(w));
  }
}

// The bits of a where kMask is set and of b elsewhere, in one LOP3 (the compiler splits the
// expression into two when the mask is an immediate).
template <uint32_t kMask>
__device__ __forceinline__ uint32_t BitSelect(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;\n" : "=r"(d) : "r"(a), "n"(kMask), "r"(b));
  return d;
}

// The eight E2M1 codes of w as four FP16 pairs scaled by 2^-14: pair p holds nibbles p and
// p + 4. Each code's sign goes to bit 15 and its three magnitude bits to bits 11..9 (exponent
// LSBs and mantissa MSB), which is exactly the E2M1 value times 2^-14, subnormal codes included.
// So that at most one shift and one mask place each pair, the codes are first regrouped: in
// `even`, byte q holds nibble 2q's magnitude at bits 0-2 and its sign at bit 6; in `odd`, nibble
// 2q+1's magnitude at bits 1-3 and its sign at bit 7 (where odd bytes 1 and 3 already place
// nibbles 3 and 7; the other bits are masked off). 11 instructions.
__device__ __forceinline__ void E2M1x8Scaled(uint32_t w, uint32_t h[4]) {
  constexpr uint32_t kPair = 0x8E008E00u;  // sign and magnitude bits of both halves
  const uint32_t even = BitSelect<0x07070707u>(w, w << 3);
  const uint32_t odd = BitSelect<0x0E0E0E0Eu>(w >> 3, w);
  h[0] = (even << 9) & kPair;
  h[1] = (odd << 8) & kPair;
  h[2] = (even << 1) & kPair;
  h[3] = odd & kPair;
}

// 2^7 twice, as an FP16 pair: E4M3 micro-scales times 2^7 are exact in FP16, and so are their
// products with E2M1x8Scaled's values (the E2M1 x E4M3 product times 2^-7).
constexpr uint32_t kHalf2Pow7 = 0x58005800u;

// 32 FP8 codes (dims 32c..32c+31 of a row, in two uint4) as 16 FP16 pairs in the canonical K
// order: pair r = 4m + q holds dims 8m + q and 8m + q + 4.
template <bool kE5M2>
__device__ __forceinline__ void Fp8RowToCanonical(uint4 a, uint4 b, uint32_t h[16]) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t lo = Prmt(w[2 * m], w[2 * m + 1], 0x5140);  // dims q and q + 4, q = 0, 1
    const uint32_t hi = Prmt(w[2 * m], w[2 * m + 1], 0x7362);  // q = 2, 3
    Fp8x4ToHalf2x2<kE5M2>(lo, h[4 * m + 0], h[4 * m + 1]);
    Fp8x4ToHalf2x2<kE5M2>(hi, h[4 * m + 2], h[4 * m + 3]);
  }
}

// Two E4M3 micro-scales (lo byte first) as an FP16 pair times 2^7: exact (at most 57344).
__device__ __forceinline__ uint32_t MicroPair(uint32_t codes16) {
  return Hmul2(E4M3x2ToHalf2(codes16), kHalf2Pow7);
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_CONVERT_CUH_
