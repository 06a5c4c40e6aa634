// Targets, readability, tensor views, partition by format, LSE merging, and the FlashInfer and
// FlashAttention/vLLM adapters. FlexAttention and TensorRT-LLM have a file each beside it.
#include "adapters/page_table_adapters.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "adapters/adapter_internal.h"
#include "adapters/scale_conventions.h"
#include "kernels/page_layout.h"
#include "kvtier/format.h"
#include "src/attention/reference_attention.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

const char* Reads(AdapterTarget target) {
  switch (target) {
    case AdapterTarget::kFlashInfer:
      return "fp16, bf16, fp8_e4m3/tensor, fp8_e5m2/tensor, nvfp4/tensor";
    case AdapterTarget::kFlashAttention2: return "fp16, bf16 with block_tokens a multiple of 256";
    case AdapterTarget::kFlashAttention3: return "fp16, bf16, fp8_e4m3/tensor";
    case AdapterTarget::kVllm:
      return "fp16, bf16, fp8_e4m3/tensor, fp8_e5m2/tensor with block_tokens a multiple of 16";
    case AdapterTarget::kFlexAttention: return "fp16, bf16";
    case AdapterTarget::kTensorRtLlm:
      return "fp16, bf16, fp8_e4m3/tensor with block_tokens a power of two";
  }
  return "";
}

bool TypeReadable(AdapterTarget target, ElementType type) {
  switch (type) {
    case ElementType::kFp16:
    case ElementType::kBf16: return true;
    case ElementType::kFp8E4M3:
      return target != AdapterTarget::kFlashAttention2 && target != AdapterTarget::kFlexAttention;
    case ElementType::kFp8E5M2:
      return target == AdapterTarget::kFlashInfer || target == AdapterTarget::kVllm;
    case ElementType::kNvfp4: return target == AdapterTarget::kFlashInfer;
  }
  return false;
}

const char* TypeName(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return "FP16";
    case ElementType::kBf16: return "BF16";
    case ElementType::kFp8E4M3: return "FP8 E4M3";
    case ElementType::kFp8E5M2: return "FP8 E5M2";
    case ElementType::kNvfp4: return "NVFP4";
  }
  return "?";
}

ViewDType ViewTypeOf(ElementType type) {
  switch (type) {
    case ElementType::kFp16: return ViewDType::kFloat16;
    case ElementType::kBf16: return ViewDType::kBFloat16;
    case ElementType::kFp8E4M3: return ViewDType::kFloat8E4M3;
    case ElementType::kFp8E5M2: return ViewDType::kFloat8E5M2;
    case ElementType::kNvfp4: return ViewDType::kFloat4E2M1x2;
  }
  return ViewDType::kFloat16;
}

}  // namespace

namespace adapter_internal {

absl::StatusOr<PoolAndFormat> GetPoolAndFormat(AdapterTarget target, const Cache& cache,
                                               int32_t format, int32_t layer) {
  PoolAndFormat p;
  KVTIER_ASSIGN_OR_RETURN(p.pool, cache.GetPool(format, layer));
  const Options& o = cache.options();
  p.format = o.palette[format];
  KVTIER_RETURN_IF_ERROR(CheckReadable(target, p.format, o.geometry));
  p.geometry = o.geometry;
  p.device = o.backend;
  return p;
}

TensorView MakeView(const PoolAndFormat& p, int64_t byte_offset, ViewDType dtype,
                    std::vector<int64_t> shape, std::vector<int64_t> strides) {
  TensorView v;
  v.data = static_cast<uint8_t*>(p.pool.base) + byte_offset;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  v.device = p.device;
  return v;
}

absl::StatusOr<std::vector<FormatPart>> ReadableParts(AdapterTarget target, const Options& options,
                                                      const PageTables& tables) {
  KVTIER_ASSIGN_OR_RETURN(std::vector<FormatPart> parts, PartitionByFormat(options, tables));
  for (const FormatPart& part : parts) {
    KVTIER_RETURN_IF_ERROR(
        CheckReadable(target, options.palette[part.format], options.geometry));
  }
  return parts;
}

int32_t MaxPages(const FormatPart& part) {
  int32_t m = 0;
  for (int64_t r = 0; r < part.rows(); ++r) m = std::max(m, part.indptr[r + 1] - part.indptr[r]);
  return m;
}

}  // namespace adapter_internal

using adapter_internal::GetPoolAndFormat;
using adapter_internal::MakeView;
using adapter_internal::PoolAndFormat;

