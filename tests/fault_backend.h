// A Backend for tests that forwards to the CPU backend and fails on demand: slab mapping,
// the data plane, fences that never pass. The test keeps a pointer to the shared Faults and
// changes them between calls. Like the CUDA backend, it refuses to map a slab that is still
// mapped (a failed Unmap leaves it so).
//
// Thread-compatible, like every Backend (the cache calls it under its mutex).
#ifndef KVTIER_TESTS_FAULT_BACKEND_H_
#define KVTIER_TESTS_FAULT_BACKEND_H_

#include <cstdint>
#include <memory>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "src/backend.h"

namespace kvtier::testing {

struct Faults {
  // Map calls that still succeed; every later one fails. -1: none fails.
  int64_t maps_before_failure = -1;
  bool fail_unmap = false;
  // Unmap calls that still succeed; every later one fails. -1: none fails.
  int64_t unmaps_before_failure = -1;
  bool fail_write_rows = false;
  bool fail_read_page = false;
  bool fail_requantize = false;
  // Requantize calls that still succeed; every later one fails. -1: none fails.
  int64_t requantizes_before_failure = -1;
  bool fail_copy_page = false;
  bool fail_copy_pages = false;  // copies between the tiers
  bool fail_record_fence = false;
  // Report an asynchronous backend, whose fences pass only when `fences_pass` is set.
  bool asynchronous = false;
  bool fences_pass = true;
  // FencePassed reports a device error, as the CUDA backend does after a fault on its stream.
  bool fail_fence_query = false;
  // Calls that failed because of a fault above.
  int64_t injected = 0;
  // Calls made (whether they failed or not).
  int64_t copy_pages_calls = 0;
  int64_t fences_recorded = 0;
};

class FaultBackend final : public Backend {
 public:
  explicit FaultBackend(std::shared_ptr<Faults> faults)
      : cpu_(MakeCpuBackend()), faults_(std::move(faults)) {}

  absl::StatusOr<uint8_t*> Reserve(size_t bytes) override { return cpu_->Reserve(bytes); }
  void Unreserve(uint8_t* base, size_t bytes) override { cpu_->Unreserve(base, bytes); }
  absl::Status Map(uint8_t* addr, size_t bytes) override {
    if (faults_->maps_before_failure == 0) {  // as the CPU and CUDA backends report it
      return Injected("Map", absl::StatusCode::kResourceExhausted);
    }
    if (faults_->maps_before_failure > 0) faults_->maps_before_failure -= 1;
    if (mapped_.count(addr) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("slab at ", reinterpret_cast<uintptr_t>(addr), " is mapped already"));
    }
    absl::Status s = cpu_->Map(addr, bytes);
    if (s.ok()) mapped_.insert(addr);
    return s;
  }
  absl::Status Unmap(uint8_t* addr, size_t bytes) override {
    if (faults_->fail_unmap || faults_->unmaps_before_failure == 0) return Injected("Unmap");
    if (faults_->unmaps_before_failure > 0) faults_->unmaps_before_failure -= 1;
    mapped_.erase(addr);
    return cpu_->Unmap(addr, bytes);
  }
  absl::Status WriteRows(const PoolView& pool, absl::Span<const int64_t> slots, const KVInput& kv,
                         int64_t* nonfinite) override {
    if (faults_->fail_write_rows) return Injected("WriteRows");
    return cpu_->WriteRows(pool, slots, kv, nonfinite);
  }
  absl::Status ReadPage(const PoolView& pool, uint32_t page, int num_tokens, float* k,
                        float* v) override {
    if (faults_->fail_read_page) return Injected("ReadPage");
    return cpu_->ReadPage(pool, page, num_tokens, k, v);
  }
  absl::Status Requantize(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                          absl::Span<const uint32_t> src_pages,
                          absl::Span<const uint32_t> dst_pages) override {
    if (faults_->fail_requantize || faults_->requantizes_before_failure == 0) {
      return Injected("Requantize");
    }
    if (faults_->requantizes_before_failure > 0) faults_->requantizes_before_failure -= 1;
    return cpu_->Requantize(from, to, src_pages, dst_pages);
  }
  absl::Status CopyPage(const PoolView& pool, uint32_t src, uint32_t dst) override {
    if (faults_->fail_copy_page) return Injected("CopyPage");
    return cpu_->CopyPage(pool, src, dst);
  }
  absl::StatusOr<uint8_t*> ReserveHost(size_t bytes) override { return cpu_->ReserveHost(bytes); }
  void UnreserveHost(uint8_t* base, size_t bytes) override { cpu_->UnreserveHost(base, bytes); }
  absl::Status MapHost(uint8_t* addr, size_t bytes) override { return cpu_->MapHost(addr, bytes); }
  absl::Status UnmapHost(uint8_t* addr, size_t bytes) override {
    return cpu_->UnmapHost(addr, bytes);
  }
  absl::Status CopyPages(absl::Span<const PoolView> from, absl::Span<const PoolView> to,
                         absl::Span<const uint32_t> src_pages,
                         absl::Span<const uint32_t> dst_pages) override {
    faults_->copy_pages_calls += 1;
    if (faults_->fail_copy_pages) return Injected("CopyPages");
    return cpu_->CopyPages(from, to, src_pages, dst_pages);
  }
  bool synchronous() const override { return !faults_->asynchronous; }
  absl::StatusOr<uint64_t> RecordFence() override {
    faults_->fences_recorded += 1;
    if (faults_->fail_record_fence) return Injected("RecordFence");
    return ++fences_;
  }
  // As on a GPU, a fence not recorded yet has not passed.
  absl::StatusOr<bool> FencePassed(uint64_t fence) override {
    if (faults_->fail_fence_query) return Injected("FencePassed");
    return faults_->fences_pass && fence <= fences_;
  }
  uint64_t NextFence() const override { return fences_ + 1; }

 private:
  absl::Status Injected(const char* call, absl::StatusCode code = absl::StatusCode::kInternal) {
    faults_->injected += 1;
    return absl::Status(code, absl::StrCat("injected fault: ", call, " failed"));
  }

  const std::unique_ptr<Backend> cpu_;
  const std::shared_ptr<Faults> faults_;
  uint64_t fences_ = 0;
  std::set<uint8_t*> mapped_;  // device slabs mapped now
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_FAULT_BACKEND_H_
