// rmsnorm_gated, float64 reference: plain loops, the executable form of docs/specs/ops.md section 5.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/core/ref_util.h"
#include "src/ops/rmsnorm/rmsnorm_gated_common.h"

namespace fusedops {
namespace {

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double act(GateActivation a, double z) { return a == GateActivation::kSilu ? z * sigmoid(z) : sigmoid(z); }
double act_grad(GateActivation a, double z) {
  const double s = sigmoid(z);
  return a == GateActivation::kSilu ? s * (1.0 + z * (1.0 - s)) : s * (1.0 - s);
}

std::vector<double> param(const TensorView& t, int64_t D, double fill) {
  std::vector<double> v(D, fill);
  if (t.defined())
    for (int64_t d = 0; d < D; ++d) v[d] = ref::load(t, d);
  return v;
}

void fwd(const Context&, const RmsNormGatedFwdArgs& a) {
  const int64_t rows = a.x.rows(), D = a.x.size(-1);
  const int64_t g = rmsnorm_gated::group_cols(D, a.group_size), G = D / g;
  const std::vector<double> w = param(a.weight, D, 1.0), b = param(a.bias, D, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x = ref::load_row(a.x, r);
    if (a.residual.defined()) {
      const std::vector<double> res = ref::load_row(a.residual, r);
      for (int64_t d = 0; d < D; ++d) x[d] += res[d];
      ref::store_row(a.residual_out, r, x);
      x = ref::load_row(a.residual_out, r);  // the stored sum is what is normalised
    }
    const std::vector<double> z = a.z.defined() ? ref::load_row(a.z, r) : std::vector<double>();
    // v: what is normalised (x, or u = x*silu(z) when the gate comes first).
    std::vector<double> v = x;
    if (z.size() && !a.norm_before_gate)
      for (int64_t d = 0; d < D; ++d) v[d] = x[d] * act(GateActivation::kSilu, z[d]);
    std::vector<double> y(D);
    for (int64_t s = 0; s < G; ++s) {
      double ss = 0;
      for (int64_t d = s * g; d < (s + 1) * g; ++d) ss += v[d] * v[d];
      const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(g) + a.eps);
      ref::store(a.rstd, r * G + s, rstd);
      for (int64_t d = s * g; d < (s + 1) * g; ++d) {
        double h = v[d] * rstd * w[d] + b[d];
        if (z.size() && a.norm_before_gate) h *= act(a.activation, z[d]);
        y[d] = h;
      }
    }
    ref::store_row(a.y, r, y);
  }
}

void bwd(const Context&, const RmsNormGatedBwdArgs& a) {
  const int64_t rows = a.x.rows(), D = a.x.size(-1);
  const int64_t g = rmsnorm_gated::group_cols(D, a.group_size), G = D / g;
  const std::vector<double> w = param(a.weight, D, 1.0), b = param(a.bias, D, 0.0);
  std::vector<double> dw(D, 0.0), db(D, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> x = ref::load_row(a.x, r), dy = ref::load_row(a.dy, r);
    const std::vector<double> z = a.z.defined() ? ref::load_row(a.z, r) : std::vector<double>();
    std::vector<double> dx(D), dz(D, 0.0);
    for (int64_t s = 0; s < G; ++s) {
      const double rstd = ref::load(a.rstd, r * G + s);
      const int64_t d0 = s * g, d1 = (s + 1) * g;
      if (a.norm_before_gate || z.empty()) {
        // dh = dy * act(z); dx = r*(dh*w - x^*mean(x^*w*dh)); dz = dy*h*act'(z)
        std::vector<double> dh(D);
        double dot = 0;
        for (int64_t d = d0; d < d1; ++d) {
          dh[d] = z.empty() ? dy[d] : dy[d] * act(a.activation, z[d]);
          // fma: one rounding in every loop version GCC makes (kda_kernels.h, token_bwd)
          dot = std::fma(x[d] * rstd * w[d], dh[d], dot);
        }
        const double mean = dot / static_cast<double>(g);
        for (int64_t d = d0; d < d1; ++d) {
          const double xh = x[d] * rstd;
          dx[d] = rstd * (dh[d] * w[d] - xh * mean);
          if (!z.empty()) dz[d] = dy[d] * (xh * w[d] + b[d]) * act_grad(a.activation, z[d]);
          dw[d] += dh[d] * xh;
          db[d] += dh[d];
        }
      } else {
        // u = x*silu(z); du = r*(dy*w - u^*mean(u^*w*dy)); dz = du*x*silu'(z); dx = du*silu(z)
        double dot = 0;
        for (int64_t d = d0; d < d1; ++d) dot += x[d] * act(GateActivation::kSilu, z[d]) * rstd * w[d] * dy[d];
        const double mean = dot / static_cast<double>(g);
        for (int64_t d = d0; d < d1; ++d) {
          const double sz = act(GateActivation::kSilu, z[d]);
          const double uh = x[d] * sz * rstd;
          const double du = rstd * (dy[d] * w[d] - uh * mean);
          dz[d] = du * x[d] * act_grad(GateActivation::kSilu, z[d]);
          dx[d] = du * sz;
          dw[d] += dy[d] * uh;
          db[d] += dy[d];
        }
      }
    }
    if (a.dresidual.defined()) {
      const std::vector<double> dres = ref::load_row(a.dresidual, r);
      for (int64_t d = 0; d < D; ++d) dx[d] += dres[d];
    }
    ref::store_row(a.dx, r, dx);
    if (a.dresidual_in.defined()) ref::store_row(a.dresidual_in, r, dx);
    if (a.dz.defined()) ref::store_row(a.dz, r, dz);
  }
  if (a.dweight.defined())
    for (int64_t d = 0; d < D; ++d) ref::store(a.dweight, d, dw[d]);
  if (a.dbias.defined())
    for (int64_t d = 0; d < D; ++d) ref::store(a.dbias, d, db[d]);
}

}  // namespace

void register_rmsnorm_gated_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<RmsNormGatedFwdArgs>("rmsnorm_gated", Direction::kForward, spec, nullptr, fwd);
  r.add<RmsNormGatedBwdArgs>("rmsnorm_gated", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
