// Gated delta rule, CUDA backend cuda_sm90 (sm_90a only): the top-level backward's two state
// recurrences on Hopper's warpgroup products (wgmma, la_wgmma_sm90.cuh):
//   B1, the forward recurrence recomputed for the backward (chunk_gated_delta_rule_fwd_h: the h
//       snapshots and Vnew), and
//   B2 + B3, the chunk-local dv (chunk_bwd_dv_local, never stored) and the reverse recurrence of
//       the state gradient (chunk_gated_delta_rule_bwd_dhu: the dh snapshots, dv2 and dh0).
// Everything else of the backward is cuda_sm80's (compose_bwd with these two as its hooks; the
// sub-operator entry points stay cuda_sm80).
//
// Why (bench/notes/ARCHIVE.md, GPU stops 28-29): cuda_sm80's kernels for these steps (fwd_h_mma_kernel
// 308 µs, dhu_mma_kernel 428 µs at B=8 T=4096 H=16 K=V=128 bf16) read every B fragment once per
// warp through ldmatrix; the forward's wgmma kernel (fwd_ho_wg_kernel) does the recurrence and
// the output together in 237 µs.
//
// One kernel for both, state_wg_kernel<BF, DHU>: one CTA of four warpgroups per (sequence, value
// head), K = V = 128, chunk 64, GDN's scalar gate g (fp32) or none. The fp32 state X [128][128]
// (h, or dh) lives in the warpgroups' wgmma accumulators, warpgroup wg holding rows 64 (wg % 2)..,
// columns 64 (wg / 2)... Per chunk (tiles loaded by cp.async one chunk ahead into the other of two
// buffers; DHU walks the chunks in reverse):
//   Xs = X in 16 bits;                                                         barrier
//   the snapshot (h or dh) from Xs by 16-byte rows, under the first product;
//   every warpgroup, its 32 columns 32 wg.. of the chunk's [64][128] product:
//     forward: Vn = U - W Xs, Vg = diag(e^{g_last - g}) Vn (Vn in U's tile for the Vnew stores);
//     DHU:     acc = diag(e^{g_last - g}) K Xs, and P^T = scale (M<= . Gamma^T . K Q^T) (16-wide
//              column slices; in the input type, as chunk_bwd_dv_local rounds it);   barrier
//              acc += P^T dO (= dv2, into a staging tile for its stores), S = -dv2; Q's rows
//              scaled in place by scale e^g;
//   X = e^{g_last} X;                                                          barrier
//   forward: X += K^T Vg;  DHU: X += (diag(scale e^g) Q)^T dO + W^T S; Vnew / dv2 by 16-byte rows.
// Values are rounded where cuda_sm80's kernels round them (Xs, Vg / -dv2, P^T in the input type),
// except that dv_local's output is never rounded (it stays in the accumulator) and the scale
// e^g lands on Q's rows instead of dO's; the summation order inside a tensor-core product may
// differ too.
#include <climits>
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/cuda/check.cuh"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/gated_delta_rule/gdn_cuda.cuh"
#include "src/ops/linear_attention/la_wg_state_sm90.cuh"
#include "src/ops/linear_attention/la_wgmma_sm90.cuh"

