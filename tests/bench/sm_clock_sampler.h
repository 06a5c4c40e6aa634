// The GPU's SM clock while a benchmark row is timed, from NVML, which the driver ships
// (libnvidia-ml.so.1, opened at run time: nothing to link, and a machine without it times rows
// as before, with no clock). A row bound by instruction issue (NVFP4 decode on the H200) runs
// slower when the board's power cap lowers the clock, as it does after seconds of heavy rows:
// the clock beside each row says whether two rows ran at the same speed of the chip.
// Thread-safety: Start/Stop from one thread; the sampling thread is internal.
#ifndef KVTIER_TESTS_BENCH_SM_CLOCK_SAMPLER_H_
#define KVTIER_TESTS_BENCH_SM_CLOCK_SAMPLER_H_

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

namespace kvtier {

// What the sampler saw between Start and Stop. samples == 0: no NVML, or no sample taken.
struct ClockWindow {
  int samples = 0;
  double mean_sm_mhz = 0;
  double capped_fraction = 0;  // of samples with a power or thermal clock limit active
};

class SmClockSampler {
 public:
  // Samples the GPU at PCI bus id `pci_bus_id` (cudaDeviceGetPCIBusId's form) every `period`.
  explicit SmClockSampler(const char* pci_bus_id,
                          std::chrono::microseconds period = std::chrono::microseconds(500)) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    const auto init = Symbol<int (*)()>("nvmlInit_v2");
    const auto by_bus = Symbol<int (*)(const char*, void**)>("nvmlDeviceGetHandleByPciBusId_v2");
    shutdown_ = Symbol<Shutdown>("nvmlShutdown");
    clock_ = Symbol<ClockInfo>("nvmlDeviceGetClockInfo");
    reasons_ = Symbol<Reasons>("nvmlDeviceGetCurrentClocksEventReasons");
    if (reasons_ == nullptr) {  // its name before NVML 12.2
      reasons_ = Symbol<Reasons>("nvmlDeviceGetCurrentClocksThrottleReasons");
    }
    if (init == nullptr || shutdown_ == nullptr || by_bus == nullptr || clock_ == nullptr ||
        reasons_ == nullptr || init() != 0) {
      return;
    }
    initialised_ = true;
    if (by_bus(pci_bus_id, &device_) != 0) return;
    thread_ = std::thread([this, period] {
      while (!quit_.load()) {
        if (active_.load()) Sample();
        std::this_thread::sleep_for(period);
      }
    });
  }
  ~SmClockSampler() {
    quit_.store(true);
    if (thread_.joinable()) thread_.join();
    if (initialised_) shutdown_();
  }
  SmClockSampler(const SmClockSampler&) = delete;
  SmClockSampler& operator=(const SmClockSampler&) = delete;

  // Whether clocks are sampled (NVML found and the device opened).
  bool available() const { return thread_.joinable(); }

  // Starts a window: the samples before it are dropped.
  void Start() {
    std::lock_guard<std::mutex> lock(mu_);
    samples_ = 0;
    sum_mhz_ = 0;
    capped_ = 0;
    active_.store(true);
  }
  // Ends the window and returns it.
  ClockWindow Stop() {
    active_.store(false);
    std::lock_guard<std::mutex> lock(mu_);
    ClockWindow w;
    w.samples = samples_;
    if (samples_ > 0) {
      w.mean_sm_mhz = sum_mhz_ / samples_;
      w.capped_fraction = static_cast<double>(capped_) / samples_;
    }
    return w;
  }

 private:
  // Power and thermal limits on the clock: SW power cap, HW slowdown, SW and HW thermal
  // slowdown, HW power brake (nvmlClocksEventReason* bits 0x4, 0x8, 0x20, 0x40, 0x80).
  static constexpr unsigned long long kCapReasons = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;
  static constexpr int kSmClock = 1;  // NVML_CLOCK_SM
  // NVML's functions used here (every one returns 0 on success).
  using Shutdown = int (*)();
  using ClockInfo = int (*)(void* device, int clock_type, unsigned* mhz);
  using Reasons = int (*)(void* device, unsigned long long* reasons);

  template <typename F>
  F Symbol(const char* name) const {
    return reinterpret_cast<F>(dlsym(lib_, name));
  }

  void Sample() {
    unsigned mhz = 0;
    unsigned long long reasons = 0;
    if (clock_(device_, kSmClock, &mhz) != 0 || reasons_(device_, &reasons) != 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    ++samples_;
    sum_mhz_ += mhz;
    capped_ += (reasons & kCapReasons) != 0;
  }

  void* lib_ = nullptr;  // left loaded until the process exits
  bool initialised_ = false;
  void* device_ = nullptr;
  Shutdown shutdown_ = nullptr;
  ClockInfo clock_ = nullptr;
  Reasons reasons_ = nullptr;
  std::thread thread_;
  std::atomic<bool> quit_{false}, active_{false};
  std::mutex mu_;
  int samples_ = 0;  // guarded by mu_, as are the sums below
  double sum_mhz_ = 0;
  int64_t capped_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_TESTS_BENCH_SM_CLOCK_SAMPLER_H_
