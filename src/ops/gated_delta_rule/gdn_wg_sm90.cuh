// Pieces shared by the cuda_sm90 GDN kernels (gated_delta_rule_fwd_sm90.cu, _bwd_sm90.cu): the
// tile geometry (K = V = 128, chunk 64, 16-bit tiles in the 128-byte swizzle of
// gdn_wgmma_sm90.cuh), the per-thread cp.async source of a token tile, and the descriptors of a
// tile as a K-major or MN-major operand. No PTX here (the CPU emulation compiles this header as
// it is).
#pragma once

#include <cstdint>

#include "src/ops/gated_delta_rule/gdn_sm80.cuh"
#include "src/ops/gated_delta_rule/gdn_tc_sm80.cuh"
#include "src/ops/gated_delta_rule/gdn_wgmma_sm90.cuh"

namespace fusedops::gdn::sm90 {

constexpr int kD = 128;                              // K = V
constexpr int kBT = 64;                              // chunk
constexpr uint32_t kTileB = kBT * kD * 2;            // a swizzled [64][128] 16-bit token tile
constexpr uint32_t kXsB = kD * kD * 2;               // the 16-bit state [128][128]

// This thread's two 16-byte units of a [64][128] token tile (512 threads: rows tid / 16 and
// tid / 16 + 32, columns 8 (tid % 16)..): the source row pointer at the sequence's first token,
// advanced by whole chunks, so that a chunk's loads cost a few instructions each (at a full
// address computation per unit, the loads were 30% of the kernel's instructions).
// (The token stride stays in the kernel's parameters: a register copy of it pushed the kernel to
// 128 registers and a spill.)
struct TileSrc {
  const uint16_t* p0;  // the sequence's first token, at this thread's columns (a valid address)
  __device__ __forceinline__ void init(const sm80::Tok& t, int64_t b, int64_t t0, int64_t head, int lc) {
    p0 = static_cast<const uint16_t*>(t.p) + t.off(b, t0, head) + lc;
  }
  // Chunk ci's units (rows lr, lr + 32; token stride st) into the tile `tile` (offsets so0 / so1);
  // rows at or past len read as zeros (their source address stays p0, inside the tensor).
  __device__ __forceinline__ void load(uint8_t* tile, uint32_t so0, uint32_t so1, int64_t ci, int lr, int len,
                                       int64_t st) const {
    const uint16_t* r0 = p0 + (ci * kBT + lr) * st;
    sm80::cp_async16(tile + so0, lr < len ? r0 : p0, lr < len);
    sm80::cp_async16(tile + so1, lr + 32 < len ? r0 + 32 * st : p0, lr + 32 < len);
  }
};

// Descriptors from the low words kLo / mLo of the shared base (K-major / MN-major): a K-major
// [64][128] tile at byte offset `tile` from the base, at k16 step kk (columns 16 kk..), and an
// MN-major operand whose step starts at byte offset `start`.
constexpr uint32_t kDescHi = desc_hi(1024);
__device__ __forceinline__ uint64_t kmajor(uint32_t kLo, uint32_t tile, int kk) {
  return desc_make(kLo + ((tile + (kk >> 2) * kTileB / 2 + (kk & 3) * 32) >> 4), kDescHi);
}
__device__ __forceinline__ uint64_t mnmajor(uint32_t mLo, uint32_t start) {
  return desc_make(mLo + (start >> 4), kDescHi);
}

}  // namespace fusedops::gdn::sm90
