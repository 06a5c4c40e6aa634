// Tensor arguments of the module `kvtier` (tensor_args.h).
#include "adapters/python/tensor_args.h"

#include <pybind11/numpy.h>

namespace kvtier::python {

using namespace pybind11::literals;

Placement PlacementOf(const Cache& cache) {
  const absl::StatusOr<PoolInfo> pool = cache.GetPool(0, 0);
  return Placement{cache.options().backend, pool.ok() ? pool->device_id : Placement::kAnyDevice};
}

KVSource::KVSource(const py::object& obj, const Placement& placement) {
  if (!py::isinstance<py::array>(obj) && py::hasattr(obj, "__dlpack__")) {
    dlpack_ = std::make_unique<DlpackImport>(obj, placement, "K/V");
    const DLDataType& t = dlpack_->dtype();
    if (t.bits != 16 || t.lanes != 1 || (t.code != 2 && t.code != 4)) {
      throw py::value_error("K/V via DLPack must be float16 or bfloat16");
    }
    dtype_ = t.code == 2 ? DType::kFloat16 : DType::kBFloat16;
    shape_ = dlpack_->shape();
    data_ = dlpack_->data();
    return;
  }
  if (placement.backend == BackendKind::kCuda) {
    throw py::value_error("the CUDA backend takes K/V in CUDA memory (e.g. a torch CUDA tensor)");
  }
  py::module_ np = py::module_::import("numpy");
  const py::array a = np.attr("ascontiguousarray")(obj, "dtype"_a = "float16");
  shape_.assign(a.shape(), a.shape() + a.ndim());
  data_ = a.data();
  array_ = a;
}

namespace {

// Raises ValueError unless K and V have one dtype and one shape: `lead` (the names of the
// dimensions before the last two) then [num_kv_heads, head_dim].
void CheckKV(const KVSource& k, const KVSource& v, const Geometry& g,
             const std::vector<std::string>& lead) {
  const std::vector<int64_t>& s = k.shape();
  const size_t n = lead.size();
  if (s.size() != n + 2 || s != v.shape() || s[n] != g.num_kv_heads || s[n + 1] != g.head_dim ||
      k.dtype() != v.dtype()) {
    std::string dims;
    for (const std::string& d : lead) dims += d + ", ";
    throw py::value_error("K and V must have the same dtype and shape [" + dims +
                          "num_kv_heads (" + std::to_string(g.num_kv_heads) + "), head_dim (" +
                          std::to_string(g.head_dim) + ")]");
  }
}

}  // namespace

KVInput MakeInput(const KVSource& k, const KVSource& v, const Geometry& g) {
  CheckKV(k, v, g, {"tokens"});
  return KVInput{k.dtype(), k.data(), v.data(), k.shape()[0], g.num_kv_heads, g.head_dim};
}

std::vector<KVInput> StackedInputs(const KVSource& k, const KVSource& v, const Geometry& g) {
  CheckKV(k, v, g, {"layers", "tokens"});
  const int64_t tokens = k.shape()[1];
  const size_t layer_bytes = static_cast<size_t>(tokens) * g.num_kv_heads * g.head_dim * 2;
  std::vector<KVInput> out;
  for (int64_t l = 0; l < k.shape()[0]; ++l) {
    const size_t at = static_cast<size_t>(l) * layer_bytes;
    out.push_back(KVInput{k.dtype(), static_cast<const uint8_t*>(k.data()) + at,
                          static_cast<const uint8_t*>(v.data()) + at, tokens, g.num_kv_heads,
                          g.head_dim});
  }
  return out;
}

FloatTensor::FloatTensor(const py::object& obj, const Placement& placement,
                         const std::vector<int64_t>& shape, const std::string& name) {
  std::vector<int64_t> got;
  if (py::isinstance<py::array>(obj)) {
    const py::array a = obj.cast<py::array>();
    if (placement.backend == BackendKind::kCuda) {
      throw py::value_error(name + " must be in CUDA memory for the CUDA backend");
    }
    if (!a.dtype().is(py::dtype::of<float>()) ||
        !(a.flags() & py::array::c_style) || !a.writeable()) {
      throw py::value_error(name + " must be a writable C-contiguous float32 array");
    }
    got.assign(a.shape(), a.shape() + a.ndim());
    data_ = static_cast<float*>(const_cast<void*>(a.data()));
    keep_ = obj;
  } else if (py::hasattr(obj, "__dlpack__")) {
    dlpack_ = std::make_unique<DlpackImport>(obj, placement, name);
    const DLDataType& t = dlpack_->dtype();
    if (t.code != 2 || t.bits != 32 || t.lanes != 1) {
      throw py::value_error(name + " must be float32");
    }
    got = dlpack_->shape();
    data_ = reinterpret_cast<float*>(dlpack_->data());
  } else {
    throw py::type_error(name + " must be a numpy array or support __dlpack__");
  }
  if (got != shape) {
    std::string want;
    for (int64_t x : shape) want += (want.empty() ? "" : ", ") + std::to_string(x);
    throw py::value_error(name + " must have shape [" + want + "]");
  }
  size_ = 1;
  for (int64_t x : shape) size_ *= static_cast<size_t>(x);
}

}  // namespace kvtier::python