namespace fusedops::gdn::sm90 {

using namespace la::sm90;  // the wgmma layer and the state kernels' pieces (la_wg*_sm90.cuh)
using la::sm90::kD;  // over mma16::kD (the same 128) where a function also uses namespace mma16

namespace {

using sm80::Layout;
using sm80::Mat;
using sm80::SeqPos;
using sm80::Tok;

constexpr int kStThreads = 512;
// Tiles per chunk buffer: forward K, W, U; DHU K, Q, W, dO. DHU also has dv2's staging tile and
// P^T [64][64].
template <bool DHU>
constexpr int kTiles = DHU ? 4 : 3;
constexpr uint32_t kPB = kBT * kBT * 2;
template <bool DHU>
constexpr size_t kStSmem = 1024 + 2 * kTiles<DHU> * static_cast<size_t>(kTileB) + kXsB + kTileB +
                           (DHU ? kTileB + kPB : 0) + 2 * kBT * sizeof(float);

// Arguments: the three or four token tiles (t0..t3: forward k, w, u; DHU k, q, w, dout), the
// gate, the state in (h0 / dht) and out (ht / dh0), the 16-bit snapshots (h / dh) and the
// chunk output (Vnew / dv2).
// This thread's two 16-byte units (rows lr, lr + 32 at columns lc..; those below len) of a
// swizzled [64][128] tile (offsets so0 / so1) to the token rows t0.. of t.
__device__ __forceinline__ void tile_rows_out(const Tok& t, const uint8_t* tile, uint32_t so0, uint32_t so1, int lr,
                                              int lc, int len, int64_t b, int64_t t0, int hv) {
  uint16_t* base = static_cast<uint16_t*>(t.p) + lc;
  if (lr < len) *reinterpret_cast<uint4*>(base + t.off(b, t0 + lr, hv)) = *reinterpret_cast<const uint4*>(tile + so0);
  if (lr + 32 < len)
    *reinterpret_cast<uint4*>(base + t.off(b, t0 + lr + 32, hv)) = *reinterpret_cast<const uint4*>(tile + so1);
}

// B1's epilogue of the first product on this thread's pairs of an m64n32 slice (columns cj..):
// Vn = U - acc into Vt and Vg = f Vn into Sg (f0 / f1 for token rows r0 / r1), U's packed pair at
// byte offset off (pair j, row half hr) given by u(off, j, hr).
template <bool BF, class UPair>
__device__ __forceinline__ void vn_vg(uint8_t* Vt, uint8_t* Sg, uint32_t tb0, uint32_t tb1, uint32_t cj, uint32_t gx,
                                      float f0, float f1, const float (&acc)[16], UPair&& u) {
  using sm80::mma16::pack2;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const uint32_t off = (hr ? tb1 : tb0) + ((cj + (j << 4)) ^ gx);
      const uint32_t uu = u(off, j, hr);
      const float f = hr ? f1 : f0;
      const float v0 = sm80::h2f<BF>(static_cast<uint16_t>(uu)) - acc[4 * j + 2 * hr];
      const float v1 = sm80::h2f<BF>(static_cast<uint16_t>(uu >> 16)) - acc[4 * j + 2 * hr + 1];
      *reinterpret_cast<uint32_t*>(Vt + off) = pack2<BF>(v0, v1);
      *reinterpret_cast<uint32_t*>(Sg + off) = pack2<BF>(f * v0, f * v1);
    }
}

template <bool BF, bool DHU>
__global__ void __launch_bounds__(kStThreads, 1)
    state_wg_kernel(Tok t0k, Tok t1, Tok t2, Tok t3, Tok g, Mat x_in, Mat snap, Tok vout, Mat x_out,
                    Layout L, int HV, int G, float scale) {
  using sm80::exp_fast;
  using sm80::mma16::pack2;
  constexpr int NTL = kTiles<DHU>;
  constexpr uint32_t kBufB = NTL * kTileB;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t sa = smem_addr(sm);  // 1024-aligned
  const uint32_t kLo = desc_lo(sa, 16), mLo = desc_lo(sa, 8192);
  constexpr uint32_t aXs = 2 * kBufB, aS = aXs + kXsB, aP = aS + 2 * kTileB;
  uint8_t* buf = sm;              // [2] x the chunk's tiles
  uint8_t* Xs = buf + 2 * kBufB;  // [128 (K)][128 (V)]
  uint8_t* Ss = Xs + kXsB;        // Vg (forward) or -dv2 (DHU), [64][128]
  uint8_t* D2 = Ss + kTileB;      // DHU: dv2 [64][128] for its stores
  uint8_t* Ps = D2 + kTileB;      // DHU: P^T [64][64]
  float* gls = reinterpret_cast<float*>(DHU ? Ps + kPB : D2);  // [2][64] gates
  // Tile slots in a buffer.
  constexpr int sK = 0, sQ = 1, sW = DHU ? 2 : 1, sU = 2, sO = 3;
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const SeqPos s = sm80::seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const WgThread th = wg_thread();  // this thread's state and token rows (la_wg_state_sm90.cuh)
  const int tid = th.tid, wg = th.wg, tq = th.tq, r0 = th.r0, r1 = th.r1;
  const uint32_t gx = th.gx;
  // The product's columns 32 wg..: block wg / 2 of the token tile, 16-byte chunks 4 (wg % 2) + j.
  const uint32_t tb0 = (wg >> 1) * (kTileB / 2) + r0 * 128 + 4 * tq, tb1 = tb0 + 8 * 128;
  const uint32_t cj = (wg & 1) * 64;
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  const int lr = tid >> 4, lc = (tid & 15) << 3;
  const uint32_t so0 = sw_off(kBT, lr, lc), so1 = sw_off(kBT, lr + 32, lc);
  const uint32_t xo = sw_off(kD, lr, lc);  // Xs rows lr + 32 i at xo + 32 i * 128
  TileSrc src[NTL];
  src[sK].init(t0k, s.b, s.t0, hk, lc);
  if constexpr (DHU) {
    src[sQ].init(t1, s.b, s.t0, hk, lc);
    src[sW].init(t2, s.b, s.t0, hv, lc);
    src[sO].init(t3, s.b, s.t0, hv, lc);
  } else {
    src[sW].init(t1, s.b, s.t0, hv, lc);
    src[sU].init(t2, s.b, s.t0, hv, lc);
  }
  const int64_t st[4] = {t0k.st, t1.st, t2.st, t3.st};
  const float* gsrc = g.p ? static_cast<const float*>(g.p) + g.off(s.b, s.t0 + (tid & (kBT - 1)), hv) : nullptr;
  auto chunk_len = [&](int64_t ci) { return static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT)); };
  auto issue = [&](int64_t ci, int slot) {
    uint8_t* b = buf + slot * kBufB;
    const int len = chunk_len(ci);
#pragma unroll
    for (int i = 0; i < NTL; ++i) src[i].load(b + i * kTileB, so0, so1, ci, lr, len, st[i]);
    if (tid < kBT) {
      const bool ok = gsrc && tid < len;
      cp_async4(gls + slot * kBT + tid, ok ? static_cast<const void*>(gsrc + ci * kBT * g.st) : src[sK].p0, ok);
    }
    sm80::cp_async_commit();
  };
  float x[32];
  load_state(x, x_in, sidx, th);
  if (nch > 0) issue(DHU ? nch - 1 : 0, 0);
  for (int64_t it = 0; it < nch; ++it) {
    const int64_t ci = DHU ? nch - 1 - it : it;
    const int cur = static_cast<int>(it & 1);
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    const int64_t idx = (s.coff + ci) * HV + hv;
    const float* gl = gls + cur * kBT;
    state_to_xs<BF>(Xs, x, th);
    sm80::cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();  // this chunk's tiles and gates, Xs; every thread is past the previous chunk
    uint8_t* Cb = buf + cur * kBufB;
    uint8_t* Vt = DHU ? D2 : Cb + sU * kTileB;  // Vn in U's tile (forward), dv2's staging tile (DHU)
    const uint32_t aC = cur * kBufB;
    const float glast = gl[len - 1];
    // Phase 1: acc = A Xs on the columns 32 wg.. (A = W forward, K for DHU); DHU also
    // pa = (K Q^T)'s columns 16 wg.. (P^T's rows are key tokens, its columns query tokens).
    float acc[16], pa[8];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_n32<BF, 0, 1>(acc, kmajor(kLo, aC + (DHU ? sK : sW) * kTileB, kk),
                          mnmajor(mLo, aXs + (wg >> 1) * (kXsB / 2) + cj + kk * 2048), kk > 0);
    if constexpr (DHU) {
#pragma unroll
      for (int i = 0; i < 8; ++i) pa[i] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        wgmma_n16<BF, 0, 0>(pa, kmajor(kLo, aC + sK * kTileB, kk), kmajor(kLo, aC + sQ * kTileB + 16 * wg * 128, kk),
                            kk > 0);
    }
    wg_commit();
    if (it + 1 < nch) issue(DHU ? ci - 1 : ci + 1, cur ^ 1);
    if (snap.p) {  // the h / dh snapshot, 16-byte rows from Xs
      uint16_t* dst = static_cast<uint16_t*>(snap.p) + idx * (kD * kD) + lc;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint4*>(dst + (lr + 32 * i) * kD) = *reinterpret_cast<const uint4*>(Xs + xo + 32 * i * 128);
    }
    wg_wait<0>();
    fence_regs(acc);
    const float f0 = (g.p && r0 < len) ? exp_fast(glast - gl[r0]) : 1.0f;
    const float f1 = (g.p && r1 < len) ? exp_fast(glast - gl[r1]) : 1.0f;
    if constexpr (DHU) {
      // chunk_bwd_dv_local's P^T: P^T[j][i] = scale (q_i . k_j) e^{g_i - g_j} for j <= i < len, in
      // the input type; then acc = f K Xs + P^T dO on this warpgroup's columns (= dv2).
      fence_regs(pa);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[4 * j] *= f0, acc[4 * j + 1] *= f0;
        acc[4 * j + 2] *= f1, acc[4 * j + 3] *= f1;
      }
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r1 : r0, col = 16 * wg + 8 * jj + 2 * tq;
          const float gr = gl[r];
          const float p0 = (col < len && col >= r) ? scale * pa[4 * jj + 2 * hr] * (g.p ? exp_fast(gl[col] - gr) : 1.0f) : 0.0f;
          const float p1 =
              (col + 1 < len && col + 1 >= r) ? scale * pa[4 * jj + 2 * hr + 1] * (g.p ? exp_fast(gl[col + 1] - gr) : 1.0f) : 0.0f;
          *reinterpret_cast<uint32_t*>(Ps + (r * 128 + 4 * tq + (((2 * wg + jj) << 4) ^ gx))) = pack2<BF>(p0, p1);
        }
      fence_async_smem();
      __syncthreads();  // P^T; every warpgroup's K Q^T is done (Q may be scaled now)
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kBT / 16; ++kk)
        wgmma_n32<BF, 0, 1>(acc, desc_make(kLo + ((aP + kk * 32) >> 4), kDescHi),
                            mnmajor(mLo, aC + sO * kTileB + (wg >> 1) * (kTileB / 2) + cj + kk * 2048), 1);
      wg_commit();
      // Q's rows times scale e^g in place (X += (diag(scale e^g) Q)^T dO below).
      uint8_t* Qt = Cb + sQ * kTileB;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = lr + 32 * hr;
        const float e = g.p ? scale * exp_fast(gl[r]) : scale;
        uint4 v = *reinterpret_cast<const uint4*>(Qt + (hr ? so1 : so0));
        uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          w[i] = pack2<BF>(e * sm80::h2f<BF>(static_cast<uint16_t>(w[i])), e * sm80::h2f<BF>(static_cast<uint16_t>(w[i] >> 16)));
        *reinterpret_cast<uint4*>(Qt + (hr ? so1 : so0)) = v;
      }
      wg_wait<0>();
      fence_regs(acc);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {  // dv2 = dvl + f K Xs; S = -dv2
          const uint32_t off = (hr ? tb1 : tb0) + ((cj + (j << 4)) ^ gx);
          const float v0 = acc[4 * j + 2 * hr], v1 = acc[4 * j + 2 * hr + 1];
          *reinterpret_cast<uint32_t*>(Vt + off) = pack2<BF>(v0, v1);
          *reinterpret_cast<uint32_t*>(Ss + off) = pack2<BF>(-v0, -v1);
        }
    } else {  // U in Vt's tile
      vn_vg<BF>(Vt, Ss, tb0, tb1, cj, gx, f0, f1, acc,
                [&](uint32_t off, int, int) { return *reinterpret_cast<const uint32_t*>(Vt + off); });
    }
    if (g.p) {
      const float f = exp_fast(glast);
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] *= f;
    }
    fence_async_smem();
    __syncthreads();  // S, the scaled Q, Vt
    // Phase 2 on this warpgroup's quadrant: X += K^T Vg (forward) or Q'^T dO + W^T S (DHU).
    wg_fence();
    if constexpr (DHU) {
#pragma unroll
      for (int kk = 0; kk < kBT / 16; ++kk)
        wgmma_n64<BF, 1, 1>(x, mnmajor(mLo, aC + sQ * kTileB + (wg & 1) * (kTileB / 2) + kk * 2048),
                            mnmajor(mLo, aC + sO * kTileB + (wg >> 1) * (kTileB / 2) + kk * 2048), 1);
    }
