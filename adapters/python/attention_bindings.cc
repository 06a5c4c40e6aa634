// kvtier's decode attention (the fused CUDA kernel or the CPU reference), the merges of partial
// attention states and the LSE base conversions, for the module `kvtier`.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "adapters/python/bindings.h"
#include "adapters/python/py_support.h"
#include "adapters/python/tensor_args.h"
#include "kvtier/adapters/partial_states.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/merge_states.h"
#include "kvtier/page_tables.h"
#include "src/attention/attention_contract.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

// A copy of `a` with `convert` (an LSE base conversion) applied in place.
using FloatArrayIn = py::array_t<float, py::array::c_style | py::array::forcecast>;
py::array_t<float> ConvertedLse(const FloatArrayIn& a, void (*convert)(absl::Span<float>)) {
  py::array_t<float> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  std::memcpy(out.mutable_data(), a.data(), a.size() * sizeof(float));
  convert(absl::MakeSpan(out.mutable_data(), out.size()));
  return out;
}

// `batch` as page tables: a PageTables as is, or a list of SequenceId built into `built`.
const PageTables& TablesOf(const PyCache& c, const py::object& batch, PageTables* built) {
  if (py::isinstance<PageTables>(batch)) return batch.cast<const PageTables&>();
  std::vector<SequenceId> seqs;
  try {
    seqs = batch.cast<std::vector<SequenceId>>();
  } catch (const py::cast_error&) {
    throw py::type_error("batch must be a PreparedDecode, PageTables or a list of SequenceId");
  }
  Check((*c).BuildPageTables(seqs, built));
  return *built;
}

// Decode attention with the CPU reference: q [batch, num_q_heads, head_dim] float32.
py::tuple Attend(const Cache& cache, int32_t layer, const PageTables& tables, const py::object& q,
                 std::optional<float> softmax_scale) {
  const Geometry& g = cache.options().geometry;
  if (cache.options().backend != BackendKind::kCpu) {
    Check(absl::FailedPreconditionError("the CPU reference attention needs the CPU backend"));
  }
  py::array_t<float, py::array::c_style | py::array::forcecast> qa =
      py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(q);
  if (!qa || qa.ndim() != 3 || qa.shape(2) != g.head_dim) {
    throw py::value_error("q must be [batch, num_q_heads, head_dim] float32");
  }
  const int64_t batch = qa.shape(0);
  const int32_t heads = static_cast<int32_t>(qa.shape(1));
  py::array_t<float> out({batch, static_cast<int64_t>(heads), static_cast<int64_t>(g.head_dim)});
  py::array_t<float> lse({batch, static_cast<int64_t>(heads)});
  const float scale = softmax_scale.value_or(1.f / std::sqrt(static_cast<float>(g.head_dim)));
  // The CPU backend's DecodeAttention: the reference, refusing stale tables (their slabs may be
  // unmapped).
  Check(DecodeAttention(
      cache, layer, tables,
      DecodeQueries{absl::MakeConstSpan(qa.data(), qa.size()), heads, scale},
      DecodeOutputs{absl::MakeSpan(out.mutable_data(), out.size()),
                    absl::MakeSpan(lse.mutable_data(), lse.size()), {}, 0, {}}));
  return py::make_tuple(out, lse);
}

FormatPart FindPart(const Cache& cache, const PageTables& tables, int32_t format) {
  for (FormatPart& p : Value(PartitionByFormat(cache.options(), tables))) {
    if (p.format == format) return std::move(p);
  }
  FormatPart empty;
  empty.format = format;
  empty.indptr = {0};
  return empty;
}

// Cache.decode_attention: kvtier's kernel (CUDA) or the CPU reference over `batch`.
void DecodeAttentionCall(const PyCache& c, int32_t layer, const py::object& batch,
                         const py::object& q, const py::object& out, const py::object& lse,
                         std::optional<float> softmax_scale, uintptr_t stream, bool synchronize) {
  const Geometry& g = c.geometry();
  const Placement at = PlacementOf(*c.cache);
  const bool prepared = py::isinstance<PreparedDecode>(batch);
  PageTables built;
  const PageTables* tables = prepared ? nullptr : &TablesOf(c, batch, &built);
  const int64_t rows = prepared ? batch.cast<const PreparedDecode&>().batch()
                                : static_cast<int64_t>(tables->seq_lens.size());
  const py::tuple qshape = q.attr("shape");
  if (qshape.size() != 3) throw py::value_error("q must be [batch, num_q_heads, head_dim]");
  const int64_t heads = qshape[1].cast<int64_t>();
  const FloatTensor qt(q, at, {rows, heads, g.head_dim}, "q");
  const FloatTensor ot(out, at, {rows, heads, g.head_dim}, "out");
  const FloatTensor lt(lse, at, {rows, heads}, "lse");
  const float scale = softmax_scale.value_or(1.f / std::sqrt(static_cast<float>(g.head_dim)));
  const DecodeQueries queries{qt.span(), static_cast<int32_t>(heads), scale};
  const DecodeOutputs outputs{ot.span(), lt.span(), {}, 0, {}};
  const DeviceLaunch launch{reinterpret_cast<void*>(stream), synchronize};
  if (prepared) {
    Check(DecodeAttention(*c.cache, layer, batch.cast<const PreparedDecode&>(), queries,
                          outputs, launch));
  } else {
    Check(DecodeAttention(*c.cache, layer, *tables, queries, outputs, launch));
  }
}