// ---- Targets ----

const char* AdapterTargetName(AdapterTarget target) {
  switch (target) {
    case AdapterTarget::kFlashInfer: return "FlashInfer";
    case AdapterTarget::kFlashAttention2: return "FlashAttention-2";
    case AdapterTarget::kFlashAttention3: return "FlashAttention-3";
    case AdapterTarget::kVllm: return "vLLM";
    case AdapterTarget::kFlexAttention: return "FlexAttention";
    case AdapterTarget::kTensorRtLlm: return "TensorRT-LLM";
  }
  return "?";
}

absl::StatusOr<AdapterTarget> ParseAdapterTarget(absl::string_view name) {
  if (name == "flashinfer") return AdapterTarget::kFlashInfer;
  if (name == "flash_attention2") return AdapterTarget::kFlashAttention2;
  if (name == "flash_attention3") return AdapterTarget::kFlashAttention3;
  if (name == "vllm") return AdapterTarget::kVllm;
  if (name == "flex_attention") return AdapterTarget::kFlexAttention;
  if (name == "tensorrt_llm") return AdapterTarget::kTensorRtLlm;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown adapter target '", name,
      "' (flashinfer, flash_attention2, flash_attention3, vllm, flex_attention, tensorrt_llm)"));
}

absl::Status CheckReadable(AdapterTarget target, const FormatSpec& format,
                           const Geometry& geometry) {
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(AdapterTargetName(target),
                                                   " cannot read format ", FormatName(format),
                                                   ": ", why, " (", AdapterTargetName(target),
                                                   " reads ", Reads(target), ")"));
  };
  if (format.k != format.v) {
    return refuse("K and V use different codecs; the kernel reads one element type for both");
  }
  const CodecSpec& c = format.k;
  if (c.type == ElementType::kNvfp4 && c.axis == MicroAxis::kTokens) {
    return refuse("its NVFP4 micro-blocks run along tokens (one scale per channel); external "
                  "kernels read micro-blocks along head_dim");
  }
  if (c.scope == ScaleScope::kBlockHead) {
    return refuse("its fp32 scales are per (block, head); the kernel takes one scale per layer");
  }
  if (c.scope == ScaleScope::kTokenHead) {
    return refuse("its fp32 scales are per (token, head); the kernel takes one scale per layer");
  }
  if (!TypeReadable(target, c.type)) {
    return refuse(absl::StrCat("the kernel has no ", TypeName(c.type), " path"));
  }
  const int s = geometry.block_tokens;
  if (target == AdapterTarget::kFlashAttention2 && s % 256 != 0) {
    return refuse(absl::StrCat("block_tokens ", s, " is not a multiple of 256"));
  }
  if (target == AdapterTarget::kVllm && s % 16 != 0) {
    return refuse(absl::StrCat("block_tokens ", s, " is not a multiple of 16"));
  }
  if (target == AdapterTarget::kTensorRtLlm && (s & (s - 1)) != 0) {
    return refuse(absl::StrCat("block_tokens ", s, " is not a power of two"));
  }
  return absl::OkStatus();
}

absl::Status CheckPaletteReadable(AdapterTarget target, const Options& options) {
  for (const FormatSpec& f : options.palette) {
    KVTIER_RETURN_IF_ERROR(CheckReadable(target, f, options.geometry));
  }
  return absl::OkStatus();
}

// ---- Views ----

const char* ViewDTypeName(ViewDType dtype) {
  switch (dtype) {
    case ViewDType::kFloat16: return "float16";
    case ViewDType::kBFloat16: return "bfloat16";
    case ViewDType::kFloat8E4M3: return "float8_e4m3fn";
    case ViewDType::kFloat8E5M2: return "float8_e5m2";
    case ViewDType::kFloat4E2M1x2: return "float4_e2m1x2";
    case ViewDType::kFloat32: return "float32";
  }
  return "?";
}

int ViewDTypeBytes(ViewDType dtype) {
  switch (dtype) {
    case ViewDType::kFloat16:
    case ViewDType::kBFloat16: return 2;
    case ViewDType::kFloat32: return 4;
    default: return 1;
  }
}

int64_t TensorView::ByteOffset(absl::Span<const int64_t> index) const {
  int64_t elements = 0;
  for (size_t i = 0; i < index.size() && i < strides.size(); ++i) elements += index[i] * strides[i];
  return elements * ViewDTypeBytes(dtype);
}

