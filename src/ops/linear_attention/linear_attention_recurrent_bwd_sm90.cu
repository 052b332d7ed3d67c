// The fused recurrent backward of both families (fused_recurrent_gated_delta_rule,
// fused_recurrent_kda) on Hopper, cuda_sm90 (sm_90a only): one kernel, the gate's form a template
// argument. cuda_sm80's kernels (one per family) give a CTA a whole [K, V] state and its gradient
// in shared memory, ~194 KiB at K = V = 128, so one CTA runs per SM and each phase of a token
// waits for the one before. Here the state is split by 32-column V tiles as in the recurrent
// forward (linear_attention_fwd_sm80.cu, recurrent_fwd_kernel: the same lane layout, W warps, lane l
// holding columns 4 (l & 7) .. + 3 of the rows 4 w + (l >> 3) + 4 W i, i < 8), with the state S and
// its gradient dS in registers: several CTAs per SM, each one's loads overlapping another's work.
//
// Every column of the recurrence is independent; only the gradients of the per-row and per-token
// inputs (dq, dk, KDA's dg: sums over the columns; GDN's dg and dbeta: sums over everything) need
// the other tiles. The V tiles of one (sequence, q/k head) are one thread-block cluster: per token
// each CTA writes its partial sums into shared memory (two buffers, by token parity), the cluster
// synchronises, and CTA r sums elements e = r mod (tiles) over the cluster's CTAs in rank order
// through distributed shared memory: the same order on every run (deterministic), no workspace.
//
// Per token (reverse), with St = diag(a) S (GDN: a S, a scalar) the decayed state before it:
//   p = St^T k; delta = beta (v - p); dq = scale (St + k delta^T) dO; dS += scale q dO^T;
//   dk = dS delta; dd = dS^T k; dv = beta dd; dbeta = dd . (v - p); dp = -beta dd;
//   D = dS + k dp^T; dk += St dp; dg = rowsum(St . D) (GDN: its total); dS = diag(a) D.
// The state before each token is recomputed from a checkpoint at the start of the token's segment of
// kSeg = 16 tokens (each thread's own 32 values in shared memory). The checkpoints past the first
// segment come from the call's workspace (la_top.h, recurrent_bwd_workspace_size), written by one
// forward sweep over the sequence before the reverse one: about T (2 + kSeg / 2) token steps in all,
// against T (1 + 64 / 2) + T^2 / 128 for cuda_sm80's kernels, which recompute every 64-token
// checkpoint from h0 and have no workspace. The value heads of a
// q/k head run one after another in the CTA; dq and dk add up over them in head order (the element's
// owner rank and thread are the same for every head).
//
// register_linear_attention_cuda_sm90 registers both per-token ops under cuda_sm90: this backward and
// cuda_sm80's forward kernel (so that a caller naming the backend gets both directions). The CPU
// emulation (cpu_emulation/) runs one block at a time and has no clusters: it leaves this file out.
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>

#include "fusedops/core/registry.h"
#include "fusedops/core/trace.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "fusedops/ops/kda.h"
#include "fusedops/ops/linear_attention.h"
#include "src/cuda/check.cuh"
#include "src/ops/linear_attention/la_top.h"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/linear_attention/la_sm80.cuh"

