// Hostile text through the parsers: format names, policy JSON and policy windows. Each answers
// InvalidArgument with a message that names the problem, in bounded length.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/policy.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::PaletteOptions;

void ExpectInvalid(const absl::Status& s, absl::string_view want) {
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find(want), absl::string_view::npos) << want << " not in: " << s;
}

TEST(ParseErrorsTest, LongFormatNamesAreCutInMessages) {
  const std::string name(size_t{1} << 20, 'x');
  const absl::Status s = ParseFormat(name).status();
  ExpectInvalid(s, "(1048576 bytes)");
  EXPECT_LT(s.message().size(), 300u);
  ExpectInvalid(ParseFormat("k:" + name + ",v:fp16").status(), "(1048576 bytes)");
}

TEST(ParseErrorsTest, PolicyNamesPathsAndKeysAreCutInMessages) {
  const std::string name(1 << 20, 'p');
  for (const absl::Status& s :
       {PolicyPreset(name).status(), LoadPolicy(name).status(),
        LoadPolicy("/nonexistent/" + name + ".json").status(),
        ParsePolicyJson(absl::StrCat("{\"", name, "\": 1, \"", name, "\": 1}")).status()}) {
    EXPECT_FALSE(s.ok());
    EXPECT_LT(s.message().size(), 400u) << s.message().substr(0, 200);
  }
  const absl::Status nul = PolicyPreset(std::string("a\0b", 3)).status();
  EXPECT_NE(nul.message().find("a\\x00"), std::string::npos) << nul;
}

TEST(ParseErrorsTest, APolicyFileIsReadUpToABound) {
  const absl::Status s = LoadPolicy("/dev/zero").status();  // endless: refused, not read whole
  ExpectInvalid(s, "is over 1048576 bytes");
}

TEST(ParseErrorsTest, EmbeddedNulIsEscapedNotACut) {
  const std::string name("fp16\0tail", 9);
  const absl::Status s = ParseFormat(name).status();
  ExpectInvalid(s, "fp16\\x00tail");
}

TEST(ParseErrorsTest, PolicyJsonTokenCountsAreIntegers) {
  for (const char* json : {
           R"({"tiers": [{"format": "fp16", "max_age_tokens": 16.5}, {"format": "bf16"}]})",
           R"({"tiers": [{"format": "fp16", "max_age_tokens": 1e300}, {"format": "bf16"}]})",
           R"({"tiers": [{"format": "fp16", "max_age_tokens": 9223372036854775807},
                         {"format": "bf16"}]})",
       }) {
    ExpectInvalid(ParsePolicyJson(json).status(), "tiers[0].max_age_tokens");
  }
  ExpectInvalid(ParsePolicyJson(R"({"tiers": [{"format": "fp16"}], "sink_tokens": 2.25})").status(),
                "sink_tokens");
  ExpectInvalid(ParsePolicyJson(R"({"tiers": [{"format": "fp16"}], "sink_tokens": -1e19})").status(),
                "sink_tokens");
}

TEST(ParseErrorsTest, JsonSyntaxIsStrict) {
  struct Case {
    const char* json;
    const char* why;
  };
  for (const Case& c : {
           Case{R"({"name": "a", "name": "b", "tiers": [{"format": "fp16"}]})", "duplicate member"},
           Case{R"({"tiers": [{"format": "fp16", "format": "bf16"}]})", "duplicate member"},
           Case{R"({"name": "\u00zz", "tiers": [{"format": "fp16"}]})", "four hexadecimal"},
           Case{R"({"name": "\u12", "tiers": [{"format": "fp16"}]})", "four hexadecimal"},
           Case{R"({"name": "\u+123", "tiers": [{"format": "fp16"}]})", "four hexadecimal"},
           Case{R"({"name": "\q", "tiers": [{"format": "fp16"}]})", "unknown escape"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": nan})", "expected a value"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": 0x10})", "malformed number"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": 1e999})", "out of range"},
           // JSON's number grammar, not strtod's.
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": -.5})", "expected a value"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": .5})", "expected a value"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": +1})", "expected a value"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": 1.})", "digits after '.'"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": 1e+})", "an exponent"},
           Case{R"({"tiers": [{"format": "fp16"}], "sink_tokens": 007})", "malformed number"},
           // Strings: UTF-16 surrogates in pairs, no raw control character, UTF-8 only.
           Case{R"({"name": "\ud800", "tiers": [{"format": "fp16"}]})", "low half"},
           Case{R"({"name": "\ud800\u0041", "tiers": [{"format": "fp16"}]})", "low half"},
           Case{R"({"name": "\udc00", "tiers": [{"format": "fp16"}]})", "lone low surrogate"},
           Case{"{\"name\": \"a\tb\", \"tiers\": [{\"format\": \"fp16\"}]}", "control character"},
           Case{"{\"name\": \"\xff\", \"tiers\": [{\"format\": \"fp16\"}]}", "not UTF-8"},
           Case{"{\"name\": \"\xc0\xaf\", \"tiers\": [{\"format\": \"fp16\"}]}", "not UTF-8"},
           Case{"{\"name\": \"\xed\xa0\x80\", \"tiers\": [{\"format\": \"fp16\"}]}", "not UTF-8"},
       }) {
    ExpectInvalid(ParsePolicyJson(c.json).status(), c.why);
  }
  // The valid escapes still parse.
  const absl::StatusOr<Policy> p =
      ParsePolicyJson(R"({"name": "a\u0041\"\\\/\n", "tiers": [{"format": "fp16"}]})");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "aA\"\\/\n");
}

