// Gated delta rule, CUDA backend cuda_sm80: the backward-direction operators (section 1.5 blocks
// B2, B4, B5, section 11, the per-token recurrence's backward; the reverse state recurrence B3 is
// the shared sub-operator's, in src/ops/linear_attention/linear_attention_bwd_sm80.cu). Same
// structure as the forward file: one CTA of 256 threads per (chunk, head) with fp32 shared-memory
// tiles and mm products. Everything reduced across value heads (dq, dk) is summed inside one CTA in
// a fixed order: no atomics.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/cuda/check.cuh"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/gated_delta_rule/gdn_cuda.cuh"

namespace fusedops::gdn::sm80 {
namespace {

int64_t chunk_count(const Layout& L, const TensorView& cu, const TensorView& ci) {
  return cu.defined() ? ci.size(0) : L.B * L.nt;
}

// ---------------------------------------------------------------------------------------------
// chunk_bwd_dv_local: CTA per (chunk, value head). P = scale M>= . Gamma . Q K^T, dv = P^T dO per
// 32-column V tile. Shared memory: Qa, Kb [64][37], P [64][69] (33.5 KiB).

__global__ void __launch_bounds__(kThreads) dv_local_kernel(Tok q, Tok k, Tok dO, Tok g, Tok dv, Layout L, int K,
                                                            int V, int G, float scale) {
  constexpr int kW = 32, kLdS = pad_ld(kW);  // 32-column K slices and V tiles
  __shared__ float Qa[kMaxBT * kLdS];
  __shared__ float Kb[kMaxBT * kLdS];
  __shared__ float P[kMaxBT * kLd];
  __shared__ float gl[kMaxBT];
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len;
  if (len == 0) return;
  if (threadIdx.x < kMaxBT) gl[threadIdx.x] = (g.p && threadIdx.x < len) ? g.ld(c.b, c.t0 + threadIdx.x, hv, 0) : 0.0f;
  fill(P, kMaxBT * kLd, 0.0f);
  for (int y0 = 0; y0 < K; y0 += kW) {
    __syncthreads();
    load_tile(Qa, kLdS, kMaxBT, kW, q, c.b, c.t0, hk, len, y0, K);
    load_tile(Kb, kLdS, kMaxBT, kW, k, c.b, c.t0, hk, len, y0, K);
    __syncthreads();
    mm(L.tc, len, len, kW, Qa, kLdS, 1, Kb, 1, kLdS, [&](int m, int n, float v) { P[m * kLd + n] += v; });
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kMaxBT * kMaxBT; e += blockDim.x) {
    const int i = e / kMaxBT, j = e - i * kMaxBT;
    P[i * kLd + j] = (i < len && j <= i) ? scale * P[i * kLd + j] * expf(gl[i] - gl[j]) : 0.0f;
  }
  for (int x0 = 0; x0 < V; x0 += kW) {
    __syncthreads();
    load_tile(Qa, kLdS, kMaxBT, kW, dO, c.b, c.t0, hv, len, x0, V);
    __syncthreads();
    // dv[j][x] = sum_i P[i][j] dO[i][x].
    mm(L.tc, len, min(kW, V - x0), len, P, 1, kLd, Qa, kLdS, 1,
       [&](int m, int n, float v) { dv.st_(c.b, c.t0 + m, hv, x0 + n, v); });
  }
}

// chunk_bwd_dv_local on 16-bit tensor cores (K = V = 128, chunk 64, q, k, dout all bf16 or all
// fp16, 16-byte aligned rows): P = scale M>= . Gamma . Q K^T
// in registers, stored transposed and rounded to the input type, then dv = P^T dO on m16n8k16
// (row block j0 of P^T takes i >= j0). 60 KiB: three CTAs per SM.
constexpr size_t kDvlMmaSmem = 2 * (3 * static_cast<size_t>(mma16::kTok) + kMaxBT * mma16::kLdS) + 4 * kMaxBT;

template <bool BF>
__global__ void __launch_bounds__(kThreads, 3) dv_local_mma_kernel(Tok q, Tok k, Tok dO, Tok g, Tok dv, Layout L, int G,
                                                                   float scale, bool staged) {
  using namespace mma16;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Ks = Qs + kTok;
  uint16_t* dOs = Ks + kTok;
  uint16_t* PT = dOs + kTok;
  float* gl = reinterpret_cast<float*>(PT + kMaxBT * kLdS);
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  load_rows(Qs, kLdT, q, c.b, c.t0, hk, len, kD / 8);
  load_rows(Ks, kLdT, k, c.b, c.t0, hk, len, kD / 8);
  load_rows(dOs, kLdT, dO, c.b, c.t0, hv, len, kD / 8);
  cp_async_commit();
  if (tid < kMaxBT) gl[tid] = (g.p && tid < len) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
  cp_async_wait<0>();
  __syncthreads();
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2);
  const int r0 = wm + (lane >> 2), r1 = r0 + 8;
  causal_qk<BF>(Qs, Ks, gl, len, lane, [&](int r, int col, float p) { PT[col * kLdS + r] = f2h<BF>(scale * p); });
  __syncthreads();
  float acc[8][4];
  zero(acc);
  mm_xs<BF, 8>(acc, PT, kLdS, dOs, kLdT, wm, wn, wm, kMaxBT, lane);
  if (staged) {  // 16-bit dv through the warp's block of Qs (its last readers were before the barrier)
    store_warp_rows16<BF, 8>(acc, 1.0f, Qs, kLdT, wm, wn, dv, c.b, c.t0, hv, len, lane);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = wn + 8 * j + 2 * tq;
    if (r0 < len) st2(dv.p, dv.code, dv.off(c.b, c.t0 + r0, hv) + col, acc[j][0], acc[j][1]);
    if (r1 < len) st2(dv.p, dv.code, dv.off(c.b, c.t0 + r1, hv) + col, acc[j][2], acc[j][3]);
  }
}

bool dv_local_mma_ok(const Context& ctx, const ChunkBwdDvLocalArgs& a) {
  using namespace mma16;
  const DType dt = a.q.dtype();
  if (a.chunk_size != kMaxBT || a.q.size(3) != kD || a.dout.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, kDvlMmaSmem, "chunk_bwd_dv_local")) return false;
  return tok16_ok(a.q, dt) && tok16_ok(a.k, dt) && tok16_ok(a.dout, dt) && out2_ok(a.dv);
}

void dv_local(const Context& ctx, const ChunkBwdDvLocalArgs& a) {
  const char* op = "chunk_bwd_dv_local";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.dout.size(2), V = a.dout.size(3);
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = chunk_count(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || HV == 0) return;
  if (dv_local_mma_ok(ctx, a)) {
    auto kernel = a.q.dtype() == DType::kBFloat16 ? dv_local_mma_kernel<true> : dv_local_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kDvlMmaSmem);
    trace_kernel("dv_local_mma_kernel");
    kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, kDvlMmaSmem, stream_of(ctx)>>>(
        tok_of(a.q), tok_of(a.k), tok_of(a.dout), tok_of(a.g), tok_of(a.dv), L, static_cast<int>(HV / H),
        static_cast<float>(a.scale), mma16::staged_out_ok(a.dv, a.dv, a.q.dtype()));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  trace_kernel("dv_local_kernel");
  dv_local_kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, 0, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.dout), tok_of(a.g), tok_of(a.dv), L, static_cast<int>(K),
      static_cast<int>(V), static_cast<int>(HV / H), static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// chunk_bwd_dqkwg: CTA per (chunk, q/k head). Outer loop over 32-column K slices (dq, dk of the
// slice summed over the group's value heads in shared memory, in head order), inner loop over the
// value heads; Ds = scale M>= . Gamma . dO Vnew^T is recomputed per slice when the group has more
// than one value head (V-reduction). The gate
// gradient is assembled from its separate terms in double (see README):
//   dg_i = scale e^{g_i} q_i.(dO S^T)_i + rowsum(M)_i - colsum(M)_i - dKi_i.k_i,   M = Ds . Q K^T
//   dg_last += e^{g_last} <S, dH> + sum_i dKi_i.k_i.
// Shared memory (floats): Ta, Tb [64][37] (32-column V tiles), Ds, P [64][69], Qs, Ks, Acc, dQa,
// dKa [64][37], g, u [64]; doubles: dgp [G][64], red [256]. About 104 KiB: two CTAs per SM.

constexpr int kKS = 32;  // K slice width
constexpr int kLdK = pad_ld(kKS);
constexpr int kVS = 32;  // V tile width (Ta, Tb): keeps shared memory under half an SM's

size_t dqkwg_smem(int G) {
  return sizeof(double) * (static_cast<size_t>(G) * kMaxBT + kThreads) +
         sizeof(float) * (2 * kMaxBT * kLd + 7 * kMaxBT * kLdK + 2 * kMaxBT);
}

