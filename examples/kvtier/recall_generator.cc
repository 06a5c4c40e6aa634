#include "examples/kvtier/recall_generator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/codec/half.h"
#include "src/status_macros.h"

namespace kvtier::tool {
namespace {

uint64_t SplitMix(uint64_t* x) {
  uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Dot(const float* a, const float* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Moves `k` by the least-norm change that makes q_i . k = target[i] for each of the `n` rows
// of `q` (row i at q + i * dim). Falls back to the single constraint `own` when the rows are
// linearly dependent.
void ShiftToLogits(const float* q, int n, int dim, const std::vector<double>& target, int own,
                   float* k) {
  std::vector<double> m(static_cast<size_t>(n) * n), r(n);
  for (int i = 0; i < n; ++i) {
    r[i] = target[i] - Dot(q + static_cast<size_t>(i) * dim, k, dim);
    for (int j = 0; j < n; ++j) {
      m[i * n + j] = Dot(q + static_cast<size_t>(i) * dim, q + static_cast<size_t>(j) * dim, dim);
    }
  }
  // Gaussian elimination with partial pivoting on [m | r].
  double largest = 0;
  for (int i = 0; i < n; ++i) largest = std::max(largest, m[i * n + i]);
  bool singular = !(largest > 0);
  for (int c = 0; c < n && !singular; ++c) {
    int pivot = c;
    for (int i = c + 1; i < n; ++i) {
      if (std::fabs(m[i * n + c]) > std::fabs(m[pivot * n + c])) pivot = i;
    }
    if (!(std::fabs(m[pivot * n + c]) > 1e-9 * largest)) {
      singular = true;
      break;
    }
    if (pivot != c) {
      for (int j = 0; j < n; ++j) std::swap(m[c * n + j], m[pivot * n + j]);
      std::swap(r[c], r[pivot]);
    }
    for (int i = c + 1; i < n; ++i) {
      const double f = m[i * n + c] / m[c * n + c];
      for (int j = c; j < n; ++j) m[i * n + j] -= f * m[c * n + j];
      r[i] -= f * r[c];
    }
  }
  std::vector<double> a(n, 0.0);
  if (!singular) {
    for (int i = n - 1; i >= 0; --i) {
      double s = r[i];
      for (int j = i + 1; j < n; ++j) s -= m[i * n + j] * a[j];
      a[i] = s / m[i * n + i];
    }
  } else {
    const float* qo = q + static_cast<size_t>(own) * dim;
    a[own] = (target[own] - Dot(qo, k, dim)) / Dot(qo, qo, dim);
  }
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < dim; ++d) k[d] += static_cast<float>(a[i] * q[static_cast<size_t>(i) * dim + d]);
  }
}

// InvalidArgument when the trial's keys, values (in FP16) or queries are not all finite: the
// generator's margins and gains too large for FP16, or a query the planting divides by.
absl::Status CheckFinite(const Trial& t) {
  for (const std::vector<float>* x : {&t.k, &t.v, &t.q}) {
    if (!std::all_of(x->begin(), x->end(), [](float f) { return std::isfinite(f); })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the trial's ", x == &t.q ? "queries are" : x == &t.k ? "keys are" : "values are",
          " not finite", x == &t.q ? "" : " in FP16",
          ": --margin, --sink-margin, --logit-std or --outlier-gain too large"));
    }
  }
  return absl::OkStatus();
}

