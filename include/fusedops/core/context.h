// Context: where and how one call runs.
#pragma once

#include <string>

#include "fusedops/core/dtype.h"

namespace fusedops {

struct Context {
  // Device every tensor argument must live on.
  Device device = Device::cpu();
  // cudaStream_t to launch on (nullptr = the legacy default stream); ignored on CPU.
  void* stream = nullptr;
  // Backward kernels are deterministic (bitwise reproducible) unless this is cleared.
  bool deterministic = true;
  // Forces a backend id ("ref", "cpu", "cuda_sm80", "cuda_sm90") for this call; empty = the
  // FUSEDOPS_BACKEND environment override, else the highest-priority backend that fits.
  std::string backend;
  // Run checks that need to read tensor contents (label ranges, offsets); may synchronize.
  bool validate = false;

  static Context cpu() { return Context{}; }
  static Context cuda(int index = 0, void* stream = nullptr) {
    Context c;
    c.device = Device::cuda(index);
    c.stream = stream;
    return c;
  }
};

// ctx with its backend forced to `backend` (a registry id): the `_ref` entry points force "ref",
// and a top level forces its own backend on every sub-operator it calls.
inline Context with_backend(const Context& ctx, const char* backend) {
  Context c = ctx;
  c.backend = backend;
  return c;
}

}  // namespace fusedops
