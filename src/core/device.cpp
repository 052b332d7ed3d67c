// Device queries. Compiled with the CUDA runtime when FUSEDOPS_WITH_CUDA is defined; the
// answers are cached so dispatch never queries the driver twice for the same device.
#include <mutex>
#include <vector>

#include "fusedops/core/registry.h"

#ifdef FUSEDOPS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace fusedops {

bool built_with_cuda() {
#ifdef FUSEDOPS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef FUSEDOPS_WITH_CUDA
  static int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device / no driver" error
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;
#endif
}

int cuda_arch(int device_index) {
#ifdef FUSEDOPS_WITH_CUDA
  static std::once_flag once;
  static std::vector<int> archs;
  std::call_once(once, [] {
    int n = cuda_device_count();
    archs.assign(n, 0);
    for (int d = 0; d < n; ++d) {
      int major = 0, minor = 0;
      if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) == cudaSuccess &&
          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d) == cudaSuccess)
        archs[d] = major * 10 + minor;
    }
  });
  if (device_index < 0 || device_index >= static_cast<int>(archs.size())) return 0;
  return archs[device_index];
#else
  (void)device_index;
  return 0;
#endif
}

}  // namespace fusedops
