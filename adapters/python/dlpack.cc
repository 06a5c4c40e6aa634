// DLPack export and import for the module `kvtier` (dlpack.h).
#include "adapters/python/dlpack.h"

namespace kvtier::python {
namespace {

DLDataType DlType(ViewDType t) {
  switch (t) {
    case ViewDType::kFloat16: return {2, 16, 1};
    case ViewDType::kBFloat16: return {4, 16, 1};
    case ViewDType::kFloat32: return {2, 32, 1};
    default: return {1, 8, 1};  // FP8 and packed FP4: uint8 plus the view's dtype tag
  }
}

// The exported tensor and what keeps its memory alive (the Python Cache object).
struct ManagerContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape, strides;
  py::object owner;
};

void DeleteManaged(DLManagedTensor* self) {
  py::gil_scoped_acquire gil;
  delete static_cast<ManagerContext*>(self->manager_ctx);
}

void CapsuleDestructor(PyObject* capsule) {
  // Only an unconsumed capsule still owns its tensor; a consumer renames it "used_dltensor".
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
}

}  // namespace

py::capsule PyTensorView::Capsule() const {
  auto* ctx = new ManagerContext;
  ctx->shape = view.shape;
  ctx->strides = view.strides;
  ctx->owner = owner;
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = view.data;
  t.device = {view.device == BackendKind::kCuda ? 2 : 1, view.device_id};
  t.ndim = static_cast<int32_t>(view.shape.size());
  t.dtype = DlType(view.dtype);
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = DeleteManaged;
  PyObject* cap = PyCapsule_New(&ctx->managed, "dltensor", CapsuleDestructor);
  if (cap == nullptr) {
    delete ctx;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

DlpackImport::DlpackImport(const py::object& obj, const Placement& placement,
                           const std::string& what) {
  capsule_ = obj.attr("__dlpack__")();
  managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
  if (managed_ == nullptr) throw py::error_already_set();
  const DLTensor& t = managed_->dl_tensor;
  // kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3, kDLCUDAManaged 13.
  const int32_t d = t.device.device_type;
  const bool cuda = placement.backend == BackendKind::kCuda;
  if (cuda ? (d != 2 && d != 13) : (d != 1 && d != 3)) {
    throw py::value_error(what + (cuda ? " must be in CUDA memory (the CUDA backend's)"
                                       : " must be in host memory (numpy, CPU tensors) here"));
  }
  // CUDA memory (2) is the cache's device's only, CPU memory (1) is device 0 by DLPack's rule;
  // pinned host (3) and managed (13) memory are reachable from every device.
  if ((d == 1 || d == 2) && placement.device_id != Placement::kAnyDevice &&
      t.device.device_id != placement.device_id) {
    throw py::value_error(what + " is on device " + std::to_string(t.device.device_id) +
                          ", the cache on device " + std::to_string(placement.device_id));
  }
  if (t.strides != nullptr) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect) {
        throw py::value_error(what + " via DLPack must be contiguous");
      }
      expect *= t.shape[i];
    }
  }
  // Consumed only once accepted: a refused tensor stays its capsule's, which frees it.
  PyCapsule_SetName(capsule_.ptr(), "used_dltensor");
}

DlpackImport::~DlpackImport() {
  if (managed_->deleter != nullptr) managed_->deleter(managed_);
}

}  // namespace kvtier::python