#pragma unroll
    for (int kk = 0; kk < kBT / 16; ++kk)
      wgmma_n64<BF, 1, 1>(x, mnmajor(mLo, aC + (DHU ? sW : sK) * kTileB + (wg & 1) * (kTileB / 2) + kk * 2048),
                          mnmajor(mLo, aS + (wg >> 1) * (kTileB / 2) + kk * 2048), 1);
    wg_commit();
    if (vout.p) tile_rows_out(vout, Vt, so0, so1, lr, lc, len, s.b, t0, hv);  // Vnew / dv2 from their tile
    wg_wait<0>();
    fence_regs(x);
  }
  if (x_out.p) store_state(x, x_out, sidx, th);
}

// B1 with recompute_w_u_fwd inside: per chunk, W =
// (A diag(beta e^g)) K and U = (A diag(beta)) V from the saved A (as wu_mma_kernel builds its Au /
// Aw), W into a tile for W Xs and out to memory (the later steps read it), U kept in registers;
// then the recurrence as in state_wg_kernel<BF, false>. Each thread builds its own 16-byte unit of
// Au / Aw from its own cp.async of A right after its wait, with the chunk's gates and betas loaded
// two chunks ahead (three slots), so no barrier is added for it; one barrier is added between the
// W / U products and W Xs.
constexpr uint32_t kWuBufB = 2 * kTileB + kPB;  // K, V, A [64][64]
constexpr size_t kWuSmem = 1024 + 2 * static_cast<size_t>(kWuBufB) + kXsB + 2 * kTileB + 2 * kPB + 3 * 2 * kBT * sizeof(float);

