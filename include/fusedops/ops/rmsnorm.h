// RMSNorm family. This header: rmsnorm_without_weight (ops.md section 2).
#pragma once

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// Forward:  rstd[r] = (mean_d x[r,d]^2 + eps)^(-1/2),   y[r,d] = x[r,d] * rstd[r].
//   x:    [..., D] fp32/bf16/fp16 (ref: also fp64). Last dim stride 1; leading dims must
//         collapse to one row stride.
//   y:    [..., D] contiguous, dtype of x; optional: leave undefined for the DeepSeek-V4 use,
//         which needs only the per-row factor.
//   rstd: [...] (x's shape without D) contiguous fp32 (ref also fp64); always written.
//   Saved for backward: x and rstd (y is recomputed as x * rstd).
struct RmsNormWithoutWeightFwdArgs {
  TensorView x;
  TensorView y;
  TensorView rstd;
  double eps = 1e-6;
};

// Backward of both outputs at once (either gradient may be absent):
//   dx = rstd*dy - rstd^3 * x * (sum_d(dy*x) + drstd) / D
// which is rstd*(dy - x_hat*mean(dy*x_hat)) for y and -drstd*rstd^3*x/D for rstd.
//   x, rstd: as saved by the forward. dy: [..., D] dtype of x, or undefined.
//   drstd: [...] fp32 (ref also fp64), or undefined. dx: [..., D] contiguous, dtype of x,
//   overwritten.
struct RmsNormWithoutWeightBwdArgs {
  TensorView x;
  TensorView rstd;
  TensorView dy;
  TensorView drstd;
  TensorView dx;
};

void rmsnorm_without_weight_fwd(const Context& ctx, const RmsNormWithoutWeightFwdArgs& args);
void rmsnorm_without_weight_bwd(const Context& ctx, const RmsNormWithoutWeightBwdArgs& args);
// The float64 reference (plain loops; CPU tensors of any floating dtype).
void rmsnorm_without_weight_fwd_ref(const Context& ctx, const RmsNormWithoutWeightFwdArgs& args);
void rmsnorm_without_weight_bwd_ref(const Context& ctx, const RmsNormWithoutWeightBwdArgs& args);

}  // namespace fusedops
