// A batch's pages split by palette format, as a launch of one decode grid per format reads them
// (gpu::FormatGrid, kernels/decode_attention.cuh): for each format, each sequence's pages of
// that format in sequence order and the tokens they hold. Attention does not depend on the order
// of a sequence's pages, and only a sequence's last page may be partial, so a format's share of
// a sequence is a sequence of its own: full pages, then the partial one if it is that format's.
#ifndef KVTIER_SRC_ATTENTION_PAGES_BY_FORMAT_H_
#define KVTIER_SRC_ATTENTION_PAGES_BY_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvtier/page_tables.h"

namespace kvtier {

struct FormatPages {
  std::vector<int32_t> indptr{0};  // [batch + 1]
  std::vector<uint32_t> pages;     // PackPage(0, page), sequence b's at indptr[b] ...
  std::vector<int32_t> seq_lens;   // [batch]: tokens in sequence b's pages of the format
};

// One FormatPages per format in [0, formats), from `tables`' packed table.
// REQUIRES: tables checked by CheckPageTables for `block_tokens` and a palette of `formats`.
std::vector<FormatPages> SplitPagesByFormat(const PageTables& tables, size_t formats,
                                            int32_t block_tokens);

}  // namespace kvtier

#endif  // KVTIER_SRC_ATTENTION_PAGES_BY_FORMAT_H_
