// Host memory that the backend's copies reach (Backend::ReserveHost/MapHost: pinned and mapped
// into the device's address space on CUDA), one slab per layer, through which the remote tier's
// pages pass between device pages and Redis values (cache_remote.cc). It is cut into slots of
// the palette's largest page; slot s of layer l holds one block's page of that layer.
//
// Slots are handed out in turn; when all have been, the next Acquire first waits until the
// device has finished every copy issued so far (2 s at most), so a slot is never rewritten while
// a copy may still read or write it. Drain does the same wait before the host reads slots that
// copies wrote.
//
// Thread-compatible: the cache's mutex guards it.
#ifndef KVTIER_SRC_REMOTE_STAGING_H_
#define KVTIER_SRC_REMOTE_STAGING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kvtier/options.h"
#include "src/backend.h"

namespace kvtier {

class RemoteStaging {
 public:
  // Reserves and maps slab_bytes x layers of host-tier memory. `backend` must outlive it.
  // The backend's error, nothing kept, when that fails.
  static absl::StatusOr<std::unique_ptr<RemoteStaging>> Create(const Options& options,
                                                               Backend* backend);
  // Waits for the copies in flight (2 s at most), then unmaps.
  ~RemoteStaging();

  uint32_t slots() const { return slots_; }
  // A slot free for a new copy. DeadlineExceeded when the device has not finished the copies
  // through the slots handed out before in 2 s.
  absl::StatusOr<uint32_t> Acquire();
  // Waits until every copy issued so far has completed; every slot is free again after.
  absl::Status Drain();
  // Slot `slot` of `layer` as page 0 of a pool of `layout`.
  PoolView View(uint32_t slot, int layer, const PageLayout& layout) const;

 private:
  RemoteStaging(Backend* backend, uint8_t* base, size_t slab_bytes, int layers, uint32_t slot_bytes);

  Backend* const backend_;
  uint8_t* const base_;
  const size_t slab_bytes_;
  const int layers_;
  const uint32_t slot_bytes_;
  const uint32_t slots_;
  uint32_t used_ = 0;  // slots handed out since the last wait
};

}  // namespace kvtier

#endif  // KVTIER_SRC_REMOTE_STAGING_H_