template <bool BF>
__global__ void __launch_bounds__(kStThreads, 1)
    state_wu_wg_kernel(Tok k, Tok v, Tok A, Tok beta, Tok g, Mat x_in, Mat snap, Tok vout, Tok wout, Mat x_out,
                       Layout L, int HV, int G) {
  using sm80::exp_fast;
  using sm80::mma16::pack2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t sa = smem_addr(sm);  // 1024-aligned
  const uint32_t kLo = desc_lo(sa, 16), mLo = desc_lo(sa, 8192);
  constexpr uint32_t aXs = 2 * kWuBufB, aS = aXs + kXsB, aWt = aS + kTileB, aAu = aWt + kTileB, aAw = aAu + kPB;
  uint8_t* Xs = sm + aXs;
  uint8_t* Ss = sm + aS;    // Vg
  uint8_t* Wt = sm + aWt;   // W [64][128]
  uint8_t* Au = sm + aAu;   // A diag(beta) [64][64]
  uint8_t* Aw = sm + aAw;   // A diag(beta e^g)
  float* gbs = reinterpret_cast<float*>(sm + aAw + kPB);  // [3] x (gates [64], betas [64])
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const SeqPos s = sm80::seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const WgThread th = wg_thread();
  const int tid = th.tid, wg = th.wg, tq = th.tq, r0 = th.r0, r1 = th.r1;
  const uint32_t gx = th.gx;
  const uint32_t tb0 = (wg >> 1) * (kTileB / 2) + r0 * 128 + 4 * tq, tb1 = tb0 + 8 * 128;
  const uint32_t cj = (wg & 1) * 64;
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  const int lr = tid >> 4, lc = (tid & 15) << 3;
  const uint32_t so0 = sw_off(kBT, lr, lc), so1 = sw_off(kBT, lr + 32, lc);
  const uint32_t xo = sw_off(kD, lr, lc);
  const int ar = tid >> 3, ac = (tid & 7) << 3;  // this thread's 16-byte unit of A: row ar, columns ac..
  const uint32_t ao = sw_off(kBT, ar, ac);
  TileSrc ks, vs;
  ks.init(k, s.b, s.t0, hk, lc);
  vs.init(v, s.b, s.t0, hv, lc);
  const uint16_t* ap0 = static_cast<const uint16_t*>(A.p) + A.off(s.b, s.t0, hv) + ac;
  // Threads 0..63 load the gates (fp32, by cp.async two chunks ahead), 64..127 the betas (any
  // dtype: a plain load two chunks ahead, kept in a register and stored one chunk later).
  const float* gsrc = (tid < kBT && g.p) ? static_cast<const float*>(g.p) + g.off(s.b, s.t0 + tid, hv) : nullptr;
  const bool bthread = tid >= kBT && tid < 2 * kBT;
  auto chunk_len = [&](int64_t ci) { return static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT)); };
  auto issue_tiles = [&](int64_t ci, int slot) {
    uint8_t* b = sm + slot * kWuBufB;
    const int len = chunk_len(ci);
    ks.load(b, so0, so1, ci, lr, len, k.st);
    vs.load(b + kTileB, so0, so1, ci, lr, len, v.st);
    const bool ok = ar < len;
    sm80::cp_async16(b + 2 * kTileB + ao, ok ? ap0 + (ci * kBT + ar) * A.st : ap0, ok);
  };
  auto issue_g = [&](int64_t ci, int slot3) {
    if (tid < kBT) {
      const bool ok = gsrc && tid < chunk_len(ci);
      cp_async4(gbs + slot3 * 2 * kBT + tid, ok ? static_cast<const void*>(gsrc + ci * kBT * g.st) : ks.p0, ok);
    }
  };
  auto load_beta = [&](int64_t ci) {
    const int r = tid - kBT;
    return r < chunk_len(ci) ? beta.ld(s.b, s.t0 + ci * kBT + r, hv, 0) : 0.0f;
  };
  float bpend = 0.0f;  // a beta thread's beta of chunk ci + 1 during chunk ci
  float x[32];
  load_state(x, x_in, sidx, th);
  if (nch > 0) {
    issue_g(0, 0);
    sm80::cp_async_commit();
    if (bthread) gbs[tid] = load_beta(0);
    sm80::cp_async_wait<0>();
    __syncthreads();  // chunk 0's gates and betas
    issue_tiles(0, 0);
    if (nch > 1) issue_g(1, 1);
    sm80::cp_async_commit();
    if (bthread && nch > 1) bpend = load_beta(1);
  }
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int cur = static_cast<int>(ci & 1);
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = chunk_len(ci);
    const int64_t idx = (s.coff + ci) * HV + hv;
    const float* gl = gbs + static_cast<int>(ci % 3) * 2 * kBT;  // visible since the previous chunk's barriers
    const float* bl = gl + kBT;
    uint8_t* Cb = sm + cur * kWuBufB;
    const uint32_t aC = cur * kWuBufB;
    state_to_xs<BF>(Xs, x, th);
    sm80::cp_async_wait<0>();  // this thread's units of chunk ci (and the gates of ci + 1)
    {  // this thread's units of Au, Aw (A's upper triangle read as zeros)
      uint4 a = *reinterpret_cast<const uint4*>(Cb + 2 * kTileB + ao);
      const uint32_t* aw32 = reinterpret_cast<const uint32_t*>(&a);
      uint4 pu, pw;
      uint32_t* pu32 = reinterpret_cast<uint32_t*>(&pu);
      uint32_t* pw32 = reinterpret_cast<uint32_t*>(&pw);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = ac + 2 * i;
        const float a0 = j <= ar ? sm80::h2f<BF>(static_cast<uint16_t>(aw32[i])) : 0.0f;
        const float a1 = j + 1 <= ar ? sm80::h2f<BF>(static_cast<uint16_t>(aw32[i] >> 16)) : 0.0f;
        const float b0 = bl[j], b1 = bl[j + 1];
        const float e0 = (g.p && j < len) ? b0 * exp_fast(gl[j]) : b0;
        const float e1 = (g.p && j + 1 < len) ? b1 * exp_fast(gl[j + 1]) : b1;
        pu32[i] = pack2<BF>(a0 * b0, a1 * b1);
        pw32[i] = pack2<BF>(a0 * e0, a1 * e1);
      }
      *reinterpret_cast<uint4*>(Au + ao) = pu;
      *reinterpret_cast<uint4*>(Aw + ao) = pw;
    }
    fence_async_smem();
    __syncthreads();  // this chunk's tiles, Au, Aw, Xs; every thread is past the previous chunk
    const float glast = gl[len - 1];
    float wa[16], ua[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) wa[i] = ua[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBT / 16; ++kk)
      wgmma_n32<BF, 0, 1>(wa, desc_make(kLo + ((aAw + kk * 32) >> 4), kDescHi),
                          mnmajor(mLo, aC + (wg >> 1) * (kTileB / 2) + cj + kk * 2048), kk > 0);
