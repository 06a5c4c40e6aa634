#include "kvtier/format.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "src/echo.h"

namespace kvtier {
namespace {

struct ScopeName {
  ScaleScope scope;
  const char* name;
};
constexpr ScopeName kScopeNames[] = {
    {ScaleScope::kTensor, "tensor"},
    {ScaleScope::kBlockHead, "block_head"},
    {ScaleScope::kTokenHead, "token_head"},
};

const char* TypeName(const CodecSpec& c) {
  switch (c.type) {
    case ElementType::kFp16: return "fp16";
    case ElementType::kBf16: return "bf16";
    case ElementType::kFp8E4M3: return "fp8_e4m3";
    case ElementType::kFp8E5M2: return "fp8_e5m2";
    case ElementType::kNvfp4:
      return c.axis == MicroAxis::kTokens ? "nvfp4_channel" : "nvfp4";
  }
  return "?";
}


}  // namespace

int PayloadBits(ElementType type) {
  switch (type) {
    case ElementType::kFp16:
    case ElementType::kBf16: return 16;
    case ElementType::kFp8E4M3:
    case ElementType::kFp8E5M2: return 8;
    case ElementType::kNvfp4: return 4;
  }
  return 0;
}

absl::Status ValidateCodec(const CodecSpec& c) {
  // Enums from a caller (or an engine's bindings) may hold any byte.
  if (c.type > ElementType::kNvfp4 || c.scope > ScaleScope::kTokenHead ||
      c.axis > MicroAxis::kTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec: element type ", static_cast<int>(c.type), ", scale scope ",
        static_cast<int>(c.scope), ", micro axis ", static_cast<int>(c.axis),
        ": an enum is out of range (type 0-4, scope 0-3, axis 0-1)"));
  }
  const bool unscaled = c.type == ElementType::kFp16 || c.type == ElementType::kBf16;
  if (unscaled != (c.scope == ScaleScope::kNone)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", TypeName(c), ": ", unscaled ? "FP16/BF16 take no scale" : "needs a scale scope"));
  }
  if (c.type != ElementType::kNvfp4 && c.axis != MicroAxis::kHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec ", TypeName(c), ": only NVFP4 has micro-blocks along tokens"));
  }
  if (c.type == ElementType::kNvfp4 && c.scope == ScaleScope::kTokenHead) {
    return absl::InvalidArgumentError(
        "codec nvfp4: the second-level scale is per tensor or per (block, head)");
  }
  if (c.axis == MicroAxis::kTokens && c.scope != ScaleScope::kBlockHead) {
    return absl::InvalidArgumentError(
        "codec nvfp4_channel: micro-blocks along tokens need a per-(block, head) second level");
  }
  return absl::OkStatus();
}

bool IsTokenWise(const FormatSpec& f) {
  for (const CodecSpec* c : {&f.k, &f.v}) {
    if (c->scope == ScaleScope::kBlockHead) return false;
  }
  return true;
}

std::string CodecName(const CodecSpec& c) {
  for (const ScopeName& s : kScopeNames) {
    if (s.scope == c.scope) return absl::StrCat(TypeName(c), "/", s.name);
  }
  return TypeName(c);
}

std::string FormatName(const FormatSpec& f) {
  if (f.k == f.v) return CodecName(f.k);
  return absl::StrCat("k:", CodecName(f.k), ",v:", CodecName(f.v));
}

absl::StatusOr<CodecSpec> ParseCodec(absl::string_view name) {
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '/');
  if (parts.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat("codec ", Echo(name), ": too many '/'"));
  }
  CodecSpec c;
  const absl::string_view type = parts[0];
  if (type == "fp16") {
    c.type = ElementType::kFp16;
  } else if (type == "bf16") {
    c.type = ElementType::kBf16;
  } else if (type == "fp8_e4m3") {
    c.type = ElementType::kFp8E4M3;
  } else if (type == "fp8_e5m2") {
    c.type = ElementType::kFp8E5M2;
  } else if (type == "nvfp4") {
    c.type = ElementType::kNvfp4;
  } else if (type == "nvfp4_channel") {
    c.type = ElementType::kNvfp4;
    c.axis = MicroAxis::kTokens;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", Echo(name),
        ": unknown element type (fp16, bf16, fp8_e4m3, fp8_e5m2, nvfp4, nvfp4_channel)"));
  }
  if (parts.size() == 2) {
    bool found = false;
    for (const ScopeName& s : kScopeNames) {
      if (parts[1] == s.name) {
        c.scope = s.scope;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "codec ", Echo(name), ": unknown scale scope (tensor, block_head, token_head)"));
    }
  }
  absl::Status valid = ValidateCodec(c);
  if (!valid.ok()) return valid;
  return c;
}

absl::StatusOr<FormatSpec> ParseFormat(absl::string_view name) {
  if (!absl::StartsWith(name, "k:")) {
    absl::StatusOr<CodecSpec> c = ParseCodec(name);
    if (!c.ok()) return c.status();
    return FormatSpec{*c, *c};
  }
  const std::vector<absl::string_view> sides = absl::StrSplit(name, ',');
  if (sides.size() != 2 || !absl::StartsWith(sides[1], "v:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("format ", Echo(name), ": expected 'k:<codec>,v:<codec>'"));
  }
  absl::StatusOr<CodecSpec> k = ParseCodec(absl::StripPrefix(sides[0], "k:"));
  if (!k.ok()) return k.status();
  absl::StatusOr<CodecSpec> v = ParseCodec(absl::StripPrefix(sides[1], "v:"));
  if (!v.ok()) return v.status();
  return FormatSpec{*k, *v};
}

}  // namespace kvtier