namespace fusedops::la::sm90 {
namespace {

namespace cg = cooperative_groups;
using sm80::code_of;
using sm80::kF32;
using sm80::Layout;
using sm80::ldf;
using sm80::Mat;
using sm80::seq_pos;
using sm80::SeqPos;
using sm80::stf;
using sm80::Tok;

constexpr int kSeg = static_cast<int>(kRecurrentBwdSegment);  // tokens per checkpoint segment
constexpr int kR = 8;         // state rows per thread (four columns each)
constexpr int kMaxTiles = 8;  // V tiles per cluster (the portable cluster size): V <= 256

struct RecBwd {
  Tok q, k, v, g, beta, dO, dq, dk, dv, dg, dbeta;
  Mat h0, dht, dh0;
  Mat ckpt;  // the workspace: fp32 [slots, HV, K, V] checkpoint states (null when no sequence passes kSeg tokens)
  Layout L;
  int K, V, H, G;
  unsigned NH;  // sequences x q/k heads
  float scale;
};

template <int W, bool KDA, bool VEC>
__global__ void __launch_bounds__(32 * W, W == 4 ? 4 : 2) recurrent_bwd_kernel(RecBwd p) {
  constexpr int KM = 32 * W;
  // Partial sums of one token: dq rows, dk rows, KDA's dg rows, GDN's dg per warp, dbeta.
  constexpr int kDq = 0, kDk = KM, kDg = 2 * KM, kDgW = 3 * KM, kDb = 3 * KM + W, kPart = 3 * KM + W + 1;
  __shared__ float ks[KM], qs[KM], as[KDA ? KM : 1], gb[2];
  __shared__ __align__(16) float vs[32], dos[32], red[2][W][32];
  __shared__ float part[2][kPart];
  __shared__ float ck[kR * 4 * 32 * W];  // the segment's checkpoint: thread t's value (i, j) at (4 i + j) blockDim + t
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned nh = blockIdx.z * gridDim.y + blockIdx.y;
  if (nh >= p.NH) return;  // the whole cluster (its CTAs share nh)
  const int nt = static_cast<int>(gridDim.x), vt = static_cast<int>(blockIdx.x);
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t n = nh / p.H;
  const int hk = static_cast<int>(nh % p.H), HV = p.H * p.G, K = p.K, V = p.V;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, c4 = lane & 7;
  const int y0 = 4 * warp + (lane >> 3), x = vt * 32 + 4 * c4;
  const SeqPos s = seq_pos(p.L, n);
  const int64_t Ln = s.len;
  // Rows K .. KM - 1 of k, q (0) and the gate (1) are set once and stay finite; every sum below
  // leaves those rows out.
  for (int e = tid; e < KM; e += blockDim.x) {
    ks[e] = 0.0f;
    qs[e] = 0.0f;
    if constexpr (KDA) as[e] = 1.0f;
  }
  // Rows past K and columns past V are left out of every sum (not only zero there): a NaN or Inf
  // input (an Inf in q times a padded zero of dO) must not reach the real elements through them.
  bool rv[kR], cv[4];
#pragma unroll
  for (int r = 0; r < kR; ++r) rv[r] = y0 + 4 * W * r < K;
#pragma unroll
  for (int j = 0; j < 4; ++j) cv[j] = x + j < V;
  float S[kR][4], dS[kR][4];

  auto ld_tile = [&](const Mat& m, int64_t base, float (&st)[kR][4]) {
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int y = y0 + 4 * W * i;
      const int64_t e = base + static_cast<int64_t>(y) * V;
      if constexpr (VEC) {
        if (m.p && y < K && x < V) {
          const float4 t = *reinterpret_cast<const float4*>(static_cast<const float*>(m.p) + e);
          st[i][0] = t.x, st[i][1] = t.y, st[i][2] = t.z, st[i][3] = t.w;
        } else {
          st[i][0] = st[i][1] = st[i][2] = st[i][3] = 0.0f;
        }
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) st[i][j] = (m.p && y < K && x + j < V) ? ldf(m.p, m.code, e + j) : 0.0f;
      }
    }
  };
  // This thread's elements of st into m (fp32) at base, as ld_tile reads them: a thread reads back
  // only what it wrote itself.
  auto st_tile = [&](const Mat& m, int64_t base, const float (&st)[kR][4]) {
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int y = y0 + 4 * W * i;
      if (y >= K) continue;
      const int64_t e = base + static_cast<int64_t>(y) * V;
      if constexpr (VEC) {
        if (x < V)
          *reinterpret_cast<float4*>(static_cast<float*>(m.p) + e) = make_float4(st[i][0], st[i][1], st[i][2], st[i][3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (x + j < V) stf(m.p, m.code, e + j, st[i][j]);
      }
    }
  };
  // Where the checkpoint before token i0 (a multiple of kSeg, > 0) of value head hv lives: slot
  // (packed index of the token) / kSeg.
  auto ckpt_base = [&](int64_t i0, int hv) {
    const int64_t slot = (s.b * p.L.T + s.t0 + i0) / kSeg;
    return (slot * HV + hv) * static_cast<int64_t>(K) * V + x;
  };
  // Token t's k (and q, dO), KDA's gate, the V tile, beta and GDN's gate. Starts and ends with a barrier.
  auto ld_token = [&](int64_t i, int hv, bool out) {
    const int64_t t = s.t0 + i;
    __syncthreads();
    for (int e = tid; e < K; e += blockDim.x) {
      ks[e] = p.k.ld(s.b, t, hk, e);
      if (out) qs[e] = p.q.ld(s.b, t, hk, e);
      if constexpr (KDA) as[e] = p.g.p ? expf(p.g.ld(s.b, t, hv, e)) : 1.0f;
    }
    if (tid < 32) {
      const int xl = vt * 32 + tid;
      vs[tid] = xl < V ? p.v.ld(s.b, t, hv, xl) : 0.0f;
      if (out) dos[tid] = xl < V ? p.dO.ld(s.b, t, hv, xl) : 0.0f;
    } else if (tid == 32) {
      gb[0] = (!KDA && p.g.p) ? expf(p.g.ld(s.b, t, hv, 0)) : 1.0f;
      gb[1] = p.beta.p ? p.beta.ld(s.b, t, hv, 0) : 1.0f;
    }
    __syncthreads();
  };
  // c (this thread's sums over its rows, four columns) summed over all rows of the tile: the lanes
  // of a column (xor 8, 16), then the warps in order through red[slot].
  auto colsum = [&](float (&c)[4], int slot) {
#pragma unroll
    for (int m = 8; m < 32; m <<= 1)
#pragma unroll
      for (int j = 0; j < 4; ++j) c[j] += __shfl_xor_sync(0xffffffffu, c[j], m);
    if (lane < 8) reinterpret_cast<float4*>(red[slot][warp])[c4] = make_float4(c[0], c[1], c[2], c[3]);
    __syncthreads();
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < W; ++w) {
      const float4 r = reinterpret_cast<const float4*>(red[slot][w])[c4];
      a.x += r.x, a.y += r.y, a.z += r.z, a.w += r.w;
    }
    c[0] = a.x, c[1] = a.y, c[2] = a.z, c[3] = a.w;
  };
  // The sum over a row's 32 columns (the 8 lanes of the row: xor 1, 2, 4).
  auto rowsum = [&](float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
  };
  // One forward step of the recurrence on S (the forward kernel's arithmetic, in its order).
  auto step = [&](int64_t i, int hv) {
    ld_token(i, hv, false);
    float pc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int y = y0 + 4 * W * r;
      const float ky = ks[y];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (KDA) S[r][j] *= as[y];
        if (rv[r]) pc[j] = fmaf(S[r][j], ky, pc[j]);
      }
    }
    colsum(pc, 0);
    const float decay = gb[0], bt = gb[1];
