// The adapters on the CPU backend: per-format tables against the cache's own block metadata for
// ragged batches and mixed palettes, refusals, views that address exactly the page layout's
// bytes (read through the strides, compared with ReadKV), and the partition-and-merge path
// (per-format attention merged by LSE equals attention over the whole sequence).
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/codec/fp4.h"
#include "kernels/codec/fp8.h"
#include "kernels/codec/half.h"
#include "kernels/codec/nvfp4.h"
#include "kvtier/adapters/block_tables.h"
#include "kvtier/adapters/flashinfer.h"
#include "kvtier/adapters/flex_attention.h"
#include "kvtier/adapters/partial_states.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/adapters/scale_conventions.h"
#include "kvtier/adapters/target.h"
#include "kvtier/adapters/tensor_view.h"
#include "kvtier/adapters/tensorrt_llm.h"
#include "kvtier/attention.h"
#include "src/attention/reference_attention.h"
#include "src/status_macros.h"
#include "tests/test_util.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MustCreate;
using ::kvtier::testing::PaletteOptions;
using ::kvtier::testing::RandomFloats;
using ::kvtier::testing::RandomHalves;

constexpr int kLayers = 2, kHeads = 2, kDim = 32, kTokens = 16;

Options MixedOptions(std::vector<std::string> palette, int block_tokens = kTokens) {
  Options o = PaletteOptions(Geometry{kLayers, kHeads, kDim, block_tokens}, palette, 16);
  o.k_tensor_amax.assign(kLayers, 12.f);
  o.v_tensor_amax.assign(kLayers, 10.f);
  return o;
}

// A sequence of `length` random tokens in every layer.
SequenceId WriteRandom(Cache& cache, int64_t length, uint32_t seed) {
  const Geometry& g = cache.options().geometry;
  const SequenceId seq = *cache.AddSequence();
  if (length == 0) return seq;
  std::vector<int64_t> slots;
  EXPECT_TRUE(cache.Append(seq, length, &slots).ok());
  const size_t n = static_cast<size_t>(length) * g.num_kv_heads * g.head_dim;
  for (int layer = 0; layer < g.num_layers; ++layer) {
    const std::vector<uint16_t> k = RandomHalves(n, seed + 10 * layer);
    const std::vector<uint16_t> v = RandomHalves(n, seed + 10 * layer + 1);
    EXPECT_TRUE(cache
                    .WriteKV(layer, slots,
                             KVInput{DType::kFloat16, k.data(), v.data(), length, g.num_kv_heads,
                                     g.head_dim})
                    .ok());
  }
  return seq;
}

// Demotes the full blocks of `seq` whose index i has (i % 3 == which) to palette `format`.
void DemoteEvery3rd(Cache& cache, SequenceId seq, int which, int32_t format) {
  const std::vector<BlockId> blocks = *cache.SequenceBlocks(seq);
  std::vector<BlockId> chosen;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockInfo info = *cache.GetBlockInfo(blocks[i]);
    if (static_cast<int>(i % 3) == which && info.num_tokens == kTokens && info.format < format) {
      chosen.push_back(blocks[i]);
    }
  }
  ASSERT_TRUE(cache.Demote(chosen, format).ok());
}

struct Batch {
  std::unique_ptr<Cache> cache;
  std::vector<SequenceId> seqs;
  PageTables tables;
};

// Ragged lengths (one empty), blocks spread over the palette in an interleaved pattern.
Batch MakeMixedBatch(std::vector<std::string> palette) {
  Batch b;
  b.cache = MustCreate(MixedOptions(palette));
  const std::vector<int64_t> lengths = {45, 0, 1, 16, 100, 33};
  for (size_t i = 0; i < lengths.size(); ++i) {
    b.seqs.push_back(WriteRandom(*b.cache, lengths[i], 100 + 7 * static_cast<uint32_t>(i)));
  }
  for (int32_t f = 1; f < static_cast<int32_t>(palette.size()); ++f) {
    for (SequenceId s : b.seqs) DemoteEvery3rd(*b.cache, s, f % 3, f);
  }
  EXPECT_TRUE(b.cache->BuildPageTables(b.seqs, &b.tables).ok());
  return b;
}

// Expected (format, page) lists of a sequence, from the cache's block metadata.
std::vector<std::vector<int32_t>> PagesByFormat(const Cache& cache, SequenceId seq) {
  std::vector<std::vector<int32_t>> pages(cache.options().palette.size());
  const std::vector<BlockId> blocks = *cache.SequenceBlocks(seq);
  for (BlockId id : blocks) {
    const BlockInfo info = *cache.GetBlockInfo(id);
    pages[info.format].push_back(info.page);
  }
  return pages;
}

