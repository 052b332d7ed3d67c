// sinkhorn and hc_split_sinkhorn, CPU backend. Matrices are processed 16 at a time in
// structure-of-arrays form (element e of matrix l at [e][l]), so every loop over the 16 lanes
// vectorises. fp32 math; the algorithm is the one of the CUDA backend (README.md):
//   forward: each step computes the row (or column) sums, d = sum + eps, inv = 1/d, and scales;
//   backward: recompute the forward keeping d of every step, then walk the steps in reverse on
//     H = G * Q: H <- H - Q * sum_axis(H), and rebuild the step's input as Q * d.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/ops/mhc/sinkhorn_common.h"

namespace fusedops {
namespace {

constexpr int kL = 16;  // matrices per block (SIMD lanes)

// Per-block scratch: n*n elements of 16 lanes each, plus the step history.
struct Block {
  int n = 0;
  std::vector<float> l;     // logits
  std::vector<float> k;     // current matrix (multiplicative variants)
  std::vector<float> g;     // adjoint
  std::vector<float> hist;  // [iters][2][n][kL]: row and column denominators (or f, g)
  std::vector<float> f, gg; // log variant potentials [n][kL]

  Block(int n_, int iters) : n(n_) {
    l.assign(n * n * kL, 0.0f);
    k.assign(n * n * kL, 0.0f);
    g.assign(n * n * kL, 0.0f);
    hist.assign(static_cast<size_t>(iters) * 2 * n * kL, 0.0f);
    f.assign(n * kL, 0.0f);
    gg.assign(n * kL, 0.0f);
  }
  float* L(int i, int j) { return &l[(i * n + j) * kL]; }
  float* K(int i, int j) { return &k[(i * n + j) * kL]; }
  float* G(int i, int j) { return &g[(i * n + j) * kL]; }
  float* H(int t, int which, int i) { return &hist[((static_cast<size_t>(t) * 2 + which) * n + i) * kL]; }
};

bool has_row_step(SinkhornVariant v, int t) { return v == SinkhornVariant::kMindSpeed || t > 0; }

// K0 from the logits: mindspeed exp(L - rowmax); deepseek softmax_row(L) + eps. `div`: divide
// (the backward's recomputation, see normalise) instead of multiplying by the reciprocal.
void init_k(Block& b, SinkhornVariant v, float eps, bool div) {
  const int n = b.n;
  for (int i = 0; i < n; ++i) {
    float m[kL], s[kL];
    for (int q = 0; q < kL; ++q) m[q] = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < n; ++j)
      for (int q = 0; q < kL; ++q) m[q] = std::max(m[q], b.L(i, j)[q]);
    for (int q = 0; q < kL; ++q) s[q] = 0.0f;
    for (int j = 0; j < n; ++j) {
      float* kk = b.K(i, j);
      const float* ll = b.L(i, j);
      for (int q = 0; q < kL; ++q) {
        kk[q] = std::exp(ll[q] - m[q]);
        s[q] += kk[q];
      }
    }
    if (v == SinkhornVariant::kDeepSeek) {
      float inv[kL];
      for (int q = 0; q < kL; ++q) inv[q] = 1.0f / s[q];
      for (int j = 0; j < n; ++j) {
        float* kk = b.K(i, j);
        if (div) {
          for (int q = 0; q < kL; ++q) kk[q] = kk[q] / s[q] + eps;
        } else {
          for (int q = 0; q < kL; ++q) kk[q] = kk[q] * inv[q] + eps;
        }
      }
    }
  }
}

// One normalisation along rows (axis 1) or columns (axis 0); writes d = sum + eps to dsave.
// The forward multiplies by 1/d (as accurate for P, and cheaper on the GPU); the backward's
// recomputation divides (correctly rounded), which halves the error of the gradients: the
// reverse steps below divide by the same d and rebuild each step's input as Q * d.
void normalise(Block& b, int axis, float eps, float* dsave_base, bool div) {
  const int n = b.n;
  for (int a = 0; a < n; ++a) {
    float s[kL] = {};
    for (int o = 0; o < n; ++o) {
      const float* kk = axis == 1 ? b.K(a, o) : b.K(o, a);
      for (int q = 0; q < kL; ++q) s[q] += kk[q];
    }
    float inv[kL];
    for (int q = 0; q < kL; ++q) {
      const float d = s[q] + eps;
      if (dsave_base) dsave_base[a * kL + q] = d;
      inv[q] = 1.0f / d;
    }
    for (int o = 0; o < n; ++o) {
      float* kk = axis == 1 ? b.K(a, o) : b.K(o, a);
      if (div) {
        const float* d = dsave_base + a * kL;
        for (int q = 0; q < kL; ++q) kk[q] /= d[q];
      } else {
        for (int q = 0; q < kL; ++q) kk[q] *= inv[q];
      }
    }
  }
}

// Iterations [t0, t1); `save` (the backward) keeps every d in the history and divides.
void iterate(Block& b, SinkhornVariant v, float eps, int t0, int t1, bool save) {
  for (int t = t0; t < t1; ++t) {
    if (has_row_step(v, t)) normalise(b, 1, eps, save ? b.H(t, 0, 0) : nullptr, save);
    normalise(b, 0, eps, save ? b.H(t, 1, 0) : nullptr, save);
  }
}

// Reverse of one step whose output is the current K, on H = G * K (the adjoint times the step's
// output, element-wise). With G_in = (G - sum_axis(G * K)) / d and K_in = K * d:
//   H_in = G_in * K_in = H - K * sum_axis(H),   K <- K * d,
// so the reverse needs no division and no reciprocal (README.md).
void reverse_step(Block& b, int axis, const float* d_base) {
  const int n = b.n;
  for (int a = 0; a < n; ++a) {
    float s[kL] = {};
    const float* d = d_base + a * kL;
    for (int o = 0; o < n; ++o) {
      const float* hh = axis == 1 ? b.G(a, o) : b.G(o, a);
      for (int q = 0; q < kL; ++q) s[q] += hh[q];
    }
    for (int o = 0; o < n; ++o) {
      float* kk = axis == 1 ? b.K(a, o) : b.K(o, a);
      float* hh = axis == 1 ? b.G(a, o) : b.G(o, a);
      for (int q = 0; q < kL; ++q) {
        hh[q] = std::fma(-kk[q], s[q], hh[q]);
        kk[q] *= d[q];
      }
    }
  }
}

// ---- log variant -----------------------------------------------------------------------------

// f_i = -LSE_j(L_ij + g_j) (axis 1) or g_j = -LSE_i(L_ij + f_i) (axis 0), for every lane.
void lse_step(Block& b, int axis) {
  const int n = b.n;
  std::vector<float>& out = axis == 1 ? b.f : b.gg;
  const std::vector<float>& other = axis == 1 ? b.gg : b.f;
  for (int a = 0; a < n; ++a) {
    float m[kL], s[kL] = {};
    for (int q = 0; q < kL; ++q) m[q] = -std::numeric_limits<float>::infinity();
    for (int o = 0; o < n; ++o) {
      const float* ll = axis == 1 ? b.L(a, o) : b.L(o, a);
      for (int q = 0; q < kL; ++q) m[q] = std::max(m[q], ll[q] + other[o * kL + q]);
    }
    for (int o = 0; o < n; ++o) {
      const float* ll = axis == 1 ? b.L(a, o) : b.L(o, a);
      for (int q = 0; q < kL; ++q) s[q] += std::exp(ll[q] + other[o * kL + q] - m[q]);
    }
    for (int q = 0; q < kL; ++q) out[a * kL + q] = -(m[q] + std::log(s[q]));
  }
}

void log_iterate(Block& b, int t0, int t1, bool save) {
  const int n = b.n;
  for (int t = t0; t < t1; ++t) {
    lse_step(b, 1);
    lse_step(b, 0);
    if (save) {
      std::copy(b.f.begin(), b.f.end(), b.H(t, 0, 0));
      std::copy(b.gg.begin(), b.gg.end(), b.H(t, 1, 0));
    }
  }
  (void)n;
}

void log_output(Block& b) {
  const int n = b.n;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      float* kk = b.K(i, j);
      const float* ll = b.L(i, j);
      for (int q = 0; q < kL; ++q) kk[q] = std::exp(b.f[i * kL + q] + ll[q] + b.gg[j * kL + q]);
    }
}

