// The Prometheus exporter through the installed package (kvtier::kvtier_prometheus; CI builds it
// against `cmake --install`): a cache of one sequence of 20 tokens is scraped through
// CacheCollectable, whose kvtier_tokens gauge must read 20. Exits 1 otherwise.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "kvtier/adapters/prometheus_exporter.h"
#include "kvtier/cache.h"

int main() {
  kvtier::Options options;
  options.geometry = kvtier::Geometry{/*num_layers=*/1, /*num_kv_heads=*/2, /*head_dim=*/64,
                                      /*block_tokens=*/16};
  options.memory_budget_bytes = size_t{8} << 20;
  absl::StatusOr<std::unique_ptr<kvtier::Cache>> cache = kvtier::Cache::Create(options);
  absl::StatusOr<kvtier::SequenceId> seq =
      cache.ok() ? (*cache)->AddSequence() : absl::StatusOr<kvtier::SequenceId>(cache.status());
  std::vector<int64_t> slots;
  const absl::Status appended = seq.ok() ? (*cache)->Append(*seq, 20, &slots) : seq.status();
  if (!appended.ok()) {
    std::fprintf(stderr, "embed_metrics: %s\n", appended.ToString().c_str());
    return 1;
  }
  const kvtier::CacheCollectable collectable(cache->get());
  for (const prometheus::MetricFamily& family : collectable.Collect()) {
    if (family.name != "kvtier_tokens" || family.metric.size() != 1) continue;
    const double tokens = family.metric[0].gauge.value;
    std::printf("embed_metrics: kvtier_tokens %g\n", tokens);
    return tokens == 20 ? 0 : 1;
  }
  std::fprintf(stderr, "embed_metrics: no kvtier_tokens family in the scrape\n");
  return 1;
}
