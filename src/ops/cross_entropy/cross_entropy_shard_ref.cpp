// The vocabulary-parallel cross-entropy pieces, float64 reference: plain loops over each row of
// the shard (include/fusedops/ops/cross_entropy.h).
#include <cmath>
#include <limits>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/core/ref_util.h"
#include "src/ops/cross_entropy/ce_shard.h"

namespace fusedops {
namespace {

// z of one row and dz/dx (logit_scale, then softcapping).
void row_z(const TensorView& logits, int64_t r, const CrossEntropyOptions& o, std::vector<double>& z,
           std::vector<double>& dzdx) {
  z = ref::load_row(logits, r);
  dzdx.assign(z.size(), o.logit_scale);
  for (size_t v = 0; v < z.size(); ++v) {
    z[v] *= o.logit_scale;
    if (o.logit_softcapping) {
      const double s = *o.logit_softcapping, t = std::tanh(z[v] / s);
      z[v] = s * t;
      dzdx[v] *= 1 - t * t;
    }
  }
}

void stats(const Context&, const CrossEntropyShardStatsArgs& a) {
  const int64_t N = a.logits.rows(), Vs = a.logits.size(-1);
  std::vector<double> z, dzdx;
  for (int64_t r = 0; r < N; ++r) {
    const int64_t y = ce::shard_label(a.labels, r);
    double out[4] = {0, 0, 0, 0};
    if (y != a.options.ignore_index) {
      row_z(a.logits, r, a.options, z, dzdx);
      double m = -std::numeric_limits<double>::infinity();
      for (double x : z) {
        m = std::max(m, x);
        out[3] += x;
      }
      for (double x : z) out[1] += std::exp(x - m);
      out[0] = m;
      const int64_t local = y - a.vocab_start;
      if (local >= 0 && local < Vs) out[2] = z[local];
    }
    for (int c = 0; c < 4; ++c) ref::store(a.stats, r * 4 + c, out[c]);
  }
}

void bwd(const Context&, const CrossEntropyShardBwdArgs& a) {
  const int64_t N = a.logits.rows(), Vs = a.logits.size(-1);
  std::vector<double> z, dzdx, g(Vs);
  for (int64_t r = 0; r < N; ++r) {
    const int64_t y = ce::shard_label(a.labels, r);
    std::fill(g.begin(), g.end(), 0.0);
    if (y != a.options.ignore_index) {
      row_z(a.logits, r, a.options, z, dzdx);
      const double lse = ref::load(a.row_grads, r * 4), dl = ref::load(a.row_grads, r * 4 + 1),
                   dy = ref::load(a.row_grads, r * 4 + 2), ds = ref::load(a.row_grads, r * 4 + 3);
      for (int64_t v = 0; v < Vs; ++v) {
        const double d = dl * std::exp(z[v] - lse) + (v + a.vocab_start == y ? dy : 0.0) + ds;
        g[v] = dzdx[v] * d;
      }
    }
    // Row by row: an in-place gradient overwrites the row only after it was read.
    ref::store_row(a.grad_logits, r, g);
  }
}

}  // namespace

void register_cross_entropy_shard_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}, kPriorityRef};
  r.add<CrossEntropyShardStatsArgs>("cross_entropy_shard", Direction::kForward, spec, nullptr, stats);
  r.add<CrossEntropyShardBwdArgs>("cross_entropy_shard", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
