// Host launchers of kvtier's fused paged decode attention and of the LSE merge. Includable from
// host C++: plain parameter structs and functions that enqueue kernels on a caller's stream.
// Every buffer is the caller's; the launchers allocate nothing and never synchronize.
//
// The decode kernel attends one query token per sequence over that sequence's pages, whatever
// palette format each page is in: it reads the packed (format, page) table of PageTables, so one
// launch covers a batch that mixes FP16, FP8 (E4M3/E5M2, every scale scope) and NVFP4 (micro-
// blocks along head_dim or along tokens, every second-level scope). GQA: the query heads of one
// KV head share every K/V byte read. Split-KV: each sequence's pages are cut into
// `num_splits` ranges attended by separate blocks and merged by LSE, so that small batches at
// long context fill the GPU.
//
// Math (docs/attention.md): every stored value is decoded exactly to FP16 (FP8 codes, and NVFP4
// E2M1 x E4M3 products, are all FP16 values); q is rounded to FP16; logits and P.V are tensor-
// core products accumulated in FP32; the per-token and per-block FP32 scales are applied in
// FP32 (to the logits for K, folded into the FP16 probabilities for V). The agreement with the
// FP32 CPU reference (src/attention/reference_attention.h) on the same pages is stated and
// tested in docs/attention.md.
#ifndef KVTIER_KERNELS_DECODE_ATTENTION_CUH_
#define KVTIER_KERNELS_DECODE_ATTENTION_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/page_layout.h"

