// sinkhorn and hc_split_sinkhorn, generic CUDA backend (sm_80 and later).
//
// Layout: a group of G = sinkhorn_group(n) threads (4, 8 or 16; G >= n) owns one matrix; thread g
// keeps row g AND column g of the current matrix in registers (Kr, Kc), so row sums and column
// sums are both thread-local. After a step, the n scale factors are exchanged with shuffles and
// each thread rescales its two copies; the two copies of an element always see the same
// operations, so they stay bitwise equal. A block of 128 threads holds 128 / G matrices.
//
// Backward (docs/specs/ops.md 3.3, the unrolled iteration): recompute the forward keeping every step's
// denominator d = sum + eps (thread g keeps those of row g and column g: 2 floats per iteration)
// in shared memory, then walk the steps in reverse: G <- (G - sum_axis(G * Q)) / d and rebuild
// the step's input as Q * d. When the history of all iterations does not fit (48 KB per block),
// the iterations are split into segments processed last to first, each recomputed from the
// start (O(T^2 / segment) extra steps; none for T <= 38 at any n). The log variant keeps the
// potentials f, g instead. The parameter gradients of hc_split_sinkhorn are summed per block in
// row order (stage 1, to a workspace) and then over blocks in a fixed order (stage 2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/cuda/check.cuh"
#include "src/cuda/fastmath.cuh"
#include "src/cuda/pdl.cuh"
#include "src/cuda/reduce.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/mhc/sinkhorn_common.h"

namespace fusedops {
namespace {

using cuda::from_f;
using cuda::to_f;
using mhc::kSinkhornBlockThreads;

constexpr int kThreads = kSinkhornBlockThreads;
constexpr int kSmemBudgetFloats = 48 * 1024 / 4;  // without the opt-in for larger shared memory
constexpr int kMindSpeed = 0, kDeepSeek = 1, kLog = 2;

struct SkParams {
  const void* in;  // sinkhorn: logits [rows, n, n]; hc_split_sinkhorn: mixes [rows, (2+n)n]
  int64_t in_rs;   // elements between rows of `in`
  const float* scale;
  const float* base;
  void* pre;
  void* post;
  void* comb;  // forward output [rows, n, n]
  const void* dpre;
  const void* dpost;
  const void* dcomb;  // backward input [rows, n, n] (may be null: zero)
  int64_t dpre_rs, dpost_rs, dcomb_rs;  // elements between rows of dpre, dpost, dcomb
  void* dout;         // dlogits [rows, n, n] or dmixes [rows, (2+n)n], contiguous
  float* partials;    // [blocks, 3 + (2+n)n]
  int64_t rows;
  int n;
  int iters;
  float eps;
  int variant;
  int seg;  // iterations per history segment
};

template <int G>
__device__ __forceinline__ float gather(float v, int j) {
  return __shfl_sync(0xffffffffu, v, j, G);
}

// x / d correctly rounded, given inv = RN(1/d) (Markstein: one residual FMA corrects x * inv).
// The backward's recomputation divides (rather than multiplying by 1/d as the forward does)
// because that halves the error of the gradients; see README.md.
__device__ __forceinline__ float div_rn(float x, float d, float inv) {
  const float q = x * inv;
  const float r = fmaf(-q, d, x);
  return fmaf(r, inv, q);
}

template <class T, bool kFused>
__device__ __forceinline__ float logit(const SkParams& p, int64_t row, int i, int j) {
  const T* in = static_cast<const T*>(p.in) + row * p.in_rs;
  if constexpr (kFused) {
    const int e = 2 * p.n + i * p.n + j;
    return p.scale[2] * to_f(in[e]) + p.base[e];
  } else {
    return to_f(in[i * p.n + j]);
  }
}

// Per-thread state of one matrix: row g and column g of L and of the current matrix.
template <int G>
struct Lanes {
  float Lr[G], Lc[G];
  float Kr[G], Kc[G];
  int g;       // row / column owned by this thread
  int n;
  bool act;    // g < n and the row exists
};

template <class T, int G, bool kFused>
__device__ __forceinline__ void load_logits(const SkParams& p, int64_t row, Lanes<G>& s) {
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const bool in = s.act && j < s.n;
    s.Lr[j] = in ? logit<T, kFused>(p, row, s.g, j) : 0.0f;
    s.Lc[j] = in ? logit<T, kFused>(p, row, j, s.g) : 0.0f;
  }
}

// K0: mindspeed exp(L - rowmax); deepseek softmax_row(L) + eps. Zero outside the matrix.
template <int G, bool kDiv>
__device__ __forceinline__ void init_k(Lanes<G>& s, int variant, float eps) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < G; ++j)
    if (j < s.n) m = fmaxf(m, s.Lr[j]);
  if (!s.act) m = 0.0f;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const float mj = gather<G>(m, j);
    const bool in = s.act && j < s.n;
    s.Kr[j] = in ? expf(s.Lr[j] - m) : 0.0f;
    s.Kc[j] = in ? expf(s.Lc[j] - mj) : 0.0f;
  }
  if (variant == kDeepSeek) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < G; ++j) sum += s.Kr[j];
    const float inv = s.act ? __frcp_rn(sum) : 0.0f;
    const float sd = s.act ? sum : 0.0f;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      const float inv_j = gather<G>(inv, j);
      const float sum_j = gather<G>(sd, j);
      const bool in = s.act && j < s.n;
      if constexpr (kDiv) {
        s.Kr[j] = in ? div_rn(s.Kr[j], sd, inv) + eps : 0.0f;
        s.Kc[j] = in ? div_rn(s.Kc[j], sum_j, inv_j) + eps : 0.0f;
      } else {
        s.Kr[j] = in ? s.Kr[j] * inv + eps : 0.0f;
        s.Kc[j] = in ? s.Kc[j] * inv_j + eps : 0.0f;
      }
    }
  }
}

// Row step (kRow) or column step: returns d = own sum + eps. kDiv: divide (backward), else
// multiply by the reciprocal (forward).
template <int G, bool kRow, bool kDiv>
__device__ __forceinline__ float normalise(Lanes<G>& s, float eps) {
  float* own = kRow ? s.Kr : s.Kc;
  float* other = kRow ? s.Kc : s.Kr;
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < G; ++j) sum += own[j];
  const float d = sum + eps;
  const float inv = s.act ? __frcp_rn(d) : 0.0f;
  const float dd = s.act ? d : 0.0f;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const float inv_j = gather<G>(inv, j);
    if constexpr (kDiv) {
      const float d_j = gather<G>(dd, j);
      own[j] = div_rn(own[j], dd, inv);
      other[j] = div_rn(other[j], d_j, inv_j);
    } else {
      own[j] *= inv;
      other[j] *= inv_j;
    }
  }
  return d;
}

__device__ __forceinline__ bool has_row_step(int variant, int t) {
  return variant == kMindSpeed || t > 0;
}

