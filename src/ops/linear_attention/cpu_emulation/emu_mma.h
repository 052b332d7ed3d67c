// CPU emulation of la_mma_sm80.cuh (the 16-bit tensor-core building blocks), put in its place by
// build.sh. Warp collectives exchange operands through the warp's scratch (emu_core.h) between two
// warp barriers; cp.async copies at once. Test aid only.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "emu_core.h"

namespace fusedops::la::sm80 {

template <bool kBF16>
inline float h2f(uint16_t u) {
  if constexpr (kBF16) return fusedops::to_float(fusedops::bf16_t{u});
  else return fusedops::to_float(fusedops::fp16_t{u});
}
template <bool kBF16>
inline uint16_t f2h(float v) {
  if constexpr (kBF16) return fusedops::float_to_bf16(v).bits;
  else return fusedops::float_to_fp16(v).bits;
}
inline uint32_t ld32(const uint16_t* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: the fragment layout of gdn_mma_sm80.cuh; the
// 16 k terms summed in fp32 in order.
template <bool kBF16>
inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  EmuWarp& w = *g_emu_warp;
  const int lane = threadIdx.x % 32;
  for (int r = 0; r < 4; ++r) w.u[lane][r] = a[r];
  w.u[lane][4] = b0;
  w.u[lane][5] = b1;
  w.bar->arrive_and_wait();
  auto el = [&](int l, int reg, int k) {  // 16-bit element k % 2 of register reg of lane l
    return h2f<kBF16>(static_cast<uint16_t>(w.u[l][reg] >> (16 * (k & 1))));
  };
  for (int r = 0; r < 4; ++r) {
    const int row = lane / 4 + 8 * (r / 2), col = 2 * (lane % 4) + r % 2;
    float acc = c[r];
    for (int k = 0; k < 16; ++k) {
      const float A = el((row % 8) * 4 + (k % 8) / 2, (row / 8) + 2 * (k / 8), k);
      const float B = el(col * 4 + (k % 8) / 2, 4 + k / 8, k);
      acc += A * B;
    }
    c[r] = acc;
  }
  w.bar->arrive_and_wait();
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16.
inline void ldsm_x4(uint32_t (&r)[4], const void* row_addr) {
  EmuWarp& w = *g_emu_warp;
  const int lane = threadIdx.x % 32, t = lane % 4, g = lane / 4;
  w.ptr[lane] = row_addr;
  w.bar->arrive_and_wait();
  for (int i = 0; i < 4; ++i) std::memcpy(&r[i], static_cast<const uint16_t*>(w.ptr[8 * i + g]) + 2 * t, 4);
  w.bar->arrive_and_wait();
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16.
inline void ldsm_x4_t(uint32_t (&r)[4], const void* row_addr) {
  EmuWarp& w = *g_emu_warp;
  const int lane = threadIdx.x % 32, t = lane % 4, g = lane / 4;
  w.ptr[lane] = row_addr;
  w.bar->arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    std::memcpy(&lo, static_cast<const uint16_t*>(w.ptr[8 * i + 2 * t]) + g, 2);
    std::memcpy(&hi, static_cast<const uint16_t*>(w.ptr[8 * i + 2 * t + 1]) + g, 2);
    r[i] = lo | (static_cast<uint32_t>(hi) << 16);
  }
  w.bar->arrive_and_wait();
}

inline void cp_async16(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 16);
  else std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

// As la_mma_sm80.cuh: the warp exchange of emu_core.h.
inline float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// ex2.approx.ftz's stand-in: exp2f, results under 2^-126 flushed to zero.
constexpr float kLog2e = 1.4426950408889634f;
inline float exp2_fast(float x) {
  const float y = std::exp2f(x);
  return y < 0x1p-126f ? 0.0f : y;
}
inline float exp_fast(float x) { return exp2_fast(x * kLog2e); }

}  // namespace fusedops::la::sm80
