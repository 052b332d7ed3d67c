// The tile layer of the 16-bit tensor-core chunk kernels (cuda_sm80; their shape: K = V = 128,
// chunk 64, 256 threads): shared-memory tile geometry, cp.async tile loads, the warp products on
// m16n8k16 (gdn_mma_sm80.cuh) with fp32 register accumulators, paired output access, and the host
// test of whether a tensor suits these kernels.
//
// Warp tiling used by every such kernel: warp w owns rows 16 (w % 4) .. +15 of every output, columns
// 64 (w / 4) .. +63 of the 64x128 outputs (acc[8][4]) and 32 (w / 4) .. +31 of the 64x64 ones
// (acc[4][4]); with g = lane / 4, t = lane % 4, acc[j][e] is row 16 (w % 4) + g + 8 (e / 2), column
// base + 8 j + 2 t + e % 2.
#pragma once

#include <cstdint>

#include "fusedops/ops/gated_delta_rule.h"
#include "src/core/env.h"
#include "src/ops/linear_attention/la_mma_sm80.cuh"
#include "src/ops/linear_attention/la_sm80.cuh"

namespace fusedops::la::sm80::mma16 {

constexpr int kD = 128;              // K = V
constexpr int kLdT = kD + 8;         // 16-bit row stride of [rows][128] tiles: 68 words, so a fragment's 8 rows hit distinct banks
constexpr int kLdS = kMaxBT + 8;     // of [64][64] 16-bit tiles (36 words)
constexpr int kLdA = kLdS;
constexpr int kLdM = kMaxBT + 1;     // of [64][64] fp32 tiles
constexpr int kTok = kMaxBT * kLdT;  // elements of a token tile
constexpr int kSt = kD * kLdT;       // of a state tile

template <int NJ>
__device__ __forceinline__ void zero(float (&a)[NJ][4]) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) a[j][e] = 0.0f;
}

// This lane's row address for ldsm_x4 of the A fragments of rows m0..m0+15 of X stored [m][k]
// (add the tile's first reduction column).
__device__ __forceinline__ const uint16_t* a_frag_row(const uint16_t* X, int ldx, int m0, int lane) {
  return X + (m0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ldx + 8 * (lane >> 4);
}

// acc[j] += X[m0..m0+15][0..kd) . Y[n0+8j..n0+8j+7][0..kd)^T: both stored with the reduction
// dimension contiguous.
template <bool BF, int NJ>
__device__ __forceinline__ void mm_xyt(float (&acc)[NJ][4], const uint16_t* X, int ldx, const uint16_t* Y, int ldy,
                                       int m0, int n0, int kd, int lane) {
  static_assert(NJ % 2 == 0, "n-tiles in pairs");
  const uint16_t* pa = a_frag_row(X, ldx, m0, lane);
  const uint16_t* pb = Y + (n0 + (lane & 7) + 8 * (lane >> 4)) * ldy + 8 * ((lane >> 3) & 1);
#pragma unroll 2
  for (int k0 = 0; k0 < kd; k0 += 16) {
    uint32_t a[4];
    ldsm_x4(a, pa + k0);
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t b[4];
      ldsm_x4(b, pb + 8 * j * ldy + k0);
      mma16816<BF>(acc[j], a, b[0], b[1]);
      mma16816<BF>(acc[j + 1], a, b[2], b[3]);
    }
  }
}

// acc[j] += X[m0..m0+15][k0..k1) . S[k0..k1)[n0+8j..n0+8j+7]: X stored [m][k], S stored [k][n]
// (its fragments read transposed by ldmatrix). k0, k1 multiples of 16, NJ even.
template <bool BF, int NJ>
__device__ __forceinline__ void mm_xs(float (&acc)[NJ][4], const uint16_t* X, int ldx, const uint16_t* S, int lds,
                                      int m0, int n0, int k0, int k1, int lane) {
  const int mi = lane >> 3, rr = lane & 7;
  const uint16_t* pa = a_frag_row(X, ldx, m0, lane);
  const uint16_t* ps = S + (rr + 8 * (mi & 1)) * lds + n0 + 8 * (mi >> 1);
  for (int kk = k0; kk < k1; kk += 16) {
    uint32_t a[4];
    ldsm_x4(a, pa + kk);
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t r[4];
      ldsm_x4_t(r, ps + kk * lds + 8 * j);
      mma16816<BF>(acc[j], a, r[0], r[1]);
      mma16816<BF>(acc[j + 1], a, r[2], r[3]);
    }
  }
}

