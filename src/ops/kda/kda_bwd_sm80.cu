// KDA (Kimi delta attention), CUDA backend cuda_sm80: the backward-direction chunk operators
// chunk_kda_bwd_wy_dqkg_fused (K3) and chunk_kda_bwd_intra (K4), and chunk_kda backward through
// kda::compose_bwd (see kda_sm80.cu for the conventions). Both kernels run one CTA of 256 threads
// per (chunk, q/k head) and loop over the head's group of value heads; dq and dk (summed over the
// group) are accumulated in the output by the thread that owns the element, in value-head order,
// so results are deterministic without atomics.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/kda.h"
#include "src/cuda/check.cuh"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"
#include "src/ops/kda/kda_sm80.cuh"
#include "src/ops/kda/kda_top.h"

namespace fusedops::kda::sm80 {
namespace {

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

constexpr int kTile = kMaxBT * kLd;  // one [64][69] fp32 tile

// ---------------------------------------------------------------------------------------------
// chunk_kda_bwd_wy_dqkg_fused (K3). Per value head of the group:
//  phase A, per 64-column V slice: dA += dVn V^T; P = Akk^T dVn; dv = beta P; db += rowsum(P V).
//  phase B, per 64-channel K slice: over the V slices dW = -dVn S^T, dQh = dO S^T, dKi = Vn dH^T,
//    sdh = rowsum(S . dH); then dQh *= scale e^g, dKi *= e^{g_last - g}, Ke = K e^g,
//    dA += dW Ke^T, R = Akk^T dW, db += rowsum(R Ke), dg = Q dQh - K dKi + beta Ke R (+ the last
//    row terms e^{g_last} sdh + colsum(K dKi)), dq += dQh, dk += dKi + beta e^g R.
//  Then dA = M> . dA diag(beta), dAkk = -M> . (Akk^T (dA Akk^T)).
// Dynamic shared memory: 8 tiles [64][69] (Am, dA, dW, dQh, dKi, T1, T2, T3) + 4 x 64 floats
// = 134.1 KB (sm_80 allows 163 KB).

constexpr size_t kWySmem = sizeof(float) * (8 * kTile + 4 * kMaxBT);

__global__ void __launch_bounds__(kThreads, 1) wy_kernel(Tok q, Tok k, Tok v, Tok vn, Tok gk, Tok beta, Tok Akk,
                                                         Mat h, Mat dh, Tok dout, Tok dvn, Tok dq, Tok dk, Tok dv,
                                                         Tok dbeta, Tok dg, Tok dAkk, Layout L, int K, int V,
                                                         int HV, int G, float scale) {
  extern __shared__ float smem[];
  float* Am = smem;
  float* dA = Am + kTile;
  float* dW = dA + kTile;
  float* dQh = dW + kTile;
  float* dKi = dQh + kTile;
  float* T1 = dKi + kTile;
  float* T2 = T1 + kTile;
  float* T3 = T2 + kTile;
  float* bs = T3 + kTile;      // beta [64]
  float* dbr = bs + kMaxBT;    // dbeta accumulator [64]
  float* sdh = dbr + kMaxBT;   // [64] rowsum(S . dH) of the K slice
  float* kd = sdh + 64;        // [64] colsum(K . dKi) of the K slice
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hk = blockIdx.y, len = c.len, BT = L.BT;
  if (len == 0) return;
  const int64_t tl = c.t0 + len - 1;
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    const int64_t sidx = chunk * HV + hv;
    __syncthreads();
    load_tri(Am, Akk, c.b, c.t0, hv, len, L.BT, false);
    fill(dA, kTile, 0.0f);
    if (threadIdx.x < kMaxBT) {
      bs[threadIdx.x] = threadIdx.x < len ? beta.ld(c.b, c.t0 + threadIdx.x, hv, 0) : 0.0f;
      dbr[threadIdx.x] = 0.0f;
    }
    // Phase A.
    for (int x0 = 0; x0 < V; x0 += 64) {
      const int vw = imin(64, V - x0);
      __syncthreads();
      load_tile(T1, kLd, kMaxBT, 64, dvn, c.b, c.t0, hv, len, x0, V);
      load_tile(T2, kLd, kMaxBT, 64, v, c.b, c.t0, hv, len, x0, V);
      __syncthreads();
      mm(L.tc, len, len, vw, T1, kLd, 1, T2, 1, kLd, [&](int m, int n, float val) { dA[m * kLd + n] += val; });
      mm(L.tc, len, vw, len, Am, 1, kLd, T1, kLd, 1, [&](int m, int n, float val) { T3[m * kLd + n] = val; });
      __syncthreads();
      if (threadIdx.x < len) {
        const int r = threadIdx.x;
        float s = 0.0f;
        for (int x = 0; x < vw; ++x) s = fmaf(T3[r * kLd + x], T2[r * kLd + x], s);
        dbr[r] += s;
      }
      for (int e = threadIdx.x; e < len * vw; e += blockDim.x) {
        const int r = e / vw, x = e - r * vw;
        dv.st_(c.b, c.t0 + r, hv, x0 + x, bs[r] * T3[r * kLd + x]);
      }
    }
    // Phase B.
    for (int y0 = 0; y0 < K; y0 += 64) {
      const int kw = imin(64, K - y0);
      __syncthreads();
      fill(dW, kTile, 0.0f);
      fill(dQh, kTile, 0.0f);
      fill(dKi, kTile, 0.0f);
      if (threadIdx.x < 64) sdh[threadIdx.x] = 0.0f;
      for (int x0 = 0; x0 < V; x0 += 64) {
        const int vw = imin(64, V - x0);
        __syncthreads();
        load_state(T1, kLd, 64, 64, h, sidx, K, V, y0, x0);   // S[ch][v]
        load_state(T3, kLd, 64, 64, dh, sidx, K, V, y0, x0);  // dH[ch][v]
        load_tile(T2, kLd, kMaxBT, 64, dvn, c.b, c.t0, hv, len, x0, V);
        __syncthreads();
        mm(L.tc, len, kw, vw, T2, kLd, 1, T1, 1, kLd, [&](int m, int n, float val) { dW[m * kLd + n] -= val; });
        if (threadIdx.x < kw) {
          const int y = threadIdx.x;
          float s = 0.0f;
          for (int x = 0; x < vw; ++x) s = fmaf(T1[y * kLd + x], T3[y * kLd + x], s);
          sdh[y] += s;
        }
        __syncthreads();
        load_tile(T2, kLd, kMaxBT, 64, dout, c.b, c.t0, hv, len, x0, V);
        __syncthreads();
        mm(L.tc, len, kw, vw, T2, kLd, 1, T1, 1, kLd, [&](int m, int n, float val) { dQh[m * kLd + n] += val; });
        __syncthreads();
        load_tile(T2, kLd, kMaxBT, 64, vn, c.b, c.t0, hv, len, x0, V);
        __syncthreads();
        mm(L.tc, len, kw, vw, T2, kLd, 1, T3, 1, kLd, [&](int m, int n, float val) { dKi[m * kLd + n] += val; });
      }
      __syncthreads();
      // Gates; Ke = K e^g into T1, Q into T3, the raw K into T2.
      for (int e = threadIdx.x; e < kMaxBT * 64; e += blockDim.x) {
        const int r = e / 64, y = e - r * 64;
        float ke = 0.0f, qq = 0.0f, kk = 0.0f;
        if (r < len && y < kw) {
          const float gv = gk.ld(c.b, c.t0 + r, hv, y0 + y);
          const float eg = expf(gv);
          kk = k.ld(c.b, c.t0 + r, hk, y0 + y);
          qq = q.ld(c.b, c.t0 + r, hk, y0 + y);
          ke = kk * eg;
          dQh[r * kLd + y] *= scale * eg;
          dKi[r * kLd + y] *= expf(gk.ld(c.b, tl, hv, y0 + y) - gv);
        }
        T1[r * kLd + y] = ke;
        T2[r * kLd + y] = kk;
        T3[r * kLd + y] = qq;
      }
      __syncthreads();
      // dA += dW Ke^T; kd = colsum(K . dKi).
      mm(L.tc, len, len, kw, dW, kLd, 1, T1, 1, kLd, [&](int m, int n, float val) { dA[m * kLd + n] += val; });
      if (threadIdx.x < kw) {
        const int y = threadIdx.x;
        float s = 0.0f;
        for (int r = 0; r < len; ++r) s = fmaf(T2[r * kLd + y], dKi[r * kLd + y], s);
        kd[y] = s;
      }
      __syncthreads();
      // R = Akk^T dW into T2 (the raw K is dead; it is re-read from global below).
      mm(L.tc, len, kw, len, Am, 1, kLd, dW, kLd, 1, [&](int m, int n, float val) { T2[m * kLd + n] = val; });
      __syncthreads();
      if (threadIdx.x < len) {
        const int r = threadIdx.x;
        float s = 0.0f;
        for (int y = 0; y < kw; ++y) s = fmaf(T2[r * kLd + y], T1[r * kLd + y], s);
        dbr[r] += s;
      }
      for (int e = threadIdx.x; e < len * kw; e += blockDim.x) {
        const int r = e / kw, y = e - r * kw;
        const float R = T2[r * kLd + y], ke = T1[r * kLd + y], qq = T3[r * kLd + y];
        const float kk = k.ld(c.b, c.t0 + r, hk, y0 + y);
        const float eg = expf(gk.ld(c.b, c.t0 + r, hv, y0 + y));
        const float dqh = dQh[r * kLd + y], dki = dKi[r * kLd + y];
        float dgv = qq * dqh - kk * dki + bs[r] * ke * R;
        if (r == len - 1) dgv += expf(gk.ld(c.b, tl, hv, y0 + y)) * sdh[y] + kd[y];
        dg.st_(c.b, c.t0 + r, hv, y0 + y, dgv);
        const float dkv = dki + bs[r] * eg * R;
        if (gi == 0) {
          dq.st_(c.b, c.t0 + r, hk, y0 + y, dqh);
          dk.st_(c.b, c.t0 + r, hk, y0 + y, dkv);
        } else {
          dq.st_(c.b, c.t0 + r, hk, y0 + y, dq.ld(c.b, c.t0 + r, hk, y0 + y) + dqh);
          dk.st_(c.b, c.t0 + r, hk, y0 + y, dk.ld(c.b, c.t0 + r, hk, y0 + y) + dkv);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < len) dbeta.st_(c.b, c.t0 + threadIdx.x, hv, 0, dbr[threadIdx.x]);
    // dA = M> . dA diag(beta); X = dA Akk^T (T1); dAkk = -M> . (Akk^T X).
    for (int e = threadIdx.x; e < kMaxBT * kMaxBT; e += blockDim.x) {
      const int i = e / kMaxBT, j = e - i * kMaxBT;
      dA[i * kLd + j] = (i < len && j < i) ? dA[i * kLd + j] * bs[j] : 0.0f;
    }
    __syncthreads();
    mm(L.tc, len, len, len, dA, kLd, 1, Am, 1, kLd, [&](int m, int n, float val) { T1[m * kLd + n] = val; });
    __syncthreads();
    mm(L.tc, len, len, len, Am, 1, kLd, T1, kLd, 1, [&](int m, int n, float val) { T2[m * kLd + n] = val; });
    __syncthreads();
    for (int e = threadIdx.x; e < len * BT; e += blockDim.x) {
      const int i = e / BT, j = e - i * BT;
      dAkk.st_(c.b, c.t0 + i, hv, j, j < i ? -T2[i * kLd + j] : 0.0f);
    }
  }
}

// --------------------------------------------------------------------------------------------- K3
// on 16-bit tensor cores, for the common shape: K = V = 128, chunk 64; q, k, v, v_new, dout, dvn,
// Akk, h and dh all bf16 or all fp16, gk fp32, 16-byte aligned rows. Same grid and math as
// wy_kernel, one CTA of 8 warps per (chunk, q/k head), value heads in order, 208 KiB of shared
// memory. Per value head the operands arrive as 16-bit tiles by cp.async (Vnew later into dO's
// buffer, dH into S's, each once its buffer's last reader is done; rowsum(S . dH) taken while dH
// replaces S) and gk as an fp32 tile; every product is an m16n8k16 mma with fp32 register
// accumulators, warp tiles as in GDN's dqkwg_mma_kernel (rows 16 (w % 4).., columns 64 (w / 4).. of
// 64x128 outputs, 32 (w / 4).. of 64x64 ones; Akk^T and the state products' transposes read by
// ldmatrix.trans):
//   dA = dVn V^T + dW Ke^T (registers);  P = Akk^T dVn: dv = beta P, dbeta = rowsum(P . V) + rowsum(R . Ke)
//   dW = -dVn S^T (rounded to 16-bit as an operand);  dQ = scale e^gk (dO S^T);  R = Akk^T dW
//   dKi = e^{gk_last - gk} (Vnew dH^T);  dk += dKi + beta e^gk R;  dq += dQ
//   dg = Q dQ - K dKi + beta Ke R (+ the last row's e^{gk_last} rowsum(S . dH) + colsum(K dKi))
//   dA = M> . dA diag(beta) -> X = dA Akk^T -> dAkk = -M> . (Akk^T X)  (dA and X rounded to 16-bit)
// with Ke = K e^gk (fp32 in the element-wise terms, 16-bit as the dA operand). dq and dk
// accumulate over the group in registers; every reduction runs in a fixed order.
namespace wy16 {
using namespace la::sm80::mma16;
constexpr int kLdG = kD + 4;  // fp32 [64][132] gate tile
constexpr size_t kSmem = 2 * (7 * static_cast<size_t>(kTok) + kSt + 2 * kMaxBT * kLdA) +
                         4 * (static_cast<size_t>(kMaxBT) * kLdG + 3 * kMaxBT + 2 * kD + 4 * kD);
}  // namespace wy16

template <bool BF>
__global__ void __launch_bounds__(kThreads, 1) wy_mma_kernel(Tok q, Tok k, Tok v, Tok vn, Tok gk, Tok beta, Tok Akk,
                                                             Mat h, Mat dh, Tok dout, Tok dvn, Tok dq, Tok dk, Tok dv,
                                                             Tok dbeta, Tok dg, Tok dAkk, Layout L, int HV, int G,
                                                             float scale) {
  using namespace la::sm80;
  using namespace la::sm80::mma16;
  using wy16::kLdG;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Ks = Qs + kTok;
  uint16_t* dVs = Ks + kTok;
  uint16_t* Vs = dVs + kTok;
  uint16_t* dOs = Vs + kTok;  // dO, then Vnew
  uint16_t* Kes = dOs + kTok;
  uint16_t* dWs = Kes + kTok;
  uint16_t* Ss = dWs + kTok;  // S, then dH
  uint16_t* As = Ss + kSt;
  uint16_t* dAs = As + kMaxBT * kLdA;  // dA, then X
  float* Gs = reinterpret_cast<float*>(dAs + kMaxBT * kLdA);  // [64][kLdG] gk
  float* bs = Gs + kMaxBT * kLdG;  // [64] beta
  float* rb = bs + kMaxBT;         // [2][64]: per column half, the row sums of dbeta
  float* gkl = rb + 2 * kMaxBT;    // [128] gk of the chunk's last row
  float* sdh = gkl + kD;           // [128] rowsum(S . dH)
  float* kc = sdh + kD;            // [4][128]: per row quarter, colsum(K . dKi)
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2), wn2 = 32 * (warp >> 2), half = warp >> 2;
  const int r0 = wm + (lane >> 2), r1 = r0 + 8;
  const bool live = wn2 <= wm + 15;  // this warp's 64x64 tile reaches the diagonal
  auto load_tok = [&](uint16_t* dst, const Tok& t, int head) { load_rows(dst, kLdT, t, c.b, c.t0, head, len, kD / 8); };
  auto row_of = [&](int e) { return e < 2 ? r0 : r1; };
  float dqa[8][4], dka[8][4];
  zero(dqa);
  zero(dka);
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    const int64_t sidx = chunk * HV + hv;
    if (gi > 0) __syncthreads();  // the previous value head is done with every buffer
    if (gi == 0) {
      load_tok(Qs, q, hk);
      load_tok(Ks, k, hk);
    }
    load_tok(dVs, dvn, hv);
    load_tok(Vs, v, hv);
    load_tok(dOs, dout, hv);
    load_rows(As, kLdA, Akk, c.b, c.t0, hv, len, kMaxBT / 8);
    load_state16(Ss, h, sidx);
    {
      const float* gb = static_cast<const float*>(gk.p);
      for (int e = tid; e < kMaxBT * (kD / 4); e += kThreads) {
        const int r = e >> 5, col = (e & 31) << 2;
        const bool ok = r < len;
        cp_async16(Gs + r * kLdG + col, gb + gk.off(c.b, c.t0 + (ok ? r : 0), hv) + col, ok);
      }
    }
    cp_async_commit();
    if (tid < kMaxBT) bs[tid] = tid < len ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    if (tid < kD) gkl[tid] = gk.ld(c.b, c.t0 + len - 1, hv, tid);
    cp_async_wait<0>();
    __syncthreads();
    // Akk's lower triangle (diagonal included); Ke = K e^gk as 16-bit.
    for (int e = tid; e < kMaxBT * kMaxBT; e += kThreads) {
      const int i = e >> 6, j = e & 63;
      if (j > i) As[i * kLdA + j] = uint16_t{0};
    }
    for (int e = tid; e < kMaxBT * (kD / 2); e += kThreads) {
      const int r = e >> 6, y = (e & 63) << 1;
      const uint32_t kk = ld32(Ks + r * kLdT + y);
      const float a = h2f<BF>(static_cast<uint16_t>(kk)) * exp_fast(Gs[r * kLdG + y]);
      const float b = h2f<BF>(static_cast<uint16_t>(kk >> 16)) * exp_fast(Gs[r * kLdG + y + 1]);
      *reinterpret_cast<uint32_t*>(Kes + r * kLdT + y) =
          pack2<BF>(a, b);
    }
    __syncthreads();  // Akk, Ke
    // dA = dVn V^T (the dW Ke^T term follows); P = Akk^T dVn: dv = beta P, rowsum(P . V).
    float da[4][4];
    zero(da);
    if (live) mm_xyt<BF, 4>(da, dVs, kLdT, Vs, kLdT, wm, wn2, kD, lane);
    float x0 = 0.0f, x1 = 0.0f;  // row sums for dbeta already reduced over the quad
    {
      float pa[8][4];
      zero(pa);
      mm_xts<BF, 8>(pa, As, kLdA, dVs, kLdT, wm, wn, wm, kMaxBT, lane);
      float u0, u1;
      row_dot<BF>(Vs, pa, r0, wn, tq, u0, u1);
      x0 += u0;
      x1 += u1;
      const float b0 = bs[r0], b1 = bs[r1];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = wn + 8 * j + 2 * tq;
        if (r0 < len) st2(dv.p, dv.code, dv.off(c.b, c.t0 + r0, hv) + col, b0 * pa[j][0], b0 * pa[j][1]);
        if (r1 < len) st2(dv.p, dv.code, dv.off(c.b, c.t0 + r1, hv) + col, b1 * pa[j][2], b1 * pa[j][3]);
      }
    }
    // dW = -dVn S^T, 16-bit into dWs.
    {
      float aw[8][4];
      zero(aw);
      mm_xyt<BF, 8>(aw, dVs, kLdT, Ss, kLdT, wm, wn, kD, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r1 : r0, col = wn + 8 * j + 2 * tq;
          *reinterpret_cast<uint32_t*>(dWs + r * kLdT + col) =
              pack2<BF>(-aw[j][2 * hr], -aw[j][2 * hr + 1]);
        }
    }
    // dQ = scale e^gk (dO S^T): dq += dQ, dg = Q . dQ.
    float dga[8][4];
    {
      float aq[8][4];
      zero(aq);
      mm_xyt<BF, 8>(aq, dOs, kLdT, Ss, kLdT, wm, wn, kD, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = row_of(e), col = wn + 8 * j + 2 * tq + (e & 1);
          const float d = r < len ? scale * exp_fast(Gs[r * kLdG + col]) * aq[j][e] : 0.0f;
          dqa[j][e] += d;
          dga[j][e] = h2f<BF>(Qs[r * kLdT + col]) * d;
        }
    }
    // dH's pieces into registers before the barrier, so that their latency overlaps the wait.
    constexpr int kPer = kD * (kD / 8) / kThreads;
    uint4 yv[kPer];
    {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(dh.p) + sidx * (kD * kD));
#pragma unroll
      for (int i = 0; i < kPer; ++i) yv[i] = src[tid + i * kThreads];
    }
    __syncthreads();  // dW; every read of dO and S done
    // Vnew into dO's buffer (under the next products); dH replaces S, rowsum(S . dH) on the way
    // (each 16-byte piece read and written by one thread; a row's 16 pieces by 16 adjacent lanes).
    load_tok(dOs, vn, hv);
    cp_async_commit();
    {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = tid + i * kThreads, r = e >> 4, col = (e & 15) << 3;
        uint4* dst = reinterpret_cast<uint4*>(Ss + r * kLdT + col);
        const uint4 xv = *dst;
        const uint32_t xs[4] = {xv.x, xv.y, xv.z, xv.w}, ys[4] = {yv[i].x, yv[i].y, yv[i].z, yv[i].w};
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; ++u)
          sum += h2f<BF>(static_cast<uint16_t>(xs[u])) * h2f<BF>(static_cast<uint16_t>(ys[u])) +
                 h2f<BF>(static_cast<uint16_t>(xs[u] >> 16)) * h2f<BF>(static_cast<uint16_t>(ys[u] >> 16));
        *dst = yv[i];
#pragma unroll
        for (int m = 1; m < 16; m <<= 1) sum += shfl_xor(sum, m);
        if ((lane & 15) == 0) sdh[r] = sum;
      }
    }
    // dA += dW Ke^T; R = Akk^T dW: rowsum(R . Ke), dk += beta e^gk R, dg += beta Ke . R.
    if (live) mm_xyt<BF, 4>(da, dWs, kLdT, Kes, kLdT, wm, wn2, kD, lane);
    float t0 = 0.0f, t1 = 0.0f;  // per-lane row sums for dbeta
    {
      float ra[8][4];
      zero(ra);
      mm_xts<BF, 8>(ra, As, kLdA, dWs, kLdT, wm, wn, wm, kMaxBT, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = row_of(e), col = wn + 8 * j + 2 * tq + (e & 1);
          const float eg = r < len ? exp_fast(Gs[r * kLdG + col]) : 0.0f;
          const float ke = h2f<BF>(Ks[r * kLdT + col]) * eg, rv = ra[j][e], b = bs[r];
          if (e < 2) t0 += rv * ke;
          else t1 += rv * ke;
          dka[j][e] += b * eg * rv;
          dga[j][e] += b * ke * rv;
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // Vnew, dH, sdh
    // dKi = e^{gk_last - gk} (Vnew dH^T): dk += dKi, dg -= K . dKi, colsum(K . dKi).
    {
      float ak[8][4];
      zero(ak);
      mm_xyt<BF, 8>(ak, dOs, kLdT, Ss, kLdT, wm, wn, kD, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float cc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = row_of(e), col = wn + 8 * j + 2 * tq + (e & 1);
          const float d = r < len ? exp_fast(gkl[col] - Gs[r * kLdG + col]) * ak[j][e] : 0.0f;
          const float kd = h2f<BF>(Ks[r * kLdT + col]) * d;
          dka[j][e] += d;
          dga[j][e] -= kd;
          cc[e & 1] += kd;
        }
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float v2 = cc[x];
          v2 += shfl_xor(v2, 4);
          v2 += shfl_xor(v2, 8);
          v2 += shfl_xor(v2, 16);
          if (lane < 4) kc[(warp & 3) * kD + wn + 8 * j + 2 * tq + x] = v2;
        }
      }
    }
    t0 = quad_sum(t0);
    t1 = quad_sum(t1);
    if (tq == 0) {
      rb[half * kMaxBT + r0] = t0 + x0;
      rb[half * kMaxBT + r1] = t1 + x1;
    }
    // dA = M> . dA diag(beta), 16-bit.
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row_of(e), col = wn2 + 8 * j + 2 * tq + (e & 1);
        dAs[r * kLdA + col] = f2h<BF>((r < len && col < r) ? da[j][e] * bs[col] : 0.0f);
      }
    __syncthreads();  // kc, rb, dA
    // dg (the last row with its extra terms), dbeta.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = hr ? r1 : r0, col = wn + 8 * j + 2 * tq;
        if (r >= len) continue;
        float a = dga[j][2 * hr], b = dga[j][2 * hr + 1];
        if (r == len - 1) {
          a += exp_fast(gkl[col]) * sdh[col] + ((kc[col] + kc[kD + col]) + (kc[2 * kD + col] + kc[3 * kD + col]));
          b += exp_fast(gkl[col + 1]) * sdh[col + 1] +
               ((kc[col + 1] + kc[kD + col + 1]) + (kc[2 * kD + col + 1] + kc[3 * kD + col + 1]));
        }
        st2(dg.p, dg.code, dg.off(c.b, c.t0 + r, hv) + col, a, b);
      }
    if (tid < len) dbeta.st_(c.b, c.t0 + tid, hv, 0, rb[tid] + rb[kMaxBT + tid]);
    // X = dA Akk^T (16-bit, over dA once every warp has read it); dAkk = -M> . (Akk^T X).
    {
      float xa[4][4];
      zero(xa);
      mm_xyt<BF, 4>(xa, dAs, kLdA, As, kLdA, wm, wn2, kMaxBT, lane);
      __syncthreads();  // every read of dA done
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = row_of(e), col = wn2 + 8 * j + 2 * tq + (e & 1);
          dAs[r * kLdA + col] = f2h<BF>(xa[j][e]);
        }
    }
    __syncthreads();  // X
    {
      float ya[4][4];
      zero(ya);
      mm_xts<BF, 4>(ya, As, kLdA, dAs, kLdA, wm, wn2, wm, kMaxBT, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r1 : r0, col = wn2 + 8 * j + 2 * tq;
          if (r >= len) continue;
          st2(dAkk.p, dAkk.code, dAkk.off(c.b, c.t0 + r, hv) + col, col < r ? -ya[j][2 * hr] : 0.0f,
              col + 1 < r ? -ya[j][2 * hr + 1] : 0.0f);
        }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = wn + 8 * j + 2 * tq;
    if (r0 < len) {
      st2(dq.p, dq.code, dq.off(c.b, c.t0 + r0, hk) + col, dqa[j][0], dqa[j][1]);
      st2(dk.p, dk.code, dk.off(c.b, c.t0 + r0, hk) + col, dka[j][0], dka[j][1]);
    }
    if (r1 < len) {
      st2(dq.p, dq.code, dq.off(c.b, c.t0 + r1, hk) + col, dqa[j][2], dqa[j][3]);
      st2(dk.p, dk.code, dk.off(c.b, c.t0 + r1, hk) + col, dka[j][2], dka[j][3]);
    }
  }
}

