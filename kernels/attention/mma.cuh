// The decode kernel's warp-level matrix primitives (kernels/attention/): the m16n8k16 and
// m16n8k8 tensor-core products (FP16 in, FP32 accumulate) and the 8x8 FP16 transpose that turns
// S^T's accumulators into P^T's B fragments.
#ifndef KVTIER_KERNELS_ATTENTION_MMA_CUH_
#define KVTIER_KERNELS_ATTENTION_MMA_CUH_

#include <cstdint>

namespace kvtier::gpu::attention {

// c += A B for A [16 x 16] (row-major fragments a) and B [16 x 8] (column fragments b0, b1).
__device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += A B for A [16 x 8] (row-major fragments a) and B [8 x 8] (column fragment b).
__device__ __forceinline__ void Mma(float c[4], const uint32_t a[2], uint32_t b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(b));
}

// The 8x8 FP16 matrix held as one pair per lane (row lane / 4, columns 2 (lane % 4) + {0, 1}),
// transposed in the same layout.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

}  // namespace kvtier::gpu::attention

#endif  // KVTIER_KERNELS_ATTENTION_MMA_CUH_
