// The one place where CUDA errors become absl::Status, and the driver API entry points.
//
// kvtier never links libcuda: the driver functions it needs (the virtual-memory calls) are
// looked up at run time through the runtime's cudaGetDriverEntryPointByVersion, so binaries
// load on machines without a driver and report Unavailable instead.
#ifndef KVTIER_SRC_CUDA_CUDA_STATUS_H_
#define KVTIER_SRC_CUDA_CUDA_STATUS_H_

#include <cuda.h>  // driver types only
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/status_macros.h"

namespace kvtier {

// OK for success; otherwise ResourceExhausted for out-of-memory errors and Internal for the
// rest, each naming `call` and CUDA's error name and string.
absl::Status CudaStatus(cudaError_t error, const char* call);
absl::Status DriverStatus(CUresult result, const char* call);
// True on success; otherwise consumes the failure as the thread's last error (as CudaStatus
// does), so that a later launch's cudaGetLastError does not report it. For calls whose failure
// is handled without a Status.
bool CudaSucceeded(cudaError_t error);

// The driver functions the CUDA backend calls, resolved once per process.
struct DriverApi {
  PFN_cuGetErrorString_v6000 cuGetErrorString;
  PFN_cuGetErrorName_v6000 cuGetErrorName;
  PFN_cuDeviceGet_v2000 cuDeviceGet;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree;
  PFN_cuMemCreate_v10020 cuMemCreate;
  PFN_cuMemRelease_v10020 cuMemRelease;
  PFN_cuMemMap_v10020 cuMemMap;
  PFN_cuMemUnmap_v10020 cuMemUnmap;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity;
};

// The driver API, or Unavailable (with the reason) when there is no usable driver.
// Thread-safe.
absl::StatusOr<const DriverApi*> GetDriverApi();

}  // namespace kvtier

// Returns the Status of a failed runtime (cuda*) or driver (cu*) call from the enclosing
// function; the message names the call as written.
#define KVTIER_CUDA_RETURN_IF_ERROR(call) \
  KVTIER_RETURN_IF_ERROR(::kvtier::CudaStatus((call), #call))
#define KVTIER_CU_RETURN_IF_ERROR(call) \
  KVTIER_RETURN_IF_ERROR(::kvtier::DriverStatus((call), #call))

#endif  // KVTIER_SRC_CUDA_CUDA_STATUS_H_
