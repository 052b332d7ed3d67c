// KDA (Kimi delta attention), CUDA backend cuda_sm80 (sm_80 and later): the forward-direction
// operators, chunk_kda_bwd_dAv, the gate backward, and the registration. Chunk-parallel operators
// run one CTA of 256 threads per (chunk, value head) with the operands staged in shared memory as
// fp32 and products by the CTA-wide mm (tf32 tensor cores for 16-bit inputs, FFMA for fp32;
// the shared helpers of la_sm80.cuh: Tok/Mat access, device-side varlen positions, tile loads,
// mm). The top level runs kda::compose_fwd with "cuda_sm80" forced on the sub-operators
// (chunk_local_cumsum, beta_sigmoid and chunk_gated_delta_rule_fwd_h, the shared sub-operators,
// whose CUDA kernels are in src/ops/linear_attention/; l2norm from its own backend).
// Math and storage dtypes as in kda_kernels.h. Deterministic: fixed thread-to-output ownership,
// fixed-order sums, no atomics.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/kda.h"
#include "src/cuda/check.cuh"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"
#include "src/ops/kda/kda_sm80.cuh"
#include "src/ops/kda/kda_top.h"

namespace fusedops::kda::sm80 {
namespace {

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

int64_t num_chunks(const Layout& L, const TensorView& cu, const TensorView& ci) {
  return cu.defined() ? ci.size(0) : L.B * L.nt;
}

// ---------------------------------------------------------------------------------------------
// chunk_kda_fwd_intra: CTA per (chunk, value head). Every thread owns the 16 (i, j) entries
// e = tid + 256 p (i = e / 64, j = e % 64) and accumulates over 32-channel slices staged in
// shared memory: aq = sum_c q_ic k_jc exp(g_ic - g_jc), ak = sum_c k_ic k_jc exp(g_ic - g_jc), for
// j <= i only (every exponential factor <= 1 for non-positive gates). Then L = diag(beta) ak
// (strictly lower) and Akk = (I + L)^{-1} by forward substitution, thread j owning column j (it
// only reads its own column of X: no barrier inside). Static shared memory 33.5 KB.

constexpr int kSl = 32;         // channel slice of the intra kernel
constexpr int kLdS = pad_ld(kSl);   // its leading dimension
constexpr int kPer = kMaxBT * kMaxBT / kThreads;  // 16 entries per thread

__global__ void __launch_bounds__(kThreads) intra_kernel(Tok q, Tok k, Tok gk, Tok beta, Tok Aqk, Tok Akk,
                                                         Layout L, int K, int G, float scale) {
  __shared__ float sm[2 * kMaxBT * kLd];  // 3 x [64][37] slices, later Ls and X [64][69]
  __shared__ float bs[kMaxBT];
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len, BT = L.BT;
  if (len == 0) return;
  float* Qs = sm;
  float* Ks = Qs + kMaxBT * kLdS;
  float* Gs = Ks + kMaxBT * kLdS;
  float aq[kPer], ak[kPer];
#pragma unroll
  for (int p = 0; p < kPer; ++p) aq[p] = ak[p] = 0.0f;
  for (int y0 = 0; y0 < K; y0 += kSl) {
    __syncthreads();
    load_tile(Qs, kLdS, kMaxBT, kSl, q, c.b, c.t0, hk, len, y0, K);
    load_tile(Ks, kLdS, kMaxBT, kSl, k, c.b, c.t0, hk, len, y0, K);
    load_tile(Gs, kLdS, kMaxBT, kSl, gk, c.b, c.t0, hv, len, y0, K);
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kPer; ++p) {
      const int e = threadIdx.x + kThreads * p, i = e >> 6, j = e & 63;
      if (i < len && j <= i) {
        const float* qi = Qs + i * kLdS;
        const float* ki = Ks + i * kLdS;
        const float* kj = Ks + j * kLdS;
        const float* gi = Gs + i * kLdS;
        const float* gj = Gs + j * kLdS;
        float sq = 0.0f, sk = 0.0f;
#pragma unroll 8
        for (int x = 0; x < kSl; ++x) {
          const float w = kj[x] * expf(gi[x] - gj[x]);
          sq = fmaf(qi[x], w, sq);
          sk = fmaf(ki[x], w, sk);
        }
        aq[p] += sq;
        ak[p] += sk;
      }
    }
  }
  __syncthreads();  // the slices are dead from here on
  float* Ls = sm;
  float* X = sm + kMaxBT * kLd;
  if (threadIdx.x < kMaxBT) bs[threadIdx.x] = threadIdx.x < len ? beta.ld(c.b, c.t0 + threadIdx.x, hv, 0) : 0.0f;
  __syncthreads();
#pragma unroll
  for (int p = 0; p < kPer; ++p) {
    const int e = threadIdx.x + kThreads * p, i = e >> 6, j = e & 63;
    Ls[i * kLd + j] = (i < len && j < i) ? bs[i] * ak[p] : 0.0f;
    if (i < len && j < BT) Aqk.st_(c.b, c.t0 + i, hv, j, j <= i ? scale * aq[p] : 0.0f);
  }
  __syncthreads();
  if (threadIdx.x < kMaxBT) {
    const int j = threadIdx.x;
    for (int i = 0; i < len; ++i) {
      float s = j == i ? 1.0f : 0.0f;
      for (int m = j; m < i; ++m) s = fmaf(-Ls[i * kLd + m], X[m * kLd + j], s);
      X[i * kLd + j] = j <= i ? s : 0.0f;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < len * BT; e += blockDim.x) {
    const int i = e / BT, j = e - i * BT;
    Akk.st_(c.b, c.t0 + i, hv, j, j <= i ? X[i * kLd + j] : 0.0f);
  }
}

namespace wu16 {
using namespace la::sm80::mma16;
constexpr size_t kSmem = 2 * (3 * static_cast<size_t>(kTok) + 2 * kMaxBT * kLdA) + 4 * kMaxBT;
}  // namespace wu16

// One chunk's (c, value head hv, key head hk) recompute on wu16::kSmem bytes of shared memory at
// smem (wu_mma_kernel's body; intra_mma_kernel's with kWU runs it after its own steps). With Xa,
// Akk comes from that fp32 tile (row stride ldx, below wu16's A tiles: the intra kernel's solve
// output) rounded as the stores to Akk round it, instead of from memory.
template <bool BF>
__device__ __forceinline__ void wu_chunk(float* smem, const Tok& q, const Tok& k, const Tok& v, const Tok& beta,
                                         const Tok& Akk, const Tok& gk, const Tok& w, const Tok& u, const Tok& kg,
                                         const Tok& qg, const ChunkPos& c, int hv, int hk, int staged,
                                         const float* Xa = nullptr, int ldx = 0) {
  using namespace la::sm80;
  using namespace la::sm80::mma16;
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);  // K, then Tk
  uint16_t* Vs = Ks + kTok;
  uint16_t* St = Vs + kTok;  // W's, then U's staging
  uint16_t* As = St + kTok;
  uint16_t* A2 = As + kMaxBT * kLdA;
  float* bs = reinterpret_cast<float*>(A2 + kMaxBT * kLdA);
  const int len = c.len, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2);
  const int r0 = wm + (lane >> 2);
  if (Xa) {  // As from Xa: the values the rows i < len of Akk got (j <= i), zeros elsewhere
    for (int e = tid; e < kMaxBT * (kMaxBT / 2); e += kThreads) {
      const int i = e >> 5, j = (e & 31) << 1;
      const float a0 = j <= i ? Xa[i * ldx + j] : 0.0f, a1 = j < i ? Xa[i * ldx + j + 1] : 0.0f;
      *reinterpret_cast<uint32_t*>(As + i * kLdA + j) = i < len ? pack2<BF>(a0, a1) : 0u;
    }
    __syncthreads();  // Xa is read: the K tile lands on it
  }
  load_rows(Ks, kLdT, k, c.b, c.t0, hk, len, kD / 8);
  load_rows(Vs, kLdT, v, c.b, c.t0, hv, len, kD / 8);
  if (!Xa) load_rows(As, kLdA, Akk, c.b, c.t0, hv, len, kMaxBT / 8);
  cp_async_commit();
  // The element-wise pass's rows rw + 8 st and channels col..col+3: their gk and q pieces are all
  // loaded here, under the tile copies.
  const float* gb = static_cast<const float*>(gk.p);
  const uint16_t* qb = static_cast<const uint16_t*>(q.p);
  const int col = 4 * lane, rw = warp;
  constexpr int kSteps = kMaxBT / (kThreads / 32);
  float4 gpf[kSteps];
  uint2 qpf[kSteps];
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    const int r = rw + 8 * st;
    gpf[st] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    qpf[st] = make_uint2(0u, 0u);
    if (r < len) {
      gpf[st] = *reinterpret_cast<const float4*>(gb + gk.off(c.b, c.t0 + r, hv) + col);
      if (qg.p) qpf[st] = *reinterpret_cast<const uint2*>(qb + q.off(c.b, c.t0 + r, hk) + col);
    }
  }
  const float4 gl = *reinterpret_cast<const float4*>(gb + gk.off(c.b, c.t0 + len - 1, hv) + col);
  if (tid < kMaxBT) bs[tid] = tid < len ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
  cp_async_wait<0>();
  __syncthreads();
  // kg, qg and Tk, four channels per step.
  const float gla[4] = {gl.x, gl.y, gl.z, gl.w};
  auto row = [&](int r, const float4& g4, const uint2& qv) {
    const float ga[4] = {g4.x, g4.y, g4.z, g4.w};
    const uint2 kv = *reinterpret_cast<const uint2*>(Ks + r * kLdT + col);
    const uint32_t kw[2] = {kv.x, kv.y};
    float kf[4], eg[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      kf[x] = h2f<BF>(static_cast<uint16_t>(kw[x >> 1] >> (16 * (x & 1))));
      eg[x] = exp_fast(ga[x]);
    }
    const int64_t ko = kg.off(c.b, c.t0 + r, hv) + col;
    float kgv[4];
#pragma unroll
    for (int x = 0; x < 4; ++x) kgv[x] = kf[x] * exp_fast(gla[x] - ga[x]);
    if (staged) {
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(kg.p) + ko) =
          make_uint2(pack2<BF>(kgv[0], kgv[1]), pack2<BF>(kgv[2], kgv[3]));
    } else {
      st2(kg.p, kg.code, ko, kgv[0], kgv[1]);
      st2(kg.p, kg.code, ko + 2, kgv[2], kgv[3]);
    }
    if (qg.p) {
      const uint32_t qw[2] = {qv.x, qv.y};
      float qf[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) qf[x] = h2f<BF>(static_cast<uint16_t>(qw[x >> 1] >> (16 * (x & 1)))) * eg[x];
      const int64_t qo = qg.off(c.b, c.t0 + r, hv) + col;
      if (staged) {
        *reinterpret_cast<uint2*>(static_cast<uint16_t*>(qg.p) + qo) =
            make_uint2(pack2<BF>(qf[0], qf[1]), pack2<BF>(qf[2], qf[3]));
      } else {
        st2(qg.p, qg.code, qo, qf[0], qf[1]);
        st2(qg.p, qg.code, qo + 2, qf[2], qf[3]);
      }
    }
    const float b = bs[r];
    *reinterpret_cast<uint2*>(Ks + r * kLdT + col) =
        make_uint2(pack2<BF>(b * eg[0] * kf[0], b * eg[1] * kf[1]), pack2<BF>(b * eg[2] * kf[2], b * eg[3] * kf[3]));
  };
