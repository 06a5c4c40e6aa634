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

  // Pops, oldest first, closed pages whose fence has passed: release(entry) for each.
  // Stops at the first fence that has not passed (fences complete in order).
  template <typename Passed, typename Release>
  void Retire(Passed passed, Release release) {
    while (open_begin_ > 0 && passed(entries_.front().fence)) {
      release(entries_.front());
      entries_.pop_front();
      open_begin_ -= 1;
    }
  }

  // Pops every page, closed or open, without waiting: for synchronous backends.
  template <typename Release>
  void RetireAll(Release release) {
    for (const Entry& e : entries_) release(e);
    entries_.clear();
    open_begin_ = 0;
  }

  size_t size() const { return entries_.size(); }
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const Entry& e : entries_) fn(e);
  }

 private:
  std::deque<Entry> entries_;
  size_t open_begin_ = 0;  // entries before this index are closed
};

}  // namespace kvtier

#endif  // KVTIER_SRC_RECLAIM_QUEUE_H_
