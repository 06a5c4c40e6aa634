// The attention contract, shared by every implementation (the CPU reference, the CUDA path and
// the Python module): a layer's pools as attention reads them, and the checks made before any
// read. The checks look at span sizes only, so the spans may describe device memory. The math
// lives in reference_attention.h (CPU) and kernels/decode_attention.cuh (CUDA).
//
// Thread-safety: the functions are thread-compatible (no shared state).
#ifndef KVTIER_SRC_ATTENTION_ATTENTION_CONTRACT_H_
#define KVTIER_SRC_ATTENTION_ATTENTION_CONTRACT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/page_layout.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// One layer of a cache's pools as attention reads them: for each palette format, the pool base,
// its page layout and its per-tensor scales.
struct PagedLayer {
  struct Format {
    const uint8_t* base = nullptr;
    int64_t capacity_pages = 0;
    PageLayout layout{};
    float k_tensor_scale = 1.f;
    float v_tensor_scale = 1.f;
  };
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 0;
  std::vector<Format> formats;  // [palette size]
  // Options::key_rotation: keys are stored as R_h k (kernels/codec/hadamard.h), so attention
  // rotates each query by R_h of its KV head first.
  bool rotate_keys = false;
  uint64_t key_rotation_seed = 0;
};

// The pools of `layer` of `cache` (Cache::GetPool for every palette format, layouts from
// MakePageLayout). Valid until the cache maps a different slab set, i.e. rebuild it after
// Append, Demote or EndStep. InvalidArgument for a bad layer. Exported (not installed) for the
// Python module, which links a shared libkvtier on the GPU machine.
KVTIER_EXPORT absl::StatusOr<PagedLayer> GetPagedLayer(const Cache& cache, int32_t layer);

// What a batch's checked page tables name: the highest page of each palette format (-1 for
// none), and the longest sequence in tokens and in pages.
struct TableExtent {
  std::vector<int64_t> max_page;  // [palette size]
  int64_t batch = 0;
  int64_t entries = 0;  // packed entries (pages) of the whole batch
  // [palette size]: the entries in each format, which choose how FP16 pages are read
  // (PagedDecodeParams::stage_fp16, and with it the split). A PreparedDecode keeps its first
  // tables' counts through Update, as it keeps max_pages, so that its launches, captured or
  // not, read alike and give the same bits.
  std::vector<int64_t> entries_of;
  int64_t max_length = 0;
  int32_t max_pages = 0;
};

// The checks that need no layer, for callers that check a step's tables once and attend every
// layer with them: packed_indptr against the batch, each sequence's page count against its
// length in `block_tokens`-token pages, every entry's format inside a palette of
// `palette_size`. InvalidArgument saying what is inconsistent.
absl::StatusOr<TableExtent> CheckPageTables(const PageTables& tables, int32_t block_tokens,
                                            size_t palette_size);

// The query and output spans shaped for `batch` sequences of at most `max_length` tokens over
// num_kv_heads x head_dim K/V, and the queries' head count and scale usable.
// InvalidArgument saying what is inconsistent.
absl::Status CheckDecodeSpans(int64_t batch, int32_t num_kv_heads, int32_t head_dim,
                              const DecodeQueries& queries, const DecodeOutputs& outputs,
                              int64_t max_length);

// The checks of one layer's call: every page `extent` names inside kv's (mapped) pools,
// CheckDecodeSpans for extent.batch sequences, and outputs.page_weight empty or of
// extent.entries floats. InvalidArgument saying what is inconsistent.
absl::Status CheckDecodeCall(const PagedLayer& kv, const TableExtent& extent,
                             const DecodeQueries& queries, const DecodeOutputs& outputs);

// CheckPageTables followed by CheckDecodeCall.
absl::Status ValidatePagedDecode(const PagedLayer& kv, const PageTables& tables,
                                 const DecodeQueries& queries, const DecodeOutputs& outputs);

// MergeStates' size checks (kvtier/merge_states.h) on the span sizes.
absl::Status ValidateMergeStates(size_t out_a, size_t lse_a, size_t out_b, size_t lse_b,
                                 int64_t rows, int32_t head_dim, size_t out, size_t lse);

}  // namespace kvtier

#endif  // KVTIER_SRC_ATTENTION_ATTENTION_CONTRACT_H_
