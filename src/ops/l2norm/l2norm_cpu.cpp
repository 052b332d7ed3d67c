// l2norm, CPU backend: the shared row-norm engine (src/cpu/rownorm) with the sum of squares.
#include "fusedops/core/registry.h"
#include "fusedops/ops/l2norm.h"
#include "src/cpu/rownorm.h"

namespace fusedops {
namespace {

bool is_lowp_or_f32(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}
bool supports_fwd(const L2NormFwdArgs& a) {
  return a.rstd.dtype() == DType::kFloat32 && is_lowp_or_f32(a.y.dtype());
}
bool supports_bwd(const L2NormBwdArgs& a) {
  return a.rstd.dtype() == DType::kFloat32 && is_lowp_or_f32(a.y.dtype());
}

void fwd(const Context&, const L2NormFwdArgs& a) {
  cpu::RowNormFwdParams p{};
  p.x = a.x.data();
  p.x_dtype = a.x.dtype();
  p.x_row_stride = a.x.row_stride();
  p.y = a.y.data();
  p.y_dtype = a.y.dtype();
  p.rstd = a.rstd.data_as<float>();
  p.rows = a.x.rows();
  p.D = a.x.size(-1);
  p.scale = 1.0f;
  p.eps = static_cast<float>(a.eps);
  cpu::rownorm_fwd(p);
}

void bwd(const Context&, const L2NormBwdArgs& a) {
  cpu::RowNormBwdParams p{};
  p.mode = cpu::RowNormBwdMode::kL2FromY;
  p.u = a.y.data();
  p.u_dtype = a.y.dtype();
  p.u_row_stride = a.y.row_stride();
  p.dy = a.dy.data();
  p.dy_row_stride = a.dy.row_stride();
  p.rstd = a.rstd.data_as<const float>();
  p.drstd = nullptr;
  p.dx = a.dx.data();
  p.dx_dtype = a.dx.dtype();
  p.rows = a.y.rows();
  p.D = a.y.size(-1);
  cpu::rownorm_bwd(p);
}

}  // namespace

void register_l2norm_cpu(Registry& r) {
  // The key dtype is x's (forward) and dx's (backward).
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<L2NormFwdArgs>("l2norm", Direction::kForward, spec, supports_fwd, fwd);
  r.add<L2NormBwdArgs>("l2norm", Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
