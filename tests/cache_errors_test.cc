// Every bad input answers a clear Status and leaves the cache exactly as it was.
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::ExpectSameState;
using ::kvtier::testing::MustCreate;
using ::kvtier::testing::SmallOptions;

TEST(OptionsErrorsTest, InvalidOptionsNameTheField) {
  struct Case {
    const char* field;
    void (*mutate)(Options&);
  };
  const Case cases[] = {
      {"num_layers", [](Options& o) { o.geometry.num_layers = 0; }},
      {"num_kv_heads", [](Options& o) { o.geometry.num_kv_heads = 300; }},
      {"head_dim", [](Options& o) { o.geometry.head_dim = 72; }},
      {"block_tokens", [](Options& o) { o.geometry.block_tokens = 0; }},
      {"slab_bytes", [](Options& o) { o.slab_bytes = 3 << 20; }},
      {"memory_budget_bytes", [](Options& o) { o.memory_budget_bytes = 1 << 20; }},
      {"palette", [](Options& o) { o.palette.clear(); }},
      {"palette", [](Options& o) { o.palette.assign(9, FormatSpec{}); }},
      {"palette[1]", [](Options& o) { o.palette.push_back(FormatSpec{}); }},
      {"palette[0]", [](Options& o) { o.palette = {*ParseFormat("fp8_e4m3/block_head")}; }},
      {"palette[1]", [](Options& o) {
         o.geometry.block_tokens = 8;
         o.palette.push_back(*ParseFormat("nvfp4_channel/block_head"));
       }},
      {"palette[0]", [](Options& o) {
         o.palette[0].k.scope = ScaleScope::kTensor;  // FP16 with a scale
       }},
      {"palette[0]", [](Options& o) {
         o.geometry.num_kv_heads = 256;
         o.geometry.head_dim = 1024;  // a page of 8 MiB exceeds a 2 MiB slab
       }},
      {"palette[0]", [](Options& o) {
         o.geometry = Geometry{1, 3, 256, 512};  // pages of 1.5 MiB: some 2 MiB slabs hold none
         o.memory_budget_bytes = 8 * o.slab_bytes;
       }},
      // The remote identity appends option text to the model id: a NUL could make two match.
      {"remote_model_id", [](Options& o) { o.remote_model_id = std::string("m\0x", 3); }},
      {"k_tensor_amax", [](Options& o) { o.k_tensor_amax = {1.f}; }},
      {"v_tensor_amax", [](Options& o) { o.v_tensor_amax = {1.f, -2.f}; }},
      // An enum out of range (from bindings or a cast): was a null backend dereferenced.
      {"backend", [](Options& o) { o.backend = static_cast<BackendKind>(7); }},
      // Block metadata is sized from the budget: SIZE_MAX threw std::bad_alloc.
      {"memory_budget_bytes", [](Options& o) { o.memory_budget_bytes = SIZE_MAX; }},
      {"memory_budget_bytes", [](Options& o) { o.memory_budget_bytes = size_t{1} << 50; }},
      // Element type, scale scope and micro axis out of range: was accepted, then decoded garbage.
      {"palette[1]", [](Options& o) {
         o.memory_budget_bytes *= 2;
         o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
         o.palette[1].v.type = static_cast<ElementType>(9);
       }},
      {"palette[0]", [](Options& o) { o.palette[0].k.scope = static_cast<ScaleScope>(200); }},
      {"palette[0]", [](Options& o) { o.palette[0].v.axis = static_cast<MicroAxis>(3); }},
      // One slab per layer, three formats: no demotion could ever find a slab for its target.
      {"memory_budget_bytes", [](Options& o) {
         o.memory_budget_bytes = size_t{2} * o.slab_bytes;
         o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
         o.palette.push_back(*ParseFormat("nvfp4/block_head"));
       }},
  };
  for (const Case& c : cases) {
    Options o = SmallOptions();
    c.mutate(o);
    absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(cache.status().message().find(c.field), absl::string_view::npos)
        << c.field << ": " << cache.status();
  }
}

TEST(OptionsErrorsTest, UndemotablePaletteSaysWhy) {
  Options o = SmallOptions(/*slabs_per_layer=*/1);
  EXPECT_TRUE(ValidateOptions(o).ok());  // one format needs one slab
  o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
  const absl::Status s = ValidateOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("demoted"), absl::string_view::npos) << s;
}