// ---- Partition and merge ----

absl::StatusOr<std::vector<FormatPart>> PartitionByFormat(const Options& options,
                                                          const PageTables& tables) {
  const int64_t batch = static_cast<int64_t>(tables.seq_lens.size());
  const int32_t s = options.geometry.block_tokens;
  if (tables.per_format.size() != options.palette.size()) {
    return absl::InvalidArgumentError(absl::StrCat("page tables hold ", tables.per_format.size(),
                                                   " formats; the palette has ",
                                                   options.palette.size()));
  }
  std::vector<int64_t> covered(batch, 0);
  std::vector<FormatPart> parts;
  for (size_t f = 0; f < tables.per_format.size(); ++f) {
    const FormatPageTable& t = tables.per_format[f];
    if (t.indptr.size() != static_cast<size_t>(batch) + 1 ||
        t.last_page_len.size() != static_cast<size_t>(batch) || t.indptr[0] != 0 ||
        static_cast<size_t>(t.indptr.back()) != t.indices.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "format ", f, "'s page table has ", t.indptr.size(), " indptr and ",
          t.last_page_len.size(), " last_page_len entries for ", batch, " sequences"));
    }
    FormatPart part;
    part.format = static_cast<int32_t>(f);
    part.indptr.push_back(0);
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t begin = t.indptr[b], end = t.indptr[b + 1];
      if (end < begin) {
        return absl::InvalidArgumentError(absl::StrCat("format ", f, ": indptr decreases at ", b));
      }
      if (end == begin) continue;
      const int32_t last = t.last_page_len[b];
      if (last < 1 || last > s) {
        return absl::InvalidArgumentError(absl::StrCat("format ", f, ", sequence ", b,
                                                       ": last page holds ", last,
                                                       " tokens; 1 to ", s, " expected"));
      }
      part.batch_index.push_back(static_cast<int32_t>(b));
      part.indices.insert(part.indices.end(), t.indices.begin() + begin, t.indices.begin() + end);
      part.indptr.push_back(static_cast<int32_t>(part.indices.size()));
      part.last_page_len.push_back(last);
      const int64_t length = int64_t{s} * (end - begin - 1) + last;
      part.lengths.push_back(static_cast<int32_t>(length));
      covered[b] += length;
    }
    if (!part.batch_index.empty()) parts.push_back(std::move(part));
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (covered[b] != tables.seq_lens[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", b, " has ", tables.seq_lens[b], " tokens but its per-format pages hold ",
          covered[b], " (only a sequence's tail page may be partial)"));
    }
  }
  return parts;
}

PageTables PartAsPageTables(const FormatPart& part) {
  PageTables t;
  t.packed_indptr = part.indptr;
  t.packed.reserve(part.indices.size());
  for (int32_t page : part.indices) {
    t.packed.push_back(PackPage(static_cast<uint32_t>(part.format), static_cast<uint32_t>(page)));
  }
  t.seq_lens = part.lengths;
  return t;
}

std::vector<float> GatherRows(absl::Span<const float> x, int64_t row_elems,
                              absl::Span<const int32_t> batch_index) {
  std::vector<float> out;
  out.reserve(batch_index.size() * row_elems);
  for (int32_t b : batch_index) {
    const float* row = x.data() + static_cast<size_t>(b) * row_elems;
    out.insert(out.end(), row, row + row_elems);
  }
  return out;
}

void NaturalToBase2Lse(absl::Span<float> lse) {
  for (float& x : lse) x = static_cast<float>(x * (1.0 / std::log(2.0)));
}

void Base2ToNaturalLse(absl::Span<float> lse) {
  for (float& x : lse) x = static_cast<float>(x * std::log(2.0));
}