// Forward of one block: K = the result.
void forward(Block& b, int iters, float eps, SinkhornVariant v) {
  if (v == SinkhornVariant::kLog) {
    std::fill(b.gg.begin(), b.gg.end(), 0.0f);
    log_iterate(b, 0, iters, false);
    log_output(b);
    return;
  }
  init_k(b, v, eps, false);
  iterate(b, v, eps, 0, iters, false);
}

// Backward of one block: G holds dP on entry and dL on exit (L unchanged).
void backward(Block& b, int iters, float eps, SinkhornVariant v) {
  const int n = b.n;
  if (v == SinkhornVariant::kLog) {
    std::fill(b.gg.begin(), b.gg.end(), 0.0f);
    log_iterate(b, 0, iters, true);
    log_output(b);  // K = P
    std::vector<float> fbar(n * kL, 0.0f), gbar(n * kL, 0.0f), gnew(n * kL);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        float* gg = b.G(i, j);
        const float* kk = b.K(i, j);
        for (int q = 0; q < kL; ++q) {
          gg[q] *= kk[q];  // dZ = dP * P; G now accumulates dL
          fbar[i * kL + q] += gg[q];
        }
      }
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < n; ++i)
        for (int q = 0; q < kL; ++q) gbar[j * kL + q] += b.G(i, j)[q];
    for (int t = iters - 1; t >= 0; --t) {
      const float* f = b.H(t, 0, 0);
      const float* g = b.H(t, 1, 0);
      const float* gp = t > 0 ? b.H(t - 1, 1, 0) : nullptr;
      // g-step: B_ij = exp(L_ij + f_i + g_j); dL_ij -= gbar_j B_ij; fbar_i -= sum_j gbar_j B_ij.
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          float* gg = b.G(i, j);
          const float* ll = b.L(i, j);
          for (int q = 0; q < kL; ++q) {
            const float w = gbar[j * kL + q] * std::exp(ll[q] + f[i * kL + q] + g[j * kL + q]);
            gg[q] -= w;
            fbar[i * kL + q] -= w;
          }
        }
      // f-step: A_ij = exp(L_ij + gprev_j + f_i); dL_ij -= fbar_i A_ij; gbar'_j = -sum_i fbar_i A_ij.
      std::fill(gnew.begin(), gnew.end(), 0.0f);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          float* gg = b.G(i, j);
          const float* ll = b.L(i, j);
          for (int q = 0; q < kL; ++q) {
            const float w =
                fbar[i * kL + q] * std::exp(ll[q] + (gp ? gp[j * kL + q] : 0.0f) + f[i * kL + q]);
            gg[q] -= w;
            gnew[j * kL + q] -= w;
          }
        }
      gbar.swap(gnew);
      std::fill(fbar.begin(), fbar.end(), 0.0f);
    }
    return;
  }
  init_k(b, v, eps, true);
  iterate(b, v, eps, 0, iters, true);
  for (int e = 0; e < n * n; ++e)
    for (int q = 0; q < kL; ++q) b.g[e * kL + q] *= b.k[e * kL + q];  // H = dP * P
  for (int t = iters - 1; t >= 0; --t) {
    reverse_step(b, 0, b.H(t, 1, 0));
    if (has_row_step(v, t)) reverse_step(b, 1, b.H(t, 0, 0));
  }
  // G = H0 = dK0 * K0. mindspeed: K0 = exp(L - rowmax), so dL = dK0 * K0 = H0. deepseek:
  // K0 = S + eps with S = softmax_row(L) recomputed exactly; dK0 = H0 / K0 and the softmax
  // backward dL = S * (dK0 - sum_row(dK0 * S)).
  if (v == SinkhornVariant::kMindSpeed) return;
  init_k(b, SinkhornVariant::kMindSpeed, eps, true);  // K = exp(L - rowmax)
  for (int i = 0; i < n; ++i) {
    float s[kL] = {}, dot[kL] = {};
    for (int j = 0; j < n; ++j)
      for (int q = 0; q < kL; ++q) s[q] += b.K(i, j)[q];
    for (int j = 0; j < n; ++j) {
      float* kk = b.K(i, j);
      float* gg = b.G(i, j);
      for (int q = 0; q < kL; ++q) {
        kk[q] /= s[q];                   // S, as in the recomputation
        gg[q] = kk[q] + eps > 0.0f ? gg[q] / (kk[q] + eps) : 0.0f;  // dK0 (S = 0: no gradient)
        dot[q] += gg[q] * kk[q];
      }
    }
    for (int j = 0; j < n; ++j) {
      float* gg = b.G(i, j);
      const float* kk = b.K(i, j);
      for (int q = 0; q < kL; ++q) gg[q] = kk[q] * (gg[q] - dot[q]);
    }
  }
}