#pragma unroll
  for (int st = 0; st < kSteps; ++st)
    if (rw + 8 * st < len) row(rw + 8 * st, gpf[st], qpf[st]);
  // A lower triangular (diagonal included) and A2 = A diag(beta), eight entries (16 bytes) per step
  // (after the rows: their prefetched gk and q pieces are dead by then).
  for (int e = tid; e < kMaxBT * kMaxBT / 8; e += kThreads) {
    const int i = e >> 3, j0 = (e & 7) << 3;
    const uint4 raw = *reinterpret_cast<const uint4*>(As + i * kLdA + j0);
    const uint32_t rw[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t am[4], a2[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int j = j0 + 2 * t;
      const uint16_t lo = j <= i ? static_cast<uint16_t>(rw[t]) : uint16_t{0};
      const uint16_t hi = j + 1 <= i ? static_cast<uint16_t>(rw[t] >> 16) : uint16_t{0};
      am[t] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      a2[t] = pack2<BF>(h2f<BF>(lo) * bs[j], h2f<BF>(hi) * bs[j + 1]);
    }
    *reinterpret_cast<uint4*>(As + i * kLdA + j0) = uint4{am[0], am[1], am[2], am[3]};
    *reinterpret_cast<uint4*>(A2 + i * kLdA + j0) = uint4{a2[0], a2[1], a2[2], a2[3]};
  }
  __syncthreads();  // A, A2, Tk
  float acc[8][4];
  zero(acc);
  mm_xs<BF, 8>(acc, As, kLdA, Ks, kLdT, wm, wn, 0, wm + 16, lane);
  if (staged) {
    store_warp_rows16<BF, 8>(acc, 1.0f, St, kLdT, wm, wn, w, c.b, c.t0, hv, len, lane);
  } else {
    store_rows2<8>(acc, w, c.b, c.t0, hv, r0, wn, tq, len);
  }
  zero(acc);
  mm_xs<BF, 8>(acc, A2, kLdA, Vs, kLdT, wm, wn, 0, wm + 16, lane);
  if (staged) {
    __syncwarp();  // every lane's reads of W's staged block are done
    store_warp_rows16<BF, 8>(acc, 1.0f, St, kLdT, wm, wn, u, c.b, c.t0, hv, len, lane);
  } else {
    store_rows2<8>(acc, u, c.b, c.t0, hv, r0, wn, tq, len);
  }
}

// chunk_kda_fwd_intra on tensor cores, for the common shape: K = 128, chunk 64; q, k, Aqk and Akk
// bf16 or fp16 alike, gk fp32, 16-byte aligned rows.
// CTA of 8 warps per (chunk, value head). The reference-row split of the per-channel decay, with
// r = 16 I the first row of i's 16-row block I: for j < r <= i, E_ijc = e^{g_ic - g_rc} e^{g_rc - g_jc},
// both factors <= 1 for non-increasing cumulated gates. So the 12 off-diagonal 16x16 tiles of Aqk
// and of K K^T are m16n8k16 products of (Q, K) rows scaled by e^{g - g_r} and K rows scaled by
// e^{g_r - g} (16-bit operands), and only the 4 diagonal blocks take the element-wise sum with one
// exponential per channel. The channels go in two 64-wide halves (q, k, gk and the scaled operands
// of one half on chip at a time, the products' accumulators in registers across both: 99 KiB of
// shared memory, two CTAs per SM). Then L = diag(beta) (K K^T . E) strictly lower and
// Akk = (I + L)^{-1} by solve_blocked (GDN's: 16x16 diagonal blocks by forward substitution, the
// rest on 3xTF32 mma). The gates are staged as g log2(e), every factor one ex2.approx of a
// difference (exp2_fast); the diagonal blocks' 544 entries j <= i spread evenly over the threads.
namespace intra16 {
using namespace la::sm80::mma16;
constexpr int kHalf = kIntraHalf;  // channels per pass
constexpr int kLdH = kHalf + 8;    // 16-bit row stride of the half tiles
constexpr int kLdG = kHalf + 4;    // fp32 [64][68] gate half
constexpr int kLdF = kMaxBT + 1;   // fp32 [64][65] score tiles
constexpr int kKnRows = 96;        // K scaled to the references r = 16, 32, 48: 16 + 32 + 48 rows
constexpr int kTri = 136;          // entries j <= i of a 16x16 diagonal block
// The diagonal blocks on mma (bf16 only) while every channel's gate spans at most this many log2
// units over a block's valid rows: both scaled operands then stay within 2^+-64 of q, k.
constexpr float kDiagSpan = 64.0f;
constexpr size_t kBytes16 = 2 * static_cast<size_t>(2 * kMaxBT + 2 * kMaxBT + kKnRows + kMaxBT) * kLdH;
constexpr size_t kSmem = kBytes16 + 4 * (static_cast<size_t>(kMaxBT) * kLdG + 2 * kMaxBT * kLdF + kMaxBT);
// solve_blocked's X [64][kLdF] and [64][17] stage reuse the 16-bit tiles.
static_assert(4 * (kMaxBT * kLdF + kMaxBT * la::sm80::kLdT16) <= kBytes16, "solve's buffers fit");
}  // namespace intra16

