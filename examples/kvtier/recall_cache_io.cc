#include "examples/kvtier/recall_cache_io.h"

#include "src/status_macros.h"

namespace kvtier::tool {
namespace {

bool OnCuda(const Cache& cache) { return cache.options().backend == BackendKind::kCuda; }

// `host` copied into `device` (when `copy_in`); the device span of the same size.
template <typename T>
absl::StatusOr<absl::Span<T>> OnDevice(absl::Span<T> host, bool copy_in, DeviceBuffer* device) {
  const size_t bytes = host.size() * sizeof(T);
  KVTIER_RETURN_IF_ERROR(copy_in ? device->CopyIn(host.data(), bytes) : device->Reserve(bytes));
  return absl::Span<T>(static_cast<T*>(device->data()), host.size());
}

}  // namespace

absl::Status CacheIo::WriteKV(Cache& cache, int32_t layer, absl::Span<const int64_t> slots,
                              const KVInput& kv) {
  if (!OnCuda(cache)) return cache.WriteKV(layer, slots, kv);
  const size_t bytes = static_cast<size_t>(kv.num_tokens) * kv.num_heads * kv.head_dim * 2;
  KVTIER_RETURN_IF_ERROR(k_.CopyIn(kv.k, bytes));
  KVTIER_RETURN_IF_ERROR(v_.CopyIn(kv.v, bytes));
  KVInput device = kv;
  device.k = k_.data();
  device.v = v_.data();
  return cache.WriteKV(layer, slots, device);
}

absl::Status CacheIo::SettleSteps(Cache& cache) {
  for (int i = 0; OnCuda(cache) && i < 3; ++i) {
    KVTIER_RETURN_IF_ERROR(DeviceSynchronize());
    KVTIER_RETURN_IF_ERROR(cache.EndStep());
  }
  return absl::OkStatus();
}

absl::Status CacheIo::Attend(const Cache& cache, int32_t layer, const PageTables& tables,
                             const DecodeQueries& queries, const DecodeOutputs& outputs) {
  if (!OnCuda(cache)) return DecodeAttention(cache, layer, tables, queries, outputs);
  DecodeQueries q = queries;
  DecodeOutputs o = outputs;
  KVTIER_ASSIGN_OR_RETURN(q.q, OnDevice(queries.q, true, &q_));
  KVTIER_ASSIGN_OR_RETURN(o.out, OnDevice(outputs.out, false, &out_));
  KVTIER_ASSIGN_OR_RETURN(o.lse, OnDevice(outputs.lse, false, &lse_));
  if (!outputs.logits.empty()) {
    KVTIER_ASSIGN_OR_RETURN(o.logits, OnDevice(outputs.logits, false, &logits_));
  }
  if (!outputs.page_weight.empty()) {  // max-accumulated: the host's values go in first
    KVTIER_ASSIGN_OR_RETURN(o.page_weight, OnDevice(outputs.page_weight, true, &page_weight_));
  }
  KVTIER_RETURN_IF_ERROR(DecodeAttention(cache, layer, tables, q, o, {nullptr, true}));
  KVTIER_RETURN_IF_ERROR(out_.CopyOut(outputs.out.data(), outputs.out.size() * sizeof(float)));
  KVTIER_RETURN_IF_ERROR(lse_.CopyOut(outputs.lse.data(), outputs.lse.size() * sizeof(float)));
  KVTIER_RETURN_IF_ERROR(
      logits_.CopyOut(outputs.logits.data(), outputs.logits.size() * sizeof(float)));
  return page_weight_.CopyOut(outputs.page_weight.data(),
                              outputs.page_weight.size() * sizeof(float));
}

}  // namespace kvtier::tool