TEST(AdaptersTest, PartsMatchTheCachesBlocksForARaggedMixedBatch) {
  Batch b = MakeMixedBatch({"fp16", "fp8_e4m3/tensor", "nvfp4/tensor"});
  absl::StatusOr<std::vector<FormatPart>> parts = BuildFlashInferParts(b.cache->options(), b.tables);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);  // every format is present
  std::vector<int64_t> covered(b.seqs.size(), 0);
  std::vector<int> found(b.seqs.size(), 0);
  for (const FormatPart& part : *parts) {
    ASSERT_EQ(part.indptr.size(), part.batch_index.size() + 1);
    for (int64_t r = 0; r < part.rows(); ++r) {
      const int32_t bi = part.batch_index[r];
      if (r > 0) {
        EXPECT_LT(part.batch_index[r - 1], bi);
      }
      const std::vector<int32_t> want = PagesByFormat(*b.cache, b.seqs[bi])[part.format];
      const std::vector<int32_t> got(part.indices.begin() + part.indptr[r],
                                     part.indices.begin() + part.indptr[r + 1]);
      EXPECT_EQ(got, want) << "format " << part.format << " row " << bi;
      EXPECT_GE(part.last_page_len[r], 1);
      EXPECT_LE(part.last_page_len[r], kTokens);
      EXPECT_EQ(part.lengths[r], kTokens * (got.size() - 1) + part.last_page_len[r]);
      if (part.format != 0) {
        EXPECT_EQ(part.last_page_len[r], kTokens);  // tails stay hot
      }
      covered[bi] += part.lengths[r];
      ++found[bi];
    }
  }
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    EXPECT_EQ(covered[i], *b.cache->SequenceLength(b.seqs[i])) << i;
  }
  EXPECT_EQ(found[1], 0);  // the empty sequence is in no part
  EXPECT_EQ(found[4], 3);  // 100 tokens: blocks in all three formats
}

TEST(AdaptersTest, BlockTableFlexAndTensorRtTablesAgreeWithTheParts) {
  Batch b = MakeMixedBatch({"fp16", "fp8_e4m3/tensor"});
  const Options& o = b.cache->options();
  const std::vector<FormatPart> parts = *PartitionByFormat(o, b.tables);

  const std::vector<BlockTablePart> bt =
      *BuildBlockTableParts(AdapterTarget::kVllm, o, b.tables, {/*max_blocks=*/12, -7});
  std::vector<FlexAttentionPart> flex;  // FlexAttention reads FP16 only: just that part
  ASSERT_EQ(BuildFlexAttentionParts(o, b.tables).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<TensorRtLlmPart> trt = *BuildTensorRtLlmParts(o, b.tables);
  ASSERT_EQ(bt.size(), parts.size());
  ASSERT_EQ(trt.size(), parts.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    const FormatPart& part = parts[p];
    EXPECT_EQ(bt[p].batch_index, part.batch_index);
    EXPECT_EQ(bt[p].seq_lens, part.lengths);
    EXPECT_EQ(bt[p].max_blocks, 12);
    const PageLayout l = MakePageLayout(kHeads, kTokens, kDim, o.palette[part.format]);
    const int64_t block = int64_t{kHeads} * kTokens * l.k.row_bytes;
    EXPECT_EQ(trt[p].bytes_per_block, block);
    for (int64_t r = 0; r < part.rows(); ++r) {
      const int32_t n = part.indptr[r + 1] - part.indptr[r];
      for (int32_t i = 0; i < 12; ++i) {
        const int32_t got = bt[p].block_table[r * 12 + i];
        EXPECT_EQ(got, i < n ? part.indices[part.indptr[r] + i] : -7);
      }
      for (int32_t i = 0; i < n; ++i) {
        const int64_t page = part.indices[part.indptr[r] + i];
        EXPECT_EQ(trt[p].block_offsets[(r * 2) * trt[p].max_blocks + i] * block,
                  page * l.page_bytes + l.k.payload_offset);
        EXPECT_EQ(trt[p].block_offsets[(r * 2 + 1) * trt[p].max_blocks + i] * block,
                  page * l.page_bytes + l.v.payload_offset);
      }
    }
  }
  EXPECT_EQ(BuildBlockTableParts(AdapterTarget::kVllm, o, b.tables, {/*max_blocks=*/2, 0})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);

  // FlexAttention over an FP16-only cache, with a fork sharing pages.
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp16"}));
  const SequenceId a = WriteRandom(*cache, 40, 1);
  const SequenceId forked = *cache->Fork(a);
  const SequenceId c = WriteRandom(*cache, 20, 2);
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables({a, forked, c}, &tables).ok());
  flex = *BuildFlexAttentionParts(cache->options(), tables);
  ASSERT_EQ(flex.size(), 1u);
  EXPECT_EQ(flex[0].n_pages, 3 + 2);  // the fork shares a's three pages
  EXPECT_EQ(flex[0].seq_lens, (std::vector<int64_t>{40, 40, 20}));
  for (int64_t r = 0; r < flex[0].rows(); ++r) {
    for (int64_t i = 0; i < flex[0].n_pages; ++i) {
      const int64_t phys = flex[0].page_table[r * flex[0].n_pages + i];
      if (phys < 0) continue;
      EXPECT_EQ(flex[0].physical_to_logical[r * flex[0].n_pages + phys], i);
    }
  }
}