// kScan: chunk_local_cumsum fused in front (the top level's path): gk is then the cumsum's output,
// written here from the raw fp32 gate graw (loaded as gk would be, then scan_gate_col by the last
// two warps per half between two barriers, then gate_block_out by every thread), and gscale the
// cumsum's scale.
// kWU (with kScan only: the top level's path): kda_recompute_w_u fused behind, wu_chunk on the same
// chunk once Akk is out, taking Akk from the solve's fp32 tile and reading g_cumsum and the chunk's
// q, k (now mostly L2 hits) and v from memory, writing w, u, kg, qg (wu_mma_kernel's values: the
// same code).
template <bool BF, bool kScan, bool kWU>
__global__ void __launch_bounds__(kThreads, 2) intra_mma_kernel(Tok q, Tok k, Tok gk, Tok beta, Tok Aqk, Tok Akk,
                                                                Layout L, int G, float scale, Tok graw,
                                                                double gscale, Tok v, Tok w, Tok u, Tok kg, Tok qg,
                                                                int staged) {
  using namespace la::sm80;
  using namespace la::sm80::mma16;
  using intra16::kHalf;
  using intra16::kLdF;
  using intra16::kLdG;
  using intra16::kLdH;
  using intra16::kTri;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);  // [64][kLdH]: the half's q
  uint16_t* Ks = Qs + kMaxBT * kLdH;
  uint16_t* QKr = Ks + kMaxBT * kLdH;       // [128][kLdH]: Q, then K, rows scaled by e^{g - g_r}
  uint16_t* Kn = QKr + 2 * kMaxBT * kLdH;  // [96][kLdH]: for I = 1..3, K rows j < 16 I scaled by e^{g_16I - g}
  uint16_t* Kd = Kn + intra16::kKnRows * kLdH;  // [64][kLdH]: K rows j scaled by e^{g_r - g_j}, r = j & ~15
  float* Gs = reinterpret_cast<float*>(Kd + kMaxBT * kLdH);  // [64][kLdG]
  float* Aq = Gs + kMaxBT * kLdG;  // [64][kLdF]
  float* Ak = Aq + kMaxBT * kLdF;  // [64][kLdF], then L
  float* bs = Ak + kMaxBT * kLdF;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31;
  // Warp w's tiles t = w, w + 8, w + 16 (< 20), of Q (t even) or K (t odd): t < 12 the
  // off-diagonal pair t / 2 of (1,0) (2,0) (2,1) (3,0) (3,1) (3,2); t >= 12 the diagonal block
  // (t - 12) / 2 on mma, in the halves that take it.
  float acc[3][2][4];
  for (int u = 0; u < 3; ++u) zero(acc[u]);
  bool ew_any = false, mma_any = false;  // some half summed the diagonal blocks element-wise / on mma
  for (int half = 0; half < 2; ++half) {
    const int y0 = kHalf * half;
    if (half == 1) __syncthreads();  // half 0's readers are done
    load_qkg_half<kLdH, kLdG>(Qs, Ks, Gs, q, k, kScan ? graw : gk, c, hk, hv, y0, tid);
    cp_async_commit();
    if (half == 0 && tid < kMaxBT) bs[tid] = tid < len ? beta.ld(c.b, c.t0 + tid, hv, 0) : 0.0f;
    cp_async_wait<0>();
    static_assert(kThreads == 4 * kHalf, "one thread per (16-row block, channel)");
    // The diagonal blocks of this half on mma (bf16) unless some channel's gate spans more than
    // kDiagSpan over a block's valid rows: thread (block tid / 64, channel tid % 64).
    bool ew = true;
    if constexpr (kScan) {
      __syncthreads();  // the raw gate half
      if (tid >= kThreads - kHalf) scan_gate_col<kLdG>(Gs, len, tid - (kThreads - kHalf), gscale);
      __syncthreads();  // the cumulated half
      const float span = gate_block_out<kLdG>(Gs, gk, c, hv, y0, tid);
      ew = __syncthreads_or(span > intra16::kDiagSpan) != 0 || !BF;
    } else {
      gates_log2<kLdG>(Gs, tid);
      __syncthreads();
      if constexpr (BF) {
        const int r0 = 16 * (tid >> 6), y = tid & 63, n = min(16, len - r0);
        float lo = 0.0f, hi = 0.0f;
        if (n > 0) lo = hi = Gs[r0 * kLdG + y];
        for (int i = 1; i < n; ++i) {
          const float x = Gs[(r0 + i) * kLdG + y];
          lo = fminf(lo, x);
          hi = fmaxf(hi, x);
        }
        ew = __syncthreads_or(hi - lo > intra16::kDiagSpan) != 0;
      }
    }
    // The scaled operands, eight channels per step (rows >= len stay zero: Q and K are zero there).
    for (int e = tid; e < kMaxBT * (kHalf / 8); e += kThreads) {
      const int i = e >> 3, y = (e & 7) << 3, r = i & ~15;
      float d[8];
      exp2_diff8(d, Gs + i * kLdG + y, Gs + r * kLdG + y, 1.0f);
      mul8_store<BF>(QKr + i * kLdH + y, Qs + i * kLdH + y, d);
      mul8_store<BF>(QKr + (kMaxBT + i) * kLdH + y, Ks + i * kLdH + y, d);
      if (!ew) {  // the diagonal blocks' right factor: K rows times e^{g_r - g}
        exp2_diff8(d, Gs + r * kLdG + y, Gs + i * kLdG + y, 1.0f);
        mul8_store<BF>(Kd + i * kLdH + y, Ks + i * kLdH + y, d);
      }
    }
    for (int e = tid; e < intra16::kKnRows * (kHalf / 8); e += kThreads) {
      const int row = e >> 3, y = (e & 7) << 3;
      const int I = row < 16 ? 1 : row < 48 ? 2 : 3, j = row - (I == 1 ? 0 : I == 2 ? 16 : 48), r = 16 * I;
      float d[8];
      exp2_diff8(d, Gs + r * kLdG + y, Gs + j * kLdG + y, 1.0f);
      mul8_store<BF>(Kn + row * kLdH + y, Ks + j * kLdH + y, d);
    }
    // The diagonal blocks, element-wise: the 136 entries j <= i of each 16-row block, entry
    // p = 136 blk + i (i + 1) / 2 + j (i, j within the block). The first 512 go one per thread and
    // pass over the half's 64 channels; the last 32 take eight lanes each, eight channels per lane,
    // summed by a fixed shuffle tree, so every warp does the same 2 1/8 passes. The second half
    // adds to the first's sums; entries j > i are never written, nor read unmasked. A half on mma
    // (!ew) skips this; its sums join at the end.
    auto diag = [&](int p, int ya, int yb, float& sq, float& sk) {
      const int blk = p / kTri, u = p - kTri * blk;
      int il = 0;
      while ((il + 1) * (il + 2) / 2 <= u) ++il;
      const int i = 16 * blk + il, j = 16 * blk + u - il * (il + 1) / 2;
      const float* gi = Gs + i * kLdG;
      const float* gj = Gs + j * kLdG;
      const uint16_t* qi = Qs + i * kLdH;
      const uint16_t* ki = Ks + i * kLdH;
      const uint16_t* kj = Ks + j * kLdH;
      sq = 0.0f;
      sk = 0.0f;
#pragma unroll 4
      for (int y = ya; y < yb; y += 2) {
        const uint32_t qq = ld32(qi + y), kk = ld32(ki + y), kjj = ld32(kj + y);
        const float w0 = h2f<BF>(static_cast<uint16_t>(kjj)) * exp2_fast(gi[y] - gj[y]);
        const float w1 = h2f<BF>(static_cast<uint16_t>(kjj >> 16)) * exp2_fast(gi[y + 1] - gj[y + 1]);
        sq = fmaf(h2f<BF>(static_cast<uint16_t>(qq)), w0, sq);
        sq = fmaf(h2f<BF>(static_cast<uint16_t>(qq >> 16)), w1, sq);
        sk = fmaf(h2f<BF>(static_cast<uint16_t>(kk)), w0, sk);
        sk = fmaf(h2f<BF>(static_cast<uint16_t>(kk >> 16)), w1, sk);
      }
      return i * kLdF + j;
    };
    static_assert(4 * kTri == 2 * kThreads + kThreads / 8, "the diagonal entries fill 2 1/8 passes");
    if (ew) {
      for (int p = tid; p < 2 * kThreads; p += kThreads) {
        float sq, sk;
        const int o = diag(p, 0, kHalf, sq, sk);
        Aq[o] = ew_any ? Aq[o] + sq : sq;
        Ak[o] = ew_any ? Ak[o] + sk : sk;
      }
      {
        const int ya = (tid & 7) * (kHalf / 8);
        float sq, sk;
        const int o = diag(2 * kThreads + (tid >> 3), ya, ya + kHalf / 8, sq, sk);
#pragma unroll
        for (int m = 1; m < 8; m <<= 1) {
          sq += shfl_xor(sq, m);
          sk += shfl_xor(sk, m);
        }
        if ((tid & 7) == 0) {
          Aq[o] = ew_any ? Aq[o] + sq : sq;
          Ak[o] = ew_any ? Ak[o] + sk : sk;
        }
      }
    }
    ew_any |= ew;
    mma_any |= !ew;
    __syncthreads();  // QKr, Kn
#pragma unroll
    for (int u = 0; u < 3; ++u) {
      const int t = warp + 8 * u;
      if (t >= 20) break;
      if (t < 12) {
        const int p = t >> 1, I = p == 0 ? 1 : p < 3 ? 2 : 3, J = p == 0 ? 0 : p < 3 ? p - 1 : p - 3;
        const uint16_t* KnI = Kn + (I == 1 ? 0 : I == 2 ? 16 : 48) * kLdH;
        mm_xyt<BF, 2>(acc[u], QKr, kLdH, KnI, kLdH, (t & 1) * kMaxBT + 16 * I, 16 * J, kHalf, lane);
      } else if (!ew) {
        const int I = (t - 12) >> 1;
        mm_xyt<BF, 2>(acc[u], QKr, kLdH, Kd, kLdH, (t & 1) * kMaxBT + 16 * I, 16 * I, kHalf, lane);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < 3; ++u) {
    const int t = warp + 8 * u;
    if (t >= 20 || (t >= 12 && !mma_any)) break;
    const int p = t >> 1, I = t >= 12 ? (t - 12) >> 1 : p == 0 ? 1 : p < 3 ? 2 : 3;
    const int J = t >= 12 ? I : p == 0 ? 0 : p < 3 ? p - 1 : p - 3;
    const bool add = t >= 12 && ew_any;  // a diagonal block also summed element-wise in a half
    float* out = (t & 1) ? Ak : Aq;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float* o = out + (16 * I + (lane >> 2) + 8 * (e >> 1)) * kLdF + 16 * J + 8 * jj + 2 * (lane & 3) + (e & 1);
        *o = add ? *o + acc[u][jj][e] : acc[u][jj][e];
      }
  }
  __syncthreads();  // Aq, Ak
  // Aqk out, two columns per store; L = diag(beta) Ak, strictly lower, in place (zero elsewhere).
  for (int e = tid; e < kMaxBT * kMaxBT / 2; e += kThreads) {
    const int i = e >> 5, j = (e & 31) << 1;
    float* ak = Ak + i * kLdF + j;
    if (i < len)
      st2(Aqk.p, Aqk.code, Aqk.off(c.b, c.t0 + i, hv) + j, (j <= i && j < len) ? scale * Aq[i * kLdF + j] : 0.0f,
          (j < i && j + 1 < len) ? scale * Aq[i * kLdF + j + 1] : 0.0f);
    ak[0] = (i < len && j < i) ? bs[i] * ak[0] : 0.0f;
    ak[1] = (i < len && j + 1 < i) ? bs[i] * ak[1] : 0.0f;
  }
  __syncthreads();
  // X = (I + L)^{-1} into the dead 16-bit tiles (fp32 [64][kLdF] and the [64][17] stage).
  float* X = reinterpret_cast<float*>(Qs);
  float* Tb = X + kMaxBT * kLdF;
  solve_blocked(Ak, kLdF, X, Tb, kMaxBT / 16);
  for (int e = tid; e < len * (kMaxBT / 2); e += kThreads) {
    const int i = e >> 5, j = (e & 31) << 1;
    st2(Akk.p, Akk.code, Akk.off(c.b, c.t0 + i, hv) + j, j <= i ? X[i * kLdF + j] : 0.0f,
        j < i ? X[i * kLdF + j + 1] : 0.0f);
  }
  if constexpr (kWU) {
    // The recompute's A tiles lie past X and its stage (dead 16-bit tiles); it takes Akk from X and
    // reads g_cumsum (written above by this block's threads, before several barriers) from memory.
    static_assert(wu16::kSmem <= intra16::kSmem, "the recompute fits in the intra kernel's shared memory");
    static_assert(2 * 3 * static_cast<size_t>(kTok) >= 4 * (kMaxBT * kLdF + kMaxBT * la::sm80::kLdT16),
                  "wu_chunk's A tiles start past X and the solve's stage");
    wu_chunk<BF>(smem, q, k, v, beta, Akk, gk, w, u, kg, qg, c, hv, hk, staged, X, kLdF);
  }
}

