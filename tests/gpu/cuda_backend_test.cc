// The CUDA backend itself: how it reports a missing device, the fast-codec self-check, slab
// mapping on the virtual-memory API, and fences (the backend's and Cache::RecordFence's).
#include "src/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "gtest/gtest.h"
#include "kvtier/cache.h"
#include "src/cuda/cuda_status.h"
#include "src/status_macros.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier::testing {
namespace {

constexpr size_t kSlab = size_t{2} << 20;

// A CUDA cache of one layer of one 16-dim head (16-token blocks) holding one sequence of one
// token, whose slot is `slots`.
struct OneSlot {
  std::unique_ptr<Cache> cache;
  SequenceId seq;
  std::vector<int64_t> slots;
};
absl::StatusOr<OneSlot> OneSlotCache() {
  Options o;
  o.backend = BackendKind::kCuda;
  o.geometry = Geometry{1, 1, 16, 16};
  OneSlot one;
  KVTIER_ASSIGN_OR_RETURN(one.cache, Cache::Create(o));
  KVTIER_ASSIGN_OR_RETURN(one.seq, one.cache->AddSequence());
  KVTIER_RETURN_IF_ERROR(one.cache->Append(one.seq, 1, &one.slots));
  return one;
}

TEST(CudaBackendTest, CreationWorksOrSaysWhyNot) {
  Options o;
  o.backend = BackendKind::kCuda;
  absl::StatusOr<std::unique_ptr<Cache>> cache = Cache::Create(o);
  if (GpuStatus().ok()) {
    EXPECT_TRUE(cache.ok()) << cache.status();
  } else {
    // A machine without a driver or device (CI): a clear status, no crash.
    ASSERT_FALSE(cache.ok());
    EXPECT_TRUE(cache.status().code() == absl::StatusCode::kUnavailable ||
                cache.status().code() == absl::StatusCode::kFailedPrecondition)
        << cache.status();
    EXPECT_FALSE(cache.status().message().empty());
  }
}

TEST(CudaBackendTest, FastCodecsPassTheirSelfCheck) {
  KVTIER_REQUIRE_GPU();
  const FastCodecCheck check = CudaBackend::fast_codec_check();
  if (!check.ran && std::getenv("KVTIER_CUDA_FAST_CODEC") != nullptr) {
    GTEST_SKIP() << "self-check skipped by KVTIER_CUDA_FAST_CODEC";
  }
  ASSERT_TRUE(check.ran);
  const char* const names[gpu::kSelfCheckCounters] = {"e4m3 encode", "e2m1 encode",
                                                       "fp16 decode", "e4m3 decode",
                                                       "e4m3 of p / 6", "division by e4m3",
                                                       "nvfp4 scope scales"};
  for (int i = 0; i < gpu::kSelfCheckCounters; ++i) {
    EXPECT_EQ(check.mismatches[i], 0u)
        << names[i] << ": first mismatch at input bits 0x" << std::hex << check.first_mismatch[i];
  }
  EXPECT_TRUE(check.passed);
}

TEST(CudaBackendTest, SlabsMapZeroFilledAndRecycle) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<CudaBackend>> made = CudaBackend::Create();
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& b = **made;
  absl::StatusOr<uint8_t*> base = b.Reserve(8 * kSlab);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(b.Reserve(kSlab + 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Map(*base + 4096, kSlab).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Unmap(*base, kSlab).code(), absl::StatusCode::kInvalidArgument);  // not mapped
  std::vector<uint8_t> host(kSlab);
  for (int round = 0; round < 3; ++round) {
    for (int s = 0; s < 8; ++s) ASSERT_TRUE(b.Map(*base + s * kSlab, kSlab).ok());
    for (int s = 0; s < 8; ++s) {
      // Fresh slabs read as zeros, even when their memory held data before.
      KVTIER_ASSERT_CUDA(cudaMemcpy(host.data(), *base + s * kSlab, kSlab, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < kSlab; i += 4093) ASSERT_EQ(host[i], 0) << "slab " << s;
      KVTIER_ASSERT_CUDA(cudaMemset(*base + s * kSlab, 0xA5, kSlab));
    }
    for (int s = 0; s < 8; ++s) ASSERT_TRUE(b.Unmap(*base + s * kSlab, kSlab).ok());
  }
  // Unreserve also releases slabs still mapped.
  ASSERT_TRUE(b.Map(*base + 3 * kSlab, kSlab).ok());
  b.Unreserve(*base, 8 * kSlab);
  absl::StatusOr<uint8_t*> again = b.Reserve(64 * kSlab);
  ASSERT_TRUE(again.ok()) << again.status();
  b.Unreserve(*again, 64 * kSlab);
  absl::StatusOr<uint64_t> fence = b.RecordFence();
  EXPECT_TRUE(fence.ok()) << fence.status();  // no error became sticky
}

// The driver's cuMemUnmap, reporting failure while g_fail_unmaps is set (after unmapping, so
// that the process is left clean).
std::atomic<bool> g_fail_unmaps{false};
PFN_cuMemUnmap_v10020 g_driver_unmap = nullptr;
CUresult UnmapThatFails(CUdeviceptr addr, size_t bytes) {
  const CUresult r = g_driver_unmap(addr, bytes);
  return g_fail_unmaps ? CUDA_ERROR_INVALID_VALUE : r;
}

// A deferred unmap that fails leaves the slab mapped where the pools believe it is not: the
// backend refuses every later call with that error (it had reported it once and then mapped
// the slab's allocation, still mapped, at another address).
TEST(CudaBackendTest, AFailedDeferredUnmapIsSticky) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<const DriverApi*> driver = GetDriverApi();
  ASSERT_TRUE(driver.ok()) << driver.status();
  DriverApi api = **driver;
  g_driver_unmap = api.cuMemUnmap;
  api.cuMemUnmap = UnmapThatFails;
  absl::StatusOr<std::unique_ptr<CudaBackend>> made = CudaBackend::CreateWithDriver(&api);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& b = **made;
  absl::StatusOr<uint8_t*> base = b.Reserve(2 * kSlab);
  ASSERT_TRUE(base.ok()) << base.status();
  ASSERT_TRUE(b.Map(*base, kSlab).ok());
  g_fail_unmaps = true;
  const absl::Status unmapped = b.Unmap(*base, kSlab);  // unmapped now or at the fence
  const absl::StatusOr<uint64_t> fence = b.RecordFence();
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(b.stream()));
  const absl::Status later = b.RecordFence().status();
  g_fail_unmaps = false;
  EXPECT_FALSE(unmapped.ok() && fence.ok() && later.ok());
  for (const absl::Status& s : {b.Map(*base + kSlab, kSlab), later}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("cuMemUnmap"), absl::string_view::npos) << s;
  }
  EXPECT_FALSE(b.FencePassed(b.NextFence()).ok());  // fences report it too
  b.Unreserve(*base, 2 * kSlab);
}