absl::Status MergePartialStates(absl::Span<const PartialState> parts, int64_t batch,
                                int32_t num_q_heads, int32_t head_dim, absl::Span<float> out,
                                absl::Span<float> lse) {
  if (batch < 0 || num_q_heads < 1 || head_dim < 1 ||
      out.size() != static_cast<size_t>(batch) * num_q_heads * head_dim ||
      lse.size() != static_cast<size_t>(batch) * num_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MergePartialStates: out holds ", out.size(), " and lse ", lse.size(), " floats for batch ",
        batch, " x ", num_q_heads, " heads x head_dim ", head_dim));
  }
  std::fill(out.begin(), out.end(), 0.f);
  std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
  const size_t row_out = static_cast<size_t>(num_q_heads) * head_dim;
  std::vector<float> natural;
  for (size_t p = 0; p < parts.size(); ++p) {
    const PartialState& part = parts[p];
    const size_t rows = part.batch_index.size();
    if (part.out.size() != rows * row_out || part.lse.size() != rows * num_q_heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "part ", p, ": ", rows, " rows need ", rows * row_out, " outputs and ",
          rows * num_q_heads, " LSEs; got ", part.out.size(), " and ", part.lse.size()));
    }
    std::vector<bool> seen(batch, false);
    for (int32_t b : part.batch_index) {
      if (b < 0 || b >= batch || seen[b]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "part ", p, ": batch index ", b, " is outside 0..", batch - 1, " or repeated"));
      }
      seen[b] = true;
    }
    natural.assign(part.lse.begin(), part.lse.end());
    if (part.base == LseBase::kBase2) Base2ToNaturalLse(absl::MakeSpan(natural));
    for (size_t r = 0; r < rows; ++r) {
      const size_t b = static_cast<size_t>(part.batch_index[r]);
      absl::Span<float> acc_out = out.subspan(b * row_out, row_out);
      absl::Span<float> acc_lse = lse.subspan(b * num_q_heads, num_q_heads);
      KVTIER_RETURN_IF_ERROR(MergeStates(acc_out, acc_lse, part.out.subspan(r * row_out, row_out),
                                         absl::MakeConstSpan(natural).subspan(r * num_q_heads,
                                                                              num_q_heads),
                                         num_q_heads, head_dim, acc_out, acc_lse));
    }
  }
  return absl::OkStatus();
}

// ---- FlashInfer ----

absl::StatusOr<std::vector<FormatPart>> BuildFlashInferParts(const Options& options,
                                                             const PageTables& tables) {
  return adapter_internal::ReadableParts(AdapterTarget::kFlashInfer, options, tables);
}

absl::StatusOr<FlashInferLayer> GetFlashInferLayer(const Cache& cache, int32_t format,
                                                   int32_t layer) {
  KVTIER_ASSIGN_OR_RETURN(const PoolAndFormat p,
                          GetPoolAndFormat(AdapterTarget::kFlashInfer, cache, format, layer));
  const Geometry& g = p.geometry;
  const int64_t h = g.num_kv_heads, s = g.block_tokens, d = g.head_dim;
  const ElementType type = p.format.k.type;
  const ViewDType dtype = ViewTypeOf(type);
  const int64_t e = ViewDTypeBytes(dtype);
  // Elements of the last dimension: D values, or D/2 bytes of packed FP4.
  const int64_t last = type == ElementType::kNvfp4 ? d / 2 : d;
  FlashInferLayer out;
  out.kv = MakeView(p, p.pool.k_offset, dtype, {p.pool.capacity_pages, 2, h, s, last},
                    {p.pool.page_bytes / e, (p.pool.v_offset - p.pool.k_offset) / e, s * last,
                     last, 1});
  if (type == ElementType::kNvfp4) {
    const int64_t sf = d / kMicroBlock;
    out.kv_cache_sf = MakeView(p, p.pool.k_micro_offset, ViewDType::kFloat8E4M3,
                               {p.pool.capacity_pages, 2, h, s, sf},
                               {p.pool.page_bytes, p.pool.v_micro_offset - p.pool.k_micro_offset,
                                s * sf, sf, 1});
  }
  if (p.format.k.scope == ScaleScope::kTensor) {
    KVTIER_ASSIGN_OR_RETURN(
        out.k_scale, ToConvention(p.pool.k_tensor_scale, type, ScaleConvention::kFlashInferKVScale));
    KVTIER_ASSIGN_OR_RETURN(
        out.v_scale, ToConvention(p.pool.v_tensor_scale, type, ScaleConvention::kFlashInferKVScale));
  }
  return out;
}

// ---- FlashAttention 2/3 and vLLM ----