bool intra_mma_ok(const Context& ctx, const ChunkKdaFwdIntraArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.q.dtype();
  if (a.chunk_size != kMaxBT || a.q.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, intra16::kSmem, "chunk_kda_fwd_intra")) return false;
  return tok16_ok(a.q, dt) && tok16_ok(a.k, dt) && tok32_ok(a.gk) && out2_ok(a.Aqk) && out2_ok(a.Akk);
}

// intra_mma_kernel over every chunk of a (intra_mma_ok); with graw defined, chunk_local_cumsum of
// graw (scale gscale) into a.gk fused in front; with wu, kda_recompute_w_u (wu_mma_ok) behind.
bool wu_mma_ok(const Context& ctx, const KdaRecomputeWUFwdArgs& a);
bool wu_staged_ok(const KdaRecomputeWUFwdArgs& a);
template <bool BF>
auto intra_variant(bool scan, bool wu) {  // the w/u recompute only behind the scan (the top level)
  return wu ? intra_mma_kernel<BF, true, true> : scan ? intra_mma_kernel<BF, true, false> : intra_mma_kernel<BF, false, false>;
}
void launch_intra_mma(const Context& ctx, const ChunkKdaFwdIntraArgs& a, const TensorView& graw, double gscale,
                      const KdaRecomputeWUFwdArgs* wu = nullptr) {
  const char* op = "chunk_kda_fwd_intra";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), HV = a.gk.size(2);
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = num_chunks(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || HV == 0) return;
  FUSEDOPS_REQUIRE(HV <= 65535 && NT <= 2147483647, kValue, op, "grid too large");
  const bool bf = a.q.dtype() == DType::kBFloat16, scan = graw.defined();
  FUSEDOPS_REQUIRE(!wu || scan, kValue, op, "the fused w/u recompute runs behind the fused cumsum only");
  auto k16 = bf ? intra_variant<true>(scan, wu != nullptr) : intra_variant<false>(scan, wu != nullptr);
  allow_smem(op, reinterpret_cast<const void*>(k16), ctx.device.index, intra16::kSmem);
  const KdaRecomputeWUFwdArgs none{};
  const KdaRecomputeWUFwdArgs& x = wu ? *wu : none;
  trace_kernel(scan ? (wu ? "intra_mma_kernel +cumsum +w/u" : "intra_mma_kernel +cumsum") : "intra_mma_kernel");
  k16<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, intra16::kSmem, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.gk), tok_of(a.beta), tok_of(a.Aqk), tok_of(a.Akk), L,
      static_cast<int>(HV / H), static_cast<float>(a.scale), tok_of(graw), gscale, tok_of(x.v), tok_of(x.w),
      tok_of(x.u), tok_of(x.kg), tok_of(x.qg), wu && wu_staged_ok(*wu) ? 1 : 0);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// Same shape, strides and storage (the fused steps hand one tensor from one to the next).
bool same_view(const TensorView& x, const TensorView& y) {
  if (x.data() != y.data() || x.dtype() != y.dtype() || x.ndim() != y.ndim()) return false;
  for (int d = 0; d < x.ndim(); ++d)
    if (x.size(d) != y.size(d) || x.stride(d) != y.stride(d)) return false;
  return true;
}

// kda::FusedCumsumIntraFwd: the forward chunk-local cumsum of an fp32 gate run inside
// intra_mma_kernel (it reads raw g, writes g_cumsum, and uses it in place of reading it back).
//
bool cumsum_intra_ok(const Context& ctx, const ChunkLocalCumsumArgs& s, const ChunkKdaFwdIntraArgs& a) {
  if (s.reverse || s.chunk_size != a.chunk_size || !same_view(s.out, a.gk) || !s.g.defined() ||
      s.g.ndim() != 4 || !la::sm80::mma16::tok32_ok(s.g))
    return false;
  for (int d = 0; d < 4; ++d)
    if (s.g.size(d) != a.gk.size(d)) return false;
  return intra_mma_ok(ctx, a);
}
bool cumsum_intra_fused(const Context& ctx, const ChunkLocalCumsumArgs& s, const ChunkKdaFwdIntraArgs& a) {
  if (!cumsum_intra_ok(ctx, s, a)) return false;
  launch_intra_mma(ctx, a, s.g, s.scale);
  return true;
}
// kda::FusedCumsumIntraWUFwd: the same with kda_recompute_w_u on intra's Akk behind, in the same
// kernel.
bool cumsum_intra_wu_fused(const Context& ctx, const ChunkLocalCumsumArgs& s, const ChunkKdaFwdIntraArgs& a,
                           const KdaRecomputeWUFwdArgs& wa) {
  if (!cumsum_intra_ok(ctx, s, a)) return false;
  if (!same_view(wa.Akk, a.Akk) || !same_view(wa.gk, a.gk) || !same_view(wa.k, a.k) || !same_view(wa.q, a.q) ||
      !same_view(wa.beta, a.beta) || !wa.q.defined() || wa.v.size(2) != a.gk.size(2) || !wu_mma_ok(ctx, wa))
    return false;
  launch_intra_mma(ctx, a, s.g, s.scale, &wa);
  return true;
}

