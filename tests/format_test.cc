#include "kvtier/format.h"

#include "gtest/gtest.h"
#include "kernels/page_layout.h"

namespace kvtier {
namespace {

FormatSpec Parse(const char* name) {
  absl::StatusOr<FormatSpec> f = ParseFormat(name);
  EXPECT_TRUE(f.ok()) << name << ": " << f.status();
  return f.ok() ? *f : FormatSpec{};
}

TEST(FormatTest, NamesRoundTrip) {
  for (const char* name :
       {"fp16", "bf16", "fp8_e4m3/tensor", "fp8_e4m3/block_head", "fp8_e5m2/token_head",
        "nvfp4/tensor", "nvfp4/block_head", "nvfp4_channel/block_head",
        "k:nvfp4_channel/block_head,v:nvfp4/block_head", "k:fp16,v:fp8_e4m3/block_head"}) {
    EXPECT_EQ(FormatName(Parse(name)), name);
  }
}

TEST(FormatTest, RejectsInvalidNamesWithAReason) {
  for (const char* name : {"", "fp32", "fp8_e4m3", "fp16/tensor", "nvfp4/token_head",
                           "nvfp4_channel/tensor", "fp8_e4m3/row", "k:fp16", "k:fp16,x:fp16",
                           "fp8_e4m3/tensor/x"}) {
    absl::StatusOr<FormatSpec> f = ParseFormat(name);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_FALSE(f.status().message().empty());
  }
}

TEST(FormatTest, TokenWiseFormats) {
  EXPECT_TRUE(IsTokenWise(Parse("fp16")));
  EXPECT_TRUE(IsTokenWise(Parse("fp8_e4m3/tensor")));
  EXPECT_TRUE(IsTokenWise(Parse("fp8_e4m3/token_head")));
  EXPECT_TRUE(IsTokenWise(Parse("nvfp4/tensor")));
  EXPECT_FALSE(IsTokenWise(Parse("fp8_e4m3/block_head")));
  EXPECT_FALSE(IsTokenWise(Parse("k:fp16,v:nvfp4/block_head")));
}

// The byte sizes of FORMATS.md's table: head_dim 128, 8 KV heads, 16 tokens.
TEST(PageLayoutTest, MatchesTheFormatsTable) {
  struct Row {
    const char* format;
    uint32_t page_bytes;
    uint32_t data_bytes;
  };
  for (const Row& r : {Row{"fp16", 65536, 65536}, Row{"fp8_e4m3/tensor", 32768, 32768},
                       Row{"fp8_e4m3/block_head", 33024, 32768 + 64},
                       Row{"fp8_e4m3/token_head", 33792, 32768 + 1024},
                       Row{"nvfp4/tensor", 18432, 16384 + 2048},
                       Row{"nvfp4/block_head", 18688, 16384 + 2048 + 64},
                       Row{"k:nvfp4_channel/block_head,v:nvfp4/block_head", 18688, 18496}}) {
    const PageLayout l = MakePageLayout(8, 16, 128, Parse(r.format));
    EXPECT_EQ(l.page_bytes, r.page_bytes) << r.format;
    EXPECT_EQ(l.data_bytes, r.data_bytes) << r.format;
    EXPECT_EQ(l.page_bytes % kPageAlignment, 0u);
  }
}

TEST(PageLayoutTest, OffsetsTileThePage) {
  const PageLayout l = MakePageLayout(2, 16, 64, Parse("nvfp4/block_head"));
  EXPECT_EQ(l.k.payload_offset, 0u);
  EXPECT_EQ(l.v.payload_offset, 2u * 16 * 32);
  EXPECT_EQ(l.k.micro_offset, 2u * 2 * 16 * 32);
  EXPECT_EQ(l.v.micro_offset, l.k.micro_offset + 2 * 16 * 4);  // K and V micro-scales adjacent
  EXPECT_EQ(l.k.scale_offset, l.v.micro_offset + 2 * 16 * 4);
  EXPECT_EQ(l.v.scale_offset, l.k.scale_offset + 2 * 4);
  // Micro-scales along tokens: one per channel per 16 tokens.
  const PageLayout c = MakePageLayout(2, 16, 64, Parse("nvfp4_channel/block_head"));
  EXPECT_EQ(c.MicroOffset(c.k, 1, 5, 7), c.k.micro_offset + 64 + 7);
  EXPECT_EQ(l.MicroOffset(l.k, 1, 5, 17), l.k.micro_offset + 64 + 5 * 4 + 1);
}

}  // namespace
}  // namespace kvtier
