// l2norm, float64 reference: plain loops, the executable form of docs/specs/ops.md section 8.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/ops/l2norm.h"
#include "src/core/ref_util.h"

namespace fusedops {
namespace {

void fwd(const Context&, const L2NormFwdArgs& a) {
  const int64_t rows = a.x.rows();
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x = ref::load_row(a.x, r);
    double ss = 0;
    for (double v : x) ss += v * v;
    const double rstd = 1.0 / std::sqrt(ss + a.eps);
    ref::store(a.rstd, r, rstd);
    for (double& v : x) v *= rstd;
    ref::store_row(a.y, r, x);
  }
}

void bwd(const Context&, const L2NormBwdArgs& a) {
  const int64_t rows = a.y.rows(), D = a.y.size(-1);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> y = ref::load_row(a.y, r), dy = ref::load_row(a.dy, r);
    const double rstd = ref::load(a.rstd, r);
    double dot = 0;
    for (int64_t d = 0; d < D; ++d) dot += dy[d] * y[d];
    std::vector<double> dx(D);
    for (int64_t d = 0; d < D; ++d) dx[d] = rstd * (dy[d] - y[d] * dot);
    ref::store_row(a.dx, r, dx);
  }
}

}  // namespace

void register_l2norm_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64},
                   kPriorityRef};
  r.add<L2NormFwdArgs>("l2norm", Direction::kForward, spec, nullptr, fwd);
  r.add<L2NormBwdArgs>("l2norm", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
