#include "src/attention/attention_contract.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "src/size_check.h"

namespace kvtier {

absl::StatusOr<PagedLayer> GetPagedLayer(const Cache& cache, int32_t layer) {
  const Options& options = cache.options();
  const Geometry& g = options.geometry;
  PagedLayer kv;
  kv.num_kv_heads = g.num_kv_heads;
  kv.head_dim = g.head_dim;
  kv.block_tokens = g.block_tokens;
  kv.rotate_keys = options.key_rotation == KeyRotation::kHadamard;
  kv.key_rotation_seed = options.key_rotation_seed;
  for (size_t f = 0; f < options.palette.size(); ++f) {
    absl::StatusOr<PoolInfo> pool = cache.GetPool(static_cast<int32_t>(f), layer);
    if (!pool.ok()) return pool.status();
    PagedLayer::Format format;
    format.base = static_cast<const uint8_t*>(pool->base);
    format.capacity_pages = pool->capacity_pages;
    format.layout = MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, options.palette[f]);
    format.k_tensor_scale = pool->k_tensor_scale;
    format.v_tensor_scale = pool->v_tensor_scale;
    if (format.layout.page_bytes != pool->page_bytes) {
      return absl::InternalError(absl::StrCat("format ", f, ": pool pages of ", pool->page_bytes,
                                              " bytes, layout of ", format.layout.page_bytes));
    }
    kv.formats.push_back(format);
  }
  return kv;
}

absl::StatusOr<TableExtent> CheckPageTables(const PageTables& tables, int32_t block_tokens,
                                            size_t palette_size) {
  const int64_t batch = static_cast<int64_t>(tables.seq_lens.size());
  if (tables.packed_indptr.size() != static_cast<size_t>(batch) + 1 ||
      tables.packed_indptr[0] != 0 ||
      static_cast<size_t>(tables.packed_indptr.back()) != tables.packed.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed_indptr has ", tables.packed_indptr.size(), " entries for ", batch,
        " sequences and ", tables.packed.size(), " packed pages"));
  }
  if (block_tokens < 1 || palette_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an empty palette or block_tokens ", block_tokens, " < 1"));
  }
  // Non-decreasing offsets from 0 to packed.size(): every sequence's entries lie in `packed`.
  for (int64_t b = 0; b < batch; ++b) {
    if (tables.packed_indptr[b + 1] < tables.packed_indptr[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "packed_indptr decreases at sequence ", b, ": ", tables.packed_indptr[b], " then ",
          tables.packed_indptr[b + 1]));
    }
  }
  TableExtent extent;
  extent.batch = batch;
  extent.entries = static_cast<int64_t>(tables.packed.size());
  extent.max_page.assign(palette_size, -1);
  extent.entries_of.assign(palette_size, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = tables.packed_indptr[b + 1] - tables.packed_indptr[b];
    const int64_t len = tables.seq_lens[b];
    if (pages < 0 || len < 0 || (len + block_tokens - 1) / block_tokens != pages) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has ", len, " tokens in ",
                                                     pages, " pages of ", block_tokens));
    }
    for (int32_t i = tables.packed_indptr[b]; i < tables.packed_indptr[b + 1]; ++i) {
      const uint32_t f = PackedFormat(tables.packed[i]);
      if (f >= palette_size) {
        return absl::InvalidArgumentError(absl::StrCat("packed entry ", i, " names format ", f,
                                                       ", outside the palette of ", palette_size));
      }
      extent.max_page[f] = std::max<int64_t>(extent.max_page[f], PackedPage(tables.packed[i]));
      extent.entries_of[f] += 1;
    }
    extent.max_length = std::max(extent.max_length, len);
    extent.max_pages = std::max(extent.max_pages, static_cast<int32_t>(pages));
  }
  return extent;
}

absl::Status CheckDecodeCall(const PagedLayer& kv, const TableExtent& extent,
                             const DecodeQueries& queries, const DecodeOutputs& outputs) {
  if (extent.max_page.size() != kv.formats.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tables were checked for a palette of ", extent.max_page.size(),
                     " formats, the layer has ", kv.formats.size()));
  }
  for (size_t f = 0; f < kv.formats.size(); ++f) {
    if (extent.max_page[f] < 0) continue;
    if (kv.formats[f].base == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tables name pages of format ", f, ", whose pool is not mapped"));
    }
    if (extent.max_page[f] >= kv.formats[f].capacity_pages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tables name page ", extent.max_page[f], " of format ", f, ", outside its pool of ",
          kv.formats[f].capacity_pages, " pages"));
    }
  }
  if (!outputs.page_weight.empty() &&
      outputs.page_weight.size() != static_cast<size_t>(extent.entries)) {
    return absl::InvalidArgumentError(absl::StrCat("page_weight holds ", outputs.page_weight.size(),
                                                   " floats; the tables have ", extent.entries,
                                                   " pages"));
  }
  return CheckDecodeSpans(extent.batch, kv.num_kv_heads, kv.head_dim, queries, outputs,
                          extent.max_length);
}

absl::Status ValidatePagedDecode(const PagedLayer& kv, const PageTables& tables,
                                 const DecodeQueries& queries, const DecodeOutputs& outputs) {
  absl::StatusOr<TableExtent> extent = CheckPageTables(tables, kv.block_tokens, kv.formats.size());
  if (!extent.ok()) return extent.status();
  return CheckDecodeCall(kv, *extent, queries, outputs);
}

absl::Status CheckDecodeSpans(int64_t batch, int32_t num_kv_heads, int32_t head_dim,
                              const DecodeQueries& q, const DecodeOutputs& o, int64_t max_length) {
  if (num_kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads ", num_kv_heads, " and head_dim ", head_dim, " must be >= 1"));
  }
  if (q.num_q_heads < 1 || q.num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads ", q.num_q_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   num_kv_heads));
  }
  if (!std::isfinite(q.softmax_scale)) {
    return absl::InvalidArgumentError("softmax_scale is not finite");
  }
  const size_t rows = static_cast<size_t>(batch) * q.num_q_heads;
  const size_t want = rows * head_dim;
  if (q.q.size() != want || o.out.size() != want || o.lse.size() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q holds ", q.q.size(), ", out ", o.out.size(), " and lse ", o.lse.size(),
        " floats; batch ", batch, " x ", q.num_q_heads, " heads x head_dim ", head_dim, " needs ",
        want, ", ", want, " and ", rows));
  }
  if (!o.logits.empty()) {
    if (o.logits_stride < max_length ||
        !HoldsExactly(o.logits.size(), rows, static_cast<uint64_t>(o.logits_stride))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logits hold ", o.logits.size(), " floats with stride ", o.logits_stride,
          "; need batch x heads x stride with stride >= the longest sequence (", max_length,
          ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMergeStates(size_t out_a, size_t lse_a, size_t out_b, size_t lse_b,
                                 int64_t rows, int32_t head_dim, size_t out, size_t lse) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(rows, 0));
  const size_t nd = n * static_cast<size_t>(std::max(head_dim, 0));
  if (rows < 0 || head_dim < 1 || out_a != nd || out_b != nd || out != nd || lse_a != n ||
      lse_b != n || lse != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MergeStates: ", rows, " rows x head_dim ", head_dim, " need outputs of ", nd,
        " floats and LSEs of ", n, "; got ", out_a, "/", out_b, "/", out, " and ", lse_a, "/",
        lse_b, "/", lse));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