// ---- sinkhorn --------------------------------------------------------------------------------

template <class T>
void sinkhorn_fwd_typed(const SinkhornFwdArgs& a) {
  const int n = static_cast<int>(a.logits.size(-1));
  const int64_t mats = a.logits.numel() / (n * n);
  const int64_t blocks = (mats + kL - 1) / kL;
  const T* in = a.logits.data_as<const T>();
  T* out = a.out.data_as<T>();
  const float eps = static_cast<float>(a.eps);
  cpu::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    Block b(n, 0);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t m0 = blk * kL;
      const int lanes = static_cast<int>(std::min<int64_t>(kL, mats - m0));
      std::fill(b.l.begin(), b.l.end(), 0.0f);
      for (int q = 0; q < lanes; ++q)
        for (int e = 0; e < n * n; ++e) b.l[e * kL + q] = to_float(in[(m0 + q) * n * n + e]);
      forward(b, a.num_iters, eps, a.variant);
      for (int q = 0; q < lanes; ++q)
        for (int e = 0; e < n * n; ++e) out[(m0 + q) * n * n + e] = from_float<T>(b.k[e * kL + q]);
    }
  });
}

template <class T>
void sinkhorn_bwd_typed(const SinkhornBwdArgs& a) {
  const int n = static_cast<int>(a.logits.size(-1));
  const int64_t mats = a.logits.numel() / (n * n);
  const int64_t blocks = (mats + kL - 1) / kL;
  const T* in = a.logits.data_as<const T>();
  const T* dout = a.dout.data_as<const T>();
  T* dl = a.dlogits.data_as<T>();
  const float eps = static_cast<float>(a.eps);
  cpu::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    Block b(n, a.num_iters);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t m0 = blk * kL;
      const int lanes = static_cast<int>(std::min<int64_t>(kL, mats - m0));
      std::fill(b.l.begin(), b.l.end(), 0.0f);
      std::fill(b.g.begin(), b.g.end(), 0.0f);
      for (int q = 0; q < lanes; ++q)
        for (int e = 0; e < n * n; ++e) {
          b.l[e * kL + q] = to_float(in[(m0 + q) * n * n + e]);
          b.g[e * kL + q] = to_float(dout[(m0 + q) * n * n + e]);
        }
      backward(b, a.num_iters, eps, a.variant);
      for (int q = 0; q < lanes; ++q)
        for (int e = 0; e < n * n; ++e) dl[(m0 + q) * n * n + e] = from_float<T>(b.g[e * kL + q]);
    }
  });
}

