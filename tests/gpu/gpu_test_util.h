// Helpers of the GPU tests: skipping where no device is usable, device buffers, random K/V
// with outlier channels, and byte comparison of pages between a CPU and a CUDA cache.
#ifndef KVTIER_TESTS_GPU_GPU_TEST_UTIL_H_
#define KVTIER_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/codec/half.h"
#include "kernels/page_layout.h"
#include "kvtier/cache.h"
#include "src/backend.h"

namespace kvtier::testing {

// OK when a CUDA backend can be created here (probed once per process).
inline const absl::Status& GpuStatus() {
  static const absl::Status* const status = [] {
    absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend();
    return new absl::Status(b.status());
  }();
  return *status;
}

#define KVTIER_REQUIRE_GPU()                                                        \
  do {                                                                              \
    if (!::kvtier::testing::GpuStatus().ok()) {                                     \
      GTEST_SKIP() << "no usable CUDA device: " << ::kvtier::testing::GpuStatus(); \
    }                                                                               \
  } while (0)

#define KVTIER_ASSERT_CUDA(call)                                                      \
  do {                                                                                \
    const cudaError_t kvtier_e_ = (call);                                             \
    ASSERT_EQ(kvtier_e_, cudaSuccess) << #call << ": " << cudaGetErrorString(kvtier_e_); \
  } while (0)

// Steps of the longer tests; the run script lowers it under compute-sanitizer.
inline int TestScale(int normal) {
  const char* s = std::getenv("KVTIER_GPU_TEST_SCALE");
  const double f = s != nullptr ? std::atof(s) : 1.0;
  const int n = static_cast<int>(normal * f);
  return n > 0 ? n : 1;
}

// A device copy of host data, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { Resize(bytes); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  void Resize(size_t bytes) {
    if (bytes <= bytes_) return;
    cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
    if (cudaMalloc(&data_, bytes) == cudaSuccess) bytes_ = bytes;
  }
  // Copies host data in; synchronous for the host buffer, ordered before later work on the
  // legacy stream and on the backend's (blocking) stream.
  template <typename T>
  void Upload(const std::vector<T>& host) {
    Resize(host.size() * sizeof(T));
    cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// FP16 bits of K or V rows [tokens, heads, head_dim]: normal values, never zero, keys with a
// few outlier channels about 10x larger (as in real models).
inline std::vector<uint16_t> RandomKV(int64_t tokens, int heads, int head_dim, bool keys,
                                      std::mt19937* rng) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> out(static_cast<size_t>(tokens) * heads * head_dim);
  for (size_t i = 0; i < out.size(); ++i) {
    const int d = static_cast<int>(i % head_dim);
    float x = dist(*rng);
    if (x == 0.f) x = 0.5f;
    if (keys && (d % 29 == 3 || d == head_dim - 1)) x *= 10.f;
    out[i] = codec::FloatToHalf(x);
  }
  return out;
}

// Overwrites a few values with specials: NaN (with payloads and both signs), +-Inf, +-65504,
// subnormals, -0.
inline void AddSpecials(std::vector<uint16_t>* x, std::mt19937* rng) {
  static constexpr uint16_t kSpecials[] = {0x7E00, 0xFE01, 0x7C01, 0x7C00, 0xFC00,
                                           0x7BFF, 0xFBFF, 0x0001, 0x8003, 0x8000};
  std::uniform_int_distribution<size_t> at(0, x->size() - 1);
  for (uint16_t s : kSpecials) (*x)[at(*rng)] = s;
}

// Bytes of a page that its codecs define when `tokens` tokens are written (all of them for a
// full block): payload rows, their micro-scales and fp32 scales. Padding and alignment gaps
// are not defined.
inline std::vector<bool> DefinedBytes(const PageLayout& l, int tokens) {
  std::vector<bool> mask(l.page_bytes, false);
  auto mark = [&](uint32_t at, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) mask[at + i] = true;
  };
  const bool full = tokens == l.tokens;
  for (const CodecLayout* c : {&l.k, &l.v}) {
    for (int h = 0; h < l.heads; ++h) {
      for (int t = 0; t < tokens; ++t) mark(l.PayloadOffset(*c, h, t), c->row_bytes);
      if (c->type == ElementType::kNvfp4) {
        if (c->axis == MicroAxis::kHeadDim) {
          for (int t = 0; t < tokens; ++t) {
            for (int d = 0; d < l.head_dim; d += kMicroBlock) mark(l.MicroOffset(*c, h, t, d), 1);
          }
        } else if (full) {
          for (int t = 0; t < l.tokens; t += kMicroBlock) {
            for (int d = 0; d < l.head_dim; ++d) mark(l.MicroOffset(*c, h, t, d), 1);
          }
        }
      }
      if (c->scope == ScaleScope::kBlockHead && full) mark(l.ScaleOffset(*c, h, 0), 4);
      if (c->scope == ScaleScope::kTokenHead) {
        for (int t = 0; t < tokens; ++t) mark(l.ScaleOffset(*c, h, t), 4);
      }
    }
  }
  return mask;
}

// The first difference between a CPU page and a CUDA page (copied back) in the defined bytes,
// or "" when they agree.
inline std::string ComparePage(const PageLayout& l, int tokens, const uint8_t* cpu,
                               const uint8_t* gpu_device) {
  std::vector<uint8_t> gpu(l.page_bytes);
  const cudaError_t e = cudaMemcpy(gpu.data(), gpu_device, l.page_bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) return absl::StrCat("cudaMemcpy: ", cudaGetErrorString(e));
  const std::vector<bool> mask = DefinedBytes(l, tokens);
  int differences = 0;
  std::string first;
  for (uint32_t i = 0; i < l.page_bytes; ++i) {
    if (mask[i] && cpu[i] != gpu[i]) {
      if (differences++ == 0) {
        first = absl::StrCat("byte ", i, ": cpu ", int{cpu[i]}, " gpu ", int{gpu[i]});
      }
    }
  }
  return differences == 0 ? "" : absl::StrCat(differences, " bytes differ, first at ", first);
}

// Bitwise equality of two float arrays (NaNs included); "" when equal.
inline std::string CompareFloats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return absl::StrCat("sizes ", a.size(), " and ", b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return absl::StrCat("float ", i, ": cpu ", a[i], " gpu ", b[i]);
    }
  }
  return "";
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_GPU_GPU_TEST_UTIL_H_
