// The CUDA backend's host tier (backend.h): host-tier memory is reserved with mmap(PROT_NONE)
// and a slab is made accessible and page-locked (cudaHostRegister, mapped into the device's
// address space) as it is mapped, so copies between the tiers are asynchronous DMA on the
// backend's stream and kernels (Requantize on the way down) reach it by the same pointer.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "src/cuda/cuda_backend.h"

namespace kvtier {
namespace {

absl::Status Errno(const char* call) {
  const int e = errno;
  return absl::ResourceExhaustedError(absl::StrCat(call, " failed: ", std::strerror(e)));
}

}  // namespace

absl::StatusOr<uint8_t*> CudaBackend::ReserveHost(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Errno("mmap");
  return static_cast<uint8_t*>(p);
}

void CudaBackend::UnreserveHost(uint8_t* base, size_t bytes) { munmap(base, bytes); }

absl::Status CudaBackend::MapHost(uint8_t* addr, size_t bytes) {
  if (mprotect(addr, bytes, PROT_READ | PROT_WRITE) != 0) return Errno("mprotect");
  const absl::Status s = CudaStatus(
      cudaHostRegister(addr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
      "cudaHostRegister");
  if (!s.ok()) mprotect(addr, bytes, PROT_NONE);
  return s;
}

absl::Status CudaBackend::UnmapHost(uint8_t* addr, size_t bytes) {
  // An empty slab's pages were reclaimed after their fences, but wait for the stream anyway:
  // slabs move rarely, and unregistering memory a copy still touches is undefined.
  KVTIER_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  KVTIER_CUDA_RETURN_IF_ERROR(cudaHostUnregister(addr));
  // Drop the memory so the slab holds zeros, not stale data, when mapped again.
  if (madvise(addr, bytes, MADV_DONTNEED) != 0) return Errno("madvise");
  if (mprotect(addr, bytes, PROT_NONE) != 0) return Errno("mprotect");
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyPages(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                                    absl::Span<const uint32_t> src_pages,
                                    absl::Span<const uint32_t> dst_pages) {
  if (src_pages.empty() && from.size() == to.size() && !from.empty()) return sticky_;
  for (size_t l = 0; l < from.size() && l < to.size(); ++l) {
    if (from[l].layout.page_bytes != to[l].layout.page_bytes) {
      return absl::InvalidArgumentError("CopyPages: the two sides' pages differ in size");
    }
  }
  KVTIER_ASSIGN_OR_RETURN(const PageBatch batch,
                          StagePageBatch("CopyPages", from, to, src_pages, dst_pages));
  gpu::CopyPagesParams p;
  p.layers = batch.layers;
  p.src_pages = batch.src_pages;
  p.dst_pages = batch.dst_pages;
  p.page_bytes = from[0].layout.page_bytes;
  p.num_layers = static_cast<int32_t>(from.size());
  p.num_pages = static_cast<int32_t>(src_pages.size());
  p.num_sms = num_sms_;
  KVTIER_CUDA_RETURN_IF_ERROR(gpu::LaunchCopyPages(p, stream_));
  return absl::OkStatus();
}

}  // namespace kvtier
