// Host launchers of the CUDA data plane (append, migration, page decode, codec self-check).
// Includable from host C++: it declares plain parameter structs and functions that enqueue
// kernels on a caller's stream and return the launch error. Every buffer is the caller's:
// the launchers allocate nothing and never synchronize.
//
// Bit-identity with the CPU backend: every value is encoded and decoded by the functions of
// kernels/page_codec.h and kernels/codec/*.h, or by the faster device forms in
// kernels/fast_codec.cuh that the self-check below proves equal to them on every input they
// can receive. Compile with --fmad=false.
#ifndef KVTIER_KERNELS_DATA_PLANE_CUH_
#define KVTIER_KERNELS_DATA_PLANE_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/migrate_occupancy.h"
#include "kernels/page_layout.h"

namespace kvtier::gpu {

// Where one appended row goes: token `token` of page `page` (the host splits the cache's slot
// page * block_tokens + token, so that kernels do no 64-bit division).
struct RowSlot {
  uint32_t page;
  uint32_t token;
};

// rows[i] = slots[i] split at `tokens` tokens per page, for i < n.
inline void SplitSlots(const int64_t* slots, size_t n, uint32_t tokens, RowSlot* rows) {
  if ((tokens & (tokens - 1)) == 0) {  // the usual case: shifts, which the compiler vectorizes
    const int shift = __builtin_ctz(tokens);
    for (size_t i = 0; i < n; ++i) {
      rows[i].page = static_cast<uint32_t>(static_cast<uint64_t>(slots[i]) >> shift);
      rows[i].token = static_cast<uint32_t>(slots[i]) & (tokens - 1);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      rows[i].page = static_cast<uint32_t>(slots[i] / tokens);
      rows[i].token = static_cast<uint32_t>(slots[i] % tokens);
    }
  }
}

struct WriteRowsParams {
  uint8_t* base = nullptr;  // the hot pool of one layer
  PageLayout layout{};
  float k_scale = 1.f;  // per-tensor scales (ScaleScope::kTensor codecs)
  float v_scale = 1.f;
  const RowSlot* slots = nullptr;  // device [num_rows]
  int64_t num_rows = 0;
  const void* k = nullptr;  // device [num_rows, heads, head_dim] of FP16 or BF16
  const void* v = nullptr;
  bool bf16 = false;
  // Rotated keys (Options::key_rotation): device [num_rows, heads, head_dim] FP32, R_h k of
  // each K row (LaunchRotateRows), encoded in place of k; null when keys are not rotated. k is
  // still read to count non-finite inputs.
  const float* k_rotated = nullptr;
  unsigned long long* nonfinite = nullptr;  // device counter, incremented by NaN/Inf inputs
  int num_sms = 0;  // multiprocessors of the device (0: ask the runtime)
};

// Encodes rows as page_codec.h's EncodeRow does (the hot format is token-wise).
cudaError_t LaunchWriteRows(const WriteRowsParams& p, cudaStream_t stream);

// One layer's hot pool in a WriteLayers call.
struct AppendPool {
  uint8_t* base = nullptr;
  float k_scale = 1.f;  // per-tensor scales (ScaleScope::kTensor codecs)
  float v_scale = 1.f;
};

// Layers whose K/V inputs one WriteLayers launch takes (by value, so that a launch captured in a
// CUDA graph keeps its own inputs): 2 KiB of pointers, under the 4 KiB classic parameter limit.
constexpr int kWriteLayersMax = 128;

// The rows of every layer of a decode step, appended with the same slots in each layer.
struct WriteLayersParams {
  PageLayout layout{};                 // the hot format's, the same in every layer
  const AppendPool* pools = nullptr;   // device [num_layers]
  const RowSlot* slots = nullptr;      // device [max_rows]
  const int64_t* num_rows = nullptr;   // device: the rows to write, <= max_rows
  int64_t max_rows = 0;                // the grid covers this many rows
  int32_t num_layers = 0;              // REQUIRES: 1 to kWriteLayersMax
  bool bf16 = false;                   // inputs are BF16 (else FP16)
  // Rotated keys (Options::key_rotation): device scratch [num_layers, max_rows, heads, head_dim]
  // FP32 that the launch fills with R_h k first; null when keys are not rotated.
  float* k_rotated = nullptr;
  uint64_t key_rotation_seed = 0;
  unsigned long long* nonfinite = nullptr;  // device counter, incremented by NaN/Inf inputs
  int num_sms = 0;                          // multiprocessors of the device. REQUIRES: > 0
  const void* k[kWriteLayersMax] = {};      // device [num_rows, heads, head_dim] per layer
  const void* v[kWriteLayersMax] = {};
};

// Encodes row i of every layer's k and v into slot slots[i] of that layer's pool, exactly as
// LaunchWriteRows does layer by layer, in one kernel launch (blockIdx.z is the layer); with
// rotated keys a rotation launch of every layer's keys comes first. The row count is read on the
// device, so a captured launch replays over the slots and count in its buffers at replay time.
cudaError_t LaunchWriteLayers(const WriteLayersParams& p, cudaStream_t stream);

// Rows rotated by the key rotation R_h (kernels/codec/hadamard.h), bit-identical to
// codec::RotateKey: out[r] = R_h in[r] with h = (r % heads) / group, so that keys
// [tokens, kv_heads, d] take heads = kv_heads, group = 1 and queries [batch, q_heads, d] take
// heads = q_heads, group = q_heads / kv_heads. REQUIRES: head_dim a power of two, at most 1024.
enum class RotateInput : int32_t { kFp16, kBf16, kFp32 };
struct RotateRowsParams {
  const void* in = nullptr;  // device [num_rows, head_dim] of in_type
  RotateInput in_type = RotateInput::kFp16;
  float* out = nullptr;  // device [num_rows, head_dim]
  int64_t num_rows = 0;
  int32_t head_dim = 0;
  int32_t heads = 1;
  int32_t group = 1;
  uint64_t seed = 0;
};
cudaError_t LaunchRotateRows(const RotateRowsParams& p, cudaStream_t stream);

// One layer's pools in a Requantize call; layouts are the same in every layer.
struct LayerPools {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  float src_k_scale = 1.f;  // per-tensor scales of the source and destination formats
  float src_v_scale = 1.f;
  float dst_k_scale = 1.f;
  float dst_v_scale = 1.f;
};

struct RequantizeParams {
  PageLayout src{};
  PageLayout dst{};
  const LayerPools* layers = nullptr;  // device [num_layers]
  const uint32_t* src_pages = nullptr;  // device [num_blocks]
  const uint32_t* dst_pages = nullptr;  // device [num_blocks]
  int32_t num_layers = 0;
  int32_t num_blocks = 0;
  // Use the fast conversions of fast_codec.cuh (only where the self-check passed).
  bool fast = true;
  // Occupancy for FP16, BF16 and FP8 E4M3 sources (migrate_occupancy.h).
  RequantizeVariant variant = RequantizeVariant::kAuto;
};

// One launch for all layers and blocks: page src_pages[i] of layers[l].src is decoded and
// re-encoded into page dst_pages[i] of layers[l].dst exactly as page_codec.h's DecodeRow and
// EncodeBlockHead do. A warp handles one (layer, block, head, K/V side).
// Returns cudaErrorInvalidValue, launching nothing, for more than 65535 layers or
// num_blocks x 2 x heads >= 2^32.
cudaError_t LaunchRequantize(const RequantizeParams& p, cudaStream_t stream);

// Copies page src_pages[i] of layers[l].src to page dst_pages[i] of layers[l].dst, bytes as
// they are (the host tier's offload and onload; scales unused), in one launch for every layer
// and page. Either side may be pinned host memory mapped into the device's address space: the
// copy is done by the SMs with 16-byte accesses, so scattered pages move as fast as one large
// copy. REQUIRES: page_bytes a multiple of 16; pool bases 16-byte aligned.
struct CopyPagesParams {
  const LayerPools* layers = nullptr;   // device [num_layers]
  const uint32_t* src_pages = nullptr;  // device [num_pages]
  const uint32_t* dst_pages = nullptr;  // device [num_pages]
  uint32_t page_bytes = 0;
  int32_t num_layers = 0;
  int32_t num_pages = 0;
  int num_sms = 0;  // multiprocessors of the device. REQUIRES: > 0
};

cudaError_t LaunchCopyPages(const CopyPagesParams& p, cudaStream_t stream);

// Decodes tokens [0, num_tokens) of one page into k and v, device [num_tokens, heads,
// head_dim] floats, with page_codec.h's DecodeRow.
struct ReadPageParams {
  const uint8_t* page = nullptr;
  PageLayout layout{};
  float k_scale = 1.f;
  float v_scale = 1.f;
  int32_t num_tokens = 0;
  float* k = nullptr;
  float* v = nullptr;
};
cudaError_t LaunchReadPage(const ReadPageParams& p, cudaStream_t stream);

// Compares every fast conversion of fast_codec.cuh with the codec it replaces, on every input
// it may receive (all 2^32 floats, all 2^16 halves, all 2^16 pairs of E4M3 codes). counts
// (device, kSelfCheckCounters zeroed values) receives the number of mismatches of each
// conversion; first_mismatch (same size, set to ~0 by the caller) the smallest failing input
// bits. E4M3 encode, E2M1 encode of products (every float by 1 and by a multiplier drawn from
// its bits, and products next to E2M1's midpoints: a sample, the multipliers being 2^32 more
// inputs), FP16 decode, E4M3 decode (one code and pairs), E4M3 of p / 6 (the NVFP4
// micro-scale), division by an E4M3 value (the NVFP4 multiplier), the NVFP4 scope scales
// A / 2688 and 2688 / A (A up to 2^125)
constexpr int kSelfCheckCounters = 7;
cudaError_t LaunchFastCodecSelfCheck(unsigned long long* counts, unsigned int* first_mismatch,
                                     cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_DATA_PLANE_CUH_
