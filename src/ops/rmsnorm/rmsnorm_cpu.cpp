// rmsnorm_without_weight, CPU backend: the shared row-norm engine (src/cpu/rownorm) with the
// mean of squares. fp32/bf16/fp16 inputs, fp32 math and fp32 rstd.
#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/cpu/rownorm.h"

namespace fusedops {
namespace {

bool supports_fwd(const RmsNormWithoutWeightFwdArgs& a) { return a.rstd.dtype() == DType::kFloat32; }
bool supports_bwd(const RmsNormWithoutWeightBwdArgs& a) {
  return a.rstd.dtype() == DType::kFloat32 &&
         (!a.drstd.defined() || a.drstd.dtype() == DType::kFloat32);
}

void fwd(const Context&, const RmsNormWithoutWeightFwdArgs& a) {
  const int64_t D = a.x.size(-1);
  cpu::RowNormFwdParams p{};
  p.x = a.x.data();
  p.x_dtype = a.x.dtype();
  p.x_row_stride = a.x.row_stride();
  p.y = a.y.defined() ? a.y.data() : nullptr;
  p.y_dtype = a.x.dtype();
  p.rstd = a.rstd.data_as<float>();
  p.rows = a.x.rows();
  p.D = D;
  p.scale = D > 0 ? 1.0f / static_cast<float>(D) : 0.0f;
  p.eps = static_cast<float>(a.eps);
  cpu::rownorm_fwd(p);
}

void bwd(const Context&, const RmsNormWithoutWeightBwdArgs& a) {
  cpu::RowNormBwdParams p{};
  p.mode = cpu::RowNormBwdMode::kRmsFromX;
  p.u = a.x.data();
  p.u_dtype = a.x.dtype();
  p.u_row_stride = a.x.row_stride();
  p.dy = a.dy.defined() ? a.dy.data() : nullptr;
  p.dy_row_stride = a.dy.defined() ? a.dy.row_stride() : 0;
  p.rstd = a.rstd.data_as<const float>();
  p.drstd = a.drstd.defined() ? a.drstd.data_as<const float>() : nullptr;
  p.dx = a.dx.data();
  p.dx_dtype = a.x.dtype();
  p.rows = a.x.rows();
  p.D = a.x.size(-1);
  cpu::rownorm_bwd(p);
}

}  // namespace

void register_rmsnorm_without_weight_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<RmsNormWithoutWeightFwdArgs>("rmsnorm_without_weight", Direction::kForward, spec, supports_fwd, fwd);
  r.add<RmsNormWithoutWeightBwdArgs>("rmsnorm_without_weight", Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
