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
  const uint64_t fence = Value(cache->RecordFence());
  if (Value(cache->FencePassed(fence))) return;  // the CPU backend's work is done on return
  held.push_back(Held{fence, std::move(tensors)});
}

void PyCache::ReleaseDone() {
  while (!held.empty() && cache->FencePassed(held.front().fence).value_or(true)) {
    held.pop_front();
  }
}

}  // namespace kvtier::python