void run_fwd(const Context&, const SinkhornFwdArgs& a) {
  visit_float(a.logits.dtype(), [&](auto t) { sinkhorn_fwd_typed<decltype(t)>(a); });
}

void run_bwd(const Context&, const SinkhornBwdArgs& a) {
  visit_float(a.logits.dtype(), [&](auto t) { sinkhorn_bwd_typed<decltype(t)>(a); });
}

// ---- hc_split_sinkhorn -----------------------------------------------------------------------

float sigmoidf(float u) { return 1.0f / (1.0f + std::exp(-u)); }

bool split_supports_fwd(const HcSplitSinkhornFwdArgs& a) { return a.hc_scale.dtype() == DType::kFloat32; }
bool split_supports_bwd(const HcSplitSinkhornBwdArgs& a) { return a.hc_scale.dtype() == DType::kFloat32; }

template <class T>
void split_fwd_typed(const HcSplitSinkhornFwdArgs& a) {
  const int n = a.hc_mult, w = (2 + n) * n;
  const int64_t rows = a.mixes.rows(), rs = a.mixes.row_stride();
  const int64_t blocks = (rows + kL - 1) / kL;
  const T* mixes = a.mixes.data_as<const T>();
  const float* sc = a.hc_scale.data_as<const float>();
  const float* base = a.hc_base.data_as<const float>();
  T* pre = a.pre.data_as<T>();
  T* post = a.post.data_as<T>();
  T* comb = a.comb.data_as<T>();
  const float eps = static_cast<float>(a.eps);
  cpu::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    Block b(n, 0);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * kL;
      const int lanes = static_cast<int>(std::min<int64_t>(kL, rows - r0));
      std::fill(b.l.begin(), b.l.end(), 0.0f);
      for (int q = 0; q < lanes; ++q) {
        const T* m = mixes + (r0 + q) * rs;
        for (int i = 0; i < n; ++i) {
          pre[(r0 + q) * n + i] = from_float<T>(sigmoidf(sc[0] * to_float(m[i]) + base[i]) + eps);
          post[(r0 + q) * n + i] =
              from_float<T>(2.0f * sigmoidf(sc[1] * to_float(m[n + i]) + base[n + i]));
        }
        for (int e = 0; e < n * n; ++e)
          b.l[e * kL + q] = sc[2] * to_float(m[2 * n + e]) + base[2 * n + e];
      }
      forward(b, a.sinkhorn_iters, eps, a.variant);
      for (int q = 0; q < lanes; ++q)
        for (int e = 0; e < n * n; ++e) comb[(r0 + q) * n * n + e] = from_float<T>(b.k[e * kL + q]);
    }
  });
  (void)w;
}