// mm_xs for two left operands X1, X2 (same stride) against one S: each S fragment is read once.
template <bool BF, int NJ>
__device__ __forceinline__ void mm_xs2(float (&acc1)[NJ][4], float (&acc2)[NJ][4], const uint16_t* X1,
                                       const uint16_t* X2, int ldx, const uint16_t* S, int lds, int m0, int n0, int k0,
                                       int k1, int lane) {
  const int mi = lane >> 3, rr = lane & 7;
  const uint16_t* p1 = a_frag_row(X1, ldx, m0, lane);
  const uint16_t* p2 = a_frag_row(X2, ldx, m0, lane);
  const uint16_t* ps = S + (rr + 8 * (mi & 1)) * lds + n0 + 8 * (mi >> 1);
  for (int kk = k0; kk < k1; kk += 16) {
    uint32_t a1[4], a2[4];
    ldsm_x4(a1, p1 + kk);
    ldsm_x4(a2, p2 + kk);
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t r[4];
      ldsm_x4_t(r, ps + kk * lds + 8 * j);
      mma16816<BF>(acc1[j], a1, r[0], r[1]);
      mma16816<BF>(acc1[j + 1], a1, r[2], r[3]);
      mma16816<BF>(acc2[j], a2, r[0], r[1]);
      mma16816<BF>(acc2[j + 1], a2, r[2], r[3]);
    }
  }
}

// acc[j] += X^T[m0..m0+15][k0..k1) . S[k0..k1)[n0+8j..n0+8j+7]: X stored [k][m] and S stored [k][n],
// both read transposed by ldmatrix (so a product with a transposed operand needs no transposed
// copy). k0, k1 multiples of 16, m0 and n0 multiples of 8, NJ even.
template <bool BF, int NJ>
__device__ __forceinline__ void mm_xts(float (&acc)[NJ][4], const uint16_t* X, int ldx, const uint16_t* S, int lds,
                                       int m0, int n0, int k0, int k1, int lane) {
  const int mi = lane >> 3, rr = lane & 7;
  const uint16_t* px = X + (rr + 8 * (mi >> 1)) * ldx + m0 + 8 * (mi & 1);
  const uint16_t* ps = S + (rr + 8 * (mi & 1)) * lds + n0 + 8 * (mi >> 1);
  for (int kk = k0; kk < k1; kk += 16) {
    uint32_t a[4];
    ldsm_x4_t(a, px + kk * ldx);
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t r[4];
      ldsm_x4_t(r, ps + kk * lds + 8 * j);
      mma16816<BF>(acc[j], a, r[0], r[1]);
      mma16816<BF>(acc[j + 1], a, r[2], r[3]);
    }
  }
}

// The accumulator's row r0 (elements 0, 1 of each tile) times s0 and row r0 + 8 (elements 2, 3)
// times s1 (the mma layout's two rows per lane).
template <int NJ>
__device__ __forceinline__ void scale_rows(float (&acc)[NJ][4], float s0, float s1) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    acc[j][0] *= s0;
    acc[j][1] *= s0;
    acc[j][2] *= s1;
    acc[j][3] *= s1;
  }
}

// Sum over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_sum(float v) {
  v += shfl_xor(v, 1);
  return v + shfl_xor(v, 2);
}

