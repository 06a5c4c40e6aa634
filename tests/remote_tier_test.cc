// The remote tier (Options::remote_tier_url) against a real redis-server on the loopback: two
// caches sharing prefixes with identical K/V, and every fault (server down at creation or mid-
// run, restarted, paused past the timeout, garbage, truncated, oversized or foreign values,
// maxmemory, a full write queue) as misses or dropped writes that are counted, never wrong K/V.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/prefix_hash.h"
#include "src/backend.h"
#include "src/redis_connection.h"
#include "src/remote_block_codec.h"
#include "src/remote_tier.h"
#include "tests/fault_backend.h"
#include "tests/loopback_server.h"
#include "tests/redis_server.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::RedisServer;
using ::kvtier::testing::Tokens;

constexpr int kBlock = 16;

// 2 layers of 2 heads x 64 dims, 16-token blocks: 16 KiB per block (FP16) in Redis.
Options RemoteOptions(const std::string& url, std::vector<std::string> palette = {"fp16"}) {
  Options o = testing::PaletteOptions(Geometry{2, 2, 64, kBlock}, palette, 8);
  o.remote_tier_url = url;
  o.remote_model_id = "test-model";
  o.remote_timeout_ms = 100;  // loopback under sanitizers
  return o;
}

// The FP16 value of element `e` of token `t` (its id) in `layer`: varied and exact.
uint16_t ValueOf(int32_t t, int layer, size_t e) {
  return codec::FloatToHalf(static_cast<float>((t * 31 + layer * 7 + static_cast<int>(e) * 3) % 97 - 48) / 8.f);
}

