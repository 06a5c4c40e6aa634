// The optional Prometheus exporter (CMake target kvtier::kvtier_prometheus, built and installed
// with KVTIER_WITH_PROMETHEUS; needs prometheus-cpp): a prometheus::Collectable that turns a
// cache's stats snapshot into metric families on each scrape (the names of docs/metrics.md).
// The library opens no port: the engine registers the collectable with its own
// prometheus::Registry or Exposer.
//
//   auto metrics = std::make_shared<kvtier::CacheCollectable>(cache.get());
//   exposer.RegisterCollectable(metrics);
//   ...
//   exposer.RemoveCollectable(metrics);  // before the cache goes
//
// Thread-safe: Collect() only calls Cache::GetStats(). REQUIRES: the cache outlives the
// collectable's registration. Remove it from the Exposer (or Registry) before destroying the
// cache: a scrape in progress holds its own reference, so dropping yours is not enough.
#ifndef KVTIER_ADAPTERS_PROMETHEUS_EXPORTER_H_
#define KVTIER_ADAPTERS_PROMETHEUS_EXPORTER_H_

#include <utility>
#include <vector>

#include "kvtier/cache.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace kvtier {

class CacheCollectable : public prometheus::Collectable {
 public:
  // `labels` go on every metric, first: several caches behind one Exposer (tensor-parallel
  // ranks, a draft model's cache) need one that tells them apart, else their series collide
  // and Prometheus keeps one of each. Default: none.
  explicit CacheCollectable(const Cache* cache, std::vector<prometheus::ClientMetric::Label> labels = {})
      : cache_(cache), labels_(std::move(labels)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Cache* const cache_;
  const std::vector<prometheus::ClientMetric::Label> labels_;
};

// The families for one stats snapshot; Collect() is MetricFamilies(options, GetStats()).
std::vector<prometheus::MetricFamily> MetricFamilies(const Options& options, const CacheStats& stats);

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_PROMETHEUS_EXPORTER_H_
