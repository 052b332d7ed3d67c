// The shared linear-attention sub-operators, CUDA backend cuda_sm80: the backward-direction
// kernels both families run. The reverse state recurrence chunk_gated_delta_rule_bwd_dhu (a CTA
// per sequence, value head and 32-column V tile, over the chunks in reverse; fp32 shared-memory
// forms and the 16-bit tensor-core forms with the state gradient in registers), in both gate forms
// (g or gk); beta_sigmoid's backward.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/linear_attention.h"
#include "src/cuda/check.cuh"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"

namespace fusedops::la::sm80 {
namespace {

// ---------------------------------------------------------------------------------------------
// chunk_gated_delta_rule_bwd_dhu: CTA per (sequence, value head, 32-column V tile), reverse over
// the chunks. Shared memory: X [K][37], Sl [64][69], D2 [64][37], dOs [64][37], g [64], gk_last [K].

constexpr int kVT = 32;
constexpr int kLdV = pad_ld(kVT);

size_t state_smem(int K) {
  return sizeof(float) * (static_cast<size_t>(K) * kLdV + kMaxBT * kLd + 2 * kMaxBT * kLdV + 2 * kMaxBT + K);
}

__global__ void __launch_bounds__(kThreads, 2) dhu_kernel(Tok q, Tok k, Tok w, Tok dO, Tok dvl, Tok g, Tok gk,
                                                          Mat dht, Mat dh, Mat dh0, Tok dv2, Layout L, int K,
                                                          int V, int HV, int G, float scale) {
  extern __shared__ float smem[];
  float* X = smem;                      // [K][kLdV]
  float* Sl = X + K * kLdV;             // [64][kLd]
  float* D2 = Sl + kMaxBT * kLd;        // [64][kLdV]
  float* dOs = D2 + kMaxBT * kLdV;      // [64][kLdV]
  float* gl = dOs + kMaxBT * kLdV;      // [64]
  float* gkl = gl + kMaxBT;             // [K]
  float* eq = gkl + K;                  // [64] scale e^g per row (the Q tile's row scale)
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * kVT, vt = min(kVT, V - x0);
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  if (dht.p) load_state(X, kLdV, K, kVT, dht, sidx, K, V, 0, x0);
  else fill(X, K * kLdV, 0.0f);
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    const int64_t idx = (s.coff + ci) * HV + hv;
    __syncthreads();
    store_state(X, kLdV, dh, idx, K, V, x0, vt);
    load_tile(D2, kLdV, kMaxBT, kVT, dvl, s.b, t0, hv, len, x0, V);
    load_tile(dOs, kLdV, kMaxBT, kVT, dO, s.b, t0, hv, len, x0, V);
    if (threadIdx.x < kMaxBT) {
      const float gv = (g.p && threadIdx.x < len) ? g.ld(s.b, t0 + threadIdx.x, hv, 0) : 0.0f;
      gl[threadIdx.x] = gv;
      eq[threadIdx.x] = g.p ? scale * expf(gv) : scale;
    }
    if (gk.p)
      for (int y = threadIdx.x; y < K; y += blockDim.x) gkl[y] = gk.ld(s.b, t0 + len - 1, hv, y);
    // dv2 = dv + diag(e^{g_last - g}) K X.
    for (int y0 = 0; y0 < K; y0 += 64) {
      __syncthreads();
      load_tile(Sl, kLd, kMaxBT, 64, k, s.b, t0, hk, len, y0, K);
      __syncthreads();
      const float glast = gl[len - 1];
      mm(L.tc, len, vt, min(64, K - y0), Sl, kLd, 1, X + y0 * kLdV, kLdV, 1, [&](int m, int nn, float v) {
        D2[m * kLdV + nn] += (g.p ? expf(glast - gl[m]) : 1.0f) * v;
      });
    }
    __syncthreads();
    store_tile(D2, kLdV, len, vt, dv2, s.b, t0, hv, x0);
    // X = decay X + scale (diag(e^g) Q)^T dO - W^T dv2.
    if (g.p) {
      const float d = expf(gl[len - 1]);
      for (int e = threadIdx.x; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= d;
    } else if (gk.p) {
      for (int e = threadIdx.x; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= expf(gkl[e / kVT]);
    }
    for (int y0 = 0; y0 < K; y0 += 64) {
      __syncthreads();
      load_tile(Sl, kLd, kMaxBT, 64, q, s.b, t0, hk, len, y0, K, eq);
      __syncthreads();
      mm(L.tc, min(64, K - y0), vt, len, Sl, 1, kLd, dOs, kLdV, 1,
         [&](int m, int nn, float v) { X[(y0 + m) * kLdV + nn] += v; });
      __syncthreads();
      load_tile(Sl, kLd, kMaxBT, 64, w, s.b, t0, hv, len, y0, K);
      __syncthreads();
      mm(L.tc, min(64, K - y0), vt, len, Sl, 1, kLd, D2, kLdV, 1,
         [&](int m, int nn, float v) { X[(y0 + m) * kLdV + nn] -= v; });
    }
  }
  __syncthreads();
  if (dh0.p) store_state(X, kLdV, dh0, sidx, K, V, x0, vt);
}

// The same reverse recurrence with register-staged prefetch (16-bit q, k, w, dO, dv with K <= 128,
// 8-byte aligned quads): the previous chunk's K, dv, dO, g and gk_last load while this chunk's
// state update runs, this chunk's Q and W while dv2 = dv + K X runs. K, then Q, and W are staged
// whole ([64][K+5]) so that each product is one phase.
constexpr int kPfQ = 8;  // quads per thread of a 64 x 128 tile

size_t state_pf_smem(int K) {
  return sizeof(float) * (static_cast<size_t>(K) * kLdV + 2 * static_cast<size_t>(kMaxBT) * pad_ld(K) +
                          2 * kMaxBT * kLdV + 2 * kMaxBT + K);
}

template <int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas) dhu_pf_kernel(Tok q, Tok k, Tok w, Tok dO, Tok dvl, Tok g,
                                                           Tok gk, Mat dht, Mat dh, Mat dh0, Tok dv2,
                                                           Layout L, int K, int V, int HV, int G,
                                                           float scale) {
  extern __shared__ float smem[];
  const int ldS = pad_ld(K), qpr = K / 4, tid = threadIdx.x;
  float* X = smem;                      // [K][kLdV]
  float* S = X + K * kLdV;              // [64][K+5]: K, then Q (scaled) of the chunk
  float* S2 = S + kMaxBT * ldS;         // [64][K+5]: W
  float* D2 = S2 + kMaxBT * ldS;        // [64][kLdV]
  float* dOs = D2 + kMaxBT * kLdV;      // [64][kLdV]
  float* gl = dOs + kMaxBT * kLdV;      // [64]
  float* eq = gl + kMaxBT;              // [64] scale e^g per row
  float* gkl = eq + kMaxBT;             // [K]
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * kVT, vt = min(kVT, V - x0);
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  RegTile<kPfQ> rk, rq, rw;
  RegTile<2> rdv, rdo;
  float rg = 0.0f, rgk = 0.0f;
  auto len_of = [&](int64_t ci) { return static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT)); };
  auto fetch_k = [&](int64_t ci) {  // K, dv, dO, g, gk_last of chunk ci
    if (ci < 0) return;
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = len_of(ci);
    rk.fetch(k, s.b, t0, hk, len, 0, qpr, K);
    rdv.fetch(dvl, s.b, t0, hv, len, x0, kVT / 4, V);
    rdo.fetch(dO, s.b, t0, hv, len, x0, kVT / 4, V);
    rg = (g.p && tid < len) ? g.ld(s.b, t0 + tid, hv, 0) : 0.0f;
    rgk = (gk.p && tid < K) ? gk.ld(s.b, t0 + len - 1, hv, tid) : 0.0f;
  };
  auto fetch_qw = [&](int64_t ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = len_of(ci);
    rq.fetch(q, s.b, t0, hk, len, 0, qpr, K);
    rw.fetch(w, s.b, t0, hv, len, 0, qpr, K);
  };
  fetch_k(nch - 1);
  if (dht.p) load_state(X, kLdV, K, kVT, dht, sidx, K, V, 0, x0);
  else fill(X, K * kLdV, 0.0f);
  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = len_of(ci);
    const int64_t idx = (s.coff + ci) * HV + hv;
    __syncthreads();
    store_state(X, kLdV, dh, idx, K, V, x0, vt);
    rk.put(S, ldS, k.code, qpr);
    rdv.put(D2, kLdV, dvl.code, kVT / 4);
    rdo.put(dOs, kLdV, dO.code, kVT / 4);
    if (tid < kMaxBT) {
      gl[tid] = rg;
      eq[tid] = g.p ? scale * expf(rg) : scale;
    }
    if (gk.p && tid < K) gkl[tid] = rgk;
    __syncthreads();
    fetch_qw(ci);
    // dv2 = dv + diag(e^{g_last - g}) K X.
    const float glast = gl[len - 1];
    mm(L.tc, len, vt, K, S, ldS, 1, X, kLdV, 1, [&](int m, int nn, float v) {
      D2[m * kLdV + nn] += (g.p ? expf(glast - gl[m]) : 1.0f) * v;
    });
    __syncthreads();
    store_tile(D2, kLdV, len, vt, dv2, s.b, t0, hv, x0);
    // X = decay X + scale (diag(e^g) Q)^T dO - W^T dv2.
    if (g.p) {
      const float d = expf(gl[len - 1]);
      for (int e = tid; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= d;
    } else if (gk.p) {
      for (int e = tid; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= expf(gkl[e / kVT]);
    }
    rq.put(S, ldS, q.code, qpr, eq);
    rw.put(S2, ldS, w.code, qpr);
    __syncthreads();
    fetch_k(ci - 1);
    // The two products give every X element the same owning thread: += then -= in that order.
    mm(L.tc, K, vt, len, S, 1, ldS, dOs, kLdV, 1, [&](int m, int nn, float v) { X[m * kLdV + nn] += v; });
    mm(L.tc, K, vt, len, S2, 1, ldS, D2, kLdV, 1, [&](int m, int nn, float v) { X[m * kLdV + nn] -= v; });
  }
  __syncthreads();
  if (dh0.p) store_state(X, kLdV, dh0, sidx, K, V, x0, vt);
}

// chunk_gated_delta_rule_bwd_dhu on 16-bit tensor cores (K = V = 128, chunk 64, q, k, w, dout, dv
// and the dh snapshots all bf16 or all fp16, 16-byte aligned rows). CTA of NG groups of 4 warps per
// (sequence, value head, 32 NG-column V tile), the fp32 state-gradient tile X [128][32 NG] in
// registers (warp w: rows 32 (w % 4).., columns 32 (w / 4)..; fwd_h_mma_kernel's tiling and its
// choice of NG), the chunks in reverse. Per chunk:
//   X -> the dh snapshot and a 16-bit copy Xs;
//   dv2 = dv + diag(e^{g_last - g}) K Xs (warp w: token rows 16 (w % 4)..), kept negated as 16-bit D2n;
//   X = e^{g_last} X + Q^T (diag(scale e^g) dO) + W^T D2n (Q^T, W^T read by ldmatrix.trans); with
//   KDA's per-channel gate gk (and no g) the decay is diag(e^{gk_last}) and the Q, K rows arrive
//   already scaled.
// Loads in two cp.async groups per chunk in one set of buffers: K and dv (needed first), then Q,
// W and dO (needed after dv2), each issued as soon as the previous chunk has finished with its
// buffers, so that they arrive under the other group's products. Two CTAs per SM (NG = 1: 77 KiB,
// NG = 2: 97 KiB).
namespace dhu16 {
template <int NG>
struct Geo {
  static constexpr int kThreads = 128 * NG;
  static constexpr int kCols = 32 * NG;
  static constexpr int kLdX = kCols + 8;
  static constexpr size_t kSmem = 2 * (3 * static_cast<size_t>(mma16::kTok) + 2 * kMaxBT * kLdX +
                                       static_cast<size_t>(mma16::kD) * kLdX + kMaxBT * kLdX) +
                                  4 * (2 * kMaxBT + mma16::kD);
};
}  // namespace dhu16

// dv2 = dv + diag(e^{g_last - g}) K Xs for a warp's 16 token rows (16 wr..) and NJ 8-column blocks
// from wc, shared by both dhu mma kernels: stored to dv2 (rows < len), or with dv2_staged written
// in place over the dv tile Ds and copied out by 16-byte rows (the warp read only its own block of
// Ds), and kept negated as 16-bit D2n for the state update.
template <bool BF, int NJ, int kLdX>
__device__ __forceinline__ void dv2_rows(const uint16_t* Ks, const uint16_t* Xs, uint16_t* Ds, uint16_t* D2n,
                                         const float* gl, bool gated, float glast, int len, const Tok& dv2,
                                         bool dv2_staged, int64_t b, int64_t t0, int hv, int x0, int wr, int wc,
                                         int lane) {
  using namespace mma16;
  const int gq = lane >> 2, tq = lane & 3;
  float a[NJ][4];
  zero(a);
  mm_xs<BF, NJ>(a, Ks, kLdT, Xs, kLdX, 16 * wr, wc, 0, kD, lane);
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = 16 * wr + gq + 8 * hr, xc = wc + 8 * j + 2 * tq;
      const float f = (gated && r < len) ? exp_fast(glast - gl[r]) : 1.0f;
      const uint32_t dd = ld32(Ds + r * kLdX + xc);
      const float v0 = h2f<BF>(static_cast<uint16_t>(dd)) + f * a[j][2 * hr];
      const float v1 = h2f<BF>(static_cast<uint16_t>(dd >> 16)) + f * a[j][2 * hr + 1];
      if (dv2_staged) *reinterpret_cast<uint32_t*>(Ds + r * kLdX + xc) = pack2<BF>(v0, v1);
      else if (r < len) st2(dv2.p, dv2.code, dv2.off(b, t0 + r, hv) + x0 + xc, v0, v1);
      const uint32_t pk = static_cast<uint32_t>(f2h<BF>(-v0)) | (static_cast<uint32_t>(f2h<BF>(-v1)) << 16);
      *reinterpret_cast<uint32_t*>(D2n + r * kLdX + xc) = pk;
    }
  if (dv2_staged) {
    uint16_t* base = static_cast<uint16_t*>(dv2.p) + x0;
    warp_copy_rows16<16, NJ>(Ds, kLdX, 16 * wr, wc, [&](int r) { return base + dv2.off(b, t0 + r, hv); }, len, lane);
  }
}

