// The smallest engine step through the installed package (CI builds it against `cmake
// --install`): one sequence of one layer written and read back, one decode step attended with
// the public attention API (PreparedDecode and DecodeAttention, CPU backend) and checked against
// a hand computation and the dense reference, and the sequence's pages handed to FlashInfer's
// adapter, whose paged_kv_cache view must address exactly the values written.
// Prints what it checked; exits 1 on the first failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "kvtier/adapters/flashinfer.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/reference_attention.h"

namespace {

constexpr int kHeads = 2;   // KV heads
constexpr int kQHeads = 4;  // query heads: GQA groups of 2
constexpr int kDim = 64;
constexpr int kBlock = 16;
constexpr int kTokens = 20;  // one full page and a tail of 4

bool Ok(const absl::Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "embed: %s: %s\n", what, s.ToString().c_str());
  return s.ok();
}

bool Expect(bool condition, const char* what) {
  if (!condition) std::fprintf(stderr, "embed: check failed: %s\n", what);
  return condition;
}

// K or V of (token, head, dim): multiples of 1/8 in [-1/2, 1/2], exact in BF16 and FP16.
float Value(int t, int h, int d, bool key) {
  return static_cast<float>((t * 7 + h * 5 + d * 3 + (key ? 1 : 4)) % 9 - 4) / 8.f;
}

uint16_t Bf16Bits(float x) {  // exact for the values above
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<uint16_t>(u >> 16);
}

float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                                        : std::ldexp(1.f + mantissa / 1024.f, exponent - 15);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Attention of one query head over the written K/V, in double: the hand computation.
void Attend(const float* q, int kv_head, float scale, double* out, double* lse) {
  double logits[kTokens], sum = 0, m = -INFINITY;
  for (int t = 0; t < kTokens; ++t) {
    double dot = 0;
    for (int d = 0; d < kDim; ++d) dot += double{q[d]} * Value(t, kv_head, d, true);
    logits[t] = scale * dot;
    m = std::fmax(m, logits[t]);
  }
  for (int t = 0; t < kTokens; ++t) sum += std::exp(logits[t] - m);
  *lse = m + std::log(sum);
  for (int d = 0; d < kDim; ++d) {
    out[d] = 0;
    for (int t = 0; t < kTokens; ++t) {
      out[d] += std::exp(logits[t] - *lse) * Value(t, kv_head, d, false);
    }
  }
}

// Writes the sequence (BF16 input, FP16 pages) and checks ReadKV returns it exactly.
bool WriteAndRead(kvtier::Cache& cache, kvtier::SequenceId seq) {
  std::vector<int64_t> slots;
  if (!Ok(cache.Append(seq, kTokens, &slots), "Append")) return false;
  std::vector<uint16_t> k, v;
  for (int t = 0; t < kTokens; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      for (int d = 0; d < kDim; ++d) {
        k.push_back(Bf16Bits(Value(t, h, d, true)));
        v.push_back(Bf16Bits(Value(t, h, d, false)));
      }
    }
  }
  const kvtier::KVInput input{kvtier::DType::kBFloat16, k.data(), v.data(), kTokens, kHeads, kDim};
  if (!Ok(cache.WriteKV(0, slots, input), "WriteKV")) return false;
  std::vector<float> rk(k.size()), rv(v.size());
  if (!Ok(cache.ReadKV(seq, 0, absl::MakeSpan(rk), absl::MakeSpan(rv)), "ReadKV")) return false;
  bool same = true;
  for (size_t i = 0; i < rk.size(); ++i) {
    const int t = static_cast<int>(i / (kHeads * kDim)), h = static_cast<int>(i / kDim % kHeads);
    same = same && rk[i] == Value(t, h, static_cast<int>(i % kDim), true) &&
           rv[i] == Value(t, h, static_cast<int>(i % kDim), false);
  }
  std::printf("embed: wrote %d tokens and read them back\n", kTokens);
  return Expect(same, "ReadKV returns the values written");
}

