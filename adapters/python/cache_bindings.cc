// Cache construction, geometry, sequences, K/V data, policy, stats and pools for the module
// `kvtier`.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapters/python/bindings.h"
#include "adapters/python/py_support.h"
#include "adapters/python/tensor_args.h"
#include "kvtier/cache.h"
#include "kvtier/format.h"
#include "kvtier/policy.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

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
  d["slabs_lost"] = s.slabs_lost;
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
  d["abandoned_blocks"] = s.abandoned_blocks;
  d["evictable_blocks"] = s.evictable_blocks;
  d["indexed_blocks"] = s.indexed_blocks;
  d["policy"] = s.policy;
  d["under_pressure"] = s.under_pressure;
  d["demotions_under_pressure"] = s.demotions_under_pressure;
  d["compacted_pages"] = s.compacted_pages;
  d["policy_demotion_failures"] = s.policy_demotion_failures;
  d["migration_seconds"] = HistogramDict(s.migration_seconds);
  d["block_lifetime_seconds"] = HistogramDict(s.block_lifetime_seconds);
  d["block_idle_before_evict_seconds"] = HistogramDict(s.block_idle_before_evict_seconds);
  d["migrations"] = migrations;
  const HostTierStats& h = s.host;
  d["host"] = py::dict(
      "budget_bytes"_a = h.budget_bytes, "slabs_free"_a = h.slabs_free, "blocks"_a = h.blocks,
      "bytes"_a = h.bytes, "evictable_blocks"_a = h.evictable_blocks,
      "offloaded_blocks"_a = h.offloaded_blocks, "onloaded_blocks"_a = h.onloaded_blocks,
      "evicted_blocks"_a = h.evicted_blocks, "offload_failures"_a = h.offload_failures,
      "onload_failures"_a = h.onload_failures, "hit_tokens"_a = h.hit_tokens,
      "bytes_offloaded"_a = h.bytes_offloaded, "bytes_onloaded"_a = h.bytes_onloaded);
  const RemoteTierStats& r = s.remote;
  d["remote"] = py::dict(
      "enabled"_a = r.enabled, "connected"_a = r.connected, "hit_blocks"_a = r.hit_blocks,
      "hit_tokens"_a = r.hit_tokens, "missed_blocks"_a = r.missed_blocks,
      "written_blocks"_a = r.written_blocks, "bytes_read"_a = r.bytes_read,
      "bytes_written"_a = r.bytes_written, "queued_blocks"_a = r.queued_blocks,
      "unavailable"_a = r.unavailable, "timeouts"_a = r.timeouts,
      "corrupt_values"_a = r.corrupt_values, "mismatched_values"_a = r.mismatched_values,
      "unauthenticated_values"_a = r.unauthenticated_values,
      "server_errors"_a = r.server_errors, "dropped_writes"_a = r.dropped_writes,
      "import_failures"_a = r.import_failures, "reconnects"_a = r.reconnects,
      "lookup_seconds"_a = HistogramDict(r.lookup_seconds));
  const EventStats& e = s.events;
  d["events"] = py::dict("published_batches"_a = e.published_batches,
                         "published_events"_a = e.published_events,
                         "dropped_batches"_a = e.dropped_batches,
                         "dropped_events"_a = e.dropped_events,
                         "replay_requests"_a = e.replay_requests,
                         "queued_batches"_a = e.queued_batches);
  return d;
}