#pragma unroll
    for (int j = 0; j < 4; ++j) pc[j] = bt * (vs[4 * c4 + j] - decay * pc[j]);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float ky = ks[y0 + 4 * W * r];
#pragma unroll
      for (int j = 0; j < 4; ++j) S[r][j] = KDA ? fmaf(ky, pc[j], S[r][j]) : fmaf(decay, S[r][j], ky * pc[j]);
    }
  };

  int buf = 0;
  for (int gi = 0; gi < p.G; ++gi) {
    const int hv = hk * p.G + gi;
    const int64_t base = (n * HV + hv) * static_cast<int64_t>(K) * V + x;
    ld_tile(p.dht, base, dS);
    if (Ln > kSeg) {  // the forward sweep: the state before tokens kSeg, 2 kSeg, ... into the workspace
      ld_tile(p.h0, base, S);
      const int64_t last = ((Ln - 1) / kSeg) * kSeg;  // the first token of the last segment
      for (int64_t j = 0; j < last; ++j) {
        step(j, hv);
        if ((j + 1) % kSeg == 0) st_tile(p.ckpt, ckpt_base(j + 1, hv), S);
      }
    }
    int64_t seg = -1;
    for (int64_t i = Ln - 1; i >= 0; --i) {
      const int64_t i0 = (i / kSeg) * kSeg;
      if (seg != i / kSeg) {
        if (i0 == 0)
          ld_tile(p.h0, base, S);
        else
          ld_tile(p.ckpt, ckpt_base(i0, hv), S);
        // Kept for the segment's other tokens; a segment entered at its first token (a decoding
        // step) has none, and its state loads stay in flight while the token's inputs load.
        if (i > i0) {
#pragma unroll
          for (int r = 0; r < kR; ++r)
#pragma unroll
            for (int j = 0; j < 4; ++j) ck[(4 * r + j) * blockDim.x + tid] = S[r][j];
        }
        seg = i / kSeg;
      } else {
#pragma unroll
        for (int r = 0; r < kR; ++r)
#pragma unroll
          for (int j = 0; j < 4; ++j) S[r][j] = ck[(4 * r + j) * blockDim.x + tid];
      }
      for (int64_t j = i0; j < i; ++j) step(j, hv);
      // Token i; S holds the state before it.
      ld_token(i, hv, true);
      const int64_t t = s.t0 + i;
      float pc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int y = y0 + 4 * W * r;
        const float ay = KDA ? as[y] : 1.0f, ky = ks[y];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (rv[r]) pc[j] = fmaf(ay * S[r][j], ky, pc[j]);
      }
      colsum(pc, 0);
      const float decay = gb[0], bt = gb[1];
      float pp[4], dl[4], dov[4], dd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        pp[j] = decay * pc[j];
        dl[j] = bt * (vs[4 * c4 + j] - pp[j]);
        dov[j] = dos[4 * c4 + j];
      }
      float* pt = part[buf];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int y = y0 + 4 * W * r;
        const float ay = KDA ? as[y] : decay, ky = ks[y], sq = p.scale * qs[y];
        float aq = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (cv[j]) aq = fmaf(fmaf(ky, dl[j], ay * S[r][j]), dov[j], aq);
          const float d = fmaf(sq, dov[j], dS[r][j]);
          dS[r][j] = d;
          if (rv[r]) dd[j] = fmaf(d, ky, dd[j]);
        }
        aq = rowsum(aq);
        if (c4 == 0) pt[kDq + y] = p.scale * aq;
      }
      colsum(dd, 1);
      float dp[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) dp[j] = -bt * dd[j];
      float gw = 0.0f;  // GDN: this thread's sum of St . D
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        const int y = y0 + 4 * W * r;
        const float ay = KDA ? as[y] : decay, ky = ks[y];
        float ak = 0.0f, a2 = 0.0f, ag = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float st = ay * S[r][j];
          const float d = fmaf(ky, dp[j], dS[r][j]);
          if (cv[j]) {
            ak = fmaf(dS[r][j], dl[j], ak);
            a2 = fmaf(st, dp[j], a2);
            ag = fmaf(st, d, ag);
          }
          dS[r][j] = ay * d;
        }
        const float dkr = rowsum(ak) + rowsum(a2);
        if (c4 == 0) pt[kDk + y] = dkr;
        if constexpr (KDA) {
          ag = rowsum(ag);
          if (c4 == 0) pt[kDg + y] = ag;
        } else if (rv[r]) {
          gw += ag;
        }
      }
      if constexpr (!KDA) {
#pragma unroll
        for (int m = 1; m < 32; m <<= 1) gw += __shfl_xor_sync(0xffffffffu, gw, m);
        if (lane == 0) pt[kDgW + warp] = gw;
      }
      if (warp == 0) {
        // Every lane of a column holds its sums: lanes 0-7 cover the tile's 32 columns.
        float tb = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (cv[j]) tb = fmaf(dd[j], vs[4 * c4 + j] - pp[j], tb);
        tb = rowsum(tb);
        if (lane == 0) pt[kDb] = tb;
        if (lane < 8) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (x + j < V) p.dv.st_(s.b, t, hv, x + j, bt * dd[j]);
        }
      }
      cluster.sync();  // every CTA's partial sums of token i written (release / acquire)
      {
        const int rows = KDA ? 3 : 2;
        for (int e = rank + nt * tid; e < rows * K; e += nt * static_cast<int>(blockDim.x)) {
          const int sec = e / K, y = e - sec * K;
          float a = 0.0f;
          for (int r = 0; r < nt; ++r) a += cluster.map_shared_rank(pt, r)[sec * KM + y];
          if (sec == 0) {
            p.dq.st_(s.b, t, hk, y, gi > 0 ? p.dq.ld(s.b, t, hk, y) + a : a);
          } else if (sec == 1) {
            p.dk.st_(s.b, t, hk, y, gi > 0 ? p.dk.ld(s.b, t, hk, y) + a : a);
          } else if (p.dg.p) {
            p.dg.st_(s.b, t, hv, y, a);
          }
        }
        if (rank == nt - 1 && tid == 0) {
          if (!KDA && p.dg.p) {
            double a = 0.0;
            for (int r = 0; r < nt; ++r) {
              const float* rp = cluster.map_shared_rank(pt, r);
              for (int w = 0; w < W; ++w) a += static_cast<double>(rp[kDgW + w]);
            }
            p.dg.st_(s.b, t, hv, 0, static_cast<float>(a));
          }
          if (p.dbeta.p) {
            double a = 0.0;
            for (int r = 0; r < nt; ++r) a += static_cast<double>(cluster.map_shared_rank(pt, r)[kDb]);
            p.dbeta.st_(s.b, t, hv, 0, static_cast<float>(a));
          }
        }
      }
      buf ^= 1;  // the next token writes the other buffer: no CTA reads this one after the next sync
    }
    if (p.dh0.p) st_tile(p.dh0, base, dS);
  }
  cluster.sync();  // no CTA leaves while a peer may still read its partial sums
}

