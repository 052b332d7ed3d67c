// Gated delta rule, CUDA backend cuda_sm90 (sm_90a only): chunk_bwd_dqkwg on Hopper's warpgroup
// products (wgmma), taken by the cuda_sm90 top-level backward (compose_bwd's dqkwg hook); the
// sub-operator's own entry point stays cuda_sm80's dqkwg_mma_kernel.
//
// Why (bench/notes/ARCHIVE.md, GPU stop 31): dqkwg_mma_kernel (649 µs at B=8 T=4096 H=16 K=V=128 bf16,
// 46% of DRAM peak) waits mostly on shared memory. Its warps issue one instruction every 2.7 cycles,
// and the top stall is the short scoreboard of the ldmatrix loads that feed every m16n8k16 product,
// where each B fragment is read by four warps. wgmma reads both operands from shared memory itself.
//
// Same math, CTA grid (chunk, head: one value head per q/k head) and reductions as
// dqkwg_mma_kernel, on two warpgroups: warpgroup wg computes columns 64 wg.. of the 64x128
// products (dq, dk, dw, dO h^T, Vnew dh^T) as m64n64 and columns 32 wg.. of the 64x64 ones
// (P = Q K^T, S = dO Vnew^T) as two m64n16. The accumulator layout of a warp is that of the mma
// kernel's warp (rows 16 (warp % 4).., the same columns), so the epilogues are the same per thread.
// Tiles are 16-bit in the 128-byte swizzle (la_wgmma_sm90.cuh): Q, K, dO (then dv2), Vnew
// [64][128], h (then dh) [128][128], Ds [64][64]. The products that sum over tokens (Ds K, Ds^T Q)
// read K, Q and Ds as MN-major operands; Ds is zero above its diagonal and past len, so they sum
// over all 64 rows. Values are rounded where the mma kernel rounds them (Ds in the input type); the
// summation order inside a tensor-core product may differ.
#include <cstdint>

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

using sm80::ChunkPos;
using sm80::Layout;
using sm80::Mat;
using sm80::Tok;

constexpr int kDqThreads = 256;
constexpr uint32_t kHB = kD * kD * 2;       // h / dh [128][128]
constexpr uint32_t kDsB = kBT * kBT * 2;    // Ds [64][64]
constexpr uint32_t oQ = 0, oK = kTileB, oO = 2 * kTileB, oV = 3 * kTileB, oH = 4 * kTileB, oDs = oH + kHB;
constexpr uint32_t kTilesB = oDs + kDsB;
// gl [64], rs [2][64], cs [4][64], red [8], redk [8].
constexpr size_t kDqSmem = 1024 + kTilesB + 4 * (7 * static_cast<size_t>(kBT) + 2 * (kDqThreads / 32));

// Rows 0..63 of a 16-bit token-major tensor (rows >= len zero) into a swizzled [64][128] tile.
__device__ __forceinline__ void load_tile(uint8_t* dst, const Tok& t, const ChunkPos& c, int head, int tid) {
  const uint16_t* base = static_cast<const uint16_t*>(t.p);
#pragma unroll
  for (int i = 0; i < kBT * 16 / kDqThreads; ++i) {
    const int e = tid + i * kDqThreads, r = e >> 4, col = (e & 15) << 3;
    const bool ok = r < c.len;
    sm80::cp_async16(dst + sw_off(kBT, r, col), base + t.off(c.b, c.t0 + (ok ? r : 0), head) + col, ok);
  }
}
// State sidx of m ([.., 128, 128] 16-bit) into a swizzled [128][128] tile.
__device__ __forceinline__ void load_state_tile(uint8_t* dst, const Mat& m, int64_t sidx, int tid) {
  const uint16_t* base = static_cast<const uint16_t*>(m.p) + sidx * (kD * kD);
#pragma unroll
  for (int i = 0; i < kD * 16 / kDqThreads; ++i) {
    const int e = tid + i * kDqThreads, r = e >> 4, col = (e & 15) << 3;
    sm80::cp_async16(dst + sw_off(kD, r, col), base + r * kD + col, true);
  }
}

