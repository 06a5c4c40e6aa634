#include "src/attention/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/page_codec.h"

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

// The attention math of one (sequence, KV head) for its `group` query heads. `Rows` provides
// Key(t, head, buf) and Value(t, head, buf), each returning a pointer to head_dim floats (buf or
// the source's own memory).
template <typename Rows>
void AttendHead(const Rows& rows, int64_t length, int kv_head, int head_dim, const float* q,
                int group, double scale, float* out, float* lse, float* logits,
                int64_t logits_stride, Scratch* s) {
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
    if (logits != nullptr) {
      float* l = logits + g * logits_stride;
      for (int64_t t = 0; t < length; ++t) l[t] = static_cast<float>(w[t]);
      for (int64_t t = length; t < logits_stride; ++t) l[t] = -INFINITY;
    }
    double m = kNegInf;
    for (int64_t t = 0; t < length; ++t) m = std::max(m, w[t]);
    double sum = 0;
    for (int64_t t = 0; t < length; ++t) {
      w[t] = std::exp(w[t] - m);
      sum += w[t];
    }
    sums[g] = sum;
    lse[g] = length > 0 ? static_cast<float>(m + std::log(sum)) : -INFINITY;
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
      out[g * head_dim + d] =
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

absl::Status CheckQueries(int64_t batch, int32_t num_kv_heads, int32_t head_dim,
                          const DecodeQueries& q, const DecodeOutputs& o,
                          int64_t max_length) {
  if (num_kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads ", num_kv_heads, " and head_dim ", head_dim, " must be >= 1"));
  }
  if (q.num_q_heads < 1 || q.num_q_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_q_heads ", q.num_q_heads,
                                                   " is not a positive multiple of num_kv_heads ",
                                                   num_kv_heads));
  }
  if (!std::isfinite(q.softmax_scale)) {
    return absl::InvalidArgumentError("softmax_scale is not finite");
  }
  const size_t rows = static_cast<size_t>(batch) * q.num_q_heads;
  const size_t want = rows * head_dim;
  if (q.q.size() != want || o.out.size() != want || o.lse.size() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q holds ", q.q.size(), ", out ", o.out.size(), " and lse ", o.lse.size(),
        " floats; batch ", batch, " x ", q.num_q_heads, " heads x head_dim ", head_dim, " needs ",
        want, ", ", want, " and ", rows));
  }
  if (!o.logits.empty()) {
    if (o.logits_stride < max_length ||
        o.logits.size() != rows * static_cast<size_t>(o.logits_stride)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logits hold ", o.logits.size(), " floats with stride ", o.logits_stride,
          "; need batch x heads x stride with stride >= the longest sequence (", max_length,
          ")"));
    }
  }
  return absl::OkStatus();
}

template <typename RowsOf>
void AttendBatch(int64_t batch, int32_t num_kv_heads, int32_t head_dim, const DecodeQueries& q,
                 const DecodeOutputs& o, absl::Span<const int64_t> lengths, RowsOf rows_of) {
  Scratch scratch;
  const int group = q.num_q_heads / num_kv_heads;
  for (int64_t b = 0; b < batch; ++b) {
    const auto rows = rows_of(b);
    for (int h = 0; h < num_kv_heads; ++h) {
      const size_t first = static_cast<size_t>(b) * q.num_q_heads + static_cast<size_t>(h) * group;
      float* logits = o.logits.empty() ? nullptr : o.logits.data() + first * o.logits_stride;
      AttendHead(rows, lengths[b], h, head_dim, q.q.data() + first * head_dim, group,
                 q.softmax_scale, o.out.data() + first * head_dim, o.lse.data() + first, logits,
                 o.logits_stride, &scratch);
    }
  }
}

}  // namespace