// One decode step through PreparedDecode and DecodeAttention, against the hand computation
// (to 1e-5) and against DenseDecodeAttention over ReadKV (bit-identical: the same math).
bool DecodeStep(const kvtier::Cache& cache, kvtier::SequenceId seq,
                const kvtier::PageTables& tables) {
  std::vector<float> q(kQHeads * kDim), out(q.size()), lse(kQHeads);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 16.f;
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  const kvtier::DecodeQueries queries{q, kQHeads, scale};
  absl::StatusOr<kvtier::PreparedDecode> step = kvtier::PreparedDecode::Create(cache, tables);
  if (!Ok(step.status(), "PreparedDecode::Create")) return false;
  const kvtier::DecodeOutputs outputs{absl::MakeSpan(out), absl::MakeSpan(lse), {}, 0};
  if (!Ok(kvtier::DecodeAttention(cache, 0, *step, queries, outputs), "DecodeAttention")) {
    return false;
  }
  double worst = 0;
  for (int h = 0; h < kQHeads; ++h) {
    double want[kDim], want_lse;
    Attend(q.data() + h * kDim, h / (kQHeads / kHeads), scale, want, &want_lse);
    worst = std::fmax(worst, std::fabs(lse[h] - want_lse));
    for (int d = 0; d < kDim; ++d) worst = std::fmax(worst, std::fabs(out[h * kDim + d] - want[d]));
  }
  std::vector<float> k(kTokens * kHeads * kDim), v(k.size()), dense(out.size()), dense_lse(kQHeads);
  if (!Ok(cache.ReadKV(seq, 0, absl::MakeSpan(k), absl::MakeSpan(v)), "ReadKV")) return false;
  const kvtier::DenseSequence sequence{k, v, kTokens};
  if (!Ok(kvtier::DenseDecodeAttention({sequence}, kHeads, kDim, queries,
                                       kvtier::DecodeOutputs{absl::MakeSpan(dense),
                                                             absl::MakeSpan(dense_lse), {}, 0, {}}),
          "DenseDecodeAttention")) {
    return false;
  }
  std::printf("embed: DecodeAttention over %d tokens, %d query heads: worst difference from the "
              "hand computation %.1e\n", kTokens, kQHeads, worst);
  return Expect(worst < 1e-5, "DecodeAttention matches the hand computation") &&
         Expect(out == dense && lse == dense_lse, "DecodeAttention equals DenseDecodeAttention");
}

// FlashInfer's tables and paged_kv_cache view: one part (the FP16 format) with the sequence's
// two pages, the tail holding 4 tokens, and every K/V element of the view equal to the value
// written.
bool FlashInferView(const kvtier::Cache& cache, const kvtier::PageTables& tables) {
  absl::StatusOr<std::vector<kvtier::FormatPart>> parts =
      kvtier::BuildFlashInferParts(cache.options(), tables);
  if (!Ok(parts.status(), "BuildFlashInferParts")) return false;
  if (!Expect(parts->size() == 1 && (*parts)[0].indptr == std::vector<int32_t>{0, 2} &&
                  (*parts)[0].last_page_len == std::vector<int32_t>{kTokens - kBlock},
              "one FlashInfer part of 2 pages, the last holding 4 tokens")) {
    return false;
  }
  absl::StatusOr<kvtier::FlashInferLayer> layer = kvtier::GetFlashInferLayer(cache, 0, 0);
  if (!Ok(layer.status(), "GetFlashInferLayer")) return false;
  const kvtier::TensorView& kv = layer->kv;
  if (!Expect(kv.dtype == kvtier::ViewDType::kFloat16 && kv.shape.size() == 5 &&
                  kv.shape[1] == 2 && kv.shape[2] == kHeads && kv.shape[3] == kBlock &&
                  kv.shape[4] == kDim,
              "paged_kv_cache is [pages, 2, heads, block_tokens, head_dim] of float16")) {
    return false;
  }
  bool same = true;
  for (int t = 0; t < kTokens; ++t) {
    const int64_t page = (*parts)[0].indices[t / kBlock];
    for (int side = 0; side < 2; ++side) {
      for (int h = 0; h < kHeads; ++h) {
        for (int d = 0; d < kDim; ++d) {
          uint16_t bits;
          const int64_t offset = kv.ByteOffset({page, side, h, t % kBlock, d});
          std::memcpy(&bits, static_cast<const uint8_t*>(kv.data) + offset, sizeof(bits));
          same = same && HalfToFloat(bits) == Value(t, h, d, side == 0);
        }
      }
    }
  }
  std::printf("embed: FlashInfer's view addresses the %d tokens' K and V\n", kTokens);
  return Expect(same, "the FlashInfer view reads the values written");
}

}  // namespace

int main() {
  kvtier::Options options;
  options.geometry = kvtier::Geometry{/*num_layers=*/1, /*num_kv_heads=*/kHeads,
                                      /*head_dim=*/kDim, /*block_tokens=*/kBlock};
  options.memory_budget_bytes = size_t{8} << 20;
  absl::StatusOr<std::unique_ptr<kvtier::Cache>> cache = kvtier::Cache::Create(options);
  if (!Ok(cache.status(), "Cache::Create")) return 1;
  absl::StatusOr<kvtier::SequenceId> seq = (*cache)->AddSequence();
  if (!Ok(seq.status(), "AddSequence") || !WriteAndRead(**cache, *seq)) return 1;
  kvtier::PageTables tables;
  if (!Ok((*cache)->BuildPageTables({*seq}, &tables), "BuildPageTables")) return 1;
  if (!DecodeStep(**cache, *seq, tables) || !FlashInferView(**cache, tables)) return 1;
  if (!Ok((*cache)->Release(*seq), "Release") || !Ok((*cache)->EndStep(), "EndStep")) return 1;
  std::printf("embed: OK\n");
  return 0;
}
