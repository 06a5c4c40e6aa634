// The synthetic long-context retrieval generator of `kvtier recall` (design/POLICY_AND_RECALL.md).
//
// One call makes one *trial sequence*: `kv_heads` independent haystacks of `length` tokens (one
// per KV head), and for each KV head a GQA group of query heads, one per requested needle
// depth. Query head j of a KV head has its own needle key at depth depths[j], so one sequence
// carries one needle trial per (KV head, depth); to every other query the needle is an ordinary
// key (its logit for them is kept at the value it had before the needle was planted).
//
// Haystack keys, per KV head: a few fixed outlier channels (gain log-uniform in [1, max_gain],
// a non-zero mean of 1 to 2 in gain units), the other channels N(mean ~ N(0, 0.25^2), 1);
// generated before rotary embedding, then rotated by RoPE (pairs (i, i + d/2), angle
// pos * base^(-2i/d)), so each outlier smears over its channel pair as in real models.
// Values: a Gaussian scale mixture z * exp(0.5 w) (heavy-tailed, kurtosis about 8), no outlier
// channels. Real K/V from a dump (recall_npy.h) can replace the haystack.
//
// Queries are isotropic Gaussian (or rows of a user's query file), scaled so that the haystack
// logits softmax_scale * q.k have standard deviation `logit_std`. For each query, mean and std
// of the haystack logits are measured on up to 4096 haystack tokens, then:
//   - the needle = the haystack key at its position, moved by the least-norm change that puts
//     its logit at mean + margin * std for its own query and leaves the other queries' logits
//     unchanged;
//   - `distractors` hard distractors per needle at random positions, built around the
//     haystack's mean key m: m + c * (needle - m) + sqrt(1 - c^2) * |needle - m| * w, with w the
//     centred key of a random haystack token (so that to every other query a distractor looks
//     like haystack) made orthogonal to (needle - m) and to the needle's query, c uniform in
//     [cos_min, cos_max]. So a distractor's centred key has cosine c to the centred needle, and
//     its logit for the needle's query is exactly mean + c * margin * std: a controlled gap of
//     (1 - c) * margin stds below the needle (0.25 stds at c = 0.95, margin 5);
//   - 1 to 4 sink tokens at the start (synthetic haystacks only): keys moved so that every
//     query's logit is mean + sink_margin * std, values one tenth of the typical size.
// Everything is finally rounded to FP16, the precision the cache is written in; the float
// copies hold exactly the rounded values.
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_GENERATOR_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_GENERATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "examples/kvtier/recall_npy.h"

namespace kvtier::tool {

struct GeneratorOptions {
  int32_t head_dim = 128;   // REQUIRES: a multiple of 16
  int32_t kv_heads = 4;
  double rope_base = 1e4;   // 1e4 (Llama 2) or 5e5 (Llama 3)
  int32_t outlier_channels = 4;  // per KV head, before RoPE
  double outlier_gain_min = 1.0;
  double outlier_gain_max = 20.0;
  int32_t min_sinks = 1;
  int32_t max_sinks = 4;
  double logit_std = 2.0;    // std of the haystack's scaled logits
  double margin = 5.0;       // needle logit above the haystack mean, in haystack stds
  double sink_margin = 4.0;  // sink logits above the haystack mean, in haystack stds
  int32_t distractors = 4;   // per needle
  double cos_min = 0.5;
  double cos_max = 0.95;
  // Real data instead of the synthetic haystack (no sinks are added); not owned. The dump's
  // kv_heads and head_dim then override the fields above.
  const KVDump* dump = nullptr;
  const NpyArray* queries = nullptr;  // query directions to use in turn; not owned
};

// Logit statistics of one query over its haystack.
struct QueryStats {
  double mean = 0;
  double std = 0;
};

struct Trial {
  int64_t length = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int32_t group = 0;         // query heads per KV head = number of depths
  float softmax_scale = 0;   // 1 / sqrt(head_dim)
  int32_t sinks = 0;
  std::vector<float> k, v;   // [length, kv_heads, head_dim], FP16 values as float
  std::vector<uint16_t> k_half, v_half;  // the same, FP16 bits, for Cache::WriteKV
  std::vector<float> q;      // [kv_heads * group, head_dim]; query h*group+j has needle j
  std::vector<int64_t> needle;        // [kv_heads * group] token positions
  std::vector<QueryStats> stats;      // [kv_heads * group], before the needles were planted
  std::vector<float> key_mean;        // [kv_heads, head_dim], the haystack's mean key
  std::vector<std::vector<int64_t>> distractor_positions;  // [kv_heads * group]
};

// The position of a needle at `depth` (0 = first token after the sinks, 1 = the last token).
int64_t NeedlePosition(double depth, int64_t length, int32_t sinks);

// REQUIRES: depths in [0, 1], 1 to 64 of them; length large enough for every needle, sink and
// distractor to have its own position (InvalidArgument otherwise); with a dump, length <= its
// tokens. Deterministic in (options, length, depths, seed).
absl::StatusOr<Trial> GenerateTrial(const GeneratorOptions& options, int64_t length,
                                    absl::Span<const double> depths, uint64_t seed);

// A small fast PRNG (xoshiro256**), seeded by splitmix64, with Gaussian draws.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double Uniform();           // [0, 1)
  double Normal();            // N(0, 1), Marsaglia's polar method
  int64_t Below(int64_t n);   // [0, n)
 private:
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

// Mixes values into a seed (for per-trial seeds).
uint64_t MixSeed(uint64_t a, uint64_t b);

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_GENERATOR_H_
