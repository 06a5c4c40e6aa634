#include "src/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

bool SameCodec(const CodecLayout& a, const CodecLayout& b) {
  return a.type == b.type && a.scope == b.scope && a.axis == b.axis &&
         a.row_bytes == b.row_bytes && a.payload_offset == b.payload_offset &&
         a.micro_offset == b.micro_offset && a.scale_offset == b.scale_offset;
}

bool SameLayout(const PageLayout& a, const PageLayout& b) {
  return a.heads == b.heads && a.tokens == b.tokens && a.head_dim == b.head_dim &&
         a.page_bytes == b.page_bytes && a.data_bytes == b.data_bytes && SameCodec(a.k, b.k) &&
         SameCodec(a.v, b.v);
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

FastCodecCheck g_check;  // written once, under g_check_once
std::once_flag g_check_once;

// Runs the self-check on `stream` and waits for it.
FastCodecCheck RunSelfCheck(cudaStream_t stream) {
  FastCodecCheck check;
  unsigned long long* counts = nullptr;
  unsigned int* first = nullptr;
  constexpr int n = gpu::kSelfCheckCounters;
  if (cudaMalloc(reinterpret_cast<void**>(&counts), n * sizeof(*counts)) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&first), n * sizeof(*first)) != cudaSuccess ||
      cudaMemsetAsync(counts, 0, n * sizeof(*counts), stream) != cudaSuccess ||
      cudaMemsetAsync(first, 0xFF, n * sizeof(*first), stream) != cudaSuccess ||
      gpu::LaunchFastCodecSelfCheck(counts, first, stream) != cudaSuccess) {
    cudaFree(counts);
    cudaFree(first);
    return check;  // not run: the codec paths only
  }
  unsigned long long c[n];
  unsigned int f[n];
  if (cudaMemcpyAsync(c, counts, sizeof(c), cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
      cudaMemcpyAsync(f, first, sizeof(f), cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
      cudaStreamSynchronize(stream) == cudaSuccess) {
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
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device: cudaGetDeviceCount: ",
        e != cudaSuccess ? absl::StrCat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")")
                         : std::string("0 devices")));
  }
  KVTIER_ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
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
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&nonfinite_device_), sizeof(*nonfinite_device_)));
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(nonfinite_device_, 0, sizeof(*nonfinite_device_), stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&snapshots_), kSnapshots * sizeof(*snapshots_)));
  for (int i = 0; i < kSnapshots; ++i) {
    KVTIER_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&snapshot_done_[i], cudaEventDisableTiming));
    snapshot_free_.push_back(i);
  }
  for (StagingSlot& s : staging_) {
    KVTIER_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
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
  // KVTIER_CUDA_MIGRATE=2|3|4: blocks per SM of the Requantize kernel for 16-bit sources
  // (data_plane.cuh's RequantizeVariant), for benchmarks and tests.
  if (const char* form = std::getenv("KVTIER_CUDA_MIGRATE"); form != nullptr) {
    if (std::strcmp(form, "2") == 0) variant_ = gpu::RequantizeVariant::kTwoBlocksPerSm;
    if (std::strcmp(form, "4") == 0) variant_ = gpu::RequantizeVariant::kFourBlocksPerSm;
  }
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  RetireUnmaps(/*wait=*/true).IgnoreError();
  for (const auto& [addr, m] : mapped_) {
    api_->cuMemUnmap(static_cast<CUdeviceptr>(addr), m.bytes);
    api_->cuMemRelease(m.handle);
  }
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
  if (snapshots_ != nullptr) cudaFreeHost(snapshots_);
  cudaFree(nonfinite_device_);
  cudaFree(device_staging_);
  cudaFree(scratch_);
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
  for (size_t i = 0; i < free_handles_.size(); ++i) {
    if (free_handles_[i].bytes == bytes) {
      const CUmemGenericAllocationHandle h = free_handles_[i].handle;
      free_handles_.erase(free_handles_.begin() + static_cast<ptrdiff_t>(i));
      return h;
    }
  }
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  CUmemGenericAllocationHandle h = 0;
  KVTIER_CU_RETURN_IF_ERROR(api_->cuMemCreate(&h, bytes, &prop, 0));
  return h;
}

void CudaBackend::RecycleHandle(const Mapping& m) {
  if (free_handles_.size() < kMaxFreeHandles) {
    free_handles_.push_back(m);
  } else {
    sticky_.Update(DriverStatus(api_->cuMemRelease(m.handle), "cuMemRelease"));
  }
}