__global__ void __launch_bounds__(kThreads, 2) dqkwg_kernel(Tok q, Tok k, Tok vn, Tok dO, Mat h, Mat dh, Tok dv2,
                                                            Tok g, Tok dq, Tok dk, Tok dw, Tok dg, Layout L,
                                                            int K, int V, int HV, int G, float scale) {
  extern __shared__ double dsmem[];
  double* dgp = dsmem;                       // [G][64]
  double* red = dgp + G * kMaxBT;            // [256]
  float* Ta = reinterpret_cast<float*>(red + kThreads);
  float* Tb = Ta + kMaxBT * kLdK;
  float* Ds = Tb + kMaxBT * kLdK;
  float* P = Ds + kMaxBT * kLd;
  float* Qs = P + kMaxBT * kLd;
  float* Ks = Qs + kMaxBT * kLdK;
  float* Acc = Ks + kMaxBT * kLdK;
  float* dQa = Acc + kMaxBT * kLdK;
  float* dKa = dQa + kMaxBT * kLdK;
  float* gl = dKa + kMaxBT * kLdK;
  float* ub = gl + kMaxBT;
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  // P = Q K^T (full K).
  fill(P, kMaxBT * kLd, 0.0f);
  for (int e = tid; e < G * kMaxBT; e += blockDim.x) dgp[e] = 0.0;
  for (int y0 = 0; y0 < K; y0 += kKS) {
    __syncthreads();
    load_tile(Qs, kLdK, kMaxBT, kKS, q, c.b, c.t0, hk, len, y0, K);
    load_tile(Ks, kLdK, kMaxBT, kKS, k, c.b, c.t0, hk, len, y0, K);
    __syncthreads();
    mm(L.tc, len, len, kKS, Qs, kLdK, 1, Ks, 1, kLdK, [&](int m, int n, float v) { P[m * kLd + n] += v; });
  }
  for (int y0 = 0; y0 < K; y0 += kKS) {
    const int ks = min(kKS, K - y0);
    __syncthreads();
    load_tile(Qs, kLdK, kMaxBT, kKS, q, c.b, c.t0, hk, len, y0, K);
    load_tile(Ks, kLdK, kMaxBT, kKS, k, c.b, c.t0, hk, len, y0, K);
    fill(dQa, kMaxBT * kLdK, 0.0f);
    fill(dKa, kMaxBT * kLdK, 0.0f);
    for (int gi = 0; gi < G; ++gi) {
      const int hv = hk * G + gi;
      const int64_t sidx = chunk * HV + hv;
      __syncthreads();
      if (tid < kMaxBT) gl[tid] = (g.p && tid < len) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
      // Pass A: Ds = scale M>= . Gamma . dO Vnew^T (with one value head per group it stays in
      // shared memory from the first K slice on).
      if (y0 == 0 || G > 1) {
        fill(Ds, kMaxBT * kLd, 0.0f);
        for (int x0 = 0; x0 < V; x0 += kVS) {
          __syncthreads();
          load_tile(Ta, kLdK, kMaxBT, kVS, dO, c.b, c.t0, hv, len, x0, V);
          load_tile(Tb, kLdK, kMaxBT, kVS, vn, c.b, c.t0, hv, len, x0, V);
          __syncthreads();
          mm(L.tc, len, len, kVS, Ta, kLdK, 1, Tb, 1, kLdK, [&](int m, int n, float v) { Ds[m * kLd + n] += v; });
        }
        __syncthreads();
        for (int e = tid; e < kMaxBT * kMaxBT; e += blockDim.x) {
          const int i = e / kMaxBT, j = e - i * kMaxBT;
          Ds[i * kLd + j] = (i < len && j <= i) ? scale * expf(gl[i] - gl[j]) * Ds[i * kLd + j] : 0.0f;
        }
      }
      __syncthreads();
      if (y0 == 0 && dg.p) {
        // rowsum(M) - colsum(M) and <S, dH> (once per value head).
        if (tid < len) {
          double r = 0.0;
          for (int j = 0; j <= tid; ++j) r += static_cast<double>(Ds[tid * kLd + j]) * P[tid * kLd + j];
          for (int m = tid; m < len; ++m) r -= static_cast<double>(Ds[m * kLd + tid]) * P[m * kLd + tid];
          dgp[gi * kMaxBT + tid] += r;
        }
        double sd = 0.0;
        const int64_t base = sidx * static_cast<int64_t>(K) * V, kv = static_cast<int64_t>(K) * V;
        if ((kv & 3) == 0 && quad_ok(h.p, h.code, base, 0) && quad_ok(dh.p, dh.code, base, 0)) {
          for (int64_t e = 4 * tid; e < kv; e += 4 * blockDim.x) {
            float hs[4], ds[4];
            ld4(h.p, h.code, base + e, hs);
            ld4(dh.p, dh.code, base + e, ds);
#pragma unroll
            for (int j = 0; j < 4; ++j) sd += static_cast<double>(hs[j]) * ds[j];
          }
        } else {
          for (int64_t e = tid; e < kv; e += blockDim.x)
            sd += static_cast<double>(ldf(h.p, h.code, base + e)) * ldf(dh.p, dh.code, base + e);
        }
        red[tid] = sd;
        __syncthreads();
        if (tid == 0) {
          double t = 0.0;
          for (int e = 0; e < kThreads; ++e) t += red[e];
          dgp[gi * kMaxBT + len - 1] += static_cast<double>(expf(gl[len - 1])) * t;
        }
      }
      // Pass B: Acc = dO S^T (slice rows of S).
      fill(Acc, kMaxBT * kLdK, 0.0f);
      for (int x0 = 0; x0 < V; x0 += kVS) {
        __syncthreads();
        load_tile(Ta, kLdK, kMaxBT, kVS, dO, c.b, c.t0, hv, len, x0, V);
        load_state(Tb, kLdK, kKS, kVS, h, sidx, K, V, y0, x0);
        __syncthreads();
        mm(L.tc, len, ks, kVS, Ta, kLdK, 1, Tb, 1, kLdK, [&](int m, int n, float v) { Acc[m * kLdK + n] += v; });
      }
      __syncthreads();
      if (tid < len) {
        const float eg = scale * expf(gl[tid]);
        double r = 0.0;
        for (int y = 0; y < ks; ++y) r += static_cast<double>(Qs[tid * kLdK + y]) * Acc[tid * kLdK + y];
        dgp[gi * kMaxBT + tid] += static_cast<double>(eg) * r;
      }
      for (int e = tid; e < len * kKS; e += blockDim.x) {
        const int i = e / kKS, y = e % kKS;
        if (y < ks) dQa[i * kLdK + y] += scale * expf(gl[i]) * Acc[i * kLdK + y];
      }
      __syncthreads();
      // dQ += Ds K.
      mm(L.tc, len, ks, len, Ds, kLd, 1, Ks, kLdK, 1, [&](int m, int n, float v) { dQa[m * kLdK + n] += v; });
      __syncthreads();
      // Pass C: Acc = Vnew dH^T -> dKi = diag(e^{g_last - g}) Acc.
      fill(Acc, kMaxBT * kLdK, 0.0f);
      for (int x0 = 0; x0 < V; x0 += kVS) {
        __syncthreads();
        load_tile(Ta, kLdK, kMaxBT, kVS, vn, c.b, c.t0, hv, len, x0, V);
        load_state(Tb, kLdK, kKS, kVS, dh, sidx, K, V, y0, x0);
        __syncthreads();
        mm(L.tc, len, ks, kVS, Ta, kLdK, 1, Tb, 1, kLdK, [&](int m, int n, float v) { Acc[m * kLdK + n] += v; });
      }
      __syncthreads();
      for (int e = tid; e < len * kKS; e += blockDim.x) {
        const int i = e / kKS, y = e % kKS;
        if (y < ks) Acc[i * kLdK + y] *= expf(gl[len - 1] - gl[i]);
      }
      __syncthreads();
      if (tid < len) {
        float r = 0.0f;
        for (int y = 0; y < ks; ++y) r = fmaf(Acc[tid * kLdK + y], Ks[tid * kLdK + y], r);
        ub[tid] = r;
        dgp[gi * kMaxBT + tid] -= r;
      }
      for (int e = tid; e < len * kKS; e += blockDim.x) {
        const int i = e / kKS, y = e % kKS;
        if (y < ks) dKa[i * kLdK + y] += Acc[i * kLdK + y];
      }
      __syncthreads();
      if (tid == 0) {
        double r = 0.0;
        for (int i = 0; i < len; ++i) r += ub[i];
        dgp[gi * kMaxBT + len - 1] += r;
      }
      // dK += Ds^T Q.
      mm(L.tc, len, ks, len, Ds, 1, kLd, Qs, kLdK, 1, [&](int m, int n, float v) { dKa[m * kLdK + n] += v; });
      // Pass D: dW = -dv2 S^T.
      if (dw.p) {
        __syncthreads();
        fill(Acc, kMaxBT * kLdK, 0.0f);
        for (int x0 = 0; x0 < V; x0 += kVS) {
          __syncthreads();
          load_tile(Ta, kLdK, kMaxBT, kVS, dv2, c.b, c.t0, hv, len, x0, V);
          load_state(Tb, kLdK, kKS, kVS, h, sidx, K, V, y0, x0);
          __syncthreads();
          mm(L.tc, len, ks, kVS, Ta, kLdK, 1, Tb, 1, kLdK, [&](int m, int n, float v) { Acc[m * kLdK + n] += v; });
        }
        __syncthreads();
        store_tile(Acc, kLdK, len, ks, dw, c.b, c.t0, hv, y0, -1.0f);
      }
    }
    __syncthreads();
    store_tile(dQa, kLdK, len, ks, dq, c.b, c.t0, hk, y0);
    store_tile(dKa, kLdK, len, ks, dk, c.b, c.t0, hk, y0);
  }
  __syncthreads();
  if (dg.p)
    for (int e = tid; e < G * len; e += blockDim.x) {
      const int gi = e / len, i = e - gi * len;
      dg.st_(c.b, c.t0 + i, hk * G + gi, 0, static_cast<float>(dgp[gi * kMaxBT + i]));
    }
}

