#include "src/attention/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/codec/hadamard.h"
#include "kernels/page_codec.h"
#include "src/size_check.h"

namespace kvtier {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// q . k accumulated in double, four partial sums in a fixed order (deterministic).
double Dot(const float* q, const float* k, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += static_cast<double>(q[i]) * k[i];
    s1 += static_cast<double>(q[i + 1]) * k[i + 1];
    s2 += static_cast<double>(q[i + 2]) * k[i + 2];
    s3 += static_cast<double>(q[i + 3]) * k[i + 3];
  }
  for (; i < n; ++i) s0 += static_cast<double>(q[i]) * k[i];
  return (s0 + s1) + (s2 + s3);
}

// Reusable per-thread buffers.
struct Scratch {
  std::vector<double> weights;  // [group][length]: logits, then exp(l - max)
  std::vector<double> acc;      // [group][head_dim]
  std::vector<float> row;       // [head_dim]
};

// Where one (sequence, KV head)'s results go: its group's first rows of out, lse and logits
// (nullptr to skip), and the sequence's page_weight entries (nullptr to skip).
struct HeadOutputs {
  float* out;
  float* lse;
  float* logits;
  int64_t logits_stride;
  float* page_weight;
  int block_tokens;
};

// page_weight[p] = max(page_weight[p], the weight `w` (exp(l - max), summing to `sum`) puts on
// page p's tokens).
void KeepPageWeights(const double* w, int64_t length, double sum, int block_tokens,
                     float* page_weight) {
  for (int64_t first = 0, p = 0; first < length; first += block_tokens, ++p) {
    double mass = 0;
    for (int64_t t = first; t < std::min<int64_t>(first + block_tokens, length); ++t) mass += w[t];
    page_weight[p] = std::max(page_weight[p], static_cast<float>(mass / sum));
  }
}

// The attention math of one (sequence, KV head) for its `group` query heads. `Rows` provides
// Key(t, head, buf) and Value(t, head, buf), each returning a pointer to head_dim floats (buf or
// the source's own memory).
template <typename Rows>
void AttendHead(const Rows& rows, int64_t length, int kv_head, int head_dim, const float* q,
                int group, double scale, const HeadOutputs& o, Scratch* s) {
  s->weights.assign(static_cast<size_t>(group) * length, 0.0);
  s->acc.assign(static_cast<size_t>(group) * head_dim, 0.0);
  s->row.resize(head_dim);
  for (int64_t t = 0; t < length; ++t) {
    const float* k = rows.Key(t, kv_head, s->row.data());
    for (int g = 0; g < group; ++g) {
      s->weights[g * length + t] = scale * Dot(q + static_cast<size_t>(g) * head_dim, k, head_dim);
    }
  }
  std::vector<double> sums(group, 0.0);
  for (int g = 0; g < group; ++g) {
    double* w = s->weights.data() + g * length;
    if (o.logits != nullptr) {
      float* l = o.logits + g * o.logits_stride;
      for (int64_t t = 0; t < length; ++t) l[t] = static_cast<float>(w[t]);
      for (int64_t t = length; t < o.logits_stride; ++t) l[t] = -INFINITY;
    }
    double m = kNegInf;
    for (int64_t t = 0; t < length; ++t) m = std::max(m, w[t]);
    double sum = 0;
    for (int64_t t = 0; t < length; ++t) {
      w[t] = std::exp(w[t] - m);
      sum += w[t];
    }
    sums[g] = sum;
    o.lse[g] = length > 0 ? static_cast<float>(m + std::log(sum)) : -INFINITY;
    if (o.page_weight != nullptr && std::isfinite(o.lse[g])) {
      KeepPageWeights(w, length, sum, o.block_tokens, o.page_weight);
    }
  }
  for (int64_t t = 0; t < length; ++t) {
    const float* v = rows.Value(t, kv_head, s->row.data());
    for (int g = 0; g < group; ++g) {
      const double w = s->weights[g * length + t];
      double* a = s->acc.data() + g * head_dim;
      for (int d = 0; d < head_dim; ++d) a[d] += w * v[d];
    }
  }
  for (int g = 0; g < group; ++g) {
    for (int d = 0; d < head_dim; ++d) {
      o.out[g * head_dim + d] =
          length > 0 ? static_cast<float>(s->acc[g * head_dim + d] / sums[g]) : 0.f;
    }
  }
}

// Rows of a dense [length, heads, head_dim] array pair.
struct DenseRows {
  const float* k;
  const float* v;
  int heads;
  int head_dim;
  const float* Key(int64_t t, int h, float*) const {
    return k + (static_cast<size_t>(t) * heads + h) * head_dim;
  }
  const float* Value(int64_t t, int h, float*) const {
    return v + (static_cast<size_t>(t) * heads + h) * head_dim;
  }
};

// Rows of one sequence's pages, decoded with the page codec.
struct PagedRows {
  const PagedLayer* kv;
  const uint32_t* packed;  // this sequence's entries
  const float* Decode(int64_t t, int h, float* buf, bool key) const {
    const uint32_t entry = packed[t / kv->block_tokens];
    const PagedLayer::Format& f = kv->formats[PackedFormat(entry)];
    const uint8_t* page = f.base + static_cast<size_t>(PackedPage(entry)) * f.layout.page_bytes;
    const int token = static_cast<int>(t % kv->block_tokens);
    DecodeRow(f.layout, key ? f.layout.k : f.layout.v, page, h, token, buf,
              key ? f.k_tensor_scale : f.v_tensor_scale);
    return buf;
  }
  const float* Key(int64_t t, int h, float* buf) const { return Decode(t, h, buf, true); }
  const float* Value(int64_t t, int h, float* buf) const { return Decode(t, h, buf, false); }
};