// Whether the state tensors take float4 loads and stores: float32 (or absent), V % 4 == 0, 16-byte
// aligned.
bool vec_states(std::initializer_list<Mat> ms, int64_t V) {
  if (V % 4 != 0) return false;
  for (const Mat& m : ms)
    if (m.p && (m.code != kF32 || reinterpret_cast<uintptr_t>(m.p) % 16 != 0)) return false;
  return true;
}

template <int W, bool KDA>
auto pick(bool vec) {
  return vec ? recurrent_bwd_kernel<W, KDA, true> : recurrent_bwd_kernel<W, KDA, false>;
}

void recurrent_bwd(const Context& ctx, const LinearAttentionRecurrentBwdArgs& a, bool kda) {
  const char* op = kda ? "fused_recurrent_kda" : "fused_recurrent_gated_delta_rule";
  cuda::DeviceGuard guard(op, ctx.device.index);
  const int64_t B = a.q.size(0), T = a.q.size(1), H = a.q.size(2), K = a.q.size(3);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  const int64_t N = a.cu_seqlens.defined() ? a.cu_seqlens.size(0) - 1 : B;
  if (N * H == 0 || V == 0) return;
  const int64_t NH = N * H, tiles = (V + 31) / 32, ny = std::min<int64_t>(NH, 65535);
  FUSEDOPS_REQUIRE(NH <= 0x7fffffff && (NH + ny - 1) / ny <= 65535, kValue, op,
                   "too many (sequence, head) states: ", NH);
  RecBwd p;
  p.q = sm80::tok_of(a.q);
  p.k = sm80::tok_of(a.k);
  p.v = sm80::tok_of(a.v);
  p.g = sm80::tok_of(a.g);
  p.beta = sm80::tok_of(a.beta);
  p.dO = sm80::tok_of(a.dout);
  p.dq = sm80::tok_of(a.dq);
  p.dk = sm80::tok_of(a.dk);
  p.dv = sm80::tok_of(a.dv);
  p.dg = sm80::tok_of(a.dg);
  p.dbeta = sm80::tok_of(a.dbeta);
  p.h0 = sm80::mat_of(a.initial_state);
  p.dht = sm80::mat_of(a.dht);
  p.dh0 = sm80::mat_of(a.dh0);
  // The checkpoint states (checked by the entry point: present, 16-byte aligned, large enough
  // whenever a sequence can pass kSeg tokens).
  p.ckpt.p = a.workspace.defined() && a.workspace.numel() > 0 ? a.workspace.data() : nullptr;
  p.ckpt.code = kF32;
  p.L = sm80::layout_of(B, T, 1, a.cu_seqlens, TensorView(), TensorView(), a.q.dtype());
  p.K = static_cast<int>(K);
  p.V = static_cast<int>(V);
  p.H = static_cast<int>(H);
  p.G = static_cast<int>(HV / H);
  p.NH = static_cast<unsigned>(NH);
  p.scale = static_cast<float>(a.scale);
  const bool vec = vec_states({p.h0, p.dht, p.dh0, p.ckpt}, V), narrow = K <= 128;
  // KDA without a gate is GDN without a gate (as in the forward).
  const bool per_channel = kda && a.g.defined();
  auto kernel = per_channel ? (narrow ? pick<4, true>(vec) : pick<8, true>(vec))
                            : (narrow ? pick<4, false>(vec) : pick<8, false>(vec));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(ny), static_cast<unsigned>((NH + ny - 1) / ny));
  cfg.blockDim = dim3(narrow ? 128 : 256);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = sm80::stream_of(ctx);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(tiles);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  trace_kernel("recurrent_bwd_cluster_kernel");
  FUSEDOPS_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, p));
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

