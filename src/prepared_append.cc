// PreparedAppend and WriteKVLayers (kvtier/prepared_append.h): the checks and the CPU path here,
// the device buffers and the launch in src/cuda/cuda_append_step.cc.
#include "kvtier/prepared_append.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

#if KVTIER_WITH_CUDA
#include "src/cuda/cuda_append_step.h"
#endif

namespace kvtier {
namespace {

constexpr int64_t kMaxRows = int64_t{1} << 31;

#if !KVTIER_WITH_CUDA
absl::Status NoCuda() { return absl::UnavailableError("kvtier was built without CUDA"); }
#endif

bool OnCpu(const Cache& cache) { return cache.options().backend == BackendKind::kCpu; }

}  // namespace

struct PreparedAppend::Rep {
  CacheImpl* cache;  // the cache the step was prepared for
  int64_t max_rows = 0;
  void* stream = nullptr;      // Create's
  std::vector<int64_t> slots;  // the step's slots (their count only is used on CUDA)
  uint64_t slab_unmaps = 0;    // the cache's SlabUnmaps() when Update took them
#if KVTIER_WITH_CUDA
  std::unique_ptr<CudaAppendStep> device;  // CUDA backend: the slots on the device
  std::vector<gpu::AppendPool> pools;      // each layer's hot pool, refilled by every Update
#endif
};

PreparedAppend::PreparedAppend(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
PreparedAppend::PreparedAppend(PreparedAppend&&) noexcept = default;
PreparedAppend& PreparedAppend::operator=(PreparedAppend&&) noexcept = default;
PreparedAppend::~PreparedAppend() = default;

int64_t PreparedAppend::rows() const {
  return rep_ == nullptr ? 0 : static_cast<int64_t>(rep_->slots.size());
}
int64_t PreparedAppend::max_rows() const { return rep_ == nullptr ? 0 : rep_->max_rows; }

absl::StatusOr<PreparedAppend> PreparedAppend::Create(Cache& cache, int64_t max_rows,
                                                      const DeviceLaunch& launch) {
  auto* impl = dynamic_cast<CacheImpl*>(&cache);
  if (impl == nullptr) return absl::InvalidArgumentError("a cache not made by Cache::Create");
  if (max_rows < 1 || max_rows > kMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows ", max_rows, " is outside [1, ", kMaxRows, "]"));
  }
  auto rep = std::make_unique<Rep>();
  rep->cache = impl;
  rep->max_rows = max_rows;
  rep->stream = launch.stream;
  if (OnCpu(cache)) return PreparedAppend(std::move(rep));
#if KVTIER_WITH_CUDA
  const Options& o = cache.options();
  const Geometry& g = o.geometry;
  CudaAppendStep::Spec spec;
  spec.layout = MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, o.palette[0]);
  spec.num_layers = g.num_layers;
  spec.max_rows = max_rows;
  spec.rotate_keys = o.key_rotation == KeyRotation::kHadamard;
  spec.key_rotation_seed = o.key_rotation_seed;
  KVTIER_ASSIGN_OR_RETURN(spec.nonfinite, impl->DeviceNonfiniteCounter());
  KVTIER_ASSIGN_OR_RETURN(rep->device, CudaAppendStep::Create(spec, launch.stream));
  rep->pools.resize(static_cast<size_t>(g.num_layers));
  return PreparedAppend(std::move(rep));
#else
  return NoCuda();
#endif
}

absl::Status PreparedAppend::Update(absl::Span<const int64_t> slots) {
  if (rep_ == nullptr) return absl::FailedPreconditionError("the step was moved from");
  if (static_cast<int64_t>(slots.size()) > rep_->max_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        slots.size(), " slots; the step was prepared for at most ", rep_->max_rows));
  }
  KVTIER_RETURN_IF_ERROR(rep_->cache->CheckSlotList(slots));
  const uint64_t unmaps = rep_->cache->SlabUnmaps();
  if (!OnCpu(*rep_->cache)) {
#if KVTIER_WITH_CUDA
    // Refilled every step: CalibrateTensorScales may have changed a layer's scales.
    std::vector<gpu::AppendPool>& pools = rep_->pools;
    for (size_t l = 0; l < pools.size(); ++l) {
      KVTIER_ASSIGN_OR_RETURN(const PoolInfo pool,
                              rep_->cache->GetPool(0, static_cast<int32_t>(l)));
      pools[l] = {static_cast<uint8_t*>(pool.base), pool.k_tensor_scale, pool.v_tensor_scale};
    }
    // The zero-fill of slabs that Append mapped, and tail copies, come first.
    KVTIER_RETURN_IF_ERROR(rep_->cache->JoinStream(rep_->stream, /*stream_waits=*/true));
    KVTIER_RETURN_IF_ERROR(rep_->device->Overwrite(slots, pools));
#else
    return NoCuda();
#endif
  }
  rep_->slots.assign(slots.begin(), slots.end());
  rep_->slab_unmaps = unmaps;
  return absl::OkStatus();
}

absl::Status PreparedAppend::AfterGraphLaunch() {
  if (rep_ == nullptr) return absl::FailedPreconditionError("the step was moved from");
  if (OnCpu(*rep_->cache)) return absl::OkStatus();
  return rep_->cache->JoinStream(rep_->stream, /*stream_waits=*/false);
}

absl::Status WriteKVLayers(Cache& cache, const PreparedAppend& step,
                           absl::Span<const KVInput> layers, const DeviceLaunch& launch) {
  if (step.rep_ == nullptr) return absl::FailedPreconditionError("the step was moved from");
  const PreparedAppend::Rep& rep = *step.rep_;
  if (rep.cache != &cache) {
    return absl::InvalidArgumentError("the step was prepared for another cache");
  }
  const int32_t num_layers = cache.options().geometry.num_layers;
  if (layers.size() != static_cast<size_t>(num_layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(layers.size(), " layer inputs for a cache of ", num_layers, " layers"));
  }
  const int64_t rows = static_cast<int64_t>(rep.slots.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const absl::Status s = rep.cache->CheckInput(layers[l], rows);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("layers[", l, "]: ", s.message()));
    if (layers[l].dtype != layers[0].dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers[", l, "] is of another dtype than layers[0]"));
    }
  }
  if (OnCpu(cache)) {
    for (int32_t l = 0; l < num_layers; ++l) {
      KVTIER_RETURN_IF_ERROR(cache.WriteKV(l, rep.slots, layers[l]));
    }
    return absl::OkStatus();
  }
#if KVTIER_WITH_CUDA
  if (launch.stream != rep.stream) {
    return absl::InvalidArgumentError("WriteKVLayers on a stream other than the step's");
  }
  // Slots from before a slab unmap may lie in unmapped memory, where the write would fault the
  // device (the CPU path's WriteKV checks every slot).
  KVTIER_RETURN_IF_ERROR(rep.cache->CheckMappedSince(rep.slab_unmaps, "the step's slots (Update)"));
  KVTIER_ASSIGN_OR_RETURN(const bool capturing, rep.device->Launch(layers, launch.synchronize));
  if (capturing) return absl::OkStatus();  // AfterGraphLaunch orders the cache after replays
  return rep.cache->JoinStream(rep.stream, /*stream_waits=*/false);
#else
  (void)launch;
  return NoCuda();
#endif
}

}  // namespace kvtier
