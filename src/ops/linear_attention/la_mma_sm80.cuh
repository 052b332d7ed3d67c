// Warp-level building blocks of the 16-bit tensor-core chunk kernels (cuda_sm80, run on sm_80 and
// later): the m16n8k16 bf16/fp16 mma with fp32 accumulation, its operand fragments read from
// shared memory (ldmatrix for operands stored with the reduction dimension contiguous,
// ldmatrix.trans for those stored the other way), cp.async 16-byte copies into shared memory with
// zero fill, the lane shuffle and the approximate exponential. Every PTX use of these kernels sits
// in this header, so that the CPU emulation (cpu_emulation/emu_mma.h) can stand in for it whole.
//
// Fragment layout of mma.m16n8k16 (g = lane / 4, t = lane % 4; a register holds two 16-bit
// elements, the lower-indexed one in its low half):
//   A (16x16, row-major): a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..), a[2] = A(g, 2t+8..), a[3] = A(g+8, 2t+8..)
//   B (16x8, k x n):      b[0] = B(2t..2t+1, g), b[1] = B(2t+8..2t+9, g)
//   C (16x8, fp32):       c[0..1] = C(g, 2t..2t+1), c[2..3] = C(g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fusedops::la::sm80 {

// c += a b for one m16n8k16 tile; kBF16 picks bf16 or fp16 operands.
template <bool kBF16>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 16-bit matrices: lane l gives the address of row l % 8 of matrix l / 8 (16-byte
// aligned) and receives r[i] = (M_i(g, 2t), M_i(g, 2t+1)). For X stored [m][k], the matrices at
// (rows m0, k0), (m0+8, k0), (m0, k0+8), (m0+8, k0+8) are the A fragment of that 16x16 tile; for Y
// stored [n][k], those at (n0, k0), (n0, k0+8), (n0+8, k0), (n0+8, k0+8) are the B fragments of
// the n-tiles n0 and n0+8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row_addr) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// Four transposed 8x8 16-bit matrices: lane l gives the address of row l % 8 of matrix l / 8
// (16-byte aligned) and receives r[i] = (M_i(2t, g), M_i(2t+1, g)). For S stored [k][n], the
// matrices at rows k0 and k0+8 of columns n0 are the B fragment (b[0], b[1]) of the n-tile n0.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* row_addr) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

// 16 bytes global -> shared without a register round trip; zeros when !valid (src is then not
// read, but must still be a valid address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }

// 2^x and e^x for the gate factors: ex2.approx.ftz, two instructions (e^x: one multiply more)
// against expf's eight. Relative error about 2^-22, plus |x| 2^-24 from rounding x log2(e),
// against the 2^-8 / 2^-11 of the 16-bit operands the factors scale; results under 2^-126 flush
// to zero and 2^-inf is 0. Gates staged as x log2(e) take exp2_fast of their differences.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float exp_fast(float x) { return exp2_fast(x * kLog2e); }

// Two adjacent 16-bit elements (4-byte aligned) as one 32-bit register; a 16-bit value as float
// and back (round to nearest even).
__device__ __forceinline__ uint32_t ld32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
template <bool kBF16>
__device__ __forceinline__ float h2f(uint16_t u) {
  if constexpr (kBF16) return __uint_as_float(static_cast<uint32_t>(u) << 16);
  else return __half2float(__ushort_as_half(u));
}
template <bool kBF16>
__device__ __forceinline__ uint16_t f2h(float v) {
  if constexpr (kBF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

}  // namespace fusedops::la::sm80
