// Adapters: kvtier's page tables and pools as external attention kernels expect them
// (design/ADAPTERS.md, docs/adapters.md).
//
// Everything here is built on the host from one PageTables snapshot (Cache::BuildPageTables)
// and the pools' PoolInfo (Cache::GetPool). Page tables must not outlive the step they were
// built for; tensor views stay valid as long as the cache does, but only pages inside mapped
// slabs may be touched.
//
// External kernels read one format per call. Every table builder therefore returns one *part*
// per palette format present in the batch: the sequences (rows) that own at least one page in
// that format, each with its pages of that format in sequence order. A row's part length is
// block_tokens x (pages - 1) + last_page_len, with 1 <= last_page_len <= block_tokens; only the
// part holding the sequence's partial tail has a short last page. Sequences with no page in a
// format are *left out* of that format's part (`batch_index` maps part rows back to batch
// positions), so no kernel ever sees an empty sequence (FlashInfer, FlashAttention and
// FlexAttention disagree about what an empty sequence returns). Attend each part, then merge the
// partial (output, LSE) states with MergePartialStates; a sequence in one part only needs no
// merge.
//
// Each target states the palette formats it reads (CheckReadable) and every builder refuses the
// rest with InvalidArgument naming the format and the target.
//
// Thread-safety: all functions are thread-compatible (no shared state).
#ifndef KVTIER_ADAPTERS_PAGE_TABLE_ADAPTERS_H_
#define KVTIER_ADAPTERS_PAGE_TABLE_ADAPTERS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvtier/cache.h"
#include "kvtier/export.h"
#include "kvtier/options.h"
#include "kvtier/page_tables.h"

namespace kvtier {

// ---- Targets and what they read ----

enum class AdapterTarget : uint8_t {
  // FlashInfer BatchDecode/BatchPrefillWithPagedKVCacheWrapper, kv_layout "HND".
  // Reads: fp16, bf16, fp8_e4m3/tensor, fp8_e5m2/tensor, nvfp4/tensor (K and V alike).
  kFlashInfer,
  // Upstream flash-attention 2 flash_attn_with_kvcache. Reads: fp16, bf16; block_tokens % 256.
  kFlashAttention2,
  // flash-attention 3 (hopper/). Reads: fp16, bf16, fp8_e4m3/tensor (descales [B, Hk]).
  kFlashAttention3,
  // vLLM's attention backends and reshape_and_cache (slot_mapping). Reads: fp16, bf16,
  // fp8_e4m3/tensor, fp8_e5m2/tensor (k_scale/v_scale [1]); block_tokens % 16.
  kVllm,
  // PyTorch FlexAttention's PagedAttention. Reads: fp16, bf16.
  kFlexAttention,
  // TensorRT-LLM kv_cache_block_offsets. Reads: fp16, bf16, fp8_e4m3/tensor; block_tokens a
  // power of two.
  kTensorRtLlm,
};

KVTIER_EXPORT const char* AdapterTargetName(AdapterTarget target);
// "flashinfer", "flash_attention2", "flash_attention3", "vllm", "flex_attention", "tensorrt_llm".
KVTIER_EXPORT absl::StatusOr<AdapterTarget> ParseAdapterTarget(absl::string_view name);

// OK when `target` can read palette format `format` with this geometry; otherwise
// InvalidArgument naming the format, the target, the reason and what the target reads.
KVTIER_EXPORT absl::Status CheckReadable(AdapterTarget target, const FormatSpec& format,
                                         const Geometry& geometry);
// CheckReadable for every palette format: for an engine that will send every block to `target`.
KVTIER_EXPORT absl::Status CheckPaletteReadable(AdapterTarget target, const Options& options);

// ---- Tensor views ----

// What the elements of a view mean. FP8 and FP4 have no code in older DLPack versions: the
// Python binding exports them as uint8 plus this tag.
enum class ViewDType : uint8_t {
  kFloat16,
  kBFloat16,
  kFloat8E4M3,   // OCP E4M3FN, one byte
  kFloat8E5M2,   // one byte
  kFloat4E2M1x2, // two E2M1 values per byte, element 2i in the low nibble
  kFloat32,
};
KVTIER_EXPORT const char* ViewDTypeName(ViewDType dtype);  // "float16", ..., "float4_e2m1x2"
KVTIER_EXPORT int ViewDTypeBytes(ViewDType dtype);         // storage bytes per element

// A strided tensor over a pool, as DLPack and torch describe it. No ownership.
struct TensorView {
  void* data = nullptr;  // element [0, 0, ...]
  ViewDType dtype = ViewDType::kFloat16;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, like torch and DLPack
  BackendKind device = BackendKind::kCpu;
  // The CUDA device is the one current when the cache was created; kvtier does not record it,
  // so this is 0 unless the caller sets it.
  int32_t device_id = 0;