// supports(): no float64, K <= kRecMaxK, V <= 256 (eight tiles, the portable cluster size).
bool recurrent_bwd_supported(const LinearAttentionRecurrentBwdArgs& a) {
  return la::no_float64(a) && a.q.size(-1) <= sm80::kRecMaxK && a.v.size(-1) <= 32 * kMaxTiles;
}

void gdn_fwd(const Context& ctx, const FusedRecurrentGatedDeltaRuleFwdArgs& a) { sm80::recurrent_fwd(ctx, a, false); }
bool gdn_sup_fwd(const FusedRecurrentGatedDeltaRuleFwdArgs& a) { return sm80::recurrent_fwd_supported(a); }
void gdn_bwd(const Context& ctx, const FusedRecurrentGatedDeltaRuleBwdArgs& a) { recurrent_bwd(ctx, a, false); }
bool gdn_sup_bwd(const FusedRecurrentGatedDeltaRuleBwdArgs& a) { return recurrent_bwd_supported(a); }
void kda_fwd(const Context& ctx, const FusedRecurrentKdaFwdArgs& a) { sm80::recurrent_fwd(ctx, a, true); }
bool kda_sup_fwd(const FusedRecurrentKdaFwdArgs& a) { return sm80::recurrent_fwd_supported(a); }
void kda_bwd(const Context& ctx, const FusedRecurrentKdaBwdArgs& a) { recurrent_bwd(ctx, a, true); }
bool kda_sup_bwd(const FusedRecurrentKdaBwdArgs& a) { return recurrent_bwd_supported(a); }

}  // namespace
}  // namespace fusedops::la::sm90

namespace fusedops {

void register_linear_attention_cuda_sm90(Registry& r) {
  using namespace la::sm90;
  // The arch range is the one where recurrent_bwd_workspace_size (la_top.h) sizes the checkpoints.
  const BackendSpec s{"cuda_sm90", DeviceKind::kCUDA, la::kRecurrentBwdArch, la::kRecurrentBwdArch,
                      {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm90};
  r.add<FusedRecurrentGatedDeltaRuleFwdArgs>("fused_recurrent_gated_delta_rule", Direction::kForward, s, gdn_sup_fwd,
                                             gdn_fwd);
  r.add<FusedRecurrentGatedDeltaRuleBwdArgs>("fused_recurrent_gated_delta_rule", Direction::kBackward, s,
                                             gdn_sup_bwd, gdn_bwd);
  r.add<FusedRecurrentKdaFwdArgs>("fused_recurrent_kda", Direction::kForward, s, kda_sup_fwd, kda_fwd);
  r.add<FusedRecurrentKdaBwdArgs>("fused_recurrent_kda", Direction::kBackward, s, kda_sup_bwd, kda_bwd);
}

}  // namespace fusedops
