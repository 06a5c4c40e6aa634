// Page tables for one batch, built from one snapshot of block metadata at step time. Callers
// must not keep them across a step: migration moves blocks between pages.
#ifndef KVTIER_PAGE_TABLES_H_
#define KVTIER_PAGE_TABLES_H_

#include <cstdint>
#include <vector>

namespace kvtier {

// CSR page table of one format, the layout FlashInfer reads: sequence b owns pages
// indices[indptr[b] .. indptr[b+1]) in sequence order; its last page in this format holds
// last_page_len[b] tokens (block_tokens for a full page, 0 when b has no page in this format).
// Only the format holding a sequence's partial tail has last_page_len < block_tokens.
struct FormatPageTable {
  std::vector<int32_t> indptr;         // [batch + 1]
  std::vector<int32_t> indices;        // [nnz], page indices into this format's pools
  std::vector<int32_t> last_page_len;  // [batch]
};

// A packed entry names a page of any format: palette index in the top 3 bits, page below.
constexpr int kPackedFormatShift = 29;
constexpr uint32_t kPackedPageMask = (uint32_t{1} << kPackedFormatShift) - 1;
constexpr uint32_t PackPage(uint32_t format, uint32_t page) {
  return (format << kPackedFormatShift) | page;
}
constexpr uint32_t PackedFormat(uint32_t packed) { return packed >> kPackedFormatShift; }
constexpr uint32_t PackedPage(uint32_t packed) { return packed & kPackedPageMask; }

struct PageTables {
  std::vector<FormatPageTable> per_format;  // [palette size]
  // All of a sequence's blocks in order, for kvtier's fused kernel.
  std::vector<int32_t> packed_indptr;       // [batch + 1]
  std::vector<uint32_t> packed;             // [total blocks], PackPage(format, page)
  std::vector<int32_t> seq_lens;            // [batch], tokens
  // The cache's count of slab unmaps when BuildPageTables made the tables: while it is the
  // cache's count, every page they name lies in mapped memory (Cache::CheckTablesMapped).
  // Tables built by hand (0) pass until the cache's first unmap.
  uint64_t slab_unmaps = 0;
};

}  // namespace kvtier

#endif  // KVTIER_PAGE_TABLES_H_
