// The top levels' fused state-and-output kernel on Hopper's warpgroup products (wgmma,
// la_wgmma_sm90.cuh), cuda_sm90 (sm_90a only): the state recurrence chunk_gated_delta_rule_fwd_h
// then the family's output step (GDN: chunk_fwd_o; KDA: chunk_kda_fwd_o) as one kernel,
// fwd_ho_wg_kernel<BF, KDA>; both families' cuda_sm90 top levels take it through
// state_out_fused (la_cuda.h) and fall back to cuda_sm80's fused kernel where it does not apply.
//
// Why (bench/notes/ARCHIVE.md, GPU stops 20 and 26): cuda_sm80's fused kernel (fwd_ho_mma_kernel) spends
// its time on shared-memory traffic, not on the tensor cores (L1/shared pipe 64% busy, tensor pipe
// 23%): on mma.sync every warp of a 64-row product reads its B fragments itself. wgmma reads each
// operand once per warpgroup from shared memory, with no ldmatrix.
//
// One CTA of four warpgroups per (sequence, value head), K = V = 128, chunk 64, GDN's scalar gate g
// or none (KDA's per-channel form: at the kernel). The fp32 state X [128][128] lives in registers:
// warpgroup wg holds the quadrant rows 64 (wg % 2).., columns 64 (wg / 2)... Per chunk (tiles K, W, Q, U loaded by cp.async one chunk
// ahead into the other of two buffers):
//   Xs = X in 16 bits (and the h snapshot, when the caller keeps it);           barrier
//   warpgroups 0, 1: Vn = U - W Xs on columns 64 wg.. (Vn into U's tile, Vg = diag(e^{g_last - g})
//     Vn beside it); warpgroups 2, 3: O = diag(e^g) Q Xs on columns 64 (wg - 2)..;
//   every warpgroup: P = M>= . Gamma . Q K^T on P's columns 16 wg..;            barrier
//   all: X = e^{g_last} X + K^T Vg on their quadrant; warpgroups 2, 3: O += P Vn, o = scale O.
// Products per warpgroup and chunk: 64x64x128 + 64x16x128 + 64x64x64 multiply-adds, and 64x64x64
// more on 2, 3. Values are rounded where cuda_sm80's kernel rounds them (Xs, Vn, Vg, P in the
// input type), but the tensor cores' summation order inside a product may
// differ from mma.sync's, so o is not bitwise cuda_sm80's.
#include <climits>
#include <cmath>
#include <type_traits>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/linear_attention.h"
#include "src/cuda/check.cuh"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"
#include "src/ops/linear_attention/la_wg_state_sm90.cuh"
#include "src/ops/linear_attention/la_wgmma_sm90.cuh"

