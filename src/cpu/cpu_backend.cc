// The host-memory backend: pools are reserved with mmap(PROT_NONE) and slabs committed with
// mprotect, so reading an unmapped slab faults instead of returning garbage.
#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/codec/hadamard.h"
#include "kernels/codec/half.h"
#include "kernels/page_codec.h"
#include "src/backend.h"

namespace kvtier {
namespace {

absl::Status Errno(const char* call) {
  const int e = errno;
  return absl::ResourceExhaustedError(absl::StrCat(call, " failed: ", std::strerror(e)));
}

// REQUIRES: dtype is kFloat16 or kBFloat16 (checked by the cache).
float InputToFloat(DType dtype, const void* data, int64_t i) {
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == DType::kFloat16 ? codec::HalfToFloat(bits) : codec::Bf16ToFloat(bits);
}

class CpuBackend final : public Backend {
 public:
  absl::StatusOr<uint8_t*> Reserve(size_t bytes) override {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Errno("mmap");
    return static_cast<uint8_t*>(p);
  }

  void Unreserve(uint8_t* base, size_t bytes) override { munmap(base, bytes); }

  absl::Status Map(uint8_t* addr, size_t bytes) override {
    if (mprotect(addr, bytes, PROT_READ | PROT_WRITE) != 0) return Errno("mprotect");
    return absl::OkStatus();
  }

  absl::Status Unmap(uint8_t* addr, size_t bytes) override {
    // Drop the memory first so the slab holds zeros, not stale data, when mapped again.
    if (madvise(addr, bytes, MADV_DONTNEED) != 0) return Errno("madvise");
    if (mprotect(addr, bytes, PROT_NONE) != 0) return Errno("mprotect");
    return absl::OkStatus();
  }

  absl::Status WriteRows(const PoolView& pool, absl::Span<const int64_t> slots,
                         const KVInput& kv, int64_t* nonfinite) override {
    const PageLayout& l = pool.layout;
    row_.resize(l.head_dim);
    for (size_t i = 0; i < slots.size(); ++i) {
      uint8_t* page = pool.base + static_cast<size_t>(slots[i] / l.tokens) * l.page_bytes;
      const int token = static_cast<int>(slots[i] % l.tokens);
      for (int h = 0; h < l.heads; ++h) {
        const int64_t first = (static_cast<int64_t>(i) * l.heads + h) * l.head_dim;
        for (int side = 0; side < 2; ++side) {
          const void* src = side == 0 ? kv.k : kv.v;
          for (int d = 0; d < l.head_dim; ++d) {
            row_[d] = InputToFloat(kv.dtype, src, first + d);
            *nonfinite += std::isfinite(row_[d]) ? 0 : 1;
          }
          if (side == 0 && pool.rotate_keys) {
            codec::RotateKey(row_.data(), l.head_dim, pool.key_rotation_seed, h);
          }
          EncodeRow(l, side == 0 ? l.k : l.v, page, h, token, row_.data(),
                    side == 0 ? pool.k_tensor_scale : pool.v_tensor_scale);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadPage(const PoolView& pool, uint32_t page_index, int num_tokens, float* k,
                        float* v) override {
    const PageLayout& l = pool.layout;
    const uint8_t* page = pool.base + static_cast<size_t>(page_index) * l.page_bytes;
    for (int t = 0; t < num_tokens; ++t) {
      for (int h = 0; h < l.heads; ++h) {
        const size_t at = (static_cast<size_t>(t) * l.heads + h) * l.head_dim;
        DecodeRow(l, l.k, page, h, t, k + at, pool.k_tensor_scale);
        DecodeRow(l, l.v, page, h, t, v + at, pool.v_tensor_scale);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Requantize(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                          absl::Span<const uint32_t> src_pages,
                          absl::Span<const uint32_t> dst_pages) override {
    for (size_t layer = 0; layer < from.size(); ++layer) {
      const PageLayout& src = from[layer].layout;
      const PageLayout& dst = to[layer].layout;
      const size_t row = static_cast<size_t>(src.head_dim);
      block_.resize(static_cast<size_t>(src.tokens) * row);
      for (size_t i = 0; i < src_pages.size(); ++i) {
        const uint8_t* in = from[layer].base + static_cast<size_t>(src_pages[i]) * src.page_bytes;
        uint8_t* out = to[layer].base + static_cast<size_t>(dst_pages[i]) * dst.page_bytes;
        for (int h = 0; h < src.heads; ++h) {
          for (int side = 0; side < 2; ++side) {
            const CodecLayout& sc = side == 0 ? src.k : src.v;
            const CodecLayout& dc = side == 0 ? dst.k : dst.v;
            const float in_scale = side == 0 ? from[layer].k_tensor_scale : from[layer].v_tensor_scale;
            const float out_scale = side == 0 ? to[layer].k_tensor_scale : to[layer].v_tensor_scale;
            for (int t = 0; t < src.tokens; ++t) DecodeRow(src, sc, in, h, t, &block_[t * row], in_scale);
            EncodeBlockHead(dst, dc, out, h, block_.data(), static_cast<int>(row), out_scale);
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CopyPage(const PoolView& pool, uint32_t src, uint32_t dst) override {
    return CopyPages({&pool, 1}, {&pool, 1}, {&src, 1}, {&dst, 1});
  }

  // The host tier is a second budget of the same host memory.
  absl::StatusOr<uint8_t*> ReserveHost(size_t bytes) override { return Reserve(bytes); }
  void UnreserveHost(uint8_t* base, size_t bytes) override { Unreserve(base, bytes); }
  absl::Status MapHost(uint8_t* addr, size_t bytes) override { return Map(addr, bytes); }
  absl::Status UnmapHost(uint8_t* addr, size_t bytes) override { return Unmap(addr, bytes); }

  absl::Status CopyPages(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                         absl::Span<const uint32_t> src_pages,
                         absl::Span<const uint32_t> dst_pages) override {
    for (size_t l = 0; l < from.size(); ++l) {
      const size_t bytes = from[l].layout.page_bytes;
      for (size_t i = 0; i < src_pages.size(); ++i) {
        std::memcpy(to[l].base + dst_pages[i] * bytes, from[l].base + src_pages[i] * bytes, bytes);
      }
    }
    return absl::OkStatus();
  }

  bool synchronous() const override { return true; }
  absl::StatusOr<uint64_t> RecordFence() override { return ++fences_; }
  absl::StatusOr<bool> FencePassed(uint64_t) override { return true; }
  uint64_t NextFence() const override { return fences_ + 1; }

 private:
  std::vector<float> row_;    // scratch for one input row
  std::vector<float> block_;  // scratch for one (block, head) of decoded values
  uint64_t fences_ = 0;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace kvtier