// Iterations [t0, t1); with `hist`, d of each step goes to hist[((t - t0) * 2 + {0: row, 1: col})
// * kThreads + threadIdx.x].
template <int G, bool kDiv>
__device__ __forceinline__ void iterate(Lanes<G>& s, int variant, float eps, int t0, int t1,
                                        float* hist) {
  for (int t = t0; t < t1; ++t) {
    if (has_row_step(variant, t)) {
      const float d = normalise<G, true, kDiv>(s, eps);
      if (hist) hist[((t - t0) * 2 + 0) * kThreads + threadIdx.x] = d;
    }
    const float d = normalise<G, false, kDiv>(s, eps);
    if (hist) hist[((t - t0) * 2 + 1) * kThreads + threadIdx.x] = d;
  }
}

// Reverse of a row step (kRow) or a column step whose output is the current K.
template <int G, bool kRow>
__device__ __forceinline__ void reverse_step(Lanes<G>& s, float (&Gr)[G], float (&Gc)[G], float d) {
  float* kown = kRow ? s.Kr : s.Kc;
  float* kother = kRow ? s.Kc : s.Kr;
  float* gown = kRow ? Gr : Gc;
  float* gother = kRow ? Gc : Gr;
  const float inv = s.act ? __frcp_rn(d) : 0.0f;
  const float dd = s.act ? d : 0.0f;
  float dot = 0.0f;
#pragma unroll
  for (int j = 0; j < G; ++j) dot += gown[j] * kown[j];
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const float dot_j = gather<G>(dot, j);
    const float inv_j = gather<G>(inv, j);
    const float d_j = gather<G>(dd, j);
    if (j < s.n) {
      gown[j] = div_rn(gown[j] - dot, dd, inv);
      gother[j] = div_rn(gother[j] - dot_j, d_j, inv_j);
    }
    kown[j] *= dd;
    kother[j] *= d_j;
  }
}

// -LSE_j(v_j) over j < n.
template <int G>
__device__ __forceinline__ float neg_lse(const float (&v)[G], int n) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < G; ++j)
    if (j < n) m = fmaxf(m, v[j]);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < G; ++j)
    if (j < n) sum += expf(v[j] - m);
  return -(m + logf(sum));
}

// Log variant iterations [t0, t1) on the potentials (f: own row, gp: own column); with `hist`,
// f and g after each iteration are stored like the denominators above.
template <int G>
__device__ __forceinline__ void log_iterate(Lanes<G>& s, float& f, float& gp, int t0, int t1,
                                            float* hist) {
  for (int t = t0; t < t1; ++t) {
    float v[G];
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = s.Lr[j] + gather<G>(gp, j);
    f = s.act ? neg_lse<G>(v, s.n) : 0.0f;
#pragma unroll
    for (int j = 0; j < G; ++j) v[j] = s.Lc[j] + gather<G>(f, j);
    gp = s.act ? neg_lse<G>(v, s.n) : 0.0f;
    if (hist) {
      hist[((t - t0) * 2 + 0) * kThreads + threadIdx.x] = f;
      hist[((t - t0) * 2 + 1) * kThreads + threadIdx.x] = gp;
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------

__device__ __forceinline__ float sigmoidf_(float u) { return 1.0f / (1.0f + expf(-u)); }

template <class T, int G, bool kFused>
__global__ void __launch_bounds__(kThreads) sinkhorn_fwd_kernel(SkParams p) {
  constexpr int R = kThreads / G;
  Lanes<G> s;
  s.g = threadIdx.x % G;
  s.n = p.n;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * R + threadIdx.x / G;
  s.act = row < p.rows && s.g < p.n;
  const int n = p.n;
  if constexpr (kFused) {
    if (s.act) {
      const T* m = static_cast<const T*>(p.in) + row * p.in_rs;
      const float pre = sigmoidf_(p.scale[0] * to_f(m[s.g]) + p.base[s.g]) + p.eps;
      const float post = 2.0f * sigmoidf_(p.scale[1] * to_f(m[n + s.g]) + p.base[n + s.g]);
      static_cast<T*>(p.pre)[row * n + s.g] = from_f<T>(pre);
      static_cast<T*>(p.post)[row * n + s.g] = from_f<T>(post);
    }
  }
  load_logits<T, G, kFused>(p, row, s);
  float out[G];
  if (p.variant == kLog) {
    float f = 0.0f, gp = 0.0f;
    log_iterate<G>(s, f, gp, 0, p.iters, nullptr);
#pragma unroll
    for (int j = 0; j < G; ++j) out[j] = expf(f + s.Lr[j] + gather<G>(gp, j));
  } else {
    init_k<G, false>(s, p.variant, p.eps);
    iterate<G, false>(s, p.variant, p.eps, 0, p.iters, nullptr);
#pragma unroll
    for (int j = 0; j < G; ++j) out[j] = s.Kr[j];
  }
  if (s.act) {
    T* comb = static_cast<T*>(p.comb) + row * n * n + s.g * n;
#pragma unroll
    for (int j = 0; j < G; ++j)
      if (j < n) comb[j] = from_f<T>(out[j]);
  }
}

// ---- backward --------------------------------------------------------------------------------

// dL (row g) of the multiplicative variants; Gr/Gc hold dP on entry.
template <int G>
__device__ __forceinline__ void mult_backward(const SkParams& p, Lanes<G>& s, float (&Gr)[G],
                                              float (&Gc)[G], float* hist, float (&dL)[G]) {
  int end = p.iters;
  while (end > 0) {
    const int start = max(0, end - p.seg);
    init_k<G, true>(s, p.variant, p.eps);
    iterate<G, true>(s, p.variant, p.eps, 0, start, nullptr);
    iterate<G, true>(s, p.variant, p.eps, start, end, hist);
    for (int t = end - 1; t >= start; --t) {
      reverse_step<G, false>(s, Gr, Gc, hist[((t - start) * 2 + 1) * kThreads + threadIdx.x]);
      if (has_row_step(p.variant, t))
        reverse_step<G, true>(s, Gr, Gc, hist[((t - start) * 2 + 0) * kThreads + threadIdx.x]);
    }
    end = start;
  }
  // Gr = dK0 (row g). mindspeed: dL = dK0 * exp(L - rowmax); deepseek: softmax backward.
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < G; ++j)
    if (j < s.n) m = fmaxf(m, s.Lr[j]);
  float e[G], sum = 0.0f;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    e[j] = (s.act && j < s.n) ? expf(s.Lr[j] - m) : 0.0f;
    sum += e[j];
  }
  if (p.variant == kMindSpeed) {
#pragma unroll
    for (int j = 0; j < G; ++j) dL[j] = Gr[j] * e[j];
  } else {
    const float inv = s.act ? __frcp_rn(sum) : 0.0f;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < G; ++j) {
      e[j] = div_rn(e[j], sum, inv);  // S, as in the recomputation
      dot += Gr[j] * e[j];
    }
#pragma unroll
    for (int j = 0; j < G; ++j) dL[j] = e[j] * (Gr[j] - dot);
  }
}