// The warp's entries of the 64x64 tile Gamma . M>= . Q K^T (rows 16 (w % 4).., columns 32 (w / 4)..;
// Gamma_ij = e^{gl_i - gl_j}): f(r, col, value) once per entry, value 0 outside j <= i < len. A tile
// wholly above the diagonal skips its product.
template <bool BF, class F>
__device__ __forceinline__ void causal_qk(const uint16_t* Qs, const uint16_t* Ks, const float* gl, int len, int lane,
                                          F&& f) {
  const int warp = threadIdx.x >> 5, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn2 = 32 * (warp >> 2), r0 = wm + (lane >> 2);
  float pa[4][4];
  zero(pa);
  if (wn2 <= wm + 15) mm_xyt<BF, 4>(pa, Qs, kLdT, Ks, kLdT, wm, wn2, kD, lane);
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + 8 * (e >> 1), col = wn2 + 8 * j + 2 * tq + (e & 1);
      f(r, col, (r < len && col <= r) ? pa[j][e] * exp_fast(gl[r] - gl[col]) : 0.0f);
    }
}

// Row sums of T . a over the warp's 64 columns of a 64x128 accumulator a (rows r0 and r0 + 8,
// columns wn..wn+63; T a 16-bit [64][kLdT] tile), reduced over the quad: every lane gets both.
template <bool BF>
__device__ __forceinline__ void row_dot(const uint16_t* T, const float (&a)[8][4], int r0, int wn, int tq, float& s0,
                                        float& s1) {
  s0 = 0.0f;
  s1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = wn + 8 * j + 2 * tq;
    const uint32_t x0 = ld32(T + r0 * kLdT + col), x1 = ld32(T + (r0 + 8) * kLdT + col);
    s0 += h2f<BF>(static_cast<uint16_t>(x0)) * a[j][0] + h2f<BF>(static_cast<uint16_t>(x0 >> 16)) * a[j][1];
    s1 += h2f<BF>(static_cast<uint16_t>(x1)) * a[j][2] + h2f<BF>(static_cast<uint16_t>(x1 >> 16)) * a[j][3];
  }
  s0 = quad_sum(s0);
  s1 = quad_sum(s1);
}

// The state kernels' register tile x[2][NJ][4] (groups of 4 warps; warp w holds rows 32 (w % 4) ..
// +31, columns 8 NJ (w / 4) .. + 8 NJ - 1 of the [128][8 NJ groups] tile; NJ = 4 but for the
// 16-column narrow form): f(x[mt][j][e], y, xc) for each entry, y its row and xc its column.
template <int NJ, class F>
__device__ __forceinline__ void for_state_frag(float (&x)[2][NJ][4], F&& f) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int y0 = 32 * (warp & 3), c0 = 8 * NJ * (warp >> 2);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) f(x[mt][j][e], y0 + 16 * mt + gq + 8 * (e >> 1), c0 + 8 * j + 2 * tq + (e & 1));
}

// The register tile from state sidx of a [.., K, V] tensor m (columns x0..; zeros when m is
// absent), and back.
template <int NJ>
__device__ __forceinline__ void load_state_frag(float (&x)[2][NJ][4], const Mat& m, int64_t sidx, int x0) {
  for_state_frag(x, [&](float& v, int y, int xc) {
    v = m.p ? ldf(m.p, m.code, sidx * (kD * kD) + static_cast<int64_t>(y) * kD + x0 + xc) : 0.0f;
  });
}
template <int NJ>
__device__ __forceinline__ void store_state_frag(float (&x)[2][NJ][4], const Mat& m, int64_t sidx, int x0) {
  for_state_frag(x, [&](float& v, int y, int xc) {
    stf(m.p, m.code, sidx * (kD * kD) + static_cast<int64_t>(y) * kD + x0 + xc, v);
  });
}

