// CPU emulation of the CUDA features the cuda_sm80 GDN and KDA kernels use (see the build.sh of
// each family). Test aid only.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* g_emu_bar = nullptr;
inline std::vector<unsigned char> g_emu_smem;
inline void __syncthreads() { g_emu_bar->arrive_and_wait(); }
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
template <class T, class U>
inline auto min(T a, U b) { return a < b ? a : b; }
typedef void* cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#ifndef EMU_OPTIN
#define EMU_OPTIN (227 * 1024)
#endif
inline size_t g_emu_optin = EMU_OPTIN;
inline size_t g_emu_allowed = 48 * 1024;
inline int cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = (int)g_emu_optin; return 0; }
inline int cudaFuncSetAttribute(const void*, cudaFuncAttribute, int bytes) { g_emu_allowed = std::max<size_t>(g_emu_allowed, bytes); return 0; }
inline int cudaGetLastError() { return 0; }
inline const char* cudaGetErrorName(int) { return "emu"; }
inline const char* cudaGetErrorString(int) { return "emu"; }
inline long g_emu_blocks = 0;
template <class K, class... A>
void emu_launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t, A... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0) throw std::runtime_error("emu: empty launch");
  if (grid.y > 65535 || grid.z > 65535 || block.x > 1024) throw std::runtime_error("emu: bad launch");
  if (smem > g_emu_allowed) throw std::runtime_error("emu: dynamic smem above the allowed limit");
  if (smem > 163 * 1024) fprintf(stderr, "emu: note: %zu bytes dynamic smem (> A100 limit)\n", smem);
  blockDim = block;
  gridDim = grid;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        ++g_emu_blocks;
        g_emu_smem.assign(smem + 16, 0);
        float nanv = std::numeric_limits<float>::quiet_NaN();
        for (size_t i = 0; i + 4 <= smem; i += 4) memcpy(&g_emu_smem[i], &nanv, 4);
        std::barrier<> bar(block.x);
        g_emu_bar = &bar;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < block.x; ++t)
          th.emplace_back([&, t] {
            threadIdx = dim3(t, 0, 0);
            blockIdx = dim3(bx, by, bz);
            kernel(args...);
          });
        for (auto& x : th) x.join();
      }
}
