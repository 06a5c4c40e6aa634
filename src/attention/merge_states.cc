// MergeStates on the host, and MergeStatesOn's dispatch by backend.
#include "kvtier/merge_states.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/attention/attention_contract.h"

#if KVTIER_WITH_CUDA
#include "src/cuda/cuda_decode_attention.h"
#endif

namespace kvtier {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace

absl::Status MergeStates(absl::Span<const float> out_a, absl::Span<const float> lse_a,
                         absl::Span<const float> out_b, absl::Span<const float> lse_b,
                         int64_t rows, int32_t head_dim, absl::Span<float> out,
                         absl::Span<float> lse) {
  const absl::Status s = ValidateMergeStates(out_a.size(), lse_a.size(), out_b.size(),
                                             lse_b.size(), rows, head_dim, out.size(), lse.size());
  if (!s.ok()) return s;
  const size_t n = static_cast<size_t>(rows);
  for (size_t r = 0; r < n; ++r) {
    const double sa = lse_a[r], sb = lse_b[r];
    // NaN in either part, whatever the other (std::max(-inf, NaN) is -inf).
    const double m = std::isnan(sa) || std::isnan(sb) ? NAN : std::max(sa, sb);
    if (m == kNegInf || std::isnan(m)) {
      for (int d = 0; d < head_dim; ++d) out[r * head_dim + d] = std::isnan(m) ? NAN : 0.f;
      lse[r] = static_cast<float>(m);
      continue;
    }
    const double wa = std::exp(sa - m), wb = std::exp(sb - m);  // exp(-inf) = 0
    const double total = wa + wb;
    for (int d = 0; d < head_dim; ++d) {
      const size_t i = r * head_dim + d;
      const double a = wa > 0 ? wa * out_a[i] : 0.0;
      const double b = wb > 0 ? wb * out_b[i] : 0.0;
      out[i] = static_cast<float>((a + b) / total);
    }
    lse[r] = static_cast<float>(m + std::log(total));
  }
  return absl::OkStatus();
}

absl::Status MergeStatesOn(BackendKind backend, absl::Span<const float> out_a,
                           absl::Span<const float> lse_a, absl::Span<const float> out_b,
                           absl::Span<const float> lse_b, int64_t rows, int32_t head_dim,
                           absl::Span<float> out, absl::Span<float> lse,
                           const DeviceLaunch& launch) {
  if (backend == BackendKind::kCpu) {
    return MergeStates(out_a, lse_a, out_b, lse_b, rows, head_dim, out, lse);
  }
#if KVTIER_WITH_CUDA
  return CudaMergeStates(out_a, lse_a, out_b, lse_b, rows, head_dim, out, lse, launch);
#else
  (void)launch;
  return absl::UnavailableError("kvtier was built without CUDA");
#endif
}

}  // namespace kvtier