// The state kernels' update x += T^T B over one chunk: T a token-major [64][kLdT] 16-bit tile (its
// A fragments read transposed by ldmatrix), B a [64][ldb] 16-bit tile; warp w's register tile
// (rows 32 (w % 4).., columns 32 (w / 4).., for_state_frag's layout).
template <bool BF, int NJ>
__device__ __forceinline__ void state_tprod(float (&x)[2][NJ][4], const uint16_t* T, const uint16_t* Bm, int ldb,
                                            int lane) {
  const int warp = threadIdx.x >> 5, wr = warp & 3, wc = 8 * NJ * (warp >> 2), mi = lane >> 3, rr = lane & 7;
#pragma unroll
  for (int kk = 0; kk < kMaxBT; kk += 16) {
    uint32_t bf[NJ][2];
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      uint32_t r4[4];
      ldsm_x4_t(r4, Bm + (kk + rr + 8 * (mi & 1)) * ldb + wc + 8 * j + 8 * (mi >> 1));
      bf[j][0] = r4[0], bf[j][1] = r4[1], bf[j + 1][0] = r4[2], bf[j + 1][1] = r4[3];
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      uint32_t a[4];
      ldsm_x4_t(a, T + (kk + rr + 8 * (mi >> 1)) * kLdT + 32 * wr + 16 * mt + 8 * (mi & 1));
#pragma unroll
      for (int j = 0; j < NJ; ++j) mma16816<BF>(x[mt][j], a, bf[j][0], bf[j][1]);
    }
  }
}

// Rows 0..63 of a 16-bit token-major tensor at (b, t0.., head), `chunks` 8-element chunks per row
// from column 0, into dst (row stride ld) by cp.async; rows >= len read as zeros. All threads take
// part; the caller commits and waits.
__device__ __forceinline__ void load_rows(uint16_t* dst, int ld, const Tok& t, int64_t b, int64_t t0, int64_t head,
                                          int len, int chunks) {
  const uint16_t* base = static_cast<const uint16_t*>(t.p);
  for (int e = threadIdx.x; e < kMaxBT * chunks; e += blockDim.x) {
    const int r = e / chunks, col = (e - r * chunks) << 3;
    const bool ok = r < len;
    cp_async16(dst + r * ld + col, base + t.off(b, t0 + (ok ? r : 0), head) + col, ok);
  }
}

// The [128][128] 16-bit state `sidx` of m into dst (row stride kLdT) by cp.async.
__device__ __forceinline__ void load_state16(uint16_t* dst, const Mat& m, int64_t sidx) {
  const uint16_t* base = static_cast<const uint16_t*>(m.p) + sidx * (kD * kD);
  for (int e = threadIdx.x; e < kD * (kD / 8); e += blockDim.x) {
    const int r = e >> 4, col = (e & 15) << 3;
    cp_async16(dst + r * kLdT + col, base + r * kD + col, true);
  }
}

// Two adjacent outputs (element offset i even) in the output's dtype; and two inputs as float.
__device__ __forceinline__ void st2(void* p, int code, int64_t i, float a, float b) {
  if (code == kF32) *reinterpret_cast<float2*>(static_cast<float*>(p) + i) = float2{a, b};
  else if (code == kBF16) *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) = __floats2bfloat162_rn(a, b);
  else *reinterpret_cast<__half2*>(static_cast<__half*>(p) + i) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void ld2(const void* p, int code, int64_t i, float& a, float& b) {
  if (code == kF32) {
    const float2 x = *reinterpret_cast<const float2*>(static_cast<const float*>(p) + i);
    a = x.x, b = x.y;
  } else {
    a = ldf(p, code, i);
    b = ldf(p, code, i + 1);
  }
}

// The warp's accumulator rows r0 and r0 + 8 that lie below len (columns n0 + 8 j + 2 tq, tq =
// lane % 4: the mma layout) into the token-major output t at (b, t0 + row, head).
template <int NJ>
__device__ __forceinline__ void store_rows2(const float (&acc)[NJ][4], const Tok& t, int64_t b, int64_t t0,
                                            int64_t head, int r0, int n0, int tq, int len) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int col = n0 + 8 * j + 2 * tq;
    if (r0 < len) st2(t.p, t.code, t.off(b, t0 + r0, head) + col, acc[j][0], acc[j][1]);
    if (r0 + 8 < len) st2(t.p, t.code, t.off(b, t0 + r0 + 8, head) + col, acc[j][2], acc[j][3]);
  }
}

