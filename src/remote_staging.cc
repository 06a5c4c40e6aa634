#include "src/remote_staging.h"

#include "absl/strings/str_cat.h"
#include "src/remote_block_codec.h"

namespace kvtier {

absl::StatusOr<std::unique_ptr<RemoteStaging>> RemoteStaging::Create(const Options& options,
                                                                     Backend* backend) {
  const Geometry& g = options.geometry;
  const uint32_t slot_bytes = LargestPageBytes(options);
  const size_t bytes = options.slab_bytes * g.num_layers;
  absl::StatusOr<uint8_t*> base = backend->ReserveHost(bytes);
  if (!base.ok()) return base.status();
  for (int l = 0; l < g.num_layers; ++l) {
    const absl::Status mapped = backend->MapHost(*base + options.slab_bytes * l, options.slab_bytes);
    if (!mapped.ok()) {
      for (int m = 0; m < l; ++m) {
        backend->UnmapHost(*base + options.slab_bytes * m, options.slab_bytes).IgnoreError();
      }
      backend->UnreserveHost(*base, bytes);
      return mapped;
    }
  }
  return std::unique_ptr<RemoteStaging>(
      new RemoteStaging(backend, *base, options.slab_bytes, g.num_layers, slot_bytes));
}

RemoteStaging::RemoteStaging(Backend* backend, uint8_t* base, size_t slab_bytes, int layers,
                             uint32_t slot_bytes)
    : backend_(backend),
      base_(base),
      slab_bytes_(slab_bytes),
      layers_(layers),
      slot_bytes_(slot_bytes),
      slots_(static_cast<uint32_t>(slab_bytes / slot_bytes)) {}

RemoteStaging::~RemoteStaging() {
  Drain().IgnoreError();
  for (int l = 0; l < layers_; ++l) {
    backend_->UnmapHost(base_ + slab_bytes_ * l, slab_bytes_).IgnoreError();
  }
  backend_->UnreserveHost(base_, slab_bytes_ * layers_);
}

absl::StatusOr<uint32_t> RemoteStaging::Acquire() {
  if (used_ == slots_) {
    if (absl::Status s = Drain(); !s.ok()) return s;
  }
  return used_++;
}

absl::Status RemoteStaging::Drain() {
  if (used_ > 0 && !backend_->synchronous()) {
    const absl::Status s = AwaitIssuedWork(*backend_, "the remote tier's staging copies");
    if (!s.ok()) return s;
  }
  used_ = 0;
  return absl::OkStatus();
}

PoolView RemoteStaging::View(uint32_t slot, int layer, const PageLayout& layout) const {
  PoolView view;
  view.base = base_ + slab_bytes_ * layer + size_t{slot_bytes_} * slot;
  view.layout = layout;
  return view;
}

}  // namespace kvtier