absl::Status CudaBackend::RetireUnmaps(bool wait, uintptr_t lo, uintptr_t hi) {
  absl::Status status;
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
        status.Update(CudaStatus(e, "cudaEventQuery (deferred unmap)"));
      }
    }
    if (done) {
      status.Update(DriverStatus(
          api_->cuMemUnmap(static_cast<CUdeviceptr>(a), p.mapping.bytes), "cuMemUnmap"));
      RecycleHandle(p.mapping);
      RecycleEvent(p.done);
    } else {
      pending_unmaps_[kept++] = p;
    }
  }
  pending_unmaps_.resize(kept);
  return status;
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
  sticky_.Update(RetireUnmaps(/*wait=*/true, lo, hi));
  bool synced = false;
  for (auto it = mapped_.lower_bound(lo); it != mapped_.end() && it->first < hi;) {
    if (!synced) {
      sticky_.Update(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
      synced = true;
    }
    sticky_.Update(DriverStatus(
        api_->cuMemUnmap(static_cast<CUdeviceptr>(it->first), it->second.bytes), "cuMemUnmap"));
    RecycleHandle(it->second);
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
  KVTIER_RETURN_IF_ERROR(RetireUnmaps(/*wait=*/true, a, a + bytes));
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
    api_->cuMemUnmap(a, bytes);
    RecycleHandle(m);
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
  return RetireUnmaps(/*wait=*/false);
}

// ---- Staging of small host arrays ----

absl::StatusOr<void*> CudaBackend::StageHost(size_t bytes) {
  next_staging_ = (next_staging_ + 1) % kStagingSlots;
  StagingSlot& s = staging_[next_staging_];
  // The copy that last read this buffer (kStagingSlots stagings ago) must have completed.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(s.copied));
  if (s.bytes < bytes) {
    const size_t want = std::max<size_t>(RoundUp(bytes, size_t{64} << 10), 2 * s.bytes);
    if (s.host != nullptr) KVTIER_CUDA_RETURN_IF_ERROR(cudaFreeHost(s.host));
    s.host = nullptr;
    s.bytes = 0;
    KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocHost(&s.host, want));
    s.bytes = want;
  }
  return s.host;
}

absl::Status CudaBackend::GrowDevice(void** buffer, size_t* capacity, size_t bytes) {
  if (*capacity >= bytes) return absl::OkStatus();
  // Stream-ordered: work already queued that reads the old buffer runs first.
  const size_t want = std::max<size_t>(RoundUp(bytes, size_t{64} << 10), 2 * *capacity);
  if (*buffer != nullptr) KVTIER_CUDA_RETURN_IF_ERROR(cudaFreeAsync(*buffer, stream_));
  *buffer = nullptr;
  *capacity = 0;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMallocAsync(buffer, want, stream_));
  *capacity = want;
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::Upload(size_t bytes) {
  KVTIER_RETURN_IF_ERROR(GrowDevice(&device_staging_, &device_staging_bytes_, bytes));
  StagingSlot& s = staging_[next_staging_];
  KVTIER_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device_staging_, s.host, bytes, cudaMemcpyHostToDevice, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.copied, stream_));
  return device_staging_;
}

// ---- Non-finite counter ----