namespace fusedops::la::sm90 {
namespace {

using sm80::Layout;
using sm80::Mat;
using sm80::SeqPos;
using sm80::Tok;

constexpr int kHoThreads = 512;
constexpr uint32_t kBufB = 4 * kTileB;               // K, W, Q, U
constexpr uint32_t kPB = kBT * kBT * 2;              // P [64][64]
constexpr size_t kHoSmem = 1024 + 2 * kBufB + kXsB + kTileB + kPB + 2 * kD * sizeof(float);

// KDA (chunk_kda's state recurrence and chunk_kda_fwd_o, the gk form): the tiles K and Q hold kg
// and qg, g is the per-channel g_cumsum [B,T,HV,128] (fp32) and aqk the stored Aqk (scale in it).
// Then Vg is not used (kg carries e^{g_last - g}) and its tile holds P = M>= . Aqk, loaded with
// the chunk's tiles (two buffers); X = diag(e^{g_last}) X + kg^T Vn; O = scale qg Xs + P Vn; the
// gate buffer holds each chunk's last row of g (128 channels) instead of its 64 scalar gates.
template <bool BF, bool KDA>
__global__ void __launch_bounds__(kHoThreads, 1)
    fwd_ho_wg_kernel(Tok q, Tok k, Tok w, Tok u, Tok g, Mat h0, Mat h, Tok vn, Mat ht, Tok o, Layout L, int HV,
                     int G, float scale, bool o_staged, Tok aqk) {
  using sm80::exp_fast;
  using sm80::mma16::pack2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t sa = smem_addr(sm);  // 1024-aligned
  const uint32_t kLo = desc_lo(sa, 16), mLo = desc_lo(sa, 8192);
  // Byte offsets from sm of Xs, Vg, P (for the descriptors).
  constexpr uint32_t aXs = 2 * kBufB, aVg = aXs + kXsB, aP = aVg + kTileB;
  uint8_t* buf = sm;                 // [2] x (K, W, Q, U)
  uint8_t* Xs = buf + 2 * kBufB;     // [128 (K)][128 (V)]
  uint8_t* Vg = Xs + kXsB;           // [64][128]
  uint8_t* Ps = Vg + kTileB;         // [64][64]
  float* gls = reinterpret_cast<float*>(Ps + kPB);  // [2][64] gates (KDA: [2][128], a row of g)
  const int64_t n = blockIdx.x / HV;
  const int hv = static_cast<int>(blockIdx.x % HV), hk = hv / G;
  const SeqPos s = sm80::seq_pos(L, n);
  const int64_t sidx = n * HV + hv;
  const WgThread th = wg_thread();  // this thread's state and token rows (la_wg_state_sm90.cuh)
  const int tid = th.tid, wg = th.wg, wq = th.wq, lane = th.lane, tq = th.tq, r0 = th.r0, r1 = th.r1;
  const uint32_t gx = th.gx;
  const int64_t nch = (s.len + L.BT - 1) / L.BT;
  const int nb = wg & 1;  // the column block of Vn or O
  const uint32_t tb0 = nb * (kTileB / 2) + r0 * 128 + 4 * tq, tb1 = tb0 + 8 * 128;  // token-tile rows r0, r1
  const int lr = tid >> 4, lc = (tid & 15) << 3;
  const uint32_t so0 = sw_off(kBT, lr, lc), so1 = sw_off(kBT, lr + 32, lc);
  TileSrc ks, ws, qs, us;
  ks.init(k, s.b, s.t0, hk, lc);
  ws.init(w, s.b, s.t0, hv, lc);
  qs.init(q, s.b, s.t0, hk, lc);
  us.init(u, s.b, s.t0, hv, lc);
  const float* gsrc = g.p ? static_cast<const float*>(g.p) + g.off(s.b, s.t0 + (tid & (kBT - 1)), hv) : nullptr;
  const int pr = tid >> 3, pc = (tid & 7) << 3;  // KDA: this thread's 16-byte unit of P (row pr, columns pc..)
  const uint32_t po = pr * 128 + (((pc >> 3) ^ (pr & 7)) << 4);
  auto issue = [&](int64_t ci) {
    uint8_t* Kb = buf + (ci & 1) * kBufB;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    ks.load(Kb, so0, so1, ci, lr, len, k.st);
    ws.load(Kb + kTileB, so0, so1, ci, lr, len, w.st);
    qs.load(Kb + 2 * kTileB, so0, so1, ci, lr, len, q.st);
    us.load(Kb + 3 * kTileB, so0, so1, ci, lr, len, u.st);
    // The chunk's gates ride with its tiles (fp32; zeros past len or without a gate), so that no
    // global load sits between the chunks.
    if constexpr (KDA) {  // the last row of g, and Aqk's rows into P's buffer (rows >= len zero)
      if (tid < kD / 4)
        sm80::cp_async16(gls + (ci & 1) * kD + 4 * tid,
                         static_cast<const float*>(g.p) + g.off(s.b, s.t0 + ci * kBT + len - 1, hv) + 4 * tid, true);
      const bool ok = pr < len;
      const uint16_t* ap = static_cast<const uint16_t*>(aqk.p) + aqk.off(s.b, s.t0 + ci * kBT + (ok ? pr : 0), hv) + pc;
      sm80::cp_async16(Vg + (ci & 1) * kPB + po, ap, ok);
    } else if (tid < kBT) {
      const bool ok = gsrc && tid < len;
      cp_async4(gls + (ci & 1) * kBT + tid, ok ? static_cast<const void*>(gsrc + ci * kBT * g.st) : ks.p0, ok);
    }
    sm80::cp_async_commit();
  };
  float x[32];
  load_state(x, h0, sidx, th);
  if (nch > 0) issue(0);
  for (int64_t ci = 0; ci < nch; ++ci) {
    const int cur = static_cast<int>(ci & 1);
    const int64_t t0 = s.t0 + ci * L.BT;
    const int len = static_cast<int>(min(static_cast<int64_t>(L.BT), s.len - ci * L.BT));
    const int64_t idx = (s.coff + ci) * HV + hv;
    // No barrier first: the previous chunk's readers of Xs (its first products) are behind its
    // second barrier. The gates came with the tiles (their buffer's last readers: two chunks ago).
    const float* gl = gls + cur * (KDA ? kD : kBT);
    state_to_xs<BF>(Xs, x, th);
    if (h.p) {  // the h snapshot
      uint16_t* snap = static_cast<uint16_t*>(h.p) + idx * (kD * kD);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          *reinterpret_cast<uint32_t*>(snap + (th.xr + 8 * hr) * kD + th.xc + 8 * j) =
              pack2<BF>(x[4 * j + 2 * hr], x[4 * j + 2 * hr + 1]);
    }
    sm80::cp_async_wait<0>();
    if constexpr (KDA) {  // P = M>= . Aqk: this thread's unit, columns past its row to zero
      if (pc + 7 > pr) {
        uint16_t* pu = reinterpret_cast<uint16_t*>(Vg + cur * kPB + po);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (pc + e > pr) pu[e] = 0;
      }
    }
    fence_async_smem();
    __syncthreads();  // this chunk's tiles, Xs, the gates; every thread is past the previous chunk
    // The next chunk's tiles go into the other buffer (its last readers, the previous chunk's
    // products, are done); issued below once this chunk's first products are under way.
    uint8_t* Kb = buf + cur * kBufB;
    uint8_t* Qs = Kb + 2 * kTileB;
    uint8_t* Us = Kb + 3 * kTileB;  // U, then Vn in place
    // The same tiles as byte offsets from sm, for the descriptors.
    const uint32_t aK = cur * kBufB, aW = aK + kTileB, aQ = aK + 2 * kTileB, aU = aK + 3 * kTileB;
    const float glast = KDA ? 0.0f : gl[len - 1];
    // Phase 1, the same products on every warpgroup: acc = W Xs (0, 1: Vn's columns 64 wg..) or
    // Q Xs (2, 3: O's columns 64 (wg - 2)..), and P's columns 16 wg.. = Q K^T.
    float acc[32], pa[8];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) pa[i] = 0.0f;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_n64<BF, 0, 1>(acc, kmajor(kLo, wg < 2 ? aW : aQ, kk), mnmajor(mLo, aXs + nb * (kXsB / 2) + kk * 2048), kk > 0);
    wg_commit();
    if constexpr (!KDA) {
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        wgmma_n16<BF, 0, 0>(pa, kmajor(kLo, aQ, kk), kmajor(kLo, aK + 16 * wg * 128, kk), kk > 0);
      wg_commit();
    }
    if (ci + 1 < nch) issue(ci + 1);
    if constexpr (KDA) wg_wait<0>();
    else wg_wait<1>();  // acc done; Q K^T still running under its epilogue
    fence_regs(acc);
    if (wg < 2) {  // Vn = U - W Xs into U's tile, Vg beside it (v_new too when kept)
      const float f0 = (g.p && r0 < len) ? exp_fast(glast - gl[r0]) : 1.0f;
      const float f1 = (g.p && r1 < len) ? exp_fast(glast - gl[r1]) : 1.0f;
      auto vn_rows = [&](auto keep) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const uint32_t off = (hr ? tb1 : tb0) + ((j << 4) ^ gx);
            const uint32_t uu = *reinterpret_cast<const uint32_t*>(Us + off);
            const float v0 = sm80::h2f<BF>(static_cast<uint16_t>(uu)) - acc[4 * j + 2 * hr];
            const float v1 = sm80::h2f<BF>(static_cast<uint16_t>(uu >> 16)) - acc[4 * j + 2 * hr + 1];
            if constexpr (decltype(keep)::value) {
              const int r = hr ? r1 : r0;
              if (r < len) sm80::mma16::st2(vn.p, vn.code, vn.off(s.b, t0 + r, hv) + 64 * nb + 8 * j + 2 * tq, v0, v1);
            }
            *reinterpret_cast<uint32_t*>(Us + off) = pack2<BF>(v0, v1);
            if constexpr (!KDA) {
              const float f = hr ? f1 : f0;
              *reinterpret_cast<uint32_t*>(Vg + off) = pack2<BF>(f * v0, f * v1);
            }
          }
      };
      if (vn.p) vn_rows(std::true_type{});
      else vn_rows(std::false_type{});
    }
    if constexpr (KDA) {
      if (wg >= 2) {  // O = scale qg Xs (P carries its scale)
#pragma unroll
        for (int i = 0; i < 32; ++i) acc[i] *= scale;
      }
      // X = diag(e^{g_last}) X: this thread's rows xr, xr + 8.
      const float f0 = exp_fast(gl[th.xr]), f1 = exp_fast(gl[th.xr + 8]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[4 * j] *= f0, x[4 * j + 1] *= f0;
        x[4 * j + 2] *= f1, x[4 * j + 3] *= f1;
      }
    } else {
      wg_wait<0>();
      fence_regs(pa);
      if (wg >= 2) {  // O = diag(e^g) Q Xs (after the last wait: acc may not be redefined while
                      // a wgmma batch is in flight, or the compiler serializes them all)
        const float e0 = exp_fast(gl[r0]), e1 = exp_fast(gl[r1]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[4 * j] *= e0, acc[4 * j + 1] *= e0;
          acc[4 * j + 2] *= e1, acc[4 * j + 3] *= e1;
        }
      }
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = hr ? r1 : r0, col = 16 * wg + 8 * j + 2 * tq;
          const float p0 = (r < len && col <= r) ? pa[4 * j + 2 * hr] * exp_fast(gl[r] - gl[col]) : 0.0f;
          const float p1 = (r < len && col + 1 <= r) ? pa[4 * j + 2 * hr + 1] * exp_fast(gl[r] - gl[col + 1]) : 0.0f;
          *reinterpret_cast<uint32_t*>(Ps + (r * 128 + 4 * tq + (((2 * wg + j) << 4) ^ gx))) = pack2<BF>(p0, p1);
        }
      if (g.p) {
        const float f = exp_fast(glast);
#pragma unroll
        for (int i = 0; i < 32; ++i) x[i] *= f;
      }
    }
    fence_async_smem();
    __syncthreads();  // Vn, Vg, P
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBT / 16; ++kk)
      wgmma_n64<BF, 1, 1>(x, mnmajor(mLo, aK + (wg & 1) * (kTileB / 2) + kk * 2048),
                          mnmajor(mLo, (KDA ? aU : aVg) + (wg >> 1) * (kTileB / 2) + kk * 2048), 1);
    wg_commit();
    if (wg >= 2) {  // O += P Vn
      const uint32_t aPc = KDA ? aVg + cur * kPB : aP;
#pragma unroll
      for (int kk = 0; kk < kBT / 16; ++kk)
        wgmma_n64<BF, 0, 1>(acc, desc_make(kLo + ((aPc + kk * 32) >> 4), kDescHi),
                            mnmajor(mLo, aU + nb * (kTileB / 2) + kk * 2048), 1);
      wg_commit();
    }
    wg_wait<0>();
    fence_regs(x);
    fence_regs(acc);
    if (wg >= 2) {
      const int cb = 64 * nb;
      const float os = KDA ? 1.0f : scale;  // KDA's O is scaled already
      if (o_staged) {
        // o through this warp's rows of Q's tile (Q's last readers were before the barrier above),
        // then 16-byte row stores.
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr)
            *reinterpret_cast<uint32_t*>(Qs + ((hr ? tb1 : tb0) + ((j << 4) ^ gx))) =
                pack2<BF>(os * acc[4 * j + 2 * hr], os * acc[4 * j + 2 * hr + 1]);
        __syncwarp();
        uint16_t* base = static_cast<uint16_t*>(o.p);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = lane + 32 * i, r = 16 * wq + (e >> 3), c = cb + 8 * (e & 7);
          if (r < len)
            *reinterpret_cast<uint4*>(base + o.off(s.b, t0 + r, hv) + c) =
                *reinterpret_cast<const uint4*>(Qs + sw_off(kBT, r, c));
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = cb + 8 * j + 2 * tq;
          if (r0 < len)
            sm80::mma16::st2(o.p, o.code, o.off(s.b, t0 + r0, hv) + col, os * acc[4 * j], os * acc[4 * j + 1]);
          if (r1 < len)
            sm80::mma16::st2(o.p, o.code, o.off(s.b, t0 + r1, hv) + col, os * acc[4 * j + 2],
                             os * acc[4 * j + 3]);
        }
      }
    }
  }
  if (ht.p) store_state(x, ht, sidx, th);
}

