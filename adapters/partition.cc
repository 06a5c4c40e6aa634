#include "kvtier/adapters/partition.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvtier {

absl::StatusOr<std::vector<FormatPart>> PartitionByFormat(const Options& options,
                                                          const PageTables& tables) {
  const int64_t batch = static_cast<int64_t>(tables.seq_lens.size());
  const int32_t s = options.geometry.block_tokens;
  if (tables.per_format.size() != options.palette.size()) {
    return absl::InvalidArgumentError(absl::StrCat("page tables hold ", tables.per_format.size(),
                                                   " formats; the palette has ",
                                                   options.palette.size()));
  }
  std::vector<int64_t> covered(batch, 0);
  std::vector<FormatPart> parts;
  for (size_t f = 0; f < tables.per_format.size(); ++f) {
    const FormatPageTable& t = tables.per_format[f];
    if (t.indptr.size() != static_cast<size_t>(batch) + 1 ||
        t.last_page_len.size() != static_cast<size_t>(batch) || t.indptr[0] != 0 ||
        static_cast<size_t>(t.indptr.back()) != t.indices.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "format ", f, "'s page table has ", t.indptr.size(), " indptr and ",
          t.last_page_len.size(), " last_page_len entries for ", batch, " sequences"));
    }
    // The whole indptr before any entry is read: a row's end past indices may come before the
    // row whose end falls back.
    for (int64_t b = 0; b < batch; ++b) {
      if (t.indptr[b + 1] < t.indptr[b]) {
        return absl::InvalidArgumentError(absl::StrCat("format ", f, ": indptr decreases at ", b));
      }
    }
    FormatPart part;
    part.format = static_cast<int32_t>(f);
    part.slab_unmaps = tables.slab_unmaps;
    part.indptr.push_back(0);
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t begin = t.indptr[b], end = t.indptr[b + 1];
      if (end == begin) continue;
      const int32_t last = t.last_page_len[b];
      if (last < 1 || last > s) {
        return absl::InvalidArgumentError(absl::StrCat("format ", f, ", sequence ", b,
                                                       ": last page holds ", last,
                                                       " tokens; 1 to ", s, " expected"));
      }
      part.batch_index.push_back(static_cast<int32_t>(b));
      part.indices.insert(part.indices.end(), t.indices.begin() + begin, t.indices.begin() + end);
      part.indptr.push_back(static_cast<int32_t>(part.indices.size()));
      part.last_page_len.push_back(last);
      const int64_t length = int64_t{s} * (end - begin - 1) + last;
      part.lengths.push_back(static_cast<int32_t>(length));
      covered[b] += length;
    }
    if (!part.batch_index.empty()) parts.push_back(std::move(part));
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (covered[b] != tables.seq_lens[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", b, " has ", tables.seq_lens[b], " tokens but its per-format pages hold ",
          covered[b], " (only a sequence's tail page may be partial)"));
    }
  }
  return parts;
}

PageTables PartAsPageTables(const FormatPart& part) {
  PageTables t;
  t.packed_indptr = part.indptr;
  t.packed.reserve(part.indices.size());
  for (int32_t page : part.indices) {
    t.packed.push_back(PackPage(static_cast<uint32_t>(part.format), static_cast<uint32_t>(page)));
  }
  t.seq_lens = part.lengths;
  t.slab_unmaps = part.slab_unmaps;
  return t;
}

std::vector<float> GatherRows(absl::Span<const float> x, int64_t row_elems,
                              absl::Span<const int32_t> batch_index) {
  std::vector<float> out;
  out.reserve(batch_index.size() * row_elems);
  for (int32_t b : batch_index) {
    const float* row = x.data() + static_cast<size_t>(b) * row_elems;
    out.insert(out.end(), row, row + row_elems);
  }
  return out;
}

}  // namespace kvtier
