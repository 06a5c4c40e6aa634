#include "src/json.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

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

  bool Number(JsonValue* v) {
    const std::string token(text_.substr(pos_, text_.find_first_of(",]} \n\t\r", pos_) - pos_));
    // JSON's grammar only (strtod alone would take "nan", "inf" and hexadecimal too).
    const bool json_chars = !token.empty() && (token[0] == '-' || absl::ascii_isdigit(token[0])) &&
                            token.find_first_not_of("0123456789+-.eE") == std::string::npos;
    char* end = nullptr;
    v->number = json_chars ? std::strtod(token.c_str(), &end) : 0;
    if (!json_chars || end != token.c_str() + token.size()) return Failed("expected a value");
    if (!std::isfinite(v->number)) return Failed("number out of range");
    v->type = JsonValue::Type::kNumber;
    pos_ += token.size();
    return true;
  }

  bool String(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (c == '\\') {
        if (pos_ >= text_.size()) break;
        const char e = text_[pos_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': {
            const absl::string_view hex = text_.substr(pos_, 4);
            if (hex.size() != 4 || !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
              return Failed("\\u needs four hexadecimal digits");
            }
            const long code = std::strtol(std::string(hex).c_str(), nullptr, 16);
            if (code > 0xFF) return Failed("\\u escape beyond Latin-1");
            c = static_cast<char>(code);
            pos_ += 4;
            break;
          }
          case '"': case '\\': case '/': c = e; break;
          default: return Failed("unknown escape");
        }
      }
      out->push_back(c);
    }
    if (pos_ >= text_.size()) return Failed("unterminated string");
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
        return Failed(absl::StrCat("duplicate member \"", absl::CHexEscape(key), "\""));
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
