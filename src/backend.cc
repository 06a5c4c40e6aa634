// The backend interface's shared helper (backend.h).
#include "src/backend.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "src/status_macros.h"

namespace kvtier {

absl::Status AwaitIssuedWork(Backend& backend, absl::string_view what) {
  constexpr std::chrono::milliseconds kFenceWait{2000};
  KVTIER_ASSIGN_OR_RETURN(const uint64_t fence, backend.RecordFence());
  const auto deadline = std::chrono::steady_clock::now() + kFenceWait;
  while (true) {
    KVTIER_ASSIGN_OR_RETURN(const bool passed, backend.FencePassed(fence));
    if (passed) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the device has not finished ", what, " after ", kFenceWait.count(), " ms"));
    }
    std::this_thread::yield();
  }
}

}  // namespace kvtier
