// rmsnorm_without_weight, generic CUDA backend (sm_80 and later): the row-norm engine of
// src/cuda/rownorm.cuh with the mean of squares. One read of x, one write of y (forward);
// one read of x and dy, one write of dx (backward).
#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/cuda/rownorm.cuh"

namespace fusedops {
namespace {

constexpr const char* kOp = "rmsnorm_without_weight";

bool supports_fwd(const RmsNormWithoutWeightFwdArgs& a) { return a.rstd.dtype() == DType::kFloat32; }
bool supports_bwd(const RmsNormWithoutWeightBwdArgs& a) {
  return a.rstd.dtype() == DType::kFloat32 &&
         (!a.drstd.defined() || a.drstd.dtype() == DType::kFloat32);
}

void fwd(const Context& ctx, const RmsNormWithoutWeightFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::RowNormFwdParams p{};
  p.x = a.x.data();
  p.y = a.y.defined() ? a.y.data() : nullptr;
  p.rstd = a.rstd.data_as<float>();
  p.rows = a.x.rows();
  p.D = a.x.size(-1);
  p.x_row_stride = a.x.row_stride();
  p.scale = p.D > 0 ? 1.0f / static_cast<float>(p.D) : 0.0f;
  p.eps = static_cast<float>(a.eps);
  cuda::visit_dtype(a.x.dtype(), [&](auto t) {
    using T = decltype(t);
    cuda::launch_rownorm_fwd<T, T>(kOp, p, static_cast<cudaStream_t>(ctx.stream));
  });
}

void bwd(const Context& ctx, const RmsNormWithoutWeightBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::RowNormBwdParams p{};
  p.u = a.x.data();
  p.dy = a.dy.defined() ? a.dy.data() : nullptr;
  p.rstd = a.rstd.data_as<const float>();
  p.drstd = a.drstd.defined() ? a.drstd.data_as<const float>() : nullptr;
  p.dx = a.dx.data();
  p.rows = a.x.rows();
  p.D = a.x.size(-1);
  p.u_row_stride = a.x.row_stride();
  p.dy_row_stride = a.dy.defined() ? a.dy.row_stride() : 0;
  p.inv_d = p.D > 0 ? 1.0f / static_cast<float>(p.D) : 0.0f;
  p.mode = cuda::kRmsFromX;
  cuda::visit_dtype(a.x.dtype(), [&](auto t) {
    using T = decltype(t);
    cuda::launch_rownorm_bwd<T, T>(kOp, p, static_cast<cudaStream_t>(ctx.stream));
  });
}

}  // namespace

void register_rmsnorm_without_weight_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<RmsNormWithoutWeightFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<RmsNormWithoutWeightBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