// Synthetic keys (rotated) and values of one KV head into the trial arrays.
void SynthesizeHead(const GeneratorOptions& o, int h, const std::vector<float>& cos_sin, Rng& rng,
                    Trial* t) {
  const int dim = t->head_dim, half = dim / 2;
  std::vector<double> mean(dim), gain(dim, 1.0);
  for (int c = 0; c < dim; ++c) mean[c] = 0.25 * rng.Normal();
  for (int n = 0; n < std::min(o.outlier_channels, dim); ++n) {
    int c;
    do c = static_cast<int>(rng.Below(dim)); while (gain[c] != 1.0);
    gain[c] = o.outlier_gain_min * std::pow(o.outlier_gain_max / o.outlier_gain_min, rng.Uniform());
    if (gain[c] == 1.0) gain[c] = 1.0 + 1e-6;  // still marks the channel as taken
    mean[c] = (rng.Uniform() < 0.5 ? -1 : 1) * (1.0 + rng.Uniform());
  }
  std::vector<float> x(dim);
  for (int64_t p = 0; p < t->length; ++p) {
    for (int c = 0; c < dim; ++c) x[c] = static_cast<float>(gain[c] * (mean[c] + rng.Normal()));
    float* k = t->k.data() + (static_cast<size_t>(p) * t->kv_heads + h) * dim;
    const float* cs = cos_sin.data() + static_cast<size_t>(p) * dim;  // cos[half], sin[half]
    for (int i = 0; i < half; ++i) {
      k[i] = x[i] * cs[i] - x[i + half] * cs[half + i];
      k[i + half] = x[i + half] * cs[i] + x[i] * cs[half + i];
    }
    float* v = t->v.data() + (static_cast<size_t>(p) * t->kv_heads + h) * dim;
    for (int c = 0; c < dim; ++c) v[c] = static_cast<float>(rng.Normal() * std::exp(0.5 * rng.Normal()));
  }
}

// ---- The steps of GenerateTrial, in the order it takes them (each draws from `rng` in turn,
// so the order is part of the output) ----

// The trial's shape and the generator options; `t` holds kv_heads, head_dim, group and length.
absl::Status CheckShape(const GeneratorOptions& o, absl::Span<const double> depths, const Trial& t) {
  const int dim = t.head_dim, group = t.group;
  if (dim < 16 || dim % 16 != 0 || t.kv_heads < 1 || group < 1 || group > 64) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", dim, ", kv_heads ", t.kv_heads,
                                                   " and ", group, " depths are out of range"));
  }
  for (double d : depths) {
    if (!(d >= 0 && d <= 1)) return absl::InvalidArgumentError("depths must be in [0, 1]");
  }
  if (!(o.cos_min >= -1 && o.cos_min <= o.cos_max && o.cos_max <= 1) || o.distractors < 0 ||
      o.min_sinks < 0 || o.min_sinks > o.max_sinks || !(o.logit_std > 0)) {
    return absl::InvalidArgumentError("generator options out of range");
  }
  return absl::OkStatus();
}

// Room for every sink, needle and distractor (`t.sinks` drawn), and within the dump if any.
absl::Status CheckLength(const GeneratorOptions& o, const Trial& t) {
  const int64_t length = t.length;
  const int64_t specials = t.sinks + static_cast<int64_t>(t.group) * (1 + o.distractors);
  if (length < 2 * specials + 16 || (o.dump && length > o.dump->tokens)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a trial of ", length, " tokens cannot hold ", specials, " special tokens",
        o.dump ? absl::StrCat(" or exceeds the dump's ", o.dump->tokens, " tokens") : ""));
  }
  return absl::OkStatus();
}

