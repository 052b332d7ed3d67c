// Pieces shared by the cuda_sm90 state kernels of one CTA per (sequence, value head): the fused
// state-and-output kernel of both families (linear_attention_sm90.cu) and GDN's backward
// (gated_delta_rule_bwd_sm90.cu, _bwd_dqkwg_sm90.cu): the tile geometry (K = V = 128, chunk 64, 16-bit tiles in the 128-byte swizzle of
// la_wgmma_sm90.cuh), the per-thread cp.async source of a token tile, and the descriptors of a
// tile as a K-major or MN-major operand. No PTX here (the CPU emulation compiles this header as
// it is).
#pragma once

#include <cstdint>

#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"
#include "src/ops/linear_attention/la_wgmma_sm90.cuh"

namespace fusedops::la::sm90 {

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
// [R][128] tile (R = 64 token rows by default) at byte offset `tile` from the base, its rows n0..,
// at k16 step kk (columns 16 kk..), and an MN-major operand whose step starts at byte offset
// `start`.
constexpr uint32_t kDescHi = desc_hi(1024);
template <int R = kBT>
__device__ __forceinline__ uint64_t kmajor(uint32_t kLo, uint32_t tile, int kk, int n0 = 0) {
  return desc_make(kLo + ((tile + n0 * 128 + (kk >> 2) * (R * 128) + (kk & 3) * 32) >> 4), kDescHi);
}
__device__ __forceinline__ uint64_t mnmajor(uint32_t mLo, uint32_t start) {
  return desc_make(mLo + (start >> 4), kDescHi);
}

// A thread of a 512-thread CTA of four warpgroups holding the fp32 state X [128][128] in m64n64
// accumulators (warpgroup wg: rows 64 (wg % 2).., columns 64 (wg / 2)..): rows xr, xr + 8 and
// columns xc + 8 j (+ 1) of X, token rows r0, r1 of a chunk product. Every row it touches in a
// fragment is gq mod 8, so the swizzled byte offset of its pair at column c0 + 8 j + 2 tq (c0 a
// multiple of 64) is a row base plus ((j << 4) ^ gx): one XOR with a constant per pair (sw_off per
// pair was ~25% of the kernels' instructions). xs0 / xs1: Xs's row bases for rows xr, xr + 8.
struct WgThread {
  int tid, wg, wq, lane, gq, tq, xr, xc, r0, r1;
  uint32_t gx, xs0, xs1;
};
__device__ __forceinline__ WgThread wg_thread() {
  WgThread t;
  t.tid = threadIdx.x;
  // The warpgroup index through a shuffle, so that the compiler sees it uniform across each warp
  // (wgmma in a branch it cannot prove warp-uniform is serialized).
  t.wg = __shfl_sync(0xffffffffu, t.tid >> 7, 0);
  t.wq = (t.tid >> 5) & 3;
  t.lane = t.tid & 31;
  t.gq = t.lane >> 2;
  t.tq = t.lane & 3;
  t.xr = 64 * (t.wg & 1) + 16 * t.wq + t.gq;
  t.xc = 64 * (t.wg >> 1) + 2 * t.tq;
  t.r0 = 16 * t.wq + t.gq;
  t.r1 = t.r0 + 8;
  t.gx = static_cast<uint32_t>(t.gq) << 4;
  t.xs0 = (t.wg >> 1) * (kXsB / 2) + t.xr * 128 + 4 * t.tq;
  t.xs1 = t.xs0 + 8 * 128;
  return t;
}

// This thread's part of state sidx ([.., 128, 128] fp32 or 16-bit, m.p null: zeros) into x, and back.
__device__ __forceinline__ void load_state(float (&x)[32], const sm80::Mat& m, int64_t sidx, const WgThread& t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t at = sidx * (kD * kD) + static_cast<int64_t>(t.xr + 8 * (e >> 1)) * kD + t.xc + 8 * j + (e & 1);
      x[4 * j + e] = m.p ? sm80::ldf(m.p, m.code, at) : 0.0f;
    }
}
__device__ __forceinline__ void store_state(const float (&x)[32], const sm80::Mat& m, int64_t sidx,
                                            const WgThread& t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t at = sidx * (kD * kD) + static_cast<int64_t>(t.xr + 8 * (e >> 1)) * kD + t.xc + 8 * j + (e & 1);
      sm80::stf(m.p, m.code, at, x[4 * j + e]);
    }
}
// x in 16 bits into the swizzled Xs [128][128].
template <bool BF>
__device__ __forceinline__ void state_to_xs(uint8_t* Xs, const float (&x)[32], const WgThread& t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
      *reinterpret_cast<uint32_t*>(Xs + ((hr ? t.xs1 : t.xs0) + ((j << 4) ^ t.gx))) =
          sm80::mma16::pack2<BF>(x[4 * j + 2 * hr], x[4 * j + 2 * hr + 1]);
}

// Host side: what every kernel of one CTA per (sequence, value head) needs. `env` (test-only: =1
// forces the kernel, =0 turns it off; src/core/env.h, docs/tuning.md); 16-bit inputs; chunk
// 64, K = V = 128; `smem` bytes of shared memory; by default, `states` (sequences x value heads)
// filling at least 7/8 of the SMs (one CTA per SM). The gate is each caller's own check
// (scalar_gate_ok for GDN's; KDA's per-channel gate in the KDA form of the forward kernel).
inline bool wg_state_ok(const Context& ctx, const char* env, DType dt, int64_t BT, int64_t K, int64_t V,
                        int64_t states, size_t smem) {
  const int force = env::force(env);
  if (force == 0) return false;
  if (dt != DType::kBFloat16 && dt != DType::kFloat16) return false;
  if (BT != kBT || K != kD || V != kD) return false;
  if (sm80::smem_optin("chunk_gated_delta_rule", ctx.device.index) < smem) return false;
  return force == 1 || states * 8 >= sm80::sm_count("chunk_gated_delta_rule", ctx.device.index) * 7;
}
// GDN's scalar gate in fp32 (4-byte cp.async) or none, and no per-channel gate.
inline bool scalar_gate_ok(const TensorView& gate, const TensorView& gk) {
  return !gk.defined() &&
         (!gate.defined() || (gate.dtype() == DType::kFloat32 && reinterpret_cast<uintptr_t>(gate.data()) % 4 == 0));
}
// The initial and final states, when given, contiguous.
inline bool ends_ok(const TensorView& a, const TensorView& b) {
  return (!a.defined() || a.is_contiguous()) && (!b.defined() || b.is_contiguous());
}

}  // namespace fusedops::la::sm90