// ---------------------------------------------------------------------------------------------
// chunk_bwd_dqkwg on 16-bit tensor cores, for the common shape: K = V = 128, chunk 64, bf16 or
// fp16 operands (h and dh too), 16-byte aligned rows; everything else takes dqkwg_kernel above.
// Same math and CTA grid (chunk, q/k head) as dqkwg_kernel. 113 KiB of shared memory and at most
// 128 registers per thread, so that two blocks share an SM (one block's loads and barrier-separated
// phases overlap the other's products). Per value head, the operands are staged as 16-bit tiles
// (Q, K, dO, Vnew and h by cp.async; dv2 later into dO's buffer, dh later into h's, each once the
// buffer's last reader is done) and every product is an m16n8k16 mma with fp32 accumulators:
//   warp w owns rows 16 (w % 4) .. +15 of every output, columns 64 (w / 4) .. +63 of the 64x128
//   ones (dq, dk, dw and the dO h^T, Vnew dH^T products) and 32 (w / 4) .. +31 of the 64x64 ones
//   (P = Q K^T and dO Vnew^T; a tile wholly above the diagonal is skipped).
// Ds = scale M>= Gamma dO Vnew^T is rounded to the 16-bit type for the Ds K and Ds^T Q products
// (Ds^T read by ldmatrix.trans); M = Ds . P stays in fp32 registers, reduced to its row and column
// sums for the gate gradient, as are the other per-row terms (rowsum(Q . dO h^T), rowsum(dKi . K))
// and <h, dh> (taken while dh replaces h in shared memory). dq and dk accumulate over the group's
// value heads in registers, in head order. Every reduction (quad and column shuffles, the two
// column halves, the four row quarters, the warps) runs in a fixed order: results are deterministic.
constexpr size_t kDqkwgSmem = 2 * (4 * static_cast<size_t>(mma16::kTok) + mma16::kSt + kMaxBT * mma16::kLdS) +
                              4 * (7 * static_cast<size_t>(kMaxBT) + 2 * (kThreads / 32));

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) dqkwg_mma_kernel(Tok q, Tok k, Tok vn, Tok dO, Mat h, Mat dh, Tok dv2,
                                                                Tok g, Tok dq, Tok dk, Tok dw, Tok dg, Layout L,
                                                                int HV, int G, float scale, bool staged) {
  using namespace mma16;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Ks = Qs + kTok;
  uint16_t* dOs = Ks + kTok;  // dO, then dv2
  uint16_t* Vs = dOs + kTok;
  uint16_t* Hs = Vs + kTok;   // h, then dh
  uint16_t* Ds = Hs + kSt;
  float* gl = reinterpret_cast<float*>(Ds + kMaxBT * kLdS);  // [64]
  float* rs = gl + kMaxBT;         // [2][64]: per column half, the per-row terms of dg
  float* cs = rs + 2 * kMaxBT;     // [4][64]: per row quarter, the column sums of M
  float* red = cs + 4 * kMaxBT;    // [8]: <h, dh> per warp
  float* redk = red + kThreads / 32;  // [8]: sum of rowsum(dKi . K) per warp
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2), wn2 = 32 * (warp >> 2), half = warp >> 2;
  const int r0 = wm + (lane >> 2), r1 = r0 + 8;
  const bool live = wn2 <= wm + 15;  // this warp's 64x64 tile reaches the diagonal
  auto load_tok = [&](uint16_t* dst, const Tok& t, int head) { load_rows(dst, kLdT, t, c.b, c.t0, head, len, kD / 8); };
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
    load_tok(dOs, dO, hv);
    load_tok(Vs, vn, hv);
    load_state16(Hs, h, sidx);
    cp_async_commit();
    if (tid < kMaxBT) gl[tid] = (g.p && tid < len) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    cp_async_wait<0>();
    __syncthreads();
    const float glast = gl[len - 1];
    // The per-row terms of dg for rows r0, r1 over this warp's columns: M's row sums per lane
    // (t0, t1), the terms that row_dot has already reduced over the quad (x0, x1).
    float t0 = 0.0f, t1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
    // P = Q K^T, S = dO Vnew^T; Ds = scale M>= Gamma S (16-bit), M = Ds . P (fp32): its row sums
    // (into t0, t1) and column sums over the warp's 16 rows (into cs).
    {
      float pa[4][4], sa[4][4];
      zero(pa);
      zero(sa);
      if (live) {
        mm_xyt<BF, 4>(pa, Qs, kLdT, Ks, kLdT, wm, wn2, kD, lane);
        mm_xyt<BF, 4>(sa, dOs, kLdT, Vs, kLdT, wm, wn2, kD, lane);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float cc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, col = wn2 + 8 * j + 2 * tq + (e & 1);
          const float d = (r < len && col <= r) ? scale * exp_fast(gl[r] - gl[col]) * sa[j][e] : 0.0f;
          // The diagonal adds m to row r's sum and to column r's alike: left out of both (it
          // cancels in dg), so their different fp32 rounding leaves no residue along the chunk.
          const float m = col == r ? 0.0f : d * pa[j][e];
          if (e < 2) t0 += m;
          else t1 += m;
          cc[e & 1] += m;
          Ds[r * kLdS + col] = f2h<BF>(d);
        }
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float v2 = cc[x];
          v2 += shfl_xor(v2, 4);
          v2 += shfl_xor(v2, 8);
          v2 += shfl_xor(v2, 16);
          if (lane < 4) cs[(warp & 3) * kMaxBT + wn2 + 8 * j + 2 * tq + x] = v2;
        }
      }
    }
    // A = dO h^T: the gate term scale e^g rowsum(Q . A), then dq += scale e^g A.
    {
      float aq[8][4];
      zero(aq);
      mm_xyt<BF, 8>(aq, dOs, kLdT, Hs, kLdT, wm, wn, kD, lane);
      const float e0 = r0 < len ? scale * exp_fast(gl[r0]) : 0.0f, e1 = r1 < len ? scale * exp_fast(gl[r1]) : 0.0f;
      float s0, s1;
      row_dot<BF>(Qs, aq, r0, wn, tq, s0, s1);
      x0 += e0 * s0;
      x1 += e1 * s1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dqa[j][0] += e0 * aq[j][0];
        dqa[j][1] += e0 * aq[j][1];
        dqa[j][2] += e1 * aq[j][2];
        dqa[j][3] += e1 * aq[j][3];
      }
    }
    __syncthreads();  // Ds; every read of dO done
    if (dw.p) load_tok(dOs, dv2, hv);
    cp_async_commit();
    mm_xs<BF, 8>(dqa, Ds, kLdS, Ks, kLdT, wm, wn, 0, wm + 16, lane);    // dq += Ds K (Ds lower triangular)
    mm_xts<BF, 8>(dka, Ds, kLdS, Qs, kLdT, wm, wn, wm, kMaxBT, lane);   // dk += Ds^T Q (rows j take i >= j)
    cp_async_wait<0>();
    __syncthreads();  // dv2
    if (dw.p) {  // dW = -dv2 h^T
      float aw[8][4];
      zero(aw);
      mm_xyt<BF, 8>(aw, dOs, kLdT, Hs, kLdT, wm, wn, kD, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = wn + 8 * j + 2 * tq;
        if (r0 < len) st2(dw.p, dw.code, dw.off(c.b, c.t0 + r0, hv) + col, -aw[j][0], -aw[j][1]);
        if (r1 < len) st2(dw.p, dw.code, dw.off(c.b, c.t0 + r1, hv) + col, -aw[j][2], -aw[j][3]);
      }
    }
    __syncthreads();  // every read of h done
    // dh replaces h in shared memory; each 16-byte piece is read and written by one thread, which
    // takes <h, dh> on the way.
    {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(dh.p) + sidx * (kD * kD));
      constexpr int kPer = kD * (kD / 8) / kThreads;
      uint4 y[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) y[i] = src[tid + i * kThreads];
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = tid + i * kThreads, r = e >> 4, col = (e & 15) << 3;
        uint4* dst = reinterpret_cast<uint4*>(Hs + r * kLdT + col);
        const uint4 x = *dst;
        const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y[i].x, y[i].y, y[i].z, y[i].w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
          s += h2f<BF>(static_cast<uint16_t>(xs[u])) * h2f<BF>(static_cast<uint16_t>(ys[u])) +
               h2f<BF>(static_cast<uint16_t>(xs[u] >> 16)) * h2f<BF>(static_cast<uint16_t>(ys[u] >> 16));
        *dst = y[i];
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) s += shfl_xor(s, m);
      if (lane == 0) red[warp] = s;
    }
    __syncthreads();  // dh
    // dKi = diag(e^{g_last - g}) Vnew dH^T: the gate term rowsum(dKi . K); dk += dKi.
    {
      float ak[8][4];
      zero(ak);
      mm_xyt<BF, 8>(ak, Vs, kLdT, Hs, kLdT, wm, wn, kD, lane);
      const float f0 = r0 < len ? exp_fast(glast - gl[r0]) : 0.0f, f1 = r1 < len ? exp_fast(glast - gl[r1]) : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        ak[j][0] *= f0;
        ak[j][1] *= f0;
        ak[j][2] *= f1;
        ak[j][3] *= f1;
        dka[j][0] += ak[j][0];
        dka[j][1] += ak[j][1];
        dka[j][2] += ak[j][2];
        dka[j][3] += ak[j][3];
      }
      float u0, u1;
      row_dot<BF>(Ks, ak, r0, wn, tq, u0, u1);
      x0 -= u0;
      x1 -= u1;
      // The sum of rowsum(dKi . K) over the warp's rows (u0, u1 are quad-reduced: one lane each).
      float uk = tq == 0 ? u0 + u1 : 0.0f;
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) uk += shfl_xor(uk, m);
      if (lane == 0) redk[warp] = uk;
    }
    t0 = quad_sum(t0);
    t1 = quad_sum(t1);
    if (tq == 0) {
      rs[half * kMaxBT + r0] = t0 + x0;
      rs[half * kMaxBT + r1] = t1 + x1;
    }
    __syncthreads();  // rs, cs, red, redk
    if (dg.p && tid < len) dqkwg_dg_row(rs, cs, red, redk, kThreads / 32, glast, dg, c, hv, tid);
  }
  if (staged) {  // 16-bit dq, dk through the warp's blocks of Qs and Ks, free after the last barrier
    store_warp_rows16<BF, 8>(dqa, 1.0f, Qs, kLdT, wm, wn, dq, c.b, c.t0, hk, len, lane);
    store_warp_rows16<BF, 8>(dka, 1.0f, Ks, kLdT, wm, wn, dk, c.b, c.t0, hk, len, lane);
    return;
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

// True when chunk_bwd_dqkwg can take dqkwg_mma_kernel (see there).
bool dqkwg_mma_ok(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  using namespace mma16;
  const DType dt = a.q.dtype();
  if (a.chunk_size != kMaxBT || a.q.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, kDqkwgSmem, "chunk_bwd_dqkwg")) return false;
  for (const TensorView* t : {&a.q, &a.k, &a.v, &a.dout})
    if (!tok16_ok(*t, dt)) return false;
  if (!state16_ok(a.h, dt) || !state16_ok(a.dh, dt) || !out2_ok(a.dq) || !out2_ok(a.dk)) return false;
  return !a.w.defined() || (tok16_ok(a.dv, dt) && out2_ok(a.dw));
}