// True when chunk_kda_bwd_wy_dqkg_fused can take wy_mma_kernel (see there).
bool wy_mma_ok(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.q.dtype();
  if (a.chunk_size != kMaxBT || a.q.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, wy16::kSmem, "chunk_kda_bwd_wy_dqkg_fused")) return false;
  for (const TensorView* t : {&a.q, &a.k, &a.v, &a.v_new, &a.dout, &a.dvn, &a.Akk})
    if (!tok16_ok(*t, dt)) return false;
  if (!state16_ok(a.h, dt) || !state16_ok(a.dh, dt) || !tok32_ok(a.gk)) return false;
  for (const TensorView* t : {&a.dq, &a.dk, &a.dv, &a.dg, &a.dAkk})
    if (!out2_ok(*t)) return false;
  return true;
}

void wy_dqkg(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& a) {
  const char* op = "chunk_kda_bwd_wy_dqkg_fused";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  // dq, dk, dbeta, dg and dAkk leave here as fp32 partial sums (the top level's workspaces); the
  // products run on tf32 tensor cores whenever the inputs are 16-bit (layout_of's choice, as in
  // every other chunk kernel): those results carry 16-bit inputs' precision whatever the output
  // dtype, and FFMA cost the KDA backward about 10 ms at issue 7's shape.
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || H == 0) return;
  FUSEDOPS_REQUIRE(H <= 65535, kValue, op, "too many heads: ", H);
  if (wy_mma_ok(ctx, a)) {
    auto k16 = a.q.dtype() == DType::kBFloat16 ? wy_mma_kernel<true> : wy_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(k16), ctx.device.index, wy16::kSmem);
    trace_kernel("wy_mma_kernel");
    k16<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, wy16::kSmem, stream_of(ctx)>>>(
        tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.v_new), tok_of(a.gk), tok_of(a.beta), tok_of(a.Akk),
        mat_of(a.h), mat_of(a.dh), tok_of(a.dout), tok_of(a.dvn), tok_of(a.dq), tok_of(a.dk), tok_of(a.dv),
        tok_of(a.dbeta), tok_of(a.dg), tok_of(a.dAkk), L, static_cast<int>(HV), static_cast<int>(HV / H),
        static_cast<float>(a.scale));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  auto kernel = wy_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kWySmem);
  trace_kernel("wy_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, kWySmem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.v_new), tok_of(a.gk), tok_of(a.beta), tok_of(a.Akk),
      mat_of(a.h), mat_of(a.dh), tok_of(a.dout), tok_of(a.dvn), tok_of(a.dq), tok_of(a.dk), tok_of(a.dv),
      tok_of(a.dbeta), tok_of(a.dg), tok_of(a.dAkk), L, static_cast<int>(K), static_cast<int>(V),
      static_cast<int>(HV), static_cast<int>(HV / H), static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// chunk_kda_bwd_intra (K4): CTA per (chunk, q/k head), value heads of the group in order. Per
// 32-channel slice every thread owns 8 (row i, channel c) outputs (a warp = one row, 32 channels)
// and sums element-wise over the pairs with every exponential factor <= 1:
//   dqi = sum_{j<i} dAqk_ij k_jc E_ij,  rr = sum_{j<i} dAkk_ij k_jc E_ij,
//   cc  = sum_{j>i} (dAqk_ji q_jc + dAkk_ji beta_j k_jc) E_ji,   E_ij = exp(g_ic - g_jc).
// dbeta_i += sum_c rr k_ic (per-row fixed-order sum through shared memory); rr *= beta_i;
// dg += q dqi + (rr - cc) k; dq += dqi + dAqk_ii k; dk += rr + cc + dAqk_ii q.
// Dynamic shared memory: Dq, Dl [64][69], Q, K, G, P [64][37], beta and dbeta [64]: 68.6 KB.

constexpr int kSl = 32;
constexpr int kLdS = pad_ld(kSl);
constexpr int kOwn = kMaxBT * kSl / kThreads;  // 8
constexpr size_t kIntraSmem = sizeof(float) * (2 * kTile + 4 * kMaxBT * kLdS + 2 * kMaxBT);

__global__ void __launch_bounds__(kThreads, 2) bintra_kernel(Tok q, Tok k, Tok gk, Tok beta, Tok dAqk, Tok dAkk,
                                                          Tok dq, Tok dk, Tok dbeta, Tok dg, Tok dqo, Tok dko,
                                                          Tok dbo, Tok dgo, Layout L, int K, int G) {
  extern __shared__ float smem[];
  float* Dq = smem;
  float* Dl = Dq + kTile;
  float* Qs = Dl + kTile;
  float* Ks = Qs + kMaxBT * kLdS;
  float* Gs = Ks + kMaxBT * kLdS;
  float* Ps = Gs + kMaxBT * kLdS;
  float* bs = Ps + kMaxBT * kLdS;
  float* dbr = bs + kMaxBT;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hk = blockIdx.y, len = c.len;
  if (len == 0) return;
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    __syncthreads();
    load_tri(Dq, dAqk, c.b, c.t0, hv, len, L.BT, false);
    load_tri(Dl, dAkk, c.b, c.t0, hv, len, L.BT, true);
    if (threadIdx.x < kMaxBT) {
      const int i = threadIdx.x;
      bs[i] = i < len ? beta.ld(c.b, c.t0 + i, hv, 0) : 0.0f;
      dbr[i] = 0.0f;
    }
    for (int y0 = 0; y0 < K; y0 += kSl) {
      __syncthreads();
      load_tile(Qs, kLdS, kMaxBT, kSl, q, c.b, c.t0, hk, len, y0, K);
      load_tile(Ks, kLdS, kMaxBT, kSl, k, c.b, c.t0, hk, len, y0, K);
      load_tile(Gs, kLdS, kMaxBT, kSl, gk, c.b, c.t0, hv, len, y0, K);
      __syncthreads();
      float dqi[kOwn], rr[kOwn], cc[kOwn];
#pragma unroll
      for (int p = 0; p < kOwn; ++p) {
        const int e = threadIdx.x + kThreads * p, i = e >> 5, x = e & 31;
        float a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        if (i < len) {
          const float gi_ = Gs[i * kLdS + x];
          for (int j = 0; j < i; ++j) {
            const float w = Ks[j * kLdS + x] * expf(gi_ - Gs[j * kLdS + x]);
            a1 = fmaf(Dq[i * kLd + j], w, a1);
            a2 = fmaf(Dl[i * kLd + j], w, a2);
          }
          for (int j = i + 1; j < len; ++j) {
            const float ex = expf(Gs[j * kLdS + x] - gi_);
            a3 = fmaf(fmaf(Dq[j * kLd + i], Qs[j * kLdS + x], Dl[j * kLd + i] * bs[j] * Ks[j * kLdS + x]), ex, a3);
          }
        }
        dqi[p] = a1;
        rr[p] = a2;
        cc[p] = a3;
        Ps[i * kLdS + x] = a2 * Ks[i * kLdS + x];
      }
      __syncthreads();
      if (threadIdx.x < len) {
        const int i = threadIdx.x;
        float s = 0.0f;
        for (int x = 0; x < kSl; ++x) s += Ps[i * kLdS + x];
        dbr[i] += s;
      }
#pragma unroll
      for (int p = 0; p < kOwn; ++p) {
        const int e = threadIdx.x + kThreads * p, i = e >> 5, x = e & 31;
        if (i < len && y0 + x < K) {
          const int64_t t = c.t0 + i;
          const int ch = y0 + x;
          const float qv = Qs[i * kLdS + x], kv = Ks[i * kLdS + x], dd = Dq[i * kLd + i];
          const float r = bs[i] * rr[p];
          dgo.st_(c.b, t, hv, ch, dg.ld(c.b, t, hv, ch) + qv * dqi[p] + (r - cc[p]) * kv);
          const float qprev = gi == 0 ? dq.ld(c.b, t, hk, ch) : dqo.ld(c.b, t, hk, ch);
          const float kprev = gi == 0 ? dk.ld(c.b, t, hk, ch) : dko.ld(c.b, t, hk, ch);
          dqo.st_(c.b, t, hk, ch, qprev + dqi[p] + dd * kv);
          dko.st_(c.b, t, hk, ch, kprev + r + cc[p] + dd * qv);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < len) {
      const int i = threadIdx.x;
      dbo.st_(c.b, c.t0 + i, hv, 0, dbeta.ld(c.b, c.t0 + i, hv, 0) + dbr[i]);
    }
  }
}

// chunk_kda_bwd_intra on tensor cores, for the common shape: K = 128, chunk 64; q and k bf16 or
// fp16 alike, gk, dAqk, dAkk and the partial sums dq, dk, dg fp32. fwd_intra's reference-row split,
// both ways. Lower sums (j < i) over the off-diagonal blocks J < I of i's 16-row block I, with r =
// 16 I:
//   dqi_ic = e^{g_ic - g_rc} sum_{j<r} dAqk_ij Kn_jc,  rr_ic the same with dAkk,  Kn_jc = k_jc e^{g_rc - g_jc};
// upper sums (j > i) over the blocks J > I, with s = 16 (I + 1):
//   cc_ic = e^{g_sc - g_ic} sum_{j>=s} (dAqk_ji Uq_jc + dAkk_ji Ub_jc),
//   Uq_jc = q_jc e^{g_jc - g_sc},  Ub_jc = beta_j k_jc e^{g_jc - g_sc}.
// Every factor is <= 1 for non-increasing cumulated gates. The scaled operands and the
// off-diagonal blocks of dA (rounded to the inputs' 16-bit type) are m16n8k16 operands with fp32
// accumulation; the diagonal 16x16 blocks sum element-wise from fp32 dA, one exponential per
// (i, j, channel). The channels go in two 64-wide halves (q, k, gk and the scaled operands of one
// half on chip at a time: 103 KiB of shared memory, two CTAs per SM); in each, warp w owns row
// block I = w % 4 and the 32 channels 32 (w / 4).. of the half, so its accumulators meet the
// diagonal sums, the partial gradients and the outputs in registers. dbeta's row sums go per
// 32-channel slice through shared memory and are added in slice order. The gates are staged as
// g log2(e), every factor one ex2.approx of a difference (exp2_fast).
namespace bintra16 {
using namespace la::sm80::mma16;
constexpr int kHalf = kIntraHalf;    // channels per pass
constexpr int kLdH = kHalf + 8;      // 16-bit row stride of the half tiles (36 words)
constexpr int kLdG = kHalf + 4;      // fp32 [64][68] gate half
constexpr int kLdF = 17;             // fp32 [64][17] diagonal blocks of dAqk, dAkk (column j % 16)
constexpr int kSc = 96;              // rows of each scaled operand: 16 + 32 + 48
constexpr int kLdD = kMaxBT + 4;     // fp32 [64][68] dA staging (in the scaled operands' space)
constexpr size_t kSmem = 2 * (2 * static_cast<size_t>(kMaxBT) * kLdH + 3 * kSc * kLdH + 2 * kMaxBT * kLdA) +
                         4 * (static_cast<size_t>(kMaxBT) * kLdG + 2 * kMaxBT * kLdF + 5 * kMaxBT);
static_assert(2 * kMaxBT * kLdD * 4 <= 3 * kSc * kLdH * 2, "dA staging fits the scaled operands' space");
}  // namespace bintra16

// kScan: the reverse chunk-local cumsum of dg fused behind (the top level's path): dgo (fp32) is
// then the cumsum's output; each half's dg rows go there as before and, once the last barrier of
// the value head has published them, warps 4-7 turn them in place into their reverse sums
// (rev_scan_col, both halves at once; each half scanned by two warps right after its own barrier,
// 16 rows per round trip to L2, made bintra 1524 -> 1659 us at 5236171).
template <bool BF, bool kScan>
__global__ void __launch_bounds__(kThreads, 2) bintra_mma_kernel(Tok q, Tok k, Tok gk, Tok beta, Tok dAqk, Tok dAkk,
                                                                 Tok dq, Tok dk, Tok dbeta, Tok dg, Tok dqo, Tok dko,
                                                                 Tok dbo, Tok dgo, Layout L, int G, double gscale) {
  using namespace la::sm80;
  using namespace la::sm80::mma16;
  using bintra16::kHalf;
  using bintra16::kLdD;
  using bintra16::kLdF;
  using bintra16::kLdG;
  using bintra16::kLdH;
  using bintra16::kSc;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);  // [64][kLdH]: the half's q
  uint16_t* Ks = Qs + kMaxBT * kLdH;
  uint16_t* Kn = Ks + kMaxBT * kLdH;  // [96][kLdH]: for I = 1..3, K's rows j < 16 I scaled by e^{g_16I - g_j}
  uint16_t* Uq = Kn + kSc * kLdH;     // [96][kLdH]: for I = 0..2, Q's rows j >= 16 (I + 1) scaled by e^{g_j - g_16(I+1)}
  uint16_t* Ub = Uq + kSc * kLdH;     // the same of beta K
  uint16_t* DAq = Ub + kSc * kLdH;    // [64][kLdA]: dAqk's blocks below the diagonal blocks, zero elsewhere
  uint16_t* DAk = DAq + kMaxBT * kLdA;
  float* Gs = reinterpret_cast<float*>(DAk + kMaxBT * kLdA);  // [64][kLdG]: the half's gk
  float* Dq = Gs + kMaxBT * kLdG;  // [64][kLdF]: dAqk's diagonal blocks, entries j <= i
  float* Dk = Dq + kMaxBT * kLdF;  // dAkk's
  float* bs = Dk + kMaxBT * kLdF;  // [64] beta
  float* dbp = bs + kMaxBT;        // [4][64]: per 32-channel slice, sum_c rr_ic k_ic
  float* Sq = reinterpret_cast<float*>(Kn);  // [64][kLdD] fp32 dAqk, then dAkk, staged before Kn is built
  float* Sk = Sq + kMaxBT * kLdD;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int I = warp & 3, m0 = 16 * I, s0 = m0 + 16, n0 = 32 * (warp >> 2);
  const bool lower = I >= 1 && m0 < len, upper = I <= 2 && s0 < len;
  const uint16_t* KnI = Kn + (I == 1 ? 0 : I == 2 ? 16 : 48) * kLdH;
  const int uo = (I == 0 ? 0 : I == 1 ? 48 : 80) * kLdH;
  const int jend = imin(m0 + 16, len);
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    // dq and dk's partial sums: the fp32 inputs for the group's first value head, then the outputs.
    const bool first = gi == 0;
    if (gi > 0) __syncthreads();  // the previous value head is done with every buffer
    {
      const float* aqb = static_cast<const float*>(dAqk.p);
      const float* akb = static_cast<const float*>(dAkk.p);
      for (int e = tid; e < kMaxBT * (kMaxBT / 4); e += kThreads) {
        const int r = e >> 4, col = (e & 15) << 2;
        const bool ok = r < len;
        const int64_t t = c.t0 + (ok ? r : 0);
        cp_async16(Sq + r * kLdD + col, aqb + dAqk.off(c.b, t, hv) + col, ok);
        cp_async16(Sk + r * kLdD + col, akb + dAkk.off(c.b, t, hv) + col, ok);
      }
    }
    load_qkg_half<kLdH, kLdG>(Qs, Ks, Gs, q, k, gk, c, hk, hv, 0, tid);
    cp_async_commit();
    if (tid < kMaxBT) bs[tid] = tid < len ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    cp_async_wait<0>();
    gates_log2<kLdG>(Gs, tid);
    __syncthreads();
    for (int e = tid; e < kMaxBT * kMaxBT; e += kThreads) {
      const int i = e >> 6, j = e & 63;
      const bool in = j <= i;  // rows >= len are zeros
      const float aq = in ? Sq[i * kLdD + j] : 0.0f, ak = in ? Sk[i * kLdD + j] : 0.0f;
      const bool diag = (i >> 4) == (j >> 4);
      DAq[i * kLdA + j] = diag ? uint16_t{0} : f2h<BF>(aq);
      DAk[i * kLdA + j] = diag ? uint16_t{0} : f2h<BF>(ak);
      if (diag) {
        Dq[i * kLdF + (j & 15)] = aq;
        Dk[i * kLdF + (j & 15)] = ak;
      }
    }
    for (int half = 0; half < 2; ++half) {
      const int y0 = kHalf * half;
      if (half == 1) {
        __syncthreads();  // half 0's readers are done
        load_qkg_half<kLdH, kLdG>(Qs, Ks, Gs, q, k, gk, c, hk, hv, y0, tid);
        cp_async_commit();
        cp_async_wait<0>();
        gates_log2<kLdG>(Gs, tid);
      }
      __syncthreads();  // the half's tiles; DAq, DAk, Dq, Dk; the dA staging is dead
      // The scaled operands, eight channels per step; rows past the sequence are zero (their gates
      // are never read).
      for (int e = tid; e < 3 * kSc * (kHalf / 8); e += kThreads) {
        const int row = e >> 3, y = (e & 7) << 3, which = row / kSc, u = row - which * kSc;
        int j, r;
        bool ok;
        float f = 1.0f;
        const uint16_t* src;
        if (which == 0) {
          const int Ib = u < 16 ? 1 : u < 48 ? 2 : 3;
          j = u - (Ib == 1 ? 0 : Ib == 2 ? 16 : 48);
          r = 16 * Ib;
          ok = r < len;
          src = Ks;
        } else {
          const int Ib = u < 48 ? 0 : u < 80 ? 1 : 2;
          r = 16 * (Ib + 1);
          j = r + u - (Ib == 0 ? 0 : Ib == 1 ? 48 : 80);
          ok = j < len;
          src = which == 1 ? Qs : Ks;
          if (which == 2 && ok) f = bs[j];
        }
        uint16_t* dst = Kn + row * kLdH + y;
        if (ok) {
          float d[8];
          exp2_diff8(d, Gs + (which == 0 ? r : j) * kLdG + y, Gs + (which == 0 ? j : r) * kLdG + y, f);
          mul8_store<BF>(dst, src + j * kLdH + y, d);
        } else {
          *reinterpret_cast<uint4*>(dst) = uint4{0u, 0u, 0u, 0u};
        }
      }
      __syncthreads();  // Kn, Uq, Ub
      float aq[4][4], ar[4][4], ac[4][4];
      zero(aq);
      zero(ar);
      zero(ac);
      if (lower) mm_xs2<BF, 4>(aq, ar, DAq, DAk, kLdA, KnI, kLdH, m0, n0, 0, m0, lane);
      if (upper) {
        mm_xts<BF, 4>(ac, DAq + s0 * kLdA, kLdA, Uq + uo, kLdH, m0, n0, 0, kMaxBT - s0, lane);
        mm_xts<BF, 4>(ac, DAk + s0 * kLdA, kLdA, Ub + uo, kLdH, m0, n0, 0, kMaxBT - s0, lane);
      }
      float dbs[2] = {0.0f, 0.0f};
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int i = m0 + gq + 8 * hr;
        float gi_[8];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int col = n0 + 8 * jj + 2 * tq;
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const float g = Gs[i * kLdG + col + b];
            gi_[2 * jj + b] = g;
            if (lower) {
              const float fl = exp2_fast(g - Gs[m0 * kLdG + col + b]);
              aq[jj][2 * hr + b] *= fl;
              ar[jj][2 * hr + b] *= fl;
            }
            if (upper) ac[jj][2 * hr + b] *= exp2_fast(Gs[s0 * kLdG + col + b] - g);
          }
        }
        // The diagonal block: j < i adds to dqi and rr, j > i to cc; the exponent is <= 0 either way.
        for (int j = m0; j < jend; ++j) {
          const bool lo = j < i, hi = j > i;
          const float cql = lo ? Dq[i * kLdF + (j & 15)] : 0.0f, ckl = lo ? Dk[i * kLdF + (j & 15)] : 0.0f;
          const float cqu = hi ? Dq[j * kLdF + (i & 15)] : 0.0f, cku = hi ? bs[j] * Dk[j * kLdF + (i & 15)] : 0.0f;
          const float sg = lo ? 1.0f : -1.0f;
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const int col = n0 + 8 * jj + 2 * tq;
            const uint32_t kk = ld32(Ks + j * kLdH + col), qq = ld32(Qs + j * kLdH + col);
            const float2 gj = *reinterpret_cast<const float2*>(Gs + j * kLdG + col);
#pragma unroll
            for (int b = 0; b < 2; ++b) {
              const float ex = exp2_fast(sg * (gi_[2 * jj + b] - (b ? gj.y : gj.x)));
              const float kv = h2f<BF>(static_cast<uint16_t>(b ? kk >> 16 : kk));
              const float qv = h2f<BF>(static_cast<uint16_t>(b ? qq >> 16 : qq));
              aq[jj][2 * hr + b] = fmaf(cql * kv, ex, aq[jj][2 * hr + b]);
              ar[jj][2 * hr + b] = fmaf(ckl * kv, ex, ar[jj][2 * hr + b]);
              ac[jj][2 * hr + b] = fmaf(fmaf(cqu, qv, cku * kv), ex, ac[jj][2 * hr + b]);
            }
          }
        }
        // The outputs: dbeta's row sum, dg, dq and dk (accumulated over the group's value heads).
        if (i < len) {
          const float bi = bs[i], dd = Dq[i * kLdF + (i & 15)];
          const int64_t t = c.t0 + i;
          const int64_t og = dg.off(c.b, t, hv) + y0, ogo = dgo.off(c.b, t, hv) + y0;
          const int64_t oq = (first ? dq.off(c.b, t, hk) : dqo.off(c.b, t, hk)) + y0;
          const int64_t ok_ = (first ? dk.off(c.b, t, hk) : dko.off(c.b, t, hk)) + y0;
          const int64_t oqo = dqo.off(c.b, t, hk) + y0, oko = dko.off(c.b, t, hk) + y0;
          const float* pq = static_cast<const float*>(dq.p) + oq;
          const float* pk = static_cast<const float*>(dk.p) + ok_;
          // Every partial sum of the row first (one round trip, not four: the stores below may
          // alias these loads, so the compiler would not hoist them), then the outputs.
          float2 g2[4], q2[4], k2[4];
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const int col = n0 + 8 * jj + 2 * tq;
            g2[jj] = *reinterpret_cast<const float2*>(static_cast<const float*>(dg.p) + og + col);
            if (first) {
              q2[jj] = *reinterpret_cast<const float2*>(pq + col);
              k2[jj] = *reinterpret_cast<const float2*>(pk + col);
            } else {
              ld2(dqo.p, dqo.code, oq + col, q2[jj].x, q2[jj].y);
              ld2(dko.p, dko.code, ok_ + col, k2[jj].x, k2[jj].y);
            }
          }
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            const int col = n0 + 8 * jj + 2 * tq;
            const uint32_t kk = ld32(Ks + i * kLdH + col), qq = ld32(Qs + i * kLdH + col);
            float on[3][2];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
              const float kv = h2f<BF>(static_cast<uint16_t>(b ? kk >> 16 : kk));
              const float qv = h2f<BF>(static_cast<uint16_t>(b ? qq >> 16 : qq));
              const float dqi = aq[jj][2 * hr + b], rr = ar[jj][2 * hr + b], cc = ac[jj][2 * hr + b];
              dbs[hr] = fmaf(rr, kv, dbs[hr]);
              const float r = bi * rr;
              on[0][b] = (b ? g2[jj].y : g2[jj].x) + qv * dqi + (r - cc) * kv;
              on[1][b] = (b ? q2[jj].y : q2[jj].x) + dqi + dd * kv;
              on[2][b] = (b ? k2[jj].y : k2[jj].x) + r + cc + dd * qv;
            }
            st2(dgo.p, dgo.code, ogo + col, on[0][0], on[0][1]);
            st2(dqo.p, dqo.code, oqo + col, on[1][0], on[1][1]);
            st2(dko.p, dko.code, oko + col, on[2][0], on[2][1]);
          }
        }
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float s = quad_sum(dbs[hr]);
        if (tq == 0) dbp[(2 * half + (warp >> 2)) * kMaxBT + m0 + gq + 8 * hr] = s;
      }
    }
    __syncthreads();  // dbp (and, for the scan, every dg row of the value head)
    if (tid < len)
      dbo.st_(c.b, c.t0 + tid, hv, 0,
              dbeta.ld(c.b, c.t0 + tid, hv, 0) + dbp[tid] + dbp[kMaxBT + tid] + dbp[2 * kMaxBT + tid] +
                  dbp[3 * kMaxBT + tid]);
    if constexpr (kScan) {
      if (tid >= kThreads - 2 * kHalf) rev_scan_col<32>(dgo, c, hv, tid - (kThreads - 2 * kHalf), gscale);
    }
  }
}

