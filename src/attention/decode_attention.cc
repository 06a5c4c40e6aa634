#include "kvtier/attention.h"

#include <memory>
#include <utility>

#include "src/attention/attention_contract.h"
#include "src/attention/reference_attention.h"
#include "src/status_macros.h"

#if KVTIER_WITH_CUDA
#include "src/cuda/cuda_decode_attention.h"
#endif

namespace kvtier {

absl::Status DecodeAttention(const Cache& cache, int32_t layer, const PageTables& tables,
                             const DecodeQueries& queries, const DecodeOutputs& outputs,
                             const DeviceLaunch& launch) {
  absl::StatusOr<PagedLayer> kv = GetPagedLayer(cache, layer);
  if (!kv.ok()) return kv.status();
  if (cache.options().backend == BackendKind::kCpu) {
    return PagedDecodeAttention(*kv, tables, queries, outputs);
  }
#if KVTIER_WITH_CUDA
  return CudaDecodeAttention(*kv, tables, queries, outputs, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

struct PreparedDecode::Rep {
  const Cache* cache;  // the cache the step was prepared for
  TableExtent extent;
  PageTables tables;  // CPU backend: the step's tables
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
                                                      const DeviceLaunch& launch) {
  const Options& options = cache.options();
  auto rep = std::make_unique<Rep>();
  rep->cache = &cache;
  KVTIER_ASSIGN_OR_RETURN(rep->extent, CheckPageTables(tables, options.geometry.block_tokens,
                                                       options.palette.size()));
  if (options.backend == BackendKind::kCpu) {
    rep->tables = tables;
    return PreparedDecode(std::move(rep));
  }
#if KVTIER_WITH_CUDA
  KVTIER_ASSIGN_OR_RETURN(rep->device, CudaDecodeTables::Upload(tables, launch.stream,
                                                                    /*any_stream=*/true));
  return PreparedDecode(std::move(rep));
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
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
    return PagedDecodeAttention(kv, rep.tables, queries, outputs);
  }
#if KVTIER_WITH_CUDA
  return CudaDecodeAttention(kv, *rep.device, rep.extent, queries, outputs, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

}  // namespace kvtier