void dqkwg(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  const char* op = "chunk_bwd_dqkwg";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = chunk_count(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || H == 0) return;
  const int G = static_cast<int>(HV / H);
  if (dqkwg_mma_ok(ctx, a)) {
    auto kernel = a.q.dtype() == DType::kBFloat16 ? dqkwg_mma_kernel<true> : dqkwg_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kDqkwgSmem);
    trace_kernel("dqkwg_mma_kernel");
    kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, kDqkwgSmem, stream_of(ctx)>>>(
        tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.dout), mat_of(a.h), mat_of(a.dh), tok_of(a.dv),
        tok_of(a.g), tok_of(a.dq), tok_of(a.dk), a.w.defined() ? tok_of(a.dw) : Tok(),
        a.g.defined() ? tok_of(a.dg) : Tok(), L, static_cast<int>(HV), G, static_cast<float>(a.scale),
        mma16::staged_out_ok(a.dq, a.dk, a.q.dtype()));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  const size_t smem = dqkwg_smem(G);
  auto kernel = dqkwg_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
  trace_kernel("dqkwg_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, smem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.dout), mat_of(a.h), mat_of(a.dh), tok_of(a.dv),
      tok_of(a.g), tok_of(a.dq), tok_of(a.dk), a.w.defined() ? tok_of(a.dw) : Tok(),
      a.g.defined() ? tok_of(a.dg) : Tok(), L, static_cast<int>(K), static_cast<int>(V),
      static_cast<int>(HV), G, static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// prepare_wy_repr_bwd: CTA per (chunk, q/k head), value heads in order, dk summed in shared
// memory over the full K. Per value head:
//   dA = M> . (dW (diag(beta e^g) K)^T + dU (diag(beta) V)^T)
//   T1 = A^T dA;  DLG = -M> . (T1 A^T) . Gamma  (= dL . Gamma);  Mm = diag(beta) DLG
//   dbeta_i = sum_j DLG_ij (KK^T)_ij + e^{g_i} R_i.k_i + P_i.v_i        (R = A^T dW, P = A^T dU)
//   dg_i   += beta_i sum_j DLG_ij KK_ij - sum_m beta_m DLG_mi KK_mi + beta_i e^{g_i} R_i.k_i
//   dk     += diag(beta e^g) R + Mm K + Mm^T K;  dv = diag(beta) P.
// Shared memory (floats): KK, Am, dAm [64][69], Ta|Tb [64][37] x2 (also T1 as one [64][69]),
// Rb [64][37], dKa [64][K+5], beta, e^g, g, dbeta, dg [64].

constexpr int kWS = 32;  // slice width of the K and V tiles here
constexpr int kLdW = pad_ld(kWS);

size_t wy_smem(int K) {
  return sizeof(float) * (3 * kMaxBT * kLd + 3 * kMaxBT * kLdW + static_cast<size_t>(kMaxBT) * pad_ld(K) +
                          5 * kMaxBT);
}

__global__ void __launch_bounds__(kThreads, 1) wy_bwd_kernel(Tok k, Tok v, Tok beta, Tok A, Tok g, Tok dW, Tok dU,
                                                             Tok dk, Tok dv, Tok dbeta, Tok dg, Layout L, int K,
                                                             int V, int G, int accumulate) {
  extern __shared__ float smem[];
  float* KK = smem;
  float* Am = KK + kMaxBT * kLd;
  float* dAm = Am + kMaxBT * kLd;
  float* Ta = dAm + kMaxBT * kLd;     // [64][kLdW]
  float* Tb = Ta + kMaxBT * kLdW;     // [64][kLdW]; Ta|Tb also hold T1 [64][kLd]
  float* T1 = Ta;
  float* Rb = Tb + kMaxBT * kLdW;     // [64][kLdW]
  float* dKa = Rb + kMaxBT * kLdW;    // [64][K+5]
  float* bs = dKa + kMaxBT * pad_ld(K);
  float* es = bs + kMaxBT;
  float* gl = es + kMaxBT;
  float* dB = gl + kMaxBT;
  float* dG = dB + kMaxBT;
  const int ldk = pad_ld(K);
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  fill(KK, kMaxBT * kLd, 0.0f);
  fill(dKa, kMaxBT * ldk, 0.0f);
  for (int y0 = 0; y0 < K; y0 += kWS) {
    __syncthreads();
    load_tile(Ta, kLdW, kMaxBT, kWS, k, c.b, c.t0, hk, len, y0, K);
    __syncthreads();
    mm(L.tc, len, len, kWS, Ta, kLdW, 1, Ta, 1, kLdW, [&](int m, int n, float x) { KK[m * kLd + n] += x; });
  }
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    __syncthreads();
    if (tid < kMaxBT) {
      const bool in = tid < len;
      const float b = in ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
      const float gv = (in && g.p) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
      bs[tid] = b;
      gl[tid] = gv;
      es[tid] = g.p ? expf(gv) : 1.0f;
      dB[tid] = 0.0f;
      dG[tid] = 0.0f;
    }
    load_tri(Am, A, c.b, c.t0, hv, len, L.BT, false);
    fill(dAm, kMaxBT * kLd, 0.0f);
    // dA (before masking) = dW (diag(beta e^g) K)^T + dU (diag(beta) V)^T.
    for (int y0 = 0; y0 < K; y0 += kWS) {
      __syncthreads();
      load_tile(Ta, kLdW, kMaxBT, kWS, dW, c.b, c.t0, hv, len, y0, K);
      load_tile(Tb, kLdW, kMaxBT, kWS, k, c.b, c.t0, hk, len, y0, K);
      __syncthreads();
      mm(L.tc, len, len, kWS, Ta, kLdW, 1, Tb, 1, kLdW,
         [&](int m, int n, float x) { dAm[m * kLd + n] += bs[n] * es[n] * x; });
    }
    for (int x0 = 0; x0 < V; x0 += kWS) {
      __syncthreads();
      load_tile(Ta, kLdW, kMaxBT, kWS, dU, c.b, c.t0, hv, len, x0, V);
      load_tile(Tb, kLdW, kMaxBT, kWS, v, c.b, c.t0, hv, len, x0, V);
      __syncthreads();
      mm(L.tc, len, len, kWS, Ta, kLdW, 1, Tb, 1, kLdW, [&](int m, int n, float x) { dAm[m * kLd + n] += bs[n] * x; });
    }
    __syncthreads();
    for (int e = tid; e < kMaxBT * kMaxBT; e += blockDim.x) {
      const int i = e / kMaxBT, j = e - i * kMaxBT;
      if (j >= i) dAm[i * kLd + j] = 0.0f;
    }
    __syncthreads();
    // T1 = A^T dA  (T1 overwrites the Ta|Tb tiles, not read by this product).
    mm(L.tc, len, len, len, Am, 1, kLd, dAm, kLd, 1, [&](int m, int n, float x) { T1[m * kLd + n] = x; });
    __syncthreads();
    // DLG = -M> . (T1 A^T) . Gamma, written over dA (entries outside j < i < len stay 0).
    mm(L.tc, len, len, len, T1, kLd, 1, Am, 1, kLd, [&](int m, int n, float x) {
      dAm[m * kLd + n] = n < m ? -x * expf(gl[m] - gl[n]) : 0.0f;
    });
    __syncthreads();
    if (tid < len) {
      const int i = tid;
      float sb = 0.0f, sc = 0.0f;
      for (int j = 0; j < i; ++j) sb = fmaf(dAm[i * kLd + j], KK[i * kLd + j], sb);
      for (int m = i + 1; m < len; ++m) sc = fmaf(bs[m] * dAm[m * kLd + i], KK[m * kLd + i], sc);
      dB[i] += sb;
      dG[i] += bs[i] * sb - sc;
    }
    __syncthreads();
    // Mm = diag(beta) DLG.
    for (int e = tid; e < kMaxBT * kMaxBT; e += blockDim.x) {
      const int i = e / kMaxBT, j = e - i * kMaxBT;
      dAm[i * kLd + j] *= bs[i];
    }
    // K slices: R = A^T dW; dk += diag(beta e^g) R + Mm K + Mm^T K.
    for (int y0 = 0; y0 < K; y0 += kWS) {
      const int ks = min(kWS, K - y0);
      __syncthreads();
      load_tile(Ta, kLdW, kMaxBT, kWS, dW, c.b, c.t0, hv, len, y0, K);
      load_tile(Tb, kLdW, kMaxBT, kWS, k, c.b, c.t0, hk, len, y0, K);
      __syncthreads();
      mm(L.tc, len, ks, len, Am, 1, kLd, Ta, kLdW, 1, [&](int m, int n, float x) {
        Rb[m * kLdW + n] = x;
        dKa[m * ldk + y0 + n] += bs[m] * es[m] * x;
      });
      __syncthreads();
      if (tid < len) {
        float rk = 0.0f;
        for (int y = 0; y < ks; ++y) rk = fmaf(Rb[tid * kLdW + y], Tb[tid * kLdW + y], rk);
        dB[tid] += es[tid] * rk;
        dG[tid] += bs[tid] * es[tid] * rk;
      }
      mm(L.tc, len, ks, len, dAm, kLd, 1, Tb, kLdW, 1, [&](int m, int n, float x) { dKa[m * ldk + y0 + n] += x; });
      __syncthreads();
      mm(L.tc, len, ks, len, dAm, 1, kLd, Tb, kLdW, 1, [&](int m, int n, float x) { dKa[m * ldk + y0 + n] += x; });
    }
    // V slices: P = A^T dU; dv = diag(beta) P; dbeta += P.v.
    for (int x0 = 0; x0 < V; x0 += kWS) {
      const int vt = min(kWS, V - x0);
      __syncthreads();
      load_tile(Ta, kLdW, kMaxBT, kWS, dU, c.b, c.t0, hv, len, x0, V);
      load_tile(Tb, kLdW, kMaxBT, kWS, v, c.b, c.t0, hv, len, x0, V);
      __syncthreads();
      mm(L.tc, len, vt, len, Am, 1, kLd, Ta, kLdW, 1, [&](int m, int n, float x) {
        Rb[m * kLdW + n] = x;
        dv.st_(c.b, c.t0 + m, hv, x0 + n, bs[m] * x);
      });
      __syncthreads();
      if (tid < len) {
        float pv = 0.0f;
        for (int x = 0; x < vt; ++x) pv = fmaf(Rb[tid * kLdW + x], Tb[tid * kLdW + x], pv);
        dB[tid] += pv;
      }
    }
    __syncthreads();
    if (tid < len) {
      dbeta.st_(c.b, c.t0 + tid, hv, 0, dB[tid]);
      if (dg.p) {
        const float old = accumulate ? dg.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
        dg.st_(c.b, c.t0 + tid, hv, 0, old + dG[tid]);
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < len * K; e += blockDim.x) {
    const int i = e / K, y = e - i * K;
    const float old = accumulate ? dk.ld(c.b, c.t0 + i, hk, y) : 0.0f;
    dk.st_(c.b, c.t0 + i, hk, y, old + dKa[i * ldk + y]);
  }
}

// ---------------------------------------------------------------------------------------------
// prepare_wy_repr_bwd on 16-bit tensor cores, for the common shape: K = V = 128, chunk 64, k, v,
// A, dW and dU all bf16 or all fp16, 16-byte aligned rows, 107 KiB of shared memory and at most
// 128 registers per thread, so that two blocks share an SM (one block's barrier-separated phases
// overlap the other's); everything else takes wy_bwd_kernel above (same math, same grid: CTA per
// (chunk, q/k head), value heads in order). K V dW dU A arrive as 16-bit tiles by cp.async; A is
// masked to its lower triangle. Products on m16n8k16 mma with fp32 register accumulators, warp
// tiles as in dqkwg_mma_kernel; the transposed operands (A^T, Mm^T) are read from A and Mm by
// ldmatrix.trans (mm_xts):
//   X = dW K^T and Y = dU V^T -> dA = M> . (X diag(beta e^g) + Y diag(beta))
//   T1 = A^T dA, DLG = -M> . (T1 A^T) . Gamma; E = DLG . (K K^T) (fp32, for dbeta and dg: only
//   its row sums and its beta-weighted column sums, reduced from registers); Mm = diag(beta) DLG
//   R = A^T dW: dk += diag(beta e^g) R;  dk += Mm K + Mm^T K;  P = A^T dU: dv = diag(beta) P.
// dA, T1 and Mm are rounded to the input type as operands of the next product (as
// flash-linear-attention does). dk accumulates over the group's value heads in registers; every
// reduction runs in a fixed order.
constexpr size_t kWySmem = 2 * (4 * static_cast<size_t>(mma16::kTok) + 4 * kMaxBT * mma16::kLdA) +
                          4 * (13 * static_cast<size_t>(kMaxBT));

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) wy_bwd_mma_kernel(Tok k, Tok v, Tok beta, Tok A, Tok g, Tok dW, Tok dU,
                                                                 Tok dk, Tok dv, Tok dbeta, Tok dg, Layout L, int G,
                                                                 int accumulate, bool dv_staged, bool dk_staged) {
  using namespace mma16;
  extern __shared__ float smem[];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Vs = Ks + kTok;
  uint16_t* dWs = Vs + kTok;
  uint16_t* dUs = dWs + kTok;
  uint16_t* As = dUs + kTok;
  uint16_t* dAs = As + kMaxBT * kLdA;
  uint16_t* T1s = dAs + kMaxBT * kLdA;
  uint16_t* Mms = T1s + kMaxBT * kLdA;
  float* bs = reinterpret_cast<float*>(Mms + kMaxBT * kLdA);
  float* es = bs + kMaxBT;
  float* gl = es + kMaxBT;
  float* rb = gl + kMaxBT;      // [2][64]: rowsum(R . K), per column half
  float* rp = rb + 2 * kMaxBT;  // [2][64]: rowsum(P . V)
  float* er = rp + 2 * kMaxBT;  // [2][64]: row sums of E, per column half
  float* ec = er + 2 * kMaxBT;  // [4][64]: sum_m beta_m E[m][col], per quarter of the rows
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2), wn2 = 32 * (warp >> 2), half = warp >> 2;
  const int r0 = wm + (lane >> 2), r1 = r0 + 8;
  const bool live = wn2 <= wm + 15;
  auto load = [&](uint16_t* dst, int ld, const Tok& t, int head, int chunks) {
    load_rows(dst, ld, t, c.b, c.t0, head, len, chunks);
  };
  float dka[8][4];
  zero(dka);
  for (int gi = 0; gi < G; ++gi) {
    const int hv = hk * G + gi;
    if (gi > 0) __syncthreads();  // the previous value head is done with every buffer
    if (gi == 0) load(Ks, kLdT, k, hk, kD / 8);
    load(Vs, kLdT, v, hv, kD / 8);
    load(dWs, kLdT, dW, hv, kD / 8);
    load(dUs, kLdT, dU, hv, kD / 8);
    load(As, kLdA, A, hv, kMaxBT / 8);
    cp_async_commit();
    if (tid < kMaxBT) {
      const bool in = tid < len;
      const float gv = (in && g.p) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
      bs[tid] = in ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
      gl[tid] = gv;
      es[tid] = g.p ? exp_fast(gv) : 1.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    // A: its lower triangle (diagonal included).
    for (int e = tid; e < kMaxBT * kMaxBT; e += kThreads) {
      const int i = e >> 6, j = e & 63;
      if (j > i) As[i * kLdA + j] = uint16_t{0};
    }
    // dA = M> . (dW K^T diag(beta e^g) + dU V^T diag(beta)).
    {
      float x1[4][4], x2[4][4];
      zero(x1);
      zero(x2);
      if (live) {
        mm_xyt<BF, 4>(x1, dWs, kLdT, Ks, kLdT, wm, wn2, kD, lane);
        mm_xyt<BF, 4>(x2, dUs, kLdT, Vs, kLdT, wm, wn2, kD, lane);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, col = wn2 + 8 * j + 2 * tq + (e & 1);
          const float d = (r < len && col < r) ? bs[col] * (es[col] * x1[j][e] + x2[j][e]) : 0.0f;
          dAs[r * kLdA + col] = f2h<BF>(d);
        }
    }
    __syncthreads();  // A, dA
    // T1 = A^T dA (rows m take i >= m only).
    {
      float t1[4][4];
      zero(t1);
      mm_xts<BF, 4>(t1, As, kLdA, dAs, kLdA, wm, wn2, wm, kMaxBT, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, col = wn2 + 8 * j + 2 * tq + (e & 1);
          T1s[r * kLdA + col] = f2h<BF>(t1[j][e]);
        }
    }
    __syncthreads();  // T1
    // DLG = -M> . (T1 A^T) . Gamma (A[n][p] = 0 for p > n: columns up to wn2 + 31 need p < wn2 + 32);
    // E = DLG . (K K^T), reduced to its row sums and beta-weighted column sums.
    {
      float dl[4][4], kk[4][4];
      zero(dl);
      zero(kk);
      if (live) {
        mm_xyt<BF, 4>(dl, T1s, kLdA, As, kLdA, wm, wn2, wn2 + 32, lane);
        mm_xyt<BF, 4>(kk, Ks, kLdT, Ks, kLdT, wm, wn2, kD, lane);
      }
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float cs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, col = wn2 + 8 * j + 2 * tq + (e & 1);
          const float d = (r < len && col < r) ? -dl[j][e] * exp_fast(gl[r] - gl[col]) : 0.0f;
          const float ev = d * kk[j][e];
          if (e < 2) s0 += ev;
          else s1 += ev;
          cs[e & 1] += bs[r] * ev;
          Mms[r * kLdA + col] = f2h<BF>(bs[r] * d);
        }
        // Column sums over the warp's 16 rows: the 8 lanes sharing tq.
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float v2 = cs[x];
          v2 += shfl_xor(v2, 4);
          v2 += shfl_xor(v2, 8);
          v2 += shfl_xor(v2, 16);
          if (lane < 4) ec[(warp & 3) * kMaxBT + wn2 + 8 * j + 2 * tq + x] = v2;
        }
      }
      s0 = quad_sum(s0);
      s1 = quad_sum(s1);
      if (tq == 0) {
        er[half * kMaxBT + r0] = s0;
        er[half * kMaxBT + r1] = s1;
      }
    }
    __syncthreads();  // Mm, er, ec
    // R = A^T dW: dk += diag(beta e^g) R, the gate/beta term rowsum(R . K).
    {
      float ra[8][4];
      zero(ra);
      mm_xts<BF, 8>(ra, As, kLdA, dWs, kLdT, wm, wn, wm, kMaxBT, lane);
      const float f0 = bs[r0] * es[r0], f1 = bs[r1] * es[r1];
      float u0, u1;
      row_dot<BF>(Ks, ra, r0, wn, tq, u0, u1);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dka[j][0] += f0 * ra[j][0];
        dka[j][1] += f0 * ra[j][1];
        dka[j][2] += f1 * ra[j][2];
        dka[j][3] += f1 * ra[j][3];
      }
      if (tq == 0) {
        rb[half * kMaxBT + r0] = u0;
        rb[half * kMaxBT + r1] = u1;
      }
    }
    // dk += Mm K (Mm[m][n] = 0 for n >= m) + Mm^T K (Mm^T[m][n] = Mm[n][m] = 0 for n <= m).
    mm_xs<BF, 8>(dka, Mms, kLdA, Ks, kLdT, wm, wn, 0, wm + 16, lane);
    mm_xts<BF, 8>(dka, Mms, kLdA, Ks, kLdT, wm, wn, wm, kMaxBT, lane);
    // P = A^T dU: dv = diag(beta) P, the beta term rowsum(P . V).
    {
      float pa[8][4];
      zero(pa);
      mm_xts<BF, 8>(pa, As, kLdA, dUs, kLdT, wm, wn, wm, kMaxBT, lane);
      const float b0 = bs[r0], b1 = bs[r1];
      float u0, u1;
      row_dot<BF>(Vs, pa, r0, wn, tq, u0, u1);
      if (dv_staged) {
        // Through the warp's own [16][64] block of Vs (row_dot above was its last reader; the
        // other warps read only their own blocks from here to the next value head's barrier).
        __syncwarp();
        scale_rows(pa, b0, b1);
        store_warp_rows16<BF, 8>(pa, 1.0f, Vs, kLdT, wm, wn, dv, c.b, c.t0, hv, len, lane);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = wn + 8 * j + 2 * tq;
          if (r0 < len) st2(dv.p, dv.code, dv.off(c.b, c.t0 + r0, hv) + col, b0 * pa[j][0], b0 * pa[j][1]);
          if (r1 < len) st2(dv.p, dv.code, dv.off(c.b, c.t0 + r1, hv) + col, b1 * pa[j][2], b1 * pa[j][3]);
        }
      }
      if (tq == 0) {
        rp[half * kMaxBT + r0] = u0;
        rp[half * kMaxBT + r1] = u1;
      }
    }
    __syncthreads();  // rb, rp
    if (tid < len) {
      // dbeta_i = sum_{j<i} E_ij + e^{g_i} R_i.k_i + P_i.v_i;
      // dg_i += beta_i sum_{j<i} E_ij - sum_{m>i} beta_m E_mi + beta_i e^{g_i} R_i.k_i.
      const int i = tid;
      const float sb = er[i] + er[kMaxBT + i];
      const float sc = (ec[i] + ec[kMaxBT + i]) + (ec[2 * kMaxBT + i] + ec[3 * kMaxBT + i]);
      const float rk = rb[i] + rb[kMaxBT + i];
      dbeta.st_(c.b, c.t0 + i, hv, 0, sb + es[i] * rk + (rp[i] + rp[kMaxBT + i]));
      if (dg.p) {
        const float old = accumulate ? dg.ld(c.b, c.t0 + i, hv, 0) : 0.0f;
        dg.st_(c.b, c.t0 + i, hv, 0, old + (bs[i] * sb - sc + bs[i] * es[i] * rk));
      }
    }
  }
  if (dk_staged) {
    // dk (16-bit, k's type) by 16-byte rows: the fp32 sums through Ks + Vs as one [64][kLdT] fp32
    // tile, then per 8 columns old + sum (fp32) rounded once, as the pair stores below do.
    __syncthreads();  // every warp is done with Ks and Vs
    static_assert(sizeof(float) * kMaxBT * kLdT == 2 * sizeof(uint16_t) * kTok, "the fp32 tile is Ks and Vs");
    float* Ds = reinterpret_cast<float*>(Ks);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = wn + 8 * j + 2 * tq;
      *reinterpret_cast<float2*>(Ds + r0 * kLdT + col) = float2{dka[j][0], dka[j][1]};
      *reinterpret_cast<float2*>(Ds + r1 * kLdT + col) = float2{dka[j][2], dka[j][3]};
    }
    __syncthreads();
    uint16_t* base = static_cast<uint16_t*>(dk.p);
    for (int e = tid; e < len * (kD / 8); e += kThreads) {
      const int r = e >> 4, col = (e & 15) << 3;
      uint16_t* dst = base + dk.off(c.b, c.t0 + r, hk) + col;
      const float4 s0 = *reinterpret_cast<const float4*>(Ds + r * kLdT + col);
      const float4 s1 = *reinterpret_cast<const float4*>(Ds + r * kLdT + col + 4);
      const float sum[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      uint4 old = {0u, 0u, 0u, 0u};
      if (accumulate) old = *reinterpret_cast<const uint4*>(dst);
      const uint32_t ow[4] = {old.x, old.y, old.z, old.w};
      uint32_t nw[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float a = accumulate ? h2f<BF>(static_cast<uint16_t>(ow[q])) : 0.0f;
        const float b = accumulate ? h2f<BF>(static_cast<uint16_t>(ow[q] >> 16)) : 0.0f;
        nw[q] = pack2<BF>(a + sum[2 * q], b + sum[2 * q + 1]);
      }
      *reinterpret_cast<uint4*>(dst) = uint4{nw[0], nw[1], nw[2], nw[3]};
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = wn + 8 * j + 2 * tq;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = hr ? r1 : r0;
      if (r >= len) continue;
      const int64_t o = dk.off(c.b, c.t0 + r, hk) + col;
      float a = 0.0f, b = 0.0f;
      if (accumulate) ld2(dk.p, dk.code, o, a, b);
      st2(dk.p, dk.code, o, a + dka[j][2 * hr], b + dka[j][2 * hr + 1]);
    }
  }
}

