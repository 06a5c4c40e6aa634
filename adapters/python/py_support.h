// Shared pieces of the Python module `kvtier` (adapters/python/): Status to Python exceptions,
// numpy conversions, and the Python-side holder of a Cache (and of the tensors it reads).
// Private to the module's sources.
#ifndef KVTIER_ADAPTERS_PYTHON_PY_SUPPORT_H_
#define KVTIER_ADAPTERS_PYTHON_PY_SUPPORT_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/python/dlpack.h"
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

// A 1-D array-like of numbers (or one number) as a vector of T. For an integral T (slots,
// counts, token ids): integers only, each in T's range, else TypeError or ValueError; a float
// would be truncated, an int64 token id wrapped into another token. None and empty inputs give
// an empty vector.
template <typename T>
std::vector<T> FromArray(const py::handle& obj) {
  if (obj.is_none()) return {};
  const py::array any = py::array::ensure(obj);
  if (!any) throw py::type_error("expected an array-like of numbers");
  if (any.size() == 0) return {};
  if (any.ndim() > 1) {
    throw py::value_error("expected a 1-D array, got " + std::to_string(any.ndim()) +
                          " dimensions");
  }
  if constexpr (std::is_integral_v<T>) {
    const char kind = any.dtype().kind();
    if (kind != 'i' && kind != 'u') {
      throw py::type_error(std::string("expected integers, got an array of ") +
                           py::str(any.dtype()).cast<std::string>());
    }
    using Wide = std::conditional_t<sizeof(T) < 8, int64_t, T>;
    const auto wide = py::array_t<Wide, py::array::c_style | py::array::forcecast>::ensure(any);
    if (!wide) throw py::type_error("expected integers");
    std::vector<T> out;
    out.reserve(wide.size());
    for (py::ssize_t i = 0; i < wide.size(); ++i) {
      const Wide x = wide.data()[i];
      bool outside = kind == 'u' && x < 0;  // a uint64 past INT64_MAX, wrapped by the cast
      if constexpr (sizeof(T) < sizeof(Wide)) {
        outside = outside || x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max();
      }
      if (outside) {
        throw py::value_error(
            (kind == 'u' ? std::to_string(static_cast<uint64_t>(x)) : std::to_string(x)) +
            " is outside [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
            std::to_string(std::numeric_limits<T>::max()) + "]");
      }
      out.push_back(static_cast<T>(x));
    }
    return out;
  } else {
    const auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(any);
    if (!a) throw py::type_error("expected an array-like of numbers");
    return std::vector<T>(a.data(), a.data() + a.size());
  }
}

// ---- The cache ----

// The cache, and the DLPack tensors its device may still be reading: on CUDA, write_kv returns
// with its copy queued on the cache's stream, so the tensors it imported are held until a fence
// after the copy passes; their producer (e.g. torch's caching allocator, which reuses a freed
// block at once on the block's stream) cannot hand their memory out under the copy.
struct PyCache {
  struct Held {
    uint64_t fence;
    std::vector<std::unique_ptr<DlpackImport>> tensors;
  };
  std::deque<Held> held;  // declared before `cache`: released after it, which waits for its stream
  std::unique_ptr<Cache> cache;

  Cache& operator*() const { return *cache; }
  const Geometry& geometry() const { return cache->options().geometry; }

  // The fence of tensors held after RecordFence failed: they are released once a fence recorded
  // after them passes, or with the cache.
  static constexpr uint64_t kNeverPasses = ~uint64_t{0};

  // Holds `tensors` (null entries: numpy inputs, nothing to hold) until the cache's device work
  // issued so far has completed (Cache::RecordFence), after releasing the tensors held before
  // whose work has. On the CPU backend, whose work is done on return, nothing is held. After a
  // CUDA error (no fence, or none that passes since) they are held until the cache is destroyed.
  // REQUIRES: the GIL (the producers' deleters run under it).
  void HoldUntilDone(std::vector<std::unique_ptr<DlpackImport>> tensors);
  // Releases the held tensors whose fences have passed, and those held without a fence before
  // one that has. REQUIRES: the GIL.
  void ReleaseDone();
};

inline PyCache& Self(const py::object& self) { return self.cast<PyCache&>(); }

}  // namespace kvtier::python

#endif  // KVTIER_ADAPTERS_PYTHON_PY_SUPPORT_H_
