// An out-of-memory from the CUDA driver under a live cache: device memory is filled with
// cudaMalloc until it fails, then the cache needs a new slab. The Append must fail with a
// clear Status (ResourceExhausted from cuMemCreate), leave the cache consistent and unchanged,
// keep the K/V written before, and work again once memory is freed. And the backend's Map,
// with memory full, waits for slabs whose unmap is pending. docs/reliability.md.
#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/stats_diff.h"
#include "tests/test_util.h"

namespace kvtier::testing {
namespace {

// Holds every byte of device memory cudaMalloc will give, in chunks down to 2 MiB.
class DeviceFiller {
 public:
  DeviceFiller() {
    for (size_t chunk = size_t{1} << 30; chunk >= (size_t{2} << 20); chunk /= 2) {
      void* p = nullptr;
      while (cudaMalloc(&p, chunk) == cudaSuccess) chunks_.push_back(p);
      cudaGetLastError();  // clear the allocation error
    }
  }
  ~DeviceFiller() {
    for (void* p : chunks_) cudaFree(p);
  }
  size_t chunks() const { return chunks_.size(); }

 private:
  std::vector<void*> chunks_;
};

TEST(CudaOomTest, DriverOutOfMemoryIsAStatusThatChangesNothing) {
  KVTIER_REQUIRE_GPU();
  Options o;
  o.backend = BackendKind::kCuda;
  o.geometry = Geometry{2, 8, 128, 16};  // FP16 pages of 64 KiB: 32 per slab
  o.memory_budget_bytes = size_t{1} << 30;
  absl::StatusOr<std::unique_ptr<Cache>> made = Cache::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  Cache& cache = **made;

  const SequenceId seq = *cache.AddSequence();
  std::vector<int64_t> slots;
  ASSERT_TRUE(cache.Append(seq, 40, &slots).ok());  // one slab per layer mapped
  const size_t elems = size_t{40} * 8 * 128;
  const std::vector<uint16_t> k = RandomHalves(elems, 1), v = RandomHalves(elems, 2);
  DeviceBuffer dk, dv;
  dk.Upload(k);
  dv.Upload(v);
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(cache.WriteKV(l, slots, {DType::kFloat16, dk.data(), dv.data(), 40, 8, 128}).ok());
  }
  ASSERT_TRUE(cache.EndStep().ok());
  const CacheStats before = cache.GetStats();

  {
    DeviceFiller filler;
    ASSERT_GT(filler.chunks(), 0u);
    std::vector<int64_t> more;
    const absl::Status s = cache.Append(seq, 16 * 200, &more);  // needs new slabs
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_FALSE(s.message().empty());
    EXPECT_TRUE(more.empty());
    EXPECT_EQ(StateDifference(before, cache.GetStats()), "");
    EXPECT_TRUE(cache.CheckConsistency().ok()) << cache.CheckConsistency();
  }

  // Memory back: the K/V written before is intact and the cache grows again.
  const size_t n = size_t{40} * 8 * 128;
  std::vector<float> rk(n), rv(n);
  ASSERT_TRUE(cache.ReadKV(seq, 1, absl::MakeSpan(rk), absl::MakeSpan(rv)).ok());
  for (size_t i = 0; i < n; i += 97) {
    ASSERT_EQ(rk[i], codec::HalfToFloat(k[i])) << i;
    ASSERT_EQ(rv[i], codec::HalfToFloat(v[i])) << i;
  }
  std::vector<int64_t> more;
  EXPECT_TRUE(cache.Append(seq, 16 * 200, &more).ok());
  EXPECT_TRUE(cache.CheckConsistency().ok());
}

// A slab unmapped under device work keeps its memory until that work completes: a Map that
// finds device memory full waits for it (the pools had already counted it free, so a new slab
// of another format failed with memory to spare).
TEST(CudaOomTest, AMapWaitsForPendingUnmapsWhenMemoryIsFull) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<CudaBackend>> made = CudaBackend::Create();
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& b = **made;
  constexpr size_t kSlab = size_t{2} << 20;
  absl::StatusOr<uint8_t*> base = b.Reserve(2 * kSlab);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(b.Map(*base, kSlab).ok());
  {
    DeviceFiller filler;
    ASSERT_GT(filler.chunks(), 0u);
    // The stream is held for 300 ms, so the unmap stays pending.
    KVTIER_ASSERT_CUDA(cudaLaunchHostFunc(
        b.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
        nullptr));
    ASSERT_TRUE(b.Unmap(*base, kSlab).ok());
    const absl::Status s = b.Map(*base + kSlab, kSlab);
    EXPECT_TRUE(s.ok()) << s;
  }
  b.Unreserve(*base, 2 * kSlab);
  EXPECT_TRUE(b.RecordFence().ok());  // nothing became sticky
}

}  // namespace
}  // namespace kvtier::testing