// True when prepare_wy_repr_bwd can take wy_bwd_mma_kernel (see there).
bool wy_mma_ok(const Context& ctx, const PrepareWyReprBwdArgs& a) {
  using namespace mma16;
  const DType dt = a.k.dtype();
  if (a.A.size(3) != kMaxBT || a.k.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, kWySmem, "prepare_wy_repr_bwd")) return false;
  for (const TensorView* t : {&a.k, &a.v, &a.A, &a.dw, &a.du})
    if (!tok16_ok(*t, dt)) return false;
  return out2_ok(a.dk) && out2_ok(a.dv);
}

void wy_bwd(const Context& ctx, const PrepareWyReprBwdArgs& a) {
  const char* op = "prepare_wy_repr_bwd";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), H = a.k.size(2), K = a.k.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3), BT = a.A.size(3);
  const Layout L = layout_of(B, T, BT, a.cu_seqlens, a.chunk_indices, TensorView(), a.k.dtype());
  const int64_t NT = chunk_count(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || H == 0) return;
  if (wy_mma_ok(ctx, a)) {
    auto kernel = a.k.dtype() == DType::kBFloat16 ? wy_bwd_mma_kernel<true> : wy_bwd_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kWySmem);
    trace_kernel("wy_bwd_mma_kernel");
    kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, kWySmem, stream_of(ctx)>>>(
        tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.A), tok_of(a.g), tok_of(a.dw), tok_of(a.du),
        tok_of(a.dk), tok_of(a.dv), tok_of(a.dbeta), a.g.defined() ? tok_of(a.dg) : Tok(), L,
        static_cast<int>(HV / H), a.accumulate_dk_dg ? 1 : 0, mma16::staged_out_ok(a.dv, a.dv, a.k.dtype()),
        mma16::staged_out_ok(a.dk, a.dk, a.k.dtype()));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  const size_t smem = wy_smem(static_cast<int>(K));
  auto kernel = wy_bwd_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
  trace_kernel("wy_bwd_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kThreads, smem, stream_of(ctx)>>>(
      tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.A), tok_of(a.g), tok_of(a.dw), tok_of(a.du),
      tok_of(a.dk), tok_of(a.dv), tok_of(a.dbeta), a.g.defined() ? tok_of(a.dg) : Tok(), L,
      static_cast<int>(K), static_cast<int>(V), static_cast<int>(HV / H), a.accumulate_dk_dg ? 1 : 0);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// gdn_gate backward. The gate's parameter gradients are reduced per head by one
