// libFuzzer target: the input's bytes choose cache options (valid and hostile), then a sequence
// of API calls with valid and invalid arguments through every entry point: sequences, appends
// and batches, forks, releases, K/V writes and reads, demotion, policies (struct and JSON),
// format names, page tables and the adapter and attention entry points behind the Python module.
// After each call the cache must pass CheckConsistency, and a refused call (or any read-only
// one) must leave GetStats' state unchanged (tests/stats_diff.h). A violation aborts.
//
// Build: -DKVTIER_BUILD_FUZZERS=ON with clang (docs/reliability.md). KVTIER_FUZZ_COUNT=1 prints
// the number of API calls made at exit.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/adapters/block_tables.h"
#include "kvtier/adapters/flashinfer.h"
#include "kvtier/adapters/flex_attention.h"
#include "kvtier/adapters/tensorrt_llm.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/policy.h"
#include "tests/stats_diff.h"

namespace kvtier {
namespace {

constexpr const char* kFormats[] = {
    "fp16", "bf16", "fp8_e4m3/tensor", "fp8_e4m3/block_head", "fp8_e5m2/token_head",
    "nvfp4/tensor", "nvfp4/block_head", "nvfp4_channel/block_head", "fp8_e4m3/token_head",
    "k:nvfp4_channel/block_head,v:nvfp4/block_head"};

uint64_t calls = 0;

void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "kvtier fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

// A count: usually small, sometimes a block multiple, sometimes hostile.
int64_t Count(FuzzedDataProvider& in) {
  constexpr int64_t kHostile[] = {0, -1, INT64_MIN, INT64_MAX, INT64_MAX / 2 + 1, INT32_MAX,
                                  int64_t{1} << 40};
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return kHostile[in.ConsumeIntegralInRange<size_t>(0, 6)];
    case 1: return 16 * in.ConsumeIntegralInRange<int64_t>(1, 64);
    default: return in.ConsumeIntegralInRange<int64_t>(1, 40);
  }
}

Options MakeOptions(FuzzedDataProvider& in) {
  Options o;
  // Pages of 4 KiB and more, so that a few slabs hold at most a few thousand blocks and each
  // call's consistency check stays cheap.
  o.geometry.num_layers = in.ConsumeIntegralInRange<int32_t>(1, 2);
  o.geometry.num_kv_heads = in.PickValueInArray({2, 4});
  o.geometry.head_dim = in.PickValueInArray({64, 128});
  o.geometry.block_tokens = in.PickValueInArray({8, 16, 16});
  o.palette.clear();
  const int formats = in.ConsumeIntegralInRange<int>(1, 3);
  o.palette.push_back(*ParseFormat(in.PickValueInArray({"fp16", "bf16", "fp8_e4m3/tensor"})));
  for (int f = 1; f < formats; ++f) o.palette.push_back(*ParseFormat(in.PickValueInArray(kFormats)));
  o.memory_budget_bytes = o.slab_bytes * o.geometry.num_layers * in.ConsumeIntegralInRange<int>(1, 4);
  if (in.ConsumeBool()) {  // a host tier below the pools, sometimes storing a colder format
    o.host_tier_bytes = o.slab_bytes * o.geometry.num_layers * in.ConsumeIntegralInRange<int>(1, 3);
    o.host_tier_format = in.ConsumeIntegralInRange<int32_t>(-1, formats - 1);
  }
  if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {  // hostile options: Create must refuse cleanly
    switch (in.ConsumeIntegralInRange<int>(0, 6)) {
      case 0: o.memory_budget_bytes = in.ConsumeIntegral<size_t>(); break;
      case 1: o.backend = static_cast<BackendKind>(in.ConsumeIntegral<uint8_t>()); break;
      case 2: o.palette.back().k.type = static_cast<ElementType>(in.ConsumeIntegral<uint8_t>()); break;
      case 3: o.slab_bytes = in.ConsumeIntegral<size_t>(); break;
      case 4: o.geometry.head_dim = in.ConsumeIntegral<int32_t>(); break;
      case 5: o.host_tier_format = in.ConsumeIntegral<int32_t>(); break;
      default: o.k_tensor_amax.assign(o.geometry.num_layers, in.ConsumeFloatingPoint<float>());
    }
  }
  return o;
}

class Fuzz {
 public:
  Fuzz(FuzzedDataProvider* in, std::unique_ptr<Cache> cache) : in_(*in), cache_(std::move(cache)) {}