// True when chunk_kda_bwd_intra can take bintra_mma_kernel (see there).
bool bintra_mma_ok(const Context& ctx, const ChunkKdaBwdIntraArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.q.dtype();
  if (a.chunk_size != kMaxBT || a.q.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, bintra16::kSmem, "chunk_kda_bwd_intra")) return false;
  if (!tok16_ok(a.q, dt) || !tok16_ok(a.k, dt) || !tok32_ok(a.gk) || !tok32_ok(a.dAqk) || !tok32_ok(a.dAkk))
    return false;
  // The partial sums dq, dk, dg are read as fp32 pairs (the top level's workspaces).
  for (const TensorView* t : {&a.dq, &a.dk, &a.dg})
    if (t->dtype() != DType::kFloat32) return false;
  for (const TensorView* t : {&a.dq, &a.dk, &a.dg, &a.dq_out, &a.dk_out, &a.dg_out})
    if (!out2_ok(*t)) return false;
  return true;
}

// bintra_mma_kernel over every chunk of a (bintra_mma_ok); with dg_final defined (fp32), dg's rows
// go there, turned into their reverse chunk-local cumsum (scale gscale), instead of into a.dg_out.
void launch_bintra_mma(const Context& ctx, const ChunkKdaBwdIntraArgs& a, const TensorView& dg_final,
                       double gscale) {
  const char* op = "chunk_kda_bwd_intra";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), HV = a.gk.size(2);
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || H == 0) return;
  FUSEDOPS_REQUIRE(H <= 65535, kValue, op, "too many heads: ", H);
  const bool bf = a.q.dtype() == DType::kBFloat16, scan = dg_final.defined();
  auto k16 = scan ? (bf ? bintra_mma_kernel<true, true> : bintra_mma_kernel<false, true>)
                  : (bf ? bintra_mma_kernel<true, false> : bintra_mma_kernel<false, false>);
  allow_smem(op, reinterpret_cast<const void*>(k16), ctx.device.index, bintra16::kSmem);
  trace_kernel("bintra_mma_kernel");
  k16<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, bintra16::kSmem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.gk), tok_of(a.beta), tok_of(a.dAqk), tok_of(a.dAkk), tok_of(a.dq),
      tok_of(a.dk), tok_of(a.dbeta), tok_of(a.dg), tok_of(a.dq_out), tok_of(a.dk_out), tok_of(a.dbeta_out),
      tok_of(scan ? dg_final : a.dg_out), L, static_cast<int>(HV / H), gscale);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// kda::FusedIntraCumsumBwd: the reverse chunk-local cumsum of bwd_intra's dg run inside
