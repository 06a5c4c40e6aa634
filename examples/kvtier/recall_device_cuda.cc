// recall_device.h where kvtier is built with CUDA.
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "examples/kvtier/recall_device.h"

namespace kvtier::tool {
namespace {

absl::Status Check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::Status CudaSweepAvailable() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--backend cuda needs a CUDA device; none is usable here (",
        e != cudaSuccess ? cudaGetErrorString(e) : "no device", ")"));
  }
  return absl::OkStatus();
}

absl::Status DeviceSynchronize() {
  return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

DeviceBuffer::~DeviceBuffer() { cudaFree(data_); }

absl::Status DeviceBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
  if (absl::Status s = Check(cudaMalloc(&data_, bytes), "cudaMalloc"); !s.ok()) return s;
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::Status DeviceBuffer::CopyIn(const void* src, size_t bytes) {
  if (absl::Status s = Reserve(bytes); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  return Check(cudaMemcpy(data_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

absl::Status DeviceBuffer::CopyOut(void* dst, size_t bytes) const {
  if (bytes == 0) return absl::OkStatus();
  return Check(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace kvtier::tool
