// Status to Python exceptions and the cache's held tensors, for the module `kvtier`
// (py_support.h).
#include "adapters/python/py_support.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvtier::python {

[[noreturn]] void Throw(const absl::Status& s) {
  PyObject* type = PyExc_RuntimeError;
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument: type = PyExc_ValueError; break;
    case absl::StatusCode::kNotFound: type = PyExc_KeyError; break;
    case absl::StatusCode::kResourceExhausted: type = PyExc_MemoryError; break;
    default: break;
  }
  PyErr_SetString(type, std::string(s.message()).c_str());
  throw py::error_already_set();
}

void PyCache::HoldUntilDone(std::vector<std::unique_ptr<DlpackImport>> tensors) {
  ReleaseDone();
  tensors.erase(std::remove(tensors.begin(), tensors.end(), nullptr), tensors.end());
  if (tensors.empty()) return;
  // Without a fence (a CUDA error) the tensors are held until a fence recorded later passes, or
  // the cache is gone: the copy may still be queued.
  const absl::StatusOr<uint64_t> fence = cache->RecordFence();
  if (fence.ok() && cache->FencePassed(*fence).value_or(false)) return;  // CPU: done on return
  held.push_back(Held{fence.ok() ? *fence : kNeverPasses, std::move(tensors)});
}

void PyCache::ReleaseDone() {
  // Fences pass in order: once one has, so has the work of everything held before it, those
  // held without a fence included (they once held everything after them for good).
  size_t passed = 0;
  for (size_t i = 0; i < held.size(); ++i) {
    if (held[i].fence == kNeverPasses) continue;
    if (!cache->FencePassed(held[i].fence).value_or(false)) break;
    passed = i + 1;
  }
  // Destroyed after the erase: a producer's deleter may run Python code that calls the cache.
  std::vector<Held> done(std::make_move_iterator(held.begin()),
                         std::make_move_iterator(held.begin() + static_cast<ptrdiff_t>(passed)));
  held.erase(held.begin(), held.begin() + static_cast<ptrdiff_t>(passed));
}

}  // namespace kvtier::python
