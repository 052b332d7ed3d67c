// The per-device bad-input record and the shared offsets check (see device_errors.cuh).
#include <cuda_runtime.h>

#include <atomic>

#include "src/cuda/device_errors.cuh"

namespace fusedops::cuda {
namespace {

// One record per device: each device's context holds its own copy of a __device__ variable.
__device__ DeviceErrorRecord g_record;

constexpr int kOffsetsThreads = 256;

__device__ __forceinline__ int64_t offset_at(const void* p, bool int64, int64_t i) {
  return int64 ? static_cast<const int64_t*>(p)[i]
               : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

__global__ void __launch_bounds__(kOffsetsThreads)
    check_offsets_kernel(DeviceErrorRecord* record, uint32_t code, const void* offsets,
                         bool int64, int64_t count, int64_t total) {
  // The smallest bad position: reported once, so that the message names the first bad entry.
  __shared__ unsigned long long first_bad;
  if (threadIdx.x == 0) first_bad = ~0ull;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    const int64_t v = offset_at(offsets, int64, i);
    bool bad = i == 0 ? v != 0 : v < offset_at(offsets, int64, i - 1);
    if (i == count - 1) bad = bad || v != total;
    if (bad) atomicMin(&first_bad, static_cast<unsigned long long>(i));
  }
  __syncthreads();
  if (threadIdx.x == 0 && first_bad != ~0ull) {
    const int64_t i = static_cast<int64_t>(first_bad);
    report_bad_input(record, code, i, offset_at(offsets, int64, i));
  }
}

}  // namespace

DeviceErrorRecord* device_error_record(const char* op, int device) {
  static std::atomic<DeviceErrorRecord*> cache[64];
  if (device >= 0 && device < 64) {
    DeviceErrorRecord* p = cache[device].load(std::memory_order_acquire);
    if (p != nullptr) return p;
  }
  DeviceGuard guard(op, device);
  void* p = nullptr;
  FUSEDOPS_CUDA_CHECK(op, cudaGetSymbolAddress(&p, g_record));
  if (device >= 0 && device < 64)
    cache[device].store(static_cast<DeviceErrorRecord*>(p), std::memory_order_release);
  return static_cast<DeviceErrorRecord*>(p);
}

void check_offsets(const char* op, uint32_t code, const void* offsets, bool int64, int64_t count,
                   int64_t total, cudaStream_t stream) {
  if (count <= 0) return;
  int device = 0;
  FUSEDOPS_CUDA_CHECK(op, cudaGetDevice(&device));
  check_offsets_kernel<<<1, kOffsetsThreads, 0, stream>>>(device_error_record(op, device), code,
                                                          offsets, int64, count, total);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

}  // namespace fusedops::cuda
