// FlashAttention 2/3 and vLLM: dense block tables for each part, the pools as [num_blocks, S,
// H, D] K and V views, FA3's descales and vLLM's slot_mapping.
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_BLOCK_TABLES_H_
#define KVTIER_ADAPTERS_BLOCK_TABLES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/adapters/target.h"
#include "kvtier/adapters/tensor_view.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"

namespace kvtier {

struct BlockTableOptions {
  // Columns of block_table. 0: the most pages any row of the part has. REQUIRES: 0 or at least
  // that, and rows x max_blocks at most 2^28 (a 1 GiB table). Default: 0.
  int32_t max_blocks = 0;
  // Entries past a row's pages. The kernels never read them (they stop at the row's length);
  // 0 keeps any address computed from one at the pool's first page. Default: 0.
  int32_t pad_value = 0;
};

struct BlockTablePart {
  int32_t format = 0;
  std::vector<int32_t> batch_index;  // [rows]
  int32_t max_blocks = 0;
  std::vector<int32_t> block_table;  // [rows, max_blocks] row-major, padded with pad_value
  std::vector<int32_t> seq_lens;     // [rows]: FlashAttention's cache_seqlens, vLLM's seq_lens

  int64_t rows() const { return static_cast<int64_t>(batch_index.size()); }
};

// `target` is kFlashAttention2, kFlashAttention3 or kVllm (InvalidArgument otherwise).
KVTIER_EXPORT absl::StatusOr<std::vector<BlockTablePart>> BuildBlockTableParts(
    AdapterTarget target, const Options& options, const PageTables& tables,
    const BlockTableOptions& block_options = {});

// K and V of one (format, layer) pool as [num_blocks, S, H, D] each (FlashAttention's and
// vLLM's NHD shape), expressed by strides over kvtier's HND pages: strides
// [page_bytes / e, D, S x D, 1]. Token and head strides are swapped relative to a contiguous
// NHD tensor; the last dimension is contiguous. `target` is kFlashAttention2, kFlashAttention3
// or kVllm (InvalidArgument otherwise), and reads `format` (CheckReadable).
struct BlockTableLayer {
  TensorView k;
  TensorView v;
  // vLLM's k_scale / v_scale (float32 [1]) and the FA3 descale value; 1 for FP16/BF16.
  float k_scale = 1.f;
  float v_scale = 1.f;
};
KVTIER_EXPORT absl::StatusOr<BlockTableLayer> GetBlockTableLayer(AdapterTarget target,
                                                                 const Cache& cache,
                                                                 int32_t format, int32_t layer);

// FA3's k_descale / v_descale, float32 [rows, num_kv_heads]: only per-tensor FP8 maps (every
// entry is the layer's tensor scale). InvalidArgument for other formats, or rows outside
// 0..2^24.
struct Fa3Descales {
  std::vector<float> k_descale;
  std::vector<float> v_descale;
};
KVTIER_EXPORT absl::StatusOr<Fa3Descales> GetFa3Descales(const Cache& cache, int32_t format,
                                                         int32_t layer, int64_t rows);

// vLLM's slot_mapping (int64, block x S + offset, -1 skips) for new tokens: `slots` as returned
// by Cache::Append (already in this form, in the hot format's pools), padded with -1 to
// `padded_size` (0: no padding). InvalidArgument when the hot format is not readable by vLLM, a
// slot is outside the hot pools, or padded_size is below slots.size() or over 2^24.
KVTIER_EXPORT absl::StatusOr<std::vector<int64_t>> VllmSlotMapping(const Cache& cache,
                                                                   absl::Span<const int64_t> slots,
                                                                   int64_t padded_size = 0);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_BLOCK_TABLES_H_
