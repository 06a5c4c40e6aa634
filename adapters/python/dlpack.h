// DLPack for the module `kvtier` (the stable v0.8 ABI, unversioned "dltensor" capsules): pool
// views exported without a copy (PyTensorView) and tensors imported without a copy
// (DlpackImport). Private to the module's sources.
#ifndef KVTIER_ADAPTERS_PYTHON_DLPACK_H_
#define KVTIER_ADAPTERS_PYTHON_DLPACK_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/adapters/tensor_view.h"
#include "kvtier/options.h"

namespace kvtier::python {

namespace py = pybind11;

struct DLDevice {
  int32_t device_type;  // kDLCPU = 1, kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// A pool view for Python: `__dlpack__` hands out the pool's memory without copying.
struct PyTensorView {
  TensorView view;
  py::object owner;

  // A "dltensor" capsule of the view that keeps `owner` alive until the consumer drops it.
  py::capsule Capsule() const;
};

inline PyTensorView ViewOf(const TensorView& v, const py::object& owner) {
  return PyTensorView{v, owner};
}

// Where a tensor handed to kvtier must live: the backend's memory (host memory for the CPU
// backend, CUDA memory for the CUDA backend) and, unless kAnyDevice, that DLPack device id (the
// cache's CUDA device; 0 for host memory).
struct Placement {
  static constexpr int32_t kAnyDevice = -1;
  BackendKind backend = BackendKind::kCpu;
  int32_t device_id = kAnyDevice;
};

// A tensor taken from an object's __dlpack__ without a copy: it must be where `placement` says
// and C-contiguous, else ValueError naming `what` (the tensor left to its producer). Holds the
// producer's tensor until destroyed.
class DlpackImport {
 public:
  DlpackImport(const py::object& obj, const Placement& placement, const std::string& what);
  ~DlpackImport();
  DlpackImport(const DlpackImport&) = delete;
  DlpackImport& operator=(const DlpackImport&) = delete;

  const DLDataType& dtype() const { return managed_->dl_tensor.dtype; }
  std::vector<int64_t> shape() const {
    const DLTensor& t = managed_->dl_tensor;
    return std::vector<int64_t>(t.shape, t.shape + t.ndim);
  }
  uint8_t* data() const {
    return static_cast<uint8_t*>(managed_->dl_tensor.data) + managed_->dl_tensor.byte_offset;
  }

 private:
  py::object capsule_;
  DLManagedTensor* managed_ = nullptr;
};

}  // namespace kvtier::python

#endif  // KVTIER_ADAPTERS_PYTHON_DLPACK_H_
