// PreparedAppend's CUDA half (kvtier/prepared_append.h): a decode step's slots, their count and
// every layer's hot pool in one device buffer of fixed address, written and read on one stream,
// and the launch of kernels/data_plane.cuh's LaunchWriteLayers over them. Compiled in CUDA
// builds only.
//
// Thread-compatible: Overwrite is not concurrent with Launch.
#ifndef KVTIER_SRC_CUDA_CUDA_APPEND_STEP_H_
#define KVTIER_SRC_CUDA_CUDA_APPEND_STEP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/data_plane.cuh"
#include "kernels/page_layout.h"
#include "kvtier/cache.h"

namespace kvtier {

class CudaAppendStep {
 public:
  struct Spec {
    PageLayout layout{};  // the hot format's
    int32_t num_layers = 0;
    int64_t max_rows = 0;
    bool rotate_keys = false;  // Options::key_rotation is kHadamard
    uint64_t key_rotation_seed = 0;
    void* nonfinite = nullptr;  // the backend's device counter (Backend::DeviceNonfiniteCounter)
  };

  // Allocates the buffers on `stream` (a cudaStream_t), holding no slots.
  // Internal for a CUDA error.
  static absl::StatusOr<std::unique_ptr<CudaAppendStep>> Create(const Spec& spec, void* stream);
  ~CudaAppendStep();  // frees the buffers on the stream, after the work enqueued there

  // Copies the slots, their count and the pools (one per layer) into the buffer on the stream.
  // REQUIRES: slots.size() <= max_rows, pools.size() == num_layers. Internal for a CUDA error.
  absl::Status Overwrite(absl::Span<const int64_t> slots, absl::Span<const gpu::AppendPool> pools);

  // Enqueues the append of every layer on the stream (layers[l] is layer l's input, device
  // memory), then waits for it when `synchronize` and the stream is not capturing. Returns
  // whether the stream is capturing a graph. REQUIRES: layers.size() == num_layers, inputs
  // checked as WriteKV checks them, all of one dtype. Internal for a CUDA error.
  absl::StatusOr<bool> Launch(absl::Span<const KVInput> layers, bool synchronize) const;

 private:
  CudaAppendStep(const Spec& spec, void* stream) : spec_(spec), stream_(stream) {}

  const Spec spec_;
  void* const stream_;
  int num_sms_ = 0;
  uint8_t* buffer_ = nullptr;  // device: the row count (int64), RowSlot[max_rows], the pools
  float* rotated_ = nullptr;   // device FP32 scratch of rotated keys, or null
  std::vector<uint8_t> host_;  // the host image of the buffer's head, for Overwrite
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CUDA_CUDA_APPEND_STEP_H_