// The largest budget under the metadata limit is created; one slab more is refused, never thrown.
TEST(OptionsErrorsTest, BudgetAtTheMetadataLimit) {
  Options o;
  o.geometry = Geometry{1, 16, 128, 16};  // FP16 pages of 128 KiB: 16 per slab
  o.memory_budget_bytes = (size_t{1} << 20) * o.slab_bytes;  // 2^20 slabs x 16 = 2^24 blocks
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
  o.memory_budget_bytes += o.slab_bytes;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateOptions(o)));
}

// KV events keep each block's token ids, for every block the budgets could hold: long blocks at
// the block limit would take 64 GiB; the options are refused (16-token blocks there pass).
TEST(OptionsErrorsTest, KvEventsKeepTheirMetadataBounded) {
  Options o;
  o.geometry = Geometry{1, 1, 16, 1024};  // FP16 pages of 64 KiB: 32 per slab
  o.memory_budget_bytes = (size_t{1} << 19) * o.slab_bytes;  // 2^19 slabs x 32 = 2^24 blocks
  ASSERT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
  o.kv_events_endpoint = "ipc:///tmp/kvtier-bound";
  const absl::Status s = ValidateOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("kv_events_endpoint"), absl::string_view::npos) << s;
  o.geometry = Geometry{1, 16, 128, 16};  // 16-token blocks at the limit: 80 bytes each
  o.memory_budget_bytes = (size_t{1} << 20) * o.slab_bytes;
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
}

// An inproc:// endpoint reaches only sockets of the publisher's own ZeroMQ context, which no
// caller has: refused, naming the field (it was bound, and its batches counted as published to
// nobody).
TEST(OptionsErrorsTest, AnInprocEventEndpointIsRefused) {
  Options o = SmallOptions();
  o.kv_events_endpoint = "inproc://kv";
  absl::Status s = ValidateOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("kv_events_endpoint"), absl::string_view::npos) << s;
  o.kv_events_endpoint = "ipc:///tmp/kvtier-kv";
  o.kv_events_replay_endpoint = "inproc://replay";
  s = ValidateOptions(o);
  EXPECT_NE(s.message().find("kv_events_replay_endpoint"), absl::string_view::npos) << s;
  o.kv_events_replay_endpoint = "ipc:///tmp/kvtier-replay";
  EXPECT_TRUE(ValidateOptions(o).ok()) << ValidateOptions(o);
}

// CI has no GPU: a build without CUDA answers Unimplemented, a CUDA build finds no driver or
// device and answers Unavailable or FailedPrecondition. Never a crash, never OK.
TEST(OptionsErrorsTest, CudaBackendWithoutAGpuFailsCleanly) {
  Options o = SmallOptions();
  o.backend = BackendKind::kCuda;
  const absl::Status s = Cache::Create(o).status();
  EXPECT_TRUE(absl::IsUnimplemented(s) || absl::IsUnavailable(s) || absl::IsFailedPrecondition(s))
      << s;
  EXPECT_NE(s.message().find("CUDA"), absl::string_view::npos) << s;
}

class CacheErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_ = MustCreate(SmallOptions(/*slabs_per_layer=*/1));  // 256 blocks
    live_ = *cache_->AddSequence();
    ASSERT_TRUE(cache_->Append(live_, 20, &slots_).ok());
    released_ = *cache_->AddSequence();
    std::vector<int64_t> ignored;
    ASSERT_TRUE(cache_->Append(released_, 3, &ignored).ok());
    ASSERT_TRUE(cache_->Release(released_).ok());
    before_ = cache_->GetStats();
  }

  // The call failed with `code`; the cache must be as it was.
  void ExpectUnchanged(const absl::Status& status, absl::StatusCode code) {
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_FALSE(status.message().empty());
    ExpectSameState(before_, cache_->GetStats());
    EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
    EXPECT_EQ(*cache_->SequenceLength(live_), 20);
  }

  KVInput Input(int64_t tokens) {
    k_.assign(tokens * 2 * 64, 0x3C00);  // 1.0
    return KVInput{DType::kFloat16, k_.data(), k_.data(), tokens, 2, 64};
  }

  std::unique_ptr<Cache> cache_;
  SequenceId live_, released_;
  std::vector<int64_t> slots_;
  std::vector<uint16_t> k_;
  CacheStats before_;
};

