// The relative error kvtier's tools and tests report: the L2 norm of the difference over the L2
// norm of the reference, sqrt(sum (got - want)^2 / sum want^2), accumulated in double. It is
// the error of docs/formats.md (`kvtier formats`), of the recall sweep's compute error, and the
// one the demotion and GPU attention tests bound.
#ifndef KVTIER_SRC_RELATIVE_ERROR_H_
#define KVTIER_SRC_RELATIVE_ERROR_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "absl/types/span.h"
#include "kernels/codec/half.h"

namespace kvtier {

// The relative error of `got` against `want`, each want[i] read as a double by `value`.
// 0 when both are all zero; +inf when only `want` is. REQUIRES: got.size() == want.size().
template <typename Want, typename Value>
double RelativeError(absl::Span<const float> got, absl::Span<const Want> want, Value value) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = value(want[i]);
    num += (got[i] - x) * (got[i] - x);
    den += x * x;
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

// Against float values.
inline double RelativeError(absl::Span<const float> got, absl::Span<const float> want) {
  return RelativeError(got, want, [](float x) { return static_cast<double>(x); });
}

// Against FP16 bit patterns (what the tools and tests write into a cache).
inline double RelativeErrorToHalf(absl::Span<const float> got,
                                  absl::Span<const uint16_t> want_fp16) {
  return RelativeError(got, want_fp16, [](uint16_t h) { return double{codec::HalfToFloat(h)}; });
}

}  // namespace kvtier

#endif  // KVTIER_SRC_RELATIVE_ERROR_H_