// bintra_mma_kernel (dg's rows go once to the cumsum's fp32 output and are summed there in place;
// the workspace dg_out is not written).
bool intra_cumsum_fused(const Context& ctx, const ChunkKdaBwdIntraArgs& a, const ChunkLocalCumsumArgs& s) {
  if (!s.reverse || s.chunk_size != a.chunk_size || s.g.data() != a.dg_out.data() || !s.out.defined() ||
      s.out.dtype() != DType::kFloat32 || s.out.ndim() != 4 || !la::sm80::mma16::out2_ok(s.out))
    return false;
  for (int d = 0; d < 4; ++d)
    if (s.out.size(d) != a.dg_out.size(d)) return false;
  if (!bintra_mma_ok(ctx, a)) return false;
  launch_bintra_mma(ctx, a, s.out, s.scale);
  return true;
}

void bwd_intra(const Context& ctx, const ChunkKdaBwdIntraArgs& a) {
  const char* op = "chunk_kda_bwd_intra";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3), HV = a.gk.size(2);
  if (bintra_mma_ok(ctx, a)) {
    launch_bintra_mma(ctx, a, TensorView(), 1.0);
    return;
  }
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || H == 0) return;
  FUSEDOPS_REQUIRE(H <= 65535, kValue, op, "too many heads: ", H);
  auto kernel = bintra_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kIntraSmem);
  trace_kernel("bintra_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, kIntraSmem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.gk), tok_of(a.beta), tok_of(a.dAqk), tok_of(a.dAkk), tok_of(a.dq),
      tok_of(a.dk), tok_of(a.dbeta), tok_of(a.dg), tok_of(a.dq_out), tok_of(a.dk_out), tok_of(a.dbeta_out),
      tok_of(a.dg_out), L, static_cast<int>(K), static_cast<int>(HV / H));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// fused_recurrent_kda (backward): CTA per (sequence, q/k head), the group's value heads in order.