// Whether the kernel takes these arguments: GDN's scalar gate (or none), K = V = 128, chunk 64,
// 16-bit inputs; one CTA per (sequence, value head) and per SM, so taken, as cuda_sm80's fused
// kernel, when those pairs fill at least 7/8 of the SMs (FUSEDOPS_GDN_FUSED_HO=1 or 0 forces the
// choice, test-only).
bool state_out_ok(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q, const TensorView& o,
                  int64_t o_chunk) {
  using namespace sm80::mma16;
  const DType dt = a.k.dtype();
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : a.k.size(0);
  if (o_chunk != kBT ||
      !wg_state_ok(ctx, "FUSEDOPS_GDN_FUSED_HO", dt, a.chunk_size, a.k.size(3), a.u.size(3), N * a.u.size(2),
                   kHoSmem) ||
      !scalar_gate_ok(a.g, a.gk))
    return false;
  if (!tok16_ok(a.k, dt) || !tok16_ok(a.w, dt) || !tok16_ok(a.u, dt) || !tok16_ok(q, dt) || !out2_ok(o))
    return false;
  if (a.h.defined() && !state16_ok(a.h, dt)) return false;
  if (a.v_new.defined() && !out2_ok(a.v_new)) return false;
  return ends_ok(a.h0, a.ht);
}