// Row sums of T . a over this thread's pairs of an m64n64 accumulator (rows r0, r0 + 8; columns
// 64 wg + 8 j + 2 tq of the swizzled [64][128] tile T, whose pair offsets are rb0 / rb1 plus
// ((j << 4) ^ gx)), reduced over the quad.
template <bool BF>
__device__ __forceinline__ void row_dot_sw(const uint8_t* T, uint32_t rb0, uint32_t rb1, uint32_t gx,
                                           const float (&a)[32], float& s0, float& s1) {
  using sm80::h2f;
  s0 = 0.0f;
  s1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t x0 = *reinterpret_cast<const uint32_t*>(T + rb0 + ((j << 4) ^ gx));
    const uint32_t x1 = *reinterpret_cast<const uint32_t*>(T + rb1 + ((j << 4) ^ gx));
    s0 += h2f<BF>(static_cast<uint16_t>(x0)) * a[4 * j] + h2f<BF>(static_cast<uint16_t>(x0 >> 16)) * a[4 * j + 1];
    s1 += h2f<BF>(static_cast<uint16_t>(x1)) * a[4 * j + 2] + h2f<BF>(static_cast<uint16_t>(x1 >> 16)) * a[4 * j + 3];
  }
  s0 = sm80::mma16::quad_sum(s0);
  s1 = sm80::mma16::quad_sum(s1);
}

// A 16-bit output's [64][128] chunk rows from this thread's m64n64 accumulator (times nothing)
// through its warp's own [16][64] block of the free swizzled tile T: pairs in, then 16-byte rows
// out (rows at or past len are not stored).
template <bool BF>
__device__ __forceinline__ void store_rows_sw(const float (&a)[32], uint8_t* T, uint32_t rb0, uint32_t rb1, uint32_t gx,
                                              const Tok& t, const ChunkPos& c, int head, int wg, int wq, int lane) {
  using sm80::mma16::pack2;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    *reinterpret_cast<uint32_t*>(T + rb0 + ((j << 4) ^ gx)) = pack2<BF>(a[4 * j], a[4 * j + 1]);
    *reinterpret_cast<uint32_t*>(T + rb1 + ((j << 4) ^ gx)) = pack2<BF>(a[4 * j + 2], a[4 * j + 3]);
  }
  __syncwarp();
  uint16_t* base = static_cast<uint16_t*>(t.p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int u = lane + 32 * i, r = 16 * wq + (u >> 3), cu = u & 7;
    if (r < c.len)
      *reinterpret_cast<uint4*>(base + t.off(c.b, c.t0 + r, head) + 64 * wg + 8 * cu) =
          *reinterpret_cast<const uint4*>(T + wg * (kTileB / 2) + r * 128 + ((cu ^ (r & 7)) << 4));
  }
}