template <class T>
void split_bwd_typed(const HcSplitSinkhornBwdArgs& a) {
  const int n = a.hc_mult, w = (2 + n) * n, np = mhc::split_param_count(n);
  const int64_t rows = a.mixes.rows(), rs = a.mixes.row_stride();
  const int64_t per = hc_split_sinkhorn_partial_rows(n);
  const int64_t partials = (rows + per - 1) / per;
  const T* mixes = a.mixes.data_as<const T>();
  const float* sc = a.hc_scale.data_as<const float>();
  const float* base = a.hc_base.data_as<const float>();
  const T* dpre = a.dpre.defined() ? a.dpre.data_as<const T>() : nullptr;
  const T* dpost = a.dpost.defined() ? a.dpost.data_as<const T>() : nullptr;
  const T* dcomb = a.dcomb.defined() ? a.dcomb.data_as<const T>() : nullptr;
  const int64_t spre = mhc::token_stride(a.dpre, 1), spost = mhc::token_stride(a.dpost, 1);
  const int64_t scomb = mhc::token_stride(a.dcomb, 2);
  T* dmixes = a.dmixes.data_as<T>();
  float* part = partials > 0 ? a.workspace.data_as<float>() : nullptr;
  const float eps = static_cast<float>(a.eps);
  // Stage 1: one partial per `per` rows, rows added in order.
  cpu::parallel_for(0, partials, 1, [&](int64_t p0, int64_t p1) {
    Block b(n, a.sinkhorn_iters);
    std::vector<float> contrib(kL * np);
    for (int64_t pi = p0; pi < p1; ++pi) {
      float* acc = part + pi * np;
      std::fill(acc, acc + np, 0.0f);
      const int64_t row_end = std::min(rows, (pi + 1) * per);
      for (int64_t r0 = pi * per; r0 < row_end; r0 += kL) {
        const int lanes = static_cast<int>(std::min<int64_t>(kL, row_end - r0));
        std::fill(b.l.begin(), b.l.end(), 0.0f);
        std::fill(b.g.begin(), b.g.end(), 0.0f);
        std::fill(contrib.begin(), contrib.end(), 0.0f);
        for (int q = 0; q < lanes; ++q) {
          const int64_t r = r0 + q;
          const T* m = mixes + r * rs;
          float* c = &contrib[q * np];
          T* dm = dmixes + r * w;
          for (int i = 0; i < n; ++i) {
            const float mp = to_float(m[i]), mq = to_float(m[n + i]);
            const float sp = sigmoidf(sc[0] * mp + base[i]);
            const float du = (dpre ? to_float(dpre[r * spre + i]) : 0.0f) * sp * (1.0f - sp);
            dm[i] = from_float<T>(du * sc[0]);
            c[0] += du * mp;
            c[3 + i] = du;
            const float sq = sigmoidf(sc[1] * mq + base[n + i]);
            const float dv = (dpost ? to_float(dpost[r * spost + i]) : 0.0f) * 2.0f * sq * (1.0f - sq);
            dm[n + i] = from_float<T>(dv * sc[1]);
            c[1] += dv * mq;
            c[3 + n + i] = dv;
          }
          for (int e = 0; e < n * n; ++e) {
            b.l[e * kL + q] = sc[2] * to_float(m[2 * n + e]) + base[2 * n + e];
            b.g[e * kL + q] = dcomb ? to_float(dcomb[r * scomb + e]) : 0.0f;
          }
        }
        backward(b, a.sinkhorn_iters, eps, a.variant);
        for (int q = 0; q < lanes; ++q) {
          const int64_t r = r0 + q;
          const T* m = mixes + r * rs;
          float* c = &contrib[q * np];
          T* dm = dmixes + r * w;
          for (int e = 0; e < n * n; ++e) {
            const float dz = b.g[e * kL + q];
            dm[2 * n + e] = from_float<T>(dz * sc[2]);
            c[2] += dz * to_float(m[2 * n + e]);
            c[3 + 2 * n + e] = dz;
          }
          for (int p = 0; p < np; ++p) acc[p] += c[p];
        }
      }
    }
  });
  // Stage 2: the partials in order.
  float* dscale = a.dhc_scale.data_as<float>();
  float* dbase = a.dhc_base.data_as<float>();
  for (int p = 0; p < np; ++p) {
    float s = 0.0f;
    for (int64_t pi = 0; pi < partials; ++pi) s += part[pi * np + p];
    if (p < 3) dscale[p] = s;
    else dbase[p - 3] = s;
  }
}

void split_fwd(const Context&, const HcSplitSinkhornFwdArgs& a) {
  visit_float(a.mixes.dtype(), [&](auto t) { split_fwd_typed<decltype(t)>(a); });
}

void split_bwd(const Context&, const HcSplitSinkhornBwdArgs& a) {
  visit_float(a.mixes.dtype(), [&](auto t) { split_bwd_typed<decltype(t)>(a); });
}

}  // namespace

void register_sinkhorn_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<SinkhornFwdArgs>("sinkhorn", Direction::kForward, spec, nullptr, run_fwd);
  r.add<SinkhornBwdArgs>("sinkhorn", Direction::kBackward, spec, nullptr, run_bwd);
  r.add<HcSplitSinkhornFwdArgs>("hc_split_sinkhorn", Direction::kForward, spec, split_supports_fwd,
                                split_fwd);
  r.add<HcSplitSinkhornBwdArgs>("hc_split_sinkhorn", Direction::kBackward, spec, split_supports_bwd,
                                split_bwd);
}

}  // namespace fusedops