// dL (row g) of the log variant; Gr/Gc hold dP on entry.
template <int G>
__device__ __forceinline__ void log_backward(const SkParams& p, Lanes<G>& s, const float (&Gr)[G],
                                             const float (&Gc)[G], float* hist, float (&dL)[G]) {
  float fbar = 0.0f, gbar = 0.0f;
  int end = p.iters;
  while (end > 0) {
    const int start = max(0, end - p.seg);
    float f = 0.0f, gp = 0.0f;
    log_iterate<G>(s, f, gp, 0, start, nullptr);
    const float g_before = gp;  // g after iteration start-1 (0 when start == 0)
    log_iterate<G>(s, f, gp, start, end, hist);
    if (end == p.iters) {
      // P = exp(f + L + g): dZ = dP * P flows into L, f (row sums) and g (column sums).
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const float fj = gather<G>(f, j);
        const float gj = gather<G>(gp, j);
        const bool in = s.act && j < s.n;
        const float zr = in ? Gr[j] * expf(f + s.Lr[j] + gj) : 0.0f;
        const float zc = in ? Gc[j] * expf(fj + s.Lc[j] + gp) : 0.0f;
        dL[j] = zr;
        fbar += zr;
        gbar += zc;
      }
    }
    for (int t = end - 1; t >= start; --t) {
      const float ft = hist[((t - start) * 2 + 0) * kThreads + threadIdx.x];
      const float gt = hist[((t - start) * 2 + 1) * kThreads + threadIdx.x];
      const float gprev = t == 0 ? 0.0f
                          : t > start ? hist[((t - 1 - start) * 2 + 1) * kThreads + threadIdx.x]
                                      : g_before;
      // g-step: B_gj = exp(L_gj + f_g + g_j); dL_gj -= gbar_j B_gj; fbar_g -= sum_j gbar_j B_gj.
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const float gj = gather<G>(gt, j);
        const float gbj = gather<G>(gbar, j);
        if (s.act && j < s.n) {
          const float w = gbj * expf(s.Lr[j] + ft + gj);
          dL[j] -= w;
          fbar -= w;
        }
      }
      // f-step: A_gj = exp(L_gj + gprev_j + f_g); dL_gj -= fbar_g A_gj;
      // gbar'_g (column g) = -sum_j fbar_j A_jg.
      float gnew = 0.0f;
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const float gpj = gather<G>(gprev, j);
        const float fbj = gather<G>(fbar, j);
        const float fj = gather<G>(ft, j);
        if (s.act && j < s.n) {
          dL[j] -= fbar * expf(s.Lr[j] + gpj + ft);
          gnew -= fbj * expf(s.Lc[j] + gprev + fj);
        }
      }
      gbar = gnew;
      fbar = 0.0f;
    }
    end = start;
  }
}

template <class T, int G, bool kFused>
__global__ void __launch_bounds__(kThreads, 3) sinkhorn_bwd_kernel(SkParams p) {
  constexpr int R = kThreads / G;
  extern __shared__ float smem[];
  float* hist = smem;                              // [seg][2][kThreads]
  float* part = smem + p.seg * 2 * kThreads;       // fused: [R][3 + (2+n)n]
  Lanes<G> s;
  s.g = threadIdx.x % G;
  s.n = p.n;
  const int r_local = threadIdx.x / G;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * R + r_local;
  const bool row_act = row < p.rows;
  s.act = row_act && s.g < p.n;
  const int n = p.n;
  load_logits<T, G, kFused>(p, row, s);
  float Gr[G], Gc[G], dL[G];
  const T* dcomb = p.dcomb ? static_cast<const T*>(p.dcomb) + (row_act ? row : 0) * p.dcomb_rs : nullptr;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const bool in = s.act && j < n && dcomb;
    Gr[j] = in ? to_f(dcomb[s.g * n + j]) : 0.0f;
    Gc[j] = in ? to_f(dcomb[j * n + s.g]) : 0.0f;
    dL[j] = 0.0f;
  }
  if (p.variant == kLog) {
    log_backward<G>(p, s, Gr, Gc, hist, dL);
  } else {
    mult_backward<G>(p, s, Gr, Gc, hist, dL);
  }
  if constexpr (!kFused) {
    if (s.act) {
      T* out = static_cast<T*>(p.dout) + row * n * n + s.g * n;
#pragma unroll
      for (int j = 0; j < G; ++j)
        if (j < n) out[j] = from_f<T>(dL[j]);
    }
  } else {
    const int w = (2 + n) * n, np = 3 + w;
    const float a0 = p.scale[0], a1 = p.scale[1], a2 = p.scale[2];
    const T* m = static_cast<const T*>(p.in) + (row_act ? row : 0) * p.in_rs;
    T* dm = static_cast<T*>(p.dout) + (row_act ? row : 0) * w;
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, du = 0.0f, dv = 0.0f;
    if (s.act) {
      const int i = s.g;
      const float mp = to_f(m[i]), mq = to_f(m[n + i]);
      const float sp = sigmoidf_(a0 * mp + p.base[i]);
      const float gpre = p.dpre ? to_f(static_cast<const T*>(p.dpre)[row * p.dpre_rs + i]) : 0.0f;
      du = gpre * sp * (1.0f - sp);
      const float sq = sigmoidf_(a1 * mq + p.base[n + i]);
      const float gpost = p.dpost ? to_f(static_cast<const T*>(p.dpost)[row * p.dpost_rs + i]) : 0.0f;
      dv = gpost * 2.0f * sq * (1.0f - sq);
      dm[i] = from_f<T>(du * a0);
      dm[n + i] = from_f<T>(dv * a1);
      c0 = du * mp;
      c1 = dv * mq;
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (j < n) {
          dm[2 * n + i * n + j] = from_f<T>(dL[j] * a2);
          c2 += dL[j] * to_f(m[2 * n + i * n + j]);
        }
      }
    }
    c0 = cuda::warp_sum(c0, G);
    c1 = cuda::warp_sum(c1, G);
    c2 = cuda::warp_sum(c2, G);
    // Every slot of part[r_local][*] is written, with zeros for rows past the end.
    float* pr = part + r_local * np;
    if (s.g == 0) {
      pr[0] = c0;
      pr[1] = c1;
      pr[2] = c2;
    }
    if (s.g < n) {
      pr[3 + s.g] = du;
      pr[3 + n + s.g] = dv;
#pragma unroll
      for (int j = 0; j < G; ++j)
        if (j < n) pr[3 + 2 * n + s.g * n + j] = s.act ? dL[j] : 0.0f;
    }
    __syncthreads();
    for (int q = threadIdx.x; q < np; q += kThreads) {
      float acc = 0.0f;
      for (int r = 0; r < R; ++r) acc += part[r * np + q];
      p.partials[static_cast<int64_t>(blockIdx.x) * np + q] = acc;
    }
  }
}