// `page_weight_of(b)`: sequence b's page_weight entries, or nullptr.
template <typename RowsOf, typename PageWeightOf>
void AttendBatch(int64_t batch, int32_t num_kv_heads, int32_t head_dim, const DecodeQueries& q,
                 const DecodeOutputs& o, absl::Span<const int64_t> lengths, int block_tokens,
                 RowsOf rows_of, PageWeightOf page_weight_of) {
  Scratch scratch;
  const int group = q.num_q_heads / num_kv_heads;
  for (int64_t b = 0; b < batch; ++b) {
    const auto rows = rows_of(b);
    for (int h = 0; h < num_kv_heads; ++h) {
      const size_t first = static_cast<size_t>(b) * q.num_q_heads + static_cast<size_t>(h) * group;
      const HeadOutputs head{o.out.data() + first * head_dim, o.lse.data() + first,
                             o.logits.empty() ? nullptr : o.logits.data() + first * o.logits_stride,
                             o.logits_stride, page_weight_of(b), block_tokens};
      AttendHead(rows, lengths[b], h, head_dim, q.q.data() + first * head_dim, group,
                 q.softmax_scale, head, &scratch);
    }
  }
}

// The queries rotated by R_h of each query head's KV head h, as keys stored rotated need.
// REQUIRES: spans checked (CheckDecodeSpans), head_dim a power of two.
std::vector<float> RotatedQueries(const DecodeQueries& q, int32_t num_kv_heads, int32_t head_dim,
                                  uint64_t seed) {
  std::vector<float> out(q.q.begin(), q.q.end());
  const int group = q.num_q_heads / num_kv_heads;
  for (size_t r = 0; r < out.size() / head_dim; ++r) {
    const int kv_head = static_cast<int>(r % q.num_q_heads) / group;
    codec::RotateKey(out.data() + r * head_dim, head_dim, seed, kv_head);
  }
  return out;
}

}  // namespace

absl::Status PagedDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                  const DecodeQueries& queries, const DecodeOutputs& outputs) {
  const absl::Status s = ValidatePagedDecode(kv, tables, queries, outputs);
  if (!s.ok()) return s;
  const int64_t batch = static_cast<int64_t>(tables.seq_lens.size());
  std::vector<int64_t> lengths(tables.seq_lens.begin(), tables.seq_lens.end());
  std::vector<float> rotated;
  DecodeQueries q = queries;
  if (kv.rotate_keys) {
    rotated = RotatedQueries(queries, kv.num_kv_heads, kv.head_dim, kv.key_rotation_seed);
    q.q = rotated;
  }
  AttendBatch(
      batch, kv.num_kv_heads, kv.head_dim, q, outputs, lengths, kv.block_tokens,
      [&](int64_t b) { return PagedRows{&kv, tables.packed.data() + tables.packed_indptr[b]}; },
      [&](int64_t b) -> float* {
        return outputs.page_weight.empty() ? nullptr
                                           : outputs.page_weight.data() + tables.packed_indptr[b];
      });
  return absl::OkStatus();
}

absl::Status DenseDecodeAttention(absl::Span<const DenseSequence> seqs, int32_t num_kv_heads,
                                  int32_t head_dim, const DecodeQueries& queries,
                                  const DecodeOutputs& outputs) {
  const int64_t batch = static_cast<int64_t>(seqs.size());
  std::vector<int64_t> lengths(batch);
  int64_t max_length = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const uint64_t row = static_cast<uint64_t>(std::max(num_kv_heads, 0)) * std::max(head_dim, 0);
    const uint64_t length = static_cast<uint64_t>(std::max<int64_t>(seqs[b].length, 0));
    const uint64_t want = length * row;  // named in the message only: checked by division
    if (seqs[b].length < 0 || !HoldsExactly(seqs[b].k.size(), length, row) ||
        !HoldsExactly(seqs[b].v.size(), length, row)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", b, ": K holds ", seqs[b].k.size(), " and V ", seqs[b].v.size(),
          " floats; length ", seqs[b].length, " x ", num_kv_heads, " heads x ", head_dim,
          " needs ", want));
    }
    lengths[b] = seqs[b].length;
    max_length = std::max(max_length, seqs[b].length);
  }
  const absl::Status s =
      CheckDecodeSpans(batch, num_kv_heads, head_dim, queries, outputs, max_length);
  if (!s.ok()) return s;
  if (!outputs.page_weight.empty()) {
    return absl::InvalidArgumentError("page_weight needs pages; dense K/V have none");
  }
  AttendBatch(
      batch, num_kv_heads, head_dim, queries, outputs, lengths, /*block_tokens=*/1,
      [&](int64_t b) {
        return DenseRows{seqs[b].k.data(), seqs[b].v.data(), num_kv_heads, head_dim};
      },
      [](int64_t) -> float* { return nullptr; });
  return absl::OkStatus();
}

}  // namespace kvtier
