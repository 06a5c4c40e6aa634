// CPU reference decode attention: the oracle that kvtier's GPU kernels and every adapter are
// checked against. Three pieces:
//   - PagedDecodeAttention reads each sequence's pages through the packed (format, page) table
//     of a PageTables and decodes every row with the page codec (kernels/page_codec.h), so it
//     sees exactly what the cache stores, in any mix of palette formats;
//   - DenseDecodeAttention runs the same math over plain float K/V arrays (the storage-error-free
//     reference when given unquantised data);
//   - MergeStates combines partial attention states exactly by their log-sum-exp
//     (design/ADAPTERS.md: s = log(e^sa + e^sb), v = (va e^sa + vb e^sb) / (e^sa + e^sb)).
//
// Math: logits l_i = softmax_scale * (q . k_i), each dot product accumulated in double from
// fp32 operands; LSE = log(sum_i exp(l_i)) in natural log; output = sum_i exp(l_i - LSE) v_i,
// accumulated in double. Both attentions share one implementation of this math, so on the same
// K/V values they return bit-identical logits, outputs and LSE.
//
// GQA: query head h reads KV head h / (num_q_heads / num_kv_heads).
// An empty sequence (length 0) returns a zero output and LSE = -inf.
//
// Thread-safety: the functions are thread-compatible; they read the pools without locking, so
// the caller must not write or demote the sequences being attended concurrently.
#ifndef KVTIER_SRC_ATTENTION_REFERENCE_ATTENTION_H_
#define KVTIER_SRC_ATTENTION_REFERENCE_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/page_layout.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// The queries of one decode step.
struct DecodeQueries {
  absl::Span<const float> q;     // [batch, num_q_heads, head_dim]
  int32_t num_q_heads = 0;       // REQUIRES: a positive multiple of num_kv_heads
  float softmax_scale = 0.f;     // usually 1 / sqrt(head_dim)
};

// Where results go. The caller owns the memory.
struct DecodeOutputs {
  absl::Span<float> out;  // [batch, num_q_heads, head_dim]
  absl::Span<float> lse;  // [batch, num_q_heads], natural log
  // Optional (empty to skip): the scaled logits l_i, [batch, num_q_heads, logits_stride]; key i
  // of sequence b at [b][h][i]; entries at or beyond the sequence's length are set to -inf.
  // REQUIRES when given: logits_stride >= every sequence's length.
  absl::Span<float> logits;
  int64_t logits_stride = 0;
};

// One layer of a cache's pools as the reference attention reads them: for each palette
// format, the pool base, its page layout and its per-tensor scales.
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
};

// The pools of `layer` of `cache` (Cache::GetPool for every palette format, layouts from
// MakePageLayout). Valid until the cache maps a different slab set, i.e. rebuild it after
// Append, Demote or EndStep. InvalidArgument for a bad layer.
KVTIER_EXPORT absl::StatusOr<PagedLayer> GetPagedLayer(const Cache& cache, int32_t layer);

// The checks PagedDecodeAttention makes before reading anything (span sizes only, so the
// spans may describe device memory): OK, or InvalidArgument saying what is inconsistent.
// CheckPageTables followed by CheckDecodeCall.
KVTIER_EXPORT absl::Status ValidatePagedDecode(const PagedLayer& kv, const PageTables& tables,
                                               const DecodeQueries& queries,
                                               const DecodeOutputs& outputs);

// What a batch's checked page tables name: the highest page of each palette format (-1 for
// none), and the longest sequence in tokens and in pages.
struct TableExtent {
  std::vector<int64_t> max_page;  // [palette size]
  int64_t batch = 0;
  int64_t max_length = 0;
  int32_t max_pages = 0;
};

// The half of ValidatePagedDecode that needs no layer, for callers that check a step's tables
// once and attend every layer with them: packed_indptr against the batch, each sequence's page
// count against its length in `block_tokens`-token pages, every entry's format inside a palette
// of `palette_size`. InvalidArgument saying what is inconsistent.
KVTIER_EXPORT absl::StatusOr<TableExtent> CheckPageTables(const PageTables& tables,
                                                          int32_t block_tokens,
                                                          size_t palette_size);

// The other half: every page `extent` names inside kv's pools, and the query and output spans
// shaped for extent.batch sequences. InvalidArgument saying what is inconsistent.
KVTIER_EXPORT absl::Status CheckDecodeCall(const PagedLayer& kv, const TableExtent& extent,
                                           const DecodeQueries& queries,
                                           const DecodeOutputs& outputs);

// Decode attention for `tables.seq_lens.size()` sequences over the pages of `kv`, using
// tables.packed_indptr / packed / seq_lens (per_format is not read). InvalidArgument for
// inconsistent shapes: spans of the wrong size, num_q_heads not a multiple of num_kv_heads, a
// sequence whose page count does not match its length, a packed entry naming a format outside
// the palette or a page outside its pool.
KVTIER_EXPORT absl::Status PagedDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                                const DecodeQueries& queries,
                                                const DecodeOutputs& outputs);

// One sequence's K and V as float arrays [length, num_kv_heads, head_dim] (Cache::ReadKV's
// layout).
struct DenseSequence {
  absl::Span<const float> k;
  absl::Span<const float> v;
  int64_t length = 0;
};

// The same attention over plain float K/V, batch = seqs.size(). InvalidArgument for spans of
// the wrong size or bad head counts.
KVTIER_EXPORT absl::Status DenseDecodeAttention(absl::Span<const DenseSequence> seqs,
                                                int32_t num_kv_heads, int32_t head_dim,
                                                const DecodeQueries& queries,
                                                const DecodeOutputs& outputs);

// MergeStates' size checks, on the span sizes (so the spans may describe device memory).
KVTIER_EXPORT absl::Status ValidateMergeStates(size_t out_a, size_t lse_a, size_t out_b,
                                               size_t lse_b, int64_t rows, int32_t head_dim,
                                               size_t out, size_t lse);

// Merges two partial states of `rows` rows (e.g. batch x heads) into one, exactly:
// out/lse may alias a or b. A part with lse = -inf is empty and contributes nothing; when both
// are empty the result is a zero output with lse = -inf. InvalidArgument for wrong sizes.
KVTIER_EXPORT absl::Status MergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                                       absl::Span<const float> out_b, absl::Span<const float> lse_b,
                                       int64_t rows, int32_t head_dim, absl::Span<float> out,
                                       absl::Span<float> lse);

}  // namespace kvtier

#endif  // KVTIER_SRC_ATTENTION_REFERENCE_ATTENTION_H_