template <bool BF, int NG>
__global__ void __launch_bounds__(dhu16::Geo<NG>::kThreads, 2) dhu_mma_kernel(Tok q, Tok k, Tok w, Tok dO, Tok dvl,
                                                                               Tok g, Tok gk, Mat dht, Mat dh,
                                                                               Mat dh0, Tok dv2, Layout L, int HV,
                                                                               int G, float scale,
                                                                               bool dv2_staged) {
  using namespace mma16;
  using Geo = dhu16::Geo<NG>;
  constexpr int kLdX = Geo::kLdX, kCols = Geo::kCols;
  extern __shared__ float smem[];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Qs = Ks + kTok;
  uint16_t* Ws = Qs + kTok;
  uint16_t* Ds = Ws + kTok;      // dv tile [64][kLdX]
  uint16_t* Os = Ds + kMaxBT * kLdX;  // dO tile, scaled in place to diag(scale e^g) dO
  uint16_t* Xs = Os + kMaxBT * kLdX;  // [128][kLdX]
  uint16_t* D2n = Xs + kD * kLdX;     // -dv2 [64][kLdX]
  float* gl = reinterpret_cast<float*>(D2n + kMaxBT * kLdX);
  float* eq = gl + kMaxBT;
  float* gkl = eq + kMaxBT;  // [128]: gk of the chunk's last row
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * kCols;
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wr = warp & 3, wc = 32 * (warp >> 2);  // the warp's row block and first column
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  auto chunk_len = [&](int64_t ci) { return static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT)); };
  auto cols32 = [&](uint16_t* dst, const Tok& t, int64_t t0, int len) {  // columns x0..x0+kCols-1 of head hv
    const uint16_t* base = static_cast<const uint16_t*>(t.p);
    constexpr int kq = kCols / 8;
    for (int e = tid; e < kMaxBT * kq; e += blockDim.x) {
      const int r = e / kq, col = (e - r * kq) << 3;
      const bool ok = r < len;
      cp_async16(dst + r * kLdX + col, base + t.off(s.b, t0 + (ok ? r : 0), hv) + x0 + col, ok);
    }
  };
  auto issue_a = [&](int64_t ci) {  // K, dv of chunk ci
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    load_rows(Ks, kLdT, k, s.b, t0, hk, len, kD / 8);
    cols32(Ds, dvl, t0, len);
    cp_async_commit();
  };
  auto issue_b = [&](int64_t ci) {  // Q, W, dO of chunk ci
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    load_rows(Qs, kLdT, q, s.b, t0, hk, len, kD / 8);
    load_rows(Ws, kLdT, w, s.b, t0, hv, len, kD / 8);
    cols32(Os, dO, t0, len);
    cp_async_commit();
  };
  float x[2][4][4];
  load_state_frag(x, dht, sidx, x0);
  if (nch > 0) {
    issue_a(nch - 1);
    issue_b(nch - 1);
  }
  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    const int64_t idx = (s.coff + ci) * HV + hv;
    // X -> Xs and the dh snapshot (the previous chunk's readers of Xs passed two barriers since).
    store_state16<BF>(x, Xs, kLdX, dh.p, idx, x0);
    if (tid < kMaxBT) {
      const float gv = (g.p && tid < len) ? g.ld(s.b, t0 + tid, hv, 0) : 0.0f;
      gl[tid] = gv;
      eq[tid] = g.p ? scale * exp_fast(gv) : scale;
    }
    if (!g.p && gk.p && tid < kD) gkl[tid] = gk.ld(s.b, t0 + len - 1, hv, tid);
    cp_async_wait<1>();  // K, dv of this chunk (Q, W, dO may still be in flight)
    __syncthreads();
    const float glast = gl[len - 1];
    dv2_rows<BF, 4, kLdX>(Ks, Xs, Ds, D2n, gl, g.p != nullptr, glast, len, dv2, dv2_staged, s.b, t0, hv, x0, wr, wc,
                          lane);
    __syncthreads();  // K, dv free; D2n
    if (ci > 0) issue_a(ci - 1);
    if (ci > 0) cp_async_wait<1>();  // Q, W, dO of this chunk
    else cp_async_wait<0>();
    __syncthreads();
    for (int e = tid; e < kMaxBT * kCols; e += blockDim.x) {  // dO rows times scale e^g
      const int r = e / kCols, xc = e % kCols;
      Os[r * kLdX + xc] = f2h<BF>(eq[r] * h2f<BF>(Os[r * kLdX + xc]));
    }
    if (g.p) {
      const float d = exp_fast(glast);
      for_state_frag(x, [&](float& v, int, int) { v *= d; });
    } else if (gk.p) {
      for_state_frag(x, [&](float& v, int y, int) { v *= exp_fast(gkl[y]); });
    }
    __syncthreads();  // scaled dO
    state_tprod<BF>(x, Qs, Os, kLdX, lane);  // X += Q^T (diag(scale e^g) dO)
    state_tprod<BF>(x, Ws, D2n, kLdX, lane);  // X += W^T D2n
    __syncthreads();  // Q, W, dO free
    if (ci > 0) issue_b(ci - 1);
  }
  if (dh0.p) store_state_frag(x, dh0, sidx, x0);
}