#pragma unroll
    for (int kk = 0; kk < kBT / 16; ++kk)
      wgmma_n32<BF, 0, 1>(ua, desc_make(kLo + ((aAu + kk * 32) >> 4), kDescHi),
                          mnmajor(mLo, aC + kTileB + (wg >> 1) * (kTileB / 2) + cj + kk * 2048), kk > 0);
    wg_commit();
    if (ci + 1 < nch) {
      issue_tiles(ci + 1, cur ^ 1);
      if (ci + 2 < nch) issue_g(ci + 2, static_cast<int>((ci + 2) % 3));
      sm80::cp_async_commit();
      if (bthread) {  // chunk ci + 1's beta into its slot (read from chunk ci + 1 on, after this chunk's barriers)
        gbs[static_cast<int>((ci + 1) % 3) * 2 * kBT + tid] = bpend;
        if (ci + 2 < nch) bpend = load_beta(ci + 2);
      }
    }
    if (snap.p) {
      uint16_t* dst = static_cast<uint16_t*>(snap.p) + idx * (kD * kD) + lc;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint4*>(dst + (lr + 32 * i) * kD) = *reinterpret_cast<const uint4*>(Xs + xo + 32 * i * 128);
    }
    wg_wait<0>();
    fence_regs(wa);
    fence_regs(ua);
    uint32_t up[8];  // U in the input type, as recompute_w_u_fwd stores it
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const uint32_t off = (hr ? tb1 : tb0) + ((cj + (j << 4)) ^ gx);
        *reinterpret_cast<uint32_t*>(Wt + off) = pack2<BF>(wa[4 * j + 2 * hr], wa[4 * j + 2 * hr + 1]);
        up[2 * j + hr] = pack2<BF>(ua[4 * j + 2 * hr], ua[4 * j + 2 * hr + 1]);
      }
    fence_async_smem();
    __syncthreads();  // W
    float acc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_n32<BF, 0, 1>(acc, kmajor(kLo, aWt, kk), mnmajor(mLo, aXs + (wg >> 1) * (kXsB / 2) + cj + kk * 2048),
                          kk > 0);
    wg_commit();
    if (wout.p) tile_rows_out(wout, Wt, so0, so1, lr, lc, len, s.b, t0, hv);  // W
    wg_wait<0>();
    fence_regs(acc);
    uint8_t* Vt = Cb + kTileB;  // Vn in V's tile (its readers, the U products, are done)
    {
      const float f0 = (g.p && r0 < len) ? exp_fast(glast - gl[r0]) : 1.0f;
      const float f1 = (g.p && r1 < len) ? exp_fast(glast - gl[r1]) : 1.0f;
      vn_vg<BF>(Vt, Ss, tb0, tb1, cj, gx, f0, f1, acc, [&](uint32_t, int j, int hr) { return up[2 * j + hr]; });
    }
    if (g.p) {
      const float f = exp_fast(glast);
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] *= f;
    }
    fence_async_smem();
    __syncthreads();  // Vg, Vn
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBT / 16; ++kk)
      wgmma_n64<BF, 1, 1>(x, mnmajor(mLo, aC + (wg & 1) * (kTileB / 2) + kk * 2048),
                          mnmajor(mLo, aS + (wg >> 1) * (kTileB / 2) + kk * 2048), 1);
    wg_commit();
    if (vout.p) tile_rows_out(vout, Vt, so0, so1, lr, lc, len, s.b, t0, hv);
    wg_wait<0>();
    fence_regs(x);
  }
  if (x_out.p) store_state(x, x_out, sidx, th);
}