TEST(CudaBackendTest, FencesPassInOrder) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<CudaBackend>> made = CudaBackend::Create();
  ASSERT_TRUE(made.ok()) << made.status();
  CudaBackend& b = **made;
  EXPECT_FALSE(b.synchronous());
  std::vector<uint64_t> fences;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<uint64_t> f = b.RecordFence();
    ASSERT_TRUE(f.ok()) << f.status();
    if (!fences.empty()) {
      EXPECT_GT(*f, fences.back());
    }
    fences.push_back(*f);
  }
  EXPECT_FALSE(*b.FencePassed(fences.back() + 1));  // not recorded yet
  KVTIER_ASSERT_CUDA(cudaStreamSynchronize(b.stream()));
  EXPECT_TRUE(*b.FencePassed(fences[2]));
  EXPECT_TRUE(*b.FencePassed(fences[0]));  // older ones passed with it
  EXPECT_TRUE(*b.FencePassed(fences[4]));
}

TEST(CudaBackendTest, BadInputTypeIsRejected) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<OneSlot> one = OneSlotCache();
  ASSERT_TRUE(one.ok()) << one.status();
  Cache& cache = *one->cache;
  const std::vector<int64_t>& slots = one->slots;
  DeviceBuffer k(64), v(64);
  KVInput in{DType::kFloat32, k.data(), v.data(), 1, 1, 16};
  EXPECT_EQ(cache.WriteKV(0, slots, in).code(), absl::StatusCode::kInvalidArgument);
}