// CTA in a fixed order (per-thread double partials over rows tid, tid+256, ..., then thread 0 sums
// the 256 partials in order): deterministic, no atomics, no workspace.

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void gate_bwd_kernel(const void* g, int gc, int64_t rs, const void* dy, int dc, int64_t drs,
                                const void* A, int ac, const void* bias, int bc, void* dx, int xc,
                                int64_t rows, int64_t D) {
  const int64_t n = rows * D;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / D, d = e - r * D;
    const float z = ldf(g, gc, r * rs + d) + (bias ? ldf(bias, bc, d) : 0.0f);
    const float ea = expf(ldf(A, ac, d));
    stf(dx, xc, e, -ea / (1.0f + expf(-z)) * ldf(dy, dc, r * drs + d));
  }
}

__global__ void __launch_bounds__(kThreads) gate_param_kernel(const void* g, int gc, int64_t rs, const void* dy,
                                                              int dc, int64_t drs, const void* A, int ac,
                                                              const void* bias, int bc, void* dA, int dac,
                                                              void* dbias, int dbc, int64_t rows, int64_t D) {
  __shared__ double red[2][kThreads];
  const int64_t d = blockIdx.x;
  const float ea = expf(ldf(A, ac, d)), bb = bias ? ldf(bias, bc, d) : 0.0f;
  double sa = 0.0, sb = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const float z = ldf(g, gc, r * rs + d) + bb;
    const float gy = ldf(dy, dc, r * drs + d);
    const float y = -ea * softplus_f(z);
    const float dx = -ea / (1.0f + expf(-z)) * gy;
    sa += static_cast<double>(gy) * y;
    sb += dx;
  }
  red[0][threadIdx.x] = sa;
  red[1][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.x == 0) {
    double ta = 0.0, tb = 0.0;
    for (int e = 0; e < kThreads; ++e) {
      ta += red[0][e];
      tb += red[1][e];
    }
    stf(dA, dac, d, static_cast<float>(ta));
    if (dbias) stf(dbias, dbc, d, static_cast<float>(tb));
  }
}