std::unique_ptr<PyCache> MakeCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim,
                                   int32_t block_tokens, int64_t budget_bytes,
                                   std::optional<std::vector<std::string>> palette,
                                   std::optional<std::string> policy, int64_t slab_bytes,
                                   std::vector<float> k_tensor_amax,
                                   std::vector<float> v_tensor_amax, const std::string& backend,
                                   int64_t host_tier_bytes, int32_t host_tier_format,
                                   std::string kv_events_endpoint,
                                   std::string kv_events_replay_endpoint,
                                   std::string kv_events_topic, bool kv_events_format_changes,
                                   std::string kv_events_vllm_hash_seed,
                                   int32_t kv_events_replay_batches,
                                   int32_t kv_events_queue_batches,
                                   std::string remote_tier_url, std::string remote_model_id,
                                   std::string remote_secret, int32_t remote_timeout_ms,
                                   std::optional<std::string> key_rotation,
                                   uint64_t key_rotation_seed) {
  Options o;
  if (!key_rotation) {
    o.key_rotation = policy ? PresetKeyRotation(*policy) : KeyRotation::kNone;
  } else if (*key_rotation == "hadamard") {
    o.key_rotation = KeyRotation::kHadamard;
  } else if (*key_rotation != "none") {
    throw py::value_error("key_rotation must be 'none' or 'hadamard', not '" + *key_rotation +
                          "'");
  }
  o.key_rotation_seed = key_rotation_seed;
  o.host_tier_bytes = static_cast<size_t>(std::max<int64_t>(host_tier_bytes, 0));
  o.host_tier_format = host_tier_format;
  o.kv_events_endpoint = std::move(kv_events_endpoint);
  o.kv_events_replay_endpoint = std::move(kv_events_replay_endpoint);
  o.kv_events_topic = std::move(kv_events_topic);
  o.kv_events_format_changes = kv_events_format_changes;
  o.kv_events_vllm_hash_seed = std::move(kv_events_vllm_hash_seed);
  o.kv_events_replay_batches = kv_events_replay_batches;
  o.kv_events_queue_batches = kv_events_queue_batches;
  o.remote_tier_url = std::move(remote_tier_url);
  o.remote_model_id = std::move(remote_model_id);
  o.remote_secret = std::move(remote_secret);
  o.remote_timeout_ms = remote_timeout_ms;
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

void BindShape(CacheClass& cache) {
  cache
      .def(py::init(&MakeCache), "num_layers"_a = 1, "num_kv_heads"_a = 1, "head_dim"_a = 128,
           "block_tokens"_a = 16, "budget_bytes"_a = int64_t{256} << 20, "palette"_a = py::none(),
           "policy"_a = py::none(), "slab_bytes"_a = int64_t{2} << 20,
           "k_tensor_amax"_a = std::vector<float>{}, "v_tensor_amax"_a = std::vector<float>{},
           "backend"_a = "cpu", "host_tier_bytes"_a = 0, "host_tier_format"_a = -1,
           "kv_events_endpoint"_a = "", "kv_events_replay_endpoint"_a = "",
           "kv_events_topic"_a = "", "kv_events_format_changes"_a = false,
           "kv_events_vllm_hash_seed"_a = "",
           "kv_events_replay_batches"_a = Options{}.kv_events_replay_batches,
           "kv_events_queue_batches"_a = Options{}.kv_events_queue_batches,
           "remote_tier_url"_a = "", "remote_model_id"_a = "",
           "remote_secret"_a = "", "remote_timeout_ms"_a = 20,
           "key_rotation"_a = py::none(), "key_rotation_seed"_a = Options{}.key_rotation_seed,
           "Creates a cache. `palette`: format names, hottest first (default: the policy's "
           "palette, else ['fp16']); `policy`: a preset name or a JSON file path; "
           "`host_tier_bytes`: host memory below the device pools for offloaded blocks "
           "(docs/tiers.md; 0: none), `host_tier_format`: the palette index they are stored in "
           "(-1: their own); `kv_events_*`: KV events for routers, as the Options fields of the "
           "same names (docs/events.md); `remote_tier_url`, `remote_model_id`, `remote_secret`, "
           "`remote_timeout_ms`: the Redis remote tier, as the Options fields of the same names "
           "(docs/tiers.md; the write queue and fetch limits keep their defaults); `key_rotation`: 'none' or 'hadamard' (keys "
           "stored rotated; decode attention rotates queries, read_kv un-rotates, the "
           "external-kernel adapters refuse the cache; docs/formats.md; default: the one the "
           "policy preset is meant for, 'hadamard' for 'balanced_rot', else 'none'), "
           "`key_rotation_seed`: the seed of its signs.")
      .def_property_readonly("num_layers", [](const PyCache& c) { return c.geometry().num_layers; })
      .def_property_readonly("num_kv_heads",
                             [](const PyCache& c) { return c.geometry().num_kv_heads; })
      .def_property_readonly("head_dim", [](const PyCache& c) { return c.geometry().head_dim; })
      .def_property_readonly("block_tokens",
                             [](const PyCache& c) { return c.geometry().block_tokens; })
      .def_property_readonly("key_rotation",
                             [](const PyCache& c) {
                               return c.cache->options().key_rotation == KeyRotation::kHadamard
                                          ? "hadamard"
                                          : "none";
                             })
      .def_property_readonly("palette", [](const PyCache& c) {
        std::vector<std::string> names;
        for (const FormatSpec& f : c.cache->options().palette) names.push_back(FormatName(f));
        return names;
      });
}

void BindSequences(CacheClass& cache) {
  cache
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
             return Value((*c).AddSequence(o));
           },
           "prompt"_a = py::none(), "extra_key"_a = 0, "coldest_format"_a = -1, "priority"_a = 0,
           "priority_ttl_steps"_a = -1,
           "A new sequence attached to the longest cached prefix of `prompt`: an AddResult, "
           "which unpacks as (id, cached_tokens).")
      .def("fence_passed", [](PyCache& c, uint64_t fence) { return Value((*c).FencePassed(fence)); },
           "fence"_a,
           "True once the device work before `fence` (AddResult.ready_fence, record_fence) is "
           "complete.")
      .def("record_fence", [](PyCache& c) { return Value((*c).RecordFence()); },
           "A fence after the device work issued so far (write_kv's copies included), for "
           "fence_passed.")
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
      .def("abandon", [](PyCache& c, SequenceId s) { Check((*c).Abandon(s)); }, "seq"_a,
           "Release for a sequence whose K/V was not all written (a failed prefill): the blocks\n"
           "it filled and indexed since the last end_step leave the prefix index (Cache::Abandon).")
      .def("sequence_length",
           [](const PyCache& c, SequenceId s) { return Value((*c).SequenceLength(s)); }, "seq"_a)
      .def("sequence_blocks",
           [](const PyCache& c, SequenceId s) { return Value((*c).SequenceBlocks(s)); }, "seq"_a)
      .def("block_info",
           [](const PyCache& c, BlockId b) {
             const BlockInfo i = Value((*c).GetBlockInfo(b));
             static const char* kStates[] = {"free", "in_use", "cached", "offloaded"};
             static_assert(std::size(kStates) == static_cast<size_t>(BlockState::kOffloaded) + 1);
             return py::dict("state"_a = kStates[static_cast<int>(i.state)], "format"_a = i.format,
                             "page"_a = i.page, "ref_count"_a = i.ref_count,
                             "num_tokens"_a = i.num_tokens, "attention"_a = i.attention);
           },
           "block"_a)
      .def(
          "record_attention",
          [](PyCache& c, SequenceId seq, const py::object& block_weight) {
            Check((*c).RecordAttention(seq, FromArray<float>(block_weight)));
          },
          "seq"_a, "block_weight"_a,
          "Records the attention weight (0 to 1) each block of seq received, one per block in "
          "order, for policies with attention_keep_ratio (e.g. the 'attentive' preset).");
}

