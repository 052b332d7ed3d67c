// Bad-input reports: the condition table, messages, the debug-checks switch and the host side
// of the per-device record (the record itself and the device code are in src/cuda/).
#include "fusedops/core/device_errors.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "fusedops/core/error.h"
#include "src/core/env.h"

#ifdef FUSEDOPS_WITH_CUDA
#include <cuda_runtime_api.h>

#include "src/cuda/device_errors.cuh"
#endif

namespace fusedops {
namespace {

struct Condition {
  std::string op, text;
};

std::mutex& table_mutex() {
  static std::mutex mu;
  return mu;
}
// Code c is entry c - 1.
std::vector<Condition>& table() {
  static std::vector<Condition> t;
  return t;
}

bool condition_of(uint32_t code, Condition* out) {
  std::lock_guard<std::mutex> lock(table_mutex());
  if (code == 0 || code > table().size()) return false;
  *out = table()[code - 1];
  return true;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

// The condition's text with {index} and {value} filled in, and the report count.
std::string report_text(const DeviceErrorRecord& r, const Condition& c) {
  std::string text = c.text;
  replace_all(text, "{index}", std::to_string(r.index));
  replace_all(text, "{value}", std::to_string(r.value));
  if (r.count > 1) text += " (" + std::to_string(r.count) + " reports; the first is shown)";
  return text;
}

Condition condition_or_unknown(uint32_t code) {
  Condition c;
  if (!condition_of(code, &c)) c = {"", "bad input (unknown report code " + std::to_string(code) + ")"};
  return c;
}

}  // namespace

uint32_t device_error_code(const char* op, const char* condition) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto& t = table();
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].op == op && t[i].text == condition) return static_cast<uint32_t>(i + 1);
  t.push_back({op, condition});
  return static_cast<uint32_t>(t.size());
}

std::string device_error_op(const DeviceErrorRecord& r) {
  Condition c;
  return condition_of(r.code, &c) ? c.op : std::string();
}

std::string describe_device_error(const DeviceErrorRecord& r) {
  if (r.code == 0 && r.count == 0) return "";
  const Condition c = condition_or_unknown(r.code);
  const std::string text = report_text(r, c);
  return c.op.empty() ? text : c.op + ": " + text;
}

bool debug_checks(const Context& ctx) {
  if (ctx.validate) return true;
  return env::flag("FUSEDOPS_CHECK_INDICES");
}

#ifdef FUSEDOPS_WITH_CUDA

void read_device_errors_async(const Context& ctx, DeviceErrorRecord* host) {
  if (ctx.device.kind != DeviceKind::kCUDA) return;
  constexpr const char* kOp = "read_device_errors";
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  DeviceErrorRecord* rec = cuda::device_error_record(kOp, ctx.device.index);
  FUSEDOPS_CUDA_CHECK(kOp, cudaMemcpyAsync(host, rec, sizeof(DeviceErrorRecord),
                                           cudaMemcpyDeviceToHost,
                                           static_cast<cudaStream_t>(ctx.stream)));
}

void clear_device_errors(const Context& ctx) {
  if (ctx.device.kind != DeviceKind::kCUDA) return;
  constexpr const char* kOp = "clear_device_errors";
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  DeviceErrorRecord* rec = cuda::device_error_record(kOp, ctx.device.index);
  FUSEDOPS_CUDA_CHECK(kOp, cudaMemsetAsync(rec, 0, sizeof(DeviceErrorRecord),
                                           static_cast<cudaStream_t>(ctx.stream)));
}

void check_device_errors(const Context& ctx) {
  if (ctx.device.kind != DeviceKind::kCUDA) return;
  constexpr const char* kOp = "check_device_errors";
  DeviceErrorRecord host;
  read_device_errors_async(ctx, &host);
  {
    cuda::DeviceGuard guard(kOp, ctx.device.index);
    FUSEDOPS_CUDA_CHECK(kOp, cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)));
  }
  if (host.code == 0 && host.count == 0) return;
  clear_device_errors(ctx);
  const Condition c = condition_or_unknown(host.code);
  FUSEDOPS_FAIL(kValue, c.op, report_text(host, c), " (reported by a kernel on ",
                to_string(ctx.device), ")");
}

#else

namespace {
void no_cuda(const Context& ctx, const char* what) {
  if (ctx.device.kind == DeviceKind::kCUDA)
    FUSEDOPS_FAIL(kRuntime, what, "this build of fusedops has no CUDA support");
}
}  // namespace

void read_device_errors_async(const Context& ctx, DeviceErrorRecord*) {
  no_cuda(ctx, "read_device_errors");
}
void clear_device_errors(const Context& ctx) { no_cuda(ctx, "clear_device_errors"); }
void check_device_errors(const Context& ctx) { no_cuda(ctx, "check_device_errors"); }

#endif

}  // namespace fusedops
