// The randomised Hadamard rotation of keys (Options::key_rotation), shared by the CPU backend,
// the CPU reference attention and the CUDA kernels so that every path rotates bit-identically.
//
// For KV head h of a cache with seed s, R_h = (1/sqrt(n)) H_n diag(sign_h), where H_n is the
// n x n Sylvester-Hadamard matrix (n = head_dim, a power of two) and sign_h[d] = +-1 is bit
// (d mod 64) of SplitMix64(s + golden * (16 h + d / 64 + 1)). R_h is orthogonal, so
// q . k == (R_h q) . (R_h k) in real arithmetic: keys are stored rotated and queries are rotated
// the same way at attention. The butterflies run in a fixed order (stage h = 1, 2, 4, ...; each a
// single a + b or a - b of FP32 operands), the signs are exact and the final scale is one
// correctly rounded multiply, so any implementation that follows that order (FastHadamard here,
// the shared-memory loops of the CUDA kernels) gives the same bits.
#ifndef KVTIER_KERNELS_CODEC_HADAMARD_H_
#define KVTIER_KERNELS_CODEC_HADAMARD_H_

#include <cstdint>

#include "kernels/codec/host_device.h"

namespace kvtier::codec {

KVTIER_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// sign_h[d] of KV head `head`: +1 or -1. REQUIRES: 0 <= d < 1024.
KVTIER_HD float RotationSign(uint64_t seed, int head, int d) {
  const uint64_t word = static_cast<uint64_t>(head) * 16 + static_cast<uint64_t>(d >> 6) + 1;
  const uint64_t bits = SplitMix64(seed + 0x9E3779B97F4A7C15ull * word);
  return ((bits >> (d & 63)) & 1) != 0 ? -1.f : 1.f;
}

// 1/sqrt(n) for n a power of two, as one correctly rounded constant: 2^-k/2 for even
// k = log2(n), 2^-(k-1)/2 / sqrt(2) for odd k. REQUIRES: n a power of two, 1 to 2^20.
KVTIER_HD float HadamardScale(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  float s = (k % 2 == 0) ? 1.f : 0.70710678118654752f;
  for (int i = 0; i < k / 2; ++i) s *= 0.5f;
  return s;
}

// x <- H_n x (unnormalised), butterflies in the documented order. REQUIRES: n a power of two.
KVTIER_HD void FastHadamard(float* x, int n) {
  for (int h = 1; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// x <- R_h x. REQUIRES: n = head_dim, a power of two, at most 1024.
KVTIER_HD void RotateKey(float* x, int n, uint64_t seed, int head) {
  for (int d = 0; d < n; ++d) x[d] *= RotationSign(seed, head, d);
  FastHadamard(x, n);
  const float scale = HadamardScale(n);
  for (int d = 0; d < n; ++d) x[d] *= scale;
}

// x <- R_h^T x, the inverse of RotateKey (up to FP32 rounding).
KVTIER_HD void UnrotateKey(float* x, int n, uint64_t seed, int head) {
  FastHadamard(x, n);
  const float scale = HadamardScale(n);
  for (int d = 0; d < n; ++d) x[d] = x[d] * scale * RotationSign(seed, head, d);
}

}  // namespace kvtier::codec

#endif  // KVTIER_KERNELS_CODEC_HADAMARD_H_