  void Run() {
    while (in_.remaining_bytes() > 0) {
      const int op = in_.ConsumeIntegralInRange<int>(0, 18);
      const CacheStats before = cache_->GetStats();
      calls += 1;
      bool read_only = false;
      const absl::Status s = Call(op, &read_only);
      if (!s.ok() && s.message().empty()) Fail("error without a message", s.ToString());
      if (!s.ok() || read_only) {
        const std::string diff = testing::StateDifference(before, cache_->GetStats());
        if (!diff.empty()) Fail(s.ok() ? "a read changed state" : "a refusal changed state",
                                absl::StrCat("op ", op, " ", s.ToString(), ": ", diff));
      }
      // allocation_failures counts refused calls: one at most, and only when this one was.
      const int64_t counted = cache_->GetStats().allocation_failures - before.allocation_failures;
      if (counted != 0 && (counted != 1 || !absl::IsResourceExhausted(s))) {
        Fail("allocation_failures", absl::StrCat("op ", op, " ", s.ToString(), ": +", counted));
      }
      const absl::Status ok = cache_->CheckConsistency();
      if (!ok.ok()) Fail("consistency", absl::StrCat("after op ", op, ": ", ok.ToString()));
    }
  }

 private:
  const Geometry& geometry() const { return cache_->options().geometry; }
  int formats() const { return static_cast<int>(cache_->options().palette.size()); }

  // A known sequence (live or released), or a made-up id.
  SequenceId Seq() {
    if (seqs_.empty() || in_.ConsumeIntegralInRange<int>(0, 15) == 0) {
      return SequenceId{in_.ConsumeIntegralInRange<uint32_t>(0, 8), in_.ConsumeIntegral<uint8_t>()};
    }
    return seqs_[in_.ConsumeIntegralInRange<size_t>(0, seqs_.size() - 1)];
  }
  std::vector<int32_t> Tokens(int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(n, 0), 5000)));
    const int32_t alphabet = in_.ConsumeIntegralInRange<int32_t>(1, 4);  // repeats share prefixes
    for (int32_t& x : t) x = in_.ConsumeIntegralInRange<int32_t>(0, alphabet);
    return t;
  }
  // K/V rows for `tokens` slots, sometimes mislabelled (a wrong count, dtype, head count or a
  // null pointer). The buffer always holds the rows it claims: the cache cannot check that.
  KVInput Input(int64_t tokens) {
    const Geometry& g = geometry();
    const int variant = in_.ConsumeIntegralInRange<int>(0, 12);
    const int64_t declared = variant == 3 ? in_.ConsumeIntegralInRange<int64_t>(0, 40) : tokens;
    data_.assign(static_cast<size_t>(std::max<int64_t>(tokens, declared)) * g.num_kv_heads * g.head_dim,
                 in_.ConsumeIntegral<uint16_t>());  // any bit pattern: NaN, Inf, subnormals
    KVInput kv{DType::kFloat16, data_.data(), data_.data(), declared, g.num_kv_heads, g.head_dim};
    if (variant == 0) kv.dtype = static_cast<DType>(in_.ConsumeIntegralInRange<int>(1, 7));
    if (variant == 1) kv.num_heads -= 1;  // fewer heads: never reads past the buffer
    if (variant == 2) kv.v = nullptr;
    return kv;
  }

  absl::Status Call(int op, bool* read_only);
  absl::Status AddSequence();
  absl::Status Append(int op);
  absl::Status WriteKV();
  absl::Status ReadKV();
  absl::Status Demote();
  absl::Status Policy();
  absl::Status RecordAttention();
  absl::Status Adapters();

  FuzzedDataProvider& in_;
  std::unique_ptr<Cache> cache_;
  std::vector<SequenceId> seqs_;
  std::vector<int64_t> slots_;
  std::vector<uint16_t> data_;
};

