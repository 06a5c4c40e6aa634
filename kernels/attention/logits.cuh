// The scaled logits of decode attention (DecodeOutputs::logits) on the device, for tools and
// tests that need every key's score (the recall sweep): a launch beside the fused kernel, not
// part of it. Includable from host C++.
//
// For each (sequence b, query head h, token i < length_b): softmax_scale * (q . k_i), with k_i
// decoded by the page codec (DecodeRow of kernels/page_codec.h: the values the CPU reference
// reads; the fused kernel reads the same codes and scales) and the dot product in FP32 in dim
// order; -inf for every i in [length_b, logits_stride). q is used as given: a cache with rotated
// keys needs the rotated queries (LaunchRotateRows), as the fused kernel does.
#ifndef KVTIER_KERNELS_ATTENTION_LOGITS_CUH_
#define KVTIER_KERNELS_ATTENTION_LOGITS_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/decode_attention.cuh"

namespace kvtier::gpu {

struct DecodeLogitsParams {
  DecodePool pools[kDecodeMaxFormats];
  int32_t num_formats = 0;
  const int32_t* packed_indptr = nullptr;  // device [batch + 1]
  const uint32_t* packed = nullptr;        // device, PackPage(format, page) per block
  const int32_t* seq_lens = nullptr;       // device [batch]
  int32_t batch = 0;                       // REQUIRES: <= kDecodeMaxBatch
  int32_t num_q_heads = 0;                 // REQUIRES: a positive multiple of num_kv_heads
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 0;  // tokens per page
  float softmax_scale = 0.f;
  const float* q = nullptr;    // device [batch, num_q_heads, head_dim]
  float* logits = nullptr;     // device [batch, num_q_heads, logits_stride]
  int64_t logits_stride = 0;   // REQUIRES: >= every sequence's length
};

// Enqueues the logits kernel: one block per (16-token tile of logits_stride, sequence, KV head)
// decodes the tile's keys and the group's queries into shared memory, then one thread per
// (query head, token) writes its logit. Returns cudaErrorInvalidValue for shapes it cannot
// launch (a group and page whose keys and queries exceed 48 KB of shared memory, a batch or KV
// heads beyond the grid).
cudaError_t LaunchDecodeLogits(const DecodeLogitsParams& p, cudaStream_t stream);

}  // namespace kvtier::gpu

#endif  // KVTIER_KERNELS_ATTENTION_LOGITS_CUH_
