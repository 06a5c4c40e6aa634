#include "src/block_table.h"

#include "gtest/gtest.h"

namespace kvtier {
namespace {

TEST(BlockTableTest, StaleIdsNeverAlias) {
  BlockTable table(2);
  const uint32_t a = table.Allocate(0, 7);
  const BlockId old_id = table.IdOf(a);
  EXPECT_TRUE(table.IsLive(old_id));
  table.Free(a);
  EXPECT_FALSE(table.IsLive(old_id));
  const uint32_t b = table.Allocate(1, 9);
  EXPECT_EQ(b, a);  // the slot is reused ...
  EXPECT_FALSE(table.IsLive(old_id));  // ... under a new generation
  EXPECT_TRUE(table.IsLive(table.IdOf(b)));
  EXPECT_FALSE(table.IsLive(BlockId{5, 1}));  // out of range
}

TEST(BlockTableTest, CountsFreeSlots) {
  BlockTable table(3);
  EXPECT_EQ(table.free_count(), 3u);
  const uint32_t a = table.Allocate(0, 0);
  table.Allocate(0, 1);
  EXPECT_EQ(table.free_count(), 1u);
  EXPECT_EQ(table.CountFreeList(), 1u);
  table.Free(a);
  EXPECT_EQ(table.CountFreeList(), 2u);
  EXPECT_EQ(table[a].state, BlockState::kFree);
}

TEST(BlockTableTest, MetadataFitsOneCacheLine) {
  EXPECT_LE(sizeof(BlockMeta), 64u);
}

}  // namespace
}  // namespace kvtier