absl::StatusOr<std::vector<BlockTablePart>> BuildBlockTableParts(
    AdapterTarget target, const Options& options, const PageTables& tables,
    const BlockTableOptions& block_options) {
  if (target != AdapterTarget::kFlashAttention2 && target != AdapterTarget::kFlashAttention3 &&
      target != AdapterTarget::kVllm) {
    return absl::InvalidArgumentError(absl::StrCat(
        AdapterTargetName(target), " takes no dense block table (FlashAttention-2, "
                                   "FlashAttention-3 and vLLM do)"));
  }
  KVTIER_ASSIGN_OR_RETURN(std::vector<FormatPart> parts,
                          adapter_internal::ReadableParts(target, options, tables));
  std::vector<BlockTablePart> out;
  for (const FormatPart& part : parts) {
    const int32_t needed = adapter_internal::MaxPages(part);
    if (block_options.max_blocks != 0 && block_options.max_blocks < needed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_blocks ", block_options.max_blocks, " is below the ", needed, " pages of format ",
          FormatName(options.palette[part.format]), " that a sequence holds"));
    }
    BlockTablePart t;
    t.format = part.format;
    t.batch_index = part.batch_index;
    t.max_blocks = block_options.max_blocks != 0 ? block_options.max_blocks : needed;
    t.block_table.assign(static_cast<size_t>(part.rows()) * t.max_blocks, block_options.pad_value);
    for (int64_t r = 0; r < part.rows(); ++r) {
      std::copy(part.indices.begin() + part.indptr[r], part.indices.begin() + part.indptr[r + 1],
                t.block_table.begin() + r * t.max_blocks);
    }
    t.seq_lens = part.lengths;
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<BlockTableLayer> GetBlockTableLayer(AdapterTarget target, const Cache& cache,
                                                   int32_t format, int32_t layer) {
  KVTIER_ASSIGN_OR_RETURN(const PoolAndFormat p, GetPoolAndFormat(target, cache, format, layer));
  const Geometry& g = p.geometry;
  const int64_t h = g.num_kv_heads, s = g.block_tokens, d = g.head_dim;
  const ViewDType dtype = ViewTypeOf(p.format.k.type);  // never FP4 here: no target reads it
  const int64_t e = ViewDTypeBytes(dtype);
  const std::vector<int64_t> shape = {p.pool.capacity_pages, s, h, d};
  const std::vector<int64_t> strides = {p.pool.page_bytes / e, d, s * d, 1};
  BlockTableLayer out;
  out.k = MakeView(p, p.pool.k_offset, dtype, shape, strides);
  out.v = MakeView(p, p.pool.v_offset, dtype, shape, strides);
  if (p.format.k.scope == ScaleScope::kTensor) {
    out.k_scale = p.pool.k_tensor_scale;  // kvtier's convention is vLLM's and FA3's
    out.v_scale = p.pool.v_tensor_scale;
  }
  return out;
}

absl::StatusOr<Fa3Descales> GetFa3Descales(const Cache& cache, int32_t format, int32_t layer,
                                           int64_t rows) {
  KVTIER_ASSIGN_OR_RETURN(const PoolAndFormat p,
                          GetPoolAndFormat(AdapterTarget::kFlashAttention3, cache, format, layer));
  if (p.format.k.scope != ScaleScope::kTensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format ", FormatName(p.format), " has no scale: FlashAttention-3 descales exist only for "
        "fp8_e4m3/tensor"));
  }
  if (rows < 0) return absl::InvalidArgumentError("rows < 0");
  const size_t n = static_cast<size_t>(rows) * p.geometry.num_kv_heads;
  return Fa3Descales{std::vector<float>(n, p.pool.k_tensor_scale),
                     std::vector<float>(n, p.pool.v_tensor_scale)};
}

absl::StatusOr<std::vector<int64_t>> VllmSlotMapping(const Cache& cache,
                                                     absl::Span<const int64_t> slots,
                                                     int64_t padded_size) {
  const Options& o = cache.options();
  KVTIER_RETURN_IF_ERROR(CheckReadable(AdapterTarget::kVllm, o.palette[0], o.geometry));
  KVTIER_ASSIGN_OR_RETURN(const PoolInfo pool, cache.GetPool(0, 0));
  const int64_t limit = pool.capacity_pages * o.geometry.block_tokens;
  if (padded_size != 0 && padded_size < static_cast<int64_t>(slots.size())) {
    return absl::InvalidArgumentError(absl::StrCat("padded_size ", padded_size, " is below the ",
                                                   slots.size(), " slots"));
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < -1 || slots[i] >= limit) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", i, " = ", slots[i],
                                                     " is outside the hot pools (0 to ", limit - 1,
                                                     ", or -1 to skip)"));
    }
  }
  std::vector<int64_t> out(slots.begin(), slots.end());
  if (padded_size > static_cast<int64_t>(out.size())) out.resize(padded_size, -1);
  return out;
}

}  // namespace kvtier
