#include "kvtier/policy.h"

#include <cmath>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/echo.h"
#include "src/json.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("policy.", field, ": ", why));
}

Policy MakePreset(const char* name, std::vector<std::pair<const char*, int64_t>> tiers,
                  int64_t sinks) {
  Policy p;
  p.name = name;
  for (const auto& [format, bound] : tiers) p.tiers.push_back({*ParseFormat(format), bound});
  p.sink_tokens = sinks;
  return p;
}

// A JSON number as a token count: an integer in [-kMaxPolicyTokens, kMaxPolicyTokens].
absl::Status ToTokens(const JsonValue& value, absl::string_view field, int64_t* out) {
  if (value.type != JsonValue::Type::kNumber) return Invalid(field, "expected a number");
  const double x = value.number;
  if (!(std::fabs(x) <= static_cast<double>(kMaxPolicyTokens)) || std::floor(x) != x) {
    return Invalid(field, absl::StrCat(x, " is not an integer in [-", kMaxPolicyTokens, ", ",
                                       kMaxPolicyTokens, "]"));
  }
  *out = static_cast<int64_t>(x);
  return absl::OkStatus();
}

constexpr const char* kNvfp4Kv = "k:nvfp4_channel/block_head,v:nvfp4/block_head";

}  // namespace

absl::Status ValidatePolicy(const Policy& p) {
  if (!IsUtf8(p.name)) return Invalid("name", absl::StrCat(Echo(p.name), " is not UTF-8"));
  if (p.tiers.empty() || p.tiers.size() > kMaxPolicyTiers) {
    return Invalid("tiers", absl::StrCat("has ", p.tiers.size(), " tiers; 1 to ",
                                         kMaxPolicyTiers, " allowed"));
  }
  for (size_t i = 0; i < p.tiers.size(); ++i) {
    const std::string field = absl::StrCat("tiers[", i, "].");
    const PolicyTier& t = p.tiers[i];
    for (const CodecSpec* c : {&t.format.k, &t.format.v}) {
      const absl::Status s = ValidateCodec(*c);
      if (!s.ok()) return Invalid(field + "format", s.message());
    }
    const bool last = i + 1 == p.tiers.size();
    if (last != (t.max_age_tokens == -1)) {
      return Invalid(field + "max_age_tokens",
                     last ? "the last tier has no bound (-1)" : "only the last tier may be unbounded");
    }
    if (!last && (t.max_age_tokens < 1 || (i > 0 && t.max_age_tokens <= p.tiers[i - 1].max_age_tokens))) {
      return Invalid(field + "max_age_tokens", "bounds must be positive and strictly increasing");
    }
    if (t.max_age_tokens > kMaxPolicyTokens) {
      return Invalid(field + "max_age_tokens",
                     absl::StrCat(t.max_age_tokens, " is above ", kMaxPolicyTokens));
    }
    for (size_t j = 0; j < i; ++j) {
      if (p.tiers[j].format == t.format) return Invalid(field + "format", "appears in two tiers");
    }
  }
  if (!IsTokenWise(p.tiers[0].format)) {
    return Invalid("tiers[0].format", "the hot tier must encode tokens one at a time");
  }
  if (p.sink_tokens < 0 || p.sink_tokens > kMaxPolicyTokens) {
    return Invalid("sink_tokens", absl::StrCat(p.sink_tokens, " is outside [0, ", kMaxPolicyTokens, "]"));
  }
  if (!(p.pressure_watermark >= 0 && p.pressure_watermark < 1)) {
    return Invalid("pressure_watermark", "must be in [0, 1)");
  }
  if (!(p.pressure_window_scale > 0 && p.pressure_window_scale <= 1)) {
    return Invalid("pressure_window_scale", "must be in (0, 1]");
  }
  if (!(p.attention_keep_ratio == 0 ||
        (p.attention_keep_ratio >= 1 && p.attention_keep_ratio <= kMaxAttentionKeepRatio))) {
    return Invalid("attention_keep_ratio",
                   absl::StrCat(p.attention_keep_ratio, " is neither 0 (off) nor in [1, ",
                                kMaxAttentionKeepRatio, "]"));
  }
  return absl::OkStatus();
}

std::vector<FormatSpec> PolicyPalette(const Policy& p) {
  std::vector<FormatSpec> palette;
  for (const PolicyTier& t : p.tiers) palette.push_back(t.format);
  return palette;
}

std::vector<std::string> PolicyPresetNames() {
  return {"fp16", "fp8", "balanced", "max_capacity", "balanced_rot", "attentive", "fp8_keys"};
}

KeyRotation PresetKeyRotation(absl::string_view name) {
  return name == "balanced_rot" ? KeyRotation::kHadamard : KeyRotation::kNone;
}

absl::StatusOr<Policy> PolicyPreset(absl::string_view name) {
  if (name == "fp16") return MakePreset("fp16", {{"fp16", -1}}, 0);
  if (name == "fp8") return MakePreset("fp8", {{"fp16", 16}, {"fp8_e4m3/block_head", -1}}, 4);
  if (name == "balanced") {
    return MakePreset("balanced", {{"fp16", 256}, {"fp8_e4m3/block_head", 2048}, {kNvfp4Kv, -1}}, 4);
  }
  if (name == "balanced_rot") {  // with Options::key_rotation = kHadamard
    return MakePreset("balanced_rot",
                      {{"fp16", 256}, {"fp8_e4m3/block_head", 2048}, {"nvfp4/block_head", -1}}, 4);
  }
  if (name == "attentive") {  // needs Cache::RecordAttention reports (docs/policies.md)
    Policy p = MakePreset("attentive",
                          {{"fp16", 128}, {"fp8_e4m3/block_head", 1024}, {kNvfp4Kv, -1}}, 4);
    p.attention_keep_ratio = 32;
    return p;
  }
  if (name == "fp8_keys") {  // a split palette: keys one tier above values
    return MakePreset("fp8_keys", {{"fp16", 256}, {"k:fp8_e4m3/block_head,v:nvfp4/block_head", -1}}, 4);
  }
  if (name == "max_capacity") return MakePreset("max_capacity", {{"fp16", 16}, {kNvfp4Kv, -1}}, 4);
  return absl::NotFoundError(absl::StrCat("no policy preset ", Echo(name), " (",
                                          absl::StrJoin(PolicyPresetNames(), ", "), ")"));
}