template <bool BF>
__global__ void __launch_bounds__(kDqThreads, 2)
    dqkwg_wg_kernel(Tok q, Tok k, Tok vn, Tok dO, Mat h, Mat dh, Tok dv2, Tok g, Tok dq, Tok dk, Tok dw, Tok dg,
                    Layout L, int HV, float scale, bool staged) {
  using sm80::exp_fast;
  using sm80::mma16::pack2;
  using sm80::mma16::quad_sum;
  using sm80::shfl_xor;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* sm = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  const uint32_t sa = smem_addr(sm);  // 1024-aligned
  const uint32_t kLo = desc_lo(sa, 16), mLo = desc_lo(sa, 8192);
  uint8_t* Qs = sm + oQ;
  uint8_t* Ks = sm + oK;
  uint8_t* dOs = sm + oO;  // dO, then dv2
  uint8_t* Vs = sm + oV;
  uint8_t* Hs = sm + oH;  // h, then dh
  uint8_t* Ds = sm + oDs;
  float* gl = reinterpret_cast<float*>(sm + kTilesB);  // [64]
  float* rs = gl + kBT;                                // [2][64]: per warpgroup, the per-row terms of dg
  float* cs = rs + 2 * kBT;                            // [4][64]: per row quarter, the column sums of M
  float* red = cs + 4 * kBT;                           // [8]: <h, dh> per warp
  float* redk = red + kDqThreads / 32;                 // [8]: sum of rowsum(dKi . K) per warp
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = sm80::chunk_pos(L, chunk);
  const int hk = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  // The warpgroup through a shuffle, so that the compiler sees it uniform across each warp.
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int warp = tid >> 5, wq = warp & 3, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int r0 = 16 * wq + gq, r1 = r0 + 8;
  const uint32_t gx = static_cast<uint32_t>(gq) << 4;
  // Pair offsets in a [64][128] tile at columns 64 wg + 8 j + 2 tq: rb0 / rb1 + ((j << 4) ^ gx).
  const uint32_t rb0 = wg * (kTileB / 2) + r0 * 128 + 4 * tq, rb1 = rb0 + 8 * 128;
  // acc = T Hs^T on this warpgroup's 64 columns (T the [64][128] tile at byte offset aT; Hs h or dh).
  auto times_state_t = [&](float(&acc)[32], uint32_t aT) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_n64<BF, 0, 0>(acc, kmajor(kLo, aT, kk), kmajor<kD>(kLo, oH, kk, 64 * wg), kk > 0);
    wg_commit();
    wg_wait<0>();
    fence_regs(acc);
  };
  float dqa[32], dka[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dqa[i] = dka[i] = 0.0f;
  {
    const int hv = hk;  // one value head per q/k head (see dqkwg_wg)
    const int64_t sidx = chunk * HV + hv;
    load_tile(Qs, q, c, hk, tid);
    load_tile(Ks, k, c, hk, tid);
    load_tile(dOs, dO, c, hv, tid);
    load_tile(Vs, vn, c, hv, tid);
    load_state_tile(Hs, h, sidx, tid);
    sm80::cp_async_commit();
    if (tid < kBT) gl[tid] = (g.p && tid < len) ? g.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    sm80::cp_async_wait<0>();
    fence_async_smem();
    __syncthreads();
    const float glast = gl[len - 1];
    float t0 = 0.0f, t1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
    // P = Q K^T, S = dO Vnew^T on columns 32 wg..; Ds = scale M>= Gamma S (16-bit), M = Ds . P: its
    // row sums (t0, t1) and column sums over the warp's 16 rows (cs).
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {  // columns 32 wg + 16 hh.., as m64n16 (fewer live registers)
      float pa[8], sa[8];
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        wgmma_n16<BF, 0, 0>(pa, kmajor(kLo, oQ, kk), kmajor(kLo, oK, kk, 32 * wg + 16 * hh), kk > 0);
        wgmma_n16<BF, 0, 0>(sa, kmajor(kLo, oO, kk), kmajor(kLo, oV, kk, 32 * wg + 16 * hh), kk > 0);
      }
      wg_commit();
      wg_wait<0>();
      fence_regs(pa);
      fence_regs(sa);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int cb = 32 * wg + 16 * hh + 8 * j;  // the 8-column block
        float cc[2] = {0.0f, 0.0f}, dd[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e < 2 ? r0 : r1, col = cb + 2 * tq + (e & 1);
          const float d = (r < len && col <= r) ? scale * exp_fast(gl[r] - gl[col]) * sa[4 * j + e] : 0.0f;
          const float m = col == r ? 0.0f : d * pa[4 * j + e];  // the diagonal cancels in dg (sm80 file)
          if (e < 2) t0 += m;
          else t1 += m;
          cc[e & 1] += m;
          dd[e] = d;
        }
        // Ds pairs at (r, cb + 2 tq) of the [64][64] tile: 16-byte chunk cb / 8 of the row.
        const uint32_t cj = static_cast<uint32_t>(cb >> 3) << 4;
        *reinterpret_cast<uint32_t*>(Ds + r0 * 128 + 4 * tq + (cj ^ gx)) = pack2<BF>(dd[0], dd[1]);
        *reinterpret_cast<uint32_t*>(Ds + r1 * 128 + 4 * tq + (cj ^ gx)) = pack2<BF>(dd[2], dd[3]);
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          float v2 = cc[x];
          v2 += shfl_xor(v2, 4);
          v2 += shfl_xor(v2, 8);
          v2 += shfl_xor(v2, 16);
          if (lane < 4) cs[wq * kBT + cb + 2 * tq + x] = v2;
        }
      }
    }
    // A = dO h^T: the gate term scale e^g rowsum(Q . A), then dq += scale e^g A.
    {
      float aq[32];
      times_state_t(aq, oO);
      const float e0 = r0 < len ? scale * exp_fast(gl[r0]) : 0.0f, e1 = r1 < len ? scale * exp_fast(gl[r1]) : 0.0f;
      float s0, s1;
      row_dot_sw<BF>(Qs, rb0, rb1, gx, aq, s0, s1);
      x0 += e0 * s0;
      x1 += e1 * s1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dqa[4 * j] += e0 * aq[4 * j];
        dqa[4 * j + 1] += e0 * aq[4 * j + 1];
        dqa[4 * j + 2] += e1 * aq[4 * j + 2];
        dqa[4 * j + 3] += e1 * aq[4 * j + 3];
      }
    }
    fence_async_smem();
    __syncthreads();  // Ds; every read of dO done
    if (dw.p) load_tile(dOs, dv2, c, hv, tid);
    sm80::cp_async_commit();
    // dq += Ds K (K as the MN-major B: token rows, columns 64 wg..); dk += Ds^T Q (Ds as the
    // MN-major A).
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < kBT / 16; ++kk) {
      wgmma_n64<BF, 0, 1>(dqa, kmajor(kLo, oDs, kk), mnmajor(mLo, oK + wg * (kTileB / 2) + kk * 2048), 1);
      wgmma_n64<BF, 1, 1>(dka, mnmajor(mLo, oDs + kk * 2048), mnmajor(mLo, oQ + wg * (kTileB / 2) + kk * 2048), 1);
    }
    wg_commit();
    sm80::cp_async_wait<0>();
    fence_async_smem();
    wg_wait<0>();
    fence_regs(dqa);
    fence_regs(dka);
    __syncthreads();  // dv2
    if (dw.p) {  // dW = -dv2 h^T
      float aw[32];
      times_state_t(aw, oO);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = 64 * wg + 8 * j + 2 * tq;
        if (r0 < len) sm80::mma16::st2(dw.p, dw.code, dw.off(c.b, c.t0 + r0, hv) + col, -aw[4 * j], -aw[4 * j + 1]);
        if (r1 < len) sm80::mma16::st2(dw.p, dw.code, dw.off(c.b, c.t0 + r1, hv) + col, -aw[4 * j + 2], -aw[4 * j + 3]);
      }
    }
    __syncthreads();  // every read of h done
    // dh replaces h in shared memory; each 16-byte unit is read and written by one thread, which
    // takes <h, dh> on the way.
    {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(dh.p) + sidx * (kD * kD));
      constexpr int kPer = kD * (kD / 8) / kDqThreads;
      uint4 y[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) y[i] = src[tid + i * kDqThreads];
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int e = tid + i * kDqThreads, r = e >> 4, col = (e & 15) << 3;
        uint4* dst = reinterpret_cast<uint4*>(Hs + sw_off(kD, r, col));
        const uint4 x = *dst;
        const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y[i].x, y[i].y, y[i].z, y[i].w};
