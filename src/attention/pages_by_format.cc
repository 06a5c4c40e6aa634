#include "src/attention/pages_by_format.h"

namespace kvtier {

std::vector<FormatPages> SplitPagesByFormat(const PageTables& tables, size_t formats,
                                            int32_t block_tokens) {
  std::vector<FormatPages> split(formats);
  for (size_t b = 0; b < tables.seq_lens.size(); ++b) {
    const int32_t begin = tables.packed_indptr[b], end = tables.packed_indptr[b + 1];
    for (int32_t i = begin; i < end; ++i) {
      const uint32_t entry = tables.packed[i];
      split[PackedFormat(entry)].pages.push_back(PackPage(0, PackedPage(entry)));
    }
    // The tokens the last page lacks (0 to block_tokens - 1), and whose page it is.
    const int64_t lacking = int64_t{block_tokens} * (end - begin) - tables.seq_lens[b];
    const uint32_t last = end > begin ? PackedFormat(tables.packed[end - 1]) : 0;
    for (size_t f = 0; f < formats; ++f) {
      FormatPages& t = split[f];
      const int64_t pages = static_cast<int64_t>(t.pages.size()) - t.indptr.back();
      t.seq_lens.push_back(
          static_cast<int32_t>(int64_t{block_tokens} * pages - (f == last ? lacking : 0)));
      t.indptr.push_back(static_cast<int32_t>(t.pages.size()));
    }
  }
  return split;
}

}  // namespace kvtier