// The GDN form (aqk undefined): false, with nothing written, where state_out_ok does not take it.
bool state_out_g(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q, const TensorView& o,
                 int64_t o_chunk, double scale) {
  if (!state_out_ok(ctx, a, q, o, o_chunk)) return false;
  const char* op = "chunk_gated_delta_rule";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), Hk = a.k.size(2), HV = a.u.size(2);
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * HV == 0) return true;
  const Layout L = sm80::with_snapshots(sm80::layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, a.k.dtype()), a.h);
  const bool o_staged = sm80::mma16::staged_out_ok(o, o, a.k.dtype());
  auto kernel = a.k.dtype() == DType::kBFloat16 ? fwd_ho_wg_kernel<true, false> : fwd_ho_wg_kernel<false, false>;
  sm80::allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kHoSmem);
  trace_kernel("fwd_ho_wg_kernel");
  kernel<<<static_cast<unsigned>(N * HV), kHoThreads, kHoSmem, sm80::stream_of(ctx)>>>(
      sm80::tok_of(q), sm80::tok_of(a.k), sm80::tok_of(a.w), sm80::tok_of(a.u), sm80::tok_of(a.g),
      sm80::mat_of(a.h0), sm80::mat_of(a.h), sm80::tok_of(a.v_new), sm80::mat_of(a.ht), sm80::tok_of(o), L,
      static_cast<int>(HV), static_cast<int>(HV / Hk), static_cast<float>(scale), o_staged, Tok());
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return true;
}