// The states are recomputed (this kernel reads no workspace): per block of 32 tokens, in reverse, the
// state before the block is recomputed from h0 and kept in registers (64 per thread: K*V <= 16384),
// and the state before each token of the block from that checkpoint: T^2/64 + 16 T token steps,
// so supports() refuses T > kRecBwdMaxT (the operator is meant for decoding-length sequences).
// Shared memory holds the state Sp [K][V+1] and its gradient dS [K][V+1] in fp32 (odd leading
// dimension: row and column passes are both conflict-free). Column passes: thread x owns state
// column x; row passes: thread y owns row y. Per token (reverse): St = diag(a) Sp; p = St^T k; delta = beta (v - p);
//   dq = scale (St + k delta^T) dO;  dS += scale q dO^T;  dk = dS delta;  dd = dS^T k;
//   dv = beta dd;  dbeta = dd . (v - p);  dp = -beta dd;  D = dS + k dp^T;  dk += St dp;
//   dg = rowsum(St . D);  dS = diag(a) D.

constexpr int64_t kRecBwdMaxT = 4096;
constexpr int64_t kRecBlk = 32;  // tokens per recomputation block
constexpr int kRecCk = 64;       // checkpoint elements per thread: K * V <= 256 * 64

size_t rec_bwd_smem(int K, int V) {
  return sizeof(float) * (2 * static_cast<size_t>(K) * (V + 1) + 3 * static_cast<size_t>(K) + 6 * V + 8);
}

