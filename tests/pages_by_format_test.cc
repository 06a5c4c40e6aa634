// SplitPagesByFormat: each format's share of every sequence, as the by-format decode grids read
// it (src/attention/pages_by_format.h).
#include "src/attention/pages_by_format.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/page_tables.h"

namespace kvtier {
namespace {

PageTables Packed(const std::vector<std::vector<uint32_t>>& sequences,
                  const std::vector<int32_t>& seq_lens) {
  PageTables t;
  t.packed_indptr = {0};
  for (const std::vector<uint32_t>& entries : sequences) {
    t.packed.insert(t.packed.end(), entries.begin(), entries.end());
    t.packed_indptr.push_back(static_cast<int32_t>(t.packed.size()));
  }
  t.seq_lens = seq_lens;
  return t;
}

// Sequences of mixed formats, the partial last page in format 0, in format 2 and full; an empty
// sequence; a format without pages: each format keeps its pages in order, with the tokens
// they hold (the partial page's shortfall only in its own format).
TEST(PagesByFormatTest, EachFormatKeepsItsPagesInOrderWithTheirTokens) {
  const PageTables tables =
      Packed({{PackPage(0, 7), PackPage(2, 3), PackPage(2, 4), PackPage(0, 9)},
              {},
              {PackPage(2, 5), PackPage(0, 1), PackPage(2, 6)},
              {PackPage(0, 2), PackPage(2, 8)}},
             {16 * 3 + 5, 0, 16 * 2 + 1, 32});
  const std::vector<FormatPages> split = SplitPagesByFormat(tables, 3, 16);
  ASSERT_EQ(split.size(), 3u);
  EXPECT_EQ(split[0].indptr, (std::vector<int32_t>{0, 2, 2, 3, 4}));
  EXPECT_EQ(split[0].pages, (std::vector<uint32_t>{7, 9, 1, 2}));
  EXPECT_EQ(split[0].seq_lens, (std::vector<int32_t>{16 + 5, 0, 16, 16}));
  EXPECT_EQ(split[1].indptr, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_TRUE(split[1].pages.empty());
  EXPECT_EQ(split[1].seq_lens, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(split[2].indptr, (std::vector<int32_t>{0, 2, 2, 4, 5}));
  EXPECT_EQ(split[2].pages, (std::vector<uint32_t>{3, 4, 5, 6, 8}));
  EXPECT_EQ(split[2].seq_lens, (std::vector<int32_t>{32, 0, 16 + 1, 16}));
}

// A batch of no sequences: each format's indptr is {0}.
TEST(PagesByFormatTest, AnEmptyBatch) {
  const std::vector<FormatPages> split = SplitPagesByFormat(Packed({}, {}), 2, 16);
  ASSERT_EQ(split.size(), 2u);
  for (const FormatPages& t : split) {
    EXPECT_EQ(t.indptr, std::vector<int32_t>{0});
    EXPECT_TRUE(t.pages.empty() && t.seq_lens.empty());
  }
}

}  // namespace
}  // namespace kvtier