#pragma unroll
        for (int u = 0; u < 4; ++u)
          s += sm80::h2f<BF>(static_cast<uint16_t>(xs[u])) * sm80::h2f<BF>(static_cast<uint16_t>(ys[u])) +
               sm80::h2f<BF>(static_cast<uint16_t>(xs[u] >> 16)) * sm80::h2f<BF>(static_cast<uint16_t>(ys[u] >> 16));
        *dst = y[i];
      }
#pragma unroll
      for (int m = 16; m > 0; m >>= 1) s += shfl_xor(s, m);
      if (lane == 0) red[warp] = s;
    }
    fence_async_smem();
    __syncthreads();  // dh
    // dKi = diag(e^{g_last - g}) Vnew dH^T: the gate term rowsum(dKi . K); dk += dKi.
    {
      float ak[32];
      times_state_t(ak, oV);
      const float f0 = r0 < len ? exp_fast(glast - gl[r0]) : 0.0f, f1 = r1 < len ? exp_fast(glast - gl[r1]) : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        ak[4 * j] *= f0;
        ak[4 * j + 1] *= f0;
        ak[4 * j + 2] *= f1;
        ak[4 * j + 3] *= f1;
        dka[4 * j] += ak[4 * j];
        dka[4 * j + 1] += ak[4 * j + 1];
        dka[4 * j + 2] += ak[4 * j + 2];
        dka[4 * j + 3] += ak[4 * j + 3];
      }
      float u0, u1;
      row_dot_sw<BF>(Ks, rb0, rb1, gx, ak, u0, u1);
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
      rs[wg * kBT + r0] = t0 + x0;
      rs[wg * kBT + r1] = t1 + x1;
    }
    __syncthreads();  // rs, cs, red, redk
    if (dg.p && tid < len) sm80::mma16::dqkwg_dg_row(rs, cs, red, redk, kDqThreads / 32, glast, dg, c, hv, tid);
  }
  if (staged) {  // 16-bit dq, dk through the warp's blocks of Qs and Ks (every product is done)
    store_rows_sw<BF>(dqa, Qs, rb0, rb1, gx, dq, c, hk, wg, wq, lane);
    store_rows_sw<BF>(dka, Ks, rb0, rb1, gx, dk, c, hk, wg, wq, lane);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 64 * wg + 8 * j + 2 * tq;
    if (r0 < len) {
      sm80::mma16::st2(dq.p, dq.code, dq.off(c.b, c.t0 + r0, hk) + col, dqa[4 * j], dqa[4 * j + 1]);
      sm80::mma16::st2(dk.p, dk.code, dk.off(c.b, c.t0 + r0, hk) + col, dka[4 * j], dka[4 * j + 1]);
    }
    if (r1 < len) {
      sm80::mma16::st2(dq.p, dq.code, dq.off(c.b, c.t0 + r1, hk) + col, dqa[4 * j + 2], dqa[4 * j + 3]);
      sm80::mma16::st2(dk.p, dk.code, dk.off(c.b, c.t0 + r1, hk) + col, dka[4 * j + 2], dka[4 * j + 3]);
    }
  }
}

}  // namespace

