// Several threads drive one cache while another reads stats: run under ThreadSanitizer in CI.
#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

TEST(CacheThreadsTest, SchedulersAndAMetricsReaderShareOneCache) {
  auto cache = testing::MustCreate(testing::SmallOptions(/*slabs_per_layer=*/4));
  std::atomic<bool> done{false};
  std::atomic<int64_t> snapshots{0};
  std::thread metrics([&] {
    while (!done.load()) {
      const CacheStats s = cache->GetStats();
      EXPECT_LE(s.used_bytes, s.budget_bytes);
      snapshots.fetch_add(1);
    }
  });
  std::vector<std::thread> schedulers;
  for (int t = 0; t < 3; ++t) {
    schedulers.emplace_back([&, t] {
      std::vector<int64_t> slots;
      std::vector<uint16_t> data(2 * 64, 0x3C00);
      for (int round = 0; round < 200; ++round) {
        const SequenceId seq = *cache->AddSequence();
        for (int i = 0; i < 20; ++i) {
          slots.clear();
          if (!cache->Append(seq, 1 + (round + t) % 7, &slots).ok()) break;
          for (size_t j = 0; j < slots.size(); ++j) {
            const KVInput one{DType::kFloat16, data.data(), data.data(), 1, 2, 64};
            EXPECT_TRUE(cache->WriteKV(0, absl::MakeConstSpan(&slots[j], 1), one).ok());
          }
        }
        const SequenceId child = *cache->Fork(seq);
        PageTables tables;
        EXPECT_TRUE(cache->BuildPageTables({seq, child}, &tables).ok());
        EXPECT_TRUE(cache->Release(seq).ok());
        EXPECT_TRUE(cache->Release(child).ok());
        if (round % 10 == 0) {
          EXPECT_TRUE(cache->EndStep().ok());
        }
      }
    });
  }
  for (std::thread& t : schedulers) t.join();
  done.store(true);
  metrics.join();
  EXPECT_GT(snapshots.load(), 0);
  EXPECT_TRUE(cache->CheckConsistency().ok()) << cache->CheckConsistency();
  EXPECT_EQ(cache->GetStats().sequences, 0);
}

}  // namespace
}  // namespace kvtier