// Stage 2: one block per parameter sums the partials: thread i adds partials i, i + 256, ... in
// order (all its loads issued at once), then the block sums the 256 in a fixed order. Launched
// with PDL after the backward kernel, so it is resident when that kernel ends.
constexpr int kReduceThreads = 256;
__global__ void __launch_bounds__(kReduceThreads) split_param_reduce_kernel(const float* partials,
                                                                            int64_t blocks, int np,
                                                                            float* dscale, float* dbase) {
  __shared__ float scratch[kReduceThreads / 32];
  const int q = blockIdx.x;
  cuda::wait_prior_grid();
  float acc = 0.0f;
  int64_t b = threadIdx.x;
  for (; b + 3 * kReduceThreads < blocks; b += 4 * kReduceThreads) {
    const float v0 = partials[b * np + q];
    const float v1 = partials[(b + kReduceThreads) * np + q];
    const float v2 = partials[(b + 2 * kReduceThreads) * np + q];
    const float v3 = partials[(b + 3 * kReduceThreads) * np + q];
    acc += v0;
    acc += v1;
    acc += v2;
    acc += v3;
  }
  for (; b < blocks; b += kReduceThreads) acc += partials[b * np + q];
  acc = cuda::block_sum(acc, scratch);
  if (threadIdx.x == 0) {
    if (q < 3) dscale[q] = acc;
    else dbase[q - 3] = acc;
  }
}

// ---- n = 4 fast path -------------------------------------------------------------------------
//
// For n = 4 and the multiplicative variants (the DeepSeek-V4 / MindSpeed case) one thread owns a
// whole matrix: the 16 logits, the current matrix and its adjoint stay in registers, every sum is
// thread-local and nothing is shuffled (the group kernels above exchange scale factors and keep
// each element twice). Same arithmetic as the group kernels and the CPU backend. Blocks of 64
// threads: 2 warps of 32 rows, one parameter-gradient partial (32 rows for n = 4) per warp; the
// backward's history is 8 floats per iteration per thread (20 iterations fit in one segment
// beside the partial sums, 24 without them).

constexpr int kN4 = 4;
constexpr int kThreads4 = 64;
constexpr int kRowsPerPartial4 = 32;  // hc_split_sinkhorn_partial_rows(4)

// sigmoid of N values, 1 / (1 + exp(-u)) with the division correctly rounded (= RN(1/x)).
template <int N>
__device__ __forceinline__ void sigmoid_n(const float (&u)[N], float (&out)[N]) {
  float x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = 1.0f + expf(-u[i]);
  cuda::rcp_rn<N>(x, out);
}

// Rows [row0, row0 + nrows) of a [rows, W] matrix of T (row stride rs elements) as floats at
// tile[r * ld + off + c], read coalesced by the whole block; a null matrix reads as zeros.
// (One thread per row reading its own row touches a new 32-byte sector per thread per element.)
// In two halves, so that a kernel staging several matrices issues every load before the first
// shared-memory store (one memory latency in all, not one per matrix): tile_fetch loads a full
// block's share of this thread into v; tile_put stores it (or, for a partial block or a null
// matrix, reads and stores element by element).
template <class T, int W>
__device__ __forceinline__ void tile_fetch(const void* src, int64_t rs, int64_t row0, int nrows,
                                           float (&v)[W]) {
  const T* m = static_cast<const T*>(src);
  if (m && nrows == kThreads4) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kThreads4;
      const int r = i / W, c = i - r * W;
      v[k] = to_f(m[(row0 + r) * rs + c]);
    }
  }
}
template <class T, int W>
__device__ __forceinline__ void tile_put(const void* src, int64_t rs, int64_t row0, int nrows,
                                         const float (&v)[W], float* tile, int ld, int off) {
  const T* m = static_cast<const T*>(src);
  if (m && nrows == kThreads4) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kThreads4;
      const int r = i / W, c = i - r * W;
      tile[r * ld + off + c] = v[k];
    }
    return;
  }
  for (int i = threadIdx.x; i < nrows * W; i += kThreads4) {
    const int r = i / W, c = i - r * W;
    tile[r * ld + off + c] = m ? to_f(m[(row0 + r) * rs + c]) : 0.0f;
  }
}

// tile[r * ld + off + c] to rows [row0, row0 + nrows) of a contiguous [rows, W] matrix of T.
template <class T, int W>
__device__ __forceinline__ void tile_out(void* dst, int64_t row0, int nrows, const float* tile,
                                         int ld, int off) {
  T* m = static_cast<T*>(dst);
  if (nrows == kThreads4) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int i = static_cast<int>(threadIdx.x) + k * kThreads4;
      const int r = i / W, c = i - r * W;
      m[row0 * W + i] = from_f<T>(tile[r * ld + off + c]);
    }
    return;
  }
  for (int i = threadIdx.x; i < nrows * W; i += kThreads4) {
    const int r = i / W, c = i - r * W;
    m[(row0 + r) * W + c] = from_f<T>(tile[r * ld + off + c]);
  }
}

// Staging tiles of the n = 4 kernels (floats per row, padded to an odd stride so that a thread
// reading its own row is free of bank conflicts). Forward: in = the mixes row (24) or the
// logits (16), out = [pre | post | comb] (24) or comb (16). Backward: in = mixes + dcomb + dpre +
// dpost (48) or logits + dcomb (32); out = dmixes (24) or dlogits (16).
template <bool kFused>
struct Tile4 {
  static constexpr int kIn = kFused ? (2 + kN4) * kN4 : kN4 * kN4;
  static constexpr int kFwdLd = kIn + 1;
  static constexpr int kBwdIn = kIn + kN4 * kN4 + (kFused ? 2 * kN4 : 0);
  static constexpr int kBwdLd = kBwdIn + 1;
  static constexpr int kBwdFloats = kThreads4 * kBwdLd;
};

__device__ __forceinline__ int rows_in_block4(const SkParams& p) {
  const int64_t left = p.rows - static_cast<int64_t>(blockIdx.x) * kThreads4;
  return static_cast<int>(left < kThreads4 ? left : kThreads4);
}

// hc_split_sinkhorn's parameters (a0, a1, a2) and the (2+n)n biases, loaded at the start of the
// kernels so that their latency overlaps the staging loads.
struct Prm4 {
  float a[3];
  float b[(2 + kN4) * kN4];
};
template <bool kFused>
__device__ __forceinline__ void load_prm4(const SkParams& p, Prm4& q) {
  if constexpr (kFused) {
#pragma unroll
    for (int i = 0; i < 3; ++i) q.a[i] = p.scale[i];
#pragma unroll
    for (int e = 0; e < (2 + kN4) * kN4; ++e) q.b[e] = p.base[e];
  }
}

