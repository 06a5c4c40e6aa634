#include "kvtier/cache.h"

#include "src/backend.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

namespace kvtier {

Cache::~Cache() = default;

absl::StatusOr<SequenceId> Cache::AddSequence() {
  absl::StatusOr<AddResult> added = AddSequence(SequenceOptions{});
  if (!added.ok()) return added.status();
  return added->id;
}

absl::Status Cache::Append(SequenceId seq, int64_t num_tokens, std::vector<int64_t>* slots) {
  return AppendBatch(absl::MakeConstSpan(&seq, 1), absl::MakeConstSpan(&num_tokens, 1), {}, slots);
}

absl::Status Cache::AppendTokens(SequenceId seq, absl::Span<const int32_t> tokens,
                                 std::vector<int64_t>* slots) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  return AppendBatch(absl::MakeConstSpan(&seq, 1), absl::MakeConstSpan(&n, 1), tokens, slots);
}

absl::StatusOr<std::unique_ptr<Cache>> Cache::Create(const Options& options) {
  KVTIER_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<Backend> backend;
  switch (options.backend) {
    case BackendKind::kCpu:
      backend = MakeCpuBackend();
      break;
    case BackendKind::kCuda: {
#if KVTIER_WITH_CUDA
      KVTIER_ASSIGN_OR_RETURN(backend, MakeCudaBackend());
      break;
#else
      return absl::UnimplementedError("this build of kvtier has no CUDA backend");
#endif
    }
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<CacheImpl> cache,
                          CacheImpl::Create(options, std::move(backend)));
  return std::unique_ptr<Cache>(std::move(cache));
}

}  // namespace kvtier