// Pools name the device they live on (views exported through DLPack carry it: a cache made on
// cuda:1 was exported as cuda:0), and K/V rows, loaded 16 bytes at a time, must start on a
// 16-byte boundary: one 8 bytes in is refused, nothing written.
TEST(CudaBackendTest, PoolsNameTheirDeviceAndUnalignedInputIsRefused) {
  KVTIER_REQUIRE_GPU();
  int devices = 0, device = -1;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices > 1) {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);  // where the old views said 0
  }
  absl::Cleanup back_to_0 = [] { cudaSetDevice(0); };
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  absl::StatusOr<OneSlot> one = OneSlotCache();
  ASSERT_TRUE(one.ok()) << one.status();
  Cache& cache = *one->cache;
  const std::vector<int64_t>& slots = one->slots;
  EXPECT_EQ(cache.GetPool(0, 0)->device_id, device);
  DeviceBuffer k(64), v(64);
  ASSERT_EQ(cudaMemset(k.data(), 0, 64), cudaSuccess);
  ASSERT_EQ(cudaMemset(v.data(), 0, 64), cudaSuccess);
  KVInput in{DType::kFloat16, k.data(), v.data(), 1, 1, 16};
  in.k = static_cast<const char*>(k.data()) + 8;
  const absl::Status refused = cache.WriteKV(0, slots, in);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("16-byte aligned"), absl::string_view::npos) << refused;
  in.k = k.data();
  EXPECT_TRUE(cache.WriteKV(0, slots, in).ok());
}

// Cache::RecordFence covers WriteKV's copy: held behind a host function on the legacy default
// stream (which the cache's blocking stream waits for), the copy has not run and the fence has
// not passed; once released, the fence passes and the rows are the input's. Warmed up first (a
// write into each of the backend's 8 staging buffers), so that no first use blocks the host
// while the stream is held; every wait is bounded, the host function's too.
TEST(CudaBackendTest, RecordFencePassesOnceWriteKVHasReadItsInput) {
  KVTIER_REQUIRE_GPU();
  absl::StatusOr<OneSlot> one = OneSlotCache();
  ASSERT_TRUE(one.ok()) << one.status();
  Cache& cache = *one->cache;
  const std::vector<int64_t>& slots = one->slots;
  std::vector<uint16_t> rows(16);
  for (int i = 0; i < 16; ++i) rows[i] = codec::FloatToHalf(0.25f * static_cast<float>(i + 1));
  DeviceBuffer k, v, zeros(32);
  k.Upload(rows);
  v.Upload(rows);
  KVTIER_ASSERT_CUDA(cudaMemset(zeros.data(), 0, 32));
  const KVInput zero_in{DType::kFloat16, zeros.data(), zeros.data(), 1, 1, 16};
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(cache.WriteKV(0, slots, zero_in).ok());
  KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());

  struct Hold {
    std::atomic<bool> release{false}, timed_out{false};
  } hold;
  const auto wait = [](void* arg) {
    Hold& h = *static_cast<Hold*>(arg);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!h.release.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        h.timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  };
  KVTIER_ASSERT_CUDA(cudaLaunchHostFunc(cudaStreamLegacy, wait, &hold));
  absl::Cleanup released = [&] {
    hold.release = true;
    cudaDeviceSynchronize();
  };
  ASSERT_TRUE(cache.WriteKV(0, slots, {DType::kFloat16, k.data(), v.data(), 1, 1, 16}).ok());
  const absl::StatusOr<uint64_t> fence = cache.RecordFence();
  ASSERT_TRUE(fence.ok()) << fence.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(cache.FencePassed(*fence).value());
  hold.release = true;
  KVTIER_ASSERT_CUDA(cudaDeviceSynchronize());
  EXPECT_FALSE(hold.timed_out) << "the host was blocked while the stream was held";
  EXPECT_TRUE(cache.FencePassed(*fence).value());
  std::vector<float> kf(16), vf(16);
  ASSERT_TRUE(cache.ReadKV(one->seq, 0, absl::MakeSpan(kf), absl::MakeSpan(vf)).ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(kf[i], 0.25f * static_cast<float>(i + 1)) << i;
    EXPECT_EQ(vf[i], kf[i]) << i;
  }
  const absl::StatusOr<uint64_t> next = cache.RecordFence();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_GT(*next, *fence);
}

}  // namespace
}  // namespace kvtier::testing
