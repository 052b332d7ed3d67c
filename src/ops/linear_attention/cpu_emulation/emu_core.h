// CPU emulation of the CUDA features the GDN and KDA kernels use (see build.sh). Test aid only.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>
#include <algorithm>
#include <stdexcept>

#include "src/core/half.h"
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
inline std::barrier<>* g_emu_bar = nullptr;
// Warp collectives (mma.sync): each warp's barrier and operand scratch, per CUDA thread.
struct EmuWarp {
  std::unique_ptr<std::barrier<>> bar;
  float a[32][4], b[32][2];
  uint32_t u[32][8];
  const void* ptr[32];
  float f[32];
};
inline thread_local EmuWarp* g_emu_warp = nullptr;
inline std::vector<unsigned char> g_emu_smem;
inline void __syncthreads() { g_emu_bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// Blocks run one at a time, so one flag serves; the third barrier keeps the reset before any
// thread's next call.
inline int g_emu_or = 0;
inline int __syncthreads_or(int p) {
  if (p) __atomic_store_n(&g_emu_or, 1, __ATOMIC_SEQ_CST);
  __syncthreads();
  const int r = __atomic_load_n(&g_emu_or, __ATOMIC_SEQ_CST);
  __syncthreads();
  if (threadIdx.x == 0) __atomic_store_n(&g_emu_or, 0, __ATOMIC_SEQ_CST);
  __syncthreads();
  return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { g_emu_warp->bar->arrive_and_wait(); }
// shfl.sync.bfly for a full warp (every lane calls): lane l gets lane (l ^ m)'s value.
inline float __shfl_xor_sync(unsigned, float v, int m) {
  EmuWarp& w = *g_emu_warp;
  const int lane = threadIdx.x % 32;
  w.f[lane] = v;
  w.bar->arrive_and_wait();
  const float r = w.f[lane ^ m];
  w.bar->arrive_and_wait();
  return r;
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
template <class T, class U>
inline auto min(T a, U b) { return a < b ? a : b; }
typedef void* cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
#ifndef EMU_OPTIN
#define EMU_OPTIN (227 * 1024)
#endif
inline size_t g_emu_optin = EMU_OPTIN;
inline size_t g_emu_allowed = 48 * 1024;
// The multiprocessor count is EMU_SMS from the environment (default 1), so that a test run can
// pick the launch shapes the kernels choose by occupancy.
inline int cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  const char* sms = std::getenv("EMU_SMS");
  *v = a == cudaDevAttrMultiProcessorCount ? (sms ? std::atoi(sms) : 1) : (int)g_emu_optin;
  return 0;
}
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
        std::vector<std::unique_ptr<EmuWarp>> warps;
        for (unsigned w = 0; w * 32 < block.x; ++w) {
          warps.push_back(std::make_unique<EmuWarp>());
          warps.back()->bar = std::make_unique<std::barrier<>>(std::min(32u, block.x - 32 * w));
        }
        std::vector<std::thread> th;
        for (unsigned t = 0; t < block.x; ++t)
          th.emplace_back([&, t] {
            threadIdx = dim3(t, 0, 0);
            g_emu_warp = warps[t / 32].get();
            blockIdx = dim3(bx, by, bz);
            kernel(args...);
          });
        for (auto& x : th) x.join();
      }
}

// Vector types and the 16-bit pair conversions of cuda_bf16.h / cuda_fp16.h the kernels use.
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct __nv_bfloat162 { fusedops::bf16_t x, y; };
struct __half2 { fusedops::fp16_t x, y; };
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {fusedops::to_float(v.x), fusedops::to_float(v.y)}; }
inline float2 __half22float2(__half2 v) { return {fusedops::to_float(v.x), fusedops::to_float(v.y)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {fusedops::float_to_bf16(a), fusedops::float_to_bf16(b)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {fusedops::float_to_fp16(a), fusedops::float_to_fp16(b)}; }

inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
// The streaming (evict-first) cache hints are plain accesses here.
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }

// cvt.rna.tf32.f32: round to 10 mantissa bits, ties away from zero (inf / NaN unchanged).
inline uint32_t emu_cvt_rna_tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return u;
}
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for the calling warp (all 32 lanes call):
// lane l holds A(l/4 + 8 (r%2), l%4 + 4 (r/2)) in a[r], B(l%4 + 4 r, l/4) in b[r] and
// C(l/4 + 8 (r/2), 2 (l%4) + r%2) in c[r]; the k terms are summed in fp32 in order.
inline void emu_mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  EmuWarp& w = *g_emu_warp;
  const int lane = threadIdx.x % 32;
  auto f = [](uint32_t u) { u &= 0xffffe000u; float v; memcpy(&v, &u, 4); return v; };
  for (int r = 0; r < 4; ++r) w.a[lane][r] = f(a[r]);
  w.b[lane][0] = f(b0);
  w.b[lane][1] = f(b1);
  w.bar->arrive_and_wait();
  for (int r = 0; r < 4; ++r) {
    const int row = lane / 4 + 8 * (r / 2), col = 2 * (lane % 4) + r % 2;
    float acc = c[r];
    for (int k = 0; k < 8; ++k)
      acc += w.a[(row % 8) * 4 + k % 4][(row / 8) + 2 * (k / 4)] * w.b[col * 4 + k % 4][k / 4];
    c[r] = acc;
  }
  w.bar->arrive_and_wait();
}
