// The shared linear-attention sub-operators, CUDA backend cuda_sm80 (sm_80 and later): the
// forward-direction kernels both families (GDN, KDA) run. chunk_local_cumsum; the state recurrence
// chunk_gated_delta_rule_fwd_h (a CTA per sequence, value head and 32-column V tile looping over the
// chunks with the [K,32] state in shared memory; the staged form prefetches the next chunk's tiles
// into registers; the 16-bit tensor-core form keeps the state in registers), in both gate forms (g
// or gk); the top levels' fused state-and-output kernel (fwd_h then the family's output step, one
// CTA per sequence and value head; state_out_fused in la_cuda.h); the fused recurrent forward of
// both families (recurrent_fwd in la_cuda.h); beta_sigmoid. Math and storage dtypes as in
// linear_attention_ref.cpp.
#include <cmath>
#include <algorithm>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/linear_attention.h"
#include "src/cuda/check.cuh"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops::la::sm80 {
namespace {

// ---------------------------------------------------------------------------------------------
// chunk_local_cumsum: one thread per (chunk, channel), the running sum in double, the rows read
// eight at a time (all eight loads issued before the first add). On the H200, KDA's
// [8,4096,16,128] fp32 gate: one row at a time (latency-bound) 181 us; a CTA per 32 channels with
// every row of a thread loaded at once and a cross-warp scan 195 us; the same with 128 channels
// per CTA (64 doubles per thread, two CTAs per SM) 379 us. With few channels (GDN's scalar gate:
// H of them) the grid is one CTA per chunk with only H threads at work, and each thread's eight
// dependent round trips to memory were the time (17 us at [8,4096,16], 4% of warps active): there
// a thread loads all 64 rows of its chunk at once (kBatch = 64, taken when C <= 64).
template <int kBatch>
__global__ void __launch_bounds__(kThreads) cumsum_kernel(Tok g, Tok out, Layout L, int64_t C, int64_t S,
                                                          int reverse, double scale) {
  const int64_t ch = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (ch >= C) return;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int64_t h = ch / S, s = ch - h * S;
  const int n = c.len;
  double acc = 0.0;
  for (int i0 = 0; i0 < n; i0 += kBatch) {
    float x[kBatch];
    // Row i0 + j of the walk is row n - 1 - (i0 + j) of the chunk when reversed. Each row is
    // read before it is written (g and out may be the same tensor).
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = reverse ? n - 1 - (i0 + j) : i0 + j;
      x[j] = i0 + j < n ? g.ld(c.b, c.t0 + i, h, s) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (i0 + j >= n) break;
      const int i = reverse ? n - 1 - (i0 + j) : i0 + j;
      acc += x[j];
      out.st_(c.b, c.t0 + i, h, s, static_cast<float>(acc * scale));
    }
  }
}

