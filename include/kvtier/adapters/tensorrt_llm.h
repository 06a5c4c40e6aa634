// TensorRT-LLM: kv_cache_block_offsets for each part and the pool pointer and scales of each
// (format, layer) pool.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_TENSORRT_LLM_H_
#define KVTIER_ADAPTERS_TENSORRT_LLM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// kv_cache_block_offsets for one pool: offsets count blocks of bytes_per_block = H x S x
// row_bytes from the pool pointer (the (format, layer) pool's base, layer index 0 in the pool
// mapping); K of page p is block p x page_bytes / bytes_per_block, V the next one. Contract only:
// not yet run against TensorRT-LLM.

struct TensorRtLlmPart {
  int32_t format = 0;
  std::vector<int32_t> batch_index;    // [rows]
  int32_t max_blocks = 0;
  std::vector<int32_t> block_offsets;  // [rows, 2, max_blocks]: K row then V row; pad 0
  std::vector<int32_t> seq_lens;       // [rows]
  int64_t bytes_per_block = 0;

  int64_t rows() const { return static_cast<int64_t>(batch_index.size()); }
};
// InvalidArgument additionally when page_bytes is not a multiple of bytes_per_block.
KVTIER_EXPORT absl::StatusOr<std::vector<TensorRtLlmPart>> BuildTensorRtLlmParts(
    const Options& options, const PageTables& tables);

struct TensorRtLlmLayer {
  void* pool_pointer = nullptr;
  int64_t bytes_per_block = 0;
  // One scale for K and V (TensorRT-LLM's kv_scale_quant_orig = s, kv_scale_orig_quant = 1/s);
  // 1 for FP16/BF16. FailedPrecondition when the layer's K and V tensor scales differ.
  float kv_scale_quant_orig = 1.f;
  float kv_scale_orig_quant = 1.f;
};
KVTIER_EXPORT absl::StatusOr<TensorRtLlmLayer> GetTensorRtLlmLayer(const Cache& cache,
                                                                   int32_t format, int32_t layer);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_TENSORRT_LLM_H_