TEST_F(CacheErrorsTest, StaleOrUnknownSequence) {
  std::vector<int64_t> slots;
  for (SequenceId bad : {released_, SequenceId{}, SequenceId{77, 1}}) {
    ExpectUnchanged(cache_->Append(bad, 1, &slots), absl::StatusCode::kNotFound);
    ExpectUnchanged(cache_->Fork(bad).status(), absl::StatusCode::kNotFound);
    ExpectUnchanged(cache_->SequenceLength(bad).status(), absl::StatusCode::kNotFound);
    ExpectUnchanged(cache_->SequenceBlocks(bad).status(), absl::StatusCode::kNotFound);
    std::vector<float> none;
    ExpectUnchanged(cache_->ReadKV(bad, 0, absl::MakeSpan(none), absl::MakeSpan(none)),
                    absl::StatusCode::kNotFound);
  }
  EXPECT_TRUE(slots.empty());
}

TEST_F(CacheErrorsTest, DoubleRelease) {
  ExpectUnchanged(cache_->Release(released_), absl::StatusCode::kNotFound);
}

TEST_F(CacheErrorsTest, StaleBlockId) {
  const BlockId block = cache_->SequenceBlocks(live_)->front();
  EXPECT_TRUE(cache_->GetBlockInfo(block).ok());
  ExpectUnchanged(cache_->GetBlockInfo(BlockId{block.index, block.generation + 1}).status(),
                  absl::StatusCode::kNotFound);
  ExpectUnchanged(cache_->GetBlockInfo(BlockId{1u << 30, 1}).status(), absl::StatusCode::kNotFound);
}

