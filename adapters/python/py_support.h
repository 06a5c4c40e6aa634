// Shared pieces of the Python module `kvtier` (adapters/python/): Status to Python exceptions,
// numpy conversions, and the Python-side holder of a Cache. Private to the module's sources.
#ifndef KVTIER_ADAPTERS_PYTHON_PY_SUPPORT_H_
#define KVTIER_ADAPTERS_PYTHON_PY_SUPPORT_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvtier/cache.h"

namespace kvtier::python {

namespace py = pybind11;

// ---- Errors ----

// Raises s as a Python exception carrying its message: ValueError (InvalidArgument), KeyError
// (NotFound), MemoryError (ResourceExhausted), RuntimeError (anything else).
[[noreturn]] void Throw(const absl::Status& s);

inline void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return std::move(*v);
}

// ---- numpy helpers ----

template <typename T>
py::array_t<T> ToNumpy(const std::vector<T>& v, std::vector<py::ssize_t> shape = {}) {
  if (shape.empty()) shape = {static_cast<py::ssize_t>(v.size())};
  py::array_t<T> a(shape);
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

template <typename T>
std::vector<T> FromArray(const py::handle& obj) {
  if (obj.is_none()) return {};
  py::array_t<T, py::array::c_style | py::array::forcecast> a =
      py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) throw py::type_error("expected an array-like of numbers");
  return std::vector<T>(a.data(), a.data() + a.size());
}

// ---- The cache ----

struct PyCache {
  std::unique_ptr<Cache> cache;
  Cache& operator*() const { return *cache; }
  const Geometry& geometry() const { return cache->options().geometry; }
};

inline PyCache& Self(const py::object& self) { return self.cast<PyCache&>(); }

}  // namespace kvtier::python

#endif  // KVTIER_ADAPTERS_PYTHON_PY_SUPPORT_H_