// RoPE's cos and sin per position: [length][cos[head_dim / 2], sin[head_dim / 2]].
std::vector<float> RopeTable(double base, int64_t length, int dim) {
  const int half = dim / 2;
  std::vector<float> cos_sin(static_cast<size_t>(length) * dim);
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(base, -2.0 * i / dim);
    for (int64_t p = 0; p < length; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      cos_sin[p * dim + i] = static_cast<float>(std::cos(angle));
      cos_sin[p * dim + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return cos_sin;
}

// Keys and values of the haystack: a window of the dump, or synthetic heads.
void FillHaystack(const GeneratorOptions& o, Rng& rng, Trial* t) {
  const int64_t length = t->length;
  const size_t row = static_cast<size_t>(t->kv_heads) * t->head_dim;
  t->k.resize(length * row);
  t->v.resize(length * row);
  if (o.dump) {
    const int64_t start = rng.Below(o.dump->tokens - length + 1);
    std::copy_n(o.dump->k.begin() + start * row, length * row, t->k.begin());
    std::copy_n(o.dump->v.begin() + start * row, length * row, t->v.begin());
  } else {
    const std::vector<float> cos_sin = RopeTable(o.rope_base, length, t->head_dim);
    for (int h = 0; h < t->kv_heads; ++h) SynthesizeHead(o, h, cos_sin, rng, t);
  }
}

// Unscaled query directions: the user's rows in turn (from a random one), or Gaussian.
void DrawQueries(const GeneratorOptions& o, Rng& rng, Trial* t) {
  const int dim = t->head_dim, q_heads = t->kv_heads * t->group;
  t->q.resize(static_cast<size_t>(q_heads) * dim);
  const int64_t query_offset = o.queries ? rng.Below(o.queries->shape[0]) : 0;
  for (int i = 0; i < q_heads; ++i) {
    float* q = t->q.data() + static_cast<size_t>(i) * dim;
    if (o.queries) {
      const int64_t r = (query_offset + i) % o.queries->shape[0];
      std::copy_n(o.queries->data.begin() + r * dim, dim, q);
    } else {
      for (int d = 0; d < dim; ++d) q[d] = static_cast<float>(rng.Normal());
    }
  }
}

// The haystack positions the statistics are measured on: all of them up to 4096, else 4096
// random ones.
std::vector<int64_t> SamplePositions(int64_t length, Rng& rng) {
  const int64_t samples = std::min<int64_t>(length, 4096);
  std::vector<int64_t> sample(samples);
  for (int64_t s = 0; s < samples; ++s) {
    sample[s] = samples == length ? s : rng.Below(length);
  }
  return sample;
}

// Scales each query so that its haystack logits have std `logit_std`; records their mean and
// std in t->stats.
void ScaleQueries(const GeneratorOptions& o, const std::vector<int64_t>& sample, Trial* t) {
  const int dim = t->head_dim, group = t->group, q_heads = t->kv_heads * group;
  const size_t row = static_cast<size_t>(t->kv_heads) * dim;
  const int64_t samples = static_cast<int64_t>(sample.size());
  t->stats.resize(q_heads);
  for (int i = 0; i < q_heads; ++i) {
    float* q = t->q.data() + static_cast<size_t>(i) * dim;
    const int h = i / group;
    double sum = 0, sum2 = 0;
    for (int64_t p : sample) {
      const double l = Dot(q, t->k.data() + p * row + h * dim, dim);
      sum += l;
      sum2 += l * l;
    }
    const double mean = sum / samples;
    const double sd = std::sqrt(std::max(sum2 / samples - mean * mean, 1e-30));
    const double f = o.logit_std / (sd * t->softmax_scale);
    for (int d = 0; d < dim; ++d) q[d] = static_cast<float>(q[d] * f);
    t->stats[i] = QueryStats{mean * f * t->softmax_scale, o.logit_std};
  }
}

// The haystack's mean key per KV head, over the sample: q . mean_key is the mean logit.
void SetMeanKey(const std::vector<int64_t>& sample, Trial* t) {
  const int dim = t->head_dim;
  const size_t row = static_cast<size_t>(t->kv_heads) * dim;
  const int64_t samples = static_cast<int64_t>(sample.size());
  t->key_mean.assign(row, 0.f);
  for (int h = 0; h < t->kv_heads; ++h) {
    std::vector<double> m(dim, 0.0);
    for (int64_t p : sample) {
      for (int d = 0; d < dim; ++d) m[d] += t->k[p * row + h * dim + d];
    }
    for (int d = 0; d < dim; ++d) t->key_mean[h * dim + d] = static_cast<float>(m[d] / samples);
  }
}

// The needle position of each depth (shared by the KV heads), marked in `taken`.
std::vector<int64_t> PlaceNeedles(absl::Span<const double> depths, const Trial& t,
                                  std::vector<char>* taken) {
  const int64_t length = t.length;
  std::vector<int64_t> needle_at(t.group);
  for (int j = 0; j < t.group; ++j) {
    int64_t p = NeedlePosition(depths[j], length, t.sinks);
    for (int64_t step = 1; (*taken)[p]; ++step) {  // two depths on one token: use the nearest free
      const int64_t a = p + step, b = p - step;
      p = a < length && !(*taken)[a] ? a : (b >= t.sinks && !(*taken)[b] ? b : p);
    }
    (*taken)[p] = 1;
    needle_at[j] = p;
  }
  return needle_at;
}

float* KeyAt(Trial* t, int64_t p, int h) {
  return t->k.data() + p * static_cast<size_t>(t->kv_heads) * t->head_dim +
         static_cast<size_t>(h) * t->head_dim;
}

float* ValueAt(Trial* t, int64_t p, int h) {
  return t->v.data() + p * static_cast<size_t>(t->kv_heads) * t->head_dim +
         static_cast<size_t>(h) * t->head_dim;
}

// Sinks of KV head h: every query of the group attends them strongly; their values shrink.
void PlantSinks(const GeneratorOptions& o, int h, Trial* t) {
  const int dim = t->head_dim, group = t->group;
  const float* qh = t->q.data() + static_cast<size_t>(h) * group * dim;
  std::vector<double> target(group);
  for (int s = 0; s < t->sinks; ++s) {
    for (int j = 0; j < group; ++j) {
      const QueryStats& st = t->stats[h * group + j];
      target[j] = (st.mean + o.sink_margin * st.std) / t->softmax_scale;
    }
    ShiftToLogits(qh, group, dim, target, 0, KeyAt(t, s, h));
    for (int d = 0; d < dim; ++d) ValueAt(t, s, h)[d] *= 0.1f;
  }
}

// Distractors of needle j of KV head h, at free positions (marked in `used`): centred on the
// haystack's mean key, cosine c to the centred needle, the rest of the direction orthogonal to
// the needle and to the needle's query, so that their logit for that query is exactly
// mean + c * (needle - mean).
void PlantDistractors(const GeneratorOptions& o, int h, int j, Rng& rng, std::vector<char>* used,
                      Trial* t) {
  const int dim = t->head_dim, i = h * t->group + j;
  const int64_t length = t->length;
  const float* k = KeyAt(t, t->needle[i], h);
  const float* mk = t->key_mean.data() + static_cast<size_t>(h) * dim;
  const float* qj = t->q.data() + static_cast<size_t>(i) * dim;
  std::vector<float> centred(dim), w(dim);
  for (int d = 0; d < dim; ++d) centred[d] = k[d] - mk[d];
  const double norm = std::sqrt(Dot(centred.data(), centred.data(), dim));
  for (int n = 0; n < o.distractors; ++n) {
    int64_t at;
    do at = t->sinks + rng.Below(length - t->sinks); while ((*used)[at]);
    (*used)[at] = 1;
    t->distractor_positions[i].push_back(at);
    const double c = o.cos_min + (o.cos_max - o.cos_min) * rng.Uniform();
    // w starts as the centred key of a random haystack token, so that the distractor looks
    // like haystack to every other query.
    int64_t from;
    do from = t->sinks + rng.Below(length - t->sinks); while ((*used)[from]);
    for (int d = 0; d < dim; ++d) w[d] = KeyAt(t, from, h)[d] - mk[d];
    // Gram-Schmidt against the centred needle, then against the part of q orthogonal to it.
    std::vector<float> qo(qj, qj + dim);
    const double qa = Dot(qo.data(), centred.data(), dim) / (norm * norm);
    for (int d = 0; d < dim; ++d) qo[d] -= static_cast<float>(qa * centred[d]);
    const double qn2 = Dot(qo.data(), qo.data(), dim);
    const double wa = Dot(w.data(), centred.data(), dim) / (norm * norm);
    for (int d = 0; d < dim; ++d) w[d] -= static_cast<float>(wa * centred[d]);
    const double wq = qn2 > 0 ? Dot(w.data(), qo.data(), dim) / qn2 : 0.0;
    for (int d = 0; d < dim; ++d) w[d] -= static_cast<float>(wq * qo[d]);
    const double wn = std::sqrt(Dot(w.data(), w.data(), dim));
    float* kd = KeyAt(t, at, h);
    for (int d = 0; d < dim; ++d) {
      kd[d] = static_cast<float>(mk[d] + c * centred[d] + std::sqrt(1 - c * c) * norm * w[d] / wn);
    }
  }
}

// KV head h's sinks, then each needle (its logit raised for its own query, the others' kept)
// followed by its distractors. `taken` marks the sinks and needles.
void PlantHead(const GeneratorOptions& o, int h, const std::vector<int64_t>& needle_at,
               const std::vector<char>& taken, Rng& rng, Trial* t) {
  const int dim = t->head_dim, group = t->group;
  const float* qh = t->q.data() + static_cast<size_t>(h) * group * dim;
  std::vector<char> used = taken;
  std::vector<double> target(group);
  PlantSinks(o, h, t);
  for (int j = 0; j < group; ++j) {
    const int i = h * group + j;
    const int64_t p = needle_at[j];
    t->needle[i] = p;
    float* k = KeyAt(t, p, h);
    for (int m = 0; m < group; ++m) target[m] = Dot(qh + static_cast<size_t>(m) * dim, k, dim);
    target[j] = (t->stats[i].mean + o.margin * t->stats[i].std) / t->softmax_scale;
    ShiftToLogits(qh, group, dim, target, j, k);
    PlantDistractors(o, h, j, rng, &used, t);
  }
}

// FP16, the precision the cache is written in: the float copies keep the rounded values.
void RoundToHalf(Trial* t) {
  t->k_half.resize(t->k.size());
  t->v_half.resize(t->v.size());
  for (size_t i = 0; i < t->k.size(); ++i) {
    t->k_half[i] = codec::FloatToHalf(t->k[i]);
    t->k[i] = codec::HalfToFloat(t->k_half[i]);
    t->v_half[i] = codec::FloatToHalf(t->v[i]);
    t->v[i] = codec::HalfToFloat(t->v_half[i]);
  }
}

}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = SplitMix(&seed);
}

