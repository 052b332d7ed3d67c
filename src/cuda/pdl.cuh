// Programmatic dependent launch (PDL, sm_90 and later). A grid launched by launch_pdl may become
// resident while the grid before it in the stream is still running: once every block of that
// grid has called allow_dependent_grid() (or exited). Before it touches any memory the earlier
// grid reads or writes, it must call wait_prior_grid(), which returns when that grid has
// completed and its writes are visible. Both are no-ops below sm_90 and in a grid launched
// without PDL, so a kernel may call them unconditionally.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "src/cuda/check.cuh"  // cc_major, FUSEDOPS_CUDA_CHECK

namespace fusedops::cuda {

__device__ __forceinline__ void wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL on sm_90 and later.
template <class... KernelArgs, class... Args>
void launch_pdl(const char* op, int device, void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cc_major(op, device) >= 9 ? 1 : 0;
  FUSEDOPS_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

}  // namespace fusedops::cuda
