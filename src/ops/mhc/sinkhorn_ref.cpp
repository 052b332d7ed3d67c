// sinkhorn and hc_split_sinkhorn, float64 reference: plain loops, the executable form of
// docs/specs/ops.md 3.2 - 3.4. The forward keeps every intermediate matrix; the backward walks the steps
// in reverse with the formula of docs/specs/ops.md 3.3 (no recomputation tricks).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/core/ref_util.h"
#include "src/ops/mhc/sinkhorn_common.h"

namespace fusedops {
namespace {

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

using Mat = std::vector<double>;  // n*n, row-major

// One normalisation step: Q = P / (sum_axis P + eps); axis 1 = rows (sum over the last index),
// axis 0 = columns.
struct Step {
  int axis;
  Mat q;                  // the step's output
  std::vector<double> d;  // sum + eps, per row or column
};

struct Trace {
  Mat k0;                            // starting matrix (mindspeed: exp(L - rowmax); deepseek: S + eps)
  Mat s;                             // deepseek: softmax_row(L)
  std::vector<Step> steps;           // multiplicative variants
  std::vector<std::vector<double>> f, g;  // log variant: potentials after each iteration
};

void normalise(Mat& k, int n, int axis, double eps, Trace* tr) {
  std::vector<double> d(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) d[axis == 1 ? i : j] += k[i * n + j];
  for (double& v : d) v += eps;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) k[i * n + j] /= d[axis == 1 ? i : j];
  if (tr) tr->steps.push_back({axis, k, d});
}

double row_max(const Mat& l, int n, int i) {
  double m = -std::numeric_limits<double>::infinity();
  for (int j = 0; j < n; ++j) m = std::max(m, l[i * n + j]);
  return m;
}

// -LSE_k(v_k), the log-domain normalisation of the log variant.
double neg_lse(const std::vector<double>& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : v) m = std::max(m, x);
  double s = 0;
  for (double x : v) s += std::exp(x - m);
  return -(m + std::log(s));
}

Mat forward(const Mat& l, int n, int iters, double eps, SinkhornVariant variant, Trace* tr) {
  Mat k(n * n);
  if (variant == SinkhornVariant::kLog) {
    std::vector<double> f(n, 0.0), g(n, 0.0), v(n);
    for (int t = 0; t < iters; ++t) {
      for (int j = 0; j < n; ++j) {
        for (int c = 0; c < n; ++c) v[c] = l[j * n + c] + g[c];
        f[j] = neg_lse(v);
      }
      for (int c = 0; c < n; ++c) {
        for (int j = 0; j < n; ++j) v[j] = l[j * n + c] + f[j];
        g[c] = neg_lse(v);
      }
      if (tr) {
        tr->f.push_back(f);
        tr->g.push_back(g);
      }
    }
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < n; ++c) k[j * n + c] = std::exp(f[j] + l[j * n + c] + g[c]);
    return k;
  }
  Mat s(n * n);
  for (int i = 0; i < n; ++i) {
    const double m = row_max(l, n, i);
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += (k[i * n + j] = std::exp(l[i * n + j] - m));
    if (variant == SinkhornVariant::kDeepSeek)
      for (int j = 0; j < n; ++j) {
        s[i * n + j] = k[i * n + j] / sum;
        k[i * n + j] = s[i * n + j] + eps;
      }
  }
  if (tr) {
    tr->k0 = k;
    tr->s = s;
  }
  for (int t = 0; t < iters; ++t) {
    if (variant == SinkhornVariant::kMindSpeed || t > 0) normalise(k, n, 1, eps, tr);
    normalise(k, n, 0, eps, tr);
  }
  return k;
}

