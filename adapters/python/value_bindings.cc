// SequenceId, BlockId, PageTables, PreparedDecode and TensorView for the module `kvtier`.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "adapters/python/bindings.h"
#include "adapters/python/dlpack.h"
#include "kvtier/adapters/tensor_view.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/ids.h"
#include "kvtier/page_tables.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

// SequenceId or BlockId: an index and a generation; equal ids hash equally; printed as
// Name(index/generation).
template <typename Id>
void BindId(py::module_& m, const std::string& name) {
  py::class_<Id>(m, name.c_str())
      .def_readonly("index", &Id::index)
      .def_readonly("generation", &Id::generation)
      .def("__eq__",  // False, not TypeError, against another type (None, an int)
           [](Id a, const py::object& b) { return py::isinstance<Id>(b) && a == b.cast<Id>(); })
      .def("__hash__", [](Id a) { return (uint64_t{a.generation} << 32) | a.index; })
      .def("__repr__", [name](Id a) {
        return name + "(" + std::to_string(a.index) + "/" + std::to_string(a.generation) + ")";
      });
}

// Cache.add_sequence's result: unpacks as (id, cached_tokens); host_tokens, remote_tokens and
// ready_fence say what a prefix hit brought back from the host and remote tiers (docs/tiers.md).
void BindAddResult(py::module_& m) {
  auto pair = [](const AddResult& r) { return py::make_tuple(r.id, r.cached_tokens); };
  py::class_<AddResult>(m, "AddResult")
      .def_readonly("id", &AddResult::id)
      .def_readonly("cached_tokens", &AddResult::cached_tokens)
      .def_readonly("host_tokens", &AddResult::host_tokens)
      .def_readonly("remote_tokens", &AddResult::remote_tokens)
      .def_readonly("ready_fence", &AddResult::ready_fence)
      .def("__len__", [](const AddResult&) { return 2; })
      .def("__iter__", [pair](const AddResult& r) { return py::iter(pair(r)); })
      .def("__getitem__",
           [pair](const AddResult& r, int i) -> py::object {
             const py::tuple t = pair(r);
             return t[py::int_(i)];  // negative indices and IndexError as a tuple's
           })
      .def("__repr__", [](const AddResult& r) {
        return "AddResult(id=" + std::to_string(r.id.index) + "/" +
               std::to_string(r.id.generation) + ", cached_tokens=" +
               std::to_string(r.cached_tokens) + ", host_tokens=" +
               std::to_string(r.host_tokens) + ", remote_tokens=" +
               std::to_string(r.remote_tokens) + ", ready_fence=" + std::to_string(r.ready_fence) +
               ")";
      });
}

void BindTables(py::module_& m) {
  py::class_<PageTables>(m, "PageTables",
                         "One step's page tables (Cache.build_page_tables). Arrays are copies.")
      .def_property_readonly("batch_size",
                             [](const PageTables& t) { return t.seq_lens.size(); })
      .def_property_readonly("seq_lens", [](const PageTables& t) { return ToNumpy(t.seq_lens); })
      .def_property_readonly("packed_indptr",
                             [](const PageTables& t) { return ToNumpy(t.packed_indptr); })
      .def_property_readonly("packed", [](const PageTables& t) { return ToNumpy(t.packed); })
      .def_property_readonly("per_format", [](const PageTables& t) {
        py::list out;
        for (const FormatPageTable& f : t.per_format) {
          out.append(py::dict("indptr"_a = ToNumpy(f.indptr), "indices"_a = ToNumpy(f.indices),
                              "last_page_len"_a = ToNumpy(f.last_page_len)));
        }
        return out;
      });

  py::class_<PreparedDecode>(m, "PreparedDecode",
                             "A decode step's page tables, checked and (on CUDA) on the device: "
                             "Cache.prepare_decode")
      .def_property_readonly("batch", &PreparedDecode::batch);

}

void BindTensorView(py::module_& m) {
  py::class_<PyTensorView>(m, "TensorView",
                           "A pool view without a copy. numpy.from_dlpack / torch.from_dlpack "
                           "read it; FP8 and FP4 arrive as uint8 (see `dtype`). It spans the "
                           "pool's whole reserved range, of which only slabs holding pages are "
                           "mapped: read it only at the pages a step's tables name (a kernel, "
                           "kv[indices]); printing, summing or copying it whole faults "
                           "(SIGSEGV on the CPU backend). read_kv gives a sequence's K/V.")
      .def_property_readonly("dtype",
                             [](const PyTensorView& v) { return ViewDTypeName(v.view.dtype); })
      .def_property_readonly("shape",
                             [](const PyTensorView& v) {
                               return py::tuple(py::cast(v.view.shape));
                             })
      .def_property_readonly("strides",
                             [](const PyTensorView& v) {
                               return py::tuple(py::cast(v.view.strides));
                             })
      .def_property_readonly("data_ptr",
                             [](const PyTensorView& v) {
                               return reinterpret_cast<uintptr_t>(v.view.data);
                             })
      .def_property_readonly("device", [](const PyTensorView& v) {
        return v.view.device == BackendKind::kCuda ? "cuda:" + std::to_string(v.view.device_id)
                                                    : std::string("cpu");
      })
      .def("__dlpack__", [](const PyTensorView& v, py::args, py::kwargs) { return v.Capsule(); })
      .def("__dlpack_device__", [](const PyTensorView& v) {
        return py::make_tuple(v.view.device == BackendKind::kCuda ? 2 : 1, v.view.device_id);
      })
      .def("__repr__", [](const PyTensorView& v) {
        std::string s =
            "TensorView(dtype=" + std::string(ViewDTypeName(v.view.dtype)) + ", shape=(";
        for (int64_t x : v.view.shape) s += std::to_string(x) + ",";
        return s + "))";
      });
}

}  // namespace

void BindValueTypes(py::module_& m) {
  BindId<SequenceId>(m, "SequenceId");
  BindId<BlockId>(m, "BlockId");
  BindAddResult(m);
  BindTables(m);
  BindTensorView(m);
}

}  // namespace kvtier::python