void fwd_intra(const Context& ctx, const ChunkKdaFwdIntraArgs& a) {
  const char* op = "chunk_kda_fwd_intra";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3), HV = a.gk.size(2);
  if (intra_mma_ok(ctx, a)) {
    launch_intra_mma(ctx, a, TensorView(), 1.0);
    return;
  }
  const Layout L = layout_of(B, T, a.chunk_size, a.cu_seqlens, a.chunk_indices, TensorView(), a.q.dtype());
  const int64_t NT = num_chunks(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || HV == 0) return;
  FUSEDOPS_REQUIRE(HV <= 65535 && NT <= 2147483647, kValue, op, "grid too large");
  trace_kernel("intra_kernel");
  intra_kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, 0, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.gk), tok_of(a.beta), tok_of(a.Aqk), tok_of(a.Akk), L,
      static_cast<int>(K), static_cast<int>(HV / H), static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// kda_recompute_w_u_fwd: CTA per (chunk, value head). Akk (lower) staged once; per 64-channel
// slice W = Akk (beta e^g K) by the CTA product, kg = K e^{g_last - g} and qg = Q e^g element-wise
// (global to global); per 64-column V slice U = Akk (beta V). Static shared memory 33.5 KB.

__global__ void __launch_bounds__(kThreads) wu_kernel(Tok q, Tok k, Tok v, Tok beta, Tok Akk, Tok gk, Tok w,
                                                      Tok u, Tok kg, Tok qg, Layout L, int K, int V, int G) {
  __shared__ float Am[kMaxBT * kLd];
  __shared__ float Ts[kMaxBT * kLd];
  __shared__ float cb[kMaxBT];
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, hk = hv / G, len = c.len;
  if (len == 0) return;
  load_tri(Am, Akk, c.b, c.t0, hv, len, L.BT, false);
  if (threadIdx.x < kMaxBT) cb[threadIdx.x] = threadIdx.x < len ? beta.ld(c.b, c.t0 + threadIdx.x, hv, 0) : 0.0f;
  __syncthreads();
  const int64_t tl = c.t0 + len - 1;
  for (int y0 = 0; y0 < K; y0 += 64) {
    const int kw = imin(64, K - y0);
    // kg, qg (no shared memory).
    for (int e = threadIdx.x; e < len * kw; e += blockDim.x) {
      const int i = e / kw, x = e - i * kw;
      const float gi = gk.ld(c.b, c.t0 + i, hv, y0 + x);
      const float kv = k.ld(c.b, c.t0 + i, hk, y0 + x);
      kg.st_(c.b, c.t0 + i, hv, y0 + x, kv * expf(gk.ld(c.b, tl, hv, y0 + x) - gi));
      if (qg.p) qg.st_(c.b, c.t0 + i, hv, y0 + x, q.ld(c.b, c.t0 + i, hk, y0 + x) * expf(gi));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kMaxBT * 64; e += blockDim.x) {
      const int r = e / 64, x = e - r * 64;
      float val = 0.0f;
      if (r < len && x < kw)
        val = k.ld(c.b, c.t0 + r, hk, y0 + x) * expf(gk.ld(c.b, c.t0 + r, hv, y0 + x)) * cb[r];
      Ts[r * kLd + x] = val;
    }
    __syncthreads();
    mm(L.tc, len, kw, len, Am, kLd, 1, Ts, kLd, 1, [&](int m, int n, float val) { w.st_(c.b, c.t0 + m, hv, y0 + n, val); });
  }
  for (int x0 = 0; x0 < V; x0 += 64) {
    __syncthreads();
    load_tile(Ts, kLd, kMaxBT, 64, v, c.b, c.t0, hv, len, x0, V, cb);
    __syncthreads();
    mm(L.tc, len, imin(64, V - x0), len, Am, kLd, 1, Ts, kLd, 1,
       [&](int m, int n, float val) { u.st_(c.b, c.t0 + m, hv, x0 + n, val); });
  }
}

// kda_recompute_w_u on 16-bit tensor cores, for the common shape: K = V = 128, chunk 64; q, k, v,
// Akk and the outputs bf16 or fp16 alike, gk fp32, 16-byte aligned rows. CTA of 8 warps per (chunk,
// value head), 52 KiB of shared memory: Akk, K and V arrive as 16-bit tiles by cp.async; an
// element-wise pass over four channels at a time writes kg = K e^{gk_last - gk} and qg = Q e^gk
// (global to global for Q) and turns K's tile into Tk = beta e^gk K in place (16-bit: the
// per-channel gate cannot fold into Akk); Akk's copy A2 = Akk diag(beta) takes U's scale instead,
// so V is used as stored. W = Akk Tk and U = A2 V on m16n8k16 mma (warp w: rows 16 (w % 4)..,
// columns 64 (w / 4)..; Akk lower triangular). The element-wise pass's gk and q pieces (eight rows
// per thread) are loaded together under the tile copies, not one row per step (0.44 -> 0.365 ms at
// issue 7's shape, stop 19). With `staged`, W and U leave through each warp's own [16][64] block of
// a staging tile by 16-byte rows (store_warp_rows16) and kg, qg as one 8-byte store of four
// channels per lane, so every store instruction fills whole 32-byte sectors (the fragment pairs and
// 4-byte pairs fill half of each); 69 KiB, still three CTAs per SM (registers bound them).
template <bool BF>
__global__ void __launch_bounds__(kThreads, 3) wu_mma_kernel(Tok q, Tok k, Tok v, Tok beta, Tok Akk, Tok gk, Tok w,
                                                             Tok u, Tok kg, Tok qg, Layout L, int G, int staged) {
  extern __shared__ float smem[];
  const ChunkPos c = la::sm80::chunk_pos(L, blockIdx.x);
  if (c.len == 0) return;
  const int hv = blockIdx.y;
  wu_chunk<BF>(smem, q, k, v, beta, Akk, gk, w, u, kg, qg, c, hv, hv / G, staged);
}

// True when kda_recompute_w_u can take wu_mma_kernel (see there).
bool wu_mma_ok(const Context& ctx, const KdaRecomputeWUFwdArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.k.dtype();
  if (a.Akk.size(3) != kMaxBT || a.k.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, wu16::kSmem, "kda_recompute_w_u")) return false;
  for (const TensorView* t : {&a.k, &a.v, &a.Akk})
    if (!tok16_ok(*t, dt)) return false;
  if (a.q.defined() && !tok16_ok(a.q, dt)) return false;
  if (!tok32_ok(a.gk)) return false;
  for (const TensorView* t : {&a.w, &a.u, &a.kg})
    if (!out2_ok(*t)) return false;
  return !a.qg.defined() || out2_ok(a.qg);
}

// wu_mma_kernel's `staged` stores: W, U, kg (and qg) all 16-bit of the inputs' type with 16-byte
// aligned rows.
bool wu_staged_ok(const KdaRecomputeWUFwdArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.k.dtype();
  return staged_out_ok(a.w, a.u, dt) && staged_out_ok(a.kg, a.qg.defined() ? a.qg : a.kg, dt);
}

