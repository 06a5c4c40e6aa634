#include "kvtier/adapters/partial_states.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtier/merge_states.h"
#include "src/size_check.h"
#include "src/status_macros.h"

namespace kvtier {

void NaturalToBase2Lse(absl::Span<float> lse) {
  for (float& x : lse) x = static_cast<float>(x * (1.0 / std::log(2.0)));
}

void Base2ToNaturalLse(absl::Span<float> lse) {
  for (float& x : lse) x = static_cast<float>(x * std::log(2.0));
}

namespace {

// InvalidArgument when part `p`'s sizes or batch indices do not fit the batch.
absl::Status CheckPart(const PartialState& part, size_t p, int64_t batch, int32_t num_q_heads,
                       size_t row_out) {
  const size_t rows = part.batch_index.size();
  if (!HoldsExactly(part.out.size(), rows, row_out) ||
      !HoldsExactly(part.lse.size(), rows, static_cast<uint64_t>(num_q_heads))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "part ", p, ": ", rows, " rows need ", rows * row_out, " outputs and ",
        rows * num_q_heads, " LSEs; got ", part.out.size(), " and ", part.lse.size()));
  }
  std::vector<bool> seen(batch, false);
  for (int32_t b : part.batch_index) {
    if (b < 0 || b >= batch || seen[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "part ", p, ": batch index ", b, " is outside 0..", batch - 1, " or repeated"));
    }
    seen[b] = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MergePartialStates(absl::Span<const PartialState> parts, int64_t batch,
                                int32_t num_q_heads, int32_t head_dim, absl::Span<float> out,
                                absl::Span<float> lse) {
  if (batch < 0 || num_q_heads < 1 || head_dim < 1 ||
      !HoldsExactly(out.size(), static_cast<uint64_t>(batch),
                    static_cast<uint64_t>(num_q_heads) * head_dim) ||
      !HoldsExactly(lse.size(), static_cast<uint64_t>(batch), static_cast<uint64_t>(num_q_heads))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MergePartialStates: out holds ", out.size(), " and lse ", lse.size(), " floats for batch ",
        batch, " x ", num_q_heads, " heads x head_dim ", head_dim));
  }
  const size_t row_out = static_cast<size_t>(num_q_heads) * head_dim;
  for (size_t p = 0; p < parts.size(); ++p) {  // every part first: nothing written on error
    KVTIER_RETURN_IF_ERROR(CheckPart(parts[p], p, batch, num_q_heads, row_out));
  }
  std::fill(out.begin(), out.end(), 0.f);
  std::fill(lse.begin(), lse.end(), -std::numeric_limits<float>::infinity());
  std::vector<float> natural;
  for (const PartialState& part : parts) {
    const size_t rows = part.batch_index.size();
    natural.assign(part.lse.begin(), part.lse.end());
    if (part.base == LseBase::kBase2) Base2ToNaturalLse(absl::MakeSpan(natural));
    for (size_t r = 0; r < rows; ++r) {
      const size_t b = static_cast<size_t>(part.batch_index[r]);
      absl::Span<float> acc_out = out.subspan(b * row_out, row_out);
      absl::Span<float> acc_lse = lse.subspan(b * num_q_heads, num_q_heads);
      KVTIER_RETURN_IF_ERROR(MergeStates(acc_out, acc_lse, part.out.subspan(r * row_out, row_out),
                                         absl::MakeConstSpan(natural).subspan(r * num_q_heads,
                                                                              num_q_heads),
                                         num_q_heads, head_dim, acc_out, acc_lse));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvtier
