// Private pieces of the KDA CUDA backend (cuda_sm80) shared by kda_sm80.cu (forward, registration)
// and kda_bwd_sm80.cu (backward). Device code: include from .cu files only.
#pragma once

#include <cstdint>

#include "fusedops/core/registry.h"
#include "fusedops/ops/kda.h"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"
#include "src/ops/kda/kda_top.h"

namespace fusedops::kda::sm80 {

// The KDA kernels are written in the shared tile layer's vocabulary (la_sm80.cuh, la_tc_sm80.cuh).
using namespace la::sm80;

// The two intra kernels' 64-channel halves (chunk 64, 256 threads): q and k rows into [64][kLdH]
// 16-bit tiles and gk rows into a [64][kLdG] fp32 tile, channels y0.., by cp.async (rows >= len
// zero); the caller commits and waits. Then gates_log2 turns, in each thread, the gate pieces that
// thread copied into g log2(e), for exp2_fast of their differences (a thread sees its own cp.async
// results once waited for; the caller's barrier publishes them).
constexpr int kIntraHalf = 64;
template <int kLdH, int kLdG>
__device__ __forceinline__ void load_qkg_half(uint16_t* Qs, uint16_t* Ks, float* Gs, const la::sm80::Tok& q,
                                              const la::sm80::Tok& k, const la::sm80::Tok& gk,
                                              const la::sm80::ChunkPos& c, int hk, int hv, int y0, int tid) {
  using la::sm80::cp_async16;
  using la::sm80::kMaxBT;
  using la::sm80::kThreads;
  const uint16_t* qb = static_cast<const uint16_t*>(q.p);
  const uint16_t* kb = static_cast<const uint16_t*>(k.p);
  const float* gb = static_cast<const float*>(gk.p);
  for (int e = tid; e < kMaxBT * (kIntraHalf / 8); e += kThreads) {
    const int r = e >> 3, col = (e & 7) << 3;
    const bool ok = r < c.len;
    const int64_t t = c.t0 + (ok ? r : 0);
    cp_async16(Qs + r * kLdH + col, qb + q.off(c.b, t, hk) + y0 + col, ok);
    cp_async16(Ks + r * kLdH + col, kb + k.off(c.b, t, hk) + y0 + col, ok);
  }
  for (int e = tid; e < kMaxBT * (kIntraHalf / 4); e += kThreads) {
    const int r = e >> 4, col = (e & 15) << 2;
    const bool ok = r < c.len;
    cp_async16(Gs + r * kLdG + col, gb + gk.off(c.b, c.t0 + (ok ? r : 0), hv) + y0 + col, ok);
  }
}
template <int kLdG>
__device__ __forceinline__ void gates_log2(float* Gs, int tid) {
  for (int e = tid; e < la::sm80::kMaxBT * (kIntraHalf / 4); e += la::sm80::kThreads) {
    float* p = Gs + (e >> 4) * kLdG + ((e & 15) << 2);
#pragma unroll
    for (int u = 0; u < 4; ++u) p[u] *= la::sm80::kLog2e;
  }
}

// chunk_local_cumsum fused into the intra kernels, with its arithmetic (a running double sum, each
// row's value scale * sum rounded to fp32 once; gdn's cumsum_kernel), so the values are its own.
// The running sum is the only dependent chain; rows past len add 0 and are written 0, no branch per
// row. Forward, thread `col` of a half, once the raw fp32 gate half is in Gs (load_qkg_half, rows
// >= len zero) and a barrier has published it: channel col summed down the chunk's rows, each row's
// fp32 value written back into Gs; nothing else on the chain. The caller, after its next barrier,
// stores g_cumsum and scales Gs to log2 units with all its threads (gate_block_out). Reading the raw
// gate from global memory here instead, 16 rows per round trip by two warps, left the other six
// waiting at the barrier: intra 799 -> 1208 us (5236171).
template <int kLdG>
__device__ __forceinline__ void scan_gate_col(float* Gs, int n, int col, double scale) {
  using la::sm80::kMaxBT;
  double acc = 0.0;
#pragma unroll 1
  for (int i0 = 0; i0 < kMaxBT; i0 += 16) {
    float x[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) x[j] = Gs[(i0 + j) * kLdG + col];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      acc += static_cast<double>(x[j]);
      Gs[(i0 + j) * kLdG + col] = i0 + j < n ? static_cast<float>(acc * scale) : 0.0f;
    }
  }
}
// Then thread (16-row block tid / 64, channel tid % 64) of the 256: its block's rows < len of that
// channel stored to out (g_cumsum, channel y0 + col; a warp's 32 channels of a row are one 128-byte
// store) and scaled in place to log2 units; returns the scaled gate's span (max - min) over those
// rows, for the diagonal blocks' mma test.
template <int kLdG>
__device__ __forceinline__ float gate_block_out(float* Gs, const la::sm80::Tok& out, const la::sm80::ChunkPos& c,
                                                int hv, int y0, int tid) {
  const int r0 = 16 * (tid >> 6), col = tid & 63, n = min(16, c.len - r0);
  float* dst = static_cast<float*>(out.p) + out.off(c.b, c.t0 + r0, hv) + y0 + col;
  float lo = 0.0f, hi = 0.0f;
  for (int i = 0; i < n; ++i) {
    float* g = Gs + (r0 + i) * kLdG + col;
    const float v = *g;
    dst[static_cast<int64_t>(i) * out.st] = v;
    const float x = v * la::sm80::kLog2e;
    *g = x;
    lo = i == 0 ? x : fminf(lo, x);
    hi = i == 0 ? x : fmaxf(hi, x);
  }
  return hi - lo;
}
// Backward, in place over channel ch of a chunk's fp32 rows of t (written by other threads of the
// block before a barrier): x_i <- scale * sum_{r >= i} x_r (rows r < len), summed from the last
// row; kRows rows per round trip, all loaded before their first add.
template <int kRows>
__device__ __forceinline__ void rev_scan_col(const la::sm80::Tok& t, const la::sm80::ChunkPos& c, int hv, int ch,
                                             double scale) {
  using la::sm80::kMaxBT;
  float* p = static_cast<float*>(t.p) + t.off(c.b, c.t0, hv) + ch;
  const int n = c.len;
  double acc = 0.0;
#pragma unroll 1
  for (int i0 = 0; i0 < kMaxBT; i0 += kRows) {
    float x[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) x[j] = i0 + j < n ? p[(n - 1 - i0 - j) * t.st] : 0.0f;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      acc += static_cast<double>(x[j]);
      const float v = static_cast<float>(acc * scale);
      if (i0 + j < n) p[(n - 1 - i0 - j) * t.st] = v;
    }
  }
}

