#include "kvtier/cache.h"

#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "src/backend.h"
#include "src/cache_impl.h"
#if KVTIER_WITH_EVENTS
#include "src/events/vllm_hashing_sink.h"
#include "src/events/zmq_publisher.h"
#endif
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
  if (tokens.empty()) {
    return absl::InvalidArgumentError("AppendTokens: tokens is empty; pass at least one token id");
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  return AppendBatch(absl::MakeConstSpan(&seq, 1), absl::MakeConstSpan(&n, 1), tokens, slots);
}

absl::StatusOr<std::unique_ptr<Cache>> CreateCache(const Options& options,
                                                   std::unique_ptr<Backend> backend,
                                                   std::unique_ptr<BlockEventSink> events) {
  KVTIER_RETURN_IF_ERROR(ValidateOptions(options));
  if (backend == nullptr) return absl::InvalidArgumentError("CreateCache: backend is null");
  try {  // metadata is sized from the budget up front: the one allocation that may not fit
    KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<CacheImpl> cache,
                            CacheImpl::Create(options, std::move(backend), std::move(events)));
    return std::unique_ptr<Cache>(std::move(cache));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no host memory for the block metadata of a ", options.memory_budget_bytes,
        "-byte budget"));
  }
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
  std::unique_ptr<BlockEventSink> events;
  if (!options.kv_events_endpoint.empty()) {
#if KVTIER_WITH_EVENTS
    KVTIER_ASSIGN_OR_RETURN(events, MakeZmqEventPublisher(options));
    if (!options.kv_events_vllm_hash_seed.empty()) {
      events = std::make_unique<VllmHashingSink>(std::move(events),
                                                 options.kv_events_vllm_hash_seed);
    }
#else
    return absl::UnimplementedError(
        "Options.kv_events_endpoint: this build of kvtier has no KV events (KVTIER_WITH_EVENTS)");
#endif
  }
  return CreateCache(options, std::move(backend), std::move(events));
}

}  // namespace kvtier
