// The Python module `kvtier` (pybind11): a cache, its sequences and data, page tables, the
// adapters' tables as numpy arrays, pool views as DLPack tensors (no copy), stats, and kvtier's
// decode attention with the CPU reference, and every layer's K/V of a step in one call (the
// prepared append). Errors become exceptions carrying the Status message:
// ValueError (InvalidArgument), KeyError (NotFound), MemoryError (ResourceExhausted),
// RuntimeError (anything else). See docs/adapters.md.
//
// Thread-safety: the Cache itself is thread-safe; the module holds the GIL throughout.
#include <pybind11/pybind11.h>

#include "adapters/python/bindings.h"

PYBIND11_MODULE(kvtier, m) {
  using namespace kvtier::python;
  m.doc() = "kvtier: a paged, mixed-precision KV cache; adapters for external attention kernels";
  BindValueTypes(m);
  CacheClass cache(m, "Cache");
  BindCache(cache);
  BindAdapters(cache, m);
  BindAttention(cache, m);
  BindAppend(cache, m);
}
