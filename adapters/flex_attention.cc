// PyTorch FlexAttention's PagedAttention: page_table / physical_to_logical (int64, -1 none) over
// a gathered copy of a part's pages, and the gather itself (a copy, CPU backend only).
#include "kvtier/adapters/flex_attention.h"

#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "adapters/adapter_internal.h"
#include "src/status_macros.h"

namespace kvtier {

absl::StatusOr<std::vector<FlexAttentionPart>> BuildFlexAttentionParts(const Options& options,
                                                                       const PageTables& tables) {
  return adapter_internal::BuildParts<FlexAttentionPart>(
      AdapterTarget::kFlexAttention, options, tables,
      [](const FormatPart& part, FlexAttentionPart* t) {
        // Physical pages of the copy: each distinct kvtier page once (forks share pages), in
        // order of first use.
        absl::flat_hash_map<int32_t, int64_t> physical;
        for (int32_t page : part.indices) {
          if (physical.try_emplace(page, static_cast<int64_t>(t->source_pages.size())).second) {
            t->source_pages.push_back(page);
          }
        }
        t->n_pages = static_cast<int64_t>(t->source_pages.size());
        // [rows, n_pages] twice: quadratic in the batch (PagedAttention's own shape).
        KVTIER_RETURN_IF_ERROR(adapter_internal::CheckDenseTable(
            part.rows(), t->n_pages, "FlexAttention's page_table"));
        const size_t cells = static_cast<size_t>(part.rows()) * t->n_pages;
        t->page_table.assign(cells, -1);
        t->physical_to_logical.assign(cells, -1);
        for (int64_t r = 0; r < part.rows(); ++r) {
          for (int32_t i = part.indptr[r]; i < part.indptr[r + 1]; ++i) {
            const int64_t logical = i - part.indptr[r];
            const int64_t p = physical.at(part.indices[i]);
            t->page_table[r * t->n_pages + logical] = p;
            t->physical_to_logical[r * t->n_pages + p] = logical;
          }
        }
        return absl::OkStatus();
      });
}

absl::Status GatherFlexKV(const Cache& cache, int32_t format, int32_t layer,
                          absl::Span<const int32_t> pages, absl::Span<uint8_t> k_out,
                          absl::Span<uint8_t> v_out) {
  if (cache.options().backend != BackendKind::kCpu) {
    return absl::FailedPreconditionError(
        "GatherFlexKV copies on the host and needs the CPU backend; on the GPU gather with "
        "torch.index_select over the block-table views");
  }
  KVTIER_ASSIGN_OR_RETURN(
      const adapter_internal::PoolAndFormat p,
      adapter_internal::GetPoolAndFormat(AdapterTarget::kFlexAttention, cache, format, layer));
  const int64_t h = p.geometry.num_kv_heads, s = p.geometry.block_tokens;
  const int64_t n = static_cast<int64_t>(pages.size());
  const size_t run = static_cast<size_t>(s * p.pool.row_bytes);  // one (page, head): S rows
  const size_t want = static_cast<size_t>(h * n) * run;
  if (k_out.size() != want || v_out.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GatherFlexKV: outputs of ", k_out.size(), " and ", v_out.size(), " bytes; (1, ", h, ", ",
        n * s, ", ", p.geometry.head_dim, ") needs ", want));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (pages[i] < 0 || pages[i] >= p.pool.capacity_pages) {
      return absl::InvalidArgumentError(absl::StrCat("page ", pages[i], " is outside the pool (",
                                                     p.pool.capacity_pages, " pages)"));
    }
  }
  // A page that holds no block now (source_pages of tables from before a release and an
  // EndStep) may lie in a slab returned to the budget: refused, not read.
  PageTables named;
  for (int32_t page : pages) named.packed.push_back(PackPage(static_cast<uint32_t>(format), page));
  KVTIER_RETURN_IF_ERROR(cache.CheckTablesHeld(named));
  const uint8_t* base = static_cast<const uint8_t*>(p.pool.base);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* page = base + pages[i] * p.pool.page_bytes;
    for (int64_t head = 0; head < h; ++head) {
      const size_t dst = static_cast<size_t>(head * n + i) * run;  // [0, head, i * S, 0]
      std::memcpy(k_out.data() + dst, page + p.pool.k_offset + head * run, run);
      std::memcpy(v_out.data() + dst, page + p.pool.v_offset + head * run, run);
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier
