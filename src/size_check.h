// Size checks of caller-sized spans that cannot be fooled by a product that overflows: a count
// near 2^64 / unit must not wrap onto a small span.
#ifndef KVTIER_SRC_SIZE_CHECK_H_
#define KVTIER_SRC_SIZE_CHECK_H_

#include <cstddef>
#include <cstdint>

namespace kvtier {

// Whether `size` elements are exactly `count` items of `unit` elements each.
inline bool HoldsExactly(size_t size, uint64_t count, uint64_t unit) {
  if (unit == 0) return size == 0;
  return size % unit == 0 && size / unit == count;
}

}  // namespace kvtier

#endif  // KVTIER_SRC_SIZE_CHECK_H_