void cumsum(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  const char* op = "chunk_local_cumsum";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.g.size(0), T = a.g.size(1), H = a.g.size(2), S = a.g.ndim() > 3 ? a.g.size(3) : 1;
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, a.chunk_indices, a.g.dtype());
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  const int64_t C = H * S;
  if (NT == 0 || C == 0) return;
  FUSEDOPS_REQUIRE((C + kThreads - 1) / kThreads <= 65535, kValue, op, "too many channels: ", C);
  const dim3 grid(static_cast<unsigned>(NT), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  if (C <= kMaxBT) {
    const int threads = static_cast<int>((C + 31) / 32 * 32);
    trace_kernel("cumsum_kernel");
    cumsum_kernel<kMaxBT><<<grid, threads, 0, stream_of(ctx)>>>(tok_of(a.g), tok_of(a.out), L, C, S,
                                                                a.reverse ? 1 : 0, a.scale);
  } else {
    trace_kernel("cumsum_kernel");
    cumsum_kernel<8><<<grid, kThreads, 0, stream_of(ctx)>>>(tok_of(a.g), tok_of(a.out), L, C, S,
                                                            a.reverse ? 1 : 0, a.scale);
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// chunk_gated_delta_rule_fwd_h: CTA per (sequence, value head, 32-column V tile). Shared memory:
// X [K][37] (the state tile), Sl [64][69] (a 64-column slice of W or K), Vn [64][37], g [64],
// gk_last [K].

constexpr int kVT = 32;          // V tile of the state kernels
constexpr int kLdV = pad_ld(kVT);

size_t state_smem(int K) {
  return sizeof(float) * (static_cast<size_t>(K) * kLdV + kMaxBT * kLd + 2 * kMaxBT * kLdV + kMaxBT + K);
}

__global__ void __launch_bounds__(kThreads, 2) fwd_h_kernel(Tok k, Tok w, Tok u, Tok g, Tok gk, Mat h0, Mat h,
                                                         Tok vn, Mat ht, Layout L, int K, int V, int HV,
                                                         int G) {
  extern __shared__ float smem[];
  float* X = smem;                           // [K][kLdV]
  float* Sl = X + K * kLdV;                  // [64][kLd]
  float* Vn = Sl + kMaxBT * kLd;             // [64][kLdV]
  float* gl = Vn + 2 * kMaxBT * kLdV;        // [64] (one spare Vn-sized block unused)
  float* gkl = gl + kMaxBT;                  // [K]
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * kVT, vt = min(kVT, V - x0);
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  if (h0.p) load_state(X, kLdV, K, kVT, h0, sidx, K, V, 0, x0);
  else fill(X, K * kLdV, 0.0f);
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    const int64_t idx = (s.coff + ci) * HV + hv;
    __syncthreads();
    store_state(X, kLdV, h, idx, K, V, x0, vt);
    load_tile(Vn, kLdV, kMaxBT, kVT, u, s.b, t0, hv, len, x0, V);
    if (threadIdx.x < kMaxBT) gl[threadIdx.x] = (g.p && threadIdx.x < len) ? g.ld(s.b, t0 + threadIdx.x, hv, 0) : 0.0f;
    if (gk.p)
      for (int y = threadIdx.x; y < K; y += blockDim.x) gkl[y] = gk.ld(s.b, t0 + len - 1, hv, y);
    // Vn = U - W X.
    for (int y0 = 0; y0 < K; y0 += 64) {
      __syncthreads();
      load_tile(Sl, kLd, kMaxBT, 64, w, s.b, t0, hv, len, y0, K);
      __syncthreads();
      mm(L.tc, len, vt, min(64, K - y0), Sl, kLd, 1, X + y0 * kLdV, kLdV, 1,
         [&](int m, int nn, float v) { Vn[m * kLdV + nn] -= v; });
    }
    __syncthreads();
    if (vn.p) store_tile(Vn, kLdV, len, vt, vn, s.b, t0, hv, x0);
    __syncthreads();
    // Gates: Vg = diag(e^{g_last - g}) Vn, X *= e^{g_last}; or X[y,:] *= e^{gk_last,y}.
    if (g.p) {
      const float glast = gl[len - 1];
      for (int e = threadIdx.x; e < len * kVT; e += blockDim.x) {
        const int i = e / kVT, cc = e % kVT;
        if (cc < vt) Vn[i * kLdV + cc] *= expf(glast - gl[i]);
      }
      const float d = expf(glast);
      for (int e = threadIdx.x; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= d;
    } else if (gk.p) {
      for (int e = threadIdx.x; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= expf(gkl[e / kVT]);
    }
    // X += K^T Vg.
    for (int y0 = 0; y0 < K; y0 += 64) {
      __syncthreads();
      load_tile(Sl, kLd, kMaxBT, 64, k, s.b, t0, hk, len, y0, K);
      __syncthreads();
      mm(L.tc, min(64, K - y0), vt, len, Sl, 1, kLd, Vn, kLdV, 1,
         [&](int m, int nn, float v) { X[(y0 + m) * kLdV + nn] += v; });
    }
  }
  __syncthreads();
  if (ht.p) store_state(X, kLdV, ht, sidx, K, V, x0, vt);
}

// The same recurrence with the next chunk's W, U (and g, gk_last) and K staged in registers while
// this chunk's products run (RegTile: 16-bit k, w, u with K <= 128 and 8-byte aligned quads), and
// W and K staged whole ([64][K+5]) so that each product is one phase (W X summed over all of K at
// once instead of in two 64-row halves: the same operations up to that grouping).
constexpr int kPfQ = 8;  // quads per thread of a 64 x 128 tile

size_t state_pf_smem(int K) {
  return sizeof(float) * (static_cast<size_t>(K) * kLdV + static_cast<size_t>(kMaxBT) * pad_ld(K) +
                          kMaxBT * kLdV + kMaxBT + K);
}

__global__ void __launch_bounds__(kThreads, 2) fwd_h_pf_kernel(Tok k, Tok w, Tok u, Tok g, Tok gk, Mat h0,
                                                             Mat h, Tok vn, Mat ht, Layout L, int K, int V,
                                                             int HV, int G) {
  extern __shared__ float smem[];
  const int ldS = pad_ld(K), qpr = K / 4;
  float* X = smem;                        // [K][kLdV]
  float* S = X + K * kLdV;                // [64][K+5]: W, then K, of the chunk
  float* Vn = S + kMaxBT * ldS;           // [64][kLdV]
  float* gl = Vn + kMaxBT * kLdV;         // [64]
  float* gkl = gl + kMaxBT;               // [K]
  const int tid = threadIdx.x;
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * kVT, vt = min(kVT, V - x0);
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  RegTile<kPfQ> rw, rk;
  RegTile<2> ru;
  float rg = 0.0f, rgk = 0.0f;
  auto len_of = [&](int64_t ci) { return static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT)); };
  auto fetch_wu = [&](int64_t ci) {
    if (ci >= nch) return;
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = len_of(ci);
    rw.fetch(w, s.b, t0, hv, len, 0, qpr, K);
    ru.fetch(u, s.b, t0, hv, len, x0, kVT / 4, V);
    rg = (g.p && tid < len) ? g.ld(s.b, t0 + tid, hv, 0) : 0.0f;
    rgk = (gk.p && tid < K) ? gk.ld(s.b, t0 + len - 1, hv, tid) : 0.0f;
  };
  auto fetch_k = [&](int64_t ci) {
    if (ci >= nch) return;
    rk.fetch(k, s.b, s.t0 + ci * L.BT, hk, len_of(ci), 0, qpr, K);
  };
  fetch_wu(0);
  fetch_k(0);
  if (h0.p) load_state(X, kLdV, K, kVT, h0, sidx, K, V, 0, x0);
  else fill(X, K * kLdV, 0.0f);
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = len_of(ci);
    const int64_t idx = (s.coff + ci) * HV + hv;
    __syncthreads();
    store_state(X, kLdV, h, idx, K, V, x0, vt);
    rw.put(S, ldS, w.code, qpr);
    ru.put(Vn, kLdV, u.code, kVT / 4);
    if (tid < kMaxBT) gl[tid] = rg;
    if (gk.p && tid < K) gkl[tid] = rgk;
    __syncthreads();
    fetch_wu(ci + 1);
    // Vn = U - W X.
    mm(L.tc, len, vt, K, S, ldS, 1, X, kLdV, 1, [&](int m, int nn, float v) { Vn[m * kLdV + nn] -= v; });
    __syncthreads();
    if (vn.p) {
      store_tile(Vn, kLdV, len, vt, vn, s.b, t0, hv, x0);
      __syncthreads();
    }
    if (g.p) {
      const float glast = gl[len - 1];
      for (int e = tid; e < len * kVT; e += blockDim.x) {
        const int i = e / kVT, cc = e % kVT;
        if (cc < vt) Vn[i * kLdV + cc] *= expf(glast - gl[i]);
      }
      const float d = expf(glast);
      for (int e = tid; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= d;
    } else if (gk.p) {
      for (int e = tid; e < K * kVT; e += blockDim.x) X[(e / kVT) * kLdV + e % kVT] *= expf(gkl[e / kVT]);
    }
    rk.put(S, ldS, k.code, qpr);
    __syncthreads();
    fetch_k(ci + 1);
    // X += K^T Vg.
    mm(L.tc, K, vt, len, S, 1, ldS, Vn, kLdV, 1, [&](int m, int nn, float v) { X[m * kLdV + nn] += v; });
  }
  __syncthreads();
  if (ht.p) store_state(X, kLdV, ht, sidx, K, V, x0, vt);
}

// chunk_gated_delta_rule_fwd_h on 16-bit tensor cores (K = V = 128, chunk 64, k, w, u and the h
// snapshots all bf16 or all fp16, 16-byte aligned rows).
// CTA of NG groups of 4 warps per (sequence, value head, 32 NG-column V tile); the fp32 state tile
// X [128][32 NG] lives in registers (warp w: rows 32 (w % 4).. as two m16 tiles, columns
// 32 (w / 4)..). Per chunk:
//   X -> the h snapshot and a 16-bit copy Xs; Vn = U - W Xs (warp w: token rows 16 (w % 4)..);
//   v_new = Vn; Vg = diag(e^{g_last - g}) Vn (16-bit, over U in place: each entry is read and
//   rewritten by the same thread); X *= e^{g_last}, or with KDA's per-channel gate gk (and no g)
//   X = diag(e^{gk_last}) X with Vg = Vn (its K arrives already scaled); X += K^T Vg (K^T's
//   fragments read from K by ldmatrix.trans).
// The next chunk's K, W, U tiles load by cp.async into the other of two buffers while this chunk
// runs; two barriers per chunk (the next chunk's tiles issued after the first). Both forms take
// two CTAs per SM (NG = 1: 88 KiB, NG = 2: 105 KiB); NG = 2 shares each K, W tile between two V
// tiles and halves the CTAs, which fills the GPU in one wave where NG = 1 needs two (fwd_h picks
// NG = 2 when it still gives every SM a CTA).
//
// S > 2 stages: chunk ci + S - 1's tiles are issued while chunk ci runs, and each chunk's gate is
// loaded into a register one chunk ahead. One CTA per SM, so the narrow form takes S = 3 when its
// CTAs (4 per state) fit one per SM, and S = 2 otherwise. With few (sequence, head) pairs (B = 1, T
// = 32768: 64 CTAs on 132 SMs) a chunk step took 2.94 us with S = 2 and 2.55 us with S = 3 on the
// H200 (S = 4: 2.62 us; bench/notes/ARCHIVE.md, stop 33).
namespace fwdh {
template <int NG, int S = 2, int NJ = 4>
struct Geo {
  static constexpr int kThreads = 128 * NG;
  static constexpr int kCols = 8 * NJ * NG;    // V columns per CTA
  static constexpr int kLdX = kCols + 8;       // 16-bit [rows][kCols] tiles: conflict-free fragment reads
  static constexpr size_t kBuf = 2 * static_cast<size_t>(mma16::kTok) + kMaxBT * kLdX;  // K, W, U (elements)
  static constexpr size_t kSmem = 2 * (S * kBuf + static_cast<size_t>(mma16::kD) * kLdX) + 4 * (2 * kMaxBT + mma16::kD);
};
}  // namespace fwdh

template <bool BF, int NG, int S = 2, int NJ = 4>
__global__ void __launch_bounds__(fwdh::Geo<NG>::kThreads, S > 2 ? 1 : 2)
    fwd_h_mma_kernel(Tok k, Tok w, Tok u, Tok g, Tok gk, Mat h0, Mat h, Tok vn, Mat ht, Layout L, int HV, int G) {
  using namespace mma16;
  using Geo = fwdh::Geo<NG, S, NJ>;
  constexpr int kLdX = Geo::kLdX;
  extern __shared__ float smem[];
  uint16_t* buf = reinterpret_cast<uint16_t*>(smem);                     // [S] x (K, W, U)
  uint16_t* Xs = buf + S * Geo::kBuf;                                     // [128][kLdX]
  float* gls = reinterpret_cast<float*>(Xs + kD * kLdX);                   // [2][64]
  float* gkl = gls + 2 * kMaxBT;                                           // [128]: gk of the chunk's last row
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const int x0 = blockIdx.y * Geo::kCols;
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, wc = 8 * NJ * (warp >> 2);  // the warp's row block and first column
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  auto tiles = [&](int b) { return buf + b * Geo::kBuf; };
  auto issue = [&](int64_t ci) {  // K, W, U of chunk ci into buffer ci % S
    uint16_t* Kb = tiles(static_cast<int>(static_cast<uint64_t>(ci) % S));
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    load_rows(Kb, kLdT, k, s.b, t0, hk, len, kD / 8);
    load_rows(Kb + kTok, kLdT, w, s.b, t0, hv, len, kD / 8);
    const uint16_t* ub = static_cast<const uint16_t*>(u.p);
    uint16_t* Ub = Kb + 2 * kTok;
    constexpr int kq = Geo::kCols / 8;  // 16-byte pieces per U row
    for (int e = tid; e < kMaxBT * kq; e += blockDim.x) {
      const int r = e / kq, col = (e - r * kq) << 3;
      const bool ok = r < len;
      cp_async16(Ub + r * kLdX + col, ub + u.off(s.b, t0 + (ok ? r : 0), hv) + x0 + col, ok);
    }
    cp_async_commit();
  };
  // X from h0 (or 0): x[mt][j][e] = X(32 wr + 16 mt + gq + 8 (e / 2), wc + 8 j + 2 tq + e % 2).
  float x[2][NJ][4];
  load_state_frag(x, h0, sidx, x0);
  // The gate of chunk cj at row tid (S > 2: loaded one chunk ahead into gnext).
  auto gate_row = [&](int64_t cj) {
    const int lj = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - cj * L.BT));
    return (g.p && cj < nch && tid < lj) ? g.ld(s.b, s.t0 + cj * L.BT + tid, hv, 0) : 0.0f;
  };
  float gnext = 0.0f;
  if constexpr (S > 2) {
    for (int j = 0; j < S - 1; ++j) {  // chunks 0 .. S-2; a group per chunk, empty past the end
      if (j < nch) issue(j);
      else cp_async_commit();
    }
    if (tid < kMaxBT) gnext = gate_row(0);
  } else if (nch > 0) {
    issue(0);
  }
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int cur = static_cast<int>(static_cast<uint64_t>(ci) % S);
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    const int64_t idx = (s.coff + ci) * HV + hv;
    // No barrier here: the previous chunk's last readers of what this step writes (Xs: its first
    // product; gkl: its state decay) are behind its second barrier, and gl is double-buffered.
    float* gl = gls + (S == 2 ? cur : static_cast<int>(ci & 1)) * kMaxBT;
    if constexpr (S > 2) {
      if (tid < kMaxBT) gl[tid] = gnext;
    } else {
      if (tid < kMaxBT) gl[tid] = (g.p && tid < len) ? g.ld(s.b, t0 + tid, hv, 0) : 0.0f;
    }
    if (!g.p && gk.p && tid < kD) gkl[tid] = gk.ld(s.b, t0 + len - 1, hv, tid);
    store_state16<BF>(x, Xs, kLdX, h.p, idx, x0);  // X -> Xs and the h snapshot
    if constexpr (S > 2) {
      cp_async_wait<S - 2>();  // chunk ci's group; the S - 2 after it may still be in flight
      __syncthreads();         // this chunk's tiles, Xs, gl; every thread is past the previous chunk
      // Into buffer (ci - 1) % S, whose readers (the previous chunk) are all done.
      if (ci + S - 1 < nch) issue(ci + S - 1);
      else cp_async_commit();
      if (tid < kMaxBT) gnext = gate_row(ci + 1);
    } else {
      cp_async_wait<0>();
      __syncthreads();  // this chunk's tiles, Xs, gl; every thread is past the previous chunk
      if (ci + 1 < nch) issue(ci + 1);  // into the other buffer, whose readers are all done
    }
    const uint16_t* Ks = tiles(cur);
    const uint16_t* Ws = Ks + kTok;
    uint16_t* Us = tiles(cur) + 2 * kTok;  // U, then Vg in place
    const float glast = gl[len - 1];
    {  // Vn = U - W Xs for token rows 16 wr.., columns wc..
      float a[NJ][4];
      zero(a);
      mm_xs<BF, NJ>(a, Ws, kLdT, Xs, kLdX, 16 * wr, wc, 0, kD, lane);
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = 16 * wr + gq + 8 * hr, xc = wc + 8 * j + 2 * tq;
          const uint32_t uu = ld32(Us + r * kLdX + xc);
          const float v0 = h2f<BF>(static_cast<uint16_t>(uu)) - a[j][2 * hr];
          const float v1 = h2f<BF>(static_cast<uint16_t>(uu >> 16)) - a[j][2 * hr + 1];
          if (vn.p && r < len) st2(vn.p, vn.code, vn.off(s.b, t0 + r, hv) + x0 + xc, v0, v1);
          const float f = (g.p && r < len) ? exp_fast(glast - gl[r]) : 1.0f;
          const uint32_t pk = static_cast<uint32_t>(f2h<BF>(f * v0)) | (static_cast<uint32_t>(f2h<BF>(f * v1)) << 16);
          *reinterpret_cast<uint32_t*>(Us + r * kLdX + xc) = pk;
        }
    }
    // Decay the state.
    if (g.p) for_state_frag(x, [&](float& v, int, int) { v *= exp_fast(glast); });
    else if (gk.p) for_state_frag(x, [&](float& v, int y, int) { v *= exp_fast(gkl[y]); });
    __syncthreads();  // Vg
    // X += K^T Vg: A(m = y, k = token) = K[token][y] by ldmatrix.trans, B = Vg[token][x].
    state_tprod<BF>(x, Ks, Us, kLdX, lane);
  }
  if (ht.p) store_state_frag(x, ht, sidx, x0);
}

// The stage count of fwd_h_mma_kernel's narrow (one warp group) form with `cols` columns per CTA:
// 3 when its CTAs fit one per SM, else 2 (the measurement knob FUSEDOPS_GDN_FWDH_STAGES and its
// 4-stage form went: bench/notes/ARCHIVE.md, stop 33). 2 where the device's shared memory does
// not hold the staged form.
int fwdh_stages(const Context& ctx, int64_t states, int cols) {
  if (!mma16::narrow_one_per_sm(ctx, states, cols)) return 2;
  return smem_optin("chunk_gated_delta_rule_fwd_h", ctx.device.index) >= fwdh::Geo<1, 3>::kSmem ? 3 : 2;
}

bool fwd_h_mma_ok(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  using namespace mma16;
  const DType dt = a.k.dtype();
  if (a.chunk_size != kMaxBT || a.k.size(3) != kD || a.u.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, fwdh::Geo<2>::kSmem, "chunk_gated_delta_rule_fwd_h"))
    return false;
  if (!tok16_ok(a.k, dt) || !tok16_ok(a.w, dt) || !tok16_ok(a.u, dt) || !a.h.defined() || !state16_ok(a.h, dt))
    return false;
  if (a.v_new.defined() && !out2_ok(a.v_new)) return false;
  for (const TensorView* t : {&a.h0, &a.ht})
    if (t->defined() && !t->is_contiguous()) return false;
  return true;
}

void fwd_h(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  const char* op = "chunk_gated_delta_rule_fwd_h";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), Hk = a.k.size(2), K = a.k.size(3);
  const int64_t HV = a.u.size(2), V = a.u.size(3);
  const Layout L = with_snapshots(layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, a.k.dtype()), a.h);
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * HV == 0) return;
  if (fwd_h_mma_ok(ctx, a)) {
    const bool bf = a.k.dtype() == DType::kBFloat16;
    auto launch = [&](const char* name, auto kernel, unsigned threads, size_t smem, int cols) {
      trace_kernel(name);
      allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
      const dim3 grid(static_cast<unsigned>(N * HV), static_cast<unsigned>(V / cols));
      kernel<<<grid, threads, smem, stream_of(ctx)>>>(tok_of(a.k), tok_of(a.w), tok_of(a.u), tok_of(a.g),
                                                      tok_of(a.gk), mat_of(a.h0), mat_of(a.h), tok_of(a.v_new), mat_of(a.ht), L,
                                                      static_cast<int>(HV), static_cast<int>(HV / Hk));
    };
    using G1 = fwdh::Geo<1>;
    using G2 = fwdh::Geo<2>;
    const bool n16 = mma16::narrow16_state_tiles(ctx, N * HV);
    const int stages = fwdh_stages(ctx, N * HV, n16 ? 16 : 32);
    using N3 = fwdh::Geo<1, 3, 2>;
    using N2 = fwdh::Geo<1, 2, 2>;
    if (mma16::wide_state_tiles(ctx, N * HV))
      launch("fwd_h_mma_kernel wide", bf ? fwd_h_mma_kernel<true, 2> : fwd_h_mma_kernel<false, 2>, G2::kThreads, G2::kSmem, G2::kCols);
    else if (n16 && stages == 3)
      launch("fwd_h_mma_kernel narrow16 3-stage", bf ? fwd_h_mma_kernel<true, 1, 3, 2> : fwd_h_mma_kernel<false, 1, 3, 2>, N3::kThreads, N3::kSmem, N3::kCols);
    else if (n16)
      launch("fwd_h_mma_kernel narrow16", bf ? fwd_h_mma_kernel<true, 1, 2, 2> : fwd_h_mma_kernel<false, 1, 2, 2>, N2::kThreads, N2::kSmem, N2::kCols);
    else if (stages == 3)
      launch("fwd_h_mma_kernel 3-stage", bf ? fwd_h_mma_kernel<true, 1, 3> : fwd_h_mma_kernel<false, 1, 3>, fwdh::Geo<1, 3>::kThreads,
             fwdh::Geo<1, 3>::kSmem, fwdh::Geo<1, 3>::kCols);
    else
      launch("fwd_h_mma_kernel", bf ? fwd_h_mma_kernel<true, 1> : fwd_h_mma_kernel<false, 1>, G1::kThreads, G1::kSmem, G1::kCols);
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  const bool pf = L.tc && K <= 4 * kPfQ * kThreads / kMaxBT && K % 4 == 0 && V % 4 == 0 &&
                  quad_tok(a.k) && quad_tok(a.w) && quad_tok(a.u);
  const size_t smem = pf ? state_pf_smem(static_cast<int>(K)) : state_smem(static_cast<int>(K));
  auto kernel = pf ? fwd_h_pf_kernel : fwd_h_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
  const dim3 grid(static_cast<unsigned>(N * HV), static_cast<unsigned>((V + kVT - 1) / kVT));
  FUSEDOPS_REQUIRE(grid.y <= 65535, kValue, op, "V too large: ", V);
  trace_kernel("fwd_h_pf_kernel/fwd_h_kernel");
  kernel<<<grid, kThreads, smem, stream_of(ctx)>>>(tok_of(a.k), tok_of(a.w), tok_of(a.u), tok_of(a.g),
                                                   tok_of(a.gk), mat_of(a.h0), mat_of(a.h),
                                                   tok_of(a.v_new), mat_of(a.ht), L, static_cast<int>(K),
                                                   static_cast<int>(V), static_cast<int>(HV),
                                                   static_cast<int>(HV / Hk));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// The top level's state recurrence and output as one kernel (chunk_gated_delta_rule_fwd_h then
// chunk_fwd_o, fused; 16-bit tensor cores, K = V = 128, chunk 64, the scalar gate g or none). One
// CTA of 16 warps per (sequence, value head) holds the whole fp32 state X [128][128] in registers
// (for_state_frag's layout: warp w rows 32 (w % 4).., columns 32 (w / 4)..). Per chunk:
//   Xs = X in 16 bits (the h snapshot, when the caller keeps it);
//   Vn = U - W Xs and O = diag(e^g) Q Xs, sharing Xs's fragments (warp w: token rows 16 (w % 4)..,
//   columns 32 (w / 4)..); Vn stays in U's buffer (v_new when kept), Vg = diag(e^{g_last - g}) Vn
//   beside it;
//   P = M>= . Gamma . Q K^T (warp w: the 16x16 tile rows 16 (w % 4).., columns 16 (w / 4)..);
//   X = e^{g_last} X + K^T Vg;  O += P Vn;  o = scale O.
// Each value is rounded and accumulated as in fwd_h_mma_kernel followed by fwd_o_mma_kernel, so o
// is theirs; what the fusion saves is h and v_new's round trip through memory (at K = V = 128 in
// 16 bits, 2.5x the bytes of o per token and head). The next chunk's K, W, Q, U tiles load by
// cp.async into the other of two buffers; two barriers per chunk. 196.5 KiB: one CTA per SM,
// so the top level takes it when the (sequence, value head) pairs nearly fill the GPU
// (FUSEDOPS_GDN_FUSED_HO=1 or 0 forces the choice where the kernel applies: test-only).
namespace fwdho {
constexpr int kThreads = 512;
// KDA: Aqk's [64][64] tile rides in each buffer, Vn serves as Vg (its K arrives gated) and the gk
// row of the chunk's last token takes the gates' place.
template <bool KDA>
struct Geo {
  static constexpr size_t kBuf = 4 * static_cast<size_t>(mma16::kTok) +
                                 (KDA ? kMaxBT * static_cast<size_t>(mma16::kLdS) : 0);  // K, W, Q, U [, Aqk]
  static constexpr size_t kSmem =
      KDA ? 2 * (2 * kBuf + mma16::kSt) + 4 * mma16::kD
          : 2 * (2 * kBuf + mma16::kSt + mma16::kTok + kMaxBT * static_cast<size_t>(mma16::kLdS)) + 4 * 2 * kMaxBT;
};
}  // namespace fwdho

template <bool BF, bool KDA>
__global__ void __launch_bounds__(fwdho::kThreads, 1)
    fwd_ho_mma_kernel(Tok q, Tok k, Tok w, Tok u, Tok g, Tok gk, Tok aqk, Mat h0, Mat h, Tok vn, Mat ht, Tok o,
                      Layout L, int HV, int G, float scale, bool o_staged, bool vn_staged) {
  using namespace mma16;
  using Geo = fwdho::Geo<KDA>;
  extern __shared__ float smem[];
  uint16_t* buf = reinterpret_cast<uint16_t*>(smem);              // [2] x (K, W, Q, U [, Aqk])
  uint16_t* Xs = buf + 2 * Geo::kBuf;                              // [128][kLdT]
  uint16_t* Vg = Xs + kSt;                                         // GDN: [64][kLdT]
  uint16_t* Pg = Vg + kTok;                                        // GDN: [64][kLdS]
  // GDN: [2][64] gates; KDA: [128] gk of the chunk's last token.
  float* gls = reinterpret_cast<float*>(KDA ? Xs + kSt : Pg + kMaxBT * kLdS);
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const SeqPos s = seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int wr = warp & 3, wc = 32 * (warp >> 2), wp = 16 * (warp >> 2);  // row block, first column, P's
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  auto issue = [&](int64_t ci) {  // K, W, Q, U [, Aqk] of chunk ci into buffer ci % 2
    uint16_t* Kb = buf + (ci & 1) * Geo::kBuf;
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    load_rows(Kb, kLdT, k, s.b, t0, hk, len, kD / 8);
    load_rows(Kb + kTok, kLdT, w, s.b, t0, hv, len, kD / 8);
    load_rows(Kb + 2 * kTok, kLdT, q, s.b, t0, hk, len, kD / 8);
    load_rows(Kb + 3 * kTok, kLdT, u, s.b, t0, hv, len, kD / 8);
    if constexpr (KDA) load_rows(Kb + 4 * kTok, kLdS, aqk, s.b, t0, hv, len, kMaxBT / 8);
    cp_async_commit();
  };
  float x[2][4][4];
  load_state_frag(x, h0, sidx, 0);
  if (nch > 0) issue(0);
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int cur = static_cast<int>(ci & 1);
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    const int64_t idx = (s.coff + ci) * HV + hv;
    // No barrier here: the previous chunk's last readers of what this step writes (Xs: its
    // first products; the gates: two chunks ago, or KDA's gk row: before its state decay) are
    // behind the previous chunk's second barrier.
    float* gl = KDA ? gls : gls + cur * kMaxBT;
    if constexpr (KDA) {
      if (tid < kD) gl[tid] = gk.ld(s.b, t0 + len - 1, hv, tid);
    } else {
      if (tid < kMaxBT) gl[tid] = (g.p && tid < len) ? g.ld(s.b, t0 + tid, hv, 0) : 0.0f;
    }
    store_state16<BF>(x, Xs, kLdT, h.p, idx, 0);  // X -> Xs (and the h snapshot)
    cp_async_wait<0>();
    __syncthreads();  // this chunk's tiles, Xs, the gates; every thread is past the previous chunk
    // The next chunk's tiles into the other buffer, whose last readers (the previous chunk's
    // products) are all done now.
    if (ci + 1 < nch) issue(ci + 1);
    uint16_t* Kb = buf + cur * Geo::kBuf;
    const uint16_t* Ks = Kb;
    const uint16_t* Ws = Kb + kTok;
    const uint16_t* Qs = Kb + 2 * kTok;
    uint16_t* Us = Kb + 3 * kTok;  // U, then Vn in place
    const float glast = KDA ? 0.0f : gl[len - 1];
    const int r0 = 16 * wr + gq, r1 = r0 + 8;
    float oa[4][4];
    {  // Vn = U - W Xs; O = diag(e^g) Q Xs (GDN), scale Q Xs (KDA).
      float a[4][4];
      zero(a);
      zero(oa);
      mm_xs2<BF, 4>(a, oa, Ws, Qs, kLdT, Xs, kLdT, 16 * wr, wc, 0, kD, lane);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r1 : r0, xc = wc + 8 * j + 2 * tq;
          const uint32_t uu = ld32(Us + r * kLdT + xc);
          const float v0 = h2f<BF>(static_cast<uint16_t>(uu)) - a[j][2 * hr];
          const float v1 = h2f<BF>(static_cast<uint16_t>(uu >> 16)) - a[j][2 * hr + 1];
          if (vn.p && !vn_staged && r < len) st2(vn.p, vn.code, vn.off(s.b, t0 + r, hv) + xc, v0, v1);
          *reinterpret_cast<uint32_t*>(Us + r * kLdT + xc) = pack2<BF>(v0, v1);
          if constexpr (!KDA) {
            const float f = (g.p && r < len) ? exp_fast(glast - gl[r]) : 1.0f;
            *reinterpret_cast<uint32_t*>(Vg + r * kLdT + xc) = pack2<BF>(f * v0, f * v1);
          }
        }
      if constexpr (KDA) scale_rows(oa, scale, scale);
      else scale_rows(oa, exp_fast(gl[r0]), exp_fast(gl[r1]));
      // Staged: v_new from the warp's own block of Vn (in U's buffer) by 16-byte rows.
      if (vn.p && vn_staged) {
        uint16_t* base = static_cast<uint16_t*>(vn.p);
        warp_copy_rows16<16, 4>(Us, kLdT, 16 * wr, wc, [&](int r) { return base + vn.off(s.b, t0 + r, hv); }, len,
                                lane);
      }
    }
    const uint16_t* Ps = Pg;
    if constexpr (KDA) {  // Aqk with its upper triangle zeroed, as chunk_kda_fwd_o takes it
      uint16_t* A = Kb + 4 * kTok;
      for (int e = tid; e < kMaxBT * kMaxBT; e += blockDim.x) {
        const int i = e >> 6, j = e & 63;
        if (j > i) A[i * kLdS + j] = uint16_t{0};
      }
      Ps = A;
    } else {  // P, rounded to the input type
      float pa[2][4];
      zero(pa);
      if (wp <= 16 * wr) mm_xyt<BF, 2>(pa, Qs, kLdT, Ks, kLdT, 16 * wr, wp, kD, lane);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r1 : r0, col = wp + 8 * j + 2 * tq;
          const float p0 = (r < len && col <= r) ? pa[j][2 * hr] * exp_fast(gl[r] - gl[col]) : 0.0f;
          const float p1 = (r < len && col + 1 <= r) ? pa[j][2 * hr + 1] * exp_fast(gl[r] - gl[col + 1]) : 0.0f;
          *reinterpret_cast<uint32_t*>(Pg + r * kLdS + col) = pack2<BF>(p0, p1);
        }
    }
    if constexpr (KDA) for_state_frag(x, [&](float& v, int y, int) { v *= exp_fast(gl[y]); });
    else if (g.p) for_state_frag(x, [&](float& v, int, int) { v *= exp_fast(glast); });
    __syncthreads();  // Vn, Vg, P
    state_tprod<BF>(x, Ks, KDA ? Us : Vg, kLdT, lane);
    mm_xs<BF, 4>(oa, Ps, kLdS, Us, kLdT, 16 * wr, wc, 0, 16 * wr + 16, lane);
    const float os = KDA ? 1.0f : scale;
    if (o_staged) {
      // o (16-bit) through the warp's block of Qs: Q's last readers were before the barrier above.
      store_warp_rows16<BF, 4>(oa, os, Kb + 2 * kTok, kLdT, 16 * wr, wc, o, s.b, t0, hv, len, lane);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = wc + 8 * j + 2 * tq;
        if (r0 < len) st2(o.p, o.code, o.off(s.b, t0 + r0, hv) + col, os * oa[j][0], os * oa[j][1]);
        if (r1 < len) st2(o.p, o.code, o.off(s.b, t0 + r1, hv) + col, os * oa[j][2], os * oa[j][3]);
      }
    }
  }
  if (ht.p) store_state_frag(x, ht, sidx, 0);
}

// Whether the fused kernel takes these arguments (h and v_new, when defined, are written too): q
// is fwd_o's q (KDA: qg), aqk KDA's Aqk (undefined for GDN).
bool state_out_fused_ok(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q,
                        const TensorView& aqk, const TensorView& o, int64_t o_chunk) {
  using namespace mma16;
  const int force = env::force("FUSEDOPS_GDN_FUSED_HO");  // test-only forcing (docs/tuning.md)
  if (force == 0) return false;
  const bool kda = aqk.defined();
  const DType dt = a.k.dtype();
  if (a.chunk_size != kMaxBT || o_chunk != kMaxBT || a.k.size(3) != kD || a.u.size(3) != kD) return false;
  if (kda ? (a.g.defined() || !a.gk.defined() || aqk.size(3) != kMaxBT) : a.gk.defined()) return false;
  const size_t smem = kda ? fwdho::Geo<true>::kSmem : fwdho::Geo<false>::kSmem;
  if (!tc16_device_ok(ctx, dt, smem, "chunk_gated_delta_rule")) return false;
  if (!tok16_ok(a.k, dt) || !tok16_ok(a.w, dt) || !tok16_ok(a.u, dt) || !tok16_ok(q, dt) || !out2_ok(o))
    return false;
  if (kda && !tok16_ok(aqk, dt)) return false;
  if (a.h.defined() && !state16_ok(a.h, dt)) return false;
  if (a.v_new.defined() && !out2_ok(a.v_new)) return false;
  for (const TensorView* t : {&a.h0, &a.ht})
    if (t->defined() && !t->is_contiguous()) return false;
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : a.k.size(0);
  // One CTA per (sequence, value head) and per SM: fused when they fill at least 7/8 of the SMs
  // (fewer leave fwd_h's V tiles and fwd_o's chunk parallelism ahead).
  return force == 1 || N * a.u.size(2) * 8 >= sm_count("chunk_gated_delta_rule", ctx.device.index) * 7;
}

}  // namespace

bool state_out_fused(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q,
                     const TensorView& aqk, const TensorView& o, int64_t o_chunk, double scale) {
  if (!state_out_fused_ok(ctx, a, q, aqk, o, o_chunk)) return false;
  const char* op = aqk.defined() ? "chunk_kda" : "chunk_gated_delta_rule";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), Hk = a.k.size(2), HV = a.u.size(2);
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * HV == 0) return true;
  const Layout L = with_snapshots(layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, a.k.dtype()), a.h);
  // o leaves through shared memory by 16-byte row stores when it is 16-bit in q's dtype.
  const bool o_staged = mma16::staged_out_ok(o, o, a.k.dtype());
  auto run = [&](const char* name, auto kernel, size_t smem) {
    trace_kernel(name);
    allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, smem);
    kernel<<<static_cast<unsigned>(N * HV), fwdho::kThreads, smem, stream_of(ctx)>>>(
        tok_of(q), tok_of(a.k), tok_of(a.w), tok_of(a.u), tok_of(a.g), tok_of(a.gk), tok_of(aqk), mat_of(a.h0),
        mat_of(a.h), tok_of(a.v_new), mat_of(a.ht), tok_of(o), L, static_cast<int>(HV), static_cast<int>(HV / Hk),
        static_cast<float>(scale), o_staged,
        a.v_new.defined() && mma16::staged_out_ok(a.v_new, a.v_new, a.k.dtype()));
  };
  const bool bf = a.k.dtype() == DType::kBFloat16;
  if (aqk.defined()) run("fwd_ho_mma_kernel kda", bf ? fwd_ho_mma_kernel<true, true> : fwd_ho_mma_kernel<false, true>, fwdho::Geo<true>::kSmem);
  else run("fwd_ho_mma_kernel", bf ? fwd_ho_mma_kernel<true, false> : fwd_ho_mma_kernel<false, false>, fwdho::Geo<false>::kSmem);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return true;
}