// Two floats as one register of two 16-bit values (a in the low half).
template <bool BF>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  return static_cast<uint32_t>(f2h<BF>(a)) | (static_cast<uint32_t>(f2h<BF>(b)) << 16);
}

// The warp's accumulator rows r0 and r0 + 8 (store_rows2's layout), times s, rounded to 16 bits
// into the shared tile T (row stride ld), for store_rows16 / warp_copy_rows16. With ld = kLdT the
// 8 rows x 4 column pairs of a fragment hit 32 distinct banks.
template <bool BF, int NJ>
__device__ __forceinline__ void stage_rows16(const float (&acc)[NJ][4], uint16_t* T, int ld, int r0, int n0, int tq,
                                             float s = 1.0f) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    const int col = n0 + 8 * j + 2 * tq;
    *reinterpret_cast<uint32_t*>(T + r0 * ld + col) = pack2<BF>(s * acc[j][0], s * acc[j][1]);
    *reinterpret_cast<uint32_t*>(T + (r0 + 8) * ld + col) = pack2<BF>(s * acc[j][2], s * acc[j][3]);
  }
}

// Rows 0..len-1 of the 16-bit shared tile T (row stride ld), `chunks` 8-element chunks per row,
// into the token-major 16-bit tensor t at (b, t0.., head), one 16-byte store per chunk (the mma
// layout's own stores write 4 bytes per row and thread: half of each 32-byte sector per
// instruction). All threads take part, after a barrier that made T visible.
__device__ __forceinline__ void store_rows16(const uint16_t* T, int ld, const Tok& t, int64_t b, int64_t t0,
                                             int64_t head, int len, int chunks) {
  uint16_t* base = static_cast<uint16_t*>(t.p);
  for (int e = threadIdx.x; e < len * chunks; e += blockDim.x) {
    const int r = e / chunks, col = (e - r * chunks) << 3;
    *reinterpret_cast<uint4*>(base + t.off(b, t0 + r, head) + col) = *reinterpret_cast<const uint4*>(T + r * ld + col);
  }
}

// Rows rb .. rb + R - 1, columns cb .. cb + 8 NJ - 1 of the 16-bit shared tile T (row stride
// ld), written by this warp alone, to global memory by 16-byte stores: tile row y goes to
// row_ptr(y) + cb (row_ptr(y) is the global row of tile row y, already at the tile's first
// column); tile rows at or past nvalid are not stored. A __syncwarp first makes the warp's own
// writes visible; no other warp may write the region meanwhile. With the tiles' padded row strides
// (ld = 8 mod 64 elements: 68 or 36 words per row) each 8-lane phase reads one 128-byte row
// (NJ = 8) or rows r and r + 4, 16 banks apart (NJ = 4): no bank conflicts. NJ = 2 (16 columns,
// ld = 24: 12 words per row) reads four 32-byte rows per phase, at most two-way conflicted.
template <int R, int NJ, class RowPtr>
__device__ __forceinline__ void warp_copy_rows16(const uint16_t* T, int ld, int rb, int cb, RowPtr row_ptr, int nvalid,
                                                 int lane) {
  static_assert((NJ == 2 && R % 16 == 0) || (NJ == 4 && R % 16 == 0) || (NJ == 8 && R % 8 == 0),
                "blocks of 16, 32 or 64 columns");
  __syncwarp();
#pragma unroll
  for (int q = 0; q < R * NJ / 32; ++q) {
    const int r = rb + (NJ == 8   ? (lane >> 3) + 4 * q
                        : NJ == 4 ? (lane >> 3) + 4 * ((lane >> 2) & 1) + 8 * q
                                  : (lane >> 1) + 16 * q);
    const int c = cb + 8 * (NJ == 8 ? lane & 7 : NJ == 4 ? lane & 3 : lane & 1);
    if (r < nvalid) *reinterpret_cast<uint4*>(row_ptr(r) + c) = *reinterpret_cast<const uint4*>(T + r * ld + c);
  }
}