template <bool kFused>
__device__ __forceinline__ void logits4(const Prm4& q, const float* v, float (&L)[16]) {
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    if constexpr (kFused) {
      L[e] = q.a[2] * v[2 * kN4 + e] + q.b[2 * kN4 + e];
    } else {
      L[e] = v[e];
    }
  }
}

// Arithmetic of the n = 4 kernels' normalisation steps x / d:
//   kMulApprox x * rcp.approx(d) (the hardware reciprocal, <= 1 ulp, no Newton step and no
//              fallback branch; for d in the normal range only: the host picks it when eps keeps
//              every denominator there, 1e-30 <= eps <= 1e30);
//   kMulRn     x * RN(1/d), for any other eps.
constexpr int kMulRn = 1, kMulApprox = 2;

template <int kArith, int N = kN4>
__device__ __forceinline__ void recip(const float (&d)[N], float (&inv)[N]) {
  if constexpr (kArith == kMulApprox) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(inv[i]) : "f"(d[i]));
  } else {
    cuda::rcp_rn<N>(d, inv);
  }
}

template <int kArith>
__device__ __forceinline__ float over(float x, float d, float inv) {
  return x * inv;
}

template <int kArith>
__device__ __forceinline__ void init4(const float (&L)[16], float (&K)[16], int variant, float eps) {
  float s[kN4];
#pragma unroll
  for (int i = 0; i < kN4; ++i) {
    float m = L[i * kN4];
#pragma unroll
    for (int j = 1; j < kN4; ++j) m = fmaxf(m, L[i * kN4 + j]);
    s[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kN4; ++j) {
      K[i * kN4 + j] = expf(L[i * kN4 + j] - m);
      s[i] += K[i * kN4 + j];
    }
  }
  if (variant == kDeepSeek) {
    float inv[kN4];
    recip<kArith>(s, inv);
#pragma unroll
    for (int i = 0; i < kN4; ++i)
#pragma unroll
      for (int j = 0; j < kN4; ++j) {
        float& k = K[i * kN4 + j];
        k = over<kArith>(k, s[i], inv[i]) + eps;
      }
  }
}

// Element (a, o) of a row step (kRow: row a) or a column step (column a).
template <bool kRow>
__device__ __forceinline__ int at4(int a, int o) {
  return kRow ? a * kN4 + o : o * kN4 + a;
}

// The sums are pairwise, (K0 + K1) + (K2 + K3): two dependent additions instead of three on the
// chain each step waits for (one thread per matrix leaves few warps to hide it; stop 36).
template <bool kRow, int kArith>
__device__ __forceinline__ void normalise4(float (&K)[16], float eps, float (&d)[kN4]) {
  float inv[kN4];
#pragma unroll
  for (int a = 0; a < kN4; ++a) {
    const float s = (K[at4<kRow>(a, 0)] + K[at4<kRow>(a, 1)]) + (K[at4<kRow>(a, 2)] + K[at4<kRow>(a, 3)]);
    d[a] = s + eps;
  }
  recip<kArith>(d, inv);
#pragma unroll
  for (int a = 0; a < kN4; ++a) {
#pragma unroll
    for (int o = 0; o < kN4; ++o) {
      float& k = K[at4<kRow>(a, o)];
      k = over<kArith>(k, d[a], inv[a]);
    }
  }
}

// Iterations [t0, t1); with kHist, the 8 denominators of iteration t go to
// hist[((t - t0) * 8 + k) * kThreads4] (k < 4: rows, k >= 4: columns), hist being this thread's
// column of the history (the block's history + threadIdx.x).
template <int kArith, bool kHist>
__device__ __forceinline__ void iterate4(float (&K)[16], int variant, float eps, int t0, int t1,
                                         float* hist) {
  for (int t = t0; t < t1; ++t) {
    float d[kN4];
    float* h = hist + (t - t0) * 8 * kThreads4;
    if (has_row_step(variant, t)) {
      normalise4<true, kArith>(K, eps, d);
      if constexpr (kHist) {
#pragma unroll
        for (int k = 0; k < kN4; ++k) h[k * kThreads4] = d[k];
      }
    }
    normalise4<false, kArith>(K, eps, d);
    if constexpr (kHist) {
#pragma unroll
      for (int k = 0; k < kN4; ++k) h[(4 + k) * kThreads4] = d[k];
    }
  }
}

// Reverse of a row step (kRow) or a column step whose output is the current K, on H = G * K
// (the adjoint times the step's output, element-wise). With G_in = (G - sum_axis(G * K)) / d and
// K_in = K * d, H_in = G_in * K_in = H - K * sum_axis(H): no division and no reciprocal.
template <bool kRow>
__device__ __forceinline__ void reverse4(float (&K)[16], float (&H)[16], const float* hist_t) {
  float d[kN4];
#pragma unroll
  for (int a = 0; a < kN4; ++a) d[a] = hist_t[((kRow ? 0 : 4) + a) * kThreads4];
#pragma unroll
  for (int a = 0; a < kN4; ++a) {
    const float sum = (H[at4<kRow>(a, 0)] + H[at4<kRow>(a, 1)]) + (H[at4<kRow>(a, 2)] + H[at4<kRow>(a, 3)]);
#pragma unroll
    for (int o = 0; o < kN4; ++o) {
      const int e = at4<kRow>(a, o);
      H[e] = fmaf(-K[e], sum, H[e]);
      K[e] *= d[a];
    }
  }
}

// One block = 64 rows: the block reads its rows (and writes its outputs) coalesced through a
// shared-memory tile; each thread then owns one row.
template <class T, bool kFused, int kArith>
__global__ void __launch_bounds__(kThreads4) sinkhorn4_fwd_kernel(SkParams p) {
  using Tl = Tile4<kFused>;
  constexpr int kLd = Tl::kFwdLd;
  __shared__ float tile[kThreads4 * kLd];
  const int nrows = rows_in_block4(p);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kThreads4;
  const bool act = static_cast<int>(threadIdx.x) < nrows;
  cuda::wait_prior_grid();
  Prm4 q;
  {
    float st[Tl::kIn];
    tile_fetch<T, Tl::kIn>(p.in, p.in_rs, row0, nrows, st);
    load_prm4<kFused>(p, q);
    tile_put<T, Tl::kIn>(p.in, p.in_rs, row0, nrows, st, tile, kLd, 0);
  }
  __syncthreads();
  float v[Tl::kIn];
#pragma unroll
  for (int c = 0; c < Tl::kIn; ++c) v[c] = act ? tile[threadIdx.x * kLd + c] : 0.0f;
  float L[16], K[16];
  logits4<kFused>(q, v, L);
  float pre[kN4], post[kN4];
  if constexpr (kFused) {
    float u[2 * kN4], sg[2 * kN4];
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      u[i] = q.a[0] * v[i] + q.b[i];
      u[kN4 + i] = q.a[1] * v[kN4 + i] + q.b[kN4 + i];
    }
    sigmoid_n<2 * kN4>(u, sg);
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      pre[i] = sg[i] + p.eps;
      post[i] = 2.0f * sg[kN4 + i];
    }
  }
  init4<kArith>(L, K, p.variant, p.eps);
  iterate4<kArith, false>(K, p.variant, p.eps, 0, p.iters, nullptr);
  cuda::allow_dependent_grid();
  __syncthreads();  // every row has been read from the tile
  float* mine = tile + threadIdx.x * kLd;
  if constexpr (kFused) {
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      mine[i] = pre[i];
      mine[kN4 + i] = post[i];
    }
  }
