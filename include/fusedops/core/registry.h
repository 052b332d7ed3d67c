// The backend registry (docs/design.md section 4). One entry per (op, direction, backend); a call
// picks the highest-priority entry that fits the device, its compute capability, the dtype and
// the arguments, unless a backend is forced by Context::backend or FUSEDOPS_BACKEND.
#pragma once

#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "fusedops/core/context.h"
#include "fusedops/core/device_errors.h"
#include "fusedops/core/dtype.h"
#include "fusedops/core/trace.h"

namespace fusedops {

enum class Direction : uint8_t { kForward, kBackward };
const char* direction_name(Direction dir);

// Conventional priorities: a faster backend gets a larger number.
inline constexpr int kPriorityRef = 0;
inline constexpr int kPriorityCpu = 10;
inline constexpr int kPriorityCudaSm80 = 20;
inline constexpr int kPriorityCudaSm90 = 30;

struct BackendSpec {
  std::string id;  // "ref", "cpu", "cuda_sm80", "cuda_sm90"
  DeviceKind device = DeviceKind::kCPU;
  int min_arch = 0;        // CUDA compute capability x10 (80 = sm_80); ignored on CPU
  int max_arch = INT_MAX;  // inclusive
  std::vector<DType> dtypes;  // dtypes of the op's key tensor this backend accepts
  int priority = 0;
};

struct KernelEntry {
  std::string op;
  Direction direction = Direction::kForward;
  BackendSpec spec;
  // Type-erased predicate and runner; args points at the op's Args struct.
  std::function<bool(const void* args)> supports;
  std::function<void(const Context& ctx, const void* args)> run;
};

// What `fusedops.backends(op)` shows.
struct BackendInfo {
  std::string op;
  Direction direction;
  BackendSpec spec;
  bool runnable_here;  // the device kind and arch exist in this process
};

class Registry {
 public:
  // The process-wide registry, filled on first use by register_all_backends().
  static Registry& instance();

  template <class Args>
  void add(const std::string& op, Direction dir, BackendSpec spec,
           bool (*supports)(const Args&), void (*run)(const Context&, const Args&)) {
    KernelEntry e;
    e.op = op;
    e.direction = dir;
    e.spec = std::move(spec);
    e.supports = [supports](const void* a) {
      return supports == nullptr || supports(*static_cast<const Args*>(a));
    };
    e.run = [run](const Context& c, const void* a) { run(c, *static_cast<const Args*>(a)); };
    add_entry(std::move(e));
  }

  // Picks the entry for this call, or throws an Error that says why each candidate was refused.
  const KernelEntry& select(const std::string& op, Direction dir, const Context& ctx, DType dtype,
                            const void* args) const;
  // The backend id that would be chosen for (op, dir) on device/dtype, ignoring supports();
  // empty when none fits.
  std::string preferred(const std::string& op, Direction dir, Device device, DType dtype) const;
  std::vector<BackendInfo> list(const std::string& op) const;
  std::vector<std::string> ops() const;

 private:
  void add_entry(KernelEntry e);
  std::vector<KernelEntry> entries_;
};

// Backend forced for `op` by the FUSEDOPS_BACKEND environment variable, "" if none.
// Syntax: "op=backend,op2=backend" or "backend" (every op); "*=backend" also means every op.
std::string env_backend_override(const std::string& op);

// Selects and runs the backend for one call (recorded by a dispatch trace, see trace.h). With
// debug checks on (debug_checks(ctx)), a CUDA call then waits for its kernels and raises what
// they reported (device_errors.h).
template <class Args>
void dispatch(const char* op, Direction dir, const Context& ctx, DType dtype, const Args& args) {
  const KernelEntry& entry = Registry::instance().select(op, dir, ctx, dtype, &args);
  TraceScope trace(op, direction_name(dir), entry.spec.id);
  entry.run(ctx, &args);
  if (ctx.device.kind == DeviceKind::kCUDA && debug_checks(ctx)) check_device_errors(ctx);
}

// Compute capability x10 of a CUDA device (cached per device), 0 when CUDA is unavailable.
int cuda_arch(int device_index);
// Number of CUDA devices visible (0 when built without CUDA or no driver/device).
int cuda_device_count();
bool built_with_cuda();

}  // namespace fusedops