template <bool DHU>
void launch(const Context& ctx, const char* op, DType dt, int64_t N, int64_t HV, int64_t Hk, const Layout& L,
            Tok a, Tok b, Tok c, Tok d, Tok g, Mat xin, Mat snap, Tok vout, Mat xout, float scale) {
  cuda::DeviceGuard guard(op, ctx.device.index);
  if (N * HV == 0) return;
  auto kernel = dt == DType::kBFloat16 ? state_wg_kernel<true, DHU> : state_wg_kernel<false, DHU>;
  sm80::allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kStSmem<DHU>);
  trace_kernel("state_wg_kernel");
  kernel<<<static_cast<unsigned>(N * HV), kStThreads, kStSmem<DHU>, sm80::stream_of(ctx)>>>(
      a, b, c, d, g, xin, snap, vout, xout, L, static_cast<int>(HV), static_cast<int>(HV / Hk), scale);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// compose_bwd's hook for B1: W and U from the saved A, then the forward recurrence (h, Vnew; ht
// when asked): state_wu_wg_kernel where it applies, else recompute_w_u_fwd and state_wg_kernel.
bool state_fwd(const Context& ctx, const RecomputeWUFwdArgs& wu, const ChunkGatedDeltaRuleFwdHArgs& a) {
  using namespace sm80::mma16;
  const DType dt = a.k.dtype();
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : a.k.size(0);
  if (!wg_state_ok(ctx, "FUSEDOPS_GDN_WG_STATE", dt, a.chunk_size, a.k.size(3), a.u.size(3), N * a.u.size(2),
                   kStSmem<false>) ||
      !scalar_gate_ok(a.g, a.gk))
    return false;
  if (!tok16_ok(a.k, dt) || !tok16_ok(a.w, dt) || !tok16_ok(a.u, dt)) return false;
  if ((a.h.defined() && !state16_ok(a.h, dt)) || (a.v_new.defined() && !tok16_ok(a.v_new, dt))) return false;
  if (!ends_ok(a.h0, a.ht)) return false;
  const int64_t B = a.k.size(0), T = a.k.size(1);
  const Layout L = sm80::with_snapshots(sm80::layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, dt), a.h);
  const bool fused = wu.A.defined() && wu.A.size(3) == kBT &&
                     tok16_ok(wu.A, dt) && tok16_ok(wu.v, dt) && wu.beta.defined() &&
                     wu.k.data() == a.k.data() && wu.w.data() == a.w.data() &&
                     sm80::smem_optin("chunk_gated_delta_rule", ctx.device.index) >= kWuSmem;
  if (!fused) {
    recompute_w_u_fwd(ctx, wu);
    launch<false>(ctx, "chunk_gated_delta_rule_fwd_h", dt, N, a.u.size(2), a.k.size(2), L, sm80::tok_of(a.k),
                  sm80::tok_of(a.w), sm80::tok_of(a.u), Tok(), sm80::tok_of(a.g), sm80::mat_of(a.h0),
                  sm80::mat_of(a.h), sm80::tok_of(a.v_new), sm80::mat_of(a.ht), 1.0f);
    return true;
  }
  const char* op = "chunk_gated_delta_rule_fwd_h";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t HV = a.u.size(2);
  if (N * HV == 0) return true;
  auto kernel = dt == DType::kBFloat16 ? state_wu_wg_kernel<true> : state_wu_wg_kernel<false>;
  sm80::allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kWuSmem);
  trace_kernel("state_wu_wg_kernel");
  kernel<<<static_cast<unsigned>(N * HV), kStThreads, kWuSmem, sm80::stream_of(ctx)>>>(
      sm80::tok_of(a.k), sm80::tok_of(wu.v), sm80::tok_of(wu.A), sm80::tok_of(wu.beta), sm80::tok_of(a.g),
      sm80::mat_of(a.h0), sm80::mat_of(a.h), sm80::tok_of(a.v_new), sm80::tok_of(a.w), sm80::mat_of(a.ht), L,
      static_cast<int>(HV), static_cast<int>(HV / a.k.size(2)));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return true;
}

