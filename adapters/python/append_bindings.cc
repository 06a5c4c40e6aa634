// The prepared append of a decode step to every layer at once (kvtier/prepared_append.h) for the
// module `kvtier`: Cache.prepare_append, PreparedAppend and Cache.write_kv_layers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "adapters/python/bindings.h"
#include "adapters/python/py_support.h"
#include "adapters/python/tensor_args.h"
#include "kvtier/cache.h"
#include "kvtier/prepared_append.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

bool IsList(const py::object& obj) {
  return py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj);
}

// Cache.write_kv_layers: K and V as WriteKVLayers' per-layer inputs, from lists of one tensor per
// layer or from stacked tensors; every other check is WriteKVLayers' own.
void WriteKVLayersCall(PyCache& c, const PreparedAppend& step, const py::object& k,
                       const py::object& v, uintptr_t stream, bool synchronize) {
  const Placement at = PlacementOf(*c);
  const Geometry& g = c.geometry();
  if (IsList(k) != IsList(v) || (IsList(k) && py::len(k) != py::len(v))) {
    throw py::value_error("k_layers and v_layers must be lists of the same length or both "
                          "stacked tensors");
  }
  std::vector<KVSource> ks, vs;  // the tensors, held through the call
  std::vector<KVInput> layers;
  if (IsList(k)) {
    ks.reserve(py::len(k));
    vs.reserve(py::len(v));
    for (size_t l = 0; l < py::len(k); ++l) {
      ks.emplace_back(py::object(k[py::int_(l)]), at);
      vs.emplace_back(py::object(v[py::int_(l)]), at);
      layers.push_back(MakeInput(ks.back(), vs.back(), g));
    }
  } else {
    ks.emplace_back(k, at);
    vs.emplace_back(v, at);
    layers = StackedInputs(ks[0], vs[0], g);
  }
  const DeviceLaunch launch{reinterpret_cast<void*>(stream), synchronize};
  Check(WriteKVLayers(*c.cache, step, layers, launch));
}

}  // namespace

void BindAppend(CacheClass& cache, py::module_& m) {
  py::class_<PreparedAppend>(
      m, "PreparedAppend",
      "A decode step's slots, checked once and (on CUDA) held in device buffers of fixed "
      "address, for Cache.write_kv_layers: Cache.prepare_append")
      .def("update",
           [](PreparedAppend& s, const py::object& slots) {
             Check(s.Update(FromArray<int64_t>(slots)));
           },
           "slots"_a,
           "Makes the step the one of `slots` (as append_batch returns them; at most max_rows), "
           "checked as write_kv checks them (ValueError naming the first bad slot, RuntimeError for "
           "a slot in a block another sequence shares; the step unchanged). On CUDA, copies them into the step's device buffers on its stream, after "
           "the cache's own work issued so far, so that a captured CUDA graph replays over the "
           "new slots.")
      .def("after_graph_launch", [](PreparedAppend& s) { Check(s.AfterGraphLaunch()); },
           "Orders the cache's later device work after a CUDA graph that captured "
           "write_kv_layers on the step's stream: call it after each graph launch, before the "
           "cache's next append or end_step. Nothing to do on the CPU backend.")
      .def_property_readonly("rows", &PreparedAppend::rows, "Slots of the last update (0 before).")
      .def_property_readonly("max_rows", &PreparedAppend::max_rows);

  cache
      .def("prepare_append",
           [](PyCache& c, int64_t max_rows, uintptr_t stream) {
             const DeviceLaunch launch{reinterpret_cast<void*>(stream), false};
             return Value(PreparedAppend::Create(*c.cache, max_rows, launch));
           },
           "max_rows"_a, "stream"_a = 0, py::keep_alive<0, 1>(),
           "A PreparedAppend with room for `max_rows` slots (tokens appended per step), made "
           "once and updated every step with the step's slots (PreparedAppend.update). On the "
           "CUDA backend it allocates its device buffers on `stream` (a raw cudaStream_t, e.g. "
           "torch.cuda.current_stream().cuda_stream; 0 for the default stream), the stream of "
           "every update and write_kv_layers over it; it is freed there too. Valid while the "
           "step's slots are: release, demote of their blocks or fork make it stale, which "
           "write_kv_layers does not detect on CUDA.")
      .def("write_kv_layers", &WriteKVLayersCall,
           "step"_a, "k_layers"_a, "v_layers"_a, "stream"_a = 0, "synchronize"_a = true,
           "Writes every layer's K/V of the step's new tokens into its slots in one call: on the "
           "CUDA backend one kernel launch for all layers (two with rotated keys) on `stream`, "
           "which must be the step's, instead of a write_kv per layer; the same bytes as "
           "write_kv(l, slots, k_layers[l], v_layers[l]) for every layer l. k_layers and "
           "v_layers are each either a list of num_layers tensors [step.rows, num_kv_heads, "
           "head_dim] (what an engine that projects K/V layer by layer holds: each layer's "
           "tensor is read where it lies, no stacking copy) or one C-contiguous tensor "
           "[num_layers, step.rows, num_kv_heads, head_dim] (a static buffer that a captured "
           "CUDA graph writes and replays); both map onto the C++ call's per-layer inputs "
           "without a copy. Tensors as write_kv takes them: numpy (float16; other dtypes are "
           "converted, a copy; CPU backend) or float16/bfloat16 with __dlpack__ on the "
           "cache's device, every layer of one dtype. ValueError, with nothing written, for a "
           "step of another cache, another number of layers, a tensor of another shape (rows "
           "other than step.rows) or dtype. With synchronize (default), waits for the write.");
}

}  // namespace kvtier::python
