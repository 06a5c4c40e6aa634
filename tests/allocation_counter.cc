#include "tests/allocation_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "absl/base/attributes.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

// The replacements are not inlined, so that g++ sees no new/free mismatch at call sites.
ABSL_ATTRIBUTE_NOINLINE void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
ABSL_ATTRIBUTE_NOINLINE void* operator new[](size_t n) { return operator new(n); }
ABSL_ATTRIBUTE_NOINLINE void operator delete(void* p) noexcept { std::free(p); }
ABSL_ATTRIBUTE_NOINLINE void operator delete[](void* p) noexcept { std::free(p); }
ABSL_ATTRIBUTE_NOINLINE void operator delete(void* p, size_t) noexcept { std::free(p); }
ABSL_ATTRIBUTE_NOINLINE void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace kvtier::testing {

int64_t AllocationCount() { return g_allocations.load(std::memory_order_relaxed); }

}  // namespace kvtier::testing