#pragma unroll
  for (int e = 0; e < 16; ++e) mine[(kFused ? 2 * kN4 : 0) + e] = K[e];
  __syncthreads();
  if constexpr (kFused) {
    tile_out<T, kN4>(p.pre, row0, nrows, tile, kLd, 0);
    tile_out<T, kN4>(p.post, row0, nrows, tile, kLd, kN4);
  }
  tile_out<T, 16>(p.comb, row0, nrows, tile, kLd, kFused ? 2 * kN4 : 0);
}

// Shared memory of the n = 4 backward: the history (which also serves as the staging tile before
// and after the iterations), then the fused partial sums.
__host__ __device__ inline int hist_floats4(int seg, int stage_floats) {
  return seg * 8 * kThreads4 > stage_floats ? seg * 8 * kThreads4 : stage_floats;
}

template <class T, bool kFused, int kArith>
__global__ void __launch_bounds__(kThreads4, 4) sinkhorn4_bwd_kernel(SkParams p) {
  using Tl = Tile4<kFused>;
  constexpr int kW = (2 + kN4) * kN4, kP = 3 + kW;
  constexpr int kLd = Tl::kBwdLd;
  extern __shared__ float smem[];
  float* hist = smem;  // [seg][8][kThreads4]; before and after the iterations the staging tile
  float* part = smem + hist_floats4(p.seg, Tl::kBwdFloats);  // fused: [kThreads4][kP]
  const int nrows = rows_in_block4(p);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kThreads4;
  const bool act = static_cast<int>(threadIdx.x) < nrows;
  cuda::wait_prior_grid();
  Prm4 q;
  load_prm4<kFused>(p, q);

  // Inputs, coalesced: [mixes or logits | dcomb | dpre | dpost] per row; every load first.
  {
    float s_in[Tl::kIn], s_dc[16], s_dp[kN4], s_dq[kN4];
    tile_fetch<T, Tl::kIn>(p.in, p.in_rs, row0, nrows, s_in);
    tile_fetch<T, 16>(p.dcomb, p.dcomb_rs, row0, nrows, s_dc);
    if constexpr (kFused) {
      tile_fetch<T, kN4>(p.dpre, p.dpre_rs, row0, nrows, s_dp);
      tile_fetch<T, kN4>(p.dpost, p.dpost_rs, row0, nrows, s_dq);
    }
    tile_put<T, Tl::kIn>(p.in, p.in_rs, row0, nrows, s_in, hist, kLd, 0);
    tile_put<T, 16>(p.dcomb, p.dcomb_rs, row0, nrows, s_dc, hist, kLd, Tl::kIn);
    if constexpr (kFused) {
      tile_put<T, kN4>(p.dpre, p.dpre_rs, row0, nrows, s_dp, hist, kLd, Tl::kIn + 16);
      tile_put<T, kN4>(p.dpost, p.dpost_rs, row0, nrows, s_dq, hist, kLd, Tl::kIn + 16 + kN4);
    }
  }
  __syncthreads();
  float v[Tl::kBwdIn];
#pragma unroll
  for (int c = 0; c < Tl::kBwdIn; ++c) v[c] = act ? hist[threadIdx.x * kLd + c] : 0.0f;
  __syncthreads();  // the tile becomes the history
  float L[16], K[16], G[16];
  logits4<kFused>(q, v, L);
#pragma unroll
  for (int e = 0; e < 16; ++e) G[e] = v[Tl::kIn + e];

  // The reverse walks H = G * K (reverse4); G becomes H after the last step's recomputation.
  float* const my_hist = hist + threadIdx.x;
  int end = p.iters;
  while (end > 0) {
    const int start = max(0, end - p.seg);
    init4<kArith>(L, K, p.variant, p.eps);
    iterate4<kArith, false>(K, p.variant, p.eps, 0, start, nullptr);
    iterate4<kArith, true>(K, p.variant, p.eps, start, end, my_hist);
    if (end == p.iters) {
#pragma unroll
      for (int e = 0; e < 16; ++e) G[e] *= K[e];
    }
    for (int t = end - 1; t >= start; --t) {
      const float* h = my_hist + (t - start) * 8 * kThreads4;
      reverse4<false>(K, G, h);
      if (has_row_step(p.variant, t)) reverse4<true>(K, G, h);
    }
    end = start;
  }
  cuda::allow_dependent_grid();
  // G = H0 = dK0 * K0 -> dL (rowmax a constant). mindspeed: K0 = exp(L - rowmax), so dL = H0.
  // deepseek: K0 = S + eps with S as recomputed; dK0 = H0 / K0, then the softmax backward.
  float dL[16];
  if (p.variant == kMindSpeed) {
#pragma unroll
    for (int k = 0; k < 16; ++k) dL[k] = G[k];
  } else {
    float e[16], s[kN4], inv[kN4];
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      float m = L[i * kN4];
#pragma unroll
      for (int j = 1; j < kN4; ++j) m = fmaxf(m, L[i * kN4 + j]);
      s[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kN4; ++j) {
        e[i * kN4 + j] = expf(L[i * kN4 + j] - m);
        s[i] += e[i * kN4 + j];
      }
    }
    recip<kArith>(s, inv);
    float k0[16], rk0[16];
#pragma unroll
    for (int i = 0; i < kN4; ++i)
#pragma unroll
      for (int j = 0; j < kN4; ++j) {
        e[i * kN4 + j] = over<kArith>(e[i * kN4 + j], s[i], inv[i]);  // S, as recomputed
        k0[i * kN4 + j] = e[i * kN4 + j] + p.eps;
      }
    recip<kArith, 16>(k0, rk0);
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kN4; ++j) {
        const int k = i * kN4 + j;
        G[k] = k0[k] > 0.0f ? over<kArith>(G[k], k0[k], rk0[k]) : 0.0f;  // dK0 (S = 0: no gradient)
        dot += G[k] * e[k];
      }
