#include "examples/kvtier/recall_npy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "kernels/codec/half.h"
#include "src/echo.h"

namespace kvtier::tool {
namespace {

// Numpy writes headers of a few hundred bytes; a longer one is not read.
constexpr size_t kMaxHeaderBytes = 1 << 16;
// The most elements a file may declare (32 GiB as floats).
constexpr int64_t kMaxElements = int64_t{1} << 33;

absl::Status Bad(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
}

// The value of `key` in the header dict, e.g. 'descr': '<f4' -> "'<f4'"; up to the next ',' or
// '}' outside parentheses.
std::string DictValue(const std::string& header, const std::string& key) {
  const size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) return "";
  size_t i = header.find(':', at);
  if (i == std::string::npos) return "";
  ++i;
  while (i < header.size() && header[i] == ' ') ++i;
  int depth = 0;
  std::string value;
  for (; i < header.size(); ++i) {
    const char c = header[i];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
    value += c;
    if (depth == 0 && c == ')') break;
  }
  while (!value.empty() && value.back() == ' ') value.pop_back();
  return value;
}

// The dimensions of a shape tuple such as "(2, 600, 8, 128)" or "(128,)": 1 to 4 numbers of up
// to 12 digits (an 'L' suffix allowed), separated by commas; false for anything else.
bool ParseShape(const std::string& text, std::vector<int64_t>* shape) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') return false;
  const std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(text).substr(1, text.size() - 2), ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    absl::string_view d = absl::StripAsciiWhitespace(parts[i]);
    if (d.empty() && i + 1 == parts.size() && i > 0) break;  // "(128,)"
    if (!d.empty() && d.back() == 'L') d.remove_suffix(1);
    if (d.empty() || d.size() > 12 ||
        !std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return false;
    }
    shape->push_back(std::stoll(std::string(d)));
  }
  return !shape->empty() && shape->size() <= 4;
}