// dhu_mma_kernel's narrow form with S sets of tile buffers (S = 2 or 3), for few (sequence, head)
// pairs, where the chain of chunk steps is the whole time (B = 1, T = 32768, H = 16: 64 CTAs on
// 132 SMs, 512 steps of ~4.5 us with one buffer set). Every tile of chunk ci - S + 1 is issued in
// one cp.async group while chunk ci runs, and the gates (g of every row, or gk of the last row)
// are loaded into registers one chunk ahead, so no global load waits on the chain. The scaling of
// dO runs under the same barrier as dv2, which leaves two barriers per chunk. One CTA per SM
// (S = 2: 139 KiB, S = 3: 199 KiB at 32 columns). NJ = 2: 16 columns per CTA, taken where 8 CTAs
// per state fit one per SM. The products, their order and the stores are dhu_mma_kernel's.
namespace dhu16 {
template <int S, int NJ = 4>
struct StagedGeo {
  static constexpr int kThreads = 128;
  static constexpr int kCols = 8 * NJ;
  static constexpr int kLdX = kCols + 8;
  static constexpr size_t kBuf = 3 * static_cast<size_t>(mma16::kTok) + 2 * kMaxBT * kLdX;  // K, Q, W, dv, dO
  static constexpr size_t kSmem =
      2 * (S * kBuf + static_cast<size_t>(mma16::kD) * kLdX + kMaxBT * kLdX) + 4 * (2 * kMaxBT + mma16::kD);
};
}  // namespace dhu16