#pragma unroll
      for (int j = 0; j < kN4; ++j) dL[i * kN4 + j] = e[i * kN4 + j] * (G[i * kN4 + j] - dot);
    }
  }
  float out[Tl::kIn];  // dlogits, or dmixes [pre | post | res]
  if constexpr (!kFused) {
#pragma unroll
    for (int e = 0; e < 16; ++e) out[e] = dL[e];
  } else {
    const float a0 = q.a[0], a1 = q.a[1], a2 = q.a[2];
    float* pr = part + threadIdx.x * kP;  // this row's contributions, zeros past the end
    float u[2 * kN4], sg[2 * kN4];
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      u[i] = a0 * v[i] + q.b[i];
      u[kN4 + i] = a1 * v[kN4 + i] + q.b[kN4 + i];
    }
    sigmoid_n<2 * kN4>(u, sg);
    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f;
#pragma unroll
    for (int i = 0; i < kN4; ++i) {
      const float mp = v[i], mq = v[kN4 + i];
      const float sp = sg[i], sq = sg[kN4 + i];
      const float gpre = v[Tl::kIn + 16 + i], gpost = v[Tl::kIn + 16 + kN4 + i];
      const float du = gpre * sp * (1.0f - sp);
      const float dv = gpost * 2.0f * sq * (1.0f - sq);
      out[i] = du * a0;
      out[kN4 + i] = dv * a1;
      c0 += du * mp;
      c1 += dv * mq;
      pr[3 + i] = du;
      pr[3 + kN4 + i] = dv;
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const float dz = act ? dL[e] : 0.0f;
      out[2 * kN4 + e] = dz * a2;
      if (act) c2 += dz * v[2 * kN4 + e];
      pr[3 + 2 * kN4 + e] = dz;
    }
    pr[0] = c0;
    pr[1] = c1;
    pr[2] = c2;
  }
  __syncthreads();  // every thread is done with the history: it becomes the output tile
#pragma unroll
  for (int c = 0; c < Tl::kIn; ++c) hist[threadIdx.x * kLd + c] = out[c];
  __syncthreads();
  tile_out<T, Tl::kIn>(p.dout, row0, nrows, hist, kLd, 0);
  if constexpr (kFused) {
    // One partial per warp (32 rows), rows added in order; a warp wholly past the end writes
    // nothing (its partial index is beyond the workspace).
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t first_row = row0 + warp * kRowsPerPartial4;
    if (first_row < p.rows) {
      for (int q = lane; q < kP; q += 32) {
        float acc = 0.0f;
        for (int rr = 0; rr < kRowsPerPartial4; ++rr) acc += part[(warp * kRowsPerPartial4 + rr) * kP + q];
        p.partials[(first_row / kRowsPerPartial4) * kP + q] = acc;
      }
    }
  }
}

// ---- host side -------------------------------------------------------------------------------

constexpr const char* kSinkhorn = "sinkhorn";
constexpr const char* kSplit = "hc_split_sinkhorn";

template <class Fn>
void with_group(int n, Fn&& fn) {
  switch (mhc::sinkhorn_group(n)) {
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 8: fn(std::integral_constant<int, 8>{}); break;
    default: fn(std::integral_constant<int, 16>{}); break;
  }
}

// History segment length (iterations) and dynamic shared memory for the backward.
void plan_backward(SkParams& p, int part_floats, size_t* smem_bytes) {
  const int room = (kSmemBudgetFloats - part_floats) / (2 * kThreads);
  p.seg = std::max(1, std::min(p.iters, room));
  *smem_bytes = static_cast<size_t>(p.seg * 2 * kThreads + part_floats) * sizeof(float);
}

unsigned blocks_for(int64_t rows, int G) {
  const int64_t per = kThreads / G;
  return static_cast<unsigned>((rows + per - 1) / per);
}

// The one-thread-per-matrix kernels serve n = 4 with the multiplicative variants (the group
// kernels, four threads per matrix, were slower at 32768 rows on the H200: hc_split_sinkhorn fwd
// 14.1 vs 13.5 us, fwd+bwd 68.5 vs 51.7 us; their knob FUSEDOPS_SINKHORN_FAST4 went).
bool fast4(int n, int variant) { return n == kN4 && variant != kLog; }

unsigned blocks4(int64_t rows) { return static_cast<unsigned>((rows + kThreads4 - 1) / kThreads4); }

// The n = 4 kernels' arithmetic (kMulRn / kMulApprox above), both directions: "approx" when eps
// keeps every denominator d = sum + eps in the normal range, 1e-30 <= eps <= 1e30 (the sums are
// <= n after the first step), else "rn" (bench/notes/ARCHIVE.md "GPU, stop 25" and "Stop 36": in
// the backward it only concerns the recomputed forward, since the reverse steps on H = G * K take
// no reciprocal; at 32768 rows it gives 11.5 us against 13.6 with "rn", with errors of dlogits /
// dmixes within 1.1x those of the fp32 composite, tolerance 2x). The correctly rounded division
// and the knobs FUSEDOPS_SINKHORN4_FWD / _BWD that chose it went.
template <class Fn>
void with_arith4(float eps, Fn&& fn) {
  if (eps >= 1e-30f && eps <= 1e30f) fn(std::integral_constant<int, kMulApprox>{});
  else fn(std::integral_constant<int, kMulRn>{});
}

template <bool kFused>
void plan_backward4(SkParams& p, int part_floats, size_t* smem_bytes) {
  const int room = (kSmemBudgetFloats - part_floats) / (8 * kThreads4);
  p.seg = std::max(1, std::min(p.iters, room));
  *smem_bytes = static_cast<size_t>(hist_floats4(p.seg, Tile4<kFused>::kBwdFloats) + part_floats) *
                sizeof(float);
}

void run_fwd(const Context& ctx, const SinkhornFwdArgs& a) {
  cuda::DeviceGuard guard(kSinkhorn, ctx.device.index);
  const int n = static_cast<int>(a.logits.size(-1));
  SkParams p{};
  p.in = a.logits.data();
  p.in_rs = static_cast<int64_t>(n) * n;
  p.comb = a.out.data();
  p.rows = a.logits.numel() / (static_cast<int64_t>(n) * n);
  p.n = n;
  p.iters = a.num_iters;
  p.eps = static_cast<float>(a.eps);
  p.variant = static_cast<int>(a.variant);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cuda::visit_dtype(a.logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (fast4(n, p.variant)) {
      with_arith4(p.eps, [&](auto at) {
        cuda::launch_pdl(kSinkhorn, ctx.device.index, sinkhorn4_fwd_kernel<T, false, decltype(at)::value>,
                         blocks4(p.rows), kThreads4, 0, stream, p);
      });
      return;
    }
    with_group(n, [&](auto gt) {
      constexpr int G = decltype(gt)::value;
      sinkhorn_fwd_kernel<T, G, false><<<blocks_for(p.rows, G), kThreads, 0, stream>>>(p);
      FUSEDOPS_CUDA_LAUNCH_CHECK(kSinkhorn);
    });
  });
}

