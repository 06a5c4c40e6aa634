// How calls that enqueue device work (decode attention, the prepared append) launch it on the
// CUDA backend; the CPU backend ignores it.
#ifndef KVTIER_DEVICE_LAUNCH_H_
#define KVTIER_DEVICE_LAUNCH_H_

namespace kvtier {

struct DeviceLaunch {
  void* stream = nullptr;    // a cudaStream_t. Default: the legacy default stream
  bool synchronize = false;  // wait for the work to finish. Default: return once enqueued
};

}  // namespace kvtier

#endif  // KVTIER_DEVICE_LAUNCH_H_