// merge_states: two partial states merged on the CPU (numpy) or the GPU (CUDA tensors).
void MergeStatesCall(const py::object& out_a, const py::object& lse_a, const py::object& out_b,
                     const py::object& lse_b, const py::object& out, const py::object& lse,
                     uintptr_t stream, bool synchronize) {
  const bool dlpack = !py::isinstance<py::array>(out_a) && py::hasattr(out_a, "__dlpack_device__");
  const py::tuple device = dlpack ? out_a.attr("__dlpack_device__")().cast<py::tuple>()
                                  : py::make_tuple(1, 0);  // (kDLCPU, 0)
  const bool cuda = device[0].cast<int>() != 1;
  const BackendKind backend = cuda ? BackendKind::kCuda : BackendKind::kCpu;
  const py::tuple shape = out_a.attr("shape");
  if (shape.size() < 1) throw py::value_error("out_a must be [..., head_dim]");
  std::vector<int64_t> vs, ss;
  for (const py::handle& x : shape) vs.push_back(x.cast<int64_t>());
  ss.assign(vs.begin(), vs.end() - 1);
  int64_t rows = 1;
  for (int64_t x : ss) rows *= x;
  // Every tensor on out_a's device (a tensor elsewhere was read there: an illegal address).
  const Placement at{backend, cuda ? device[1].cast<int32_t>() : Placement::kAnyDevice};
  const FloatTensor a(out_a, at, vs, "out_a"), b(out_b, at, vs, "out_b");
  const FloatTensor sa(lse_a, at, ss, "lse_a"), sb(lse_b, at, ss, "lse_b");
  const FloatTensor o(out, at, vs, "out"), s(lse, at, ss, "lse");
  Check(MergeStatesOn(backend, a.span(), sa.span(), b.span(), sb.span(), rows,
                      static_cast<int32_t>(vs.back()), o.span(), s.span(),
                      DeviceLaunch{reinterpret_cast<void*>(stream), synchronize}));
}

// merge_partial_states: per-format (batch_index, out, lse[, base]) states merged on the CPU.
py::tuple MergePartialStatesCall(int64_t batch, const py::list& parts) {
  using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
  std::vector<std::vector<int32_t>> idx;
  std::vector<FloatArray> outs, lses;
  std::vector<PartialState> states;
  int32_t heads = 0, dim = 0;
  for (const py::handle& h : parts) {
    if (!py::isinstance<py::tuple>(h)) {
      throw py::type_error("each part is a tuple (batch_index, out, lse[, 'natural' | 'base2'])");
    }
    const py::tuple t = h.cast<py::tuple>();
    if (t.size() != 3 && t.size() != 4) {
      throw py::value_error("each part is (batch_index, out, lse[, 'natural' | 'base2'])");
    }
    idx.push_back(FromArray<int32_t>(t[0]));  // integers only: a float is refused, not truncated
    outs.push_back(FloatArray::ensure(t[1]));
    lses.push_back(FloatArray::ensure(t[2]));
    if (!outs.back() || !lses.back()) {
      throw py::type_error("a part's out and lse must be arrays of numbers");
    }
    if (t.size() == 4 && !py::isinstance<py::str>(t[3])) {
      throw py::type_error("a part's LSE base must be the string 'natural' or 'base2'");
    }
    const std::string base = t.size() == 4 ? t[3].cast<std::string>() : "natural";
    if (base != "natural" && base != "base2") {
      throw py::value_error("LSE base must be 'natural' or 'base2'");
    }
    const FloatArray& o = outs.back();
    if (o.ndim() != 3) throw py::value_error("out must be [rows, num_q_heads, head_dim]");
    heads = static_cast<int32_t>(o.shape(1));
    dim = static_cast<int32_t>(o.shape(2));
    states.push_back(PartialState{
        absl::MakeConstSpan(idx.back().data(), idx.back().size()),
        absl::MakeConstSpan(o.data(), o.size()),
        absl::MakeConstSpan(lses.back().data(), lses.back().size()),
        base == "base2" ? LseBase::kBase2 : LseBase::kNatural});
  }
  if (states.empty()) throw py::value_error("no parts to merge");
  // The outputs are sized by the caller's batch: bounded before they are allocated.
  constexpr int64_t kMostRows = int64_t{1} << 24;
  if (batch < 0 || batch > kMostRows) {
    throw py::value_error("batch " + std::to_string(batch) + " is outside [0, 2^24]");
  }
  py::array_t<float> out({batch, int64_t{heads}, int64_t{dim}});
  py::array_t<float> lse({batch, int64_t{heads}});
  Check(MergePartialStates(states, batch, heads, dim,
                           absl::MakeSpan(out.mutable_data(), out.size()),
                           absl::MakeSpan(lse.mutable_data(), lse.size())));
  return py::make_tuple(out, lse);
}

