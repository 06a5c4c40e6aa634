#include "kernels/migrate_occupancy.h"

#include "gtest/gtest.h"
#include "kernels/page_layout.h"
#include "kvtier/format.h"

namespace kvtier::gpu {
namespace {

PageLayout Layout(const char* format) {
  return MakePageLayout(8, 16, 128, ParseFormat(format).value());
}

TEST(MigrateOccupancyTest, AutoRunsFourBlocksPerSmIntoNvfp4AndThreeOtherwise) {
  for (const char* format : {"nvfp4/block_head", "nvfp4/tensor", "nvfp4_channel/block_head",
                             "k:nvfp4_channel/block_head,v:nvfp4/block_head",
                             "k:fp8_e4m3/block_head,v:nvfp4/block_head"}) {
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kAuto, Layout(format)), 4) << format;
  }
  for (const char* format : {"fp8_e4m3/block_head", "fp8_e4m3/token_head", "fp8_e5m2/tensor",
                             "bf16", "k:fp16,v:fp8_e4m3/block_head"}) {
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kAuto, Layout(format)), 3) << format;
  }
}

TEST(MigrateOccupancyTest, ForcedVariantsIgnoreTheDestination) {
  for (const char* format : {"nvfp4/block_head", "fp8_e4m3/block_head"}) {
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kTwoBlocksPerSm, Layout(format)), 2);
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kThreeBlocksPerSm, Layout(format)), 3);
    EXPECT_EQ(RequantizeBlocksPerSm(RequantizeVariant::kFourBlocksPerSm, Layout(format)), 4);
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
}

TEST(MigrateOccupancyTest, RejectsOtherValuesLeavingTheVariant) {
  for (const char* value : {"", "1", "5", "04", "4 ", "AUTO", "three"}) {
    RequantizeVariant v = RequantizeVariant::kThreeBlocksPerSm;
    EXPECT_FALSE(ParseRequantizeVariant(value, &v)) << value;
    EXPECT_EQ(v, RequantizeVariant::kThreeBlocksPerSm) << value;
  }
}

}  // namespace
}  // namespace kvtier::gpu