void wu_fwd(const Context& ctx, const KdaRecomputeWUFwdArgs& a) {
  const char* op = "kda_recompute_w_u";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.k.size(0), T = a.k.size(1), H = a.k.size(2), K = a.k.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3), BT = a.Akk.size(3);
  const Layout L = layout_of(B, T, BT, a.cu_seqlens, a.chunk_indices, TensorView(), a.k.dtype());
  const int64_t NT = num_chunks(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || HV == 0) return;
  FUSEDOPS_REQUIRE(HV <= 65535, kValue, op, "too many value heads: ", HV);
  if (wu_mma_ok(ctx, a)) {
    auto k16 = a.k.dtype() == DType::kBFloat16 ? wu_mma_kernel<true> : wu_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(k16), ctx.device.index, wu16::kSmem);
    trace_kernel("wu_mma_kernel");
    k16<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, wu16::kSmem, stream_of(ctx)>>>(
        tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.Akk), tok_of(a.gk), tok_of(a.w),
        tok_of(a.u), tok_of(a.kg), tok_of(a.qg), L, static_cast<int>(HV / H),
        wu_staged_ok(a) ? 1 : 0);
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  trace_kernel("wu_kernel");
  wu_kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, 0, stream_of(ctx)>>>(
      tok_of(a.q), tok_of(a.k), tok_of(a.v), tok_of(a.beta), tok_of(a.Akk), tok_of(a.gk), tok_of(a.w),
      tok_of(a.u), tok_of(a.kg), tok_of(a.qg), L, static_cast<int>(K), static_cast<int>(V),
      static_cast<int>(HV / H));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// chunk_kda_fwd_o: CTA per (chunk, value head). P = lower(Aqk) staged once; per 64-column V tile
// O = qg S (64-row K slices of the snapshot), then O = scale O + P Vnew. Dynamic shared memory
// 4 x [64][69] fp32 = 66.6 KB.

constexpr size_t kFourTiles = sizeof(float) * 4 * kMaxBT * kLd;

__global__ void __launch_bounds__(kThreads) fwd_o_kernel(Tok qg, Tok Aqk, Tok v, Mat h, Tok o, Layout L, int K,
                                                         int V, int HV, float scale) {
  extern __shared__ float smem[];
  float* Qa = smem;
  float* Sb = Qa + kMaxBT * kLd;
  float* P = Sb + kMaxBT * kLd;
  float* O = P + kMaxBT * kLd;
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hv = blockIdx.y, len = c.len;
  if (len == 0) return;
  load_tri(P, Aqk, c.b, c.t0, hv, len, L.BT, false);
  const int64_t sidx = chunk * HV + hv;
  for (int x0 = 0; x0 < V; x0 += 64) {
    const int vt = imin(64, V - x0);
    __syncthreads();
    fill(O, kMaxBT * kLd, 0.0f);
    for (int y0 = 0; y0 < K; y0 += 64) {
      __syncthreads();
      load_tile(Qa, kLd, kMaxBT, 64, qg, c.b, c.t0, hv, len, y0, K);
      load_state(Sb, kLd, 64, 64, h, sidx, K, V, y0, x0);
      __syncthreads();
      mm(L.tc, len, vt, imin(64, K - y0), Qa, kLd, 1, Sb, kLd, 1, [&](int m, int n, float val) { O[m * kLd + n] += val; });
    }
    __syncthreads();
    load_tile(Sb, kLd, kMaxBT, 64, v, c.b, c.t0, hv, len, x0, V);
    __syncthreads();
    mm(L.tc, len, vt, len, P, kLd, 1, Sb, kLd, 1,
       [&](int m, int n, float val) { O[m * kLd + n] = fmaf(scale, O[m * kLd + n], val); });
    __syncthreads();
    store_tile(O, kLd, len, vt, o, c.b, c.t0, hv, x0);
  }
}

// chunk_kda_fwd_o on 16-bit tensor cores (K = V = 128, chunk 64; qg, Aqk, v, h and o bf16 or
// fp16 alike, 16-byte aligned rows): CTA of 8 warps
// per (chunk, value head), Qg, the snapshot S, Aqk and Vnew staged once by cp.async (77 KiB, two
// CTAs per SM); O = scale (Qg S) + (M>= . Aqk) Vnew on m16n8k16 mma, warp w owning rows
// 16 (w % 4).. and columns 64 (w / 4).. of O.
namespace o16 {
using namespace la::sm80::mma16;
constexpr size_t kSmem = 2 * (2 * static_cast<size_t>(kTok) + kSt + kMaxBT * kLdA);
}  // namespace o16

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) fwd_o_mma_kernel(Tok qg, Tok Aqk, Tok v, Mat h, Tok o, Layout L, int HV,
                                                                float scale) {
  using namespace la::sm80;
  using namespace la::sm80::mma16;
  extern __shared__ float smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Vs = Qs + kTok;
  uint16_t* Ss = Vs + kTok;
  uint16_t* Ps = Ss + kSt;
  const int64_t chunk = blockIdx.x;
  const ChunkPos c = chunk_pos(L, chunk);
  const int hv = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2);
  const int r0 = wm + (lane >> 2);
  load_rows(Qs, kLdT, qg, c.b, c.t0, hv, len, kD / 8);
  load_rows(Vs, kLdT, v, c.b, c.t0, hv, len, kD / 8);
  load_rows(Ps, kLdA, Aqk, c.b, c.t0, hv, len, kMaxBT / 8);
  load_state16(Ss, h, chunk * HV + hv);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int e = tid; e < kMaxBT * kMaxBT; e += kThreads) {
    const int i = e >> 6, j = e & 63;
    if (j > i) Ps[i * kLdA + j] = uint16_t{0};
  }
  float acc[8][4];
  zero(acc);
  mm_xs<BF, 8>(acc, Qs, kLdT, Ss, kLdT, wm, wn, 0, kD, lane);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] *= scale;
  __syncthreads();  // P masked
  mm_xs<BF, 8>(acc, Ps, kLdA, Vs, kLdT, wm, wn, 0, wm + 16, lane);
  store_rows2(acc, o, c.b, c.t0, hv, r0, wn, tq, len);
}

bool fwd_o_mma_ok(const Context& ctx, const ChunkKdaFwdOArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.v.dtype();
  if (a.Aqk.size(3) != kMaxBT || a.qg.size(3) != kD || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, o16::kSmem, "chunk_kda_fwd_o")) return false;
  for (const TensorView* t : {&a.qg, &a.Aqk, &a.v})
    if (!tok16_ok(*t, dt)) return false;
  return state16_ok(a.h, dt) && out2_ok(a.o);
}

