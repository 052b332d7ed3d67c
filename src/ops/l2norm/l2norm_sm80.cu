// l2norm, generic CUDA backend (sm_80 and later): the row-norm engine of src/cuda/rownorm.cuh
// with the sum of squares; any of fp32/bf16/fp16 in and out.
#include "fusedops/core/registry.h"
#include "fusedops/ops/l2norm.h"
#include "src/cuda/rownorm.cuh"

namespace fusedops {
namespace {

constexpr const char* kOp = "l2norm";

bool is_lowp_or_f32(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}
bool supports_fwd(const L2NormFwdArgs& a) {
  return a.rstd.dtype() == DType::kFloat32 && is_lowp_or_f32(a.y.dtype());
}
bool supports_bwd(const L2NormBwdArgs& a) {
  return a.rstd.dtype() == DType::kFloat32 && is_lowp_or_f32(a.y.dtype());
}

void fwd(const Context& ctx, const L2NormFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::RowNormFwdParams p{};
  p.x = a.x.data();
  p.y = a.y.data();
  p.rstd = a.rstd.data_as<float>();
  p.rows = a.x.rows();
  p.D = a.x.size(-1);
  p.x_row_stride = a.x.row_stride();
  p.scale = 1.0f;
  p.eps = static_cast<float>(a.eps);
  cuda::visit_dtype(a.x.dtype(), [&](auto tx) {
    cuda::visit_dtype(a.y.dtype(), [&](auto ty) {
      cuda::launch_rownorm_fwd<decltype(tx), decltype(ty)>(kOp, p,
                                                           static_cast<cudaStream_t>(ctx.stream));
    });
  });
}

void bwd(const Context& ctx, const L2NormBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::RowNormBwdParams p{};
  p.u = a.y.data();
  p.dy = a.dy.data();
  p.rstd = a.rstd.data_as<const float>();
  p.drstd = nullptr;
  p.dx = a.dx.data();
  p.rows = a.y.rows();
  p.D = a.y.size(-1);
  p.u_row_stride = a.y.row_stride();
  p.dy_row_stride = a.dy.row_stride();
  p.inv_d = 0.0f;
  p.mode = cuda::kL2FromY;
  cuda::visit_dtype(a.y.dtype(), [&](auto tu) {
    cuda::visit_dtype(a.dx.dtype(), [&](auto tx) {
      cuda::launch_rownorm_bwd<decltype(tu), decltype(tx)>(kOp, p,
                                                           static_cast<cudaStream_t>(ctx.stream));
    });
  });
}

}  // namespace

void register_l2norm_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<L2NormFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<L2NormBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