absl::StatusOr<PagedLayer> GetPagedLayer(const Cache& cache, int32_t layer) {
  const Options& options = cache.options();
  const Geometry& g = options.geometry;
  PagedLayer kv;
  kv.num_kv_heads = g.num_kv_heads;
  kv.head_dim = g.head_dim;
  kv.block_tokens = g.block_tokens;
  for (size_t f = 0; f < options.palette.size(); ++f) {
    absl::StatusOr<PoolInfo> pool = cache.GetPool(static_cast<int32_t>(f), layer);
    if (!pool.ok()) return pool.status();
    PagedLayer::Format format;
    format.base = static_cast<const uint8_t*>(pool->base);
    format.capacity_pages = pool->capacity_pages;
    format.layout = MakePageLayout(g.num_kv_heads, g.block_tokens, g.head_dim, options.palette[f]);
    format.k_tensor_scale = pool->k_tensor_scale;
    format.v_tensor_scale = pool->v_tensor_scale;
    if (format.layout.page_bytes != pool->page_bytes) {
      return absl::InternalError(absl::StrCat("format ", f, ": pool pages of ", pool->page_bytes,
                                              " bytes, layout of ", format.layout.page_bytes));
    }
    kv.formats.push_back(format);
  }
  return kv;
}

absl::StatusOr<TableExtent> CheckPageTables(const PageTables& tables, int32_t block_tokens,
                                            size_t palette_size) {
  const int64_t batch = static_cast<int64_t>(tables.seq_lens.size());
  if (tables.packed_indptr.size() != static_cast<size_t>(batch) + 1 ||
      tables.packed_indptr[0] != 0 ||
      static_cast<size_t>(tables.packed_indptr.back()) != tables.packed.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed_indptr has ", tables.packed_indptr.size(), " entries for ", batch,
        " sequences and ", tables.packed.size(), " packed pages"));
  }
  if (block_tokens < 1 || palette_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("an empty palette or block_tokens ", block_tokens, " < 1"));
  }
  TableExtent extent;
  extent.batch = batch;
  extent.max_page.assign(palette_size, -1);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = tables.packed_indptr[b + 1] - tables.packed_indptr[b];
    const int64_t len = tables.seq_lens[b];
    if (pages < 0 || len < 0 || (len + block_tokens - 1) / block_tokens != pages) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b, " has ", len, " tokens in ",
                                                     pages, " pages of ", block_tokens));
    }
    for (int32_t i = tables.packed_indptr[b]; i < tables.packed_indptr[b + 1]; ++i) {
      const uint32_t f = PackedFormat(tables.packed[i]);
      if (f >= palette_size) {
        return absl::InvalidArgumentError(absl::StrCat("packed entry ", i, " names format ", f,
                                                       ", outside the palette of ", palette_size));
      }
      extent.max_page[f] = std::max<int64_t>(extent.max_page[f], PackedPage(tables.packed[i]));
    }
    extent.max_length = std::max(extent.max_length, len);
    extent.max_pages = std::max(extent.max_pages, static_cast<int32_t>(pages));
  }
  return extent;
}

absl::Status CheckDecodeCall(const PagedLayer& kv, const TableExtent& extent,
                             const DecodeQueries& queries, const DecodeOutputs& outputs) {
  if (extent.max_page.size() != kv.formats.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tables were checked for a palette of ", extent.max_page.size(),
                     " formats, the layer has ", kv.formats.size()));
  }
  for (size_t f = 0; f < kv.formats.size(); ++f) {
    if (extent.max_page[f] < 0) continue;
    if (kv.formats[f].base == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tables name pages of format ", f, ", whose pool is not mapped"));
    }
    if (extent.max_page[f] >= kv.formats[f].capacity_pages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tables name page ", extent.max_page[f], " of format ", f, ", outside its pool of ",
          kv.formats[f].capacity_pages, " pages"));
    }
  }
  return CheckQueries(extent.batch, kv.num_kv_heads, kv.head_dim, queries, outputs,
                      extent.max_length);
}

absl::Status ValidatePagedDecode(const PagedLayer& kv, const PageTables& tables,
                                 const DecodeQueries& queries, const DecodeOutputs& outputs) {
  absl::StatusOr<TableExtent> extent = CheckPageTables(tables, kv.block_tokens, kv.formats.size());
  if (!extent.ok()) return extent.status();
  return CheckDecodeCall(kv, *extent, queries, outputs);
}