// Cache.write_kv: the tensors it imported are held until the copy that reads them is done,
// also after a failure other than InvalidArgument (refused before anything was queued).
void WriteKVCall(PyCache& c, int32_t layer, const py::object& slots, const py::object& k,
                 const py::object& v) {
  const Placement at = PlacementOf(*c);
  KVSource ks(k, at), vs(v, at);
  const absl::Status written =
      (*c).WriteKV(layer, FromArray<int64_t>(slots), MakeInput(ks, vs, c.geometry()));
  if (written.code() != absl::StatusCode::kInvalidArgument) {
    std::vector<std::unique_ptr<DlpackImport>> read;
    read.push_back(ks.TakeImport());
    read.push_back(vs.TakeImport());
    c.HoldUntilDone(std::move(read));
  }
  Check(written);
}

void BindData(CacheClass& cache) {
  cache
      .def("write_kv", &WriteKVCall, "layer"_a, "slots"_a, "k"_a, "v"_a,
           "Writes K/V [tokens, num_kv_heads, head_dim]: numpy (float16; other dtypes are "
           "converted, a copy; CPU backend) or any float16/bfloat16 object with __dlpack__ on "
           "the cache's device. On CUDA the write is queued on the cache's stream, which the "
           "legacy default stream (torch's default) is ordered with, and the cache holds the "
           "tensors until a write_kv or end_step after the write is done (or until the cache "
           "is destroyed), so that dropping them at once is safe; a tensor of another stream "
           "must be ready when write_kv is called and stay unchanged until the device has "
           "done the write (for example until torch.cuda.synchronize()).")
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
             // Host memory whatever the backend (Cache::CalibrateTensorScales reads it there).
             const Placement at{BackendKind::kCpu};
             const KVSource ks(k, at), vs(v, at);
             Check((*c).CalibrateTensorScales(layer, MakeInput(ks, vs, c.geometry())));
           },
           "layer"_a, "k"_a, "v"_a,
           "Per-tensor scales from a sample of K/V in host memory (numpy, CPU tensors), whatever\n"
           "the backend.")
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
      .def("end_step",
           [](PyCache& c) {
             Check((*c).EndStep());
             c.ReleaseDone();
           })
      .def("check_consistency", [](const PyCache& c) { Check((*c).CheckConsistency()); })
      .def("stats", [](const PyCache& c) { return StatsDict((*c).GetStats()); })
      .def(
          "indexed_blocks",
          [](const PyCache& c) {
            py::list out;
            for (const IndexedBlock& b : (*c).IndexedBlocks()) {
              out.append(py::make_tuple(
                  b.hash, b.state == BlockState::kOffloaded ? "CPU" : "GPU", b.format));
            }
            return out;
          },
          "Every block of the prefix index as (hash, medium, palette index): medium 'GPU' for "
          "the device tier, 'CPU' for the host tier, as KV events name them; the hashes are "
          "kvtier's, also when the events carry vLLM's (kv_events_vllm_hash_seed).")
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
                             "v_tensor_scale"_a = p.v_tensor_scale, "device_id"_a = p.device_id);
           },
           "format"_a, "layer"_a);
}

}  // namespace

void BindCache(CacheClass& cache) {
  BindShape(cache);
  BindSequences(cache);
  BindData(cache);
}

}  // namespace kvtier::python
