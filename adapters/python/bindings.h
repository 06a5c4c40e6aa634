// The binding functions of the module `kvtier` (adapters/python/), one per concept; module.cc
// calls them in order. Private to the module's sources.
#ifndef KVTIER_ADAPTERS_PYTHON_BINDINGS_H_
#define KVTIER_ADAPTERS_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include "adapters/python/py_support.h"

namespace kvtier::python {

using CacheClass = py::class_<PyCache>;

// SequenceId, BlockId, PageTables, PreparedDecode and TensorView (value_bindings.cc).
void BindValueTypes(py::module_& m);

// Cache: construction, geometry, sequences, K/V data, policy, stats and pools
// (cache_bindings.cc).
void BindCache(CacheClass& cache);

// Cache: page tables and the adapters' tables and layer views; check_readable
// (adapter_bindings.cc).
void BindAdapters(CacheClass& cache, py::module_& m);

// Cache: kvtier's decode attention and the CPU reference; the merges of partial states and the
// LSE base conversions (attention_bindings.cc).
void BindAttention(CacheClass& cache, py::module_& m);

// PreparedAppend; Cache: prepare_append and write_kv_layers, every layer's K/V of a step in one
// call (append_bindings.cc).
void BindAppend(CacheClass& cache, py::module_& m);

}  // namespace kvtier::python

#endif  // KVTIER_ADAPTERS_PYTHON_BINDINGS_H_