uint32_t ReadLe(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  // The preamble and header first, so that a stream that is not a .npy file (/dev/zero) is
  // refused after a few bytes, and the data read is at most what the header declares.
  unsigned char pre[12];
  if (!in.read(reinterpret_cast<char*>(pre), 10) || std::memcmp(pre, "\x93NUMPY", 6) != 0) {
    return Bad(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = pre[6];
  if (major < 1 || major > 3) return Bad(path, absl::StrCat("unsupported .npy version ", major));
  const int len_bytes = major == 1 ? 2 : 4;
  if (len_bytes == 4 && !in.read(reinterpret_cast<char*>(pre + 10), 2)) {
    return Bad(path, "truncated header");
  }
  const size_t header_len = ReadLe(pre + 8, len_bytes);
  if (header_len > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header of ", header_len, " bytes (at most ", kMaxHeaderBytes,
                                  ")"));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    return Bad(path, "truncated header");
  }

  const std::string descr = DictValue(header, "descr");
  int elem = 0;
  if (descr == "'<f2'") elem = 2;
  if (descr == "'<f4'") elem = 4;
  if (elem == 0) {
    return Bad(path, absl::StrCat("dtype ", Echo(descr.empty() ? "(missing)" : descr),
                                  " is not '<f2' (float16) or '<f4' (float32)"));
  }
  if (DictValue(header, "fortran_order") != "False") {
    return Bad(path, "fortran_order must be False (save a C-contiguous array)");
  }
  const std::string shape_text = DictValue(header, "shape");
  NpyArray array;
  if (!ParseShape(shape_text, &array.shape)) {
    return Bad(path, absl::StrCat("cannot parse shape ", Echo(shape_text),
                                  " (a tuple of 1 to 4 dimensions)"));
  }
  int64_t count = 1;
  for (const int64_t d : array.shape) {
    if (d != 0 && count > kMaxElements / d) {
      return Bad(path, absl::StrCat("shape ", Echo(shape_text), " has more than ", kMaxElements,
                                    " elements"));
    }
    count *= d;
  }
  // Read in pieces, so that memory follows the bytes that arrive, not the header's claim.
  const int64_t data_bytes = count * elem;
  std::string data;
  while (static_cast<int64_t>(data.size()) < data_bytes) {
    const size_t have = data.size();
    const size_t piece = static_cast<size_t>(std::min<int64_t>(1 << 20, data_bytes - have));
    data.resize(have + piece);
    in.read(data.data() + have, static_cast<std::streamsize>(piece));
    data.resize(have + static_cast<size_t>(in.gcount()));
    if (data.size() < have + piece) break;
  }
  if (static_cast<int64_t>(data.size()) != data_bytes || in.peek() != EOF) {
    return Bad(path, absl::StrCat("holds ",
                                  static_cast<int64_t>(data.size()) < data_bytes
                                      ? absl::StrCat(data.size())
                                      : std::string("more"),
                                  " data bytes; shape ", Echo(shape_text), " needs ", data_bytes));
  }
  array.data.resize(count);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (int64_t i = 0; i < count; ++i, p += elem) {
    if (elem == 2) {
      array.data[i] = codec::HalfToFloat(static_cast<uint16_t>(ReadLe(p, 2)));
    } else {
      const uint32_t bits = ReadLe(p, 4);
      std::memcpy(&array.data[i], &bits, 4);
    }
  }
  return array;
}

absl::StatusOr<KVDump> LoadKVDump(const std::string& k_path, const std::string& v_path,
                                  int32_t layer) {
  absl::StatusOr<NpyArray> k = ReadNpy(k_path);
  if (!k.ok()) return k.status();
  absl::StatusOr<NpyArray> v = ReadNpy(v_path);
  if (!v.ok()) return v.status();
  if (k->shape != v->shape) return Bad(v_path, "K and V shapes differ");
  const std::vector<int64_t>& s = k->shape;
  if (s.size() != 3 && s.size() != 4) {
    return Bad(k_path, "shape must be [tokens, kv_heads, head_dim] or [layers, tokens, kv_heads, head_dim]");
  }
  const int64_t layers = s.size() == 4 ? s[0] : 1;
  if (layer < 0 || layer >= layers) {
    return Bad(k_path, absl::StrCat("layer ", layer, " is outside [0, ", layers, ")"));
  }
  KVDump dump;
  const int64_t kv_heads = s[s.size() - 2], head_dim = s[s.size() - 1];
  dump.tokens = s[s.size() - 3];
  if (dump.tokens < 1 || kv_heads < 1 || kv_heads > 256 || head_dim < 16 || head_dim > 1024 ||
      head_dim % 16 != 0) {
    return Bad(k_path, "needs tokens >= 1, kv_heads 1 to 256 and head_dim a multiple of 16 "
                       "from 16 to 1024 (the cache's geometry)");
  }
  dump.kv_heads = static_cast<int32_t>(kv_heads);
  dump.head_dim = static_cast<int32_t>(head_dim);
  const size_t per_layer = static_cast<size_t>(dump.tokens) * dump.kv_heads * dump.head_dim;
  const size_t at = per_layer * layer;
  dump.k.assign(k->data.begin() + at, k->data.begin() + at + per_layer);
  dump.v.assign(v->data.begin() + at, v->data.begin() + at + per_layer);
  for (const std::vector<float>* x : {&dump.k, &dump.v}) {
    for (float f : *x) {
      if (!(std::fabs(f) <= 65504.f)) {
        return Bad(x == &dump.k ? k_path : v_path, "holds a value that is not finite in FP16");
      }
    }
  }
  return dump;
}

absl::StatusOr<NpyArray> LoadQueries(const std::string& path, int32_t head_dim) {
  absl::StatusOr<NpyArray> q = ReadNpy(path);
  if (!q.ok()) return q.status();
  if (q->shape.size() == 1) q->shape.insert(q->shape.begin(), 1);
  if (q->shape.size() != 2 || q->shape[1] != head_dim || q->shape[0] < 1) {
    return Bad(path, absl::StrCat("queries must be [count, ", head_dim, "]"));
  }
  for (float f : q->data) {
    if (!std::isfinite(f)) return Bad(path, "holds a non-finite value");
  }
  for (int64_t row = 0; row < q->shape[0]; ++row) {
    const auto at = q->data.begin() + row * head_dim;
    if (std::all_of(at, at + head_dim, [](float f) { return f == 0.f; })) {
      return Bad(path, absl::StrCat("query row ", row, " is all zeros (it has no direction)"));
    }
  }
  return q;
}

}  // namespace kvtier::tool