absl::Status PagedDecodeAttention(const PagedLayer& kv, const PageTables& tables,
                                  const DecodeQueries& queries, const DecodeOutputs& outputs) {
  const absl::Status s = ValidatePagedDecode(kv, tables, queries, outputs);
  if (!s.ok()) return s;
  const int64_t batch = static_cast<int64_t>(tables.seq_lens.size());
  std::vector<int64_t> lengths(tables.seq_lens.begin(), tables.seq_lens.end());
  AttendBatch(batch, kv.num_kv_heads, kv.head_dim, queries, outputs, lengths, [&](int64_t b) {
    return PagedRows{&kv, tables.packed.data() + tables.packed_indptr[b]};
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
    const size_t want = static_cast<size_t>(std::max<int64_t>(seqs[b].length, 0)) *
                        std::max(num_kv_heads, 0) * std::max(head_dim, 0);
    if (seqs[b].length < 0 || seqs[b].k.size() != want || seqs[b].v.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", b, ": K holds ", seqs[b].k.size(), " and V ", seqs[b].v.size(),
          " floats; length ", seqs[b].length, " x ", num_kv_heads, " heads x ", head_dim,
          " needs ", want));
    }
    lengths[b] = seqs[b].length;
    max_length = std::max(max_length, seqs[b].length);
  }
  const absl::Status s = CheckQueries(batch, num_kv_heads, head_dim, queries, outputs, max_length);
  if (!s.ok()) return s;
  AttendBatch(batch, num_kv_heads, head_dim, queries, outputs, lengths, [&](int64_t b) {
    return DenseRows{seqs[b].k.data(), seqs[b].v.data(), num_kv_heads, head_dim};
  });
  return absl::OkStatus();
}

absl::Status ValidateMergeStates(size_t out_a, size_t lse_a, size_t out_b, size_t lse_b,
                                 int64_t rows, int32_t head_dim, size_t out, size_t lse) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(rows, 0));
  const size_t nd = n * static_cast<size_t>(std::max(head_dim, 0));
  if (rows < 0 || head_dim < 1 || out_a != nd || out_b != nd || out != nd || lse_a != n ||
      lse_b != n || lse != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MergeStates: ", rows, " rows x head_dim ", head_dim, " need outputs of ", nd,
        " floats and LSEs of ", n, "; got ", out_a, "/", out_b, "/", out, " and ", lse_a, "/",
        lse_b, "/", lse));
  }
  return absl::OkStatus();
}

absl::Status MergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                         absl::Span<const float> out_b, absl::Span<const float> lse_b,
                         int64_t rows, int32_t head_dim, absl::Span<float> out,
                         absl::Span<float> lse) {
  const absl::Status s = ValidateMergeStates(out_a.size(), lse_a.size(), out_b.size(),
                                             lse_b.size(), rows, head_dim, out.size(), lse.size());
  if (!s.ok()) return s;
  const size_t n = static_cast<size_t>(rows);
  for (size_t r = 0; r < n; ++r) {
    const double sa = lse_a[r], sb = lse_b[r];
    const double m = std::max(sa, sb);
    if (m == kNegInf || std::isnan(m)) {
      for (int d = 0; d < head_dim; ++d) out[r * head_dim + d] = std::isnan(m) ? NAN : 0.f;
      lse[r] = static_cast<float>(m);
      continue;
    }
    const double wa = std::exp(sa - m), wb = std::exp(sb - m);  // exp(-inf) = 0
    const double total = wa + wb;
    for (int d = 0; d < head_dim; ++d) {
      const size_t i = r * head_dim + d;
      const double a = wa > 0 ? wa * out_a[i] : 0.0;
      const double b = wb > 0 ? wb * out_b[i] : 0.0;
      out[i] = static_cast<float>((a + b) / total);
    }
    lse[r] = static_cast<float>(m + std::log(total));
  }
  return absl::OkStatus();
}

}  // namespace kvtier
