// Device side of the bad-input reports (fusedops/core/device_errors.h): the per-device record
// that kernels report into, and shared checks of index tensors.
//
// A kernel that reads an index, offset or label takes the record pointer as a parameter
// (device_error_record(op, device) on the host, cached) and the condition's code
// (device_error_code(op, text), registered once per launcher in a function-local static), and
// on a bad value keeps its accesses in bounds (clamp or skip, as the operator documents) and
// calls report_bad_input. Reporting costs nothing on good input.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fusedops/core/device_errors.h"
#include "src/cuda/check.cuh"

namespace fusedops::cuda {

// ctx.device's record in device memory (the library's own __device__ variable, so no
// allocation); cached per device. Callable from host code compiled by any compiler.
DeviceErrorRecord* device_error_record(const char* op, int device);

// Launches one block that checks offsets [count] (int32 or int64, contiguous) on the device:
// offsets[0] == 0, non-decreasing, offsets[count-1] == total. The first bad entry is reported
// with `code` (index = its position, value = its value). Nothing when count == 0. Asynchronous.
void check_offsets(const char* op, uint32_t code, const void* offsets, bool int64, int64_t count,
                   int64_t total, cudaStream_t stream);

#ifdef __CUDACC__
// Records one report: the first report since the last clear keeps its code, index and value;
// every report counts. Safe from any thread of any kernel.
__device__ __forceinline__ void report_bad_input(DeviceErrorRecord* record, uint32_t code,
                                                 int64_t index, int64_t value) {
  if (record == nullptr) return;
  if (atomicCAS(&record->code, 0u, code) == 0u) {
    record->index = index;
    record->value = value;
  }
  atomicAdd(reinterpret_cast<unsigned long long*>(&record->count), 1ull);
}
#endif

}  // namespace fusedops::cuda