TEST_F(CacheErrorsTest, AppendBeyondTheBudget) {
  std::vector<int64_t> slots;
  ExpectUnchanged(cache_->Append(live_, 256 * 16, &slots), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(slots.empty());
  EXPECT_EQ(cache_->GetStats().allocation_failures, before_.allocation_failures + 1);
  // What still fits, fits.
  EXPECT_TRUE(cache_->Append(live_, 254 * 16, &slots).ok());
}

TEST_F(CacheErrorsTest, BadAppendArguments) {
  std::vector<int64_t> slots;
  ExpectUnchanged(cache_->Append(live_, 0, &slots), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged(cache_->Append(live_, -5, &slots), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged(cache_->Append(live_, 1, nullptr), absl::StatusCode::kInvalidArgument);
}

// Counts whose page arithmetic overflowed: a negative page count passed the budget check and
// PagePool::Allocate read out of bounds.
TEST_F(CacheErrorsTest, AppendCountsThatOverflow) {
  std::vector<int64_t> slots;
  ExpectUnchanged(cache_->Append(live_, INT64_MAX, &slots), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged(cache_->Append(live_, INT64_MAX - 3, &slots), absl::StatusCode::kInvalidArgument);
  const SequenceId two[] = {live_, live_};
  const int64_t halves[] = {INT64_MAX / 2 + 1, INT64_MAX / 2 + 1};
  const absl::Status s = cache_->AppendBatch(two, halves, {}, &slots);
  ExpectUnchanged(s, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_tokens[0] 4611686018427387904 is outside [1, 2147483647]"),
            absl::string_view::npos) << s;
  const int64_t wraps[] = {5, INT64_MAX};
  ExpectUnchanged(cache_->AppendBatch(two, wraps, {}, &slots), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(slots.empty());
}

// A sequence named twice in a batch appends after itself: its second count starts where the
// first ends. Planned from the same tail room twice, [7, 7] into 12 free slots and no free page
// passed the budget check and PagePool::Allocate read out of bounds (found by the fuzzer).
TEST_F(CacheErrorsTest, ASequenceTwiceInABatchIsPlannedAfterItself) {
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->Append(live_, 254 * 16, &slots).ok());  // every page; 12 slots left in the tail
  before_ = cache_->GetStats();
  const SequenceId two[] = {live_, live_};
  const int64_t sevens[] = {7, 7};
  slots.clear();
  const absl::Status s = cache_->AppendBatch(two, sevens, {}, &slots);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(slots.empty());
  EXPECT_EQ(*cache_->SequenceLength(live_), 20 + 254 * 16);
  const int64_t sixes[] = {6, 6};
  EXPECT_TRUE(cache_->AppendBatch(two, sixes, {}, &slots).ok());
  EXPECT_EQ(slots.size(), 12u);
  EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
}

TEST_F(CacheErrorsTest, AppendNoTokenIds) {
  std::vector<int64_t> slots;
  const absl::Status s = cache_->AppendTokens(live_, {}, &slots);
  ExpectUnchanged(s, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tokens is empty"), absl::string_view::npos) << s;
}

TEST_F(CacheErrorsTest, WriteWithWrongShapeOrDtype) {
  const absl::Span<const int64_t> two(slots_.data(), 2);
  KVInput kv = Input(2);
  kv.dtype = DType::kFloat32;
  ExpectUnchanged(cache_->WriteKV(0, two, kv), absl::StatusCode::kInvalidArgument);
  kv = Input(2);
  kv.num_heads = 3;
  ExpectUnchanged(cache_->WriteKV(0, two, kv), absl::StatusCode::kInvalidArgument);
  kv = Input(2);
  kv.head_dim = 128;
  ExpectUnchanged(cache_->WriteKV(0, two, kv), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged(cache_->WriteKV(0, two, Input(3)), absl::StatusCode::kInvalidArgument);
  kv = Input(2);
  kv.v = nullptr;
  absl::Status s = cache_->WriteKV(0, two, kv);
  ExpectUnchanged(s, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the v data pointer"), absl::string_view::npos) << s;
  kv.k = nullptr;
  s = cache_->WriteKV(0, two, kv);
  EXPECT_NE(s.message().find("the k and v data pointer"), absl::string_view::npos) << s;
  kv = Input(2);
  kv.k = nullptr;
  s = cache_->WriteKV(0, two, kv);
  EXPECT_NE(s.message().find("the k data pointer"), absl::string_view::npos) << s;
  // An odd address (a tensor sliced at a byte): its 2-byte elements would be read unaligned.
  kv = Input(2);
  kv.v = static_cast<const char*>(kv.v) + 1;
  s = cache_->WriteKV(0, two, kv);
  ExpectUnchanged(s, absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the v data pointer is not 2-byte aligned"), absl::string_view::npos)
      << s;
  ExpectUnchanged(cache_->WriteKV(2, two, Input(2)), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged(cache_->WriteKV(-1, two, Input(2)), absl::StatusCode::kInvalidArgument);
}

TEST_F(CacheErrorsTest, WriteToUnreservedSlotsSaysWhich) {
  const int64_t tail_page = slots_.back() / 16;
  struct Case {
    int64_t slot;
    const char* why;
  };
  for (const Case& c : {Case{-1, "outside [0, 4096)"}, Case{int64_t{1} << 40, "outside [0, 4096)"},
                        Case{tail_page * 16 + 4, "offset 4 of a block with 4 reserved tokens"},
                        Case{int64_t{200} * 16, "holds no block"}}) {
    const int64_t one[] = {c.slot};
    const absl::Status s = cache_->WriteKV(0, one, Input(1));
    ExpectUnchanged(s, absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.why), absl::string_view::npos) << c.why << " not in: " << s;
  }
}

TEST(CacheErrorsReleasedTest, WriteToAReleasedSlotSaysSo) {
  std::unique_ptr<Cache> cache = MustCreate(SmallOptions(1));
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 3, &slots).ok());
  const SequenceId keep = *cache->AddSequence();  // keeps the slab mapped
  std::vector<int64_t> kept;
  ASSERT_TRUE(cache->Append(keep, 3, &kept).ok());
  ASSERT_TRUE(cache->Release(seq).ok());
  std::vector<uint16_t> k(2 * 64, 0x3C00);
  const KVInput kv{DType::kFloat16, k.data(), k.data(), 1, 2, 64};
  const absl::Status s = cache->WriteKV(0, absl::MakeConstSpan(slots.data(), 1), kv);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("holds no block"), absl::string_view::npos) << s;
}

TEST_F(CacheErrorsTest, WriteIntoASharedTail) {
  const SequenceId child = *cache_->Fork(live_);
  before_ = cache_->GetStats();
  const int64_t tail[] = {slots_.back()};
  ExpectUnchanged(cache_->WriteKV(0, tail, Input(1)), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cache_->Release(child).ok());
  EXPECT_TRUE(cache_->WriteKV(0, tail, Input(1)).ok());
}

TEST_F(CacheErrorsTest, ReadWithWrongSizes) {
  std::vector<float> k(20 * 2 * 64), v(20 * 2 * 64 - 1);
  ExpectUnchanged(cache_->ReadKV(live_, 0, absl::MakeSpan(k), absl::MakeSpan(v)),
                  absl::StatusCode::kInvalidArgument);
  v.resize(k.size());
  ExpectUnchanged(cache_->ReadKV(live_, 5, absl::MakeSpan(k), absl::MakeSpan(v)),
                  absl::StatusCode::kInvalidArgument);
}

TEST_F(CacheErrorsTest, PageTablesForAnUnknownSequence) {
  PageTables tables;
  ASSERT_TRUE(cache_->BuildPageTables({live_}, &tables).ok());
  const PageTables copy = tables;
  ExpectUnchanged(cache_->BuildPageTables({live_, released_}, &tables),
                  absl::StatusCode::kNotFound);
  EXPECT_EQ(tables.packed, copy.packed);
  EXPECT_EQ(tables.seq_lens, copy.seq_lens);
  ExpectUnchanged(cache_->BuildPageTables({live_}, nullptr), absl::StatusCode::kInvalidArgument);
}

TEST_F(CacheErrorsTest, CalibrationCountsOutOfRange) {
  KVInput kv = Input(1);
  kv.num_tokens = -1;
  ExpectUnchanged(cache_->CalibrateTensorScales(0, kv), absl::StatusCode::kInvalidArgument);
  kv.num_tokens = INT64_MAX;
  ExpectUnchanged(cache_->CalibrateTensorScales(0, kv), absl::StatusCode::kInvalidArgument);
}

// A TTL of INT64_MAX steps: steps + ttl overflowed.
TEST_F(CacheErrorsTest, PriorityTtlNearInt64Max) {
  SequenceOptions options;
  options.priority = 3;
  options.priority_ttl_steps = INT64_MAX;
  const std::vector<int32_t> prompt(33, 7);
  options.prompt = prompt;
  const SequenceId seq = cache_->AddSequence(options)->id;
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache_->AppendTokens(seq, prompt, &slots).ok());
  ASSERT_TRUE(cache_->EndStep().ok());
  ASSERT_TRUE(cache_->Release(seq).ok());
  ASSERT_TRUE(cache_->EndStep().ok());
  EXPECT_TRUE(cache_->CheckConsistency().ok()) << cache_->CheckConsistency();
  EXPECT_EQ(cache_->GetStats().formats[0].blocks_cached, 2);
}

// A refused Append evicts nothing. Here the FP8 slab holds cached blocks and blocks in use, so
// evicting the cached ones cannot free it (the old bound counted it free, evicted, then failed).
TEST(CacheErrorsEvictionTest, RefusedAppendEvictsNothing) {
  Options o = SmallOptions(/*slabs_per_layer=*/2);
  o.palette.push_back(*ParseFormat("fp8_e4m3/block_head"));
  std::unique_ptr<Cache> cache = MustCreate(o);
  std::vector<int64_t> slots;
  std::vector<int32_t> a(32), b(32);
  for (int i = 0; i < 32; ++i) a[i] = i, b[i] = 100 + i;
  const SequenceId live = *cache->AddSequence(), gone = *cache->AddSequence();
  ASSERT_TRUE(cache->AppendTokens(live, a, &slots).ok());
  ASSERT_TRUE(cache->AppendTokens(gone, b, &slots).ok());
  std::vector<BlockId> blocks = *cache->SequenceBlocks(live);
  const std::vector<BlockId> gone_blocks = *cache->SequenceBlocks(gone);
  blocks.insert(blocks.end(), gone_blocks.begin(), gone_blocks.end());
  ASSERT_TRUE(cache->Demote(blocks, 1).ok());
  ASSERT_TRUE(cache->Release(gone).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const CacheStats before = cache->GetStats();
  ASSERT_EQ(before.formats[1].blocks_cached, 2);
  ASSERT_EQ(before.formats[0].slabs_mapped, 1);
  ASSERT_EQ(before.slabs_free, 0);
  const SequenceId big = *cache->AddSequence();
  const CacheStats added = cache->GetStats();
  const absl::Status s = cache->Append(big, 16 * 257, &slots);  // needs a second FP16 slab
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  const CacheStats after = cache->GetStats();
  ExpectSameState(added, after);
  EXPECT_EQ(after.evicted_blocks, before.evicted_blocks);
  EXPECT_EQ(after.formats[1].blocks_cached, 2);
  EXPECT_TRUE(cache->CheckConsistency().ok());
  // What fits without the FP8 slab still evicts as before.
  EXPECT_TRUE(cache->Append(big, 16 * 256, &slots).ok());
}

TEST_F(CacheErrorsTest, PoolOutOfRange) {
  ExpectUnchanged(cache_->GetPool(1, 0).status(), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged(cache_->GetPool(0, 2).status(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier
