#include "fusedops/core/registry.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include "fusedops/core/error.h"
#include "src/core/env.h"
#include "src/core/register_all.h"

namespace fusedops {

const char* direction_name(Direction dir) { return dir == Direction::kForward ? "fwd" : "bwd"; }

Registry& Registry::instance() {
  static Registry* registry = [] {
    auto* r = new Registry();
    register_all_backends(*r);
    return r;
  }();
  return *registry;
}

void Registry::add_entry(KernelEntry e) {
  for (const auto& other : entries_) {
    FUSEDOPS_REQUIRE(!(other.op == e.op && other.direction == e.direction &&
                       other.spec.id == e.spec.id),
                     kRuntime, e.op, "backend ", e.spec.id, " registered twice for ",
                     direction_name(e.direction));
  }
  entries_.push_back(std::move(e));
  std::stable_sort(entries_.begin(), entries_.end(), [](const KernelEntry& a, const KernelEntry& b) {
    return a.spec.priority > b.spec.priority;
  });
}

namespace {

// Why the entry cannot serve this device/dtype, or "" when it can.
std::string refusal(const KernelEntry& e, Device device, DType dtype) {
  if (e.spec.device != device.kind)
    return std::string("runs on ") + device_kind_name(e.spec.device) + ", not " +
           device_kind_name(device.kind);
  if (device.kind == DeviceKind::kCUDA) {
    int arch = cuda_arch(device.index);
    if (arch == 0) return "no CUDA device " + std::to_string(device.index) + " in this process";
    if (arch < e.spec.min_arch || arch > e.spec.max_arch)
      return "needs sm_" + std::to_string(e.spec.min_arch) + (e.spec.max_arch == INT_MAX ? "+" : "..sm_" + std::to_string(e.spec.max_arch)) +
             ", device is sm_" + std::to_string(arch);
  }
  if (std::find(e.spec.dtypes.begin(), e.spec.dtypes.end(), dtype) == e.spec.dtypes.end())
    return std::string("does not take ") + dtype_name(dtype);
  return "";
}

struct EnvOverride {
  std::string raw;
  std::map<std::string, std::string> per_op;
  std::string all;
};

}  // namespace

std::string env_backend_override(const std::string& op) {
  static std::mutex mu;
  static EnvOverride cache;
  std::string raw = env::text("FUSEDOPS_BACKEND");
  std::lock_guard<std::mutex> lock(mu);
  if (raw != cache.raw) {
    cache = EnvOverride{raw, {}, ""};
    size_t start = 0;
    while (start <= raw.size()) {
      size_t end = raw.find(',', start);
      if (end == std::string::npos) end = raw.size();
      std::string item = raw.substr(start, end - start);
      auto eq = item.find('=');
      if (eq == std::string::npos) {
        if (!item.empty()) cache.all = item;
      } else if (item.substr(0, eq) == "*") {
        cache.all = item.substr(eq + 1);
      } else {
        cache.per_op[item.substr(0, eq)] = item.substr(eq + 1);
      }
      start = end + 1;
    }
  }
  auto it = cache.per_op.find(op);
  return it != cache.per_op.end() ? it->second : cache.all;
}

const KernelEntry& Registry::select(const std::string& op, Direction dir, const Context& ctx,
                                    DType dtype, const void* args) const {
  std::string forced = ctx.backend.empty() ? env_backend_override(op) : ctx.backend;
  std::string reasons;
  bool any = false;
  for (const auto& e : entries_) {
    if (e.op != op || e.direction != dir) continue;
    any = true;
    if (!forced.empty() && e.spec.id != forced) continue;
    std::string why = refusal(e, ctx.device, dtype);
    if (why.empty() && !e.supports(args)) why = "does not support these arguments";
    if (why.empty()) return e;
    reasons += "; " + e.spec.id + ": " + why;
  }
  FUSEDOPS_REQUIRE(any, kRuntime, op, "no backend is registered for the ", direction_name(dir),
                   " direction");
  if (!forced.empty() && reasons.empty())
    FUSEDOPS_FAIL(kValue, op, "backend '", forced, "' is not registered for ", direction_name(dir),
                  " (forced by ", ctx.backend.empty() ? "FUSEDOPS_BACKEND" : "the context", ")");
  FUSEDOPS_FAIL(kRuntime, op, "no backend can run the ", direction_name(dir), " direction on ",
                to_string(ctx.device), " with ", dtype_name(dtype),
                forced.empty() ? "" : " (forced: " + forced + ")", reasons);
}

std::string Registry::preferred(const std::string& op, Direction dir, Device device,
                                DType dtype) const {
  std::string forced = env_backend_override(op);
  for (const auto& e : entries_) {
    if (e.op != op || e.direction != dir) continue;
    if (!forced.empty() && e.spec.id != forced) continue;
    if (refusal(e, device, dtype).empty()) return e.spec.id;
  }
  return "";
}

std::vector<BackendInfo> Registry::list(const std::string& op) const {
  std::vector<BackendInfo> out;
  for (const auto& e : entries_) {
    if (e.op != op) continue;
    bool runnable = true;
    if (e.spec.device == DeviceKind::kCUDA) {
      int arch = cuda_device_count() > 0 ? cuda_arch(0) : 0;
      runnable = arch != 0 && arch >= e.spec.min_arch && arch <= e.spec.max_arch;
    }
    out.push_back({e.op, e.direction, e.spec, runnable});
  }
  return out;
}

std::vector<std::string> Registry::ops() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    if (std::find(out.begin(), out.end(), e.op) == out.end()) out.push_back(e.op);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fusedops