template <bool BF, int S, int NJ = 4>
__global__ void __launch_bounds__(128, 1) dhu_mma_staged_kernel(Tok q, Tok k, Tok w, Tok dO, Tok dvl, Tok g, Tok gk,
                                                               Mat dht, Mat dh, Mat dh0, Tok dv2, Layout L, int HV,
                                                               int G, float scale, bool dv2_staged) {
  using namespace mma16;
  using Geo = dhu16::StagedGeo<S, NJ>;
  constexpr int kLdX = Geo::kLdX, kCols = Geo::kCols;
  extern __shared__ float smem[];
  uint16_t* buf = reinterpret_cast<uint16_t*>(smem);  // [S] x (K, Q, W, dv, dO)
  uint16_t* Xs = buf + S * Geo::kBuf;                  // [128][kLdX]
  uint16_t* D2n = Xs + kD * kLdX;                      // -dv2 [64][kLdX]
  float* gl = reinterpret_cast<float*>(D2n + kMaxBT * kLdX);
  float* eq = gl + kMaxBT;
  float* gkl = eq + kMaxBT;  // [128]: gk of the chunk's last row
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * kCols;
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wr = warp & 3, wc = 0;  // the warp's row block and first column
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  auto chunk_len = [&](int64_t ci) { return static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT)); };
  auto tiles = [&](int64_t ci) { return buf + static_cast<int>(static_cast<uint64_t>(ci) % S) * Geo::kBuf; };
  auto cols32 = [&](uint16_t* dst, const Tok& t, int64_t t0, int len) {  // columns x0..x0+kCols-1 of head hv
    const uint16_t* base = static_cast<const uint16_t*>(t.p);
    constexpr int kq = kCols / 8;
    for (int e = tid; e < kMaxBT * kq; e += blockDim.x) {
      const int r = e / kq, col = (e - r * kq) << 3;
      const bool ok = r < len;
      cp_async16(dst + r * kLdX + col, base + t.off(s.b, t0 + (ok ? r : 0), hv) + x0 + col, ok);
    }
  };
  auto issue = [&](int64_t ci) {  // every tile of chunk ci into buffer ci % S, one group
    uint16_t* Kb = tiles(ci);
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    load_rows(Kb, kLdT, k, s.b, t0, hk, len, kD / 8);
    load_rows(Kb + kTok, kLdT, q, s.b, t0, hk, len, kD / 8);
    load_rows(Kb + 2 * kTok, kLdT, w, s.b, t0, hv, len, kD / 8);
    cols32(Kb + 3 * kTok, dvl, t0, len);
    cols32(Kb + 3 * kTok + kMaxBT * kLdX, dO, t0, len);
    cp_async_commit();
  };
  // The gates of chunk cj: g at row tid (tid < 64), or gk of the last row at column tid.
  auto gate_g = [&](int64_t cj) {
    return (g.p && cj >= 0 && tid < chunk_len(cj)) ? g.ld(s.b, s.t0 + cj * L.BT + tid, hv, 0) : 0.0f;
  };
  auto gate_gk = [&](int64_t cj) {
    return (!g.p && gk.p && cj >= 0) ? gk.ld(s.b, s.t0 + cj * L.BT + chunk_len(cj) - 1, hv, tid) : 0.0f;
  };
  float x[2][NJ][4];
  load_state_frag(x, dht, sidx, x0);
  for (int j = 0; j < S - 1; ++j) {  // chunks nch-1 .. nch-S+1; a group per chunk, empty past the start
    if (nch - 1 - j >= 0) issue(nch - 1 - j);
    else cp_async_commit();
  }
  float gnext = tid < kMaxBT ? gate_g(nch - 1) : 0.0f;
  float gknext = gate_gk(nch - 1);
  for (int64_t ci = nch - 1; ci >= 0; --ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    const int64_t idx = (s.coff + ci) * HV + hv;
    uint16_t* Ks = tiles(ci);
    uint16_t* Qs = Ks + kTok;
    uint16_t* Ws = Ks + 2 * kTok;
    uint16_t* Ds = Ks + 3 * kTok;     // dv tile [64][kLdX]
    uint16_t* Os = Ds + kMaxBT * kLdX;  // dO tile, scaled in place to diag(scale e^g) dO
    // X -> Xs and the dh snapshot; gl, eq, gkl. The previous chunk's readers of all four are
    // behind its second barrier.
    store_state16<BF>(x, Xs, kLdX, dh.p, idx, x0);
    if (tid < kMaxBT) {
      gl[tid] = gnext;
      eq[tid] = g.p ? scale * exp_fast(gnext) : scale;
    }
    if (!g.p && gk.p) gkl[tid] = gknext;
    cp_async_wait<S - 2>();  // chunk ci's group; the S - 2 after it may still be in flight
    __syncthreads();         // chunk ci's tiles, Xs, gl, eq; every thread is past the previous chunk
    // Into the buffer of chunk ci + 1, whose readers (the previous chunk) are all done.
    if (ci - S + 1 >= 0) issue(ci - S + 1);
    else cp_async_commit();
    if (tid < kMaxBT) gnext = gate_g(ci - 1);
    gknext = gate_gk(ci - 1);
    const float glast = gl[len - 1];
    for (int e = tid; e < kMaxBT * kCols; e += blockDim.x) {  // dO rows times scale e^g
      const int r = e / kCols, xc = e % kCols;
      Os[r * kLdX + xc] = f2h<BF>(eq[r] * h2f<BF>(Os[r * kLdX + xc]));
    }
    dv2_rows<BF, NJ, kLdX>(Ks, Xs, Ds, D2n, gl, g.p != nullptr, glast, len, dv2, dv2_staged, s.b, t0, hv, x0, wr,
                           wc, lane);
    if (g.p) {
      const float d = exp_fast(glast);
      for_state_frag(x, [&](float& v, int, int) { v *= d; });
    } else if (gk.p) {
      for_state_frag(x, [&](float& v, int y, int) { v *= exp_fast(gkl[y]); });
    }
    __syncthreads();  // D2n, scaled dO
    state_tprod<BF>(x, Qs, Os, kLdX, lane);  // X += Q^T (diag(scale e^g) dO)
    state_tprod<BF>(x, Ws, D2n, kLdX, lane);  // X += W^T D2n
    // No barrier: the next chunk writes Xs, gl, eq, gkl before its first barrier, and every
    // reader of those here is behind the barrier above; D2n is written after that first barrier.
  }
  cp_async_wait<0>();
  if (dh0.p) store_state_frag(x, dh0, sidx, x0);
}