void run_bwd(const Context& ctx, const SinkhornBwdArgs& a) {
  cuda::DeviceGuard guard(kSinkhorn, ctx.device.index);
  const int n = static_cast<int>(a.logits.size(-1));
  SkParams p{};
  p.in = a.logits.data();
  p.in_rs = static_cast<int64_t>(n) * n;
  p.dcomb = a.dout.data();
  p.dcomb_rs = static_cast<int64_t>(n) * n;
  p.dout = a.dlogits.data();
  p.rows = a.logits.numel() / (static_cast<int64_t>(n) * n);
  p.n = n;
  p.iters = a.num_iters;
  p.eps = static_cast<float>(a.eps);
  p.variant = static_cast<int>(a.variant);
  size_t smem = 0;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (fast4(n, p.variant)) {
    plan_backward4<false>(p, 0, &smem);
    cuda::visit_dtype(a.logits.dtype(), [&](auto tag) {
      using T = decltype(tag);
      with_arith4(p.eps, [&](auto at) {
        cuda::launch_pdl(kSinkhorn, ctx.device.index, sinkhorn4_bwd_kernel<T, false, decltype(at)::value>,
                         blocks4(p.rows), kThreads4, smem, stream, p);
      });
    });
    return;
  }
  plan_backward(p, 0, &smem);
  cuda::visit_dtype(a.logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    with_group(n, [&](auto gt) {
      constexpr int G = decltype(gt)::value;
      sinkhorn_bwd_kernel<T, G, false><<<blocks_for(p.rows, G), kThreads, smem, stream>>>(p);
      FUSEDOPS_CUDA_LAUNCH_CHECK(kSinkhorn);
    });
  });
}

bool split_supports_fwd(const HcSplitSinkhornFwdArgs& a) { return a.hc_scale.dtype() == DType::kFloat32; }
bool split_supports_bwd(const HcSplitSinkhornBwdArgs& a) { return a.hc_scale.dtype() == DType::kFloat32; }

void split_fwd(const Context& ctx, const HcSplitSinkhornFwdArgs& a) {
  cuda::DeviceGuard guard(kSplit, ctx.device.index);
  const int n = a.hc_mult;
  SkParams p{};
  p.in = a.mixes.data();
  p.in_rs = a.mixes.row_stride();
  p.scale = a.hc_scale.data_as<const float>();
  p.base = a.hc_base.data_as<const float>();
  p.pre = a.pre.data();
  p.post = a.post.data();
  p.comb = a.comb.data();
  p.rows = a.mixes.rows();
  p.n = n;
  p.iters = a.sinkhorn_iters;
  p.eps = static_cast<float>(a.eps);
  p.variant = static_cast<int>(a.variant);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cuda::visit_dtype(a.mixes.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (fast4(n, p.variant)) {
      with_arith4(p.eps, [&](auto at) {
        cuda::launch_pdl(kSplit, ctx.device.index, sinkhorn4_fwd_kernel<T, true, decltype(at)::value>,
                         blocks4(p.rows), kThreads4, 0, stream, p);
      });
      return;
    }
    with_group(n, [&](auto gt) {
      constexpr int G = decltype(gt)::value;
      sinkhorn_fwd_kernel<T, G, true><<<blocks_for(p.rows, G), kThreads, 0, stream>>>(p);
      FUSEDOPS_CUDA_LAUNCH_CHECK(kSplit);
    });
  });
}

void split_bwd(const Context& ctx, const HcSplitSinkhornBwdArgs& a) {
  cuda::DeviceGuard guard(kSplit, ctx.device.index);
  const int n = a.hc_mult;
  const int np = mhc::split_param_count(n);
  SkParams p{};
  p.in = a.mixes.data();
  p.in_rs = a.mixes.rows() > 0 ? a.mixes.row_stride() : 0;
  p.scale = a.hc_scale.data_as<const float>();
  p.base = a.hc_base.data_as<const float>();
  p.dpre = a.dpre.defined() ? a.dpre.data() : nullptr;
  p.dpost = a.dpost.defined() ? a.dpost.data() : nullptr;
  p.dcomb = a.dcomb.defined() ? a.dcomb.data() : nullptr;
  p.dpre_rs = mhc::token_stride(a.dpre, 1);
  p.dpost_rs = mhc::token_stride(a.dpost, 1);
  p.dcomb_rs = mhc::token_stride(a.dcomb, 2);
  p.dout = a.dmixes.data();
  p.partials = a.workspace.defined() ? a.workspace.data_as<float>() : nullptr;
  p.rows = a.mixes.rows();
  p.n = n;
  p.iters = a.sinkhorn_iters;
  p.eps = static_cast<float>(a.eps);
  p.variant = static_cast<int>(a.variant);
  const int G = mhc::sinkhorn_group(n);
  // Partial sums of hc_split_sinkhorn_partial_rows(n) rows: one per block of the group kernels,
  // one per warp of the n = 4 kernel (both 32 rows for n = 4).
  const int64_t per = hc_split_sinkhorn_partial_rows(n);
  const int64_t partials = (p.rows + per - 1) / per;
  size_t smem = 0;
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (partials > 0 && fast4(n, p.variant)) {
    plan_backward4<true>(p, kThreads4 * np, &smem);
    cuda::visit_dtype(a.mixes.dtype(), [&](auto tag) {
      using T = decltype(tag);
      with_arith4(p.eps, [&](auto at) {
        cuda::launch_pdl(kSplit, ctx.device.index, sinkhorn4_bwd_kernel<T, true, decltype(at)::value>,
                         blocks4(p.rows), kThreads4, smem, stream, p);
      });
    });
  } else if (partials > 0) {
    plan_backward(p, (kThreads / G) * np, &smem);
    cuda::visit_dtype(a.mixes.dtype(), [&](auto tag) {
      using T = decltype(tag);
      with_group(n, [&](auto gt) {
        constexpr int kG = decltype(gt)::value;
        sinkhorn_bwd_kernel<T, kG, true><<<blocks_for(p.rows, kG), kThreads, smem, stream>>>(p);
        FUSEDOPS_CUDA_LAUNCH_CHECK(kSplit);
      });
    });
  }
  cuda::launch_pdl(kSplit, ctx.device.index, split_param_reduce_kernel, static_cast<unsigned>(np),
                   kReduceThreads, 0, stream, static_cast<const float*>(p.partials), partials, np,
                   a.dhc_scale.data_as<float>(), a.dhc_base.data_as<float>());
}

}  // namespace

void register_sinkhorn_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<SinkhornFwdArgs>(kSinkhorn, Direction::kForward, spec, nullptr, run_fwd);
  r.add<SinkhornBwdArgs>(kSinkhorn, Direction::kBackward, spec, nullptr, run_bwd);
  r.add<HcSplitSinkhornFwdArgs>(kSplit, Direction::kForward, spec, split_supports_fwd, split_fwd);
  r.add<HcSplitSinkhornBwdArgs>(kSplit, Direction::kBackward, spec, split_supports_bwd, split_bwd);
}

}  // namespace fusedops
