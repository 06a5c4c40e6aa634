// Page tables, the adapters' tables (FlashInfer, block tables for vLLM / FlashAttention-3,
// FlexAttention, TensorRT-LLM) and their layer views for the module `kvtier`.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "adapters/python/bindings.h"
#include "adapters/python/dlpack.h"
#include "adapters/python/py_support.h"
#include "kvtier/adapters/block_tables.h"
#include "kvtier/adapters/flashinfer.h"
#include "kvtier/adapters/flex_attention.h"
#include "kvtier/adapters/partition.h"
#include "kvtier/adapters/target.h"
#include "kvtier/adapters/tensorrt_llm.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/page_tables.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

std::string PartFormatName(const Cache& c, int32_t f) { return FormatName(c.options().palette[f]); }

py::dict PartDict(const Cache& c, int32_t format, const std::vector<int32_t>& batch_index) {
  py::dict d;
  d["format"] = format;
  d["format_name"] = PartFormatName(c, format);
  d["batch_index"] = ToNumpy(batch_index);
  return d;
}

void BindFlashInfer(CacheClass& cache) {
  cache
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
           "format"_a, "layer"_a);
}

void BindBlockTables(CacheClass& cache) {
  cache
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
           "slots"_a, "padded_size"_a = 0);
}

void BindFlexAttention(CacheClass& cache) {
  cache
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
             const std::vector<FormatSpec>& palette = (*c).options().palette;
             if (format < 0 || static_cast<size_t>(format) >= palette.size()) {
               throw py::value_error("format " + std::to_string(format) +
                                     " is not in the palette (" +
                                     std::to_string(palette.size()) + " formats)");
             }
             const bool bf16 = palette[format].k.type == ElementType::kBf16;
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
           "A COPY of `pages` as FlexAttention's (1, H, n * S, D) K and V (CPU backend).");
}

void BindTensorRtLlm(CacheClass& cache) {
  cache
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
           "format"_a, "layer"_a);
}

}  // namespace

void BindAdapters(CacheClass& cache, py::module_& m) {
  cache
      .def("build_page_tables",
           [](const PyCache& c, const std::vector<SequenceId>& batch) {
             PageTables t;
             Check((*c).BuildPageTables(batch, &t));
             return t;
           },
           "batch"_a);
  BindFlashInfer(cache);
  BindBlockTables(cache);
  BindFlexAttention(cache);
  BindTensorRtLlm(cache);
  m.def("check_readable",
        [](const std::string& target, const std::string& format, int32_t block_tokens,
           int32_t head_dim) {
          Check(CheckReadable(Value(ParseAdapterTarget(target)), Value(ParseFormat(format)),
                              Geometry{1, 1, head_dim, block_tokens}));
        },
        "target"_a, "format"_a, "block_tokens"_a = 16, "head_dim"_a = 128,
        "Raises ValueError naming the format and the target when `target` cannot read `format`.");
}

}  // namespace kvtier::python