TEST(AdaptersTest, EachTargetReadsItsFormatsAndRefusesTheRest) {
  const Geometry g{1, 2, 32, 16};
  const std::vector<std::string> formats = {
      "fp16", "bf16", "fp8_e4m3/tensor", "fp8_e5m2/tensor", "nvfp4/tensor",
      "fp8_e4m3/block_head", "fp8_e4m3/token_head", "nvfp4/block_head",
      "nvfp4_channel/block_head", "k:fp16,v:fp8_e4m3/tensor"};
  struct Row {
    AdapterTarget target;
    std::vector<bool> reads;  // per entry of `formats`
  };
  const std::vector<Row> rows = {
      {AdapterTarget::kFlashInfer, {1, 1, 1, 1, 1, 0, 0, 0, 0, 0}},
      {AdapterTarget::kFlashAttention3, {1, 1, 1, 0, 0, 0, 0, 0, 0, 0}},
      {AdapterTarget::kVllm, {1, 1, 1, 1, 0, 0, 0, 0, 0, 0}},
      {AdapterTarget::kFlexAttention, {1, 1, 0, 0, 0, 0, 0, 0, 0, 0}},
      {AdapterTarget::kTensorRtLlm, {1, 1, 1, 0, 0, 0, 0, 0, 0, 0}},
      {AdapterTarget::kFlashAttention2, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},  // pages of 16 < 256
  };
  for (const Row& row : rows) {
    for (size_t i = 0; i < formats.size(); ++i) {
      const absl::Status s = CheckReadable(row.target, *ParseFormat(formats[i]), g);
      const std::string name = AdapterTargetName(row.target);
      if (row.reads[i]) {
        EXPECT_TRUE(s.ok()) << name << " " << formats[i] << ": " << s;
        continue;
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << " " << formats[i];
      EXPECT_NE(s.message().find(name), std::string::npos) << s;
      EXPECT_NE(s.message().find(formats[i]), std::string::npos) << s;
    }
  }
  EXPECT_TRUE(
      CheckReadable(AdapterTarget::kFlashAttention2, *ParseFormat("bf16"), Geometry{1, 2, 32, 256})
          .ok());
  EXPECT_FALSE(
      CheckReadable(AdapterTarget::kTensorRtLlm, *ParseFormat("fp16"), Geometry{1, 2, 32, 12}).ok());
  EXPECT_EQ(*ParseAdapterTarget("flashinfer"), AdapterTarget::kFlashInfer);
  EXPECT_FALSE(ParseAdapterTarget("xformers").ok());
}

// The NHD views of a dense block table are for the targets that take one: FlashInfer reads
// nvfp4/tensor, but through its own HND view (a byte-per-element NHD view of FP4 pages would
// run into V), so it gets none, whatever the format.
TEST(AdaptersTest, BlockTableLayersAreOnlyForTheTargetsOfDenseTables) {
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp16", "nvfp4/tensor"}));
  for (const AdapterTarget target : {AdapterTarget::kFlashInfer, AdapterTarget::kFlexAttention,
                                     AdapterTarget::kTensorRtLlm}) {
    for (int32_t format : {0, 1}) {
      const absl::Status s = GetBlockTableLayer(target, *cache, format, 0).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << AdapterTargetName(target);
      EXPECT_NE(s.message().find("takes no dense block table"), std::string::npos) << s;
    }
  }
  EXPECT_TRUE(GetBlockTableLayer(AdapterTarget::kVllm, *cache, 0, 0).ok());
}

TEST(AdaptersTest, BuildersRefuseAFormatPresentInTheBatchOnly) {
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp16", "fp8_e4m3/block_head"}));
  const SequenceId seq = WriteRandom(*cache, 40, 3);
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables({seq}, &tables).ok());
  // All blocks are FP16: the unreadable palette format is not in the batch.
  EXPECT_TRUE(BuildFlashInferParts(cache->options(), tables).ok());
  EXPECT_FALSE(CheckPaletteReadable(AdapterTarget::kFlashInfer, cache->options()).ok());
  DemoteEvery3rd(*cache, seq, 1, 1);
  ASSERT_TRUE(cache->BuildPageTables({seq}, &tables).ok());
  const absl::Status s = BuildFlashInferParts(cache->options(), tables).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("FlashInfer cannot read format fp8_e4m3/block_head"),
            std::string::npos)
      << s;
  EXPECT_EQ(GetFlashInferLayer(*cache, 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFlashInferLayer(*cache, 5, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildBlockTableParts(AdapterTarget::kFlexAttention, cache->options(), tables)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFa3Descales(*cache, 0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// Decodes one element the way the target kernel would, from the raw bytes a view addresses.
float DecodeAt(const TensorView& view, const std::vector<int64_t>& index,
               const std::optional<TensorView>& sf, float scale) {
  const uint8_t* base = static_cast<const uint8_t*>(view.data);
  switch (view.dtype) {
    case ViewDType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, base + view.ByteOffset(index), 2);
      return codec::HalfToFloat(h);
    }
    case ViewDType::kFloat8E4M3: return codec::E4M3ToFloat(base[view.ByteOffset(index)]) * scale;
    case ViewDType::kFloat4E2M1x2: {
      std::vector<int64_t> byte = index, micro = index;
      const int64_t d = index.back();
      byte.back() = d / 2;
      micro.back() = d / kMicroBlock;
      const uint8_t packed = base[view.ByteOffset(byte)];
      const uint8_t nibble = d % 2 == 0 ? (packed & 0xF) : (packed >> 4);  // low nibble first
      const uint8_t s = static_cast<const uint8_t*>(sf->data)[sf->ByteOffset(micro)];
      return codec::Nvfp4DecodeValue(nibble, s, scale);
    }
    default: ADD_FAILURE() << "unexpected dtype"; return 0;
  }
}

TEST(AdaptersTest, ViewsAddressExactlyThePageLayoutsBytes) {
  Batch b = MakeMixedBatch({"fp16", "fp8_e4m3/tensor", "nvfp4/tensor"});
  const Options& o = b.cache->options();
  for (int layer = 0; layer < kLayers; ++layer) {
    for (size_t si = 0; si < b.seqs.size(); ++si) {
      const int64_t len = *b.cache->SequenceLength(b.seqs[si]);
      std::vector<float> k(len * kHeads * kDim), v(k.size());
      ASSERT_TRUE(b.cache->ReadKV(b.seqs[si], layer, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
      const std::vector<BlockId> blocks = *b.cache->SequenceBlocks(b.seqs[si]);
      for (int64_t t = 0; t < len; ++t) {
        const BlockInfo info = *b.cache->GetBlockInfo(blocks[t / kTokens]);
        const PoolInfo pool = *b.cache->GetPool(info.format, layer);
        const FlashInferLayer fi = *GetFlashInferLayer(*b.cache, info.format, layer);
        const ElementType type = o.palette[info.format].k.type;
        if (type != ElementType::kFp16) {
          EXPECT_EQ(fi.k_scale, *ToConvention(pool.k_tensor_scale, type,
                                              ScaleConvention::kFlashInferKVScale));
        }
        const int64_t s = t % kTokens;
        for (int h = 0; h < kHeads; ++h) {
          for (int d = 0; d < kDim; ++d) {
            const size_t i = (t * kHeads + h) * kDim + d;
            const float want_k = k[i], want_v = v[i];
            // FlashInfer HND [P, 2, H, S, D]: K at [p, 0], V at [p, 1].
            ASSERT_EQ(DecodeAt(fi.kv, {info.page, 0, h, s, d}, fi.kv_cache_sf, pool.k_tensor_scale),
                      want_k)
                << "format " << info.format << " t " << t << " h " << h << " d " << d;
            ASSERT_EQ(DecodeAt(fi.kv, {info.page, 1, h, s, d}, fi.kv_cache_sf, pool.v_tensor_scale),
                      want_v);
            if (type == ElementType::kNvfp4) continue;
            // FlashAttention/vLLM [P, S, H, D] per K and V.
            const BlockTableLayer bt = *GetBlockTableLayer(AdapterTarget::kVllm, *b.cache,
                                                           info.format, layer);
            ASSERT_EQ(DecodeAt(bt.k, {info.page, s, h, d}, {}, bt.k_scale), want_k);
            ASSERT_EQ(DecodeAt(bt.v, {info.page, s, h, d}, {}, bt.v_scale), want_v);
          }
        }
      }
    }
  }
  // K and V strides are identical in the FlashInfer view; the last dimension is contiguous.
  const FlashInferLayer nv = *GetFlashInferLayer(*b.cache, 2, 1);
  EXPECT_EQ(nv.kv.shape, (std::vector<int64_t>{nv.kv.shape[0], 2, kHeads, kTokens, kDim / 2}));
  ASSERT_TRUE(nv.kv_cache_sf.has_value());
  EXPECT_EQ(nv.kv_cache_sf->shape.back(), kDim / 16);
  EXPECT_EQ(nv.kv.strides.back(), 1);
  EXPECT_EQ(nv.kv_cache_sf->dtype, ViewDType::kFloat8E4M3);
}

TEST(AdaptersTest, TensorRtLlmOffsetsAndFlexGatherReadTheSameBytes) {
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp16"}));
  const SequenceId a = WriteRandom(*cache, 37, 5), c = WriteRandom(*cache, 16, 6);
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables({a, c}, &tables).ok());
  const int layer = 1;
  const TensorRtLlmLayer trt_layer = *GetTensorRtLlmLayer(*cache, 0, layer);
  const TensorRtLlmPart trt = BuildTensorRtLlmParts(cache->options(), tables)->at(0);
  const FlexAttentionPart flex = BuildFlexAttentionParts(cache->options(), tables)->at(0);
  const int64_t n = flex.n_pages;
  std::vector<uint16_t> fk(kHeads * n * kTokens * kDim), fv(fk.size());
  ASSERT_TRUE(GatherFlexKV(*cache, 0, layer, flex.source_pages,
                           absl::MakeSpan(reinterpret_cast<uint8_t*>(fk.data()), fk.size() * 2),
                           absl::MakeSpan(reinterpret_cast<uint8_t*>(fv.data()), fv.size() * 2))
                  .ok());
  const uint8_t* pool = static_cast<const uint8_t*>(trt_layer.pool_pointer);
  for (int r = 0; r < 2; ++r) {
    const SequenceId seq = r == 0 ? a : c;
    const int64_t len = *cache->SequenceLength(seq);
    std::vector<float> k(len * kHeads * kDim), v(k.size());
    ASSERT_TRUE(cache->ReadKV(seq, layer, absl::MakeSpan(k), absl::MakeSpan(v)).ok());
    for (int64_t t = 0; t < len; ++t) {
      const int64_t phys = flex.page_table[r * n + t / kTokens];
      for (int h = 0; h < kHeads; ++h) {
        for (int d = 0; d < kDim; ++d) {
          const size_t i = (t * kHeads + h) * kDim + d;
          // FlexAttention (1, H, n * S, D).
          const size_t fi = ((h * n + phys) * kTokens + t % kTokens) * kDim + d;
          ASSERT_EQ(codec::HalfToFloat(fk[fi]), k[i]);
          ASSERT_EQ(codec::HalfToFloat(fv[fi]), v[i]);
          // TensorRT-LLM: block offset x bytes_per_block, then [H, S, D] inside the block.
          for (int kv = 0; kv < 2; ++kv) {
            const int64_t offset = trt.block_offsets[(r * 2 + kv) * trt.max_blocks + t / kTokens];
            uint16_t bits;
            std::memcpy(&bits,
                        pool + offset * trt.bytes_per_block +
                            ((h * kTokens + t % kTokens) * kDim + d) * 2,
                        2);
            ASSERT_EQ(codec::HalfToFloat(bits), kv == 0 ? k[i] : v[i]);
          }
        }
      }
    }
  }
  std::vector<uint8_t> small(8);
  EXPECT_EQ(GatherFlexKV(*cache, 0, 0, flex.source_pages, absl::MakeSpan(small),
                         absl::MakeSpan(small))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The same pages once their sequences are gone and their slab unmapped: refused (they were
  // read: SIGSEGV).
  ASSERT_TRUE(cache->Release(a).ok());
  ASSERT_TRUE(cache->Release(c).ok());
  ASSERT_TRUE(cache->EndStep().ok());
  const absl::Status stale = GatherFlexKV(
      *cache, 0, layer, flex.source_pages,
      absl::MakeSpan(reinterpret_cast<uint8_t*>(fk.data()), fk.size() * 2),
      absl::MakeSpan(reinterpret_cast<uint8_t*>(fv.data()), fv.size() * 2));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
}

TEST(AdaptersTest, SlotMappingAndDescales) {
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp8_e4m3/tensor"}));
  const SequenceId seq = *cache->AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache->Append(seq, 5, &slots).ok());
  const std::vector<int64_t> mapping = *VllmSlotMapping(*cache, slots, 8);
  ASSERT_EQ(mapping.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(mapping[i], i < 5 ? slots[i] : -1);
  EXPECT_FALSE(VllmSlotMapping(*cache, slots, 3).ok());
  EXPECT_FALSE(VllmSlotMapping(*cache, {int64_t{1} << 40}).ok());
  // Counts that would size the output past reason are refused, not allocated (they threw).
  EXPECT_EQ(VllmSlotMapping(*cache, slots, int64_t{1} << 61).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetFa3Descales(*cache, 0, 1, int64_t{1} << 40).status().code(),
            absl::StatusCode::kInvalidArgument);
  const Fa3Descales ds = *GetFa3Descales(*cache, 0, 1, 3);
  const PoolInfo pool = *cache->GetPool(0, 1);
  EXPECT_EQ(ds.k_descale, std::vector<float>(3 * kHeads, pool.k_tensor_scale));
  EXPECT_EQ(ds.v_descale, std::vector<float>(3 * kHeads, pool.v_tensor_scale));
  EXPECT_FLOAT_EQ(pool.k_tensor_scale, 12.f / 448);
}

// Tables and counts built by hand: refused before an entry is read or an output sized from them.
TEST(AdaptersTest, HandBuiltTablesAndCountsAreRefusedBeforeUse) {
  Batch b = MakeMixedBatch({"fp16", "fp8_e4m3/tensor"});
  PageTables bad = b.tables;
  FormatPageTable& t = bad.per_format[0];
  // Row 0 ends 1000 entries past indices; row 1's end falls back to the true total.
  t.indptr[1] = static_cast<int32_t>(t.indices.size()) + 1000;
  EXPECT_EQ(BuildFlashInferParts(b.cache->options(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildBlockTableParts(AdapterTarget::kVllm, b.cache->options(), b.tables,
                                 {/*max_blocks=*/INT32_MAX, 0})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // rows x 2^31 entries were allocated
  // A batch whose out and lse sizes wrap to 0 (2^61 x 8 heads x head_dim 1).
  std::vector<float> none;
  EXPECT_EQ(MergePartialStates({}, int64_t{1} << 61, 8, 1, absl::MakeSpan(none),
                               absl::MakeSpan(none))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Hand-built tables of 2^17 rows: with a page each, FlexAttention's [rows, n_pages] tables hold
// 2^34 cells; with one row of 2^14 pages, TensorRT-LLM's [rows, 2, max_blocks] offsets 2^32.
// Both are refused, as a block table over 2^28 entries is. Was: the allocation (std::bad_alloc
// or the OOM killer) before any check.
TEST(AdaptersTest, DenseTablesOfAWideBatchAreRefusedNotAllocated) {
  const Options o = MixedOptions({"fp16"});
  constexpr int32_t kRows = 1 << 17;
  const auto tables = [&](int32_t first_row_pages) {
    PageTables t;
    t.per_format.resize(1);
    FormatPageTable& f = t.per_format[0];
    f.indptr.push_back(0);
    for (int32_t r = 0; r < kRows; ++r) {
      const int32_t pages = r == 0 ? first_row_pages : 1;
      for (int32_t i = 0; i < pages; ++i) f.indices.push_back(f.indptr.back() + i);
      f.indptr.push_back(f.indptr.back() + pages);
      t.seq_lens.push_back(pages * kTokens);
    }
    f.last_page_len.assign(kRows, kTokens);
    return t;
  };
  const PageTables one_each = tables(1), lopsided = tables(1 << 14);
  ASSERT_TRUE(BuildBlockTableParts(AdapterTarget::kVllm, o, one_each).ok());  // 2^17 entries
  EXPECT_EQ(BuildFlexAttentionParts(o, one_each).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildBlockTableParts(AdapterTarget::kVllm, o, lopsided).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildTensorRtLlmParts(o, lopsided).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AdaptersTest, TensorRtLlmRefusesDistinctKAndVScales) {
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp8_e4m3/tensor"}));
  EXPECT_EQ(GetTensorRtLlmLayer(*cache, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  Options o = MixedOptions({"fp8_e4m3/tensor"});
  o.v_tensor_amax = o.k_tensor_amax;
  std::unique_ptr<Cache> same = MustCreate(o);
  const TensorRtLlmLayer trt = *GetTensorRtLlmLayer(*same, 0, 0);
  EXPECT_FLOAT_EQ(trt.kv_scale_quant_orig, 12.f / 448);
  EXPECT_FLOAT_EQ(trt.kv_scale_orig_quant, 448 / 12.f);
}

// The partition-and-merge path: a mixed FP16/FP8 batch attended per format (the CPU reference
// standing in for one FlashInfer call per format; the FP8 part's LSE converted to base 2 as
// FlashInfer returns it) and merged by LSE equals attention over the whole sequences.
TEST(AdaptersTest, PerFormatAttentionMergedByLseEqualsWholeSequenceAttention) {
  Batch b = MakeMixedBatch({"fp16", "fp8_e4m3/tensor"});
  const int64_t batch = static_cast<int64_t>(b.seqs.size());
  const int q_heads = 4;
  const int layer = 1;
  const PagedLayer kv = *GetPagedLayer(*b.cache, layer);
  const std::vector<float> q = RandomFloats(batch * q_heads * kDim, 9);
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));

  std::vector<float> whole_out(batch * q_heads * kDim), whole_lse(batch * q_heads);
  ASSERT_TRUE(PagedDecodeAttention(kv, b.tables, DecodeQueries{q, q_heads, scale},
                                   DecodeOutputs{absl::MakeSpan(whole_out),
                                                 absl::MakeSpan(whole_lse), {}, 0, {}})
                  .ok());

  const std::vector<FormatPart> parts = *BuildFlashInferParts(b.cache->options(), b.tables);
  ASSERT_EQ(parts.size(), 2u);
  std::vector<std::vector<float>> outs(parts.size()), lses(parts.size());
  std::vector<PartialState> states;
  for (size_t p = 0; p < parts.size(); ++p) {
    const FormatPart& part = parts[p];
    const std::vector<float> part_q = GatherRows(q, q_heads * kDim, part.batch_index);
    outs[p].resize(part.rows() * q_heads * kDim);
    lses[p].resize(part.rows() * q_heads);
    ASSERT_TRUE(PagedDecodeAttention(kv, PartAsPageTables(part),
                                     DecodeQueries{part_q, q_heads, scale},
                                     DecodeOutputs{absl::MakeSpan(outs[p]),
                                                   absl::MakeSpan(lses[p]), {}, 0, {}})
                    .ok());
    const bool base2 = part.format == 1;
    if (base2) NaturalToBase2Lse(absl::MakeSpan(lses[p]));
    states.push_back(PartialState{part.batch_index, outs[p], lses[p],
                                  base2 ? LseBase::kBase2 : LseBase::kNatural});
  }
  std::vector<float> out(whole_out.size()), lse(whole_lse.size());
  ASSERT_TRUE(MergePartialStates(states, batch, q_heads, kDim, absl::MakeSpan(out),
                                 absl::MakeSpan(lse))
                  .ok());
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(whole_lse[i])) {
      EXPECT_EQ(lse[i], whole_lse[i]) << i;  // the empty sequence: -inf both ways
    } else {
      EXPECT_NEAR(lse[i], whole_lse[i], 2e-6 * (1 + std::fabs(whole_lse[i]))) << i;
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_NEAR(out[i], whole_out[i], 2e-6 * (1 + std::fabs(whole_out[i]))) << i;
  }
  // A sequence with blocks in both formats really was split.
  EXPECT_GT(parts[1].rows(), 0);

  // Shape errors.
  const std::vector<int32_t> twice = {0, 0};
  const std::vector<float> o2(2 * q_heads * kDim), l2(2 * q_heads);
  const PartialState bad{twice, o2, l2, LseBase::kNatural};
  EXPECT_EQ(MergePartialStates({&bad, 1}, batch, q_heads, kDim, absl::MakeSpan(out),
                               absl::MakeSpan(lse))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // A bad part after good ones: the outputs are left as they were, not half merged.
  const std::vector<float> merged_out = out, merged_lse = lse;
  std::vector<PartialState> good_then_bad = states;
  good_then_bad.push_back(bad);
  EXPECT_EQ(MergePartialStates(good_then_bad, batch, q_heads, kDim, absl::MakeSpan(out),
                               absl::MakeSpan(lse))
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, merged_out);
  EXPECT_EQ(lse, merged_lse);
  EXPECT_EQ(MergePartialStates({}, batch, q_heads, kDim, absl::MakeSpan(out).subspan(1),
                               absl::MakeSpan(lse))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AdaptersTest, LseBaseConversionsRoundTrip) {
  std::vector<float> lse = {0.f, 1.f, -3.5f, -INFINITY};
  NaturalToBase2Lse(absl::MakeSpan(lse));
  EXPECT_FLOAT_EQ(lse[1], 1.f / std::log(2.f));
  EXPECT_EQ(lse[3], -INFINITY);
  Base2ToNaturalLse(absl::MakeSpan(lse));
  EXPECT_FLOAT_EQ(lse[1], 1.f);
  EXPECT_FLOAT_EQ(lse[2], -3.5f);
}


// ---- The snippets of docs/adapters.md, verbatim (tests/python checks they stay identical) ----

// Stand-ins for the calls into external kernels.
int flashinfer_calls = 0, block_table_calls = 0;
void EnqueueFlashInfer(const FormatPart& part, const FlashInferLayer& pool) {
  EXPECT_EQ(pool.kv.shape[1], 2);
  flashinfer_calls += part.rows() > 0;
}
void EnqueueBlockTable(const BlockTablePart& part, const BlockTableLayer& pool,
                       const std::vector<int64_t>& slot_mapping) {
  EXPECT_EQ(pool.k.strides, pool.v.strides);
  EXPECT_EQ(slot_mapping.size(), 8u);
  block_table_calls += part.rows() > 0;
}

absl::Status AttendWithFlashInfer(const Cache& cache, absl::Span<const SequenceId> batch,
                                  int32_t layer) {
  PageTables tables;
  KVTIER_RETURN_IF_ERROR(cache.BuildPageTables(batch, &tables));
  KVTIER_ASSIGN_OR_RETURN(std::vector<FormatPart> parts,
                          BuildFlashInferParts(cache.options(), tables));
  for (const FormatPart& part : parts) {
    KVTIER_ASSIGN_OR_RETURN(FlashInferLayer pool, GetFlashInferLayer(cache, part.format, layer));
    EnqueueFlashInfer(part, pool);  // plan(part.indptr, part.indices, part.last_page_len), run
  }
  return absl::OkStatus();
}

absl::Status VllmStep(Cache& cache, SequenceId seq, absl::Span<const SequenceId> batch) {
  std::vector<int64_t> slots;
  KVTIER_RETURN_IF_ERROR(cache.Append(seq, 1, &slots));
  KVTIER_ASSIGN_OR_RETURN(std::vector<int64_t> slot_mapping, VllmSlotMapping(cache, slots, 8));
  PageTables tables;
  KVTIER_RETURN_IF_ERROR(cache.BuildPageTables(batch, &tables));
  KVTIER_ASSIGN_OR_RETURN(std::vector<BlockTablePart> parts,
                          BuildBlockTableParts(AdapterTarget::kVllm, cache.options(), tables));
  for (const BlockTablePart& part : parts) {
    KVTIER_ASSIGN_OR_RETURN(BlockTableLayer pool,
                            GetBlockTableLayer(AdapterTarget::kVllm, cache, part.format, 0));
    EnqueueBlockTable(part, pool, slot_mapping);
  }
  return absl::OkStatus();
}

absl::Status AttendMixedOnCpu(const Cache& cache, const PageTables& tables, int32_t layer,
                              const DecodeQueries& q, absl::Span<float> out,
                              absl::Span<float> lse) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<FormatPart> parts,
                          PartitionByFormat(cache.options(), tables));
  KVTIER_ASSIGN_OR_RETURN(PagedLayer kv, GetPagedLayer(cache, layer));
  const int32_t head_dim = cache.options().geometry.head_dim;
  const int64_t row = int64_t{q.num_q_heads} * head_dim;
  std::vector<std::vector<float>> outs(parts.size()), lses(parts.size());
  std::vector<PartialState> states;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<float> part_q = GatherRows(q.q, row, parts[i].batch_index);
    outs[i].resize(parts[i].rows() * row);
    lses[i].resize(parts[i].rows() * q.num_q_heads);
    KVTIER_RETURN_IF_ERROR(PagedDecodeAttention(
        kv, PartAsPageTables(parts[i]), DecodeQueries{part_q, q.num_q_heads, q.softmax_scale},
        DecodeOutputs{absl::MakeSpan(outs[i]), absl::MakeSpan(lses[i]), {}, 0, {}}));
    states.push_back({parts[i].batch_index, outs[i], lses[i], LseBase::kNatural});
  }
  return MergePartialStates(states, static_cast<int64_t>(tables.seq_lens.size()),
                            q.num_q_heads, head_dim, out, lse);
}

TEST(AdaptersDocTest, SnippetsRun) {
  std::unique_ptr<Cache> cache = MustCreate(MixedOptions({"fp16", "fp8_e4m3/tensor"}));
  const std::vector<SequenceId> batch = {WriteRandom(*cache, 40, 1), WriteRandom(*cache, 7, 2)};
  DemoteEvery3rd(*cache, batch[0], 1, 1);
  ASSERT_TRUE(AttendWithFlashInfer(*cache, batch, 1).ok());
  EXPECT_EQ(flashinfer_calls, 2);

  const int q_heads = 4;
  const std::vector<float> q = RandomFloats(batch.size() * q_heads * kDim, 3);
  const DecodeQueries queries{q, q_heads, 0.125f};
  PageTables tables;
  ASSERT_TRUE(cache->BuildPageTables(batch, &tables).ok());
  std::vector<float> out(q.size()), lse(batch.size() * q_heads);
  std::vector<float> whole_out(q.size()), whole_lse(lse.size());
  ASSERT_TRUE(AttendMixedOnCpu(*cache, tables, 0, queries, absl::MakeSpan(out),
                               absl::MakeSpan(lse))
                  .ok());
  ASSERT_TRUE(PagedDecodeAttention(*GetPagedLayer(*cache, 0), tables, queries,
                                   DecodeOutputs{absl::MakeSpan(whole_out),
                                                 absl::MakeSpan(whole_lse), {}, 0, {}})
                  .ok());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], whole_out[i], 1e-5) << i;
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], whole_lse[i], 1e-5) << i;

  ASSERT_TRUE(VllmStep(*cache, batch[1], batch).ok());
  EXPECT_EQ(block_table_calls, 2);
}

}  // namespace
}  // namespace kvtier
