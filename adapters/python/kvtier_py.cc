// The Python module `kvtier` (pybind11): a cache, its sequences and data, page tables, the
// adapters' tables as numpy arrays, pool views as DLPack tensors (no copy), stats, and the CPU
// reference attention. Errors become exceptions carrying the Status message: ValueError
// (InvalidArgument), KeyError (NotFound), MemoryError (ResourceExhausted), RuntimeError
// (anything else). See docs/adapters.md.
//
// Thread-safety: the Cache itself is thread-safe; the module holds the GIL throughout.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/adapters/block_tables.h"
#include "kvtier/adapters/flashinfer.h"
#include "kvtier/adapters/flex_attention.h"
#include "kvtier/adapters/partial_states.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/adapters/target.h"
#include "kvtier/adapters/tensor_view.h"
#include "kvtier/adapters/tensorrt_llm.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/merge_states.h"
#include "kvtier/policy.h"
#include "src/attention/attention_contract.h"
#include "src/attention/reference_attention.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace kvtier {
namespace {

// ---- Errors ----

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

void Check(const absl::Status& s) {
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

// ---- DLPack (the stable v0.8 ABI, unversioned "dltensor" capsules) ----

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

// A pool view for Python: `__dlpack__` hands out the pool's memory without copying.
struct PyTensorView {
  TensorView view;
  py::object owner;

  py::capsule Capsule() const {
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
};

// A tensor taken from an object's __dlpack__ without a copy: it must be in the memory of
// `backend` (host memory for the CPU backend, CUDA memory for the CUDA backend) and C-contiguous,
// else ValueError naming `what`. Holds the producer's tensor until destroyed.
class DlpackImport {
 public:
  DlpackImport(const py::object& obj, BackendKind backend, const std::string& what) {
    capsule_ = obj.attr("__dlpack__")();
    managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule_.ptr(), "dltensor"));
    if (managed_ == nullptr) throw py::error_already_set();
    PyCapsule_SetName(capsule_.ptr(), "used_dltensor");
    const DLTensor& t = managed_->dl_tensor;
    // kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3, kDLCUDAManaged 13.
    const int32_t d = t.device.device_type;
    if (backend == BackendKind::kCuda ? (d != 2 && d != 13) : (d != 1 && d != 3)) {
      throw py::value_error(what + (backend == BackendKind::kCuda
                                        ? " must be in CUDA memory for the CUDA backend"
                                        : " must be in host memory for the CPU backend"));
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
  }
  ~DlpackImport() {
    if (managed_->deleter != nullptr) managed_->deleter(managed_);
  }
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

// K or V input from a numpy array (float16; other dtypes are converted, a copy) or any object
// with __dlpack__ (float16 or bfloat16, contiguous, on the cache's device: host memory for the
// CPU backend, CUDA memory for the CUDA backend, whose kernels read the pointer directly).
class KVSource {
 public:
  KVSource(const py::object& obj, BackendKind backend) {
    if (!py::isinstance<py::array>(obj) && py::hasattr(obj, "__dlpack__")) {
      dlpack_ = std::make_unique<DlpackImport>(obj, backend, "K/V");
      const DLDataType& t = dlpack_->dtype();
      if (t.bits != 16 || t.lanes != 1 || (t.code != 2 && t.code != 4)) {
        throw py::value_error("K/V via DLPack must be float16 or bfloat16");
      }
      dtype_ = t.code == 2 ? DType::kFloat16 : DType::kBFloat16;
      shape_ = dlpack_->shape();
      data_ = dlpack_->data();
      return;
    }
    if (backend == BackendKind::kCuda) {
      throw py::value_error("the CUDA backend takes K/V in CUDA memory (e.g. a torch CUDA tensor)");
    }
    py::module_ np = py::module_::import("numpy");
    const py::array a = np.attr("ascontiguousarray")(obj, "dtype"_a = "float16");
    shape_.assign(a.shape(), a.shape() + a.ndim());
    data_ = a.data();
    array_ = a;
  }

  const void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  py::object array_;  // keeps the converted array alive
  std::unique_ptr<DlpackImport> dlpack_;
  const void* data_ = nullptr;
  DType dtype_ = DType::kFloat16;
  std::vector<int64_t> shape_;
};

KVInput MakeInput(const KVSource& k, const KVSource& v, const Geometry& g) {
  const std::vector<int64_t>& s = k.shape();
  if (s.size() != 3 || s != v.shape() || s[1] != g.num_kv_heads || s[2] != g.head_dim ||
      k.dtype() != v.dtype()) {
    throw py::value_error("K and V must have the same dtype and shape [tokens, num_kv_heads (" +
                          std::to_string(g.num_kv_heads) + "), head_dim (" +
                          std::to_string(g.head_dim) + ")]");
  }
  return KVInput{k.dtype(), k.data(), v.data(), s[0], g.num_kv_heads, g.head_dim};
}

// A float32 tensor handed to a kernel in place: a numpy array (host memory, CPU backend) or any
// object with __dlpack__ (host or CUDA memory, matching `backend`). Must be C-contiguous float32
// of `shape`; nothing is converted or copied, so outputs are written where the caller sees them.
class FloatTensor {
 public:
  FloatTensor(const py::object& obj, BackendKind backend, const std::vector<int64_t>& shape,
              const std::string& name) {
    std::vector<int64_t> got;
    if (py::isinstance<py::array>(obj)) {
      const py::array a = obj.cast<py::array>();
      if (backend == BackendKind::kCuda) {
        throw py::value_error(name + " must be in CUDA memory for the CUDA backend");
      }
      if (!a.dtype().is(py::dtype::of<float>()) ||
          !(a.flags() & py::array::c_style) || !a.writeable()) {
        throw py::value_error(name + " must be a writable C-contiguous float32 array");
      }
      got.assign(a.shape(), a.shape() + a.ndim());
      data_ = static_cast<float*>(const_cast<void*>(a.data()));
      keep_ = obj;
    } else if (py::hasattr(obj, "__dlpack__")) {
      dlpack_ = std::make_unique<DlpackImport>(obj, backend, name);
      const DLDataType& t = dlpack_->dtype();
      if (t.code != 2 || t.bits != 32 || t.lanes != 1) {
        throw py::value_error(name + " must be float32");
      }
      got = dlpack_->shape();
      data_ = reinterpret_cast<float*>(dlpack_->data());
    } else {
      throw py::type_error(name + " must be a numpy array or support __dlpack__");
    }
    if (got != shape) {
      std::string want;
      for (int64_t x : shape) want += (want.empty() ? "" : ", ") + std::to_string(x);
      throw py::value_error(name + " must have shape [" + want + "]");
    }
    size_ = 1;
    for (int64_t x : shape) size_ *= static_cast<size_t>(x);
  }

  absl::Span<float> span() const { return absl::MakeSpan(data_, size_); }

 private:
  py::object keep_;
  std::unique_ptr<DlpackImport> dlpack_;
  float* data_ = nullptr;
  size_t size_ = 0;
};

// A copy of `a` with `convert` (an LSE base conversion) applied in place.
using FloatArrayIn = py::array_t<float, py::array::c_style | py::array::forcecast>;
py::array_t<float> ConvertedLse(const FloatArrayIn& a, void (*convert)(absl::Span<float>)) {
  py::array_t<float> out(std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim()));
  std::memcpy(out.mutable_data(), a.data(), a.size() * sizeof(float));
  convert(absl::MakeSpan(out.mutable_data(), out.size()));
  return out;
}

// ---- The cache ----

struct PyCache {
  std::unique_ptr<Cache> cache;
  Cache& operator*() const { return *cache; }
  const Geometry& geometry() const { return cache->options().geometry; }
};

std::string PartFormatName(const Cache& c, int32_t f) { return FormatName(c.options().palette[f]); }

py::dict PartDict(const Cache& c, int32_t format, const std::vector<int32_t>& batch_index) {
  py::dict d;
  d["format"] = format;
  d["format_name"] = PartFormatName(c, format);
  d["batch_index"] = ToNumpy(batch_index);
  return d;
}

py::dict HistogramDict(const HistogramStats& h) {
  return py::dict("bounds"_a = h.bounds, "counts"_a = h.counts, "sum"_a = h.sum,
                  "count"_a = h.count);
}

py::dict StatsDict(const CacheStats& s) {
  py::list formats;
  for (const FormatStats& f : s.formats) {
    formats.append(py::dict("name"_a = f.name, "page_bytes"_a = f.page_bytes,
                            "slabs_mapped"_a = f.slabs_mapped, "pages_mapped"_a = f.pages_mapped,
                            "pages_used"_a = f.pages_used, "blocks_in_use"_a = f.blocks_in_use,
                            "blocks_cached"_a = f.blocks_cached, "bytes"_a = f.bytes,
                            "bits_per_element"_a = f.bits_per_element));
  }
  py::list migrations;
  for (const MigrationStats& m : s.migrations) {
    migrations.append(
        py::dict("from"_a = m.from, "to"_a = m.to, "blocks"_a = m.blocks, "bytes"_a = m.bytes));
  }
  py::dict d;
  d["budget_bytes"] = s.budget_bytes;
  d["slab_bytes"] = s.slab_bytes;
  d["slabs_total"] = s.slabs_total;
  d["slabs_free"] = s.slabs_free;
  d["used_bytes"] = s.used_bytes;
  d["cached_bytes"] = s.cached_bytes;
  d["usage_ratio"] = s.usage_ratio;
  d["effective_bits_per_element"] = s.effective_bits_per_element;
  d["sequences"] = s.sequences;
  d["tokens"] = s.tokens;
  d["pages_pending_reclaim"] = s.pages_pending_reclaim;
  d["steps"] = s.steps;
  d["formats"] = formats;
  d["allocation_failures"] = s.allocation_failures;
  d["copy_on_write_blocks"] = s.copy_on_write_blocks;
  d["slab_moves"] = s.slab_moves;
  d["nonfinite_values"] = s.nonfinite_values;
  d["prefix_queried_tokens"] = s.prefix_queried_tokens;
  d["prefix_hit_tokens"] = s.prefix_hit_tokens;
  d["prefix_hit_blocks"] = s.prefix_hit_blocks;
  d["prefix_missed_blocks"] = s.prefix_missed_blocks;
  d["evicted_blocks"] = s.evicted_blocks;
  d["evictable_blocks"] = s.evictable_blocks;
  d["indexed_blocks"] = s.indexed_blocks;
  d["policy"] = s.policy;
  d["under_pressure"] = s.under_pressure;
  d["demotions_under_pressure"] = s.demotions_under_pressure;
  d["policy_demotion_failures"] = s.policy_demotion_failures;
  d["migration_seconds"] = HistogramDict(s.migration_seconds);
  d["block_lifetime_seconds"] = HistogramDict(s.block_lifetime_seconds);
  d["block_idle_before_evict_seconds"] = HistogramDict(s.block_idle_before_evict_seconds);
  d["migrations"] = migrations;
  return d;
}

PyTensorView ViewOf(const TensorView& v, const py::object& owner) { return PyTensorView{v, owner}; }

PyCache& Self(const py::object& self) { return self.cast<PyCache&>(); }

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
  const PagedLayer kv = Value(GetPagedLayer(cache, layer));
  py::array_t<float> out({batch, static_cast<int64_t>(heads), static_cast<int64_t>(g.head_dim)});
  py::array_t<float> lse({batch, static_cast<int64_t>(heads)});
  const float scale = softmax_scale.value_or(1.f / std::sqrt(static_cast<float>(g.head_dim)));
  Check(PagedDecodeAttention(
      kv, tables,
      DecodeQueries{absl::MakeConstSpan(qa.data(), qa.size()), heads, scale},
      DecodeOutputs{absl::MakeSpan(out.mutable_data(), out.size()),
                    absl::MakeSpan(lse.mutable_data(), lse.size()), {}, 0}));
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

std::unique_ptr<PyCache> MakeCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim,
                                   int32_t block_tokens, int64_t budget_bytes,
                                   std::optional<std::vector<std::string>> palette,
                                   std::optional<std::string> policy, int64_t slab_bytes,
                                   std::vector<float> k_tensor_amax,
                                   std::vector<float> v_tensor_amax, const std::string& backend) {
  Options o;
  o.geometry = Geometry{num_layers, num_kv_heads, head_dim, block_tokens};
  o.memory_budget_bytes = static_cast<size_t>(budget_bytes);
  o.slab_bytes = static_cast<size_t>(slab_bytes);
  o.k_tensor_amax = std::move(k_tensor_amax);
  o.v_tensor_amax = std::move(v_tensor_amax);
  if (backend == "cpu") {
    o.backend = BackendKind::kCpu;
  } else if (backend == "cuda") {
    o.backend = BackendKind::kCuda;
  } else {
    throw py::value_error("backend must be 'cpu' or 'cuda', not '" + backend + "'");
  }
  std::optional<Policy> loaded;
  if (policy) loaded = Value(LoadPolicy(*policy));
  if (palette) {
    o.palette.clear();
    for (const std::string& name : *palette) o.palette.push_back(Value(ParseFormat(name)));
  } else if (loaded) {
    o.palette = PolicyPalette(*loaded);
  }
  auto c = std::make_unique<PyCache>();
  c->cache = Value(Cache::Create(o));
  if (loaded) Check(c->cache->SetPolicy(*loaded));
  return c;
}

}  // namespace
}  // namespace kvtier