namespace {

// ---------------------------------------------------------------------------------------------
// The fused recurrent forward of both families (fused_recurrent_gated_delta_rule,
// fused_recurrent_kda): CTA per (sequence, value head, 32-column V tile) with W warps (W = 4 for
// K <= 128, 8 for K <= 256). Lane l holds columns x0 + 4 (l & 7) .. + 3 of the state rows
// y = 4 w + (l >> 3) + 4 W i (i < 8) of warp w in registers: 32 values, loaded and stored as
// float4 when the state is float32 with V % 4 == 0 and 16-byte aligned (VEC; element by element
// otherwise). Per token, with the gate a = e^g:
//   GDN (a scalar per token and value head):  p = S^T k; delta = beta (v - a p); S = a S + k delta^T
//   KDA (a per key channel, KDA = true):      S = diag(a) S; p = S^T k; delta = beta (v - p);
//                                             S += k delta^T
// then o = scale S^T q; the sums over rows go through the lanes (xor 8, 16) and then the warps.
// A decoding step (T = 1) is a stream of state reads and writes: at 64 registers this layout keeps
// eight CTAs (K <= 128) of 16 KiB of state each per SM, against four of the former layout (a lane per
// column, 16 rows per thread, 256 threads). Alone on an H100 at B = 64, H = 16, K = V = 128, T = 1:
// GDN 56.0 us against 66.7, KDA 57.4 against 69.1; T = 16 (GDN) 170.9 against 333.2
// (bench/recurrent_decode_bench.cu, bench/results/h100/studies/recurrent_decode-h100.txt).
// Two forms by the tokens per sequence (DEC = one token each, as in decoding):
//   - DEC: the V tiles of one state are neighbours in the grid (x = V tile, then y/z = sequence and
//     head), and the state moves with plain loads and stores;
//   - otherwise: x = (sequence, head), y = V tile, and streaming (evict-first) loads and stores
//     (alone, the hints cost 2-4% at T = 1 and saved 7-8% at T = 16: the 'plain' rows of
//     bench/results/h100/studies/recurrent_decode-h100-cs.txt).
// In the library on an H100, in one process beside fla (bench/results/h100/studies/recurrent-forms-h100.txt):
// at [64, 1, 16, 128] the DEC form took 56.2-56.8 us (GDN) and 57.1-57.8 (KDA) against 58.8-60.2 and
// 59.8-60.7 with the other form (three runs); at T = 4 and 16 the other form was 3-8% faster for GDN
// and within 2% for KDA. Loading the next token's inputs a step ahead (in registers), tried for
// T > 1: 5% faster at T = 16 (GDN), slower at T = 1 and 4, with 40-56 bytes of spills at this
// layout's 64 registers (at 80 registers, six CTAs per SM: slower everywhere); not kept.
// A token's inputs (vin): each thread issues at most one 16-byte load (k, q, KDA's gate, the V tile,
// then beta and GDN's gate, by thread ranges), so the input stage waits for one load latency; the
// element loop before waited for three to five in turn (the dtype switch of ldf put each load in its
// own branch). Same results bitwise; on an H100 at [64, T, 16, 128] bf16 (one process, beside fla,
// bench/results/h100/studies/recurrent-inputs-h100.txt): T = 1 GDN 52.4 us against 55.6, KDA 52.0
// against 56.7 (fla 62.5, 54.3); T = 16 GDN 192.8 against 210.9, KDA 214.2 against 237.2 (fla 180.5,
// 209.6). Element by element when a row is not 16-byte aligned or K, V are not multiples of 16 bytes.
// After that measurement the thread ranges' three integer divisions per token (K / elements per 16
// bytes, in the SASS after the loop's first barrier) became shifts: then on another H100
// (bench/results/h100/studies/recurrent-shifts-h100.txt) T = 1 GDN 52.1 us, KDA 51.8 (fla 61.8,
// 53.8); T = 16 GDN 186.0, KDA 193.0 (fla 178.0, 210.1). Copying token t + 1's inputs into shared
// memory by cp.async while token t computes (two stages) was within 1% at T = 16 for GDN, slower
// at T = 1, and 4-24% slower for KDA (it spilled;
// bench/results/h100/studies/recurrent-prefetch-h100.txt): not kept. A CTA of one warp per 8-column
// tile with the row sums in the lanes only (no CTA barrier, as fla's kernel) was 40-81% slower at
// T = 4 and 16 and 58-72% at T = 1 (bench/results/h100/studies/recurrent-warp-h100.txt): not kept.

static_assert(kRecMaxK == 32 * 8, "eight warps of the recurrent forward hold kRecMaxK state rows");

template <int W, bool KDA, bool VEC, bool DEC>
__global__ void __launch_bounds__(32 * W, W == 4 ? 8 : 4)
    recurrent_fwd_kernel(Tok q, Tok k, Tok v, Tok g, Tok beta, Mat h0, Tok o, Mat ht, Layout L, int K, int V, int HV,
                         int G, float scale, unsigned NH, bool vin) {
  constexpr int KM = 32 * W, kR = 8;
  constexpr int kBeta = KDA ? 0 : 1;  // beta's slot in gb
  __shared__ float ks[KM], qs[KM], as[KDA ? KM : 1], gb[kBeta + 1];
  __shared__ __align__(16) float vs[32], red[W][32];
  // nh = n HV + hv; the DEC grid's last z slice may run past NH.
  const unsigned nh = DEC ? blockIdx.z * gridDim.y + blockIdx.y : blockIdx.x;
  if (DEC && nh >= NH) return;
  const unsigned vt = DEC ? blockIdx.x : blockIdx.y;  // the 32-column V tile
  const int64_t n = nh / HV;
  const int hv = static_cast<int>(nh % HV), hk = hv / G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c4 = lane & 7;
  const int y0 = 4 * warp + (lane >> 3);
  const int x = vt * 32 + 4 * c4;
  const SeqPos s = seq_pos(L, n);
  const int64_t base = (n * HV + hv) * K * V + x;  // element (y, x) of this sequence's state: base + y V
  float st[kR][4];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int y = y0 + 4 * W * i;
    const int64_t e = base + static_cast<int64_t>(y) * V;
    if constexpr (VEC) {
      if (h0.p && y < K && x < V) {
        const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(h0.p) + e);
        const float4 t = DEC ? *src : __ldcs(src);
        st[i][0] = t.x, st[i][1] = t.y, st[i][2] = t.z, st[i][3] = t.w;
      } else {
        st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) st[i][j] = (h0.p && y < K && x + j < V) ? ldf(h0.p, h0.code, e + j) : 0.0f;
    }
  }
  for (int64_t it = 0; it < s.len; ++it) {
    const int64_t t = s.t0 + it;
    __syncthreads();
    if (vin) {
      // The token's inputs in one 16-byte load per thread, all issued at once: threads [0, o1) k,
      // [o1, o2) q, [o2, o3) KDA's gate, [o3, o4) the V tile, then beta and GDN's gate (o4 + 2 <=
      // blockDim: at most 3 K / 4 + 10 threads, K <= 32 W).
      // Elements per 16 bytes: 4 (fp32) or 8, as shifts (no integer division in the token loop).
      const int sk = k.code == kF32 ? 2 : 3, sq = q.code == kF32 ? 2 : 3, sv = v.code == kF32 ? 2 : 3;
      const int sg = KDA ? (g.code == kF32 ? 2 : 3) : 0;
      const int ek = 1 << sk, eq = 1 << sq, ev = 1 << sv, eg = 1 << sg;
      const int o1 = K >> sk, o2 = o1 + (K >> sq), o3 = o2 + (KDA ? K >> sg : 0), o4 = o3 + (32 >> sv);
      const int r = threadIdx.x;
      if (r < o1) {
        ld16_to(k.p, k.code, k.off(s.b, t, hk) + r * ek, ks + r * ek, false);
      } else if (r < o2) {
        ld16_to(q.p, q.code, q.off(s.b, t, hk) + (r - o1) * eq, qs + (r - o1) * eq, false);
      } else if (r < o3) {
        if constexpr (KDA) ld16_to(g.p, g.code, g.off(s.b, t, hv) + (r - o2) * eg, as + (r - o2) * eg, true);
      } else if (r < o4) {
        const int c = (r - o3) * ev, xv = vt * 32 + c;
        if (xv < V) {
          ld16_to(v.p, v.code, v.off(s.b, t, hv) + xv, vs + c, false);
        } else {
          for (int j = 0; j < ev; ++j) vs[c + j] = 0.0f;
        }
      } else if (r == o4) {
        gb[kBeta] = beta.p ? beta.ld(s.b, t, hv, 0) : 1.0f;
      } else if (!KDA && r == o4 + 1) {
        gb[0] = g.p ? expf(g.ld(s.b, t, hv, 0)) : 1.0f;
      }
    } else {
      for (int e = threadIdx.x; e < K; e += blockDim.x) {
        ks[e] = k.ld(s.b, t, hk, e);
        qs[e] = q.ld(s.b, t, hk, e);
        if constexpr (KDA) as[e] = g.p ? expf(g.ld(s.b, t, hv, e)) : 1.0f;
      }
      if (threadIdx.x < 32) {
        const int xl = vt * 32 + lane;
        vs[lane] = xl < V ? v.ld(s.b, t, hv, xl) : 0.0f;
      }
      if (threadIdx.x == 0) {
        if constexpr (!KDA) gb[0] = g.p ? expf(g.ld(s.b, t, hv, 0)) : 1.0f;
        gb[kBeta] = beta.p ? beta.ld(s.b, t, hv, 0) : 1.0f;
      }
    }
    __syncthreads();
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int y = y0 + 4 * W * i;
      if (y < K) {
        if constexpr (KDA) {
          const float a = as[y];
#pragma unroll
          for (int j = 0; j < 4; ++j) st[i][j] *= a;
        }
        const float ky = ks[y];
#pragma unroll
        for (int j = 0; j < 4; ++j) p[j] = fmaf(st[i][j], ky, p[j]);
      }
    }
#pragma unroll
    for (int m = 8; m < 32; m <<= 1)
#pragma unroll
      for (int j = 0; j < 4; ++j) p[j] += __shfl_xor_sync(0xffffffffu, p[j], m);
    if (lane < 8) reinterpret_cast<float4*>(red[warp])[c4] = make_float4(p[0], p[1], p[2], p[3]);
    __syncthreads();
    const float decay = KDA ? 1.0f : gb[0], bt = gb[kBeta];
    float4 ps = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float4 r = reinterpret_cast<const float4*>(red[w])[c4];
      ps.x += r.x, ps.y += r.y, ps.z += r.z, ps.w += r.w;
    }
    const float4 vv = reinterpret_cast<const float4*>(vs)[c4];
    const float delta[4] = {bt * (vv.x - decay * ps.x), bt * (vv.y - decay * ps.y), bt * (vv.z - decay * ps.z),
                            bt * (vv.w - decay * ps.w)};
    float po[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int y = y0 + 4 * W * i;
      if (y < K) {
        const float ky = ks[y], qy = qs[y];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          st[i][j] = KDA ? fmaf(ky, delta[j], st[i][j]) : fmaf(decay, st[i][j], ky * delta[j]);
          po[j] = fmaf(st[i][j], qy, po[j]);
        }
      }
    }
#pragma unroll
    for (int m = 8; m < 32; m <<= 1)