void fwd_o(const Context& ctx, const ChunkKdaFwdOArgs& a) {
  const char* op = "chunk_kda_fwd_o";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.v.size(0), T = a.v.size(1), HV = a.v.size(2), V = a.v.size(3), K = a.qg.size(3);
  const int64_t BT = a.Aqk.size(3);
  const Layout L = layout_of(B, T, BT, a.cu_seqlens, a.chunk_indices, TensorView(), a.v.dtype());
  const int64_t NT = num_chunks(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || HV == 0) return;
  FUSEDOPS_REQUIRE(HV <= 65535, kValue, op, "too many value heads: ", HV);
  if (fwd_o_mma_ok(ctx, a)) {
    auto k16 = a.v.dtype() == DType::kBFloat16 ? fwd_o_mma_kernel<true> : fwd_o_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(k16), ctx.device.index, o16::kSmem);
    trace_kernel("fwd_o_mma_kernel");
    k16<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, o16::kSmem, stream_of(ctx)>>>(
        tok_of(a.qg), tok_of(a.Aqk), tok_of(a.v), mat_of(a.h), tok_of(a.o), L, static_cast<int>(HV),
        static_cast<float>(a.scale));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  auto kernel = fwd_o_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kFourTiles);
  trace_kernel("fwd_o_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, kFourTiles, stream_of(ctx)>>>(
      tok_of(a.qg), tok_of(a.Aqk), tok_of(a.v), mat_of(a.h), tok_of(a.o), L, static_cast<int>(K),
      static_cast<int>(V), static_cast<int>(HV), static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// chunk_kda_bwd_dAv: CTA per (chunk, value head). P = lower(Aqk); per 64-column V slice
// D += dO Vnew^T and dv = P^T dO (stored per slice); then dAqk = scale M>= . D. Dynamic shared
// memory 4 x [64][69] fp32 = 66.6 KB.

__global__ void __launch_bounds__(kThreads, 2) dav_kernel(Tok Aqk, Tok v, Tok dout, Tok dA, Tok dv, Layout L, int V,
                                                       float scale) {
  extern __shared__ float smem[];
  float* P = smem;
  float* D = P + kMaxBT * kLd;
  float* dOs = D + kMaxBT * kLd;
  float* Vs = dOs + kMaxBT * kLd;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, len = c.len, BT = L.BT;
  if (len == 0) return;
  load_tri(P, Aqk, c.b, c.t0, hv, len, L.BT, false);
  fill(D, kMaxBT * kLd, 0.0f);
  for (int x0 = 0; x0 < V; x0 += 64) {
    const int vw = imin(64, V - x0);
    __syncthreads();
    load_tile(dOs, kLd, kMaxBT, 64, dout, c.b, c.t0, hv, len, x0, V);
    load_tile(Vs, kLd, kMaxBT, 64, v, c.b, c.t0, hv, len, x0, V);
    __syncthreads();
    mm(L.tc, len, len, vw, dOs, kLd, 1, Vs, 1, kLd, [&](int m, int n, float val) { D[m * kLd + n] += val; });
    mm(L.tc, len, vw, len, P, 1, kLd, dOs, kLd, 1, [&](int m, int n, float val) { dv.st_(c.b, c.t0 + m, hv, x0 + n, val); });
  }
  __syncthreads();
  for (int e = threadIdx.x; e < len * BT; e += blockDim.x) {
    const int i = e / BT, j = e - i * BT;
    dA.st_(c.b, c.t0 + i, hv, j, (j <= i) ? scale * D[i * kLd + j] : 0.0f);
  }
}

// chunk_kda_bwd_dAv on 16-bit tensor cores (V = 128, chunk 64; Aqk, v, dout and dv bf16 or fp16
// alike, 16-byte aligned rows): CTA of 8 warps per (chunk, value head), Aqk, Vnew and dO staged
// once by cp.async (43 KiB); D = dO Vnew^T (tiles above the diagonal skipped) -> dAqk = scale M>= .
// D, and dv = (M>= . Aqk)^T dO with the transposed operand read by ldmatrix.trans.
namespace dav16 {
using namespace la::sm80::mma16;
constexpr size_t kSmem = 2 * (2 * static_cast<size_t>(kTok) + kMaxBT * kLdA);
}  // namespace dav16

template <bool BF>
__global__ void __launch_bounds__(kThreads, 2) dav_mma_kernel(Tok Aqk, Tok v, Tok dout, Tok dA, Tok dv, Layout L,
                                                              float scale) {
  using namespace la::sm80;
  using namespace la::sm80::mma16;
  extern __shared__ float smem[];
  uint16_t* dOs = reinterpret_cast<uint16_t*>(smem);
  uint16_t* Vs = dOs + kTok;
  uint16_t* Ps = Vs + kTok;
  const ChunkPos c = chunk_pos(L, blockIdx.x);
  const int hv = blockIdx.y, len = c.len, tid = threadIdx.x;
  if (len == 0) return;
  const int warp = tid >> 5, lane = tid & 31, tq = lane & 3;
  const int wm = 16 * (warp & 3), wn = 64 * (warp >> 2), wn2 = 32 * (warp >> 2);
  const int r0 = wm + (lane >> 2), r1 = r0 + 8;
  load_rows(dOs, kLdT, dout, c.b, c.t0, hv, len, kD / 8);
  load_rows(Vs, kLdT, v, c.b, c.t0, hv, len, kD / 8);
  load_rows(Ps, kLdA, Aqk, c.b, c.t0, hv, len, kMaxBT / 8);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int e = tid; e < kMaxBT * kMaxBT; e += kThreads) {
    const int i = e >> 6, j = e & 63;
    if (j > i) Ps[i * kLdA + j] = uint16_t{0};
  }
  {
    float da[4][4];
    zero(da);
    if (wn2 <= wm + 15) mm_xyt<BF, 4>(da, dOs, kLdT, Vs, kLdT, wm, wn2, kD, lane);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = hr ? r1 : r0, col = wn2 + 8 * j + 2 * tq;
        if (r >= len) continue;
        st2(dA.p, dA.code, dA.off(c.b, c.t0 + r, hv) + col, col <= r ? scale * da[j][2 * hr] : 0.0f,
            col + 1 <= r ? scale * da[j][2 * hr + 1] : 0.0f);
      }
  }
  __syncthreads();  // P masked
  float acc[8][4];
  zero(acc);
  mm_xts<BF, 8>(acc, Ps, kLdA, dOs, kLdT, wm, wn, wm, kMaxBT, lane);
  store_rows2(acc, dv, c.b, c.t0, hv, r0, wn, tq, len);
}

bool dav_mma_ok(const Context& ctx, const ChunkKdaBwdDAvArgs& a) {
  using namespace la::sm80::mma16;
  const DType dt = a.v.dtype();
  if (a.Aqk.size(3) != kMaxBT || a.v.size(3) != kD) return false;
  if (!tc16_device_ok(ctx, dt, dav16::kSmem, "chunk_kda_bwd_dAv")) return false;
  for (const TensorView* t : {&a.Aqk, &a.v, &a.dout})
    if (!tok16_ok(*t, dt)) return false;
  return out2_ok(a.dAqk) && out2_ok(a.dv);
}

void bwd_dav(const Context& ctx, const ChunkKdaBwdDAvArgs& a) {
  const char* op = "chunk_kda_bwd_dAv";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.v.size(0), T = a.v.size(1), HV = a.v.size(2), V = a.v.size(3), BT = a.Aqk.size(3);
  const Layout L = layout_of(B, T, BT, a.cu_seqlens, a.chunk_indices, TensorView(), a.v.dtype());
  const int64_t NT = num_chunks(L, a.cu_seqlens, a.chunk_indices);
  if (NT == 0 || HV == 0) return;
  FUSEDOPS_REQUIRE(HV <= 65535, kValue, op, "too many value heads: ", HV);
  if (dav_mma_ok(ctx, a)) {
    auto k16 = a.v.dtype() == DType::kBFloat16 ? dav_mma_kernel<true> : dav_mma_kernel<false>;
    allow_smem(op, reinterpret_cast<const void*>(k16), ctx.device.index, dav16::kSmem);
    trace_kernel("dav_mma_kernel");
    k16<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, dav16::kSmem, stream_of(ctx)>>>(
        tok_of(a.Aqk), tok_of(a.v), tok_of(a.dout), tok_of(a.dAqk), tok_of(a.dv), L, static_cast<float>(a.scale));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
    return;
  }
  auto kernel = dav_kernel;
  allow_smem(op, reinterpret_cast<const void*>(kernel), ctx.device.index, kFourTiles);
  trace_kernel("dav_kernel");
  kernel<<<dim3(static_cast<unsigned>(NT), static_cast<unsigned>(HV)), kThreads, kFourTiles, stream_of(ctx)>>>(
      tok_of(a.Aqk), tok_of(a.v), tok_of(a.dout), tok_of(a.dAqk), tok_of(a.dv), L, static_cast<int>(V),
      static_cast<float>(a.scale));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// ---------------------------------------------------------------------------------------------
// kda_gate forward / backward. The element-wise parts run one thread per element of [B,T,HV,K]
// (grid-stride, int64 indices); the parameter sums (dA_log, ddt_bias) run one CTA per value head,
// thread c owning channels c, c + 256, ... and summing over the tokens in order in double; dA_log
// is then summed over the threads in index order.

struct GateP {
  const void* A = nullptr;
  int ac = 0;
  const void* bias = nullptr;
  int bc = 0;
  int has_lb = 0;
  float lb = 0.0f;
};

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float gate_a(const GateP& P, int hv) { return P.A ? expf(ldf(P.A, P.ac, hv)) : 1.0f; }

// f(b, t, hv, c) over every element of a [B,T,HV,K] gate: batch rows over y (strided past the
// grid's limit), the T*HV*K elements of a row over x.
template <class F>
__device__ __forceinline__ void for_each_gate_element(int64_t B, int64_t T, int HV, int K, F f) {
  const int64_t per = T * HV * K;
  for (int64_t b = blockIdx.y; b < B; b += gridDim.y)
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < per;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t r = e / K;
      const int64_t t = r / HV;
      f(b, t, static_cast<int>(r - t * HV), static_cast<int>(e - r * K));
    }
}

__device__ __forceinline__ float gate_bias(const GateP& P, int hv, int K, int c) {
  return P.bias ? ldf(P.bias, P.bc, static_cast<int64_t>(hv) * K + c) : 0.0f;
}

__global__ void gate_fwd_kernel(Tok g, Tok y, GateP P, int64_t B, int64_t T, int HV, int K) {
  for_each_gate_element(B, T, HV, K, [&](int64_t b, int64_t t, int hv, int c) {
    const float x = g.ld(b, t, hv, c) + gate_bias(P, hv, K, c);
    const float a = gate_a(P, hv);
    y.st_(b, t, hv, c, P.has_lb ? P.lb * sigmoid_f(a * x) : -a * softplus_f(x));
  });
}

// dx for one element and its dA_log term.
struct GateD {
  float dx, da;
};
__device__ __forceinline__ GateD gate_dx(const GateP& P, float a, float z, float d) {
  GateD r;
  if (P.has_lb) {
    const float sg = sigmoid_f(a * z);
    r.dx = d * P.lb * sg * (1.0f - sg) * a;
    r.da = r.dx * z;
  } else {
    r.da = d * (-a * softplus_f(z));
    r.dx = -a * sigmoid_f(z) * d;
  }
  return r;
}

