// CacheImpl::CheckConsistency: the invariants that tests run after every operation. The
// cache checks its sequences; the block pool checks blocks, the index and eviction order; the
// page store checks pools and slabs.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/cache_impl.h"
#include "src/status_macros.h"

namespace kvtier {
namespace {

absl::Status Violation(absl::string_view what) {
  return absl::InternalError(absl::StrCat("consistency: ", what));
}

}  // namespace

absl::Status CacheImpl::CheckConsistency() const {
  MutexLock lock(&mu_);
  const int64_t s = options_.geometry.block_tokens;
  // Reference counts equal references from sequences; sequences are well formed.
  std::vector<uint32_t> refs(pool_.blocks().capacity(), 0);
  int64_t tokens = 0;
  for (uint32_t index = 0; index < sequences_.num_slots(); ++index) {
    const Sequence& seq = sequences_.slot(index);
    if (seq.generation == 0) continue;
    tokens += seq.num_tokens;
    const int64_t want_blocks = (seq.num_tokens + s - 1) / s;
    if (static_cast<int64_t>(seq.blocks.size()) != want_blocks) {
      return Violation(absl::StrCat("sequence ", index, " has ", seq.blocks.size(),
                                    " blocks for ", seq.num_tokens, " tokens"));
    }
    for (size_t i = 0; i < seq.blocks.size(); ++i) {
      const uint32_t b = seq.blocks[i];
      refs[b] += 1;
      const BlockMeta& m = pool_[b];
      const int64_t want_tokens = std::min<int64_t>(s, seq.num_tokens - static_cast<int64_t>(i) * s);
      if (m.state != BlockState::kInUse || m.num_tokens != want_tokens) {
        return Violation(absl::StrCat("sequence ", index, " block ", i, " (", b,
                                      ") is not in use with ", want_tokens, " tokens"));
      }
      if (m.num_tokens < s && m.format != 0) {
        return Violation(absl::StrCat("partial block ", b, " is not in the hot format"));
      }
    }
  }
  if (tokens != metrics_.tokens) {
    return Violation(absl::StrCat("token count ", metrics_.tokens, " != ", tokens));
  }
  return pool_.CheckConsistency(refs);
}

}  // namespace kvtier