absl::Status Fuzz::AddSequence() {
  SequenceOptions o;
  const std::vector<int32_t> prompt = Tokens(in_.ConsumeIntegralInRange<int64_t>(0, 80));
  o.prompt = prompt;
  o.extra_key = in_.ConsumeIntegralInRange<uint64_t>(0, 2);
  o.coldest_format = in_.ConsumeIntegralInRange<int32_t>(-2, formats());
  o.priority = in_.ConsumeIntegralInRange<int32_t>(-1, 8);
  o.priority_ttl_steps = in_.ConsumeBool() ? -1 : Count(in_);
  absl::StatusOr<AddResult> added = cache_->AddSequence(o);
  if (!added.ok()) return added.status();
  seqs_.push_back(added->id);
  if (added->host_tokens > added->cached_tokens) Fail("host hit beyond the prefix hit", "");
  if (!cache_->FencePassed(added->ready_fence).ok()) Fail("ready fence refused", "");
  return absl::OkStatus();
}

absl::Status Fuzz::Append(int op) {
  slots_.clear();
  if (op == 1) return cache_->Append(Seq(), Count(in_), &slots_);
  if (op == 2) {
    const std::vector<int32_t> tokens = Tokens(in_.ConsumeIntegralInRange<int64_t>(0, 70));
    return cache_->AppendTokens(Seq(), tokens, &slots_);
  }
  std::vector<SequenceId> batch;
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int i = in_.ConsumeIntegralInRange<int>(0, 4); i > 0; --i) {
    batch.push_back(Seq());
    counts.push_back(in_.ConsumeBool() ? Count(in_) : in_.ConsumeIntegralInRange<int64_t>(1, 20));
    total += std::min<int64_t>(std::max<int64_t>(counts.back(), 0), 100);
  }
  if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) counts.push_back(1);  // mismatched lengths
  const std::vector<int32_t> tokens = in_.ConsumeBool() ? Tokens(total + in_.ConsumeIntegralInRange<int>(-1, 1))
                                                        : std::vector<int32_t>{};
  return cache_->AppendBatch(batch, counts, tokens, &slots_);
}

absl::Status Fuzz::WriteKV() {
  std::vector<int64_t> slots;
  if (!slots_.empty()) {
    const size_t first = in_.ConsumeIntegralInRange<size_t>(0, slots_.size() - 1);
    const size_t n = in_.ConsumeIntegralInRange<size_t>(0, slots_.size() - first);
    slots.assign(slots_.begin() + first, slots_.begin() + first + n);
  }
  if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) slots.push_back(Count(in_));  // a stray slot
  return cache_->WriteKV(in_.ConsumeIntegralInRange<int32_t>(-1, geometry().num_layers),
                         slots, Input(static_cast<int64_t>(slots.size())));
}

absl::Status Fuzz::ReadKV() {
  const SequenceId seq = Seq();
  absl::StatusOr<int64_t> length = cache_->SequenceLength(seq);
  const size_t row = static_cast<size_t>(geometry().num_kv_heads) * geometry().head_dim;
  int64_t n = length.ok() ? *length * static_cast<int64_t>(row) : 0;
  if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) n += in_.ConsumeIntegralInRange<int>(-1, 1);
  std::vector<float> k(static_cast<size_t>(std::max<int64_t>(n, 0))), v(k.size());
  return cache_->ReadKV(seq, in_.ConsumeIntegralInRange<int32_t>(-1, geometry().num_layers),
                        absl::MakeSpan(k), absl::MakeSpan(v));
}

absl::Status Fuzz::Demote() {
  absl::StatusOr<std::vector<BlockId>> blocks = cache_->SequenceBlocks(Seq());
  std::vector<BlockId> ids;
  if (blocks.ok()) {
    for (BlockId b : *blocks) {
      if (in_.ConsumeBool()) ids.push_back(b);
    }
  }
  if (!ids.empty() && in_.ConsumeIntegralInRange<int>(0, 7) == 0) ids.push_back(ids.front());
  if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) {
    ids.push_back(BlockId{in_.ConsumeIntegralInRange<uint32_t>(0, 300), in_.ConsumeIntegral<uint8_t>()});
  }
  return cache_->Demote(ids, in_.ConsumeIntegralInRange<int32_t>(-1, formats()));
}

// A policy from JSON (a template with fuzzed values, or raw text), set when it parses. A parsed
// policy must round-trip through PolicyToJson.
absl::Status Fuzz::Policy() {
  std::string json;
  if (in_.ConsumeBool()) {
    json = in_.ConsumeRandomLengthString(200);
  } else {
    json = absl::StrCat(R"({"name": ")", in_.ConsumeRandomLengthString(8), R"(", "tiers": [{"format": ")",
                        cache_->options().palette[0] == *ParseFormat("fp16") ? "fp16" : "bf16",
                        R"(", "max_age_tokens": )", Count(in_), R"(}, {"format": ")",
                        in_.PickValueInArray(kFormats), R"("}], "sink_tokens": )",
                        in_.ConsumeIntegralInRange<int>(-1, 40), R"(, "pressure_watermark": )",
                        in_.ConsumeFloatingPointInRange<double>(-0.5, 1.5), R"(, "attention_keep_ratio": )",
                        in_.PickValueInArray({0.0, 1.0, 4.0, 32.0, 0.5, -1.0, 1e9}), "}");
  }
  absl::StatusOr<kvtier::Policy> p = ParsePolicyJson(json);
  if (!p.ok()) return absl::OkStatus();  // parsing changes no cache: checked as a read
  absl::StatusOr<kvtier::Policy> again = ParsePolicyJson(PolicyToJson(*p));
  if (!again.ok() || PolicyToJson(*again) != PolicyToJson(*p)) {
    Fail("policy JSON round trip", PolicyToJson(*p));
  }
  return cache_->SetPolicy(*p);
}