void BindDecode(CacheClass& cache) {
  cache
      .def("prepare_decode",
           [](const PyCache& c, const py::object& batch, uintptr_t stream) {
             PageTables built;
             const PageTables& tables = TablesOf(c, batch, &built);
             const DeviceLaunch launch{reinterpret_cast<void*>(stream), false};
             return Value(PreparedDecode::Create(*c.cache, tables, launch));
           },
           "batch"_a, "stream"_a = 0, py::keep_alive<0, 1>(),
           "This decode step's page tables made ready once for every layer's decode_attention: "
           "checked and, on the CUDA backend, copied to the device on `stream` (a raw "
           "cudaStream_t, e.g. torch.cuda.current_stream().cuda_stream; 0 for the default "
           "stream). `batch` is a PageTables or a list of SequenceId. Valid until the cache "
           "changes (append, demote, end_step). Run the step's decode_attention calls on the "
           "same stream (or order their streams after it), and drop the step only after them: "
           "its device copy is freed on `stream`.")
      .def("decode_attention", &DecodeAttentionCall,
           "layer"_a, "batch"_a, "q"_a, "out"_a, "lse"_a, "softmax_scale"_a = py::none(),
           "stream"_a = 0, "synchronize"_a = true,
           "Decode attention for `batch` (a PreparedDecode from prepare_decode, PageTables from "
           "build_page_tables, or a list of SequenceId) with kvtier's own kernel: the fused "
           "mixed-format kernel on the CUDA backend (q, out, lse: float32 CUDA tensors via "
           "__dlpack__, e.g. torch), the CPU reference on the CPU backend (numpy float32 arrays). "
           "q and out are [batch, num_q_heads, head_dim], lse [batch, num_q_heads] in natural "
           "log; out and lse are written in place. Runs on `stream` (a raw cudaStream_t; 0 for "
           "the default stream) and, with synchronize (default), waits for the result. An engine "
           "prepares each step once and calls this per layer with the PreparedDecode.");
}

void BindReference(CacheClass& cache) {
  cache
      .def("reference_attention",
           [](const PyCache& c, int32_t layer, const PageTables& t, const py::object& q,
              std::optional<float> softmax_scale) {
             return Attend(*c, layer, t, q, softmax_scale);
           },
           "layer"_a, "tables"_a, "q"_a, "softmax_scale"_a = py::none(),
           "Decode attention over the batch of `tables`: (out [B, Hq, D], natural-log lse "
           "[B, Hq]).")
      .def("reference_attention_part",
           [](const PyCache& c, int32_t layer, const PageTables& t, int32_t format,
              const py::object& q, std::optional<float> softmax_scale) {
             const FormatPart part = FindPart(*c, t, format);
             const py::tuple r = Attend(*c, layer, PartAsPageTables(part), q, softmax_scale);
             return py::make_tuple(r[0], r[1], ToNumpy(part.batch_index));
           },
           "layer"_a, "tables"_a, "format"_a, "q"_a, "softmax_scale"_a = py::none(),
           "The reference over format `format`'s part only, standing in for one external call: "
           "q is [rows, Hq, D] for the part's rows; returns (out, lse, batch_index).");
}

}  // namespace

void BindAttention(CacheClass& cache, py::module_& m) {
  BindDecode(cache);
  BindReference(cache);
  m.def("merge_states", &MergeStatesCall,
        "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a, "stream"_a = 0,
        "synchronize"_a = true,
        "Merges two partial attention states exactly by natural-log LSE into out/lse (in place; "
        "may alias a or b): outputs [..., head_dim], LSEs [...], all float32; numpy arrays merge "
        "on the CPU, CUDA tensors (via __dlpack__, all on out_a's device, which must be the "
        "current one) with kvtier's merge kernel on `stream` (a raw cudaStream_t; 0 for the "
        "default stream), waiting for it with synchronize (default).");
  m.def("natural_to_base2_lse",
        [](const FloatArrayIn& a) { return ConvertedLse(a, NaturalToBase2Lse); }, "lse"_a);
  m.def("base2_to_natural_lse",
        [](const FloatArrayIn& a) { return ConvertedLse(a, Base2ToNaturalLse); }, "lse"_a);
  m.def("merge_partial_states", &MergePartialStatesCall,
        "batch"_a, "parts"_a,
        "Merges per-format (batch_index, out, lse[, base]) states exactly: (out, natural lse).");
}

}  // namespace kvtier::python
