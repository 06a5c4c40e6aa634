#include "kvtier/cache.h"

#include "src/backend.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

namespace kvtier {

Cache::~Cache() = default;

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
