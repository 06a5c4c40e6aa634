#include "examples/kvtier/recall_npy.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "kernels/codec/half.h"

namespace kvtier::tool {
namespace {

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

uint32_t ReadLe(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) {
    return Bad(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = u[6];
  if (major < 1 || major > 3) return Bad(path, absl::StrCat("unsupported .npy version ", major));
  const int len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < static_cast<size_t>(8 + len_bytes)) return Bad(path, "truncated header");
  const size_t header_len = ReadLe(u + 8, len_bytes);
  const size_t data_at = 8 + len_bytes + header_len;
  if (bytes.size() < data_at) return Bad(path, "truncated header");
  const std::string header = bytes.substr(8 + len_bytes, header_len);

  const std::string descr = DictValue(header, "descr");
  int elem = 0;
  if (descr == "'<f2'") elem = 2;
  if (descr == "'<f4'") elem = 4;
  if (elem == 0) {
    return Bad(path, absl::StrCat("dtype ", descr.empty() ? "(missing)" : descr,
                                  " is not '<f2' (float16) or '<f4' (float32)"));
  }
  if (DictValue(header, "fortran_order") != "False") {
    return Bad(path, "fortran_order must be False (save a C-contiguous array)");
  }
  const std::string shape_text = DictValue(header, "shape");
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')') {
    return Bad(path, "no shape tuple in the header");
  }
  NpyArray array;
  int64_t count = 1;
  std::string number;
  for (size_t i = 1; i < shape_text.size(); ++i) {
    const char c = shape_text[i];
    if (c >= '0' && c <= '9') {
      number += c;
    } else if (c == ',' || c == ')') {
      if (!number.empty()) {
        if (number.size() > 12) return Bad(path, "dimension too large");
        array.shape.push_back(std::stoll(number));
        count *= array.shape.back();
        number.clear();
      }
    } else if (c != ' ' && c != 'L') {
      return Bad(path, absl::StrCat("cannot parse shape ", shape_text));
    }
  }
  if (array.shape.empty() || array.shape.size() > 4) {
    return Bad(path, absl::StrCat("shape ", shape_text, " must have 1 to 4 dimensions"));
  }
  if (bytes.size() - data_at != static_cast<size_t>(count) * elem) {
    return Bad(path, absl::StrCat("holds ", bytes.size() - data_at, " data bytes; shape ",
                                  shape_text, " needs ", count * elem));
  }
  array.data.resize(count);
  const unsigned char* p = u + data_at;
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
  dump.tokens = s[s.size() - 3];
  dump.kv_heads = static_cast<int32_t>(s[s.size() - 2]);
  dump.head_dim = static_cast<int32_t>(s[s.size() - 1]);
  if (dump.tokens < 1 || dump.kv_heads < 1 || dump.head_dim < 16 || dump.head_dim % 16 != 0) {
    return Bad(k_path, "needs tokens >= 1, kv_heads >= 1 and head_dim a multiple of 16");
  }
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
  return q;
}

}  // namespace kvtier::tool
