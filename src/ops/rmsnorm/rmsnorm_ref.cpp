// rmsnorm_without_weight, float64 reference: plain loops, the executable form of docs/specs/ops.md section 2.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/core/ref_util.h"

namespace fusedops {
namespace {

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

void fwd(const Context&, const RmsNormWithoutWeightFwdArgs& a) {
  const int64_t rows = a.x.rows(), D = a.x.size(-1);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x = ref::load_row(a.x, r);
    double ss = 0;
    for (double v : x) ss += v * v;
    // The mean over an empty row is taken as 0, so D == 0 gives rstd = eps^(-1/2).
    const double mean = D > 0 ? ss / static_cast<double>(D) : 0.0;
    const double rstd = 1.0 / std::sqrt(mean + a.eps);
    ref::store(a.rstd, r, rstd);
    if (!a.y.defined()) continue;
    for (double& v : x) v *= rstd;
    ref::store_row(a.y, r, x);
  }
}

void bwd(const Context&, const RmsNormWithoutWeightBwdArgs& a) {
  const int64_t rows = a.x.rows(), D = a.x.size(-1);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> x = ref::load_row(a.x, r);
    const std::vector<double> dy = a.dy.defined() ? ref::load_row(a.dy, r) : std::vector<double>(D, 0.0);
    const double rstd = ref::load(a.rstd, r);
    const double g = a.drstd.defined() ? ref::load(a.drstd, r) : 0.0;
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += dy[d] * x[d];
    // dx = rstd*dy - rstd^3 * x * (sum(dy*x) + g) / D
    const double coef = D > 0 ? rstd * rstd * rstd * (dot + g) / static_cast<double>(D) : 0.0;
    std::vector<double> dx(D);
    for (int64_t d = 0; d < D; ++d) dx[d] = rstd * dy[d] - coef * x[d];
    ref::store_row(a.dx, r, dx);
  }
}

}  // namespace

void register_rmsnorm_without_weight_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<RmsNormWithoutWeightFwdArgs>("rmsnorm_without_weight", Direction::kForward, spec, nullptr, fwd);
  r.add<RmsNormWithoutWeightBwdArgs>("rmsnorm_without_weight", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