// A warp's [16][8 NJ] block of a 16-bit output (the mma accumulators acc[j] of rows rb + gq and
// rb + gq + 8, columns cb + 8 j + 2 tq, times s) into the token-major tensor t at (b, t0 + row,
// head) through the warp's own region of a free shared tile T (row stride ld, conflict-free
// fragment writes at the padded strides): rows leave as 16-byte stores (full 32-byte sectors)
// instead of 4-byte pairs (half sectors). Rows at or past len are not stored.
template <bool BF, int NJ>
__device__ __forceinline__ void store_warp_rows16(const float (&acc)[NJ][4], float s, uint16_t* T, int ld, int rb,
                                                  int cb, const Tok& t, int64_t b, int64_t t0, int64_t head,
                                                  int len, int lane) {
  static_assert(NJ == 4 || NJ == 8, "blocks of 32 or 64 columns");
  stage_rows16<BF, NJ>(acc, T, ld, rb + (lane >> 2), cb, lane & 3, s);
  uint16_t* base = static_cast<uint16_t*>(t.p);
  warp_copy_rows16<16, NJ>(T, ld, rb, cb, [&](int r) { return base + t.off(b, t0 + r, head); }, len, lane);
}

// The state kernels' register tile (for_state_frag's layout) rounded to 16 bits into Xs (row stride
// ldx, columns of the CTA's tile) and, when snap is given, into state sidx of that [.., K, V] 16-bit
// tensor at columns x0 + the tile's, by 16-byte rows from Xs (stop 22: the fragments' 4-byte pair
// stores, and the switch FUSEDOPS_GDN_STAGED_STORES that kept them, went).
template <bool BF, int NJ>
__device__ __forceinline__ void store_state16(const float (&x)[2][NJ][4], uint16_t* Xs, int ldx, void* snap,
                                              int64_t sidx, int x0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int y0 = 32 * (warp & 3), c0 = 8 * NJ * (warp >> 2);
  uint16_t* base = snap ? static_cast<uint16_t*>(snap) + sidx * (kD * kD) + x0 : nullptr;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int y = y0 + 16 * mt + gq + 8 * hr, xc = c0 + 8 * j + 2 * tq;
        const uint32_t pk = pack2<BF>(x[mt][j][2 * hr], x[mt][j][2 * hr + 1]);
        *reinterpret_cast<uint32_t*>(Xs + y * ldx + xc) = pk;
      }
  // The snapshot leaves from the warp's own [32][8 NJ] block of Xs by 16-byte rows.
  if (base) warp_copy_rows16<32, NJ>(Xs, ldx, y0, c0, [&](int y) { return base + y * kD; }, kD, lane);
}

// chunk_bwd_dqkwg's gate gradient (dqkwg_mma_kernel and cuda_sm90's dqkwg_wg_kernel), thread i < len
// of the CTA: dg_i = rowsum(M)_i - colsum(M)_i + scale e^{g_i} rowsum(Q . dO h^T)_i -
// rowsum(dKi . K)_i (rs: the row terms of two column halves; cs: M's column sums of four row
// quarters), and for the last row e^{g_last} <h, dh> + sum_i rowsum(dKi . K)_i (red, redk: per warp).
__device__ __forceinline__ void dqkwg_dg_row(const float* rs, const float* cs, const float* red, const float* redk,
                                             int warps, float glast, const Tok& dg, const ChunkPos& c, int hv,
                                             int i) {
  float v = (rs[i] + rs[kMaxBT + i]) - ((cs[i] + cs[kMaxBT + i]) + (cs[2 * kMaxBT + i] + cs[3 * kMaxBT + i]));
  if (i == c.len - 1) {
    float s = 0.0f, u = 0.0f;
    for (int w = 0; w < warps; ++w) {
      s += red[w];
      u += redk[w];
    }
    v += exp_fast(glast) * s + u;
  }
  dg.st_(c.b, c.t0 + i, hv, 0, v);
}