// The buffer sets of dhu's narrow form with `cols` columns per CTA: 2 when its CTAs fit one per
// SM, else 1 (dhu_mma_kernel; 32 columns only; the 16-column form always 2). 1 where the
// device's shared memory does not hold the staged form. On the H200 at B = 1, T = 32768, H = 16
// (32 columns): 2311 us with 1, 1993 us with 2, 2010 us with 3 (bench/notes/ARCHIVE.md, stop 33),
// so the 3-set form and its measurement knob FUSEDOPS_GDN_DHU_STAGES went.
int dhu_stages(const Context& ctx, int64_t states, int cols) {
  if (cols != 16 && !mma16::narrow_one_per_sm(ctx, states, cols)) return 1;
  return smem_optin("chunk_gated_delta_rule_bwd_dhu", ctx.device.index) >= dhu16::StagedGeo<2>::kSmem ? 2 : 1;
}

bool dhu_mma_ok(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  using namespace mma16;
  const DType dt = a.k.dtype();
  if (a.chunk_size != kMaxBT || a.k.size(3) != kD || a.dout.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, dhu16::Geo<2>::kSmem, "chunk_gated_delta_rule_bwd_dhu"))
    return false;
  for (const TensorView* t : {&a.q, &a.k, &a.w, &a.dout, &a.dv})
    if (!tok16_ok(*t, dt)) return false;
  if (!a.dh.defined() || !state16_ok(a.dh, dt) || !out2_ok(a.dv2)) return false;
  for (const TensorView* t : {&a.dht, &a.dh0})
    if (t->defined() && !t->is_contiguous()) return false;
  return true;
}

