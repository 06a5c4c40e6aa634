#include "src/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

absl::Status Error(bool out_of_memory, const char* call, const char* name,
                   const char* text) {
  std::string message = absl::StrCat(call, " failed: ", name, " (", text, ")");
  return out_of_memory ? absl::ResourceExhaustedError(std::move(message))
                       : absl::InternalError(std::move(message));
}

struct Loaded {
  DriverApi api{};
  absl::Status status;
};

template <typename Fn>
absl::Status Resolve(const char* symbol, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // 12000: the function signatures as of CUDA 12.0, which the PFN_*_v* types above name.
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("CUDA driver unavailable: looking up ", symbol,
                                               ": ", cudaGetErrorName(e), " (",
                                               cudaGetErrorString(e), ")"));
  }
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("CUDA driver has no ", symbol, " (query result ", int{found}, ")"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

Loaded* Load() {
  auto* l = new Loaded;
  DriverApi& a = l->api;
  l->status.Update(Resolve("cuGetErrorString", &a.cuGetErrorString));
  l->status.Update(Resolve("cuGetErrorName", &a.cuGetErrorName));
  l->status.Update(Resolve("cuDeviceGet", &a.cuDeviceGet));
  l->status.Update(Resolve("cuDeviceGetAttribute", &a.cuDeviceGetAttribute));
  l->status.Update(Resolve("cuMemAddressReserve", &a.cuMemAddressReserve));
  l->status.Update(Resolve("cuMemAddressFree", &a.cuMemAddressFree));
  l->status.Update(Resolve("cuMemCreate", &a.cuMemCreate));
  l->status.Update(Resolve("cuMemRelease", &a.cuMemRelease));
  l->status.Update(Resolve("cuMemMap", &a.cuMemMap));
  l->status.Update(Resolve("cuMemUnmap", &a.cuMemUnmap));
  l->status.Update(Resolve("cuMemSetAccess", &a.cuMemSetAccess));
  l->status.Update(Resolve("cuMemGetAllocationGranularity", &a.cuMemGetAllocationGranularity));
  return l;
}

const Loaded& Driver() {
  static const Loaded* const loaded = Load();  // never freed: used until exit
  return *loaded;
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  // The runtime also keeps a failed call's error as the thread's last error: consume it here,
  // so that the next kernel launch's cudaGetLastError does not report this failure again.
  cudaGetLastError();
  return Error(error == cudaErrorMemoryAllocation, call, cudaGetErrorName(error),
               cudaGetErrorString(error));
}

bool CudaSucceeded(cudaError_t error) {
  if (error == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

absl::Status DriverStatus(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "no description";
  const Loaded& d = Driver();
  if (d.status.ok()) {
    d.api.cuGetErrorName(result, &name);
    d.api.cuGetErrorString(result, &text);
  }
  return Error(result == CUDA_ERROR_OUT_OF_MEMORY, call, name, text);
}

absl::StatusOr<const DriverApi*> GetDriverApi() {
  const Loaded& d = Driver();
  if (!d.status.ok()) return d.status;
  return &d.api;
}

}  // namespace kvtier