// dL for the unrolled iteration (docs/specs/ops.md 3.3); rowmax is a constant.
Mat backward(const Mat& l, const Mat& dp, int n, int iters, double eps, SinkhornVariant variant) {
  Trace tr;
  const Mat p = forward(l, n, iters, eps, variant, &tr);
  Mat dl(n * n, 0.0);
  if (variant == SinkhornVariant::kLog) {
    // P = exp(f + L + g): dZ = dP * P flows into L, f (row sums) and g (column sums).
    std::vector<double> fbar(n, 0.0), gbar(n, 0.0);
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < n; ++c) {
        const double dz = dp[j * n + c] * p[j * n + c];
        dl[j * n + c] += dz;
        fbar[j] += dz;
        gbar[c] += dz;
      }
    for (int t = iters - 1; t >= 0; --t) {
      const auto& f = tr.f[t];
      const auto& g = tr.g[t];
      const std::vector<double> gprev = t > 0 ? tr.g[t - 1] : std::vector<double>(n, 0.0);
      // g_c = -LSE_j(L_jc + f_j): d/dL_jc = d/df_j = -B_jc, B_jc = exp(L_jc + f_j + g_c).
      for (int j = 0; j < n; ++j)
        for (int c = 0; c < n; ++c) {
          const double b = std::exp(l[j * n + c] + f[j] + g[c]);
          dl[j * n + c] -= gbar[c] * b;
          fbar[j] -= gbar[c] * b;
        }
      // f_j = -LSE_c(L_jc + gprev_c): d/dL_jc = d/dgprev_c = -A_jc, A_jc = exp(L_jc + gprev_c + f_j).
      std::vector<double> gnew(n, 0.0);
      for (int j = 0; j < n; ++j)
        for (int c = 0; c < n; ++c) {
          const double a = std::exp(l[j * n + c] + gprev[c] + f[j]);
          dl[j * n + c] -= fbar[j] * a;
          gnew[c] -= fbar[j] * a;
        }
      gbar = gnew;
      std::fill(fbar.begin(), fbar.end(), 0.0);
    }
    return dl;
  }
  Mat g = dp;
  for (auto it = tr.steps.rbegin(); it != tr.steps.rend(); ++it) {
    // dP = (dQ - sum_axis(dQ * Q)) / (s + eps)
    std::vector<double> dot(n, 0.0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) dot[it->axis == 1 ? i : j] += g[i * n + j] * it->q[i * n + j];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const int a = it->axis == 1 ? i : j;
        g[i * n + j] = (g[i * n + j] - dot[a]) / it->d[a];
      }
  }
  if (variant == SinkhornVariant::kMindSpeed) {
    for (int e = 0; e < n * n; ++e) dl[e] = g[e] * tr.k0[e];
  } else {
    // K0 = S + eps: dS = g; softmax backward per row.
    for (int i = 0; i < n; ++i) {
      double dot = 0;
      for (int j = 0; j < n; ++j) dot += g[i * n + j] * tr.s[i * n + j];
      for (int j = 0; j < n; ++j) dl[i * n + j] = tr.s[i * n + j] * (g[i * n + j] - dot);
    }
  }
  return dl;
}

Mat load_mat(const TensorView& t, int64_t offset, int n) {
  Mat m(n * n);
  for (int e = 0; e < n * n; ++e) m[e] = ref::load(t, offset + e);
  return m;
}

void run_fwd(const Context&, const SinkhornFwdArgs& a) {
  const int n = static_cast<int>(a.logits.size(-1));
  const int64_t mats = a.logits.numel() / (n * n);
  for (int64_t b = 0; b < mats; ++b) {
    const Mat p = forward(load_mat(a.logits, b * n * n, n), n, a.num_iters, a.eps, a.variant, nullptr);
    for (int e = 0; e < n * n; ++e) ref::store(a.out, b * n * n + e, p[e]);
  }
}

void run_bwd(const Context&, const SinkhornBwdArgs& a) {
  const int n = static_cast<int>(a.logits.size(-1));
  const int64_t mats = a.logits.numel() / (n * n);
  for (int64_t b = 0; b < mats; ++b) {
    const Mat dl = backward(load_mat(a.logits, b * n * n, n), load_mat(a.dout, b * n * n, n), n,
                            a.num_iters, a.eps, a.variant);
    for (int e = 0; e < n * n; ++e) ref::store(a.dlogits, b * n * n + e, dl[e]);
  }
}

double sigmoid(double u) { return 1.0 / (1.0 + std::exp(-u)); }