void bwd_dhu(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  const char* op = "chunk_gated_delta_rule_bwd_dhu";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), Hk = a.k.size(2), K = a.k.size(3);
  const int64_t HV = a.dout.size(2), V = a.dout.size(3);
  const Layout L = with_snapshots(layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, a.k.dtype()), a.dh);
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * HV == 0) return;
  if (dhu_mma_ok(ctx, a)) {
    const bool bf = a.k.dtype() == DType::kBFloat16;
    auto launch = [&](const char* name, auto kernel, unsigned threads, size_t smem, int cols) {
      trace_kernel(name);
      allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
      const dim3 grid(static_cast<unsigned>(N * HV), static_cast<unsigned>(V / cols));
      kernel<<<grid, threads, smem, stream_of(ctx)>>>(
          tok_of(a.q), tok_of(a.k), tok_of(a.w), tok_of(a.dout), tok_of(a.dv), tok_of(a.g), tok_of(a.gk),
          mat_of(a.dht), mat_of(a.dh), mat_of(a.dh0), tok_of(a.dv2), L, static_cast<int>(HV),
          static_cast<int>(HV / Hk), static_cast<float>(a.scale),
          mma16::staged_out_ok(a.dv2, a.dv2, a.k.dtype()));
    };
    using G1 = dhu16::Geo<1>;
    using G2 = dhu16::Geo<2>;
    using S2 = dhu16::StagedGeo<2>;
    using N2 = dhu16::StagedGeo<2, 2>;
    const bool wide = mma16::wide_state_tiles(ctx, N * HV);
    const bool n16 = !wide && mma16::narrow16_state_tiles(ctx, N * HV);
    const int stages = wide ? 1 : dhu_stages(ctx, N * HV, n16 ? 16 : 32);
    if (wide)
      launch("dhu_mma_kernel wide", bf ? dhu_mma_kernel<true, 2> : dhu_mma_kernel<false, 2>, G2::kThreads, G2::kSmem, G2::kCols);
    else if (n16 && stages == 2)
      launch("dhu_mma_staged_kernel narrow16", bf ? dhu_mma_staged_kernel<true, 2, 2> : dhu_mma_staged_kernel<false, 2, 2>, N2::kThreads, N2::kSmem,
             N2::kCols);
    else if (stages == 2)
      launch("dhu_mma_staged_kernel", bf ? dhu_mma_staged_kernel<true, 2> : dhu_mma_staged_kernel<false, 2>, S2::kThreads, S2::kSmem, S2::kCols);
    else
      launch("dhu_mma_kernel", bf ? dhu_mma_kernel<true, 1> : dhu_mma_kernel<false, 1>, G1::kThreads, G1::kSmem, G1::kCols);
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  const bool pf = L.tc && K <= 4 * kPfQ * kThreads / kMaxBT && K % 4 == 0 && V % 4 == 0 &&
                  quad_tok(a.q) && quad_tok(a.k) && quad_tok(a.w) && quad_tok(a.dout) && quad_tok(a.dv);
  const size_t smem = pf ? state_pf_smem(static_cast<int>(K)) : state_smem(static_cast<int>(K));
  // Two CTAs per SM cap the staged kernel at 128 registers (ptxas: 144 B of spills), one leaves it
  // room (215 registers); on the H200 two are faster (B=8 T=4096 H=16 K=V=128 bf16: 2.38 vs
  // 3.24 ms), so two it is (the knob FUSEDOPS_GDN_DHU_CTAS went).
  auto kernel = !pf ? dhu_kernel : dhu_pf_kernel<2>;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
  const dim3 grid(static_cast<unsigned>(N * HV), static_cast<unsigned>((V + kVT - 1) / kVT));
  FUSEDOPS_REQUIRE(grid.y <= 65535, kValue, op, "V too large: ", V);
  trace_kernel("dhu_kernel/dhu_pf_kernel");
  kernel<<<grid, kThreads, smem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.w), tok_of(a.dout), tok_of(a.dv), tok_of(a.g), tok_of(a.gk),
      mat_of(a.dht), mat_of(a.dh), mat_of(a.dh0), tok_of(a.dv2), L, static_cast<int>(K),
      static_cast<int>(V), static_cast<int>(HV), static_cast<int>(HV / Hk), static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// beta_sigmoid (backward).

