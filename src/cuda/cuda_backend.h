// The CUDA backend: device pools on the CUDA virtual-memory API and the data plane of
// kernels/data_plane.cuh.
//
// Memory. Each (format, layer) pool is one range reserved with cuMemAddressReserve. A slab is
// a device-local physical allocation (cuMemCreate, 2 MiB granularity) mapped into the range
// (cuMemMap, cuMemSetAccess) and zero-filled, so that a new slab holds zeros as on the CPU
// backend. Unmap is stream-ordered: the slab stays mapped until the device work issued before
// the call has completed, then it is unmapped; its physical allocation is kept in a small free
// list for the next Map (kMaxFreeHandles) or released. A Map that finds device memory full
// first waits for the deferred unmaps, whose memory is not free until they are done. A failed
// cuMemUnmap is sticky (the pools believe the slab unmapped): every later call returns it, and
// the allocation is released, never mapped elsewhere.
//
// Work. Every kernel and copy goes on one stream the backend owns, created as a blocking
// stream: it is ordered after work on the legacy default stream (stream 0) and the legacy
// stream waits for it. So K/V inputs written by the caller on the legacy stream (or by a
// synchronous cudaMemcpy) are complete before WriteRows reads them. Callers that produce K/V on
// a non-blocking stream must synchronize it before WriteKV. An engine-provided stream can come
// later.
//
// Fences. RecordFence records an event (from a pool) on the stream and returns an increasing
// id; FencePassed(id) queries it, and returns the device's error (sticky) when the work failed.
// synchronous() is false: the cache reuses freed pages only once the fence of the step that
// freed them has passed.
//
// Non-finite inputs. The append kernel adds NaN/Inf input counts to a device counter. The
// counter is copied back at RecordFence and at ReadPage, and added to the `nonfinite` pointer
// of the latest WriteRows call once that copy has completed: at a later RecordFence or
// FencePassed after the device finished, or at once in ReadPage (which synchronizes). Counts
// therefore lag by about one step; reading them never stalls the append path.
//
// Device. The backend uses the device current when it is created; it must be current in the
// calling thread for every later call. The kernels are built for sm_90 only (Hopper).
//
// Thread-compatible: the cache calls it under its mutex.
#ifndef KVTIER_SRC_CUDA_CUDA_BACKEND_H_
#define KVTIER_SRC_CUDA_CUDA_BACKEND_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/data_plane.cuh"
#include "src/backend.h"
#include "src/cuda/cuda_status.h"

namespace kvtier {

// What the fast-codec self-check (kernels/data_plane.cuh) found. It runs once per process,
// when the first CUDA backend is created (a few milliseconds); unless it passed, the kernels
// use the codec functions only. The environment variable KVTIER_CUDA_FAST_CODEC=on skips it
// and uses the fast conversions (ran = false, passed = true); =off skips it and does not.
struct FastCodecCheck {
  bool ran = false;
  bool passed = false;
  uint64_t mismatches[gpu::kSelfCheckCounters] = {};
  uint32_t first_mismatch[gpu::kSelfCheckCounters] = {};
};

class CudaBackend final : public Backend {
 public:
  static constexpr int kMaxFreeHandles = 8;

  // Unavailable when there is no driver or device; FailedPrecondition when the device is not
  // sm_90 or lacks virtual-memory management; InvalidArgument when KVTIER_CUDA_MIGRATE is set
  // to anything but auto, 2, 3, 4 or 5.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create();
  // As Create, with the driver's calls made through `driver` (tests substitute failing ones).
  // REQUIRES: `driver` outlives the backend.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> CreateWithDriver(const DriverApi* driver);
  ~CudaBackend() override;

  absl::StatusOr<uint8_t*> Reserve(size_t bytes) override;
  void Unreserve(uint8_t* base, size_t bytes) override;
  absl::Status Map(uint8_t* addr, size_t bytes) override;
  absl::Status Unmap(uint8_t* addr, size_t bytes) override;
  absl::Status WriteRows(const PoolView& pool, absl::Span<const int64_t> slots,
                         const KVInput& kv, int64_t* nonfinite) override;
  absl::Status ReadPage(const PoolView& pool, uint32_t page, int num_tokens, float* k,
                        float* v) override;
  absl::Status Requantize(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                          absl::Span<const uint32_t> src_pages,
                          absl::Span<const uint32_t> dst_pages) override;
  absl::Status CopyPage(const PoolView& pool, uint32_t src, uint32_t dst) override;
  // Host tier (cuda_host_tier.cc): pinned, device-mapped host memory; copies on the stream.
  absl::StatusOr<uint8_t*> ReserveHost(size_t bytes) override;
  void UnreserveHost(uint8_t* base, size_t bytes) override;
  absl::Status MapHost(uint8_t* addr, size_t bytes) override;
  absl::Status UnmapHost(uint8_t* addr, size_t bytes) override;
  absl::Status CopyPages(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                         absl::Span<const uint32_t> src_pages,
                         absl::Span<const uint32_t> dst_pages) override;
  absl::StatusOr<void*> DeviceNonfiniteCounter(int64_t* nonfinite) override;
  absl::Status JoinStream(void* stream, bool stream_waits) override;
  int32_t device_id() const override { return device_; }
  bool synchronous() const override { return false; }
  absl::StatusOr<uint64_t> RecordFence() override;
  absl::StatusOr<bool> FencePassed(uint64_t fence) override;
  uint64_t NextFence() const override { return last_fence_ + 1; }