// compose_bwd's hook for B2 + B3: chunk_bwd_dv_local's dvl and the state gradient's reverse
// recurrence (dh, dv2; dh0 when asked); a.dv is undefined (dvl never reaches memory).
bool state_dhu(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  using namespace sm80::mma16;
  const DType dt = a.k.dtype();
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : a.k.size(0);
  if (!wg_state_ok(ctx, "FUSEDOPS_GDN_WG_STATE", dt, a.chunk_size, a.k.size(3), a.dout.size(3),
                   N * a.dout.size(2), kStSmem<true>) ||
      !scalar_gate_ok(a.g, a.gk))
    return false;
  if (a.dv.defined()) return false;
  for (const TensorView* t : {&a.q, &a.k, &a.w, &a.dout})
    if (!tok16_ok(*t, dt)) return false;
  if ((a.dh.defined() && !state16_ok(a.dh, dt)) || (a.dv2.defined() && !tok16_ok(a.dv2, dt))) return false;
  if (!ends_ok(a.dht, a.dh0)) return false;
  const int64_t B = a.k.size(0), T = a.k.size(1);
  const Layout L = sm80::with_snapshots(sm80::layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, dt), a.dh);
  launch<true>(ctx, "chunk_gated_delta_rule_bwd_dhu", dt, N, a.dout.size(2), a.k.size(2), L, sm80::tok_of(a.k),
               sm80::tok_of(a.q), sm80::tok_of(a.w), sm80::tok_of(a.dout), sm80::tok_of(a.g),
               sm80::mat_of(a.dht), sm80::mat_of(a.dh), sm80::tok_of(a.dv2), sm80::mat_of(a.dh0),
               static_cast<float>(a.scale));
  return true;
}

}  // namespace

// The top-level backward of cuda_sm90: cuda_sm80's sub-operators with the two recurrences above
// and chunk_bwd_dqkwg on wgmma (gated_delta_rule_bwd_dqkwg_sm90.cu).
void top_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  // The sub-operators are cuda_sm80's.
  compose_bwd(with_backend(ctx, "cuda_sm80"), a, state_fwd, state_dhu, dqkwg_wg);
}

}  // namespace fusedops::gdn::sm90