__global__ void __launch_bounds__(kThreads, 1) rec_bwd_kernel(Tok q, Tok k, Tok v, Tok g, Tok beta, Mat h0, Tok dout,
                                                           Mat dht, Tok dq, Tok dk, Tok dv, Tok dg, Tok dbeta,
                                                           Mat dh0, Layout L, int K, int V, int HV, int G,
                                                           float scale) {
  extern __shared__ float smem[];
  const int ld = V + 1;
  float* Sp = smem;                 // [K][V+1]
  float* dS = Sp + K * ld;          // [K][V+1]
  float* qs = dS + K * ld;          // [K]
  float* ks = qs + K;               // [K]
  float* as = ks + K;               // [K] exp(g)
  float* vs = as + K;               // [V]
  float* ds = vs + V;               // [V] dO
  float* ps = ds + V;               // [V] p
  float* dl = ps + V;               // [V] delta
  float* dp = dl + V;               // [V] dp
  float* db = dp + V;               // [V] dbeta terms
  float* sc = db + V;               // [8] scalars: beta
  const int64_t n = blockIdx.x;  // sequence
  const int hk = blockIdx.y;
  const SeqPos s = seq_pos(L, n);
  const int tid = threadIdx.x;
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    const int64_t sidx = n * HV + hv;
    __syncthreads();
    for (int e = tid; e < K * V; e += blockDim.x) {
      const int y = e / V, x = e - y * V;
      dS[y * ld + x] = dht.p ? ldf(dht.p, dht.code, sidx * K * V + e) : 0.0f;
    }
    // Tokens tau in [from, to] (loading q and dO at tau == tq); a forward step on the columns for
    // every tau != tq. Starts and ends with every thread past a barrier after the loads.
    auto tokens = [&](int64_t from, int64_t to, int64_t tq) {
      for (int64_t tau = from; tau <= to; ++tau) {
        const int64_t tt = s.t0 + tau;
        __syncthreads();
        for (int y = tid; y < K; y += blockDim.x) {
          ks[y] = k.ld(s.b, tt, hk, y);
          as[y] = g.p ? expf(g.ld(s.b, tt, hv, y)) : 1.0f;
          if (tau == tq) qs[y] = q.ld(s.b, tt, hk, y);
        }
        for (int x = tid; x < V; x += blockDim.x) {
          vs[x] = v.ld(s.b, tt, hv, x);
          if (tau == tq) ds[x] = dout.ld(s.b, tt, hv, x);
        }
        if (tid == 0) sc[0] = beta.p ? beta.ld(s.b, tt, hv, 0) : 1.0f;
        __syncthreads();
        if (tau != tq) {
          for (int x = tid; x < V; x += blockDim.x) {
            float p = 0.0f;
            for (int y = 0; y < K; ++y) p = fmaf(ks[y], as[y] * Sp[y * ld + x], p);
            const float d = sc[0] * (vs[x] - p);
            for (int y = 0; y < K; ++y) Sp[y * ld + x] = fmaf(as[y], Sp[y * ld + x], ks[y] * d);
          }
        }
      }
    };
    const int64_t nblk = (s.len + kRecBlk - 1) / kRecBlk;
    for (int64_t blk = nblk - 1; blk >= 0; --blk) {
      const int64_t b0 = blk * kRecBlk, b1 = b0 + kRecBlk < s.len ? b0 + kRecBlk : s.len;
      // The state before token b0, from h0, kept in registers (element e = tid + 256 r).
      __syncthreads();
      for (int e = tid; e < K * V; e += blockDim.x) {
        const int y = e / V, x = e - y * V;
        Sp[y * ld + x] = h0.p ? ldf(h0.p, h0.code, sidx * K * V + e) : 0.0f;
      }
      tokens(0, b0 - 1, -1);
      __syncthreads();
      float ck[kRecCk];
#pragma unroll
      for (int r = 0; r < kRecCk; ++r) {
        const int e = tid + kThreads * r;
        ck[r] = e < K * V ? Sp[(e / V) * ld + e % V] : 0.0f;
      }
      for (int64_t t = b1 - 1; t >= b0; --t) {
      // Sp = the state before token t: the block's checkpoint, then tokens b0 .. t-1.
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRecCk; ++r) {
        const int e = tid + kThreads * r;
        if (e < K * V) Sp[(e / V) * ld + e % V] = ck[r];
      }
      tokens(b0, t, t);
      // Token t. Pass 1 (columns): p, delta.
      const float bt = sc[0];
      for (int x = tid; x < V; x += blockDim.x) {
        float p = 0.0f;
        for (int y = 0; y < K; ++y) p = fmaf(ks[y], as[y] * Sp[y * ld + x], p);
        ps[x] = p;
        dl[x] = bt * (vs[x] - p);
      }
      __syncthreads();
      // Pass 2 (rows): dq; dS += scale q dO^T; dk1 = dS delta.
      // (K <= 256 = blockDim.x: thread y owns row y.)
      float dq_y = 0.0f, dk_y = 0.0f;
      if (tid < K) {
        const int y = tid;
        const float ay = as[y], ky = ks[y], qy = scale * qs[y];
        for (int x = 0; x < V; ++x) {
          dq_y = fmaf(fmaf(ay, Sp[y * ld + x], ky * dl[x]), ds[x], dq_y);
          const float d = fmaf(qy, ds[x], dS[y * ld + x]);
          dS[y * ld + x] = d;
          dk_y = fmaf(d, dl[x], dk_y);
        }
        dq_y *= scale;
      }
      __syncthreads();
      // Pass 3 (columns): dd = dS^T k; dv, dp, dbeta terms.
      for (int x = tid; x < V; x += blockDim.x) {
        float d = 0.0f;
        for (int y = 0; y < K; ++y) d = fmaf(dS[y * ld + x], ks[y], d);
        dv.st_(s.b, s.t0 + t, hv, x, bt * d);
        dp[x] = -bt * d;
        db[x] = d * (vs[x] - ps[x]);
      }
      __syncthreads();
      if (tid == 0 && dbeta.p) {
        float sb = 0.0f;
        for (int x = 0; x < V; ++x) sb += db[x];
        dbeta.st_(s.b, s.t0 + t, hv, 0, sb);
      }
      // Pass 4 (rows): D = dS + k dp^T; dk += St dp; dg = rowsum(St . D); dS = diag(a) D.
      if (tid < K) {
        const int y = tid;
        float a2 = 0.0f, ag = 0.0f;
        const float ay = as[y], ky = ks[y];
        for (int x = 0; x < V; ++x) {
          const float st = ay * Sp[y * ld + x];
          const float d = fmaf(ky, dp[x], dS[y * ld + x]);
          a2 = fmaf(st, dp[x], a2);
          ag = fmaf(st, d, ag);
          dS[y * ld + x] = ay * d;
        }
        const int64_t tt = s.t0 + t;
        if (dg.p) dg.st_(s.b, tt, hv, y, ag);
        const float dkv = dk_y + a2;
        if (gi == 0) {
          dq.st_(s.b, tt, hk, y, dq_y);
          dk.st_(s.b, tt, hk, y, dkv);
        } else {
          dq.st_(s.b, tt, hk, y, dq.ld(s.b, tt, hk, y) + dq_y);
          dk.st_(s.b, tt, hk, y, dk.ld(s.b, tt, hk, y) + dkv);
        }
      }
      }
    }
    __syncthreads();
    if (dh0.p)
      for (int e = tid; e < K * V; e += blockDim.x) {
        const int y = e / V, x = e - y * V;
        stf(dh0.p, dh0.code, sidx * K * V + e, dS[y * ld + x]);
      }
  }
}