void split_fwd(const Context&, const HcSplitSinkhornFwdArgs& a) {
  const int n = a.hc_mult;
  const int64_t rows = a.mixes.rows(), rs = a.mixes.row_stride();
  std::vector<double> scale(3), base((2 + n) * n);
  for (int i = 0; i < 3; ++i) scale[i] = ref::load(a.hc_scale, i);
  for (size_t i = 0; i < base.size(); ++i) base[i] = ref::load(a.hc_base, static_cast<int64_t>(i));
  for (int64_t r = 0; r < rows; ++r) {
    auto m = [&](int e) { return ref::load(a.mixes, r * rs + e); };
    for (int i = 0; i < n; ++i) {
      ref::store(a.pre, r * n + i, sigmoid(scale[0] * m(i) + base[i]) + a.eps);
      ref::store(a.post, r * n + i, 2.0 * sigmoid(scale[1] * m(n + i) + base[n + i]));
    }
    Mat l(n * n);
    for (int e = 0; e < n * n; ++e) l[e] = scale[2] * m(2 * n + e) + base[2 * n + e];
    const Mat p = forward(l, n, a.sinkhorn_iters, a.eps, a.variant, nullptr);
    for (int e = 0; e < n * n; ++e) ref::store(a.comb, r * n * n + e, p[e]);
  }
}

void split_bwd(const Context&, const HcSplitSinkhornBwdArgs& a) {
  const int n = a.hc_mult;
  const int64_t rows = a.mixes.rows(), rs = a.mixes.row_stride();
  std::vector<double> scale(3), base((2 + n) * n);
  for (int i = 0; i < 3; ++i) scale[i] = ref::load(a.hc_scale, i);
  for (size_t i = 0; i < base.size(); ++i) base[i] = ref::load(a.hc_base, static_cast<int64_t>(i));
  std::vector<double> dscale(3, 0.0), dbase(base.size(), 0.0);
  auto grad = [](const TensorView& t, int64_t i) { return t.defined() ? ref::load(t, i) : 0.0; };
  const int64_t spre = mhc::token_stride(a.dpre, 1), spost = mhc::token_stride(a.dpost, 1);
  const int64_t scomb = mhc::token_stride(a.dcomb, 2);
  for (int64_t r = 0; r < rows; ++r) {
    auto m = [&](int e) { return ref::load(a.mixes, r * rs + e); };
    for (int i = 0; i < n; ++i) {
      const double sp = sigmoid(scale[0] * m(i) + base[i]);
      const double du = grad(a.dpre, r * spre + i) * sp * (1 - sp);
      ref::store(a.dmixes, r * (2 + n) * n + i, du * scale[0]);
      dscale[0] += du * m(i);
      dbase[i] += du;
      const double sq = sigmoid(scale[1] * m(n + i) + base[n + i]);
      const double dv = grad(a.dpost, r * spost + i) * 2.0 * sq * (1 - sq);
      ref::store(a.dmixes, r * (2 + n) * n + n + i, dv * scale[1]);
      dscale[1] += dv * m(n + i);
      dbase[n + i] += dv;
    }
    Mat l(n * n), dp(n * n);
    for (int e = 0; e < n * n; ++e) {
      l[e] = scale[2] * m(2 * n + e) + base[2 * n + e];
      dp[e] = grad(a.dcomb, r * scomb + e);
    }
    const Mat dz = backward(l, dp, n, a.sinkhorn_iters, a.eps, a.variant);
    for (int e = 0; e < n * n; ++e) {
      ref::store(a.dmixes, r * (2 + n) * n + 2 * n + e, dz[e] * scale[2]);
      dscale[2] += dz[e] * m(2 * n + e);
      dbase[2 * n + e] += dz[e];
    }
  }
  for (int i = 0; i < 3; ++i) ref::store(a.dhc_scale, i, dscale[i]);
  for (size_t i = 0; i < dbase.size(); ++i) ref::store(a.dhc_base, static_cast<int64_t>(i), dbase[i]);
}

}  // namespace

void register_sinkhorn_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<SinkhornFwdArgs>("sinkhorn", Direction::kForward, spec, nullptr, run_fwd);
  r.add<SinkhornBwdArgs>("sinkhorn", Direction::kBackward, spec, nullptr, run_bwd);
  r.add<HcSplitSinkhornFwdArgs>("hc_split_sinkhorn", Direction::kForward, spec, nullptr, split_fwd);
  r.add<HcSplitSinkhornBwdArgs>("hc_split_sinkhorn", Direction::kBackward, spec, nullptr, split_bwd);
}

}  // namespace fusedops