absl::StatusOr<Policy> ParsePolicyJson(absl::string_view json) {
  absl::StatusOr<JsonValue> doc = ParseJson(json);
  if (!doc.ok()) return doc.status();
  if (doc->type != JsonValue::Type::kObject) return Invalid("", "expected a JSON object");
  Policy p;
  for (const auto& [key, value] : doc->members) {
    const bool number = value.type == JsonValue::Type::kNumber;
    if (key == "name") {
      if (value.type != JsonValue::Type::kString) return Invalid(key, "expected a string");
      p.name = value.string;
    } else if (key == "sink_tokens") {
      KVTIER_RETURN_IF_ERROR(ToTokens(value, key, &p.sink_tokens));
    } else if (key == "pressure_watermark") {
      if (!number) return Invalid(key, "expected a number");
      p.pressure_watermark = value.number;
    } else if (key == "pressure_window_scale") {
      if (!number) return Invalid(key, "expected a number");
      p.pressure_window_scale = value.number;
    } else if (key == "attention_keep_ratio") {
      if (!number) return Invalid(key, "expected a number");
      p.attention_keep_ratio = value.number;
    } else if (key == "tiers") {
      if (value.type != JsonValue::Type::kArray) return Invalid(key, "expected an array");
      for (size_t i = 0; i < value.items.size(); ++i) {
        const JsonValue& tier = value.items[i];
        const std::string field = absl::StrCat("tiers[", i, "].");
        const JsonValue* format = tier.Find("format");
        if (format == nullptr || format->type != JsonValue::Type::kString) {
          return Invalid(field + "format", "expected a format name");
        }
        absl::StatusOr<FormatSpec> spec = ParseFormat(format->string);
        if (!spec.ok()) return Invalid(field + "format", spec.status().message());
        PolicyTier t{*spec, -1};
        if (const JsonValue* bound = tier.Find("max_age_tokens"); bound != nullptr) {
          KVTIER_RETURN_IF_ERROR(ToTokens(*bound, field + "max_age_tokens", &t.max_age_tokens));
        }
        for (const auto& member : tier.members) {
          if (member.first != "format" && member.first != "max_age_tokens") {
            return Invalid(absl::StrCat("tiers[", i, "]"),
                           absl::StrCat("unknown field ", Echo(member.first)));
          }
        }
        p.tiers.push_back(t);
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("policy: unknown field ", Echo(key)));
    }
  }
  absl::Status valid = ValidatePolicy(p);
  if (!valid.ok()) return valid;
  return p;
}

absl::StatusOr<Policy> LoadPolicy(absl::string_view name_or_path) {
  absl::StatusOr<Policy> preset = PolicyPreset(name_or_path);
  const bool looks_like_path = name_or_path.find('/') != absl::string_view::npos ||
                              absl::EndsWith(name_or_path, ".json");
  if (preset.ok()) return preset;
  if (!looks_like_path) {
    return absl::Status(preset.status().code(),
                        absl::StrCat(preset.status().message(),
                                     " (a policy file's path holds a '/' or ends in .json)"));
  }
  std::ifstream in{std::string(name_or_path)};
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open policy file ", Echo(name_or_path)));
  // A policy is a few hundred bytes: a file past kMaxPolicyFileBytes (/dev/zero, say) is refused
  // after that much is read, not read whole.
  constexpr size_t kMaxPolicyFileBytes = 1 << 20;
  std::string text(kMaxPolicyFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxPolicyFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("policy file ", Echo(name_or_path),
                                                   " is over ", kMaxPolicyFileBytes, " bytes"));
  }
  absl::StatusOr<Policy> p = ParsePolicyJson(text);
  if (!p.ok()) {
    return absl::Status(p.status().code(),
                        absl::StrCat(Echo(name_or_path), ": ", p.status().message()));
  }
  return p;
}

std::string PolicyToJson(const Policy& p) {
  std::vector<std::string> tiers;
  for (const PolicyTier& t : p.tiers) {
    tiers.push_back(t.max_age_tokens < 0
                        ? absl::StrCat("{\"format\": \"", FormatName(t.format), "\"}")
                        : absl::StrCat("{\"format\": \"", FormatName(t.format),
                                       "\", \"max_age_tokens\": ", t.max_age_tokens, "}"));
  }
  return absl::StrCat("{\"name\": ", JsonQuote(p.name), ", \"tiers\": [", absl::StrJoin(tiers, ", "),
                      "], \"sink_tokens\": ", p.sink_tokens, ", \"pressure_watermark\": ",
                      JsonNumber(p.pressure_watermark), ", \"pressure_window_scale\": ",
                      JsonNumber(p.pressure_window_scale), ", \"attention_keep_ratio\": ",
                      JsonNumber(p.attention_keep_ratio), "}");
}

}  // namespace kvtier