// Host side. A 16-bit token-major input [B,T,H,D] these kernels can stage: dtype dt, 16-byte
// aligned, unit last stride, the other strides multiples of 8 elements.
inline bool tok16_ok(const TensorView& t, DType dt) {
  return t.dtype() == dt && reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 && t.stride(3) == 1 &&
         t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0;
}
// An fp32 token-major input [B,T,H,D] read 16 bytes at a time (cp.async or float4).
inline bool tok32_ok(const TensorView& t) {
  return t.dtype() == DType::kFloat32 && reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 && t.stride(3) == 1 &&
         t.stride(0) % 4 == 0 && t.stride(1) % 4 == 0 && t.stride(2) % 4 == 0;
}
// A [.., K, V] state these kernels can stage.
inline bool state16_ok(const TensorView& t, DType dt) {
  return t.dtype() == dt && reinterpret_cast<uintptr_t>(t.data()) % 16 == 0 && t.is_contiguous();
}
// An output [B,T,H,D] (any dtype) written two elements at a time.
inline bool out2_ok(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data()) % 8 == 0 && t.stride(3) == 1 && t.stride(0) % 2 == 0 &&
         t.stride(1) % 2 == 0 && t.stride(2) % 2 == 0;
}
// bf16 or fp16, and the device's per-block shared memory reaches `smem`.
inline bool tc16_device_ok(const Context& ctx, DType dt, size_t smem, const char* op) {
  if (dt != DType::kBFloat16 && dt != DType::kFloat16) return false;
  return smem_optin(op, ctx.device.index) >= smem;
}

// Whether a kernel's two token-major outputs a, b (W and U; dq and dk; or one output passed
// twice) go out through shared memory by 16-byte row stores (wu_products' `staged`,
// store_warp_rows16): both 16-bit of the inputs' type dt with 16-byte aligned rows.
inline bool staged_out_ok(const TensorView& a, const TensorView& b, DType dt) {
  return tok16_ok(a, dt) && tok16_ok(b, dt);
}

// Whether the state kernels take 64-column V tiles (two warp groups per CTA, each K/W tile shared
// by both): when `states` (sequences x value heads) x 2 CTAs still reach every SM.
// FUSEDOPS_GDN_WIDE_STATE=1 or 0 forces the choice (test-only: the GPU tests run both forms).
inline bool wide_state_tiles(const Context& ctx, int64_t states) {
  const int force = env::force("FUSEDOPS_GDN_WIDE_STATE");
  if (force >= 0) return force == 1;
  return states * (kD / 64) >= sm_count("chunk_gated_delta_rule", ctx.device.index);
}

// Whether a narrow state kernel's CTAs (one warp group each, `cols` V columns: kD / cols per
// state) fit one per SM, where its forms with more buffer sets (one CTA per SM) pay.
inline bool narrow_one_per_sm(const Context& ctx, int64_t states, int cols) {
  return states * (kD / cols) <= sm_count("chunk_gated_delta_rule", ctx.device.index);
}

// Whether the narrow state kernels (one warp group per CTA: fwd_h, dhu) take 16-column V tiles
// instead of 32: when `states` x 8 CTAs fit one per SM (B = 1, T = 32768, H = 16: 128 CTAs
// instead of 64, each step's products per warp halved on the chain). FUSEDOPS_GDN_NARROW16=1 or
// 0 forces the choice (test-only).
inline bool narrow16_state_tiles(const Context& ctx, int64_t states) {
  const int force = env::force("FUSEDOPS_GDN_NARROW16");
  if (force >= 0) return force == 1;
  return narrow_one_per_sm(ctx, states, 16);
}

}  // namespace fusedops::la::sm80::mma16
