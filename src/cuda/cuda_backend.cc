// CudaBackend's memory side (src/cuda/cuda_backend.h): creation and the fast-codec self-check,
// events, physical handles and deferred unmaps, address ranges and slabs, and fences. The data
// plane (staging, the non-finite counter, page kernels and copies) is in cuda_data_plane.cc.
#include "src/cuda/cuda_backend.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

FastCodecCheck g_check;  // written once, under g_check_once
std::once_flag g_check_once;

// Runs the self-check on `stream` and waits for it.
FastCodecCheck RunSelfCheck(cudaStream_t stream) {
  FastCodecCheck check;
  unsigned long long* counts = nullptr;
  unsigned int* first = nullptr;
  constexpr int n = gpu::kSelfCheckCounters;
  if (!CudaSucceeded(cudaMalloc(reinterpret_cast<void**>(&counts), n * sizeof(*counts))) ||
      !CudaSucceeded(cudaMalloc(reinterpret_cast<void**>(&first), n * sizeof(*first))) ||
      !CudaSucceeded(cudaMemsetAsync(counts, 0, n * sizeof(*counts), stream)) ||
      !CudaSucceeded(cudaMemsetAsync(first, 0xFF, n * sizeof(*first), stream)) ||
      !CudaSucceeded(gpu::LaunchFastCodecSelfCheck(counts, first, stream))) {
    cudaFree(counts);
    cudaFree(first);
    return check;  // not run: the codec paths only
  }
  unsigned long long c[n];
  unsigned int f[n];
  if (CudaSucceeded(cudaMemcpyAsync(c, counts, sizeof(c), cudaMemcpyDeviceToHost, stream)) &&
      CudaSucceeded(cudaMemcpyAsync(f, first, sizeof(f), cudaMemcpyDeviceToHost, stream)) &&
      CudaSucceeded(cudaStreamSynchronize(stream))) {
    check.ran = true;
    check.passed = true;
    for (int i = 0; i < n; ++i) {
      check.mismatches[i] = c[i];
      check.first_mismatch[i] = f[i];
      check.passed = check.passed && c[i] == 0;
    }
  }
  cudaFree(counts);
  cudaFree(first);
  return check;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend() {
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create());
  return std::unique_ptr<Backend>(std::move(backend));
}

FastCodecCheck CudaBackend::fast_codec_check() { return g_check; }

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create() {
  KVTIER_ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  return CreateWithDriver(api);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::CreateWithDriver(const DriverApi* api) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount: ",
        e != cudaSuccess ? absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")")
                         : std::string("0 devices")));
  }
  int device = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  int major = 0, minor = 0, vmm = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major != 9 || minor != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("kvtier's CUDA kernels are built for sm_90 (Hopper); device ", device,
                     " is sm_", major, minor));
  }
  CUdevice cu_device = 0;
  KVTIER_CU_RETURN_IF_ERROR(api->cuDeviceGet(&cu_device, device));
  KVTIER_CU_RETURN_IF_ERROR(api->cuDeviceGetAttribute(
      &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device));
  if (vmm == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, " does not support CUDA virtual-memory management"));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(api, device));
  KVTIER_RETURN_IF_ERROR(backend->Init());
  return backend;
}

CudaBackend::CudaBackend(const DriverApi* api, int device) : api_(api), device_(device) {}

