// Helpers shared by the cache tests.
#ifndef KVTIER_TESTS_TEST_UTIL_H_
#define KVTIER_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/codec/half.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "tests/stats_diff.h"

namespace kvtier::testing {

// A small geometry: 2 layers, 2 KV heads, head_dim 64, 16-token blocks; FP16 pages of 8 KiB,
// so a 2 MiB slab holds 256 pages.
inline Options SmallOptions(int slabs_per_layer = 4) {
  Options o;
  o.geometry = Geometry{2, 2, 64, 16};
  o.memory_budget_bytes = size_t{2} * slabs_per_layer * o.slab_bytes;
  return o;
}

// Options of `geometry` with a budget of `budget_mib` MiB and the palette of `formats` (format
// names, hottest first).
inline Options PaletteOptions(const Geometry& geometry, const std::vector<std::string>& formats,
                              int64_t budget_mib) {
  Options o;
  o.geometry = geometry;
  o.memory_budget_bytes = static_cast<size_t>(budget_mib) << 20;
  o.palette.clear();
  for (const std::string& name : formats) o.palette.push_back(ParseFormat(name).value());
  return o;
}

inline std::unique_ptr<Cache> MustCreate(const Options& o) {
  absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
  EXPECT_TRUE(cache.ok()) << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

// Token ids first, first + 1, ..., n of them.
inline std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Random FP16 bit patterns of finite, non-zero values in about [-8, 8].
inline std::vector<uint16_t> RandomHalves(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<uint16_t> out(n);
  for (uint16_t& h : out) {
    float x = dist(rng);
    if (x == 0.f) x = 1.f;
    h = codec::FloatToHalf(x);
  }
  return out;
}

// Standard normal floats.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// The counters and gauges that must not move when a call fails (stats_diff.h).
inline void ExpectSameState(const CacheStats& a, const CacheStats& b) {
  EXPECT_EQ(StateDifference(a, b), "");
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TEST_UTIL_H_
