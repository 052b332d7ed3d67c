// CUDA error checks: every runtime call and every launch goes through these, and a failure
// becomes a fusedops::Error naming the op.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>

#include "fusedops/core/error.h"

#define FUSEDOPS_CUDA_CHECK(op, call)                                                        \
  do {                                                                                       \
    cudaError_t fusedops_err_ = (call);                                                      \
    if (fusedops_err_ != cudaSuccess)                                                        \
      FUSEDOPS_FAIL(kRuntime, op, "CUDA error ", cudaGetErrorName(fusedops_err_), " (",      \
                    cudaGetErrorString(fusedops_err_), ") in ", #call);                      \
  } while (0)

// After a <<<...>>> launch: catches bad configurations and launch failures (without syncing).
#define FUSEDOPS_CUDA_LAUNCH_CHECK(op) FUSEDOPS_CUDA_CHECK(op, cudaGetLastError())

namespace fusedops::cuda {

// Makes `device` current for the guard's lifetime and restores the previous device after.
class DeviceGuard {
 public:
  DeviceGuard(const char* op, int device) {
    FUSEDOPS_CUDA_CHECK(op, cudaGetDevice(&previous_));
    if (previous_ != device) FUSEDOPS_CUDA_CHECK(op, cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// A device attribute (at least 1), read once per device and cached (thread-safe).
template <cudaDeviceAttr kAttr>
int cached_attribute(const char* op, int device) {
  static std::atomic<int> cache[64];
  if (device >= 0 && device < 64) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int n = 0;
  FUSEDOPS_CUDA_CHECK(op, cudaDeviceGetAttribute(&n, kAttr, device));
  n = std::max(n, 1);
  if (device >= 0 && device < 64) cache[device].store(n, std::memory_order_relaxed);
  return n;
}

// The device's SM count: launch heuristics size grids by it.
inline int sm_count(const char* op, int device) {
  return cached_attribute<cudaDevAttrMultiProcessorCount>(op, device);
}

// The device's compute capability major version.
inline int cc_major(const char* op, int device) {
  return cached_attribute<cudaDevAttrComputeCapabilityMajor>(op, device);
}

}  // namespace fusedops::cuda