#pragma unroll
      for (int j = 0; j < 4; ++j) po[j] += __shfl_xor_sync(0xffffffffu, po[j], m);
    __syncthreads();
    if (lane < 8) reinterpret_cast<float4*>(red[warp])[c4] = make_float4(po[0], po[1], po[2], po[3]);
    __syncthreads();
    const int xl = vt * 32 + lane;
    if (warp == 0 && xl < V) {
      float os = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) os += red[w][lane];
      o.st_(s.b, t, hv, xl, scale * os);
    }
  }
  if (!ht.p) return;
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const int y = y0 + 4 * W * i;
    const int64_t e = base + static_cast<int64_t>(y) * V;
    if (y >= K) continue;
    if constexpr (VEC) {
      if (x < V) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(ht.p) + e);
        const float4 r = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
        if constexpr (DEC) *dst = r; else __stcs(dst, r);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (x + j < V) stf(ht.p, ht.code, e + j, st[i][j]);
    }
  }
}

// Whether a token-major input [B,T,H,D] takes one 16-byte load per 16 bytes of a row: its rows
// 16-byte aligned (tok32_ok / tok16_ok) and D a multiple of the elements in 16 bytes.
bool vec_rows(const TensorView& t, int64_t D) {
  if (!t.defined() || t.numel() == 0) return false;
  const bool f32 = t.dtype() == DType::kFloat32;
  return D % (f32 ? 4 : 8) == 0 && (f32 ? mma16::tok32_ok(t) : mma16::tok16_ok(t, t.dtype()));
}

// Whether the state tensors take the float4 path: float32 (or absent), V % 4 == 0, 16-byte aligned.
bool vec_state(const Mat& h0, const Mat& ht, int64_t V) {
  auto ok = [](const Mat& m) { return !m.p || (m.code == kF32 && reinterpret_cast<uintptr_t>(m.p) % 16 == 0); };
  return V % 4 == 0 && ok(h0) && ok(ht);
}

template <int W, bool KDA>
auto recurrent_fwd_pick(bool vec, bool dec) {
  return vec ? (dec ? recurrent_fwd_kernel<W, KDA, true, true> : recurrent_fwd_kernel<W, KDA, true, false>)
             : (dec ? recurrent_fwd_kernel<W, KDA, false, true> : recurrent_fwd_kernel<W, KDA, false, false>);
}

}  // namespace

void recurrent_fwd(const Context& ctx, const LinearAttentionRecurrentFwdArgs& a, bool kda) {
  const char* op = kda ? "fused_recurrent_kda" : "fused_recurrent_gated_delta_rule";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  const Layout L = layout_of(B, T, 1, a.cu_seqlens, TensorView(), TensorView(), a.q.dtype());
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * HV == 0 || V == 0) return;
  // DEC: every sequence one token (a decoding step; q holds N tokens in all).
  const bool dec = B * T == N;
  const int64_t NH = N * HV, tiles = (V + 31) / 32, ny = std::min<int64_t>(NH, 65535);
  FUSEDOPS_REQUIRE(NH <= 0x7fffffff, kValue, op, "too many (sequence, value head) states: ", NH);
  FUSEDOPS_REQUIRE(dec || tiles <= 65535, kValue, op, "V too large: ", V);
  const dim3 grid = dec ? dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(ny), static_cast<unsigned>((NH + ny - 1) / ny))
                        : dim3(static_cast<unsigned>(NH), static_cast<unsigned>(tiles));
  const bool narrow = K <= 128;  // four warps hold 128 rows, eight 256 (kRecMaxK)
  const Mat h0 = mat_of(a.initial_state), ht = mat_of(a.final_state);
  const bool vec = vec_state(h0, ht, V);
  // KDA without a gate (no decay) is GDN without a gate: it runs GDN's kernel, whose 16-byte input
  // stage needs no gate (KDA's takes it only with a gate to load). On an H100 at [64, 16, 16, 128]
  // bf16: 174.1 us against 222.5 (bench/results/h100/studies/recurrent-kda-nogate-h100.txt).
  const bool per_channel = kda && a.g.defined();
  auto kernel = per_channel ? (narrow ? recurrent_fwd_pick<4, true>(vec, dec) : recurrent_fwd_pick<8, true>(vec, dec))
                            : (narrow ? recurrent_fwd_pick<4, false>(vec, dec) : recurrent_fwd_pick<8, false>(vec, dec));
  // The token's inputs in 16-byte loads: q, k, v (and KDA's gate) with 16-byte aligned rows.
  const bool vin = vec_rows(a.q, K) && vec_rows(a.k, K) && vec_rows(a.v, V) && (!per_channel || vec_rows(a.g, K));
  trace_kernel("recurrent_fwd_kernel");
  kernel<<<grid, narrow ? 128 : 256, 0, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.g), tok_of(a.beta), h0, tok_of(a.o), ht, L,
      static_cast<int>(K), static_cast<int>(V), static_cast<int>(HV), static_cast<int>(HV / H),
      static_cast<float>(a.scale), static_cast<unsigned>(NH), vin);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

bool recurrent_fwd_supported(const LinearAttentionRecurrentFwdArgs& a) {
  return la::no_float64(a) && a.q.size(-1) <= kRecMaxK;
}

namespace {

// ---------------------------------------------------------------------------------------------
// beta_sigmoid (forward): elementwise over [rows, D] with a row stride.

__global__ void sigmoid_fwd_kernel(const void* x, int xc, int64_t rs, void* y, int yc, int64_t rows,
                                   int64_t D, float cm) {
  const int64_t n = rows * D;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / D, d = e - r * D;
    stf(y, yc, e, cm / (1.0f + expf(-ldf(x, xc, r * rs + d))));
  }
}

void sigmoid_fwd(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  const char* op = "beta_sigmoid";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t D = a.x.size(-1), rows = a.x.rows(), n = rows * D;
  if (n == 0) return;
  trace_kernel("sigmoid_fwd_kernel");
  sigmoid_fwd_kernel<<<elem_blocks(n), kThreads, 0, stream_of(ctx)>>>(
      a.x.data(), code_of(a.x.dtype()), a.x.row_stride(), a.y.data(), code_of(a.y.dtype()), rows, D,
      a.allow_neg_eigval ? 2.0f : 1.0f);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// supports(): no float64 anywhere, K <= 256 (state tiles).

bool sup_cumsum(const ChunkLocalCumsumArgs& a) { return no_f64({&a.g, &a.out}); }
bool sup_fwd_h(const ChunkGatedDeltaRuleFwdHArgs& a) {
  return no_f64({&a.k, &a.w, &a.u, &a.g, &a.gk, &a.h0, &a.h, &a.v_new, &a.ht}) && a.k.size(-1) <= 256;
}
bool sup_sigmoid(const BetaSigmoidFwdArgs& a) { return no_f64({&a.x, &a.y}); }

}  // namespace

}  // namespace fusedops::la::sm80

namespace fusedops {

void register_linear_attention_cuda_sm80(Registry& r) {
  using namespace la::sm80;
  const BackendSpec s = spec();
  r.add<ChunkLocalCumsumArgs>("chunk_local_cumsum", Direction::kForward, s, sup_cumsum, cumsum);
  r.add<ChunkGatedDeltaRuleFwdHArgs>("chunk_gated_delta_rule_fwd_h", Direction::kForward, s, sup_fwd_h,
                                     fwd_h);
  r.add<BetaSigmoidFwdArgs>("beta_sigmoid", Direction::kForward, s, sup_sigmoid, sigmoid_fwd);
  la::sm80::register_bwd(r);
}

}  // namespace fusedops
