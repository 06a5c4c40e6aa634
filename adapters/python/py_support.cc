// Status to Python exceptions for the module `kvtier` (py_support.h).
#include "adapters/python/py_support.h"

#include <string>

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

}  // namespace kvtier::python
