// The smallest engine loop: one sequence, one layer, FP16 K/V written and read back.
#include <cstdio>
#include <vector>

#include "kvtier/cache.h"

int main() {
  kvtier::Options options;
  options.geometry = kvtier::Geometry{/*num_layers=*/1, /*num_kv_heads=*/2, /*head_dim=*/64,
                                      /*block_tokens=*/16};
  options.memory_budget_bytes = size_t{8} << 20;
  absl::StatusOr<std::unique_ptr<kvtier::Cache>> cache = kvtier::Cache::Create(options);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.status().ToString().c_str());
    return 1;
  }
  const kvtier::SequenceId seq = *(*cache)->AddSequence();
  std::vector<int64_t> slots;
  if (!(*cache)->Append(seq, 3, &slots).ok()) return 1;
  std::vector<uint16_t> kv(3 * 2 * 64, 0x4000);  // FP16 2.0
  const kvtier::KVInput input{kvtier::DType::kFloat16, kv.data(), kv.data(), 3, 2, 64};
  if (!(*cache)->WriteKV(0, slots, input).ok()) return 1;
  std::vector<float> k(kv.size()), v(kv.size());
  if (!(*cache)->ReadKV(seq, 0, absl::MakeSpan(k), absl::MakeSpan(v)).ok()) return 1;
  std::printf("embed: wrote and read 3 tokens, k[0] = %.1f\n", k[0]);
  return k[0] == 2.0f ? 0 : 1;
}
