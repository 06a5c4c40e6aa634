// Proves on the device that every fast conversion of fast_codec.cuh equals the codec function
// it replaces, on all the inputs it can receive. About 2^32 evaluations of each: a few
// milliseconds on an H200; the backend runs it once per process.
#include <cstdint>

#include "kernels/codec/fp4.h"
#include "kernels/codec/fp8.h"
#include "kernels/codec/half.h"
#include "kernels/data_plane.cuh"
#include "kernels/fast_codec.cuh"

namespace kvtier::gpu {
namespace {

__device__ void Mismatch(unsigned long long* counts, unsigned int* first, int which,
                         uint32_t input) {
  atomicAdd(&counts[which], 1ull);
  atomicMin(&first[which], input);
}

// A multiplier in E2M1Steps' range [2^-125, 2^117] drawn from the bits of u.
__device__ float MultiplierOf(uint32_t u) {
  const uint32_t h = u * 0x9E3779B1u;
  return __uint_as_float(((2u + (h >> 24) % 243u) << 23) | (h & 0x7FFFFFu));
}

// The E2M1 midpoints and values, and two points above 6.
__constant__ float kE2M1Edges[16] = {0.25f, 0.5f, 0.75f, 1.f, 1.25f, 1.5f, 1.75f, 2.f,
                                     2.5f,  3.f,  3.5f,  4.f, 5.f,   6.f,  6.5f,  7.f};

__global__ void SelfCheckKernel(unsigned long long* counts, unsigned int* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < (uint64_t{1} << 32); i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float x = __uint_as_float(u);
    const float y = __uint_as_float(u ^ 0x80000000u);
    // Every input in every byte position of the packed result.
    const uint32_t got = FastE4M3x4(x, y, y, x);
    const uint32_t ex = codec::FloatToE4M3(x);
    const uint32_t ey = codec::FloatToE4M3(y);
    if (got != (ex | (ey << 8) | (ey << 16) | (ex << 24))) Mismatch(counts, first, 0, u);
    // E2M1 of exact products: every non-NaN x by 1 and by a multiplier drawn from its bits,
    // and products next to each midpoint and value (RN(edge / m), moved by -8 to +7 ulps).
    if ((u & 0x7FFFFFFFu) <= 0x7F800000u) {
      const float m = MultiplierOf(u);
      const float near =
          __uint_as_float(__float_as_uint(kE2M1Edges[u & 15] / m) + ((u >> 4) & 15) - 8);
      if (FastE2M1(x, E2M1Steps(1.f)) != codec::ProductToE2M1(x, 1.f) ||
          FastE2M1(x, E2M1Steps(m)) != codec::ProductToE2M1(x, m) ||
          FastE2M1(near, E2M1Steps(m)) != codec::ProductToE2M1(near, m)) {
        Mismatch(counts, first, 1, u);
      }
    }
    if (u < 0x10000u && (u & 0x7FFFu) <= 0x7C00u &&
        __float_as_uint(FastHalfToFloat(u)) !=
            __float_as_uint(codec::HalfToFloat(static_cast<uint16_t>(u)))) {
      Mismatch(counts, first, 2, u);
    }
    if (u <= 0x7F7FFFFFu && FastE4M3(FastDivideBy6(x)) != codec::FloatToE4M3(x / 6.f)) {
      Mismatch(counts, first, 4, u);
    }
    // Every significand of a in [1, 2) by every positive non-NaN E4M3 value d (code u >> 23):
    // the quotients of other binades of a are these scaled by powers of two, exactly. Code 0
    // gives 0.
    if (u < (0x7Fu << 23)) {
      const float a = __uint_as_float(0x3F800000u | (u & 0x7FFFFFu));
      const uint32_t code = u >> 23;
      const float d = codec::E4M3ToFloat(static_cast<uint8_t>(code));
      if (__float_as_uint(FastDivideByE4M3(a, code)) != (code == 0 ? 0u : __float_as_uint(a / d))) {
        Mismatch(counts, first, 5, u);
      }
    }
    // The NVFP4 scope scales of every A in [2^-96, 2^125].
    if (u >= 0x0F800000u && u <= __float_as_uint(kFastDivide2688ByMax) &&
        (__float_as_uint(FastDivideBy2688(x)) != __float_as_uint(x / 2688.f) ||
         __float_as_uint(FastDivide2688By(x)) != __float_as_uint(2688.f / x))) {
      Mismatch(counts, first, 6, u);
    }
    // Pairs of non-NaN codes (u < 2^16), each code alone (u < 2^8).
    if (u < 0x10000u && (u & 0x7Fu) != 0x7Fu && ((u >> 8) & 0x7Fu) != 0x7Fu) {
      const float2 got = FastE4M3x2ToFloat2<0>(u), got_high = FastE4M3x2ToFloat2<1>(u << 16);
      const float lo = codec::E4M3ToFloat(static_cast<uint8_t>(u));
      const float hi = codec::E4M3ToFloat(static_cast<uint8_t>(u >> 8));
      if (__float_as_uint(got.x) != __float_as_uint(lo) ||
          __float_as_uint(got.y) != __float_as_uint(hi) ||
          __float_as_uint(got_high.x) != __float_as_uint(lo) ||
          __float_as_uint(got_high.y) != __float_as_uint(hi) ||
          (u < 0x100u && __float_as_uint(FastE4M3ToFloat(u)) != __float_as_uint(lo))) {
        Mismatch(counts, first, 3, u);
      }
    }
  }
}

}  // namespace

cudaError_t LaunchFastCodecSelfCheck(unsigned long long* counts, unsigned int* first_mismatch,
                                     cudaStream_t stream) {
  SelfCheckKernel<<<1024, 256, 0, stream>>>(counts, first_mismatch);
  return cudaGetLastError();
}

}  // namespace kvtier::gpu