absl::Status CudaBackend::Init() {
  // KVTIER_CUDA_MIGRATE=auto|2|3|4|5: blocks per SM of the Requantize kernel (default auto:
  // chosen per source and destination format, kernels/migrate_occupancy.h), for benchmarks and
  // tests.
  if (const char* form = std::getenv("KVTIER_CUDA_MIGRATE");
      form != nullptr && !gpu::ParseRequantizeVariant(form, &variant_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KVTIER_CUDA_MIGRATE=", form,
                     ": expected auto, 2, 3, 4 or 5 (blocks per SM of the migration kernel)"));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  KVTIER_CU_RETURN_IF_ERROR(
      api_->cuMemGetAllocationGranularity(&granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // Blocking (not cudaStreamNonBlocking): ordered with the legacy default stream.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMalloc(reinterpret_cast<void**>(&nonfinite_device_), sizeof(*nonfinite_device_)));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(nonfinite_device_, 0, sizeof(*nonfinite_device_), stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMallocHost(reinterpret_cast<void**>(&snapshots_), kSnapshots * sizeof(*snapshots_)));
  for (int i = 0; i < kSnapshots; ++i) {
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&snapshot_done_[i], cudaEventDisableTiming));
    snapshot_free_.push_back(i);
  }
  for (StagingSlot& s : staging_) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  std::call_once(g_check_once, [this] {
    // KVTIER_CUDA_FAST_CODEC: "check" (default) runs the self-check; "on" trusts the fast
    // conversions without it (for compute-sanitizer runs, where it is slow); "off" uses the
    // codec functions only.
    const char* mode = std::getenv("KVTIER_CUDA_FAST_CODEC");
    if (mode != nullptr && std::strcmp(mode, "on") == 0) {
      g_check.passed = true;
    } else if (mode == nullptr || std::strcmp(mode, "off") != 0) {
      g_check = RunSelfCheck(stream_);
    }
  });
  fast_ = g_check.passed;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  RetireUnmaps(/*wait=*/true);
  for (const auto& [addr, m] : mapped_) UnmapSlab(addr, m);
  for (const Mapping& m : free_handles_) api_->cuMemRelease(m.handle);
  for (const Fence& f : fences_) cudaEventDestroy(f.done);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  for (cudaEvent_t e : snapshot_done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (StagingSlot& s : staging_) {
    if (s.copied != nullptr) cudaEventDestroy(s.copied);
    if (s.host != nullptr) cudaFreeHost(s.host);
  }
  if (joined_ != nullptr) cudaEventDestroy(joined_);
  if (snapshots_ != nullptr) cudaFreeHost(snapshots_);
  cudaFree(nonfinite_device_);
  cudaFree(device_staging_);
  cudaFree(scratch_);
  cudaFree(rotated_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

// ---- Events, handles, deferred unmaps ----

absl::StatusOr<cudaEvent_t> CudaBackend::NewEvent() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CudaBackend::RecycleEvent(cudaEvent_t e) { free_events_.push_back(e); }

absl::StatusOr<CUmemGenericAllocationHandle> CudaBackend::NewHandle(size_t bytes) {
  if (const auto recycled = TakeFreeHandle(bytes)) return *recycled;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = CreateHandle(bytes, &h);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && !pending_unmaps_.empty()) {
    // Slabs unmapped earlier hold their memory until their work has completed.
    RetireUnmaps(/*wait=*/true);
    KVTIER_RETURN_IF_ERROR(sticky_);
    if (const auto recycled = TakeFreeHandle(bytes)) return *recycled;
    r = CreateHandle(bytes, &h);
  }
  if (r != CUDA_SUCCESS) return DriverStatus(r, "cuMemCreate");
  return h;
}

std::optional<CUmemGenericAllocationHandle> CudaBackend::TakeFreeHandle(size_t bytes) {
  for (size_t i = 0; i < free_handles_.size(); ++i) {
    if (free_handles_[i].bytes == bytes) {
      const CUmemGenericAllocationHandle h = free_handles_[i].handle;
      free_handles_.erase(free_handles_.begin() + static_cast<ptrdiff_t>(i));
      return h;
    }
  }
  return std::nullopt;
}

CUresult CudaBackend::CreateHandle(size_t bytes, CUmemGenericAllocationHandle* handle) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  return api_->cuMemCreate(handle, bytes, &prop, 0);
}

void CudaBackend::RecycleHandle(const Mapping& m) {
  if (free_handles_.size() < kMaxFreeHandles) {
    free_handles_.push_back(m);
  } else {
    sticky_.Update(DriverStatus(api_->cuMemRelease(m.handle), "cuMemRelease"));
  }
}

void CudaBackend::UnmapSlab(uintptr_t addr, const Mapping& m) {
  const absl::Status s = DriverStatus(api_->cuMemUnmap(static_cast<CUdeviceptr>(addr), m.bytes),
                                      "cuMemUnmap");
  if (s.ok()) {
    RecycleHandle(m);
    return;
  }
  // Still mapped here: mapping it elsewhere too would alias two slabs. The driver frees the
  // allocation once nothing maps it.
  sticky_.Update(s);
  sticky_.Update(DriverStatus(api_->cuMemRelease(m.handle), "cuMemRelease"));
}

void CudaBackend::RetireUnmaps(bool wait, uintptr_t lo, uintptr_t hi) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_unmaps_.size(); ++i) {
    PendingUnmap& p = pending_unmaps_[i];
    const uintptr_t a = reinterpret_cast<uintptr_t>(p.addr);
    const bool selected = hi <= lo || (a < hi && a + p.mapping.bytes > lo);
    bool done = false;
    if (selected) {
      const cudaError_t e = wait ? cudaEventSynchronize(p.done) : cudaEventQuery(p.done);
      if (e == cudaSuccess) {
        done = true;
      } else if (e != cudaErrorNotReady) {
        sticky_.Update(CudaStatus(e, "cudaEventQuery (deferred unmap)"));
      }
    }
    if (done) {
      UnmapSlab(a, p.mapping);
      RecycleEvent(p.done);
    } else {
      pending_unmaps_[kept++] = p;
    }
  }
  pending_unmaps_.resize(kept);
}