void CudaBackend::SnapshotNonfinite() {
  if (nonfinite_sink_ == nullptr || snapshot_free_.empty()) return;
  const int i = snapshot_free_.back();
  if (cudaMemcpyAsync(&snapshots_[i], nonfinite_device_, sizeof(uint64_t),
                      cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
      cudaEventRecord(snapshot_done_[i], stream_) != cudaSuccess) {
    return;  // a later snapshot takes the count
  }
  snapshot_free_.pop_back();
  snapshot_pending_.push_back(i);
}

void CudaBackend::FoldNonfinite() {
  while (!snapshot_pending_.empty() &&
         cudaEventQuery(snapshot_done_[snapshot_pending_.front()]) == cudaSuccess) {
    const int i = snapshot_pending_.front();
    snapshot_pending_.pop_front();
    snapshot_free_.push_back(i);
    const uint64_t value = snapshots_[i];
    if (value > folded_) {
      *nonfinite_sink_ += static_cast<int64_t>(value - folded_);
      folded_ = value;
    }
  }
}

// ---- Data plane ----

absl::Status CudaBackend::WriteRows(const PoolView& pool, absl::Span<const int64_t> slots,
                                    const KVInput& kv, int64_t* nonfinite) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (kv.dtype != DType::kFloat16 && kv.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError("K/V input must be FP16 or BF16");
  }
  if (slots.empty()) return absl::OkStatus();
  if (nonfinite != nonfinite_sink_) {
    FoldNonfinite();
    nonfinite_sink_ = nonfinite;
  }
  const PageLayout& l = pool.layout;
  const size_t bytes = slots.size() * sizeof(gpu::RowSlot);
  KVTIER_ASSIGN_OR_RETURN(void* host, StageHost(bytes));
  auto* rows = static_cast<gpu::RowSlot*>(host);
  const uint32_t tokens = static_cast<uint32_t>(l.tokens);
  if ((tokens & (tokens - 1)) == 0) {  // the usual case: shifts, which the compiler vectorizes
    const int shift = __builtin_ctz(tokens);
    for (size_t i = 0; i < slots.size(); ++i) {
      rows[i].page = static_cast<uint32_t>(static_cast<uint64_t>(slots[i]) >> shift);
      rows[i].token = static_cast<uint32_t>(slots[i]) & (tokens - 1);
    }
  } else {
    for (size_t i = 0; i < slots.size(); ++i) {
      rows[i].page = static_cast<uint32_t>(slots[i] / tokens);
      rows[i].token = static_cast<uint32_t>(slots[i] % tokens);
    }
  }
  KVTIER_ASSIGN_OR_RETURN(void* device_rows, Upload(bytes));
  gpu::WriteRowsParams p;
  p.base = pool.base;
  p.layout = l;
  p.k_scale = pool.k_tensor_scale;
  p.v_scale = pool.v_tensor_scale;
  p.slots = static_cast<const gpu::RowSlot*>(device_rows);
  p.num_rows = static_cast<int64_t>(slots.size());
  p.k = kv.k;
  p.v = kv.v;
  p.bf16 = kv.dtype == DType::kBFloat16;
  p.nonfinite = nonfinite_device_;
  p.num_sms = num_sms_;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchWriteRows(p, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReadPage(const PoolView& pool, uint32_t page, int num_tokens, float* k,
                                   float* v) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (num_tokens <= 0) return absl::OkStatus();
  const PageLayout& l = pool.layout;
  const size_t floats = static_cast<size_t>(num_tokens) * l.heads * l.head_dim;
  KVTIER_RETURN_IF_ERROR(GrowDevice(&scratch_, &scratch_bytes_, 2 * floats * sizeof(float)));
  gpu::ReadPageParams p;
  p.page = pool.base + static_cast<size_t>(page) * l.page_bytes;
  p.layout = l;
  p.k_scale = pool.k_tensor_scale;
  p.v_scale = pool.v_tensor_scale;
  p.num_tokens = num_tokens;
  p.k = static_cast<float*>(scratch_);
  p.v = p.k + floats;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchReadPage(p, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(k, p.k, floats * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(v, p.v, floats * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
  SnapshotNonfinite();
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  FoldNonfinite();
  return absl::OkStatus();
}

absl::Status CudaBackend::Requantize(absl::Span<const PoolView> from,
                                     absl::Span<const PoolView> to,
                                     absl::Span<const uint32_t> src_pages,
                                     absl::Span<const uint32_t> dst_pages) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  if (from.size() != to.size() || src_pages.size() != dst_pages.size() || from.empty()) {
    return absl::InvalidArgumentError("Requantize: mismatched layer or page lists");
  }
  if (src_pages.empty()) return absl::OkStatus();
  for (size_t l = 1; l < from.size(); ++l) {
    if (!SameLayout(from[l].layout, from[0].layout) || !SameLayout(to[l].layout, to[0].layout)) {
      return absl::InvalidArgumentError("Requantize: page layouts differ between layers");
    }
  }
  const size_t layers = from.size();
  const size_t n = src_pages.size();
  const size_t table = layers * sizeof(gpu::LayerPools);
  const size_t bytes = table + 2 * n * sizeof(uint32_t);
  KVTIER_ASSIGN_OR_RETURN(void* host, StageHost(bytes));
  auto* pools = static_cast<gpu::LayerPools*>(host);
  for (size_t l = 0; l < layers; ++l) {
    pools[l].src = from[l].base;
    pools[l].dst = to[l].base;
    pools[l].src_k_scale = from[l].k_tensor_scale;
    pools[l].src_v_scale = from[l].v_tensor_scale;
    pools[l].dst_k_scale = to[l].k_tensor_scale;
    pools[l].dst_v_scale = to[l].v_tensor_scale;
  }
  auto* pages = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(host) + table);
  std::memcpy(pages, src_pages.data(), n * sizeof(uint32_t));
  std::memcpy(pages + n, dst_pages.data(), n * sizeof(uint32_t));
  KVTIER_ASSIGN_OR_RETURN(void* device, Upload(bytes));
  gpu::RequantizeParams p;
  p.src = from[0].layout;
  p.dst = to[0].layout;
  p.layers = static_cast<const gpu::LayerPools*>(device);
  p.src_pages = reinterpret_cast<const uint32_t*>(static_cast<uint8_t*>(device) + table);
  p.dst_pages = p.src_pages + n;
  p.num_layers = static_cast<int32_t>(layers);
  p.num_blocks = static_cast<int32_t>(n);
  p.fast = fast_;
  p.variant = variant_;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchRequantize(p, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyPage(const PoolView& pool, uint32_t src, uint32_t dst) {
  KVTIER_RETURN_IF_ERROR(sticky_);
  const size_t bytes = pool.layout.page_bytes;
  KVTIER_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pool.base + dst * bytes, pool.base + src * bytes,
                                              bytes, cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
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
  KVTIER_RETURN_IF_ERROR(RetireUnmaps(/*wait=*/false));
  return last_fence_;
}

bool CudaBackend::FencePassed(uint64_t fence) {
  if (fence <= passed_fence_) return true;
  if (fence > last_fence_ || fences_.empty()) return false;
  // Work on one stream completes in order: when this fence passed, so did every older one.
  const Fence& f = fences_[static_cast<size_t>(fence - fences_.front().id)];
  const cudaError_t e = cudaEventQuery(f.done);
  if (e != cudaSuccess) {
    if (e != cudaErrorNotReady) sticky_.Update(CudaStatus(e, "cudaEventQuery (fence)"));
    return false;
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