__global__ void gate_bwd_kernel(Tok g, Tok dy, Tok dg, GateP P, int64_t B, int64_t T, int HV, int K) {
  for_each_gate_element(B, T, HV, K, [&](int64_t b, int64_t t, int hv, int c) {
    const float z = g.ld(b, t, hv, c) + gate_bias(P, hv, K, c);
    dg.st_(b, t, hv, c, gate_dx(P, gate_a(P, hv), z, dy.ld(b, t, hv, c)).dx);
  });
}

__global__ void __launch_bounds__(kThreads) gate_param_kernel(Tok g, Tok dy, GateP P, int64_t B, int64_t T, int K,
                                                              void* dA, int dAc, void* db, int dbc) {
  __shared__ double red[kThreads];
  const int hv = blockIdx.x;
  const float a = gate_a(P, hv);
  double sa = 0.0;
  for (int c = threadIdx.x; c < K; c += blockDim.x) {
    const float bias = gate_bias(P, hv, K, c);
    double sb = 0.0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float z = g.ld(b, t, hv, c) + bias;
        const GateD r = gate_dx(P, a, z, dy.ld(b, t, hv, c));
        sb += r.dx;
        sa += r.da;
      }
    if (db) stf(db, dbc, static_cast<int64_t>(hv) * K + c, static_cast<float>(sb));
  }
  red[threadIdx.x] = sa;
  __syncthreads();
  if (threadIdx.x == 0 && dA) {
    double s = 0.0;
    for (int i = 0; i < kThreads; ++i) s += red[i];
    stf(dA, dAc, hv, static_cast<float>(s));
  }
}

GateP gate_params(const TensorView& A_log, const TensorView& dt_bias, bool has_lb, double lb) {
  GateP P;
  if (A_log.defined() && A_log.numel()) {
    P.A = A_log.data();
    P.ac = code_of(A_log.dtype());
  }
  if (dt_bias.defined() && dt_bias.numel()) {
    P.bias = dt_bias.data();
    P.bc = code_of(dt_bias.dtype());
  }
  P.has_lb = has_lb ? 1 : 0;
  P.lb = static_cast<float>(lb);
  return P;
}

void gate_fwd(const Context& ctx, const KdaGateFwdArgs& a) {
  const char* op = "kda_gate";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.g.size(0), T = a.g.size(1), HV = a.g.size(2), K = a.g.size(3);
  if (B * T * HV * K == 0) return;
  trace_kernel("gate_fwd_kernel");
  // Batch rows past the grid's y limit are strided over it in the kernel.
  gate_fwd_kernel<<<dim3(elem_blocks(T * HV * K), static_cast<unsigned>(std::min<int64_t>(B, 65535))), kThreads, 0,
                    stream_of(ctx)>>>(tok_of(a.g), tok_of(a.y),
                                      gate_params(a.A_log, a.dt_bias, a.has_lower_bound, a.lower_bound), B, T,
                                      static_cast<int>(HV), static_cast<int>(K));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void gate_bwd(const Context& ctx, const KdaGateBwdArgs& a) {
  const char* op = "kda_gate";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.g.size(0), T = a.g.size(1), HV = a.g.size(2), K = a.g.size(3);
  const GateP P = gate_params(a.A_log, a.dt_bias, a.has_lower_bound, a.lower_bound);
  void* dA = a.dA_log.defined() && a.dA_log.numel() ? a.dA_log.data() : nullptr;
  void* db = a.ddt_bias.defined() && a.ddt_bias.numel() ? a.ddt_bias.data() : nullptr;
  if (B * T * HV * K > 0) {
    trace_kernel("gate_bwd_kernel");
    gate_bwd_kernel<<<dim3(elem_blocks(T * HV * K), static_cast<unsigned>(std::min<int64_t>(B, 65535))), kThreads, 0,
                      stream_of(ctx)>>>(tok_of(a.g), tok_of(a.dy), tok_of(a.dg), P, B, T, static_cast<int>(HV),
                                        static_cast<int>(K));
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  }
  if (HV > 0 && (dA || db)) {
    trace_kernel("gate_param_kernel");
    gate_param_kernel<<<static_cast<unsigned>(HV), kThreads, 0, stream_of(ctx)>>>(
        tok_of(a.g), tok_of(a.dy), P, B, T, static_cast<int>(K), dA, dA ? code_of(a.dA_log.dtype()) : 0, db,
        db ? code_of(a.ddt_bias.dtype()) : 0);
    FUSEDOPS_CUDA_LAUNCH_CHECK(op);
  }
}

// fused_recurrent_kda (forward): the shared recurrent kernel in KDA's gate form.
void recurrent_fwd(const Context& ctx, const FusedRecurrentKdaFwdArgs& a) { la::sm80::recurrent_fwd(ctx, a, true); }

bool state_out_fused(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const ChunkKdaFwdOArgs& b) {
  return b.Aqk.defined() && la::sm80::state_out_fused(ctx, a, b.qg, b.Aqk, b.o, b.Aqk.size(3), b.scale);
}

void top_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  compose_fwd(with_backend(ctx, "cuda_sm80"), a, fwd_fusions());
}

// ---------------------------------------------------------------------------------------------
// supports(): no float64 anywhere; K <= 256 where a kernel keeps K-long rows on chip (recurrent
// registers, the gated_delta_rule state kernels of the top level).

using la::sm80::no_f64;

bool sup_intra(const ChunkKdaFwdIntraArgs& a) {
  return no_f64({&a.q, &a.k, &a.gk, &a.beta, &a.Aqk, &a.Akk}) && a.chunk_size <= kMaxBT;
}
bool sup_wu(const KdaRecomputeWUFwdArgs& a) {
  return no_f64({&a.q, &a.k, &a.v, &a.beta, &a.Akk, &a.gk, &a.w, &a.u, &a.kg, &a.qg}) && a.Akk.size(-1) <= kMaxBT;
}
bool sup_o(const ChunkKdaFwdOArgs& a) {
  return no_f64({&a.qg, &a.Aqk, &a.v, &a.h, &a.o}) && a.Aqk.size(-1) <= kMaxBT;
}
bool sup_dav(const ChunkKdaBwdDAvArgs& a) {
  return no_f64({&a.Aqk, &a.v, &a.dout, &a.dAqk, &a.dv}) && a.Aqk.size(-1) <= kMaxBT;
}
bool sup_gate(const KdaGateFwdArgs& a) { return no_f64({&a.g, &a.A_log, &a.dt_bias, &a.y}); }
bool sup_gate_bwd(const KdaGateBwdArgs& a) {
  return no_f64({&a.g, &a.A_log, &a.dt_bias, &a.dy, &a.dg, &a.dA_log, &a.ddt_bias});
}
bool sup_rec(const FusedRecurrentKdaFwdArgs& a) { return la::sm80::recurrent_fwd_supported(a); }
bool sup_top(const ChunkKdaFwdArgs& a) {
  return la::no_float64(a, {&a.Aqk, &a.Akk}) &&
         a.q.size(-1) <= 256;
}

}  // namespace

FwdFusions fwd_fusions() { return {state_out_fused, cumsum_intra_fused, cumsum_intra_wu_fused}; }
bool top_fwd_supported(const ChunkKdaFwdArgs& a) { return sup_top(a); }

}  // namespace fusedops::kda::sm80

namespace fusedops {

void register_kda_cuda_sm80(Registry& r) {
  using namespace kda::sm80;
  const BackendSpec s = la::sm80::spec();
  const auto F = Direction::kForward, B = Direction::kBackward;
  r.add<ChunkKdaFwdIntraArgs>("chunk_kda_fwd_intra", F, s, sup_intra, fwd_intra);
  r.add<KdaRecomputeWUFwdArgs>("kda_recompute_w_u", F, s, sup_wu, wu_fwd);
  r.add<ChunkKdaFwdOArgs>("chunk_kda_fwd_o", F, s, sup_o, fwd_o);
  r.add<ChunkKdaBwdDAvArgs>("chunk_kda_bwd_dAv", B, s, sup_dav, bwd_dav);
  r.add<KdaGateFwdArgs>("kda_gate", F, s, sup_gate, gate_fwd);
  r.add<KdaGateBwdArgs>("kda_gate", B, s, sup_gate_bwd, gate_bwd);
  r.add<FusedRecurrentKdaFwdArgs>("fused_recurrent_kda", F, s, sup_rec, recurrent_fwd);
  r.add<ChunkKdaFwdArgs>("chunk_kda", F, s, sup_top, top_fwd);
  kda::sm80::register_bwd(r);
}

}  // namespace fusedops