// A prompt of `blocks` full blocks and one token more (the token left to compute).
std::vector<int32_t> Prompt(int blocks, int32_t first) { return Tokens(blocks * kBlock + 1, first); }

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::Installed()) {
      GTEST_SKIP() << "redis-server is not installed (scripts/setup.sh installs it)";
    }
    ASSERT_TRUE(server_.Start()) << "redis-server did not start on port " << server_.port();
  }

  static std::unique_ptr<Cache> Make(const Options& o) { return testing::MustCreate(o); }

  // Computes `tokens` in a new sequence of `cache` with their values, ends the step (which
  // queues the full blocks for Redis) and releases it.
  static void Serve(Cache& cache, const std::vector<int32_t>& tokens) {
    const SequenceId id = *cache.AddSequence();
    std::vector<int64_t> slots;
    ASSERT_TRUE(cache.AppendTokens(id, tokens, &slots).ok());
    const Geometry& g = cache.options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    std::vector<uint16_t> k(tokens.size() * row), v(k.size());
    for (int l = 0; l < g.num_layers; ++l) {
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = ValueOf(tokens[i / row], l, i % row);
        v[i] = ValueOf(tokens[i / row] + 1000, l, i % row);
      }
      const KVInput kv{DType::kFloat16, k.data(), v.data(), static_cast<int64_t>(tokens.size()),
                       g.num_kv_heads, g.head_dim};
      ASSERT_TRUE(cache.WriteKV(l, slots, kv).ok());
    }
    ASSERT_TRUE(cache.EndStep().ok());
    ASSERT_TRUE(cache.Release(id).ok());
  }

  // Waits until `cache` has no write queued (5 s at most).
  static RemoteTierStats Drain(Cache& cache) {
    for (int i = 0; i < 500 && cache.GetStats().remote.queued_blocks > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cache.GetStats().remote;
  }

  static AddResult Match(Cache& cache, const std::vector<int32_t>& prompt) {
    SequenceOptions options;
    options.prompt = prompt;
    absl::StatusOr<AddResult> r = cache.AddSequence(options);
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  }

  // The decoded K and V of every token of `id`: per layer, K then V, [tokens, heads, dim] each.
  static std::vector<float> Read(Cache& cache, SequenceId id) {
    const Geometry& g = cache.options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    const int64_t n = *cache.SequenceLength(id);
    std::vector<float> out, k(n * row), v(n * row);
    for (int l = 0; l < g.num_layers; ++l) {
      EXPECT_TRUE(cache.ReadKV(id, l, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
      out.insert(out.end(), k.begin(), k.end());
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // Expects tokens [from, to) of sequence `a` of `x` and `b` of `y` to hold the same K/V.
  static void ExpectSameTokens(Cache& x, SequenceId a, Cache& y, SequenceId b, int64_t from,
                               int64_t to) {
    const Geometry& g = x.options().geometry;
    const size_t row = static_cast<size_t>(g.num_kv_heads) * g.head_dim;
    const std::vector<float> mine = Read(x, a), theirs = Read(y, b);
    const size_t na = mine.size() / (2 * g.num_layers), nb = theirs.size() / (2 * g.num_layers);
    ASSERT_LE(to * row, std::min(na, nb));
    for (int c = 0; c < 2 * g.num_layers; ++c) {
      for (size_t i = from * row; i < to * row; ++i) {
        ASSERT_EQ(mine[c * na + i], theirs[c * nb + i]) << "K/V " << c << " element " << i;
      }
    }
  }

  // Expects the first `blocks` blocks of `prompt` matched in `reader` to hold exactly what
  // `writer` holds for them.
  static void ExpectSameKV(Cache& writer, Cache& reader, const std::vector<int32_t>& prompt,
                           int blocks) {
    const AddResult w = Match(writer, prompt), r = Match(reader, prompt);
    ASSERT_GE(w.cached_tokens, blocks * kBlock);
    ASSERT_EQ(r.cached_tokens, blocks * kBlock);
    ExpectSameTokens(writer, w.id, reader, r.id, 0, blocks * kBlock);
    ASSERT_TRUE(writer.Release(w.id).ok());
    ASSERT_TRUE(reader.Release(r.id).ok());
    EXPECT_TRUE(reader.CheckConsistency().ok()) << reader.CheckConsistency();
  }

  // The key under which `prompt`'s first block is stored.
  std::string FirstKey(const Options& o, const std::vector<int32_t>& prompt) const {
    const uint64_t hash = HashBlock(kRootParentHash, absl::MakeConstSpan(prompt).first(kBlock), 0);
    return RemoteKey(RemoteIdentity(o), hash);
  }

  RedisServer server_;
};

TEST_F(RemoteTierTest, TwoCachesShareAPrefixWithIdenticalKV) {
  const Options o = RemoteOptions(server_.url());
  auto a = Make(o), b = Make(o);
  const std::vector<int32_t> prompt = Prompt(4, 100);
  Serve(*a, prompt);
  EXPECT_EQ(Drain(*a).written_blocks, 4);
  const AddResult r = Match(*b, prompt);
  EXPECT_EQ(r.cached_tokens, 4 * kBlock);
  EXPECT_EQ(r.remote_tokens, 4 * kBlock);
  ASSERT_TRUE(b->Release(r.id).ok());
  // Now local in b: a second match needs no remote block.
  EXPECT_EQ(Match(*b, prompt).remote_tokens, 0);
  ExpectSameKV(*a, *b, prompt, 4);
  const CacheStats s = b->GetStats();
  EXPECT_EQ(s.remote.hit_blocks, 4);
  EXPECT_EQ(s.remote.hit_tokens, 4 * kBlock);
  EXPECT_GT(s.remote.bytes_read, 4 * 16384);
  EXPECT_EQ(s.remote.lookup_seconds.count, 1);
  EXPECT_TRUE(s.remote.connected);
}

// missed_blocks counts lookups ended by a missing value, not ones cut by
// remote_max_fetch_blocks that found every block they asked for.
TEST_F(RemoteTierTest, ALookupCutByTheFetchLimitIsNoMiss) {
  Options o = RemoteOptions(server_.url());
  o.remote_max_fetch_blocks = 2;
  auto a = Make(o), b = Make(o);
  const std::vector<int32_t> prompt = Prompt(4, 100);
  Serve(*a, prompt);
  EXPECT_EQ(Drain(*a).written_blocks, 4);
  EXPECT_EQ(Match(*b, prompt).remote_tokens, 2 * kBlock);
  EXPECT_EQ(b->GetStats().remote.missed_blocks, 0);
  EXPECT_EQ(Match(*b, Prompt(4, 200)).remote_tokens, 0);
  EXPECT_EQ(b->GetStats().remote.missed_blocks, 1);
}

TEST_F(RemoteTierTest, ALocalPrefixContinuesWithRemoteBlocksInTheirColderFormat) {
  const Options o = RemoteOptions(server_.url(), {"fp16", "fp8_e4m3/block_head"});
  auto a = Make(o), b = Make(o);
  const std::vector<int32_t> prompt = Prompt(3, 7);
  // b holds the first block itself; a holds all three, demoted to FP8 before they are written.
  Serve(*b, Tokens(kBlock, 7));
  const SequenceId id = *a->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(a->AppendTokens(id, prompt, &slots).ok());
  std::vector<BlockId> full = *a->SequenceBlocks(id);
  full.pop_back();  // the partial tail stays hot
  ASSERT_TRUE(a->Demote(full, 1).ok());
  ASSERT_TRUE(a->EndStep().ok());
  ASSERT_TRUE(a->Release(id).ok());
  EXPECT_EQ(Drain(*a).written_blocks, 3);
  const AddResult r = Match(*b, prompt);
  EXPECT_EQ(r.cached_tokens, 3 * kBlock);
  EXPECT_EQ(r.remote_tokens, 2 * kBlock);
  EXPECT_EQ(b->GetBlockInfo(b->SequenceBlocks(r.id)->at(2))->format, 1);
  // Blocks 1 and 2 came from a: equal to a's bit for bit (block 0 is b's own FP16 block).
  const AddResult w = Match(*a, prompt);
  ExpectSameTokens(*a, w.id, *b, r.id, kBlock, 3 * kBlock);
  EXPECT_TRUE(b->CheckConsistency().ok());
}

TEST_F(RemoteTierTest, AServerDownAtCreationCostsOnlyMissesAndDroppedWrites) {
  const int port = server_.port();
  server_.Stop();
  const Options o = RemoteOptions(absl::StrCat("redis://127.0.0.1:", port));
  auto a = Make(o);
  ASSERT_NE(a, nullptr);
  Serve(*a, Prompt(2, 1));
  const RemoteTierStats s = Drain(*a);
  EXPECT_EQ(s.written_blocks, 0);
  EXPECT_GE(s.unavailable, 1);
  auto b = Make(o);
  EXPECT_EQ(Match(*b, Prompt(2, 1)).cached_tokens, 0);
  EXPECT_GE(b->GetStats().remote.unavailable, 1);
  EXPECT_FALSE(b->GetStats().remote.connected);
  EXPECT_TRUE(b->CheckConsistency().ok());
}

TEST_F(RemoteTierTest, AServerStoppedMidRunAndRestartedIsUsedAgain) {
  const Options o = RemoteOptions(server_.url());
  auto a = Make(o), b = Make(o);
  Serve(*a, Prompt(2, 1));
  EXPECT_EQ(Drain(*a).written_blocks, 2);
  ExpectSameKV(*a, *b, Prompt(2, 1), 2);
  server_.Stop();
  Serve(*a, Prompt(2, 500));  // written while down: dropped
  EXPECT_GE(Drain(*a).unavailable, 1);
  auto c = Make(o);
  EXPECT_EQ(Match(*c, Prompt(2, 1)).cached_tokens, 0);
  ASSERT_TRUE(server_.Start());  // empty: nothing was saved
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // past the longest backoff
  Serve(*a, Prompt(2, 900));
  EXPECT_EQ(Drain(*a).written_blocks, 4);
  EXPECT_GE(a->GetStats().remote.reconnects, 1);
  ExpectSameKV(*a, *c, Prompt(2, 900), 2);
  EXPECT_EQ(Match(*c, Prompt(2, 500)).cached_tokens, 0);
}

TEST_F(RemoteTierTest, AServerPausedPastTheTimeoutIsAMissWithinAboutTheTimeout) {
  const Options o = RemoteOptions(server_.url());
  auto a = Make(o), b = Make(o);
  Serve(*a, Prompt(2, 1));
  Drain(*a);
  server_.Pause();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Match(*b, Prompt(2, 1)).cached_tokens, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
  EXPECT_EQ(b->GetStats().remote.timeouts, 1);
  server_.Resume();
  auto c = Make(o);
  ExpectSameKV(*a, *c, Prompt(2, 1), 2);
}

// Lookups from many threads share one connection, in turn: a caller that has waited its turn
// past remote_timeout_ms misses at once (a timeout) instead of taking a window more, so that
// each waits about the timeout at most, not the timeout times the callers before it. The server
// answers each GETRANGE (a missing key) after 60 ms; the timeout is 100 ms.
TEST(RemoteTierLookupTest, CallersQueuedPastTheTimeoutMissInsteadOfWaitingTheirTurn) {
  testing::LoopbackServer server([](int client) {
    char request[4096];
    while (client >= 0 && recv(client, request, sizeof(request), 0) > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      if (send(client, "$0\r\n\r\n", 6, MSG_NOSIGNAL) != 6) break;
    }
  });
  Options o = RemoteOptions(absl::StrCat("redis://127.0.0.1:", server.address().port));
  absl::StatusOr<std::unique_ptr<RemoteTier>> tier = RemoteTier::Create(o);
  ASSERT_TRUE(tier.ok()) << tier.status();
  constexpr int kCallers = 8;
  std::vector<std::chrono::steady_clock::duration> took(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      const auto start = std::chrono::steady_clock::now();
      const uint64_t hash = 1000 + i;
      EXPECT_TRUE((*tier)->Lookup(absl::MakeConstSpan(&hash, 1)).empty());
      took[i] = std::chrono::steady_clock::now() - start;
    });
  }
  for (std::thread& t : callers) t.join();
  const auto longest = *std::max_element(took.begin(), took.end());
  EXPECT_LT(longest, std::chrono::milliseconds(350))
      << "a caller waited " << std::chrono::duration<double, std::milli>(longest).count()
      << " ms (8 lookups of 60 ms in turn take 480)";
  RemoteTierStats stats;
  (*tier)->Fill(&stats);
  EXPECT_GT(stats.timeouts, 0);
  tier->reset();  // before the server: its connection closes, so the server's loop ends
}

TEST_F(RemoteTierTest, GarbageTruncatedOversizedAndForeignValuesAreMissesCountedByKind) {
  const Options o = RemoteOptions(server_.url());
  auto a = Make(o), b = Make(o);
  const std::vector<int32_t> prompt = Prompt(2, 40);
  Serve(*a, prompt);
  Drain(*a);
  const std::string key = FirstKey(o, prompt);
  const std::string good = server_.Command({"GET", key});
  ASSERT_EQ(good.size(), kRemoteHeaderBytes + 2 * 8192);
  std::string flipped = good, version = good, foreign = good;
  flipped[good.size() - 1] ^= 1;
  version[4] = 2;
  foreign[32] = 3;  // three layers
  const std::vector<std::pair<std::string, int64_t RemoteTierStats::*>> cases = {
      {"garbage", &RemoteTierStats::corrupt_values},
      {good.substr(0, good.size() - 1), &RemoteTierStats::corrupt_values},
      {good.substr(0, 20), &RemoteTierStats::corrupt_values},
      {flipped, &RemoteTierStats::corrupt_values},
      {version, &RemoteTierStats::mismatched_values},
      {foreign, &RemoteTierStats::corrupt_values},  // the checksum covers the header
  };
  for (const auto& [value, counter] : cases) {
    ASSERT_EQ(server_.Command({"SET", key, value}), "OK");
    const int64_t before = b->GetStats().remote.*counter;
    EXPECT_EQ(Match(*b, prompt).cached_tokens, 0);
    EXPECT_EQ(b->GetStats().remote.*counter, before + 1);
  }
  // 64 MiB under the key: read only one byte past the longest block this cache writes, then
  // refused; never transferred whole (the server's own count of bytes sent says so).
  auto bytes_sent = [&] {
    const std::string info = server_.Command({"INFO", "stats"});
    const size_t at = info.find("total_net_output_bytes:");
    if (at == std::string::npos) return int64_t{-1};
    const size_t from = at + std::strlen("total_net_output_bytes:");
    return int64_t{std::stoll(info.substr(from, info.find_first_of("\r\n", from) - from))};
  };
  ASSERT_EQ(server_.Command({"SET", key, good + std::string(size_t{64} << 20, 'x')}), "OK");
  const int64_t sent = bytes_sent(), corrupt = b->GetStats().remote.corrupt_values;
  ASSERT_GE(sent, 0) << "no total_net_output_bytes in INFO stats";
  EXPECT_EQ(Match(*b, prompt).cached_tokens, 0);
  EXPECT_EQ(b->GetStats().remote.corrupt_values, corrupt + 1);
  EXPECT_LT(bytes_sent() - sent, int64_t{1} << 20);
  // A whole value of another geometry under this key (a key collision): refused by its header.
  Options other = o;
  other.geometry.num_kv_heads = 1;
  auto c = Make(other);
  Serve(*c, prompt);
  Drain(*c);
  ASSERT_EQ(server_.Command({"COPY", FirstKey(other, prompt), key, "REPLACE"}), "1");
  EXPECT_EQ(Match(*b, prompt).cached_tokens, 0);
  EXPECT_EQ(b->GetStats().remote.mismatched_values, 2);
  ASSERT_EQ(server_.Command({"SET", key, good}), "OK");
  auto d = Make(o);
  ExpectSameKV(*a, *d, prompt, 2);
}

// Caches sharing a secret share blocks, each value signed; a cache with another secret looks up
// other keys; a value signed with another secret, or placed by a writer without one, under
// this secret's key is a miss counted as unauthenticated.
TEST_F(RemoteTierTest, WithASecretOnlyValuesSignedWithItAreRead) {
  Options o = RemoteOptions(server_.url());
  o.remote_secret = std::string(32, 'k');
  auto a = Make(o), b = Make(o);
  const std::vector<int32_t> prompt = Prompt(3, 300);
  Serve(*a, prompt);
  const RemoteTierStats written = Drain(*a);
  EXPECT_EQ(written.written_blocks, 3);
  EXPECT_EQ(written.bytes_written, 3 * (kRemoteHeaderBytes + 2 * 8192));  // header and pages
  EXPECT_EQ(server_.Command({"GET", FirstKey(o, prompt)}).size(),
            kRemoteHeaderBytes + 2 * 8192 + RemoteMac::kTrailerBytes);
  ExpectSameKV(*a, *b, prompt, 3);
  EXPECT_EQ(b->GetStats().remote.hit_blocks, 3);
  Options wrong = o;
  wrong.remote_secret = std::string(32, 'w');
  auto c = Make(wrong);
  EXPECT_NE(FirstKey(wrong, prompt), FirstKey(o, prompt));
  EXPECT_EQ(Match(*c, prompt).cached_tokens, 0);
  EXPECT_EQ(c->GetStats().remote.unauthenticated_values, 0);  // found nothing under its keys
  ASSERT_EQ(server_.Command({"COPY", FirstKey(o, prompt), FirstKey(wrong, prompt)}), "1");
  EXPECT_EQ(Match(*c, prompt).cached_tokens, 0);
  EXPECT_EQ(c->GetStats().remote.unauthenticated_values, 1);
  Options plain = o;
  plain.remote_secret.clear();
  auto writer = Make(plain);
  Serve(*writer, prompt);
  Drain(*writer);
  ASSERT_EQ(server_.Command({"COPY", FirstKey(plain, prompt), FirstKey(o, prompt), "REPLACE"}),
            "1");
  auto d = Make(o);
  EXPECT_EQ(Match(*d, prompt).cached_tokens, 0);
  EXPECT_EQ(d->GetStats().remote.unauthenticated_values, 1);
  EXPECT_EQ(d->GetStats().remote.hit_blocks, 0);
}

// A host name is resolved (within the timeout) and its addresses tried in turn: "localhost"
// reaches the server, which listens on 127.0.0.1 alone. A name with no address is Unavailable.
TEST_F(RemoteTierTest, AHostNameReachesTheServerAndANameWithNoAddressIsUnavailable) {
  RedisConnection by_name(RedisAddress{"localhost", server_.port()}, 1000);
  EXPECT_TRUE(by_name.Set("kvtier-test-key", "value").ok());
  EXPECT_EQ(server_.Command({"GET", "kvtier-test-key"}), "value");
  RedisConnection nowhere(RedisAddress{"kvtier-no-such-host.invalid.", server_.port()}, 3000);
  const absl::Status s = nowhere.Set("k", "v");
  EXPECT_TRUE(absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) << s;
  EXPECT_FALSE(nowhere.connected());
}

TEST_F(RemoteTierTest, ModelsNeverReadEachOthersBlocks) {
  Options o = RemoteOptions(server_.url());
  auto a = Make(o);
  Serve(*a, Prompt(2, 1));
  Drain(*a);
  o.remote_model_id = "another-model";
  auto b = Make(o);
  EXPECT_EQ(Match(*b, Prompt(2, 1)).cached_tokens, 0);
  EXPECT_EQ(b->GetStats().remote.missed_blocks, 1);
  EXPECT_EQ(b->GetStats().remote.corrupt_values + b->GetStats().remote.mismatched_values, 0);
}

TEST_F(RemoteTierTest, WritesPastMaxmemoryAreRefusedAndWhatWasStoredReadsBackIntact) {
  ASSERT_EQ(server_.Command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "OK");
  ASSERT_EQ(server_.Command({"CONFIG", "SET", "maxmemory", "2mb"}), "OK");
  const Options o = RemoteOptions(server_.url());
  auto a = Make(o), b = Make(o);
  for (int i = 0; i < 20; ++i) Serve(*a, Prompt(8, 10000 * (i + 1)));
  const RemoteTierStats s = Drain(*a);
  EXPECT_GT(s.server_errors, 0);
  EXPECT_EQ(s.written_blocks + s.server_errors, 160);
  // Whatever was stored reads back identical; the rest are misses.
  int64_t hits = 0;
  for (int i = 0; i < 20; ++i) {
    const AddResult r = Match(*b, Prompt(8, 10000 * (i + 1)));
    if (r.cached_tokens > 0) {
      hits += r.cached_tokens / kBlock;
      ASSERT_TRUE(b->Release(r.id).ok());
      ExpectSameKV(*a, *b, Prompt(8, 10000 * (i + 1)), static_cast<int>(r.cached_tokens / kBlock));
    } else {
      ASSERT_TRUE(b->Release(r.id).ok());
    }
  }
  EXPECT_GT(hits, 0);
  EXPECT_EQ(b->GetStats().remote.corrupt_values, 0);
}

TEST_F(RemoteTierTest, AFullWriteQueueDropsWritesAndCountsThem) {
  Options o = RemoteOptions(server_.url());
  o.remote_write_queue_blocks = 2;
  auto a = Make(o);
  Serve(*a, Prompt(6, 1));
  const RemoteTierStats s = Drain(*a);
  EXPECT_GE(s.dropped_writes, 4);
  EXPECT_EQ(s.written_blocks + s.dropped_writes, 6);
}

TEST_F(RemoteTierTest, NoDeviceRoomForARemoteBlockEndsTheMatchThere) {
  Options o = RemoteOptions(server_.url());
  auto a = Make(o);
  Serve(*a, Prompt(2, 1));
  Drain(*a);
  o.memory_budget_bytes = 2 * o.slab_bytes;  // 256 FP16 pages
  auto b = Make(o);
  const SequenceId filler = *b->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(b->Append(filler, 256 * kBlock, &slots).ok());
  const AddResult r = Match(*b, Prompt(2, 1));
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_EQ(b->GetStats().remote.import_failures, 1);
  EXPECT_EQ(b->GetStats().allocation_failures, 0);  // the call succeeded
  EXPECT_TRUE(b->CheckConsistency().ok()) << b->CheckConsistency();
  ASSERT_TRUE(b->Release(filler).ok());
  ASSERT_TRUE(b->Release(r.id).ok());
  EXPECT_EQ(Match(*b, Prompt(2, 1)).remote_tokens, 2 * kBlock);
}

TEST_F(RemoteTierTest, ManyBlocksOfOneStepPassThroughTheStagingSlotsInBatches) {
  Options o = RemoteOptions(server_.url());
  o.remote_write_queue_blocks = 400;  // 300 blocks in one step: 256 staging slots, then 44
  o.remote_max_fetch_blocks = 400;
  auto a = Make(o), b = Make(o);
  Serve(*a, Prompt(300, 1));
  EXPECT_EQ(Drain(*a).written_blocks, 300);
  ExpectSameKV(*a, *b, Prompt(300, 1), 300);
}

// A backend whose copies fail, or whose fences pass only later (as on a GPU).
class RemoteTierFaultTest : public RemoteTierTest {
 protected:
  std::unique_ptr<Cache> MakeFaulty(const Options& o) {
    absl::StatusOr<std::unique_ptr<Cache>> cache =
        CreateCache(o, std::make_unique<testing::FaultBackend>(faults_));
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? std::move(*cache) : nullptr;
  }
  std::shared_ptr<testing::Faults> faults_ = std::make_shared<testing::Faults>();
};

TEST_F(RemoteTierFaultTest, FailingStagingCopiesDropTheWritesAndEndTheMatch) {
  const Options o = RemoteOptions(server_.url());
  auto a = MakeFaulty(o);
  faults_->fail_copy_pages = true;
  Serve(*a, Prompt(2, 1));
  EXPECT_EQ(Drain(*a).dropped_writes, 2);
  EXPECT_EQ(a->GetStats().remote.written_blocks, 0);
  faults_->fail_copy_pages = false;
  Serve(*a, Prompt(2, 100));
  EXPECT_EQ(Drain(*a).written_blocks, 2);
  auto b = MakeFaulty(o);
  faults_->fail_copy_pages = true;
  const CacheStats before = b->GetStats();
  const AddResult r = Match(*b, Prompt(2, 100));
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_EQ(b->GetStats().remote.import_failures, before.remote.import_failures + 1);
  EXPECT_TRUE(b->CheckConsistency().ok()) << b->CheckConsistency();
  ASSERT_TRUE(b->Release(r.id).ok());
  faults_->fail_copy_pages = false;
  ExpectSameKV(*a, *b, Prompt(2, 100), 2);
}

TEST_F(RemoteTierFaultTest, OnAnAsynchronousBackendStagedCopiesAreWaitedFor) {
  faults_->asynchronous = true;
  faults_->fences_pass = true;
  const Options o = RemoteOptions(server_.url());
  auto a = MakeFaulty(o), b = MakeFaulty(o);
  Serve(*a, Prompt(3, 1));
  EXPECT_EQ(Drain(*a).written_blocks, 3);
  const AddResult r = Match(*b, Prompt(3, 1));
  EXPECT_EQ(r.remote_tokens, 3 * kBlock);
  EXPECT_NE(r.ready_fence, 0u);
  ASSERT_TRUE(b->Release(r.id).ok());
  ExpectSameKV(*a, *b, Prompt(3, 1), 3);
  // Without a fence of its own after the copies, the import's is the next one recorded.
  Serve(*a, Prompt(2, 700));
  EXPECT_EQ(Drain(*a).written_blocks, 3 + 2);
  faults_->fail_record_fence = true;
  const AddResult unfenced = Match(*b, Prompt(2, 700));
  faults_->fail_record_fence = false;
  EXPECT_EQ(unfenced.remote_tokens, 2 * kBlock);
  EXPECT_FALSE(*b->FencePassed(unfenced.ready_fence));
  ASSERT_TRUE(b->EndStep().ok());
  EXPECT_TRUE(*b->FencePassed(unfenced.ready_fence));
  ASSERT_TRUE(b->Release(unfenced.id).ok());
  // Fences that never pass: the staged writes are dropped after the wait, never read early.
  faults_->fences_pass = false;
  Serve(*a, Prompt(2, 500));
  EXPECT_EQ(Drain(*a).dropped_writes, 2);
  faults_->fences_pass = true;
}

// The child half of AnotherProcessReadsWhatThisOneWrote: run by that test in a process of its
// own (skipped otherwise), it matches the prompt through Redis and checks every K/V value.
TEST(RemoteTierChildProcess, ReadsThePrefixAnotherProcessWrote) {
  const char* url = std::getenv("KVTIER_TEST_REMOTE_URL");
  if (url == nullptr) GTEST_SKIP() << "run by RemoteTierTest.AnotherProcessReadsWhatThisOneWrote";
  auto cache = testing::MustCreate(RemoteOptions(url));
  const std::vector<int32_t> prompt = Prompt(3, 4242);
  SequenceOptions options;
  options.prompt = prompt;
  const AddResult r = *cache->AddSequence(options);
  ASSERT_EQ(r.remote_tokens, 3 * kBlock);
  const size_t row = 2 * 64;
  std::vector<float> k(3 * kBlock * row), v(k.size());
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(cache->ReadKV(r.id, l, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_EQ(k[i], codec::HalfToFloat(ValueOf(prompt[i / row], l, i % row))) << i;
      ASSERT_EQ(v[i], codec::HalfToFloat(ValueOf(prompt[i / row] + 1000, l, i % row))) << i;
    }
  }
}

TEST_F(RemoteTierTest, AnotherProcessReadsWhatThisOneWrote) {
  auto a = Make(RemoteOptions(server_.url()));
  Serve(*a, Prompt(3, 4242));
  ASSERT_EQ(Drain(*a).written_blocks, 3);
  const std::string env = absl::StrCat("KVTIER_TEST_REMOTE_URL=", server_.url());
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--gtest_filter=RemoteTierChildProcess.*"};
  std::vector<char*> argv = {args[0].data(), args[1].data(), nullptr};
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  pid_t child;
  ASSERT_EQ(posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child process failed (its output is above)";
}

TEST(RemoteTierOptionsTest, ABadUrlOrAMissingModelIdIsRefused) {
  Options o = testing::SmallOptions();
  o.remote_tier_url = "http://127.0.0.1:6379";
  o.remote_model_id = "m";
  EXPECT_EQ(Cache::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.remote_tier_url = "redis://127.0.0.1:99999";
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.remote_tier_url = "redis://127.0.0.1:6379";
  o.remote_model_id = "";
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.remote_model_id = "m";
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.remote_secret = std::string(15, 's');
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.remote_secret = std::string(16, 's');
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.remote_tier_url = "";  // a secret without a remote tier: a mistake, said so
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o.remote_tier_url = "redis://127.0.0.1:6379";
  o.remote_secret = "";
  o.remote_timeout_ms = 0;
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
