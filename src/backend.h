// The narrow platform layer under a cache: address space, slab mapping, the data plane and
// fences. One implementation per platform, one file each: cpu/cpu_backend.cc for host memory,
// cuda/cuda_backend.cc for NVIDIA GPUs. The cache does all bookkeeping; a backend only moves
// bytes and reports when device work has finished.
//
// Thread-compatible: the cache calls a backend under its own mutex.
#ifndef KVTIER_SRC_BACKEND_H_
#define KVTIER_SRC_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/page_layout.h"
#include "kvtier/cache.h"
#include "src/block_events.h"

namespace kvtier {

// One (format, layer) pool as the data plane sees it.
struct PoolView {
  uint8_t* base = nullptr;  // page p starts at base + p * layout.page_bytes
  PageLayout layout{};
  float k_tensor_scale = 1.f;  // for ScaleScope::kTensor codecs
  float v_tensor_scale = 1.f;
  // Options::key_rotation: when set, WriteRows stores R_h k for each K row of head h
  // (kernels/codec/hadamard.h) instead of k. Read by WriteRows only; every other call moves
  // the rotated data as it is.
  bool rotate_keys = false;
  uint64_t key_rotation_seed = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Reserves `bytes` of address space with nothing accessible in it.
  virtual absl::StatusOr<uint8_t*> Reserve(size_t bytes) = 0;
  virtual void Unreserve(uint8_t* base, size_t bytes) = 0;
  // Backs [addr, addr + bytes), one slab of one layer, with memory; contents unspecified.
  virtual absl::Status Map(uint8_t* addr, size_t bytes) = 0;
  // Makes [addr, addr + bytes) inaccessible again and returns its memory.
  virtual absl::Status Unmap(uint8_t* addr, size_t bytes) = 0;

  // Encodes token rows into token-wise pages: row i of `kv` goes to slot slots[i]
  // (page * block_tokens + offset). Adds the count of NaN/Inf input values to *nonfinite.
  // REQUIRES: slots and shapes validated by the cache.
  virtual absl::Status WriteRows(const PoolView& pool, absl::Span<const int64_t> slots,
                                 const KVInput& kv, int64_t* nonfinite) = 0;
  // Decodes the first `num_tokens` tokens of `page` into k and v, [num_tokens, heads, dim].
  virtual absl::Status ReadPage(const PoolView& pool, uint32_t page, int num_tokens, float* k,
                                float* v) = 0;
  // Requantises full blocks in every layer: page src_pages[i] of `from[layer]` is decoded and
  // re-encoded into page dst_pages[i] of `to[layer]`, scales computed from the block's own data
  // (page_codec.h's EncodeBlockHead). REQUIRES: from.size() == to.size() == layers; the pages
  // hold full blocks.
  virtual absl::Status Requantize(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                                  absl::Span<const uint32_t> src_pages,
                                  absl::Span<const uint32_t> dst_pages) = 0;
  // Copies page `src` to page `dst` of one pool.
  virtual absl::Status CopyPage(const PoolView& pool, uint32_t src, uint32_t dst) = 0;

  // Host-tier memory: the contract of Reserve, Unreserve, Map and Unmap, in host memory that
  // CopyPages and Requantize reach directly (pinned on CUDA, so copies are asynchronous DMA).
  virtual absl::StatusOr<uint8_t*> ReserveHost(size_t bytes) = 0;
  virtual void UnreserveHost(uint8_t* base, size_t bytes) = 0;
  virtual absl::Status MapHost(uint8_t* addr, size_t bytes) = 0;
  virtual absl::Status UnmapHost(uint8_t* addr, size_t bytes) = 0;
  // Copies page src_pages[i] of `from[layer]` to page dst_pages[i] of `to[layer]` in every
  // layer, as one batch; one side may be host-tier memory. Ordered with every other call:
  // complete by the next fence. REQUIRES: from.size() == to.size(); equal layouts in every
  // pool; src_pages.size() == dst_pages.size().
  virtual absl::Status CopyPages(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                                 absl::Span<const uint32_t> src_pages,
                                 absl::Span<const uint32_t> dst_pages) = 0;

  // Device work that callers enqueue on their own streams (PreparedAppend's WriteKVLayers).
  // The device counter such work adds its NaN/Inf input counts to, folded into *nonfinite as
  // WriteRows' counts are (the binding of WriteRows' latest call is replaced); null on backends
  // that run no device work.
  virtual absl::StatusOr<void*> DeviceNonfiniteCounter(int64_t* nonfinite) {
    (void)nonfinite;
    return nullptr;
  }
  // Orders `stream` (a cudaStream_t on CUDA) after the work issued here so far when
  // `stream_waits`, or this backend's later work after the work enqueued on `stream` so far
  // otherwise. OK and nothing to do on synchronous backends.
  virtual absl::Status JoinStream(void* stream, bool stream_waits) {
    (void)stream;
    (void)stream_waits;
    return absl::OkStatus();
  }

  // The CUDA device the pools live on (the one current when the backend was made); 0 on
  // backends of host memory, as DLPack numbers the CPU.
  virtual int32_t device_id() const { return 0; }
  // True when every call above has completed on return, so freed pages may be reused at once.
  virtual bool synchronous() const = 0;
  // A fence that passes once all work issued so far has completed.
  virtual absl::StatusOr<uint64_t> RecordFence() = 0;
  // Whether `fence` has passed; the device's error when the work before it failed (it never
  // passes then).
  virtual absl::StatusOr<bool> FencePassed(uint64_t fence) = 0;
  // The id that the next RecordFence returns: a fence that passes only once a fence recorded
  // later has passed, so that a caller whose RecordFence failed can still hand out a fence that
  // covers the work issued so far (never one that has passed before that work is done).
  virtual uint64_t NextFence() const = 0;
};

std::unique_ptr<Backend> MakeCpuBackend();

// Records a fence on `backend` and waits (yielding) until it passes: the device's error when the
// work before it failed, DeadlineExceeded ("the device has not finished <what> after 2000 ms")
// when it has not passed in 2 s. For asynchronous backends.
absl::Status AwaitIssuedWork(Backend& backend, absl::string_view what);

// A cache over `backend` (Cache::Create picks the backend from options.backend; tests pass a
// fault-injecting one). Errors as Cache::Create's, and ResourceExhausted when the host cannot
// hold the block metadata that the budget needs. Never throws.
// `events` receives the cache's block events (block_events.h), or null for none.
absl::StatusOr<std::unique_ptr<Cache>> CreateCache(
    const Options& options, std::unique_ptr<Backend> backend,
    std::unique_ptr<BlockEventSink> events = nullptr);

// The CUDA backend on the current device. Unavailable (with the reason) when no driver or
// device is present. Defined only in builds with KVTIER_WITH_CUDA.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend();

}  // namespace kvtier

#endif  // KVTIER_SRC_BACKEND_H_
