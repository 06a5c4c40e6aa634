// KVTIER_HD marks a function callable from host and device code alike: inline on the host,
// __host__ __device__ __forceinline__ under nvcc.
#ifndef KVTIER_KERNELS_CODEC_HOST_DEVICE_H_
#define KVTIER_KERNELS_CODEC_HOST_DEVICE_H_

#ifdef __CUDACC__
#define KVTIER_HD __host__ __device__ __forceinline__
#else
#define KVTIER_HD inline
#endif

#endif  // KVTIER_KERNELS_CODEC_HOST_DEVICE_H_