namespace kvtier::gpu {

constexpr int kDecodeHeadDim = 128;     // the head_dim the kernel is built for
constexpr int kDecodeBlockTokens = 16;  // tokens per page the kernel is built for
constexpr int kDecodeMaxGroup = 16;     // query heads per KV head, at most
constexpr int kDecodeMaxFormats = 8;    // palette entries (the packed table's 3 format bits)
constexpr int kDecodeMaxBatch = 65535;  // sequences per launch (the grid's z dimension)

// One palette format's pool in one layer.
struct DecodePool {
  const uint8_t* base = nullptr;  // page p at base + p * layout.page_bytes
  PageLayout layout{};
  float k_tensor_scale = 1.f;  // for ScaleScope::kTensor codecs
  float v_tensor_scale = 1.f;
};

struct PagedDecodeParams {
  DecodePool pools[kDecodeMaxFormats];
  int32_t num_formats = 0;
  const int32_t* packed_indptr = nullptr;  // device [batch + 1]
  const uint32_t* packed = nullptr;        // device, PackPage(format, page) per block
  const int32_t* seq_lens = nullptr;       // device [batch]
  int32_t batch = 0;
  int32_t num_q_heads = 0;   // REQUIRES: num_kv_heads * g with 1 <= g <= kDecodeMaxGroup
  int32_t num_kv_heads = 0;
  float softmax_scale = 0.f;
  const float* q = nullptr;  // device [batch, num_q_heads, kDecodeHeadDim]
  // Keys stored rotated (Options::key_rotation): each block rotates its group's queries by its
  // KV head's R_h (kernels/rotate_row.cuh, bit-identical to LaunchRotateRows) as it loads them,
  // so that a rotated call costs no kernel of its own. Default: queries used as given.
  bool rotate_queries = false;
  uint64_t key_rotation_seed = 0;
  float* out = nullptr;      // device [batch, num_q_heads, kDecodeHeadDim]
  // device [batch, num_q_heads], natural log; -inf for an empty sequence, NaN (with a NaN output)
  // for a head with a NaN or +inf logit, as the CPU reference.
  float* lse = nullptr;
  // Split-KV: split s of a sequence attends its pages [s * pages_per_split, (s + 1) * ...).
  int32_t num_splits = 1;
  int32_t pages_per_split = 0;  // REQUIRES: num_splits * pages_per_split >= every page count
  // Warps a block (4 or 8): ChooseDecodeSplit's choice, which its split assumes. Default: 4.
  int32_t warps_per_block = 4;
  // With num_splits > 1: device workspace of DecodeWorkspaceFloats() floats.
  float* workspace = nullptr;
  // Optional (null to skip): the attention each page received. The kernel writes the log-sum-
  // exp of each (packed entry, query head)'s logits within its page, in log2 units, to page_lse
  // (device, PageLseFloats() floats, laid out by PageLseIndex in page_weight.cuh); once the
  // heads' LSEs are final, the launch stores max(page_weight[e], the largest exp(page LSE - LSE)
  // of a head whose LSE is finite) in page_weight[e] for every entry e of the batch (device
  // [packed_indptr[batch]]), by atomicMax on the bits (non-negative floats order as integers).
  // REQUIRES: page_lse when page_weight is set, 8-byte aligned (pairs of heads are stored
  // together), of at most 2^32 - 1 floats (the kernel indexes it with 32 bits, PageLseStore).
  float* page_weight = nullptr;
  float* page_lse = nullptr;
  // A palette whose all-FP16 formats sit next to smaller ones reads its FP16 pages directly
  // from global memory, so that the staging ring keeps the smaller pages' size (the balanced
  // mix's few FP16 pages); with stage_fp16 they are staged like the others, the ring at FP16's
  // size: for a batch whose pages are mostly FP16 (a young cache under a mixed palette; the
  // library sets it when more than half are, FavoursStagedFp16). Either way every page is read
  // right. Default: read directly.
  bool stage_fp16 = false;
  // Set by LaunchPagedDecode: how each format's page is staged in shared memory and decoded.
  // A staged page holds one KV head's data: [K rows][K micro-scales][V rows][V micro-scales],
  // then 16 K and 16 V FP32 scales at `scales_at`.
  struct FormatPlan {
    // K SideKind | V SideKind << 3 | read directly << 8
    uint32_t kinds = 0;
    uint32_t v_at = 0;   // offset of V's rows in a staged page
    uint32_t src[4]{};   // page offsets of head 0's K rows, V rows, K micro, V micro
    uint32_t scale_src[2]{};    // page offset of head 0's first K / V FP32 scale
    uint32_t scale_count[2]{};  // FP32 scales per head: 16 (per token), 1 (per block) or 0
    // What the kernel makes of a staged K / V scale s: s * scale_mul + scale_add. The decoding
    // leaves values times 1 / mul (NVFP4: 2^-7, else 1) and a side without scales in the page
    // stages s = 0 and has `fill` (its per-tensor scale, or 1 for FP16), so scale_mul = mul (for
    // K times softmax_scale x log2(e), the logits' unit) and scale_add = fill x scale_mul.
    float scale_mul[2]{};
    float scale_add[2]{};
  };
  FormatPlan plans[kDecodeMaxFormats]{};
  int32_t stage_bytes = 0;
  int32_t scales_at = 0;  // offset of the 32 staged scales in a buffer
};

// A split of every sequence's pages that fills `num_sms` multiprocessors in one wave with this
// launch's blocks, and the warps of those blocks (their residency depends on the palette's
// staged page size, stage_fp16 and the GQA group, not on page_weight: the split, and so every
// output bit, is the same with page weights or without): 8 warps where 8-warp blocks fill 16
// warps an SM (two blocks) and the launch is split or max_pages is at least 512, else 4.
// REQUIRES: p's pools, formats, batch, heads and stage_fp16 are set. Returns
// cudaErrorInvalidValue for shapes or layouts the kernel does not read.
struct DecodeSplit {
  int32_t num_splits;
  int32_t pages_per_split;
  int32_t warps_per_block;  // for PagedDecodeParams::warps_per_block
};
cudaError_t ChooseDecodeSplit(const PagedDecodeParams& p, int32_t max_pages, int32_t num_sms,
                              DecodeSplit* split);

// Floats of workspace a launch with these shapes needs (0 when num_splits == 1).
int64_t DecodeWorkspaceFloats(int32_t batch, int32_t num_q_heads, int32_t num_splits);

// Floats of page_lse a launch over `entries` packed entries needs (a GQA group's row of page
// LSEs is padded to an even count, PageLseRow in page_weight.cuh).
int64_t PageLseFloats(int64_t entries, int32_t num_q_heads, int32_t num_kv_heads);

// Whether a launch with page weights stores its page LSEs with an L2 evict_last hint (and its
// weights blocks read them as streaming): when no format of p's palette has an NVFP4 side.
// Measured on the H200 (docs/attention.md, "Performance"): the hint takes FP16 and FP8 page
// weights 1-3 points of decode time closer to the plain decode, NVFP4 and the balanced mix 2.3
// points further. REQUIRES: p's pools and num_formats are set.
bool PageLsesKeptInL2(const PagedDecodeParams& p);

// Whether every format of p's palette has at most one V scale per page and KV head (per block,
// per tensor, or none: FP16), so that the decode kernel multiplies a page's FP16 probabilities
// by one FP16 ratio (docs/attention.md, "FP32 scales"): one more rounding of each probability
// than the per-token path, 1-1.7% faster NVFP4 decode on the H200. REQUIRES: p's pools and
// num_formats are set.
bool ValueScalesUniform(const PagedDecodeParams& p);

// Whether a batch of `entries` packed pages, `fp16_entries` of them in all-FP16 formats, reads
// faster with PagedDecodeParams::stage_fp16: when they are more than half.
inline bool FavoursStagedFp16(int64_t fp16_entries, int64_t entries) {
  return 2 * fp16_entries > entries;
}
// The same for a batch over p's pools with entries_of[f] packed pages in format f.
// REQUIRES: p's pools and num_formats are set; entries_of has num_formats counts.
bool FavoursStagedFp16(const PagedDecodeParams& p, const int64_t* entries_of);

// Which instance of the decode kernel p's palette runs, by the side kinds it compiles its staged
// pages' reads for (kernels/attention/side_kind.cuh): a palette kernel's when every format is
// NVFP4 with micro-blocks along head_dim in K and V (kNvfp4Kinds) or E4M3 in both (kE4M3Kinds),
// else kAnyKinds (the generic kernel: an FP16 format beside them too). 0 for a palette the
// kernel does not read (LaunchPagedDecode refuses it). REQUIRES: p's pools, num_formats and
// stage_fp16 are set.
uint32_t DecodeKernelKinds(const PagedDecodeParams& p);

// Enqueues the decode kernel and, with num_splits > 1, the merge of its partial states; with
// page_weight set, the page weights: a kernel after it when not split, blocks in the merge's
// grid when split (kernels/attention/page_weight.cu).
// Returns cudaErrorInvalidValue for shapes outside the REQUIRES above (the host wrapper in
// src/attention/decode_attention.h checks them first and says why).
cudaError_t LaunchPagedDecode(const PagedDecodeParams& p, cudaStream_t stream);

// Merges `parts` partial attention states per row into one, exactly by log-sum-exp (natural
// log): part k of row r is v[k * v_part_stride + r * head_dim ...] with LSE
// s[k * s_part_stride + r]. A part with LSE -inf is empty; a row whose parts are all empty gets a
// zero output and LSE -inf; a row with a NaN or +inf LSE gets NaN output and LSE (as
// MergeStates). out/lse must not alias the inputs.
struct MergeStatesParams {
  const float* v = nullptr;
  const float* s = nullptr;
  int64_t v_part_stride = 0;
  int64_t s_part_stride = 0;
  int32_t parts = 0;
  int64_t rows = 0;
  int32_t head_dim = 0;
  float* out = nullptr;  // [rows, head_dim]
  float* lse = nullptr;  // [rows]
};
cudaError_t LaunchMergeStates(const MergeStatesParams& p, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_DECODE_ATTENTION_CUH_