void gate_bwd(const Context& ctx, const GdnGateBwdArgs& a) {
  const char* op = "gdn_gate";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t D = a.g.size(-1), n = a.g.numel(), rows = D > 0 ? n / D : 0;
  if (D == 0) return;
  const int64_t rs = rows ? a.g.row_stride() : 0, drs = rows ? a.dy.row_stride() : 0;
  const bool has_bias = a.dt_bias.defined() && a.dt_bias.numel();
  const void* bias = has_bias ? a.dt_bias.data() : nullptr;
  const int bc = has_bias ? code_of(a.dt_bias.dtype()) : kF32;
  const cudaStream_t st = stream_of(ctx);
  if (n > 0) {
    trace_kernel("gate_bwd_kernel");
    gate_bwd_kernel<<<elem_blocks(n), kThreads, 0, st>>>(a.g.data(), code_of(a.g.dtype()), rs, a.dy.data(),
                                                        code_of(a.dy.dtype()), drs, a.A_log.data(),
                                                        code_of(a.A_log.dtype()), bias, bc, a.dg.data(),
                                                        code_of(a.dg.dtype()), rows, D);
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  }
  const bool has_db = a.ddt_bias.defined() && a.ddt_bias.numel();
  trace_kernel("gate_param_kernel");
  gate_param_kernel<<<static_cast<unsigned>(D), kThreads, 0, st>>>(
      rows ? a.g.data() : nullptr, code_of(a.g.dtype()), rs, rows ? a.dy.data() : nullptr,
      code_of(a.dy.dtype()), drs, a.A_log.data(), code_of(a.A_log.dtype()), bias, bc, a.dA_log.data(),
      code_of(a.dA_log.dtype()), has_db ? a.ddt_bias.data() : nullptr,
      has_db ? code_of(a.ddt_bias.dtype()) : kF32, rows, D);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void top_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  compose_bwd(with_backend(ctx, "cuda_sm80"), a);
}

// ---------------------------------------------------------------------------------------------
// fused_recurrent_gated_delta_rule (backward): CTA per (sequence, q/k head); the group's value
// heads one after the other, each with its whole [K,V] state S and gradient dS in shared memory.
// No workspace: the state before token t is recomputed from a checkpoint C at the start of t's
// 64-token segment (C itself recomputed from h0 when the reverse sweep enters a segment), or from
// h0 when three [K,V] buffers do not fit in shared memory. dq and dk are summed over the value
// heads in head order: the first head writes them, the next ones add to the stored values.

constexpr int kRecSeg = 64;

struct RecBwd {
  Tok q, k, v, g, beta, dO, dq, dk, dv, dg, dbeta;
  Mat h0, dht, dh0;
  Layout L;
  int K, V, HV, G, ldv, ckpt;
  float scale;
};

size_t rec_bwd_smem(int K, int V, bool ckpt) {
  const size_t state = static_cast<size_t>(K) * (V + 1);
  return sizeof(float) * ((ckpt ? 3 : 2) * state + 2 * static_cast<size_t>(K) + 5 * static_cast<size_t>(V) +
                          kThreads + 4);
}

// Loads token t's k (and q), v, decay and beta into shared memory. Ends with a barrier.
__device__ __forceinline__ void rec_token(const RecBwd& p, const SeqPos& s, int64_t i, int hk, int hv, float* ks,
                                          float* qs, float* vs, float* sc) {
  const int64_t t = s.t0 + i;
  __syncthreads();
  for (int e = threadIdx.x; e < p.K; e += blockDim.x) {
    ks[e] = p.k.ld(s.b, t, hk, e);
    if (qs) qs[e] = p.q.ld(s.b, t, hk, e);
  }
  for (int e = threadIdx.x; e < p.V; e += blockDim.x) vs[e] = p.v.ld(s.b, t, hv, e);
  if (threadIdx.x == 0) {
    sc[0] = p.g.p ? expf(p.g.ld(s.b, t, hv, 0)) : 1.0f;
    sc[1] = p.beta.p ? p.beta.ld(s.b, t, hv, 0) : 1.0f;
  }
  __syncthreads();
}

// f(y, x) over the elements of a [K, V] state, e = threadIdx.x + j blockDim.x in the row-major order
// (y = e / V); without a division per element where blockDim.x is a multiple of V (each thread
// keeps its column). The same elements in the same order either way.
template <class F>
__device__ __forceinline__ void for_kv(int K, int V, F&& f) {
  const int step = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  if (step % V == 0) {
    const int x = tid % V, dy = step / V;
    for (int y = tid / V; y < K; y += dy) f(y, x);
  } else {
    for (int e = tid; e < K * V; e += step) {
      const int y = e / V;
      f(y, e - y * V);
    }
  }
}

// One forward step of the recurrence on S in place (S = decay S + k delta^T).
__device__ __forceinline__ void rec_step(const RecBwd& p, float* S, const float* ks, const float* vs,
                                         const float* sc, float* delta) {
  const float decay = sc[0], bt = sc[1];
  for (int x = threadIdx.x; x < p.V; x += blockDim.x) {
    float acc = 0.0f;
    for (int y = 0; y < p.K; ++y) acc = fmaf(S[y * p.ldv + x], ks[y], acc);
    delta[x] = bt * (vs[x] - decay * acc);
  }
  __syncthreads();
  for_kv(p.K, p.V, [&](int y, int x) { S[y * p.ldv + x] = fmaf(decay, S[y * p.ldv + x], ks[y] * delta[x]); });
}

__device__ __forceinline__ void rec_copy(const RecBwd& p, float* dst, const float* src) {
  for_kv(p.K, p.V, [&](int y, int x) { dst[y * p.ldv + x] = src[y * p.ldv + x]; });
}

// A [K,V] state (or zeros) into shared memory. The loads of a thread are issued in batches of
// kRecLoads before any is stored: one latency per batch, not per element (a decoding step's
// backward read its 64 KiB state at one load per latency and took ~70 us per CTA).
constexpr int kRecLoads = 16;