void recurrent_bwd(const Context& ctx, const FusedRecurrentKdaBwdArgs& a) {
  const char* op = "fused_recurrent_kda";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  const Layout L = layout_of(B, T, 1, a.cu_seqlens, TensorView(), TensorView(), a.q.dtype());
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * H == 0) return;
  FUSEDOPS_REQUIRE(H <= 65535, kValue, op, "too many heads: ", H);
  const size_t smem = rec_bwd_smem(static_cast<int>(K), static_cast<int>(V));
  auto kernel = rec_bwd_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
  trace_kernel("rec_bwd_kernel");
  kernel<<<dim3(static_cast<unsigned>(N), static_cast<unsigned>(H)), kThreads, smem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.g), tok_of(a.beta), mat_of(a.initial_state),
      tok_of(a.dout), mat_of(a.dht), tok_of(a.dq), tok_of(a.dk), tok_of(a.dv), tok_of(a.dg), tok_of(a.dbeta),
      mat_of(a.dh0), L, static_cast<int>(K), static_cast<int>(V), static_cast<int>(HV),
      static_cast<int>(HV / H), static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void top_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  compose_bwd(with_backend(ctx, "cuda_sm80"), a, intra_cumsum_fused);
}

bool sup_wy(const ChunkKdaBwdWyDqkgArgs& a) {
  return no_f64({&a.q, &a.k, &a.v, &a.v_new, &a.gk, &a.beta, &a.Akk, &a.h, &a.dh, &a.dout, &a.dvn, &a.dq,
                 &a.dk, &a.dv, &a.dbeta, &a.dg, &a.dAkk}) &&
         a.chunk_size <= kMaxBT;
}
bool sup_bintra(const ChunkKdaBwdIntraArgs& a) {
  return no_f64({&a.q, &a.k, &a.gk, &a.beta, &a.dAqk, &a.dAkk, &a.dq, &a.dk, &a.dbeta, &a.dg, &a.dq_out,
                 &a.dk_out, &a.dbeta_out, &a.dg_out}) &&
         a.chunk_size <= kMaxBT;
}
bool sup_top_bwd(const ChunkKdaBwdArgs& a) {
  return la::no_float64(a, {&a.Aqk, &a.Akk}) &&
         a.q.size(-1) <= 256;
}