// The intra kernels' scaled operands, eight channels (16 bytes of a 16-bit row) at a time:
// d[c] = f 2^(ga[c] - gb[c]) from two log2-domain gate rows (16-byte aligned), and
// dst[c] = src[c] d[c] rounded to 16-bit (16-byte aligned rows).
__device__ __forceinline__ void exp2_diff8(float (&d)[8], const float* ga, const float* gb, float f) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float4 a = *reinterpret_cast<const float4*>(ga + 4 * h), b = *reinterpret_cast<const float4*>(gb + 4 * h);
    d[4 * h] = f * la::sm80::exp2_fast(a.x - b.x);
    d[4 * h + 1] = f * la::sm80::exp2_fast(a.y - b.y);
    d[4 * h + 2] = f * la::sm80::exp2_fast(a.z - b.z);
    d[4 * h + 3] = f * la::sm80::exp2_fast(a.w - b.w);
  }
}
template <bool BF>
__device__ __forceinline__ void mul8_store(uint16_t* dst, const uint16_t* src, const float (&d)[8]) {
  using la::sm80::h2f;
  const uint4 x = *reinterpret_cast<const uint4*>(src);
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
  uint32_t o[4];
#pragma unroll
  for (int u = 0; u < 4; ++u)
    o[u] = la::sm80::mma16::pack2<BF>(h2f<BF>(static_cast<uint16_t>(xs[u])) * d[2 * u],
                                       h2f<BF>(static_cast<uint16_t>(xs[u] >> 16)) * d[2 * u + 1]);
  *reinterpret_cast<uint4*>(dst) = uint4{o[0], o[1], o[2], o[3]};
}

// Registers the backward-direction kernels of kda_bwd_sm80.cu.
void register_bwd(Registry& r);

// The top-level forward's fused steps (compose_fwd's hooks) of this backend, and whether its top
// level takes a call (kda_sm90.cu's forward is this one with another state-and-output hook).
FwdFusions fwd_fusions();
bool top_fwd_supported(const ChunkKdaFwdArgs& a);
// The top-level backward (kda_bwd_sm80.cu), which kda_sm90.cu registers as its own.
void top_bwd_entry(const Context& ctx, const ChunkKdaBwdArgs& a);
bool top_bwd_supported(const ChunkKdaBwdArgs& a);

}  // namespace fusedops::kda::sm80
