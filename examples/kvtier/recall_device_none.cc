// recall_device.h where kvtier is built without CUDA: the CUDA backend is unavailable.
#include "examples/kvtier/recall_device.h"

namespace kvtier::tool {
namespace {

absl::Status NoCuda() {
  return absl::UnavailableError(
      "--backend cuda: this kvtier was built without CUDA (configure with KVTIER_WITH_CUDA=ON)");
}

}  // namespace

absl::Status CudaSweepAvailable() { return NoCuda(); }
absl::Status DeviceSynchronize() { return NoCuda(); }
DeviceBuffer::~DeviceBuffer() = default;
absl::Status DeviceBuffer::Reserve(size_t) { return NoCuda(); }
absl::Status DeviceBuffer::CopyIn(const void*, size_t) { return NoCuda(); }
absl::Status DeviceBuffer::CopyOut(void*, size_t) const { return NoCuda(); }

}  // namespace kvtier::tool