__device__ __forceinline__ void rec_load(const RecBwd& p, float* dst, const Mat& m, int64_t index) {
  const int64_t base = index * static_cast<int64_t>(p.K) * p.V;
  const int n = p.K * p.V, step = static_cast<int>(blockDim.x);
  for (int e0 = threadIdx.x; e0 < n; e0 += kRecLoads * step) {
    float r[kRecLoads];
#pragma unroll
    for (int u = 0; u < kRecLoads; ++u) {
      const int e = e0 + u * step;
      r[u] = (m.p && e < n) ? ldf(m.p, m.code, base + e) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kRecLoads; ++u) {
      const int e = e0 + u * step;
      if (e < n) dst[(e / p.V) * p.ldv + e % p.V] = r[u];
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) recurrent_bwd_kernel(RecBwd p) {
  extern __shared__ float smem[];
  const int K = p.K, V = p.V, ldv = p.ldv;
  const size_t state = static_cast<size_t>(K) * ldv;
  float* S = smem;
  float* dS = S + state;
  float* C = p.ckpt ? dS + state : nullptr;
  float* ks = dS + state * (p.ckpt ? 2 : 1);
  float* qs = ks + K;
  float* vs = qs + K;
  float* dOs = vs + V;
  float* delta = dOs + V;
  float* pp = delta + V;
  float* dd = pp + V;
  float* red = dd + V;
  float* sc = red + kThreads;
  const int64_t n = blockIdx.x / (p.HV / p.G);
  const int hk = static_cast<int>(blockIdx.x % (p.HV / p.G));
  const SeqPos s = seq_pos(p.L, n);
  const int64_t Ln = s.len;
  const int tid = threadIdx.x;
  for (int gi = 0; gi < p.G; ++gi) {
    const int hv = hk * p.G + gi;
    const int64_t sidx = n * p.HV + hv;
    __syncthreads();
    rec_load(p, dS, p.dht, sidx);
    int64_t seg = -1;  // segment whose start state C holds
    for (int64_t i = Ln - 1; i >= 0; --i) {
      // S = state before token i.
      const int64_t i0 = p.ckpt ? (i / kRecSeg) * kRecSeg : 0;
      if (p.ckpt && seg != i / kRecSeg) {
        __syncthreads();
        rec_load(p, S, p.h0, sidx);
        for (int64_t j = 0; j < i0; ++j) {
          rec_token(p, s, j, hk, hv, ks, nullptr, vs, sc);
          rec_step(p, S, ks, vs, sc, delta);
        }
        __syncthreads();
        rec_copy(p, C, S);
        seg = i / kRecSeg;
      } else {
        __syncthreads();
        if (p.ckpt) rec_copy(p, S, C);
        else rec_load(p, S, p.h0, sidx);
      }
      for (int64_t j = i0; j < i; ++j) {
        rec_token(p, s, j, hk, hv, ks, nullptr, vs, sc);
        rec_step(p, S, ks, vs, sc, delta);
      }
      // Token i: S holds S_{i-1}.
      rec_token(p, s, i, hk, hv, ks, qs, vs, sc);
      const int64_t t = s.t0 + i;
      for (int e = tid; e < V; e += blockDim.x) dOs[e] = p.dO.ld(s.b, t, hv, e);
      const float decay = sc[0], bt = sc[1];
      __syncthreads();
      // p = (decay S)^T k; delta = beta (v - p).
      for (int x = tid; x < V; x += blockDim.x) {
        float acc = 0.0f;
        for (int y = 0; y < K; ++y) acc = fmaf(S[y * ldv + x], ks[y], acc);
        pp[x] = decay * acc;
        delta[x] = bt * (vs[x] - decay * acc);
      }
      // dS += scale q dO^T.
      for_kv(K, V, [&](int y, int x) { dS[y * ldv + x] = fmaf(p.scale * qs[y], dOs[x], dS[y * ldv + x]); });
      __syncthreads();
      // dd = dS^T k (per column); dq = scale S_i dO, dk = dS delta (per row).
      for (int x = tid; x < V; x += blockDim.x) {
        float acc = 0.0f;
        for (int y = 0; y < K; ++y) acc = fmaf(dS[y * ldv + x], ks[y], acc);
        dd[x] = acc;
        p.dv.st_(s.b, t, hv, x, bt * acc);
      }
      float dk_row = 0.0f;  // for row y = tid (K <= 256)
      if (tid < K) {
        const int y = tid;
        float aq = 0.0f, ak = 0.0f;
        for (int x = 0; x < V; ++x) {
          const float sv = fmaf(decay, S[y * ldv + x], ks[y] * delta[x]);
          aq = fmaf(sv, dOs[x], aq);
          ak = fmaf(dS[y * ldv + x], delta[x], ak);
        }
        const float dqv = p.scale * aq + (gi > 0 ? p.dq.ld(s.b, t, hk, y) : 0.0f);
        p.dq.st_(s.b, t, hk, y, dqv);
        dk_row = ak;
      }
      __syncthreads();
      // dbeta = dd . (v - p); dp = -beta dd; dk += decay S dp; dS += k dp^T.
      if (tid < K) {
        const int y = tid;
        float a2 = 0.0f;
        for (int x = 0; x < V; ++x) a2 = fmaf(S[y * ldv + x], -bt * dd[x], a2);
        const float dkv = dk_row + decay * a2 + (gi > 0 ? p.dk.ld(s.b, t, hk, y) : 0.0f);
        p.dk.st_(s.b, t, hk, y, dkv);
      }
      if (tid == 0 && p.dbeta.p) {
        float db = 0.0f;
        for (int x = 0; x < V; ++x) db = fmaf(dd[x], vs[x] - pp[x], db);
        p.dbeta.st_(s.b, t, hv, 0, db);
      }
      __syncthreads();
      float part = 0.0f;
      for_kv(K, V, [&](int y, int x) {
        const float d = fmaf(ks[y], -bt * dd[x], dS[y * ldv + x]);
        dS[y * ldv + x] = d;
        part = fmaf(decay * S[y * ldv + x], d, part);
      });
      red[tid] = part;
      __syncthreads();
      if (tid == 0 && p.dg.p) {
        // The 256 partials summed in double: a float running sum of them cost dg up to 4x the
        // error of PyTorch's (pairwise) reduction on the fp32 test.
        double tot = 0.0;
        for (int e = 0; e < kThreads; ++e) tot += static_cast<double>(red[e]);
        p.dg.st_(s.b, t, hv, 0, static_cast<float>(tot));
      }
      for_kv(K, V, [&](int y, int x) { dS[y * ldv + x] *= decay; });
    }
    __syncthreads();
    if (p.dh0.p) {
      const int64_t base = sidx * static_cast<int64_t>(K) * V;
      for (int e = tid; e < K * V; e += blockDim.x) stf(p.dh0.p, p.dh0.code, base + e, dS[(e / V) * ldv + e % V]);
    }
  }
}

size_t smem_optin(const char* op, int device) {
  int optin = 0;
  FUSEDOPS_CUDA_CHECK(op, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return static_cast<size_t>(optin);
}

void recurrent_bwd(const Context& ctx, const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  const char* op = "fused_recurrent_gated_delta_rule";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * H == 0) return;
  RecBwd p;
  p.q = tok_of(a.q);
  p.k = tok_of(a.k);
  p.v = tok_of(a.v);
  p.g = tok_of(a.g);
  p.beta = tok_of(a.beta);
  p.dO = tok_of(a.dout);
  p.dq = tok_of(a.dq);
  p.dk = tok_of(a.dk);
  p.dv = tok_of(a.dv);
  p.dg = tok_of(a.dg);
  p.dbeta = tok_of(a.dbeta);
  p.h0 = mat_of(a.initial_state);
  p.dht = mat_of(a.dht);
  p.dh0 = mat_of(a.dh0);
  p.L = layout_of(B, T, 1, a.cu_seqlens, TensorView(), TensorView(), a.q.dtype());
  p.K = static_cast<int>(K);
  p.V = static_cast<int>(V);
  p.HV = static_cast<int>(HV);
  p.G = static_cast<int>(HV / H);
  p.ldv = static_cast<int>(V) + 1;
  p.scale = static_cast<float>(a.scale);
  const size_t optin = smem_optin(op, ctx.device.index);
  p.ckpt = rec_bwd_smem(p.K, p.V, true) <= optin ? 1 : 0;
  const size_t smem = rec_bwd_smem(p.K, p.V, p.ckpt != 0);
  auto kernel = recurrent_bwd_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
  trace_kernel("recurrent_bwd_kernel");
  kernel<<<static_cast<unsigned>(N * H), kThreads, smem, stream_of(ctx)>>>(p);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

bool sup_recurrent(const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  return la::no_float64(a) &&
         a.q.size(-1) <= kThreads && rec_bwd_smem(static_cast<int>(a.q.size(-1)), static_cast<int>(a.v.size(-1)),
                                                  false) <= 227 * 1024;
}

// ---------------------------------------------------------------------------------------------

bool sup_wy(const PrepareWyReprBwdArgs& a) {
  return no_f64({&a.k, &a.v, &a.beta, &a.A, &a.g, &a.dw, &a.du, &a.dk, &a.dv, &a.dbeta, &a.dg}) &&
         a.k.size(-1) <= 256;
}
bool sup_dvl(const ChunkBwdDvLocalArgs& a) { return no_f64({&a.q, &a.k, &a.dout, &a.g, &a.dv}); }
bool sup_dqkwg(const ChunkBwdDqkwgArgs& a) {
  return no_f64({&a.q, &a.k, &a.v, &a.dout, &a.h, &a.dh, &a.w, &a.dv, &a.g, &a.dq, &a.dk, &a.dw, &a.dg}) &&
         a.v.size(2) / a.q.size(2) <= 64;
}
bool sup_gate(const GdnGateBwdArgs& a) {
  return no_f64({&a.g, &a.A_log, &a.dt_bias, &a.dy, &a.dg, &a.dA_log, &a.ddt_bias});
}
bool sup_top(const ChunkGatedDeltaRuleBwdArgs& a) {
  return la::no_float64(a, {&a.A}) &&
         a.q.size(-1) <= 256 && a.v.size(2) / a.q.size(2) <= 64;
}

}  // namespace

bool top_bwd_supported(const ChunkGatedDeltaRuleBwdArgs& a) { return sup_top(a); }

}  // namespace fusedops::gdn::sm80

namespace fusedops::gdn {

void register_cuda_sm80_bwd(Registry& r) {
  using namespace sm80;
  const BackendSpec s = spec();
  r.add<PrepareWyReprBwdArgs>("recompute_w_u", Direction::kBackward, s, sup_wy, wy_bwd);
  r.add<ChunkBwdDvLocalArgs>("chunk_bwd_dv_local", Direction::kBackward, s, sup_dvl, dv_local);
  r.add<ChunkBwdDqkwgArgs>("chunk_bwd_dqkwg", Direction::kBackward, s, sup_dqkwg, dqkwg);
  r.add<GdnGateBwdArgs>("gdn_gate", Direction::kBackward, s, sup_gate, gate_bwd);
  r.add<FusedRecurrentGatedDeltaRuleBwdArgs>("fused_recurrent_gated_delta_rule", Direction::kBackward, s,
                                             sup_recurrent, recurrent_bwd);
  r.add<ChunkGatedDeltaRuleBwdArgs>("chunk_gated_delta_rule", Direction::kBackward, s, sup_top, top_bwd);
}

}  // namespace fusedops::gdn
