#include "kvtier/adapters/scale_conventions.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/page_codec.h"

namespace kvtier {
namespace {

constexpr ScaleConvention kAll[] = {
    ScaleConvention::kKvtier,           ScaleConvention::kModelOpt,
    ScaleConvention::kFlashInferKVScale, ScaleConvention::kFlashInferGlobalSf,
    ScaleConvention::kTensorRtLlmQuantOrig, ScaleConvention::kTensorRtLlmOrigQuant,
    ScaleConvention::kAmaxOver6};

TEST(ScaleConventionsTest, EveryConventionRoundTrips) {
  for (ElementType type : {ElementType::kFp8E4M3, ElementType::kFp8E5M2, ElementType::kNvfp4}) {
    for (ScaleConvention c : kAll) {
      for (float s : {1e-6f, 0.0371f, 1.f, 3.5f, 1e4f}) {
        absl::StatusOr<float> v = ToConvention(s, type, c);
        if (c == ScaleConvention::kAmaxOver6 && type != ElementType::kNvfp4) {
          EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
          continue;
        }
        ASSERT_TRUE(v.ok()) << v.status();
        EXPECT_FLOAT_EQ(*FromConvention(*v, type, c), s);
      }
    }
  }
}

TEST(ScaleConventionsTest, Nvfp4ConventionsAgreeOnAmax) {
  const float amax = 37.5f;
  const float d = codec::Nvfp4DecodeScale(amax);  // kvtier: amax / 2688
  EXPECT_FLOAT_EQ(*ToConvention(d, ElementType::kNvfp4, ScaleConvention::kModelOpt), amax / (6 * 448));
  EXPECT_FLOAT_EQ(*ToConvention(d, ElementType::kNvfp4, ScaleConvention::kFlashInferGlobalSf), 448 / amax);
  // FlashInfer reads kvtier's micro-scales (up to 448) with k_scale = d.
  EXPECT_FLOAT_EQ(*ToConvention(d, ElementType::kNvfp4, ScaleConvention::kFlashInferKVScale), amax / 2688);
  EXPECT_FLOAT_EQ(*ToConvention(d, ElementType::kNvfp4, ScaleConvention::kAmaxOver6), amax / 6);
  EXPECT_FLOAT_EQ(*ToConvention(d, ElementType::kNvfp4, ScaleConvention::kTensorRtLlmOrigQuant), 2688 / amax);
}

// A page decoded with a scale that went through each convention and back gives the same values.
TEST(ScaleConventionsTest, APageDecodesIdenticallyThroughEachConvention) {
  const FormatSpec f{{ElementType::kNvfp4, ScaleScope::kTensor, MicroAxis::kHeadDim},
                     {ElementType::kFp8E4M3, ScaleScope::kTensor, MicroAxis::kHeadDim}};
  const PageLayout l = MakePageLayout(1, 16, 64, f);
  std::vector<uint8_t> page(l.page_bytes);
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(i * 0.7f) * 9.f;
  const float k_scale = codec::Nvfp4DecodeScale(9.f), v_scale = 9.f / 448.f;
  EncodeRow(l, l.k, page.data(), 0, 3, x.data(), k_scale);
  EncodeRow(l, l.v, page.data(), 0, 3, x.data(), v_scale);
  std::vector<float> want_k(64), want_v(64), got(64);
  DecodeRow(l, l.k, page.data(), 0, 3, want_k.data(), k_scale);
  DecodeRow(l, l.v, page.data(), 0, 3, want_v.data(), v_scale);
  for (ScaleConvention c : kAll) {
    const float ks = *FromConvention(*ToConvention(k_scale, ElementType::kNvfp4, c), ElementType::kNvfp4, c);
    DecodeRow(l, l.k, page.data(), 0, 3, got.data(), ks);
    for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(got[i], want_k[i]);
    if (c == ScaleConvention::kAmaxOver6) continue;
    const float vs = *FromConvention(*ToConvention(v_scale, ElementType::kFp8E4M3, c), ElementType::kFp8E4M3, c);
    DecodeRow(l, l.v, page.data(), 0, 3, got.data(), vs);
    for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(got[i], want_v[i]);
  }
}

TEST(ScaleConventionsTest, RejectsWhatHasNoScale) {
  EXPECT_FALSE(ToConvention(1.f, ElementType::kFp16, ScaleConvention::kKvtier).ok());
  EXPECT_FALSE(ToConvention(0.f, ElementType::kFp8E4M3, ScaleConvention::kKvtier).ok());
  EXPECT_FALSE(FromConvention(NAN, ElementType::kNvfp4, ScaleConvention::kModelOpt).ok());
}

}  // namespace
}  // namespace kvtier
