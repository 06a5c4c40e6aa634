// Counts the program's global operator new calls: linked into a test binary of its own, it
// replaces the global allocation functions, so that a test can show a path allocates nothing.
// Not with ThreadSanitizer, whose runtime defines operator new too.
#ifndef KVTIER_TESTS_ALLOCATION_COUNTER_H_
#define KVTIER_TESTS_ALLOCATION_COUNTER_H_

#include <cstdint>

namespace kvtier::testing {

// Calls of operator new (and new[]) so far, in every thread.
int64_t AllocationCount();

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_ALLOCATION_COUNTER_H_
