// l2norm (docs/specs/ops.md section 8): normalisation by the L2 norm of the last dimension.
#pragma once

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// Forward:  rstd[r] = (sum_d x[r,d]^2 + eps)^(-1/2)  (eps inside the root, added to the sum),
//           y[r,d] = x[r,d] * rstd[r].
//   x:    [..., D] fp32/bf16/fp16 (ref: also fp64). Last dim stride 1; leading dims must
//         collapse to one row stride.
//   y:    [..., D] contiguous; its dtype is the output dtype (any of fp32/bf16/fp16).
//   rstd: [...] contiguous fp32 (ref also fp64).
//   Saved for backward: y and rstd.
struct L2NormFwdArgs {
  TensorView x;
  TensorView y;
  TensorView rstd;
  double eps = 1e-6;
};

// Backward from the saved output: dx = rstd * (dy - y * sum_d(dy*y)).
//   y, rstd: as saved. dy: [..., D], dtype of y. dx: [..., D] contiguous (dtype of the forward's
//   x), overwritten.
struct L2NormBwdArgs {
  TensorView y;
  TensorView rstd;
  TensorView dy;
  TensorView dx;
};

void l2norm_fwd(const Context& ctx, const L2NormFwdArgs& args);
void l2norm_bwd(const Context& ctx, const L2NormBwdArgs& args);
void l2norm_fwd_ref(const Context& ctx, const L2NormFwdArgs& args);
void l2norm_bwd_ref(const Context& ctx, const L2NormBwdArgs& args);

}  // namespace fusedops
