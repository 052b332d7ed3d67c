// Warpgroup building blocks of the Hopper kernels (cuda_sm90, sm_90a only): wgmma (the
// warpgroup matrix product, operands read by the tensor cores straight from shared memory) with
// fp32 accumulators in registers, its shared-memory matrix descriptors, and the fences around it.
// Every PTX use of the sm90 GDN kernels sits in this header, so that the CPU emulation
// (cpu_emulation/emu_wgmma.h) can stand in for it whole.
//
// Tiles: a [R][C] 16-bit tile (C a multiple of 64, base 1024-byte aligned) is stored as C / 64
// column blocks of R rows x 128 bytes; in row r, the 16-byte chunk c of a block sits at chunk
// c ^ (r % 8) (the 128-byte swizzle, applied by the hardware to address bits 4-6 from bits 7-9).
// The same tile serves as a K-major operand (rows = M or N, columns = the reduction) and as an
// MN-major one (rows = the reduction, columns = M or N), so a tile loaded once feeds products on
// both sides (K as K^T in the state update, Vn as the B of P Vn, ...).
//
// Accumulators of m64nNk16 (thread t of the warpgroup: warp w = t / 32, g = lane / 4, q = lane % 4):
// d[4 j + e] = D(16 w + g + 8 (e / 2), 8 j + 2 q + e % 2), the layout of mma.m16n8's C repeated
// over the N / 8 column blocks.
#pragma once

#include <cstdint>

namespace fusedops::la::sm90 {

// Byte offset of element (r, c) in a swizzled [R][C] 16-bit tile.
__device__ __forceinline__ uint32_t sw_off(int R, int r, int c) {
  return static_cast<uint32_t>((c >> 6) * (R * 128) + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) + ((c & 7) << 1));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A shared-memory matrix descriptor in the 128-byte swizzle mode, as its two 32-bit words. K-major
// operands: rows of 128 bytes, groups of 8 rows `sbo` bytes apart (a k16 step moves the start 32
// bytes along the row); MN-major: 8 reduction rows of 128 bytes (64 M or N elements) per group,
// groups `sbo` apart, the next 64 M or N elements `lbo` bytes on. The low word holds the start
// address (shared address a, 16-byte aligned, under 256 KiB) / 16 in its low 14 bits, so a
// descriptor at a + off is desc_lo(a, lbo) + off / 16: one add per product in an unrolled loop
// (built whole each time, a descriptor took ~10 uniform instructions).
__device__ __forceinline__ uint32_t desc_lo(uint32_t a, uint32_t lbo) {
  return ((a >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16);
}
constexpr uint32_t desc_hi(uint32_t sbo) { return ((sbo >> 4) & 0x3FFF) | (1u << 30); }
__device__ __forceinline__ uint64_t desc_make(uint32_t lo, uint32_t hi) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// 4 bytes global -> shared by cp.async (zeros when !valid; src must still be a valid address).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}

// Before the first wgmma of a batch (orders the accumulator registers' earlier writes), after
// the batch's issue (closes a group) and waiting for all but N groups.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared-memory writes by ordinary stores (and cp.async) become visible to wgmma's operand reads
// (the async proxy): each writer fences, then the CTA synchronises.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator reads or writes across a wgmma batch.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A B for m64n64k16 / m64n32k16 / m64n16k16 (scale_d = 0: d = A B). kTA / kTB: 0 for a K-major
// operand, 1 for an MN-major one; kBF16 picks bf16 or fp16 operands. FUSEDOPS_WGMMA_ASM is the asm
// statement of one product: its shape, operand type TY ("bf16" or "f16"), the accumulator
// operands' numbers, those of scale_d, the two descriptors and the two majors, then the
// accumulator constraints; FUSEDOPS_WGMMA_N<N>(TY) fills them in per shape, so each wrapper only
// picks TY.
#define FUSEDOPS_WGMMA_ASM(SHAPE, TY, REGS, PSCALE, PA, PB, PTA, PTB, ...)                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PSCALE ", 0;\n"                                  \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" REGS "}, " PA ", " PB   \
               ", p, 1, 1, " PTA ", " PTB ";\n}\n"                                                  \
               : __VA_ARGS__                                                                      \
               : "l"(da), "l"(db), "r"(scale_d), "n"(kTA), "n"(kTB))

#define FUSEDOPS_WGMMA_N64(TY) FUSEDOPS_WGMMA_ASM("m64n64k16", TY, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31", "%34", "%32", "%33", "%35", "%36", "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]))
template <bool kBF16, int kTA, int kTB>
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (kBF16) FUSEDOPS_WGMMA_N64("bf16");
  else FUSEDOPS_WGMMA_N64("f16");
}

#define FUSEDOPS_WGMMA_N32(TY) FUSEDOPS_WGMMA_ASM("m64n32k16", TY, "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15", "%18", "%16", "%17", "%19", "%20", "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]))
template <bool kBF16, int kTA, int kTB>
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (kBF16) FUSEDOPS_WGMMA_N32("bf16");
  else FUSEDOPS_WGMMA_N32("f16");
}

#define FUSEDOPS_WGMMA_N16(TY) FUSEDOPS_WGMMA_ASM("m64n16k16", TY, "%0, %1, %2, %3, %4, %5, %6, %7", "%10", "%8", "%9", "%11", "%12", "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]))
template <bool kBF16, int kTA, int kTB>
__device__ __forceinline__ void wgmma_n16(float (&d)[8], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (kBF16) FUSEDOPS_WGMMA_N16("bf16");
  else FUSEDOPS_WGMMA_N16("f16");
}

}  // namespace fusedops::la::sm90