// ---- Address space and slabs ----

absl::StatusOr<uint8_t*> CudaBackend::Reserve(size_t bytes) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (bytes == 0 || bytes % granularity_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reservation of ", bytes, " bytes is not a multiple of the CUDA granularity ",
        granularity_));
  }
  CUdeviceptr p = 0;
  KVTIER_CU_RETURN_IF_ERROR(api_->cuMemAddressReserve(&p, bytes, granularity_, 0, 0));
  return reinterpret_cast<uint8_t*>(p);
}

void CudaBackend::Unreserve(uint8_t* base, size_t bytes) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base);
  const uintptr_t hi = lo + bytes;
  RetireUnmaps(/*wait=*/true, lo, hi);
  bool synced = false;
  for (auto it = mapped_.lower_bound(lo); it != mapped_.end() && it->first < hi;) {
    if (!synced) {
      sticky_.Update(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
      synced = true;
    }
    UnmapSlab(it->first, it->second);
    it = mapped_.erase(it);
  }
  sticky_.Update(DriverStatus(api_->cuMemAddressFree(static_cast<CUdeviceptr>(lo), bytes),
                              "cuMemAddressFree"));
}

absl::Status CudaBackend::Map(uint8_t* addr, size_t bytes) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (bytes == 0 || bytes % granularity_ != 0 || a % granularity_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat("slab [", a, ", +", bytes,
                                                   ") is not aligned to the CUDA granularity ",
                                                   granularity_));
  }
  // A slab unmapped here earlier may still be waiting for its work.
  RetireUnmaps(/*wait=*/true, a, a + bytes);
  KVTIER_RETURN_IF_ERROR(sticky_);
  KVTIER_ASSIGN_OR_RETURN(const CUmemGenericAllocationHandle handle, NewHandle(bytes));
  const Mapping m{handle, bytes};
  absl::Status s = DriverStatus(api_->cuMemMap(a, bytes, 0, handle, 0), "cuMemMap");
  if (!s.ok()) {
    RecycleHandle(m);
    return s;
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  s = DriverStatus(api_->cuMemSetAccess(a, bytes, &access, 1), "cuMemSetAccess");
  if (s.ok()) s = CudaStatus(cudaMemsetAsync(addr, 0, bytes, stream_), "cudaMemsetAsync");
  if (!s.ok()) {
    UnmapSlab(a, m);
    return s;
  }
  mapped_[a] = m;
  return absl::OkStatus();
}

absl::Status CudaBackend::Unmap(uint8_t* addr, size_t bytes) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  const auto it = mapped_.find(reinterpret_cast<uintptr_t>(addr));
  if (it == mapped_.end() || it->second.bytes != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("no slab of ", bytes, " bytes is mapped at ",
                                                   reinterpret_cast<uintptr_t>(addr)));
  }
  KVTIER_ASSIGN_OR_RETURN(cudaEvent_t done, NewEvent());
  const absl::Status s = CudaStatus(cudaEventRecord(done, stream_), "cudaEventRecord");
  if (!s.ok()) {
    RecycleEvent(done);
    return s;
  }
  pending_unmaps_.push_back(PendingUnmap{addr, it->second, done});
  mapped_.erase(it);
  RetireUnmaps(/*wait=*/false);
  return sticky_;
}

// ---- Fences ----

absl::StatusOr<uint64_t> CudaBackend::RecordFence() {
  KVTIER_RETURN_IF_ERROR(sticky_);
  SnapshotNonfinite();
  KVTIER_ASSIGN_OR_RETURN(cudaEvent_t done, NewEvent());
  const absl::Status s = CudaStatus(cudaEventRecord(done, stream_), "cudaEventRecord");
  if (!s.ok()) {
    RecycleEvent(done);
    return s;
  }
  fences_.push_back(Fence{++last_fence_, done});
  FoldNonfinite();
  RetireUnmaps(/*wait=*/false);
  KVTIER_RETURN_IF_ERROR(sticky_);
  return last_fence_;
}

absl::StatusOr<bool> CudaBackend::FencePassed(uint64_t fence) {
  if (fence <= passed_fence_) return true;
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (fence > last_fence_ || fences_.empty()) return false;
  // Work on one stream completes in order: when this fence passed, so did every older one.
  const Fence& f = fences_[static_cast<size_t>(fence - fences_.front().id)];
  const cudaError_t e = cudaEventQuery(f.done);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) {
    sticky_.Update(CudaStatus(e, "cudaEventQuery (fence)"));
    return sticky_;
  }
  while (!fences_.empty() && fences_.front().id <= fence) {
    RecycleEvent(fences_.front().done);
    fences_.pop_front();
  }
  passed_fence_ = fence;
  FoldNonfinite();
  return true;
}

}  // namespace kvtier
