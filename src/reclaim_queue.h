// Pages freed by release, migration or eviction wait here until the device work that may still
// read them has completed. Pages freed during a step wait for the fence recorded at the end of
// that step (EndStep); a synchronous backend's fences pass at once.
//
// Thread-compatible.
#ifndef KVTIER_SRC_RECLAIM_QUEUE_H_
#define KVTIER_SRC_RECLAIM_QUEUE_H_

#include <cstdint>
#include <deque>

namespace kvtier {

class ReclaimQueue {
 public:
  struct Entry {
    uint8_t format;
    uint32_t page;
    uint64_t fence;  // 0 until the step that freed it closes
  };

  // Queues a page freed during the open step.
  void Push(uint8_t format, uint32_t page) { entries_.push_back({format, page, 0}); }

  // Closes the open step: its pages wait for `fence`.
  void CloseStep(uint64_t fence) {
    for (size_t i = open_begin_; i < entries_.size(); ++i) entries_[i].fence = fence;
    open_begin_ = entries_.size();
  }

  // Pops into `entry` the oldest closed page whose fence has passed. False when there is none:
  // fences complete in order, so it stops at the first that has not passed.
  template <typename Passed>
  bool PopPassed(Passed passed, Entry* entry) {
    if (open_begin_ == 0 || !passed(entries_.front().fence)) return false;
    *entry = entries_.front();
    entries_.pop_front();
    open_begin_ -= 1;
    return true;
  }

  // Pops the oldest page, closed or not, without waiting: for synchronous backends.
  bool PopAny(Entry* entry) {
    if (entries_.empty()) return false;
    *entry = entries_.front();
    entries_.pop_front();
    open_begin_ = open_begin_ > 0 ? open_begin_ - 1 : 0;
    return true;
  }

  size_t size() const { return entries_.size(); }
  const std::deque<Entry>& entries() const { return entries_; }

 private:
  std::deque<Entry> entries_;
  size_t open_begin_ = 0;  // entries before this index are closed
};

}  // namespace kvtier

#endif  // KVTIER_SRC_RECLAIM_QUEUE_H_