  // Byte offset from `data` of the element at `index` (index.size() == shape.size()).
  KVTIER_EXPORT int64_t ByteOffset(absl::Span<const int64_t> index) const;
};

// ---- Partition by format (the path of ADAPTERS.md for mixed-format sequences) ----

// One format's share of a batch, in FlashInfer's CSR form.
struct FormatPart {
  int32_t format = 0;                  // palette index
  std::vector<int32_t> batch_index;    // [rows]: batch position of each row
  std::vector<int32_t> indptr;         // [rows + 1]
  std::vector<int32_t> indices;        // [nnz]: pages of this format's pools, sequence order
  std::vector<int32_t> last_page_len;  // [rows]: 1 to block_tokens
  std::vector<int32_t> lengths;        // [rows]: tokens of the row in this part

  int64_t rows() const { return static_cast<int64_t>(batch_index.size()); }
};

// Splits `tables` (built for a cache with `options`) into one part per palette format present,
// in palette order. InvalidArgument when the tables do not match the palette or a last page
// length is outside 1..block_tokens.
KVTIER_EXPORT absl::StatusOr<std::vector<FormatPart>> PartitionByFormat(const Options& options,
                                                                        const PageTables& tables);

// A part as a packed PageTables that src/attention's PagedDecodeAttention (the CPU reference)
// attends: the reference acting as "one kernel call for one format".
KVTIER_EXPORT PageTables PartAsPageTables(const FormatPart& part);

// Rows `batch_index` of a row-major [batch, row_elems] array: the queries of one part.
KVTIER_EXPORT std::vector<float> GatherRows(absl::Span<const float> x, int64_t row_elems,
                                            absl::Span<const int32_t> batch_index);

// ---- LSE ----

enum class LseBase : uint8_t { kNatural, kBase2 };  // FlashInfer returns base 2
KVTIER_EXPORT void NaturalToBase2Lse(absl::Span<float> lse);  // x log2(e); -inf stays -inf
KVTIER_EXPORT void Base2ToNaturalLse(absl::Span<float> lse);  // x ln(2)

// One part's attention result.
struct PartialState {
  absl::Span<const int32_t> batch_index;  // [rows]
  absl::Span<const float> out;            // [rows, num_q_heads, head_dim]
  absl::Span<const float> lse;            // [rows, num_q_heads]; -inf marks an empty row
  LseBase base = LseBase::kNatural;
};

// Merges the parts of a batch exactly (src/attention's MergeStates, row by row) into `out`
// [batch, num_q_heads, head_dim] and `lse` [batch, num_q_heads] (natural log). A batch row in no
// part gets a zero output and LSE -inf. InvalidArgument for wrong sizes or a batch index out of
// range or repeated within a part.
KVTIER_EXPORT absl::Status MergePartialStates(absl::Span<const PartialState> parts, int64_t batch,
                                              int32_t num_q_heads, int32_t head_dim,
                                              absl::Span<float> out, absl::Span<float> lse);

// ---- FlashInfer ----

// The parts of `tables` for FlashInfer (PartitionByFormat after CheckReadable on each format
// present). indptr/indices/last_page_len are what plan() takes (int32).
KVTIER_EXPORT absl::StatusOr<std::vector<FormatPart>> BuildFlashInferParts(
    const Options& options, const PageTables& tables);

// One (format, layer) pool as FlashInfer's paged_kv_cache, HND.
struct FlashInferLayer {
  // [P, 2, H, S, D] of FP16/BF16/FP8, or [P, 2, H, S, D/2] of packed FP4 (uint8) for NVFP4.
  // K at [:, 0] and V at [:, 1] have identical strides; P is the pool's page capacity.
  TensorView kv;
  // NVFP4 only: the E4M3 micro-scales as FlashInfer's kv_cache_sf, [P, 2, H, S, D/16].
  std::optional<TensorView> kv_cache_sf;
  // FlashInfer's k_scale / v_scale (scale_conventions.h, kFlashInferKVScale); 1 for FP16/BF16.
  float k_scale = 1.f;
  float v_scale = 1.f;
};
KVTIER_EXPORT absl::StatusOr<FlashInferLayer> GetFlashInferLayer(const Cache& cache,
                                                                 int32_t format, int32_t layer);

// ---- FlashAttention 2/3 and vLLM: dense block tables ----

struct BlockTableOptions {
  // Columns of block_table. 0: the most pages any row of the part has. REQUIRES: 0 or at least
  // that. Default: 0.
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
// NHD tensor; the last dimension is contiguous.
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
// entry is the layer's tensor scale). InvalidArgument for other formats.
struct Fa3Descales {
  std::vector<float> k_descale;
  std::vector<float> v_descale;
};
KVTIER_EXPORT absl::StatusOr<Fa3Descales> GetFa3Descales(const Cache& cache, int32_t format,
                                                         int32_t layer, int64_t rows);

// vLLM's slot_mapping (int64, block x S + offset, -1 skips) for new tokens: `slots` as returned
// by Cache::Append (already in this form, in the hot format's pools), padded with -1 to
// `padded_size` (0: no padding). InvalidArgument when the hot format is not readable by vLLM, a
// slot is outside the hot pools, or padded_size is below slots.size().
KVTIER_EXPORT absl::StatusOr<std::vector<int64_t>> VllmSlotMapping(const Cache& cache,
                                                                   absl::Span<const int64_t> slots,
                                                                   int64_t padded_size = 0);

// ---- PyTorch FlexAttention ----
//
// PagedAttention reads K and V as (1, H, n_pages x S, D) tensors: token s of physical page p of
// head h at [0, h, p x S + s, :]. kvtier's pages are HND with K then V (and padding), so the
// token stride within a page (D) and the page stride (page_bytes) do not form one token axis:
// no strided view exists. GatherFlexKV copies the part's pages into such tensors; page_table
// then indexes the copy.

struct FlexAttentionPart {
  int32_t format = 0;
  std::vector<int32_t> batch_index;          // [rows]
  int64_t n_pages = 0;                       // physical pages of the gathered copy
  std::vector<int32_t> source_pages;         // [n_pages]: kvtier page copied to each
  std::vector<int64_t> page_table;           // [rows, n_pages]: logical -> physical, -1 none
  std::vector<int64_t> physical_to_logical;  // [rows, n_pages]: -1 none
  std::vector<int64_t> seq_lens;             // [rows]

  int64_t rows() const { return static_cast<int64_t>(batch_index.size()); }
};
KVTIER_EXPORT absl::StatusOr<std::vector<FlexAttentionPart>> BuildFlexAttentionParts(
    const Options& options, const PageTables& tables);

// A COPY: pages `pages` of (format, layer) into k_out and v_out, each (1, H, pages.size() x S,
// D) of the format's element type (raw bytes, FP16 or BF16). CPU backend only
// (FailedPrecondition on the CUDA backend). InvalidArgument for a bad format, layer, page or
// output size.
KVTIER_EXPORT absl::Status GatherFlexKV(const Cache& cache, int32_t format, int32_t layer,
                                        absl::Span<const int32_t> pages, absl::Span<uint8_t> k_out,
                                        absl::Span<uint8_t> v_out);

// ---- TensorRT-LLM ----
//
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

#endif  // KVTIER_ADAPTERS_PAGE_TABLE_ADAPTERS_H_