// Attention weights for a sequence's blocks: usually one per block in [0, 1], sometimes the
// wrong count or out of range (NaN, negative, above 1).
absl::Status Fuzz::RecordAttention() {
  const SequenceId seq = Seq();
  const absl::StatusOr<std::vector<BlockId>> blocks = cache_->SequenceBlocks(seq);
  int64_t n = blocks.ok() ? static_cast<int64_t>(blocks->size()) : 2;
  if (in_.ConsumeIntegralInRange<int>(0, 7) == 0) n += in_.ConsumeIntegralInRange<int>(-1, 1);
  std::vector<float> weights(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (float& w : weights) {
    w = in_.ConsumeIntegralInRange<int>(0, 31) == 0
            ? in_.PickValueInArray({NAN, -1.f, 2.f, INFINITY})
            : in_.ConsumeFloatingPointInRange<float>(0.f, 1.f);
  }
  return cache_->RecordAttention(seq, weights);
}

// The read-only entry points behind the Python module's page-table, adapter and attention calls.
absl::Status Fuzz::Adapters() {
  std::vector<SequenceId> batch;
  for (int i = in_.ConsumeIntegralInRange<int>(0, 3); i > 0; --i) batch.push_back(Seq());
  PageTables tables;
  if (absl::Status s = cache_->BuildPageTables(batch, &tables); !s.ok()) return s;
  const Options& o = cache_->options();
  const int32_t format = in_.ConsumeIntegralInRange<int32_t>(-1, formats());
  const int32_t layer = in_.ConsumeIntegralInRange<int32_t>(-1, geometry().num_layers);
  switch (in_.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return BuildFlashInferParts(o, tables).status();
    case 1: return BuildBlockTableParts(static_cast<AdapterTarget>(in_.ConsumeIntegralInRange<int>(0, 4)),
                                        o, tables).status();
    case 2: return VllmSlotMapping(*cache_, slots_, in_.ConsumeIntegralInRange<int64_t>(-1, 64)).status();
    case 3: return GetFlashInferLayer(*cache_, format, layer).status();
    case 4: return GetFa3Descales(*cache_, format, layer, Count(in_) % 1000).status();
    case 5: return BuildFlexAttentionParts(o, tables).status();
    case 6: return BuildTensorRtLlmParts(o, tables).status();
    default: break;
  }
  const int32_t heads = geometry().num_kv_heads * in_.ConsumeIntegralInRange<int32_t>(0, 2);
  const size_t n = batch.size() * heads * geometry().head_dim;
  std::vector<float> q(n + in_.ConsumeIntegralInRange<int>(0, 1), 0.5f), out(n), lse(batch.size() * heads);
  const DecodeQueries queries{q, heads, 0.25f};
  DecodeOutputs outputs;
  outputs.out = absl::MakeSpan(out);
  outputs.lse = absl::MakeSpan(lse);
  if (in_.ConsumeBool()) return DecodeAttention(*cache_, layer, tables, queries, outputs);
  absl::StatusOr<PreparedDecode> step = PreparedDecode::Create(*cache_, tables);
  if (!step.ok()) return step.status();
  return DecodeAttention(*cache_, layer, *step, queries, outputs);
}

absl::Status Fuzz::Call(int op, bool* read_only) {
  switch (op) {
    case 0: return AddSequence();
    case 1: case 2: case 3: return Append(op);
    case 4: {
      absl::StatusOr<SequenceId> child = cache_->Fork(Seq());
      if (child.ok()) seqs_.push_back(*child);
      return child.status();
    }
    case 5: return cache_->Release(Seq());
    case 6: return WriteKV();
    case 8: return Demote();
    case 9: return Policy();
    case 10: return cache_->EndStep();
    case 18: return RecordAttention();
    case 11: {
      const int32_t layer = in_.ConsumeIntegralInRange<int32_t>(-1, geometry().num_layers);
      return cache_->CalibrateTensorScales(layer, Input(in_.ConsumeIntegralInRange<int64_t>(0, 8)));
    }
    default: break;
  }
  *read_only = true;
  switch (op) {
    case 7: return ReadKV();
    case 12: return cache_->GetBlockInfo(BlockId{in_.ConsumeIntegralInRange<uint32_t>(0, 600),
                                                 in_.ConsumeIntegral<uint8_t>()}).status();
    case 13: return cache_->GetPool(in_.ConsumeIntegralInRange<int32_t>(-1, formats()),
                                    in_.ConsumeIntegralInRange<int32_t>(-1, 2)).status();
    case 14: return cache_->SequenceBlocks(Seq()).status();
    case 15: {
      const std::string name = in_.ConsumeRandomLengthString(40);
      absl::StatusOr<FormatSpec> f = ParseFormat(name);
      if (f.ok() && *ParseFormat(FormatName(*f)) != *f) Fail("format name round trip", name);
      return absl::OkStatus();
    }
    default: return Adapters();
  }
}

}  // namespace
}  // namespace kvtier

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool count = [] {
    if (std::getenv("KVTIER_FUZZ_COUNT") == nullptr) return false;
    std::atexit([] { std::fprintf(stderr, "kvtier fuzz: %llu API calls\n",
                                  static_cast<unsigned long long>(kvtier::calls)); });
    return true;
  }();
  (void)count;
  FuzzedDataProvider in(data, size);
  const kvtier::Options options = kvtier::MakeOptions(in);
  absl::StatusOr<std::unique_ptr<kvtier::Cache>> cache = kvtier::Cache::Create(options);
  kvtier::calls += 1;
  if (!cache.ok()) {
    if (cache.status().message().empty()) kvtier::Fail("Create error without a message", "");
    return 0;
  }
  kvtier::Fuzz(&in, std::move(*cache)).Run();
  return 0;
}
