#include "kvtier/adapters/scale_conventions.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

// value = factor x s^power, with power +1 or -1.
struct Rule {
  float factor;
  int power;
};

absl::StatusOr<Rule> RuleFor(ElementType type, ScaleConvention c) {
  const bool nvfp4 = type == ElementType::kNvfp4;
  if (type == ElementType::kFp16 || type == ElementType::kBf16) {
    return absl::InvalidArgumentError("FP16/BF16 codecs have no scale");
  }
  switch (c) {
    case ScaleConvention::kKvtier:
    case ScaleConvention::kModelOpt:
    case ScaleConvention::kTensorRtLlmQuantOrig: return Rule{1.f, 1};
    case ScaleConvention::kTensorRtLlmOrigQuant: return Rule{1.f, -1};
    case ScaleConvention::kFlashInferKVScale: return Rule{1.f, 1};
    case ScaleConvention::kFlashInferGlobalSf: return Rule{nvfp4 ? 1.f / 6.f : 1.f, -1};
    case ScaleConvention::kAmaxOver6:
      if (!nvfp4) return absl::InvalidArgumentError("amax / 6 is an NVFP4 convention only");
      return Rule{448.f, 1};
  }
  return absl::InvalidArgumentError("unknown scale convention");
}

absl::Status CheckPositive(float x) {
  if (!(std::isfinite(x) && x > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("scale ", x, " is not finite positive"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<float> ToConvention(float s, ElementType type, ScaleConvention convention) {
  absl::StatusOr<Rule> rule = RuleFor(type, convention);
  if (!rule.ok()) return rule.status();
  if (absl::Status ok = CheckPositive(s); !ok.ok()) return ok;
  return rule->power > 0 ? rule->factor * s : rule->factor / s;
}

absl::StatusOr<float> FromConvention(float value, ElementType type, ScaleConvention convention) {
  absl::StatusOr<Rule> rule = RuleFor(type, convention);
  if (!rule.ok()) return rule.status();
  if (absl::Status ok = CheckPositive(value); !ok.ok()) return ok;
  return rule->power > 0 ? value / rule->factor : rule->factor / value;
}

}  // namespace kvtier
