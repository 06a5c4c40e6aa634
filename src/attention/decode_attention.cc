#include "kvtier/attention.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/attention/attention_contract.h"
#include "src/attention/reference_attention.h"
#include "src/status_macros.h"

#if KVTIER_WITH_CUDA
#include "src/cuda/cuda_decode_attention.h"
#endif

namespace kvtier {
namespace {

// The CPU backend's attention: the reference, once the call's shapes are valid (InvalidArgument)
// and every page it names holds a block (FailedPrecondition: a stale page's slab may be
// unmapped).
absl::Status ReferenceOverHeldPages(const Cache& cache, const PagedLayer& kv,
                                    const PageTables& tables, const DecodeQueries& queries,
                                    const DecodeOutputs& outputs) {
  KVTIER_RETURN_IF_ERROR(ValidatePagedDecode(kv, tables, queries, outputs));
  KVTIER_RETURN_IF_ERROR(cache.CheckTablesHeld(tables));
  return PagedDecodeAttention(kv, tables, queries, outputs);
}

}  // namespace

absl::Status DecodeAttention(const Cache& cache, int32_t layer, const PageTables& tables,
                             const DecodeQueries& queries, const DecodeOutputs& outputs,
                             const DeviceLaunch& launch) {
  absl::StatusOr<PagedLayer> kv = GetPagedLayer(cache, layer);
  if (!kv.ok()) return kv.status();
  if (cache.options().backend == BackendKind::kCpu) {
    return ReferenceOverHeldPages(cache, *kv, tables, queries, outputs);
  }
#if KVTIER_WITH_CUDA
  KVTIER_RETURN_IF_ERROR(cache.CheckTablesMapped(tables));
  return CudaDecodeAttention(*kv, tables, queries, outputs, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

struct PreparedDecode::Rep {
  const Cache* cache;  // the cache the step was prepared for
  TableExtent extent;
  PageTables tables;  // the step's tables (CUDA backend: only their slab_unmaps)
#if KVTIER_WITH_CUDA
  std::unique_ptr<CudaDecodeTables> device;  // CUDA backend: their device copy
#endif
};

PreparedDecode::PreparedDecode(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
PreparedDecode::PreparedDecode(PreparedDecode&&) noexcept = default;
PreparedDecode& PreparedDecode::operator=(PreparedDecode&&) noexcept = default;
PreparedDecode::~PreparedDecode() = default;

int64_t PreparedDecode::batch() const { return rep_ == nullptr ? 0 : rep_->extent.batch; }

absl::StatusOr<PreparedDecode> PreparedDecode::Create(const Cache& cache, const PageTables& tables,
                                                      const DeviceLaunch& launch,
                                                      int32_t max_pages) {
  const Options& options = cache.options();
  auto rep = std::make_unique<Rep>();
  rep->cache = &cache;
  KVTIER_ASSIGN_OR_RETURN(rep->extent, CheckPageTables(tables, options.geometry.block_tokens,
                                                       options.palette.size()));
  // The most pages a sequence of an int32 length can take.
  const int64_t most = (int64_t{INT32_MAX} + options.geometry.block_tokens - 1) /
                       options.geometry.block_tokens;
  if (max_pages < 0 || max_pages > most) {
    return absl::InvalidArgumentError(absl::StrCat("max_pages ", max_pages, " is outside [0, ",
                                                   most, "], the pages an int32 length can take"));
  }
  // Every later step's split is planned for this many pages, so that a captured launch replays.
  rep->extent.max_pages = std::max(rep->extent.max_pages, max_pages);
  if (options.backend == BackendKind::kCpu) {
    rep->tables = tables;
    return PreparedDecode(std::move(rep));
  }
#if KVTIER_WITH_CUDA
  const size_t capacity = static_cast<size_t>(rep->extent.batch) * rep->extent.max_pages;
  KVTIER_ASSIGN_OR_RETURN(rep->device, CudaDecodeTables::Upload(tables, launch.stream,
                                                                    /*any_stream=*/true, capacity));
  rep->tables.slab_unmaps = tables.slab_unmaps;
  return PreparedDecode(std::move(rep));
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

absl::Status PreparedDecode::Update(const PageTables& tables) {
  if (rep_ == nullptr) return absl::FailedPreconditionError("the step was moved from");
  const Options& options = rep_->cache->options();
  KVTIER_ASSIGN_OR_RETURN(TableExtent extent, CheckPageTables(tables, options.geometry.block_tokens,
                                                              options.palette.size()));
  if (extent.batch != rep_->extent.batch || extent.max_pages > rep_->extent.max_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the step was prepared for ", rep_->extent.batch, " sequences of at most ",
        rep_->extent.max_pages, " pages; these tables have ", extent.batch,
        " sequences of up to ", extent.max_pages));
  }
  extent.max_pages = rep_->extent.max_pages;
  extent.entries_of = rep_->extent.entries_of;  // the staging Create chose (TableExtent)
  if (options.backend == BackendKind::kCpu) {
    rep_->tables = tables;
  } else {
#if KVTIER_WITH_CUDA
    KVTIER_RETURN_IF_ERROR(rep_->device->Overwrite(tables));
#endif
    rep_->tables.slab_unmaps = tables.slab_unmaps;
  }
  rep_->extent = std::move(extent);
  return absl::OkStatus();
}

absl::Status DecodeAttention(const Cache& cache, int32_t layer, const PreparedDecode& step,
                             const DecodeQueries& queries, const DecodeOutputs& outputs,
                             const DeviceLaunch& launch) {
  if (step.rep_ == nullptr) return absl::FailedPreconditionError("the step was moved from");
  const PreparedDecode::Rep& rep = *step.rep_;
  if (rep.cache != &cache) {
    return absl::InvalidArgumentError("the step was prepared for another cache");
  }
  KVTIER_ASSIGN_OR_RETURN(const PagedLayer kv, GetPagedLayer(cache, layer));
  if (cache.options().backend == BackendKind::kCpu) {
    return ReferenceOverHeldPages(cache, kv, rep.tables, queries, outputs);
  }
#if KVTIER_WITH_CUDA
  KVTIER_RETURN_IF_ERROR(cache.CheckTablesMapped(rep.tables));
  return CudaDecodeAttention(kv, *rep.device, rep.extent, queries, outputs, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

}  // namespace kvtier
