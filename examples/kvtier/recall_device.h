// Device memory for the recall sweep's arms on the CUDA backend (`kvtier recall --backend
// cuda`): the sweep's K/V, queries and results live on the host, and a CUDA cache reads and
// writes device memory. One implementation per build: recall_device_cuda.cc where kvtier is
// built with CUDA, recall_device_none.cc otherwise (every call Unavailable), so that the tool
// builds either way.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_DEVICE_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_DEVICE_H_

#include <cstddef>

#include "absl/status/status.h"

namespace kvtier::tool {

// OK when arms can run on the CUDA backend here; Unavailable saying why otherwise (kvtier was
// built without CUDA, or no usable CUDA device is visible).
absl::Status CudaSweepAvailable();

// Waits until the device has finished all work issued so far (by any thread). Internal for a
// CUDA error.
absl::Status DeviceSynchronize();

// A device buffer that grows as needed, freed on destruction. Copies are synchronous and on
// the legacy default stream, so they are ordered with a CUDA cache's work, which runs on a
// blocking stream (docs/gpu.md): a copy in completes before a later WriteKV or DecodeAttention
// reads it, a copy out waits for them. Thread-compatible.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  // Makes room for `bytes` (contents undefined after growing). Internal for a CUDA error.
  absl::Status Reserve(size_t bytes);
  // Reserve, then copies `bytes` from host `src`. Internal for a CUDA error.
  absl::Status CopyIn(const void* src, size_t bytes);
  // Copies the first `bytes` to host `dst`. REQUIRES: bytes <= the size reserved.
  absl::Status CopyOut(void* dst, size_t bytes) const;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  [[maybe_unused]] size_t bytes_ = 0;  // read by the CUDA build only
};

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_DEVICE_H_