bool sup_rec_bwd(const FusedRecurrentKdaBwdArgs& a) {
  return la::no_float64(a) &&
         a.q.size(-1) <= kThreads && a.v.size(-1) <= kThreads && a.q.size(1) <= kRecBwdMaxT &&
         a.q.size(-1) * a.v.size(-1) <= kThreads * kRecCk &&
         rec_bwd_smem(static_cast<int>(a.q.size(-1)), static_cast<int>(a.v.size(-1))) <= 160 * 1024;
}

}  // namespace

void top_bwd_entry(const Context& ctx, const ChunkKdaBwdArgs& a) { top_bwd(ctx, a); }
bool top_bwd_supported(const ChunkKdaBwdArgs& a) { return sup_top_bwd(a); }

void register_bwd(Registry& r) {
  const BackendSpec s = la::sm80::spec();
  const auto B = Direction::kBackward;
  r.add<ChunkKdaBwdWyDqkgArgs>("chunk_kda_bwd_wy_dqkg_fused", B, s, sup_wy, wy_dqkg);
  r.add<ChunkKdaBwdIntraArgs>("chunk_kda_bwd_intra", B, s, sup_bintra, bwd_intra);
  r.add<ChunkKdaBwdArgs>("chunk_kda", B, s, sup_top_bwd, top_bwd);
  r.add<FusedRecurrentKdaBwdArgs>("fused_recurrent_kda", B, s, sup_rec_bwd, recurrent_bwd);
}

}  // namespace fusedops::kda::sm80
