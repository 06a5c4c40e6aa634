// A mutex with Clang thread-safety annotations over std::mutex.
//
// Why not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so TSan cannot see
// the synchronisation inside absl::Mutex and reports false races. std::mutex goes through
// pthread, which TSan intercepts, and the annotations keep -Wthread-safety checking.
#ifndef KVTIER_SRC_MUTEX_H_
#define KVTIER_SRC_MUTEX_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace kvtier {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace kvtier

#endif  // KVTIER_SRC_MUTEX_H_
