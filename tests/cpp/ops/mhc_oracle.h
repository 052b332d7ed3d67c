// Oracles of the mHC family tests, written from docs/specs/ops.md 3 and 9 independently of the library:
// plain loops in a floating type F, so F = double gives the float64 oracle and F = float the
// "plain composite in fp32" baseline of the precision policy (what the PyTorch composite that
// upcasts to fp32 computes: every operation rounded to fp32).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fusedops/ops/mhc.h"

namespace fusedops::testing::mhc_oracle {

// Sinkhorn of one n x n matrix (row-major) in precision F; the unrolled steps are kept for the
// backward. axis 1 = row step, 0 = column step.
template <class F>
struct Sinkhorn {
  int n;
  SinkhornVariant variant;
  std::vector<F> l, k0, s;                 // logits, start matrix, softmax (deepseek)
  std::vector<std::vector<F>> q;           // output of each step
  std::vector<std::vector<F>> d;           // sum + eps of each step
  std::vector<int> axis;
  std::vector<std::vector<F>> f, g;        // log variant potentials per iteration
  std::vector<F> p;                        // result

  Sinkhorn(const std::vector<F>& logits, int n_, int iters, F eps, SinkhornVariant v)
      : n(n_), variant(v), l(logits) {
    const int nn = n * n;
    if (v == SinkhornVariant::kLog) {
      std::vector<F> fv(n, F(0)), gv(n, F(0)), tmp(n);
      for (int t = 0; t < iters; ++t) {
        for (int i = 0; i < n; ++i) {
          for (int j = 0; j < n; ++j) tmp[j] = l[i * n + j] + gv[j];
          fv[i] = -lse(tmp);
        }
        for (int j = 0; j < n; ++j) {
          for (int i = 0; i < n; ++i) tmp[i] = l[i * n + j] + fv[i];
          gv[j] = -lse(tmp);
        }
        f.push_back(fv);
        g.push_back(gv);
      }
      p.assign(nn, F(0));
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) p[i * n + j] = std::exp(fv[i] + l[i * n + j] + gv[j]);
      return;
    }
    k0.assign(nn, F(0));
    s.assign(nn, F(0));
    for (int i = 0; i < n; ++i) {
      F m = -std::numeric_limits<F>::infinity();
      for (int j = 0; j < n; ++j) m = std::max(m, l[i * n + j]);
      F sum = 0;
      for (int j = 0; j < n; ++j) sum += (k0[i * n + j] = std::exp(l[i * n + j] - m));
      if (v == SinkhornVariant::kDeepSeek)
        for (int j = 0; j < n; ++j) {
          s[i * n + j] = k0[i * n + j] / sum;
          k0[i * n + j] = s[i * n + j] + eps;
        }
    }
    std::vector<F> k = k0;
    for (int t = 0; t < iters; ++t) {
      if (v == SinkhornVariant::kMindSpeed || t > 0) step(k, 1, eps);
      step(k, 0, eps);
    }
    p = k;
  }

  static F lse(const std::vector<F>& v) {
    F m = -std::numeric_limits<F>::infinity();
    for (F x : v) m = std::max(m, x);
    F sum = 0;
    for (F x : v) sum += std::exp(x - m);
    return m + std::log(sum);
  }

  void step(std::vector<F>& k, int ax, F eps) {
    std::vector<F> dd(n, F(0));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) dd[ax == 1 ? i : j] += k[i * n + j];
    for (F& x : dd) x += eps;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) k[i * n + j] = k[i * n + j] / dd[ax == 1 ? i : j];
    q.push_back(k);
    d.push_back(dd);
    axis.push_back(ax);
  }

  // dL for the output gradient dp (docs/specs/ops.md 3.3; rowmax is a constant).
  std::vector<F> backward(const std::vector<F>& dp) const {
    const int nn = n * n;
    std::vector<F> dl(nn, F(0));
    if (variant == SinkhornVariant::kLog) {
      const int iters = static_cast<int>(f.size());
      std::vector<F> fb(n, F(0)), gb(n, F(0));
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          const F z = dp[i * n + j] * p[i * n + j];
          dl[i * n + j] += z;
          fb[i] += z;
          gb[j] += z;
        }
      for (int t = iters - 1; t >= 0; --t) {
        const std::vector<F> gprev = t > 0 ? g[t - 1] : std::vector<F>(n, F(0));
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < n; ++j) {
            const F w = gb[j] * std::exp(l[i * n + j] + f[t][i] + g[t][j]);
            dl[i * n + j] -= w;
            fb[i] -= w;
          }
        std::vector<F> gn(n, F(0));
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < n; ++j) {
            const F w = fb[i] * std::exp(l[i * n + j] + gprev[j] + f[t][i]);
            dl[i * n + j] -= w;
            gn[j] -= w;
          }
        gb = gn;
        std::fill(fb.begin(), fb.end(), F(0));
      }
      return dl;
    }
    std::vector<F> gr = dp;
    for (int st = static_cast<int>(q.size()) - 1; st >= 0; --st) {
      std::vector<F> dot(n, F(0));
      const int ax = axis[st];
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) dot[ax == 1 ? i : j] += gr[i * n + j] * q[st][i * n + j];
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          const int a = ax == 1 ? i : j;
          gr[i * n + j] = (gr[i * n + j] - dot[a]) / d[st][a];
        }
    }
    if (variant == SinkhornVariant::kMindSpeed) {
      for (int e = 0; e < nn; ++e) dl[e] = gr[e] * k0[e];
    } else {
      for (int i = 0; i < n; ++i) {
        F dot = 0;
        for (int j = 0; j < n; ++j) dot += gr[i * n + j] * s[i * n + j];
        for (int j = 0; j < n; ++j) dl[i * n + j] = s[i * n + j] * (gr[i * n + j] - dot);
      }
    }
    return dl;
  }
};

template <class F>
std::vector<F> cast(const std::vector<double>& v) {
  return std::vector<F>(v.begin(), v.end());
}

inline std::vector<double> widen(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::vector<double> widen(const std::vector<double>& v) { return v; }

}  // namespace fusedops::testing::mhc_oracle