uint64_t Rng::Next() {
  auto rotl = [](uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1p-53; }

double Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, s;
  do {
    u = 2 * Uniform() - 1;
    v = 2 * Uniform() - 1;
    s = u * u + v * v;
  } while (s >= 1 || s == 0);
  const double f = std::sqrt(-2 * std::log(s) / s);
  spare_ = v * f;
  has_spare_ = true;
  return u * f;
}

int64_t Rng::Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

uint64_t MixSeed(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b * 0xD6E8FEB86659FD93ull);
  return SplitMix(&x);
}

int64_t NeedlePosition(double depth, int64_t length, int32_t sinks) {
  const int64_t span = length - 1 - sinks;
  return sinks + static_cast<int64_t>(std::llround(depth * static_cast<double>(span)));
}

absl::StatusOr<Trial> GenerateTrial(const GeneratorOptions& o, int64_t length,
                                    absl::Span<const double> depths, uint64_t seed) {
  Trial t;
  t.kv_heads = o.dump ? o.dump->kv_heads : o.kv_heads;
  t.head_dim = o.dump ? o.dump->head_dim : o.head_dim;
  t.group = static_cast<int32_t>(depths.size());
  t.length = length;
  KVTIER_RETURN_IF_ERROR(CheckShape(o, depths, t));
  Rng rng(seed);
  t.sinks = o.dump ? 0 : o.min_sinks + static_cast<int32_t>(rng.Below(o.max_sinks - o.min_sinks + 1));
  KVTIER_RETURN_IF_ERROR(CheckLength(o, t));
  t.softmax_scale = 1.f / std::sqrt(static_cast<float>(t.head_dim));
  FillHaystack(o, rng, &t);
  DrawQueries(o, rng, &t);
  const std::vector<int64_t> sample = SamplePositions(length, rng);
  ScaleQueries(o, sample, &t);
  SetMeanKey(sample, &t);
  std::vector<char> taken(length, 0);
  for (int s = 0; s < t.sinks; ++s) taken[s] = 1;
  const std::vector<int64_t> needle_at = PlaceNeedles(depths, t, &taken);
  t.needle.resize(static_cast<size_t>(t.kv_heads) * t.group);
  t.distractor_positions.resize(t.needle.size());
  for (int h = 0; h < t.kv_heads; ++h) PlantHead(o, h, needle_at, taken, rng, &t);
  RoundToHalf(&t);
  KVTIER_RETURN_IF_ERROR(CheckFinite(t));
  return t;
}

}  // namespace kvtier::tool
