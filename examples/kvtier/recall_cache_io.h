// How the recall sweep's host data reach a cache on either backend: WriteKV of host K/V and
// DecodeAttention with host queries into host outputs. On the CPU backend the host spans go to
// the cache as they are (the reference attention); on the CUDA backend through device buffers
// (recall_device.h), reused across calls, and DecodeAttention runs the fused kernel (and the
// logits kernel for DecodeOutputs::logits).
#ifndef KVTIER_EXAMPLES_KVTIER_RECALL_CACHE_IO_H_
#define KVTIER_EXAMPLES_KVTIER_RECALL_CACHE_IO_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "examples/kvtier/recall_device.h"
#include "kvtier/attention.h"
#include "kvtier/cache.h"

namespace kvtier::tool {

// Thread-compatible: one per cache user (the sweep has one per ArmRunner).
class CacheIo {
 public:
  // Cache::WriteKV of host `kv` (FP16 or BF16).
  absl::Status WriteKV(Cache& cache, int32_t layer, absl::Span<const int64_t> slots,
                       const KVInput& kv);

  // DecodeAttention of `layer` over `tables` with host queries into host outputs: every span
  // of `outputs` that is set is filled (page_weight max-accumulated, as DecodeAttention says).
  // On the CUDA backend the call is synchronous. Errors as DecodeAttention's, Internal for a
  // failed copy.
  absl::Status Attend(const Cache& cache, int32_t layer, const PageTables& tables,
                      const DecodeQueries& queries, const DecodeOutputs& outputs);

  // After a policy's EndSteps, the state they reach on the CPU backend. There, the pages a
  // step's demotions free return to the budget at once; on the CUDA backend only at a later
  // EndStep, once the device has passed the step's fence, so demotions that found no room wait
  // a step more. So on CUDA: three times, wait for the device, then EndStep (the retired pages
  // come back, the queued demotions run, their pages come back). Nothing on the CPU backend.
  absl::Status SettleSteps(Cache& cache);

 private:
  DeviceBuffer k_, v_, q_, out_, lse_, logits_, page_weight_;
};

}  // namespace kvtier::tool

#endif  // KVTIER_EXAMPLES_KVTIER_RECALL_CACHE_IO_H_
