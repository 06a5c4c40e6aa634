// The byte layout of one page (one block of one layer in one format), shared by the CPU
// backend and the CUDA kernels. A plain struct passed by value into kernels.
//
//   [K payload: heads x tokens x row] [V payload: same]
//   [K E4M3 micro-scales] [V E4M3 micro-scales]      NVFP4 only, identical sizes
//   [K fp32 scales] [V fp32 scales]                   per (block, head) or per (token, head)
//   padding to kPageAlignment
//
// The E4M3 micro-scales of K and V are adjacent with equal sizes so that external kernels see
// them as one strided tensor [P, 2, H, S, D/16] (FlashInfer's kv_cache_sf).
#ifndef KVTIER_KERNELS_PAGE_LAYOUT_H_
#define KVTIER_KERNELS_PAGE_LAYOUT_H_

#include <cstdint>

#include "kernels/codec/host_device.h"
#include "kvtier/format.h"

namespace kvtier {

constexpr uint32_t kPageAlignment = 256;
constexpr int kMicroBlock = 16;  // NVFP4 values per E4M3 scale

// Where one side's (K's or V's) data lives inside a page.
struct CodecLayout {
  ElementType type;
  ScaleScope scope;
  MicroAxis axis;
  uint32_t row_bytes;       // payload bytes of one (head, token): head_dim * bits / 8
  uint32_t payload_offset;  // [heads][tokens][row_bytes]
  uint32_t micro_offset;    // NVFP4: E4M3 [heads][tokens][D/16] or [heads][tokens/16][D]
  uint32_t scale_offset;    // fp32 [heads] (block_head) or [heads][tokens] (token_head)
};

struct PageLayout {
  int32_t heads;
  int32_t tokens;
  int32_t head_dim;
  uint32_t page_bytes;  // multiple of kPageAlignment
  uint32_t data_bytes;  // payload and in-page scales, before padding
  CodecLayout k;
  CodecLayout v;

  KVTIER_HD uint32_t PayloadOffset(const CodecLayout& c, int head, int token) const {
    return c.payload_offset + (static_cast<uint32_t>(head) * tokens + token) * c.row_bytes;
  }
  // Offset of the E4M3 micro-scale that covers element `dim` of (head, token).
  KVTIER_HD uint32_t MicroOffset(const CodecLayout& c, int head, int token, int dim) const {
    const uint32_t per_head = static_cast<uint32_t>(tokens) * head_dim / kMicroBlock;
    if (c.axis == MicroAxis::kHeadDim) {
      return c.micro_offset + head * per_head + token * (head_dim / kMicroBlock) +
             dim / kMicroBlock;
    }
    return c.micro_offset + head * per_head + (token / kMicroBlock) * head_dim + dim;
  }
  // Offset of the fp32 scale of (head, token); `token` is ignored for per-(block, head).
  KVTIER_HD uint32_t ScaleOffset(const CodecLayout& c, int head, int token) const {
    const uint32_t index = c.scope == ScaleScope::kTokenHead
                               ? static_cast<uint32_t>(head) * tokens + token
                               : static_cast<uint32_t>(head);
    return c.scale_offset + index * 4;
  }
};

// Fp32 scales a codec keeps per (block, head) inside the page.
inline uint32_t PageScalesPerHead(const CodecSpec& c, int tokens) {
  switch (c.scope) {
    case ScaleScope::kBlockHead: return 1;
    case ScaleScope::kTokenHead: return static_cast<uint32_t>(tokens);
    default: return 0;
  }
}

// REQUIRES: ValidateCodec() is OK for both codecs; head_dim % 16 == 0; for an NVFP4 codec
// along tokens, tokens % 16 == 0.
inline PageLayout MakePageLayout(int heads, int tokens, int head_dim, const FormatSpec& f) {
  PageLayout p{};
  p.heads = heads;
  p.tokens = tokens;
  p.head_dim = head_dim;
  auto init = [&](CodecLayout& c, const CodecSpec& s) {
    c.type = s.type;
    c.scope = s.scope;
    c.axis = s.axis;
    c.row_bytes = static_cast<uint32_t>(head_dim * PayloadBits(s.type) / 8);
  };
  init(p.k, f.k);
  init(p.v, f.v);
  const uint32_t cells = static_cast<uint32_t>(heads) * tokens;
  uint32_t offset = 0;
  p.k.payload_offset = offset;
  offset += cells * p.k.row_bytes;
  p.v.payload_offset = offset;
  offset += cells * p.v.row_bytes;
  const uint32_t micro_bytes = cells * head_dim / kMicroBlock;
  p.k.micro_offset = offset;
  offset += f.k.type == ElementType::kNvfp4 ? micro_bytes : 0;
  p.v.micro_offset = offset;
  offset += f.v.type == ElementType::kNvfp4 ? micro_bytes : 0;
  offset = (offset + 3) / 4 * 4;
  p.k.scale_offset = offset;
  offset += heads * PageScalesPerHead(f.k, tokens) * 4;
  p.v.scale_offset = offset;
  offset += heads * PageScalesPerHead(f.v, tokens) * 4;
  p.data_bytes = offset;
  p.page_bytes = (offset + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
  return p;
}

}  // namespace kvtier

#endif  // KVTIER_KERNELS_PAGE_LAYOUT_H_
