// The exporter renders every metric of docs/metrics.md from a stats snapshot.
#include "kvtier/adapters/prometheus_exporter.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

std::string Scrape(const Cache& cache,
                   std::vector<prometheus::ClientMetric::Label> labels = {}) {
  CacheCollectable collectable(&cache, std::move(labels));
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, collectable.Collect());
  return out.str();
}

TEST(PrometheusExporterTest, ExportsTheDocumentedMetricsWithTheSnapshotsValues) {
  Options o = testing::SmallOptions();
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head")};
  auto cache = testing::MustCreate(o);
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  std::vector<int32_t> tokens(40);
  for (int i = 0; i < 40; ++i) tokens[i] = i;
  ASSERT_TRUE(cache->AppendTokens(seq, tokens, &slots).ok());
  ASSERT_TRUE(cache->Demote({cache->SequenceBlocks(seq)->front()}, 1).ok());
  SequenceOptions again;
  again.prompt = tokens;
  ASSERT_TRUE(cache->AddSequence(again).ok());
  const std::string text = Scrape(*cache);
  for (const char* line : {
           "kvtier_blocks{format=\"fp16\",state=\"in_use\"} 2",
           "kvtier_blocks{format=\"fp8_e4m3/block_head\",state=\"in_use\"} 1",
           "kvtier_migrated_blocks_total{from=\"fp16\",to=\"fp8_e4m3/block_head\"} 1",
           "kvtier_prefix_queried_tokens_total 40",
           "kvtier_prefix_hit_tokens_total 32",
           "kvtier_prefix_hit_blocks_total 2",
           "kvtier_prefix_missed_blocks_total 0",
           "kvtier_capacity_bytes 16777216",
           "kvtier_evicted_blocks_total{reason=\"capacity\"} 0",
           "kvtier_evicted_blocks_total{reason=\"abandoned\"} 0",
           "kvtier_allocation_failures_total{reason=\"budget\"} 0",
           "kvtier_nonfinite_values_total 0",
           "kvtier_demotions_under_pressure_total 0",
           "kvtier_policy_demotion_failures_total 0",
           "kvtier_sequences 2",
           "kvtier_events_batches_total{outcome=\"dropped\"} 0",
           "kvtier_events_total{outcome=\"published\"} 0",
           "kvtier_events_replay_requests_total 0",
           "kvtier_events_queued_batches 0",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  for (const char* name : {"kvtier_usage_ratio ", "kvtier_bytes{", "kvtier_effective_bits_per_element ",
                           "kvtier_migrated_bytes_total{", "kvtier_migration_duration_seconds_bucket{",
                           "kvtier_block_lifetime_seconds_count ", "kvtier_block_idle_before_evict_seconds_sum ",
                           "kvtier_cache_info{", "# TYPE kvtier_prefix_hit_tokens_total counter",
                           "# TYPE kvtier_blocks gauge"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name;
  }
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {  // no colons in metric names
    if (line.empty() || line[0] == '#') continue;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_EQ(name.find(':'), std::string::npos) << name;
  }
}

// Every pair of the palette that can migrate is exported from 0 (a pair appeared only with its
// first demotions, which rate() then never counted); a collectable's labels go on every series.
TEST(PrometheusExporterTest, MigrationPairsStartAtZeroAndLabelsTellCachesApart) {
  Options o = testing::SmallOptions();
  o.palette = {*ParseFormat("fp16"), *ParseFormat("fp8_e4m3/block_head"),
               *ParseFormat("nvfp4/block_head")};
  auto cache = testing::MustCreate(o);
  const std::string text = Scrape(*cache, {{"rank", "1"}});
  for (const char* line : {
           "kvtier_migrated_blocks_total{rank=\"1\",from=\"fp16\",to=\"fp8_e4m3/block_head\"} 0",
           "kvtier_migrated_blocks_total{rank=\"1\",from=\"fp16\",to=\"nvfp4/block_head\"} 0",
           "kvtier_migrated_bytes_total{rank=\"1\",from=\"fp8_e4m3/block_head\",to=\"nvfp4/block_head\"} 0",
           "kvtier_usage_ratio{rank=\"1\"} 0",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  EXPECT_EQ(text.find("to=\"fp16\""), std::string::npos);  // nothing migrates to the hot format
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] != '#') EXPECT_NE(line.find("rank=\"1\""), std::string::npos) << line;
  }
}

TEST(PrometheusExporterTest, ExportsTheRemoteTierByKind) {
  Options o = testing::SmallOptions();
  o.remote_tier_url = "redis://127.0.0.1:1";  // nothing listens there: connection refused
  o.remote_model_id = "m";
  auto cache = testing::MustCreate(o);
  SequenceOptions options;
  options.prompt = testing::Tokens(40, 0);
  ASSERT_TRUE(cache->AddSequence(options).ok());
  const std::string text = Scrape(*cache);
  for (const char* line : {
           "kvtier_remote_errors_total{kind=\"unavailable\"} 1",
           "kvtier_remote_errors_total{kind=\"timeout\"} 0",
           "kvtier_remote_errors_total{kind=\"corrupt\"} 0",
           "kvtier_remote_errors_total{kind=\"unauthenticated\"} 0",
           "kvtier_remote_errors_total{kind=\"queue_full\"} 0",
           "kvtier_remote_blocks_total{op=\"read\"} 0",
           "kvtier_remote_bytes_total{op=\"write\"} 0",
           "kvtier_remote_misses_total 1",
           "kvtier_remote_connected 0",
           "kvtier_remote_queued_blocks 0",
           "kvtier_remote_reconnects_total 0",
           "kvtier_remote_lookup_duration_seconds_count 1",
           "kvtier_tier_hit_tokens_total{tier=\"remote\"} 0",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

}  // namespace
}  // namespace kvtier