PYBIND11_MODULE(kvtier, m) {
  using namespace kvtier;
  m.doc() = "kvtier: a paged, mixed-precision KV cache; adapters for external attention kernels";

  py::class_<SequenceId>(m, "SequenceId")
      .def_readonly("index", &SequenceId::index)
      .def_readonly("generation", &SequenceId::generation)
      .def("__eq__", [](SequenceId a, SequenceId b) { return a == b; })
      .def("__hash__", [](SequenceId a) { return (uint64_t{a.generation} << 32) | a.index; })
      .def("__repr__", [](SequenceId a) {
        return "SequenceId(" + std::to_string(a.index) + "/" + std::to_string(a.generation) + ")";
      });
  py::class_<BlockId>(m, "BlockId")
      .def_readonly("index", &BlockId::index)
      .def_readonly("generation", &BlockId::generation)
      .def("__eq__", [](BlockId a, BlockId b) { return a == b; })
      .def("__hash__", [](BlockId a) { return (uint64_t{a.generation} << 32) | a.index; })
      .def("__repr__", [](BlockId a) {
        return "BlockId(" + std::to_string(a.index) + "/" + std::to_string(a.generation) + ")";
      });

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

  py::class_<PyTensorView>(m, "TensorView",
                           "A pool view without a copy. numpy.from_dlpack / torch.from_dlpack "
                           "read it; FP8 and FP4 arrive as uint8 (see `dtype`).")
      .def_property_readonly("dtype", [](const PyTensorView& v) { return ViewDTypeName(v.view.dtype); })
      .def_property_readonly("shape", [](const PyTensorView& v) { return py::tuple(py::cast(v.view.shape)); })
      .def_property_readonly("strides",
                             [](const PyTensorView& v) { return py::tuple(py::cast(v.view.strides)); })
      .def_property_readonly("data_ptr",
                             [](const PyTensorView& v) { return reinterpret_cast<uintptr_t>(v.view.data); })
      .def_property_readonly("device", [](const PyTensorView& v) {
        return v.view.device == BackendKind::kCuda ? "cuda:" + std::to_string(v.view.device_id)
                                                    : std::string("cpu");
      })
      .def("__dlpack__", [](const PyTensorView& v, py::args, py::kwargs) { return v.Capsule(); })
      .def("__dlpack_device__", [](const PyTensorView& v) {
        return py::make_tuple(v.view.device == BackendKind::kCuda ? 2 : 1, v.view.device_id);
      })
      .def("__repr__", [](const PyTensorView& v) {
        std::string s = "TensorView(dtype=" + std::string(ViewDTypeName(v.view.dtype)) + ", shape=(";
        for (int64_t x : v.view.shape) s += std::to_string(x) + ",";
        return s + "))";
      });

  py::class_<PyCache>(m, "Cache")
      .def(py::init(&MakeCache), "num_layers"_a = 1, "num_kv_heads"_a = 1, "head_dim"_a = 128,
           "block_tokens"_a = 16, "budget_bytes"_a = int64_t{256} << 20, "palette"_a = py::none(),
           "policy"_a = py::none(), "slab_bytes"_a = int64_t{2} << 20,
           "k_tensor_amax"_a = std::vector<float>{}, "v_tensor_amax"_a = std::vector<float>{},
           "backend"_a = "cpu",
           "Creates a cache. `palette`: format names, hottest first (default: the policy's "
           "palette, else ['fp16']); `policy`: a preset name or a JSON file path.")
      .def_property_readonly("num_layers", [](const PyCache& c) { return c.geometry().num_layers; })
      .def_property_readonly("num_kv_heads",
                             [](const PyCache& c) { return c.geometry().num_kv_heads; })
      .def_property_readonly("head_dim", [](const PyCache& c) { return c.geometry().head_dim; })
      .def_property_readonly("block_tokens",
                             [](const PyCache& c) { return c.geometry().block_tokens; })
      .def_property_readonly("palette", [](const PyCache& c) {
        std::vector<std::string> names;
        for (const FormatSpec& f : c.cache->options().palette) names.push_back(FormatName(f));
        return names;
      })
      // ---- Sequences ----
      .def("add_sequence",
           [](PyCache& c, const py::object& prompt, uint64_t extra_key, int32_t coldest_format,
              int32_t priority, int64_t priority_ttl_steps) {
             const std::vector<int32_t> tokens = FromArray<int32_t>(prompt);
             SequenceOptions o;
             o.prompt = tokens;
             o.extra_key = extra_key;
             o.coldest_format = coldest_format;
             o.priority = priority;
             o.priority_ttl_steps = priority_ttl_steps;
             const AddResult r = Value((*c).AddSequence(o));
             return py::make_tuple(r.id, r.cached_tokens);
           },
           "prompt"_a = py::none(), "extra_key"_a = 0, "coldest_format"_a = -1, "priority"_a = 0,
           "priority_ttl_steps"_a = -1,
           "A new sequence attached to the longest cached prefix of `prompt`: (id, cached_tokens).")
      .def("append",
           [](PyCache& c, SequenceId seq, int64_t n) {
             std::vector<int64_t> slots;
             Check((*c).Append(seq, n, &slots));
             return ToNumpy(slots);
           },
           "seq"_a, "num_tokens"_a, "Reserves slots (int64, page * block_tokens + offset).")
      .def("append_tokens",
           [](PyCache& c, SequenceId seq, const py::object& tokens) {
             std::vector<int64_t> slots;
             Check((*c).AppendTokens(seq, FromArray<int32_t>(tokens), &slots));
             return ToNumpy(slots);
           },
           "seq"_a, "tokens"_a)
      .def("append_batch",
           [](PyCache& c, const std::vector<SequenceId>& batch, const py::object& num_tokens,
              const py::object& tokens) {
             std::vector<int64_t> slots;
             Check((*c).AppendBatch(batch, FromArray<int64_t>(num_tokens),
                                    FromArray<int32_t>(tokens), &slots));
             return ToNumpy(slots);
           },
           "batch"_a, "num_tokens"_a, "tokens"_a = py::none())
      .def("fork", [](PyCache& c, SequenceId s) { return Value((*c).Fork(s)); }, "parent"_a)
      .def("release", [](PyCache& c, SequenceId s) { Check((*c).Release(s)); }, "seq"_a)
      .def("sequence_length",
           [](const PyCache& c, SequenceId s) { return Value((*c).SequenceLength(s)); }, "seq"_a)
      .def("sequence_blocks",
           [](const PyCache& c, SequenceId s) { return Value((*c).SequenceBlocks(s)); }, "seq"_a)
      .def("block_info",
           [](const PyCache& c, BlockId b) {
             const BlockInfo i = Value((*c).GetBlockInfo(b));
             static const char* kStates[] = {"free", "in_use", "cached"};
             return py::dict("state"_a = kStates[static_cast<int>(i.state)], "format"_a = i.format,
                             "page"_a = i.page, "ref_count"_a = i.ref_count,
                             "num_tokens"_a = i.num_tokens);
           },
           "block"_a)
      // ---- Data ----
      .def("write_kv",
           [](PyCache& c, int32_t layer, const py::object& slots, const py::object& k,
              const py::object& v) {
             const KVSource ks(k, (*c).options().backend), vs(v, (*c).options().backend);
             const std::vector<int64_t> s = FromArray<int64_t>(slots);
             Check((*c).WriteKV(layer, s, MakeInput(ks, vs, c.geometry())));
           },
           "layer"_a, "slots"_a, "k"_a, "v"_a,
           "Writes K/V [tokens, num_kv_heads, head_dim]: numpy (float16; other dtypes are "
           "converted, a copy; CPU backend) or any float16/bfloat16 object with __dlpack__ on "
           "the cache's device.")
      .def("read_kv",
           [](const PyCache& c, SequenceId seq, int32_t layer) {
             const Geometry& g = c.geometry();
             const int64_t len = Value((*c).SequenceLength(seq));
             py::array_t<float> k({len, int64_t{g.num_kv_heads}, int64_t{g.head_dim}});
             py::array_t<float> v({len, int64_t{g.num_kv_heads}, int64_t{g.head_dim}});
             Check((*c).ReadKV(seq, layer, absl::MakeSpan(k.mutable_data(), k.size()),
                               absl::MakeSpan(v.mutable_data(), v.size())));
             return py::make_tuple(k, v);
           },
           "seq"_a, "layer"_a, "K and V decoded to float32, each [length, num_kv_heads, head_dim].")
      .def("calibrate_tensor_scales",
           [](PyCache& c, int32_t layer, const py::object& k, const py::object& v) {
             const KVSource ks(k, (*c).options().backend), vs(v, (*c).options().backend);
             Check((*c).CalibrateTensorScales(layer, MakeInput(ks, vs, c.geometry())));
           },
           "layer"_a, "k"_a, "v"_a)
      .def("demote",
           [](PyCache& c, const std::vector<BlockId>& blocks, int32_t format) {
             Check((*c).Demote(blocks, format));
           },
           "blocks"_a, "format"_a)
      .def("set_policy",
           [](PyCache& c, const std::string& name_or_path) {
             Check((*c).SetPolicy(Value(LoadPolicy(name_or_path))));
           },
           "policy"_a)
      .def("end_step", [](PyCache& c) { Check((*c).EndStep()); })
      .def("check_consistency", [](const PyCache& c) { Check((*c).CheckConsistency()); })
      .def("stats", [](const PyCache& c) { return StatsDict((*c).GetStats()); })
      .def("pool",
           [](const PyCache& c, int32_t format, int32_t layer) {
             const PoolInfo p = Value((*c).GetPool(format, layer));
             return py::dict("base"_a = reinterpret_cast<uintptr_t>(p.base),
                             "page_bytes"_a = p.page_bytes, "capacity_pages"_a = p.capacity_pages,
                             "k_offset"_a = p.k_offset, "v_offset"_a = p.v_offset,
                             "row_bytes"_a = p.row_bytes, "k_micro_offset"_a = p.k_micro_offset,
                             "v_micro_offset"_a = p.v_micro_offset,
                             "k_scale_offset"_a = p.k_scale_offset,
                             "v_scale_offset"_a = p.v_scale_offset,
                             "k_tensor_scale"_a = p.k_tensor_scale,
                             "v_tensor_scale"_a = p.v_tensor_scale);
           },
           "format"_a, "layer"_a)
      // ---- Page tables and adapters ----
      .def("build_page_tables",
           [](const PyCache& c, const std::vector<SequenceId>& batch) {
             PageTables t;
             Check((*c).BuildPageTables(batch, &t));
             return t;
           },
           "batch"_a)
      .def("flashinfer_parts",
           [](const PyCache& c, const PageTables& t) {
             py::list out;
             for (const FormatPart& p : Value(BuildFlashInferParts((*c).options(), t))) {
               py::dict d = PartDict(*c, p.format, p.batch_index);
               d["indptr"] = ToNumpy(p.indptr);
               d["indices"] = ToNumpy(p.indices);
               d["last_page_len"] = ToNumpy(p.last_page_len);
               d["lengths"] = ToNumpy(p.lengths);
               out.append(d);
             }
             return out;
           },
           "tables"_a, "One FlashInfer CSR per format present (int32 arrays).")
      .def("flashinfer_layer",
           [](const py::object& self, int32_t format, int32_t layer) {
             const FlashInferLayer l = Value(GetFlashInferLayer(*Self(self), format, layer));
             py::dict d("kv"_a = ViewOf(l.kv, self), "k_scale"_a = l.k_scale,
                        "v_scale"_a = l.v_scale);
             d["kv_cache_sf"] = l.kv_cache_sf ? py::cast(ViewOf(*l.kv_cache_sf, self)) : py::none();
             return d;
           },
           "format"_a, "layer"_a)
      .def("block_table_parts",
           [](const PyCache& c, const std::string& target, const PageTables& t,
              int32_t max_blocks, int32_t pad_value) {
             py::list out;
             for (const BlockTablePart& p :
                  Value(BuildBlockTableParts(Value(ParseAdapterTarget(target)), (*c).options(), t,
                                             {max_blocks, pad_value}))) {
               py::dict d = PartDict(*c, p.format, p.batch_index);
               d["block_table"] = ToNumpy(p.block_table, {static_cast<py::ssize_t>(p.rows()),
                                                          static_cast<py::ssize_t>(p.max_blocks)});
               d["seq_lens"] = ToNumpy(p.seq_lens);
               out.append(d);
             }
             return out;
           },
           "target"_a, "tables"_a, "max_blocks"_a = 0, "pad_value"_a = 0)
      .def("block_table_layer",
           [](const py::object& self, const std::string& target, int32_t format, int32_t layer) {
             const BlockTableLayer l = Value(
                 GetBlockTableLayer(Value(ParseAdapterTarget(target)), *Self(self), format, layer));
             return py::dict("k"_a = ViewOf(l.k, self), "v"_a = ViewOf(l.v, self),
                             "k_scale"_a = l.k_scale, "v_scale"_a = l.v_scale);
           },
           "target"_a, "format"_a, "layer"_a)
      .def("fa3_descales",
           [](const PyCache& c, int32_t format, int32_t layer, int64_t rows) {
             const Fa3Descales d = Value(GetFa3Descales(*c, format, layer, rows));
             const std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(rows),
                                                     c.geometry().num_kv_heads};
             return py::make_tuple(ToNumpy(d.k_descale, shape), ToNumpy(d.v_descale, shape));
           },
           "format"_a, "layer"_a, "rows"_a)
      .def("vllm_slot_mapping",
           [](const PyCache& c, const py::object& slots, int64_t padded_size) {
             return ToNumpy(Value(VllmSlotMapping(*c, FromArray<int64_t>(slots), padded_size)));
           },
           "slots"_a, "padded_size"_a = 0)
      .def("flex_attention_parts",
           [](const PyCache& c, const PageTables& t) {
             py::list out;
             for (const FlexAttentionPart& p : Value(BuildFlexAttentionParts((*c).options(), t))) {
               const std::vector<py::ssize_t> shape = {static_cast<py::ssize_t>(p.rows()),
                                                       static_cast<py::ssize_t>(p.n_pages)};
               py::dict d = PartDict(*c, p.format, p.batch_index);
               d["n_pages"] = p.n_pages;
               d["source_pages"] = ToNumpy(p.source_pages);
               d["page_table"] = ToNumpy(p.page_table, shape);
               d["physical_to_logical"] = ToNumpy(p.physical_to_logical, shape);
               d["seq_lens"] = ToNumpy(p.seq_lens);
               out.append(d);
             }
             return out;
           },
           "tables"_a)
      .def("gather_flex_kv",
           [](const PyCache& c, int32_t format, int32_t layer, const py::object& pages) {
             const Geometry& g = c.geometry();
             const std::vector<int32_t> p = FromArray<int32_t>(pages);
             const bool bf16 = (*c).options().palette.at(format).k.type == ElementType::kBf16;
             const py::dtype dtype(bf16 ? "uint16" : "float16");  // numpy has no bfloat16
             const std::vector<py::ssize_t> shape = {
                 1, g.num_kv_heads, static_cast<py::ssize_t>(p.size()) * g.block_tokens,
                 g.head_dim};
             py::array k(dtype, shape), v(dtype, shape);
             Check(GatherFlexKV(
                 *c, format, layer, p,
                 absl::MakeSpan(static_cast<uint8_t*>(k.mutable_data()), k.nbytes()),
                 absl::MakeSpan(static_cast<uint8_t*>(v.mutable_data()), v.nbytes())));
             return py::make_tuple(k, v);
           },
           "format"_a, "layer"_a, "pages"_a,
           "A COPY of `pages` as FlexAttention's (1, H, n * S, D) K and V (CPU backend).")
      .def("tensorrt_llm_parts",
           [](const PyCache& c, const PageTables& t) {
             py::list out;
             for (const TensorRtLlmPart& p : Value(BuildTensorRtLlmParts((*c).options(), t))) {
               py::dict d = PartDict(*c, p.format, p.batch_index);
               d["block_offsets"] =
                   ToNumpy(p.block_offsets, {static_cast<py::ssize_t>(p.rows()), 2,
                                             static_cast<py::ssize_t>(p.max_blocks)});
               d["seq_lens"] = ToNumpy(p.seq_lens);
               d["bytes_per_block"] = p.bytes_per_block;
               out.append(d);
             }
             return out;
           },
           "tables"_a)
      .def("tensorrt_llm_layer",
           [](const PyCache& c, int32_t format, int32_t layer) {
             const TensorRtLlmLayer l = Value(GetTensorRtLlmLayer(*c, format, layer));
             return py::dict("pool_pointer"_a = reinterpret_cast<uintptr_t>(l.pool_pointer),
                             "bytes_per_block"_a = l.bytes_per_block,
                             "kv_scale_quant_orig"_a = l.kv_scale_quant_orig,
                             "kv_scale_orig_quant"_a = l.kv_scale_orig_quant);
           },
           "format"_a, "layer"_a)
      // ---- kvtier's decode attention (CPU reference or the fused CUDA kernel) ----
      .def("prepare_decode",
           [](const PyCache& c, const py::object& batch, uintptr_t stream) {
             PageTables built;
             const PageTables& tables = TablesOf(c, batch, &built);
             return Value(PreparedDecode::Create(*c.cache, tables,
                                                 DeviceLaunch{reinterpret_cast<void*>(stream), false}));
           },
           "batch"_a, "stream"_a = 0, py::keep_alive<0, 1>(),
           "This decode step's page tables made ready once for every layer's decode_attention: "
           "checked and, on the CUDA backend, copied to the device on `stream` (a raw "
           "cudaStream_t, e.g. torch.cuda.current_stream().cuda_stream; 0 for the default "
           "stream). `batch` is a PageTables or a list of SequenceId. Valid until the cache "
           "changes (append, demote, end_step). Run the step's decode_attention calls on the "
           "same stream (or order their streams after it), and drop the step only after them: "
           "its device copy is freed on `stream`.")
      .def("decode_attention",
           [](const PyCache& c, int32_t layer, const py::object& batch, const py::object& q,
              const py::object& out, const py::object& lse, std::optional<float> softmax_scale,
              uintptr_t stream, bool synchronize) {
             const Geometry& g = c.geometry();
             const BackendKind backend = c.cache->options().backend;
             const bool prepared = py::isinstance<PreparedDecode>(batch);
             PageTables built;
             const PageTables* tables = prepared ? nullptr : &TablesOf(c, batch, &built);
             const int64_t rows = prepared ? batch.cast<const PreparedDecode&>().batch()
                                           : static_cast<int64_t>(tables->seq_lens.size());
             const py::tuple qshape = q.attr("shape");
             if (qshape.size() != 3) throw py::value_error("q must be [batch, num_q_heads, head_dim]");
             const int64_t heads = qshape[1].cast<int64_t>();
             const FloatTensor qt(q, backend, {rows, heads, g.head_dim}, "q");
             const FloatTensor ot(out, backend, {rows, heads, g.head_dim}, "out");
             const FloatTensor lt(lse, backend, {rows, heads}, "lse");
             const float scale = softmax_scale.value_or(1.f / std::sqrt(static_cast<float>(g.head_dim)));
             const DecodeQueries queries{qt.span(), static_cast<int32_t>(heads), scale};
             const DecodeOutputs outputs{ot.span(), lt.span(), {}, 0};
             const DeviceLaunch launch{reinterpret_cast<void*>(stream), synchronize};
             if (prepared) {
               Check(DecodeAttention(*c.cache, layer, batch.cast<const PreparedDecode&>(), queries,
                                     outputs, launch));
             } else {
               Check(DecodeAttention(*c.cache, layer, *tables, queries, outputs, launch));
             }
           },
           "layer"_a, "batch"_a, "q"_a, "out"_a, "lse"_a, "softmax_scale"_a = py::none(),
           "stream"_a = 0, "synchronize"_a = true,
           "Decode attention for `batch` (a PreparedDecode from prepare_decode, PageTables from "
           "build_page_tables, or a list of SequenceId) with kvtier's own kernel: the fused "
           "mixed-format kernel on the CUDA backend (q, out, lse: float32 CUDA tensors via "
           "__dlpack__, e.g. torch), the CPU reference on the CPU backend (numpy float32 arrays). "
           "q and out are [batch, num_q_heads, head_dim], lse [batch, num_q_heads] in natural "
           "log; out and lse are written in place. Runs on `stream` (a raw cudaStream_t; 0 for "
           "the default stream) and, with synchronize (default), waits for the result. An engine "
           "prepares each step once and calls this per layer with the PreparedDecode.")
      // ---- CPU reference attention ----
      .def("reference_attention",
           [](const PyCache& c, int32_t layer, const PageTables& t, const py::object& q,
              std::optional<float> softmax_scale) { return Attend(*c, layer, t, q, softmax_scale); },
           "layer"_a, "tables"_a, "q"_a, "softmax_scale"_a = py::none(),
           "Decode attention over the batch of `tables`: (out [B, Hq, D], natural-log lse [B, Hq]).")
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

  m.def("check_readable",
        [](const std::string& target, const std::string& format, int32_t block_tokens,
           int32_t head_dim) {
          Check(CheckReadable(Value(ParseAdapterTarget(target)), Value(ParseFormat(format)),
                              Geometry{1, 1, head_dim, block_tokens}));
        },
        "target"_a, "format"_a, "block_tokens"_a = 16, "head_dim"_a = 128,
        "Raises ValueError naming the format and the target when `target` cannot read `format`.");
  m.def("merge_states",
        [](const py::object& out_a, const py::object& lse_a, const py::object& out_b,
           const py::object& lse_b, const py::object& out, const py::object& lse) {
          const bool cuda = !py::isinstance<py::array>(out_a) && py::hasattr(out_a, "__dlpack_device__") &&
                            out_a.attr("__dlpack_device__")().cast<py::tuple>()[0].cast<int>() != 1;
          const BackendKind backend = cuda ? BackendKind::kCuda : BackendKind::kCpu;
          const py::tuple shape = out_a.attr("shape");
          if (shape.size() < 1) throw py::value_error("out_a must be [..., head_dim]");
          std::vector<int64_t> vs, ss;
          for (const py::handle& x : shape) vs.push_back(x.cast<int64_t>());
          ss.assign(vs.begin(), vs.end() - 1);
          int64_t rows = 1;
          for (int64_t x : ss) rows *= x;
          const FloatTensor a(out_a, backend, vs, "out_a"), b(out_b, backend, vs, "out_b");
          const FloatTensor sa(lse_a, backend, ss, "lse_a"), sb(lse_b, backend, ss, "lse_b");
          const FloatTensor o(out, backend, vs, "out"), s(lse, backend, ss, "lse");
          Check(MergeStatesOn(backend, a.span(), sa.span(), b.span(), sb.span(), rows,
                              static_cast<int32_t>(vs.back()), o.span(), s.span(),
                              DeviceLaunch{nullptr, /*synchronize=*/true}));
        },
        "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a,
        "Merges two partial attention states exactly by natural-log LSE into out/lse (in place; "
        "may alias a or b): outputs [..., head_dim], LSEs [...], all float32; numpy arrays merge "
        "on the CPU, CUDA tensors (via __dlpack__) with kvtier's merge kernel.");
  m.def("natural_to_base2_lse",
        [](const FloatArrayIn& a) { return ConvertedLse(a, NaturalToBase2Lse); }, "lse"_a);
  m.def("base2_to_natural_lse",
        [](const FloatArrayIn& a) { return ConvertedLse(a, Base2ToNaturalLse); }, "lse"_a);
  m.def("merge_partial_states",
        [](int64_t batch, const py::list& parts) {
          using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
          using IntArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
          std::vector<IntArray> idx;
          std::vector<FloatArray> outs, lses;
          std::vector<PartialState> states;
          int32_t heads = 0, dim = 0;
          for (const py::handle& h : parts) {
            const py::tuple t = h.cast<py::tuple>();
            if (t.size() != 3 && t.size() != 4) {
              throw py::value_error("each part is (batch_index, out, lse[, 'natural' | 'base2'])");
            }
            idx.push_back(IntArray::ensure(t[0]));
            outs.push_back(FloatArray::ensure(t[1]));
            lses.push_back(FloatArray::ensure(t[2]));
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
          py::array_t<float> out({batch, int64_t{heads}, int64_t{dim}});
          py::array_t<float> lse({batch, int64_t{heads}});
          Check(MergePartialStates(states, batch, heads, dim,
                                   absl::MakeSpan(out.mutable_data(), out.size()),
                                   absl::MakeSpan(lse.mutable_data(), lse.size())));
          return py::make_tuple(out, lse);
        },
        "batch"_a, "parts"_a,
        "Merges per-format (batch_index, out, lse[, base]) states exactly: (out, natural lse).");
}