// compose_bwd's hook for B4 (chunk_bwd_dqkwg): dqkwg_wg_kernel where it applies, else false.
bool dqkwg_wg(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  using namespace sm80::mma16;
  const char* op = "chunk_bwd_dqkwg";
  const DType dt = a.q.dtype();
  if (dt != DType::kBFloat16 && dt != DType::kFloat16) return false;
  if (a.chunk_size != kBT || a.q.size(3) != kD || a.v.size(3) != kD) return false;
  if (sm80::smem_optin(op, ctx.device.index) < kDqSmem) return false;
  for (const TensorView* t : {&a.q, &a.k, &a.v, &a.dout})
    if (!tok16_ok(*t, dt)) return false;
  if (!state16_ok(a.h, dt) || !state16_ok(a.dh, dt) || !out2_ok(a.dq) || !out2_ok(a.dk)) return false;
  if (a.w.defined() && !(tok16_ok(a.dv, dt) && out2_ok(a.dw))) return false;
  // One value head per q/k head. With grouped values dq and dk sum over the group's heads in the
  // accumulators that wgmma also adds into, and ptxas then spilled ~800 bytes per thread and
  // serialized the products (a loop over the heads, or two unrolled); those keep cuda_sm80's kernel.
  if (a.v.size(2) != a.q.size(2)) return false;
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), HV = a.v.size(2);
  const Layout L = sm80::layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), dt);
  const int64_t NT = a.cu_seqlens.defined() ? a.chunk_indices.size(0) : B * L.nt;
  if (NT == 0 || H == 0) return true;
  auto kernel = dt == DType::kBFloat16 ? dqkwg_wg_kernel<true> : dqkwg_wg_kernel<false>;
  sm80::allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kDqSmem);
  trace_kernel("dqkwg_wg_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(H)), kDqThreads, kDqSmem, sm80::stream_of(ctx)>>>(
      sm80::tok_of(a.q), sm80::tok_of(a.k), sm80::tok_of(a.v), sm80::tok_of(a.dout), sm80::mat_of(a.h),
      sm80::mat_of(a.dh), sm80::tok_of(a.dv), sm80::tok_of(a.g), sm80::tok_of(a.dq), sm80::tok_of(a.dk),
      a.w.defined() ? sm80::tok_of(a.dw) : Tok(), a.g.defined() ? sm80::tok_of(a.dg) : Tok(), L,
      static_cast<int>(HV), static_cast<float>(a.scale), staged_out_ok(a.dq, a.dk, dt));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  return true;
}

}  // namespace fusedops::gdn::sm90
