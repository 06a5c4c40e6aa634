// A strided tensor over a pool, as DLPack and torch describe it: how the adapters hand kvtier's
// pages to external kernels without a copy.
#ifndef KVTIER_ADAPTERS_TENSOR_VIEW_H_
#define KVTIER_ADAPTERS_TENSOR_VIEW_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kvtier/export.h"
#include "kvtier/options.h"

namespace kvtier {

// What the elements of a view mean. FP8 and FP4 have no code in older DLPack versions: the
// Python binding exports them as uint8 plus this tag.
enum class ViewDType : uint8_t {
  kFloat16,
  kBFloat16,
  kFloat8E4M3,   // OCP E4M3FN, one byte
  kFloat8E5M2,   // one byte
  kFloat4E2M1x2, // two E2M1 values per byte, element 2i in the low nibble
  kFloat32,
};
KVTIER_EXPORT const char* ViewDTypeName(ViewDType dtype);  // "float16", ..., "float4_e2m1x2"
KVTIER_EXPORT int ViewDTypeBytes(ViewDType dtype);         // storage bytes per element

// A strided tensor over a pool, as DLPack and torch describe it. No ownership. A pool's view
// spans its whole reserved range (page tables index into it), of which only the slabs holding
// pages are mapped. REQUIRES: readers read only the pages a step's page tables name; the rest
// faults (SIGSEGV on the CPU backend, an illegal address on CUDA).
struct TensorView {
  void* data = nullptr;  // element [0, 0, ...]
  ViewDType dtype = ViewDType::kFloat16;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, like torch and DLPack
  BackendKind device = BackendKind::kCpu;
  // The CUDA device holding the data (PoolInfo::device_id for a pool's view); 0 on the CPU.
  int32_t device_id = 0;

  // Byte offset from `data` of the element at `index` (index.size() == shape.size()).
  KVTIER_EXPORT int64_t ByteOffset(absl::Span<const int64_t> index) const;
};

}  // namespace kvtier

#endif  // KVTIER_ADAPTERS_TENSOR_VIEW_H_
