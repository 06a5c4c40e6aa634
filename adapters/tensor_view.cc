#include "kvtier/adapters/tensor_view.h"

namespace kvtier {

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

}  // namespace kvtier
