// CPU emulation of la_wgmma_sm90.cuh (wgmma and its shared-memory descriptors), put in its place
// by build.sh. Each thread computes its own accumulator entries from the operands its warpgroup's
// descriptors address in the emulated shared memory, decoding the descriptor and the 128-byte
// swizzle the way the PTX ISA defines them; the products are summed in fp32 in k order. The
// fences are no-ops (the emulation's products complete at issue). Test aid only.
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "emu_core.h"

namespace fusedops::la::sm90 {

inline uint32_t sw_off(int R, int r, int c) {
  return static_cast<uint32_t>((c >> 6) * (R * 128) + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) + ((c & 7) << 1));
}
inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - g_emu_smem.data());
}
inline uint32_t desc_lo(uint32_t a, uint32_t lbo) { return ((a >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16); }
constexpr uint32_t desc_hi(uint32_t sbo) { return ((sbo >> 4) & 0x3FFF) | (1u << 30); }
inline uint64_t desc_make(uint32_t lo, uint32_t hi) { return (static_cast<uint64_t>(hi) << 32) | lo; }
inline void cp_async4(void* dst, const void* src, bool valid) {
  if (valid) std::memcpy(dst, src, 4);
  else std::memset(dst, 0, 4);
}
inline void wg_fence() {}
inline void wg_commit() {}
template <int N>
inline void wg_wait() {}
inline void fence_async_smem() {}
template <int N>
inline void fence_regs(float (&)[N]) {}

// Element (i, k) of an operand: i its M (A) or N (B) index, k the reduction index (0..15).
template <bool kBF16>
inline float emu_operand(uint64_t desc, bool mn_major, int i, int k) {
  if (((desc >> 62) & 3) != 1) throw std::runtime_error("emu: wgmma descriptor not in the 128-byte swizzle mode");
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFF) << 4;
  const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4;
  uint32_t a = mn_major ? start + (i / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (i % 64) * 2
                        : start + (i / 8) * sbo + (i % 8) * 128 + k * 2;
  a ^= ((a >> 7) & 7) << 4;
  if (a + 2 > g_emu_smem.size()) throw std::runtime_error("emu: wgmma operand outside shared memory");
  uint16_t v;
  std::memcpy(&v, &g_emu_smem[a], 2);
  if constexpr (kBF16) return fusedops::to_float(fusedops::bf16_t{v});
  else return fusedops::to_float(fusedops::fp16_t{v});
}

template <bool kBF16, int kTA, int kTB, int N>
inline void emu_wgmma(float* d, uint64_t da, uint64_t db, int scale_d) {
  const int t = threadIdx.x % 128, w = t / 32, lane = t % 32;
  for (int r = 0; r < N / 2; ++r) {
    const int row = 16 * w + lane / 4 + 8 * ((r >> 1) & 1), col = 8 * (r >> 2) + 2 * (lane & 3) + (r & 1);
    float acc = scale_d ? d[r] : 0.0f;
    for (int k = 0; k < 16; ++k)
      acc += emu_operand<kBF16>(da, kTA == 1, row, k) * emu_operand<kBF16>(db, kTB == 1, col, k);
    d[r] = acc;
  }
}
template <bool kBF16, int kTA, int kTB>
inline void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma<kBF16, kTA, kTB, 64>(d, da, db, scale_d);
}
template <bool kBF16, int kTA, int kTB>
inline void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma<kBF16, kTA, kTB, 32>(d, da, db, scale_d);
}

template <bool kBF16, int kTA, int kTB>
inline void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
  emu_wgmma<kBF16, kTA, kTB, 16>(d, da, db, scale_d);
}

}  // namespace fusedops::la::sm90

// __shfl_sync of an int (the kernels' broadcast of a warp-uniform value).
inline int __shfl_sync(unsigned, int v, int src) {
  EmuWarp& w = *g_emu_warp;
  const int lane = threadIdx.x % 32;
  w.u[lane][7] = static_cast<uint32_t>(v);
  w.bar->arrive_and_wait();
  const int r = static_cast<int>(w.u[src][7]);
  w.bar->arrive_and_wait();
  return r;
}