// KDA's state recurrence (its gk form: a.k = kg, a.gk = g_cumsum) and chunk_kda_fwd_o in the same
// kernel (fwd_ho_wg_kernel<BF, true>): taken under the conditions of GDN's (FUSEDOPS_GDN_FUSED_HO;
// K = V = 128, chunk 64, 16-bit, enough (sequence, head) pairs) with the gate
// in fp32 rows of 16 bytes and Aqk 16-bit; false, with nothing written, otherwise.
bool state_out_gk(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& qg,
                  const TensorView& aqk, const TensorView& o, double scale) {
  using namespace sm80::mma16;
  const DType dt = a.k.dtype();
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : a.k.size(0);
  if (a.g.defined() || !a.gk.defined() || aqk.size(3) != kBT || a.gk.size(3) != kD) return false;
  if (!wg_state_ok(ctx, "FUSEDOPS_GDN_FUSED_HO", dt, a.chunk_size, a.k.size(3), a.u.size(3), N * a.u.size(2),
                   kHoSmem))
    return false;
  if (!tok32_ok(a.gk) || !tok16_ok(a.k, dt) || !tok16_ok(a.w, dt) || !tok16_ok(a.u, dt) || !tok16_ok(qg, dt) ||
      !tok16_ok(aqk, dt) || !out2_ok(o) || a.h.defined() || a.v_new.defined() || !ends_ok(a.h0, a.ht))
    return false;
  const char* op = "chunk_kda";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), Hk = a.k.size(2), HV = a.u.size(2);
  if (N * HV == 0) return true;
  const Layout L = sm80::with_snapshots(sm80::layout_of(B, T, a.chunk_size, a.cu_seqlens, TensorView(), a.chunk_offsets, dt), a.h);
  const bool o_staged = staged_out_ok(o, o, dt);
  auto kernel = dt == DType::kBFloat16 ? fwd_ho_wg_kernel<true, true> : fwd_ho_wg_kernel<false, true>;
  sm80::allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kHoSmem);
  trace_kernel("fwd_ho_wg_kernel");
  kernel<<<static_cast<unsigned>(N * HV), kHoThreads, kHoSmem, sm80::stream_of(ctx)>>>(
      sm80::tok_of(qg), sm80::tok_of(a.k), sm80::tok_of(a.w), sm80::tok_of(a.u), sm80::tok_of(a.gk),
      sm80::mat_of(a.h0), Mat(), Tok(), sm80::mat_of(a.ht), sm80::tok_of(o), L,
      static_cast<int>(HV), static_cast<int>(HV / Hk), static_cast<float>(scale), o_staged, sm80::tok_of(aqk));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return true;
}

}  // namespace

bool state_out_fused(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q,
                     const TensorView& aqk, const TensorView& o, int64_t o_chunk, double scale) {
  if (aqk.defined()) return state_out_gk(ctx, a, q, aqk, o, scale);
  return state_out_g(ctx, a, q, o, o_chunk, scale);
}

}  // namespace fusedops::la::sm90
