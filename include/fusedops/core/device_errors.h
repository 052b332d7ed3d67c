// Bad-input reports from device code, and the debug-checks switch.
//
// On the CPU every operator checks the contents of its index, offset and label tensors before
// any work and raises a fusedops::Error. On CUDA that would need a device-to-host copy and a
// synchronisation per call, so kernels check the values they read instead: a bad value is
// clamped or skipped (it never causes an access out of bounds; each operator documents the
// result it then gives) and reported into one record per device, kept in the library's own
// `__device__` memory (no allocation). The record keeps the first report (a condition code, the
// position and the value) and counts all of them; it is read back
//   - asynchronously: read_device_errors_async() copies it to host memory on a stream (no
//     synchronisation; the Python layer does this every few calls and raises at a later call);
//   - synchronously: check_device_errors() (fusedops.check_errors() in Python), and after every
//     CUDA call when debug checks are on (Context::validate or FUSEDOPS_CHECK_INDICES=1): then
//     the operators also copy their index tensors to the host and check them before the launch,
//     so the error is raised by the call that got the bad input, with the host-side message.
#pragma once

#include <cstdint>
#include <string>

#include "fusedops/core/context.h"

namespace fusedops {

// The per-device record. Written only by device code (report_bad_input in
// src/cuda/device_errors.cuh) and cleared by clear_device_errors().
struct DeviceErrorRecord {
  uint32_t code = 0;  // condition of the first report (device_error_code); 0: no report
  uint32_t reserved = 0;
  int64_t index = 0;   // where the first report was made (e.g. the row), as the condition says
  int64_t value = 0;   // the offending value
  uint64_t count = 0;  // reports since the last clear
};
static_assert(sizeof(DeviceErrorRecord) == 32, "DeviceErrorRecord is copied as 32 bytes");

// The code (>= 1) of a condition a kernel can report, registered on first use (thread-safe; the
// same (op, condition) gives the same code). `condition` may name the report's position and
// value as {index} and {value}, e.g. "labels[{index}] = {value} is outside [0, V)".
uint32_t device_error_code(const char* op, const char* condition);

// "op: condition (with {index}/{value} filled in; N reports)", or "" when the record is clear.
std::string describe_device_error(const DeviceErrorRecord& record);
// The operator name of a report ("" when clear or unknown).
std::string device_error_op(const DeviceErrorRecord& record);

// Whether the calls of this context run the debug checks: ctx.validate, or the environment
// variable FUSEDOPS_CHECK_INDICES set to a value other than "" and "0" (read at every call).
bool debug_checks(const Context& ctx);

// CUDA contexts only (on a CPU context these do nothing; in a build without CUDA they raise):
// Enqueues a copy of ctx.device's record into `host` on ctx.stream; no synchronisation (`host`
// should be pinned memory for the copy to be asynchronous). The caller waits for the stream
// (e.g. with an event) before reading `host`.
void read_device_errors_async(const Context& ctx, DeviceErrorRecord* host);
// Enqueues clearing ctx.device's record on ctx.stream.
void clear_device_errors(const Context& ctx);
// Reads the record (synchronising ctx.stream), clears it, and throws a kValue Error naming the
// reporting operator when it holds a report.
void check_device_errors(const Context& ctx);

}  // namespace fusedops