// \u escapes are UTF-16 code units, read as UTF-8 (a name Python's json.dump writes with its
// default ensure_ascii); raw UTF-8 is read as it is.
TEST(ParseErrorsTest, JsonStringsAreUtf8) {
  for (const auto& [json_name, bytes] : {
           std::pair<const char*, const char*>{R"(caf\u00e9)", "caf\xc3\xa9"},
           {R"(\u7b56)", "\xe7\xad\x96"},
           {R"(\ud83d\ude00)", "\xf0\x9f\x98\x80"},
           {"caf\xc3\xa9", "caf\xc3\xa9"},
       }) {
    const absl::StatusOr<Policy> p = ParsePolicyJson(
        absl::StrCat(R"({"name": ")", json_name, R"(", "tiers": [{"format": "fp16"}]})"));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->name, bytes);
    const absl::StatusOr<Policy> again = ParsePolicyJson(PolicyToJson(*p));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->name, bytes);
  }
  Policy p = *PolicyPreset("fp8");
  p.name = "\xff";
  ExpectInvalid(ValidatePolicy(p), "policy.name");
}

// Every double of a valid policy reads back as the same double (6 significant digits wrote
// 0.9999999 as 1, outside [0, 1), and changed 0.1234567).
TEST(ParseErrorsTest, PolicyNumbersRoundTripExactly) {
  Policy p = *PolicyPreset("fp8");
  p.pressure_watermark = 0.9999999;
  p.pressure_window_scale = 0.1234567;
  p.attention_keep_ratio = 1048575.0000000001;  // printed 1.04858e+06: past 2^20
  ASSERT_TRUE(ValidatePolicy(p).ok()) << ValidatePolicy(p);
  const absl::StatusOr<Policy> again = ParsePolicyJson(PolicyToJson(p));
  ASSERT_TRUE(again.ok()) << again.status() << " in " << PolicyToJson(p);
  EXPECT_EQ(again->pressure_watermark, p.pressure_watermark);
  EXPECT_EQ(again->pressure_window_scale, p.pressure_window_scale);
  EXPECT_EQ(again->attention_keep_ratio, p.attention_keep_ratio);
}

// An unknown member's name is echoed cut and escaped, like any caller text.
TEST(ParseErrorsTest, UnknownPolicyFieldsAreEchoedCut) {
  const std::string key(1000, 'k');
  for (const std::string& json :
       {absl::StrCat(R"({")", key, R"(": 1, "tiers": [{"format": "fp16"}]})"),
        absl::StrCat(R"({"tiers": [{"format": "fp16", ")", key, R"(": 1}]})")}) {
    const absl::Status s = ParsePolicyJson(json).status();
    ExpectInvalid(s, "unknown field 'kkkk");
    ExpectInvalid(s, "(1000 bytes)");
    EXPECT_LT(s.message().size(), 200u) << s;
  }
}

TEST(ParseErrorsTest, PolicyNamesRoundTripThroughJson) {
  Policy p = *PolicyPreset("fp8");
  p.name = std::string("quote\" back\\ nul\0 tab\t end", 26);
  const absl::StatusOr<Policy> again = ParsePolicyJson(PolicyToJson(p));
  ASSERT_TRUE(again.ok()) << again.status() << " in " << PolicyToJson(p);
  EXPECT_EQ(again->name, p.name);
}

// Windows near INT64_MAX: the pressure-scaled bound was an out-of-range double-to-int64
// conversion and then an overflow. Refused in validation; the largest allowed one runs.
TEST(ParseErrorsTest, PolicyWindowsNearInt64Max) {
  Policy p;
  p.tiers = {{*ParseFormat("fp16"), INT64_MAX - 1}, {*ParseFormat("fp8_e4m3/block_head"), -1}};
  ExpectInvalid(ValidatePolicy(p), "tiers[0].max_age_tokens");
  p.sink_tokens = INT64_MAX;
  p.tiers[0].max_age_tokens = 16;
  ExpectInvalid(ValidatePolicy(p), "sink_tokens");

  p.sink_tokens = kMaxPolicyTokens;
  p.tiers[0].max_age_tokens = kMaxPolicyTokens;
  p.pressure_watermark = 0.99;  // under pressure at once: the scaled window is used
  ASSERT_TRUE(ValidatePolicy(p).ok()) << ValidatePolicy(p);
  std::unique_ptr<Cache> cache =
      MustCreate(PaletteOptions(Geometry{1, 1, 16, 16}, {"fp16", "fp8_e4m3/block_head"}, 4));
  ASSERT_TRUE(cache->SetPolicy(p).ok());
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 64, &slots).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  EXPECT_TRUE(cache->CheckConsistency().ok());
  EXPECT_EQ(cache->GetStats().formats[1].blocks_in_use, 0);  // nothing is that old
}

}  // namespace
}  // namespace kvtier
