#include "src/json.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "src/echo.h"

namespace kvtier {
namespace {

void AppendUtf8(uint32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
    return;
  }
  constexpr unsigned kLead[] = {0, 0xC0, 0xE0, 0xF0};  // by continuation bytes
  const int continuation = code < 0x800 ? 1 : code < 0x10000 ? 2 : 3;
  out->push_back(static_cast<char>(kLead[continuation] | (code >> (6 * continuation))));
  for (int i = continuation - 1; i >= 0; --i) {
    out->push_back(static_cast<char>(0x80 | ((code >> (6 * i)) & 0x3F)));
  }
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    if (!Value(&v, 0)) return error_;
    SkipSpace();
    if (pos_ != text_.size()) return Fail("trailing characters");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  absl::Status Fail(absl::string_view what) {
    error_ = absl::InvalidArgumentError(absl::StrCat("JSON at byte ", pos_, ": ", what));
    return error_;
  }
  bool Failed(absl::string_view what) {
    error_ = Fail(what);
    return false;
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool Value(JsonValue* v, int depth) {
    if (depth > kMaxDepth) return Failed("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) return Failed("unexpected end");
    const char c = text_[pos_];
    if (c == '{') return Object(v, depth);
    if (c == '[') return Array(v, depth);
    if (c == '"') {
      v->type = JsonValue::Type::kString;
      return String(&v->string);
    }
    if (Consume("true") || Consume("false")) {
      v->type = JsonValue::Type::kBool;
      v->boolean = c == 't';
      return true;
    }
    if (Consume("null")) return true;
    return Number(v);
  }

  // JSON's grammar only, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, read whatever the
  // locale (strtod would also take "nan", "inf", hexadecimal, "1." and a locale's decimal comma).
  bool Number(JsonValue* v) {
    size_t end = pos_;
    auto digits = [&] {
      const size_t first = end;
      while (end < text_.size() && absl::ascii_isdigit(text_[end])) ++end;
      return end > first;
    };
    auto next_is = [&](absl::string_view chars) {
      return end < text_.size() && chars.find(text_[end]) != absl::string_view::npos;
    };
    if (next_is("-")) ++end;
    if (next_is("0")) {
      ++end;
    } else if (!digits()) {
      return Failed("expected a value");
    }
    if (next_is(".") && (++end, !digits())) return Failed("expected digits after '.'");
    if (next_is("eE")) {
      ++end;
      if (next_is("+-")) ++end;
      if (!digits()) return Failed("expected an exponent");
    }
    if (end < text_.size() && (absl::ascii_isalnum(text_[end]) || text_[end] == '.')) {
      return Failed("malformed number");  // "0x10", "007", "1.5.2"
    }
    const char* last = text_.data() + end;
    const std::from_chars_result r = std::from_chars(text_.data() + pos_, last, v->number);
    if (r.ec != std::errc() || r.ptr != last || !std::isfinite(v->number)) {
      return Failed("number out of range");
    }
    v->type = JsonValue::Type::kNumber;
    pos_ = end;
    return true;
  }

  // Four hexadecimal digits at pos_, as a UTF-16 code unit.
  bool CodeUnit(uint32_t* unit) {
    const absl::string_view hex = text_.substr(pos_, 4);
    const char* end = hex.data() + hex.size();
    const std::from_chars_result r = std::from_chars(hex.data(), end, *unit, 16);
    if (hex.size() != 4 || r.ec != std::errc() || r.ptr != hex.data() + 4) {
      return Failed("\\u needs four hexadecimal digits");
    }
    pos_ += 4;
    return true;
  }

  // A \u escape (pos_ after the 'u'), a surrogate pair taken whole, appended as UTF-8.
  bool Escape(std::string* out) {
    uint32_t code = 0;
    if (!CodeUnit(&code)) return false;
    if (code >= 0xDC00 && code <= 0xDFFF) return Failed("lone low surrogate");
    if (code >= 0xD800 && code <= 0xDBFF) {
      uint32_t low = 0;
      if (!Consume("\\u") || !CodeUnit(&low) || low < 0xDC00 || low > 0xDFFF) {
        return Failed("high surrogate without its low half");
      }
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    AppendUtf8(code, out);
    return true;
  }

  bool String(std::string* out) {
    ++pos_;  // opening quote
    const size_t first = out->size();
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) return Failed("control character in a string");
      if (c == '\\') {
        if (pos_ >= text_.size()) break;
        const char e = text_[pos_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u':
            if (!Escape(out)) return false;
            continue;
          case '"': case '\\': case '/': c = e; break;
          default: return Failed("unknown escape");
        }
      }
      out->push_back(c);
    }
    if (pos_ >= text_.size()) return Failed("unterminated string");
    if (!IsUtf8(absl::string_view(*out).substr(first))) return Failed("a string is not UTF-8");
    ++pos_;  // closing quote
    return true;
  }

  bool Array(JsonValue* v, int depth) {
    v->type = JsonValue::Type::kArray;
    ++pos_;
    SkipSpace();
    if (Consume("]")) return true;
    while (true) {
      v->items.emplace_back();
      if (!Value(&v->items.back(), depth + 1)) return false;
      SkipSpace();
      if (Consume("]")) return true;
      if (!Consume(",")) return Failed("expected ',' or ']'");
    }
  }

  bool Object(JsonValue* v, int depth) {
    v->type = JsonValue::Type::kObject;
    ++pos_;
    SkipSpace();
    if (Consume("}")) return true;
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Failed("expected a member name");
      std::string key;
      const size_t key_at = pos_;
      if (!String(&key)) return false;
      if (v->Find(key) != nullptr) {
        pos_ = key_at;
        return Failed(absl::StrCat("duplicate member ", Echo(key)));
      }
      SkipSpace();
      if (!Consume(":")) return Failed("expected ':'");
      v->members.emplace_back(std::move(key), JsonValue{});
      if (!Value(&v->members.back().second, depth + 1)) return false;
      SkipSpace();
      if (Consume("}")) return true;
      if (!Consume(",")) return Failed("expected ',' or '}'");
    }
  }

  absl::string_view text_;
  size_t pos_ = 0;
  absl::Status error_;
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& [name, value] : members) {
    if (name == key) return &value;
  }
  return nullptr;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).ParseDocument(); }

bool IsUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const int continuation = lead < 0x80 ? 0 : lead >= 0xC2 && lead <= 0xDF ? 1
                             : lead >= 0xE0 && lead <= 0xEF ? 2 : lead >= 0xF0 && lead <= 0xF4 ? 3
                             : -1;
    if (continuation < 0 || i + continuation >= text.size()) return false;
    uint32_t code = lead & (0x7F >> continuation);
    for (int k = 1; k <= continuation; ++k) {
      const auto byte = static_cast<unsigned char>(text[i + k]);
      if ((byte & 0xC0) != 0x80) return false;
      code = (code << 6) | (byte & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF.
    constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    if (code < kLeast[continuation] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
      return false;
    }
    i += continuation + 1;
  }
  return true;
}

std::string JsonNumber(double x) {
  char buffer[32];
  const std::to_chars_result r = std::to_chars(buffer, buffer + sizeof(buffer), x);
  return std::string(buffer, r.ptr);
}

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(byte, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace kvtier
