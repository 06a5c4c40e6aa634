#include "kernels/migrate_occupancy.h"

#include "gtest/gtest.h"
#include "kernels/page_layout.h"
#include "kvtier/format.h"

namespace kvtier::gpu {
namespace {

PageLayout Layout(const char* format) {
  return MakePageLayout(8, 16, 128, ParseFormat(format).value());
}

TEST(MigrateOccupancyTest, AutoRunsMoreBlocksPerSmIntoNvfp4AndFiveFromE4m3) {
  const PageLayout fp16 = Layout("fp16"), e4m3 = Layout("fp8_e4m3/block_head");
  for (const char* format : {"nvfp4/block_head", "nvfp4/tensor", "nvfp4_channel/block_head",
                             "k:nvfp4_channel/block_head,v:nvfp4/block_head",
                             "k:fp8_e4m3/block_head,v:nvfp4/block_head"}) {
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kAuto, fp16, Layout(format)), 4) << format;
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kAuto, e4m3, Layout(format)), 5) << format;
  }
  // A source that is not all E4M3 gets the 16-bit sources' choice.
  EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kAuto, Layout("k:fp16,v:fp8_e4m3/block_head"),
                                  Layout("nvfp4/block_head")),
            4);
  for (const char* format : {"fp8_e4m3/block_head", "fp8_e4m3/token_head", "fp8_e5m2/tensor",
                             "bf16", "k:fp16,v:fp8_e4m3/block_head"}) {
    for (const PageLayout& src : {fp16, e4m3}) {
      EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kAuto, src, Layout(format)), 3) << format;
    }
  }
}

TEST(MigrateOccupancyTest, ForcedVariantsIgnoreTheFormats) {
  for (const char* from : {"fp16", "fp8_e4m3/block_head"}) {
    for (const char* to : {"nvfp4/block_head", "fp8_e4m3/block_head"}) {
      const PageLayout src = Layout(from), dst = Layout(to);
      EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kTwoBlocksPerSm, src, dst), 2);
      EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kThreeBlocksPerSm, src, dst), 3);
      EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kFourBlocksPerSm, src, dst), 4);
      EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kFiveBlocksPerSm, src, dst), 5);
    }
  }
}

TEST(MigrateOccupancyTest, ParsesTheEnvironmentValues) {
  RequantizeVariant v = RequantizeVariant::kTwoBlocksPerSm;
  ASSERT_TRUE(ParseRequantizeVariant("auto", &v));
  EXPECT_EQ(v, RequantizeVariant::kAuto);
  ASSERT_TRUE(ParseRequantizeVariant("2", &v));
  EXPECT_EQ(v, RequantizeVariant::kTwoBlocksPerSm);
  ASSERT_TRUE(ParseRequantizeVariant("3", &v));
  EXPECT_EQ(v, RequantizeVariant::kThreeBlocksPerSm);
  ASSERT_TRUE(ParseRequantizeVariant("4", &v));
  EXPECT_EQ(v, RequantizeVariant::kFourBlocksPerSm);
  ASSERT_TRUE(ParseRequantizeVariant("5", &v));
  EXPECT_EQ(v, RequantizeVariant::kFiveBlocksPerSm);
}

TEST(MigrateOccupancyTest, RejectsOtherValuesLeavingTheVariant) {
  for (const char* value : {"", "1", "6", "04", "4 ", "AUTO", "three"}) {
    RequantizeVariant v = RequantizeVariant::kThreeBlocksPerSm;
    EXPECT_FALSE(ParseRequantizeVariant(value, &v)) << value;
    EXPECT_EQ(v, RequantizeVariant::kThreeBlocksPerSm) << value;
  }
}

}  // namespace
}  // namespace kvtier::gpu