  // The stream all work goes on (for benchmarks and tests that time or order against it).
  cudaStream_t stream() const { return stream_; }
  static FastCodecCheck fast_codec_check();

 private:
  struct Mapping {
    CUmemGenericAllocationHandle handle;
    size_t bytes;
  };
  struct PendingUnmap {
    uint8_t* addr;
    Mapping mapping;
    cudaEvent_t done;
  };
  struct Fence {
    uint64_t id;
    cudaEvent_t done;
  };
  // Pinned host buffers used in turn to stage small arrays (slots, page lists) for upload;
  // one is reused only after the copy that read it has completed.
  struct StagingSlot {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  static constexpr int kStagingSlots = 8;
  static constexpr int kSnapshots = 16;

  CudaBackend(const DriverApi* api, int device);
  absl::Status Init();

  absl::StatusOr<cudaEvent_t> NewEvent();
  void RecycleEvent(cudaEvent_t e);
  // An allocation of `bytes` of device memory: a recycled one, else a new one; when memory is
  // full and unmaps are pending, after they have completed (their memory is freed then).
  absl::StatusOr<CUmemGenericAllocationHandle> NewHandle(size_t bytes);
  // A recycled allocation of `bytes`, taken from free_handles_, if there is one.
  std::optional<CUmemGenericAllocationHandle> TakeFreeHandle(size_t bytes);
  // cuMemCreate of `bytes` of this device's memory into *handle.
  CUresult CreateHandle(size_t bytes, CUmemGenericAllocationHandle* handle);
  void RecycleHandle(const Mapping& m);
  // Unmaps the slab at `addr` and keeps its allocation for reuse; a failure is sticky, and the
  // allocation, still mapped, is released instead.
  void UnmapSlab(uintptr_t addr, const Mapping& m);
  // Unmaps deferred slabs whose work has completed (all of them, waiting, when `wait`), or
  // only those overlapping [lo, hi) when hi > lo. Errors are sticky.
  void RetireUnmaps(bool wait, uintptr_t lo = 0, uintptr_t hi = 0);
  // A batch of page moves in device staging memory: the layer table and both page lists.
  struct PageBatch {
    const gpu::LayerPools* layers = nullptr;
    const uint32_t* src_pages = nullptr;
    const uint32_t* dst_pages = nullptr;
  };
  // Checks a Requantize or CopyPages batch (`call` names it in errors) and stages it.
  absl::StatusOr<PageBatch> StagePageBatch(const char* call, absl::Span<const PoolView> from,
                                           absl::Span<const PoolView> to,
                                           absl::Span<const uint32_t> src_pages,
                                           absl::Span<const uint32_t> dst_pages);
  // Host staging memory for `bytes`, then its upload to the device staging buffer.
  absl::StatusOr<void*> StageHost(size_t bytes);
  absl::StatusOr<void*> Upload(size_t bytes);
  absl::Status GrowDevice(void** buffer, size_t* capacity, size_t bytes);
  // The K rows of `kv` rotated by R_h into rotated_ (grown as needed), on the stream.
  absl::StatusOr<const float*> RotateKeys(const PoolView& pool, const KVInput& kv);
  // Non-finite counter: enqueue a copy to the host, fold completed copies into the sink.
  void SnapshotNonfinite();
  void FoldNonfinite();
  // Makes `nonfinite` the sink of the counter (folding what the previous sink is owed first).
  void BindNonfinite(int64_t* nonfinite);

  const DriverApi* const api_;
  const int device_;
  int num_sms_ = 0;
  bool fast_ = false;
  gpu::RequantizeVariant variant_ = gpu::RequantizeVariant::kAuto;
  size_t granularity_ = 0;
  cudaStream_t stream_ = nullptr;
  absl::Status sticky_;  // an error found where it could not be returned

  std::map<uintptr_t, Mapping> mapped_;  // by slab address
  std::vector<PendingUnmap> pending_unmaps_;
  std::vector<Mapping> free_handles_;

  std::vector<cudaEvent_t> free_events_;
  std::deque<Fence> fences_;  // recorded, not yet seen passed, oldest first
  uint64_t last_fence_ = 0;
  uint64_t passed_fence_ = 0;

  StagingSlot staging_[kStagingSlots];
  int next_staging_ = -1;  // the slot of the last StageHost
  void* device_staging_ = nullptr;
  size_t device_staging_bytes_ = 0;
  void* scratch_ = nullptr;  // ReadPage's decoded floats
  size_t scratch_bytes_ = 0;
  void* rotated_ = nullptr;  // WriteRows' rotated keys (Options::key_rotation), FP32
  size_t rotated_bytes_ = 0;

  cudaEvent_t joined_ = nullptr;  // JoinStream's event, re-recorded by each call
  unsigned long long* nonfinite_device_ = nullptr;
  uint64_t* snapshots_ = nullptr;  // pinned [kSnapshots]
  cudaEvent_t snapshot_done_[kSnapshots] = {};
  std::deque<int> snapshot_pending_;  // slots copied or being copied, oldest first
  std::vector<int> snapshot_free_;
  uint64_t folded_ = 0;  // counter value already added to the sink
  int64_t* nonfinite_sink_ = nullptr;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_CUDA_CUDA_BACKEND_H_
