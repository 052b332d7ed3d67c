// The float64 cross-entropy of one row (docs/specs/ops.md 1.3-1.4), shared by the reference backends of
// fused_cross_entropy_loss and chunk_loss.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fusedops/ops/cross_entropy.h"

namespace fusedops::ce {

struct RefRow {
  double loss = 0;  // l_i (z-loss included); NaN for a label outside [0, V)
  double z = 0;     // lambda lse^2
};

// x: the row's logits. When grad is given it receives c * dl/dx (c = w_i / norm_i).
inline RefRow ref_row(const std::vector<double>& x, int64_t y, const CrossEntropyOptions& o,
                      double c, std::vector<double>* grad) {
  const int64_t V = static_cast<int64_t>(x.size());
  const double eps = o.label_smoothing, lambda = o.lse_square_scale, scale = o.logit_scale;
  const bool capped = o.logit_softcapping.has_value();
  const double cap = capped ? *o.logit_softcapping : 1.0;
  std::vector<double> z(V), t(V, 0.0);
  for (int64_t v = 0; v < V; ++v) {
    z[v] = scale * x[v];
    if (capped) {
      t[v] = std::tanh(z[v] / cap);
      z[v] = cap * t[v];
    }
  }
  double m = -std::numeric_limits<double>::infinity(), sz = 0;
  for (int64_t v = 0; v < V; ++v) {
    m = std::max(m, z[v]);
    sz += z[v];
  }
  double d = 0;
  for (int64_t v = 0; v < V; ++v) d += std::exp(z[v] - m);
  const double lse = m + std::log(d);
  const bool in_range = y >= 0 && y < V;
  const double zy = in_range ? z[y] : std::numeric_limits<double>::quiet_NaN();
  RefRow r;
  r.z = lambda * lse * lse;
  // The smoothing term only with smoothing: with eps = 0, logits of -inf (a masked vocabulary)
  // would otherwise give 0 * inf = NaN.
  const double smooth = eps != 0.0 ? eps * (lse - sz / static_cast<double>(V)) : 0.0;
  r.loss = (1 - eps) * (lse - zy) + smooth + r.z;
  if (grad) {
    grad->assign(V, 0.0);
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(z[v] - lse);
      double dz = c * ((1 + 2 * lambda * lse) * p - eps / static_cast<double>(V));
      if (in_range && v == y) dz -= c * (1 - eps);
      (*grad)[v] = scale * dz * (capped ? 1 - t[v] * t[v] : 1.0);
    }
  }
  return r;
}

}  // namespace fusedops::ce