__global__ void sigmoid_bwd_kernel(const void* x, int xc, int64_t rs, const void* dy, int dc, int64_t drs,
                                   void* dx, int oc, int64_t rows, int64_t D, float cm) {
  const int64_t n = rows * D;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / D, d = e - r * D;
    const float s = 1.0f / (1.0f + expf(-ldf(x, xc, r * rs + d)));
    stf(dx, oc, e, ldf(dy, dc, r * drs + d) * cm * s * (1.0f - s));
  }
}

void sigmoid_bwd(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  const char* op = "beta_sigmoid";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t D = a.x.size(-1), rows = a.x.rows(), n = rows * D;
  if (n == 0) return;
  trace_kernel("sigmoid_bwd_kernel");
  sigmoid_bwd_kernel<<<elem_blocks(n), kThreads, 0, stream_of(ctx)>>>(
      a.x.data(), code_of(a.x.dtype()), a.x.row_stride(), a.dy.data(), code_of(a.dy.dtype()),
      a.dy.row_stride(), a.dx.data(), code_of(a.dx.dtype()), rows, D, a.allow_neg_eigval ? 2.0f : 1.0f);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

bool sup_dhu(const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  return no_f64({&a.q, &a.k, &a.w, &a.dout, &a.dv, &a.g, &a.gk, &a.dht, &a.dh, &a.dh0, &a.dv2}) &&
         a.k.size(-1) <= 256;
}
bool sup_sigmoid(const BetaSigmoidBwdArgs& a) { return no_f64({&a.x, &a.dy, &a.dx}); }

}  // namespace

void register_bwd(Registry& r) {
  const BackendSpec s = spec();
  r.add<ChunkGatedDeltaRuleBwdDhuArgs>("chunk_gated_delta_rule_bwd_dhu", Direction::kBackward, s, sup_dhu,
                                       bwd_dhu);
  r.add<BetaSigmoidBwdArgs>("beta_sigmoid", Direction::kBackward, s, sup_sigmoid, sigmoid_bwd);
}

}  // namespace fusedops::la::sm80
