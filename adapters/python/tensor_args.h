// Tensor arguments of the module `kvtier`: K/V inputs (numpy or DLPack) and float32 tensors
// handed to a kernel in place. Private to the module's sources.
#ifndef KVTIER_ADAPTERS_PYTHON_TENSOR_ARGS_H_
#define KVTIER_ADAPTERS_PYTHON_TENSOR_ARGS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "adapters/python/dlpack.h"
#include "kvtier/cache.h"
#include "kvtier/options.h"

namespace kvtier::python {

namespace py = pybind11;

// Where tensors for `cache` must live: its backend's memory, on its device.
Placement PlacementOf(const Cache& cache);

// K or V input from a numpy array (float16; other dtypes are converted, a copy) or any object
// with __dlpack__ (float16 or bfloat16, contiguous, on the cache's device: host memory for the
// CPU backend, CUDA memory for the CUDA backend, whose kernels read the pointer directly).
class KVSource {
 public:
  KVSource(const py::object& obj, const Placement& placement);

  const void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  // The DLPack import (null for a numpy input), moved out for the caller to hold: data() stays
  // valid while it is held (PyCache::HoldUntilDone).
  std::unique_ptr<DlpackImport> TakeImport() { return std::move(dlpack_); }

 private:
  py::object array_;  // keeps the converted array alive
  std::unique_ptr<DlpackImport> dlpack_;
  const void* data_ = nullptr;
  DType dtype_ = DType::kFloat16;
  std::vector<int64_t> shape_;
};

// K and V as the cache's input. Raises ValueError unless both are [tokens, num_kv_heads,
// head_dim] of one dtype.
KVInput MakeInput(const KVSource& k, const KVSource& v, const Geometry& g);

// Every layer's K and V from stacked tensors [layers, tokens, num_kv_heads, head_dim]: layer l's
// input points at its rows in k and v, no copy (both are C-contiguous and 16-bit). Raises
// ValueError unless both have that shape and one dtype.
std::vector<KVInput> StackedInputs(const KVSource& k, const KVSource& v, const Geometry& g);

// A float32 tensor handed to a kernel in place: a numpy array (host memory, CPU backend) or any
// object with __dlpack__ (host or CUDA memory, matching `backend`). Must be C-contiguous float32
// of `shape`; nothing is converted or copied, so outputs are written where the caller sees them.
class FloatTensor {
 public:
  FloatTensor(const py::object& obj, const Placement& placement,
              const std::vector<int64_t>& shape, const std::string& name);

  absl::Span<float> span() const { return absl::MakeSpan(data_, size_); }

 private:
  py::object keep_;
  std::unique_ptr<DlpackImport> dlpack_;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvtier::python

#endif  // KVTIER_ADAPTERS_PYTHON_TENSOR_ARGS_H_
