// RMSNorm family. This header: rmsnorm_without_weight (docs/specs/ops.md section 2).
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

// rmsnorm_gated (docs/specs/ops.md section 5): RMSNorm with an optional weight and bias, a per-group rstd,
// and an optional gate z, applied after the norm (FLA fused_norm_gate / rmsnorm_fn with
// norm_before_gate=True) or before it (Mamba-2's RMSNormGated, norm_before_gate=False).
namespace fusedops {

enum class GateActivation : int { kSilu = 0, kSigmoid = 1 };  // "swish" is kSilu

// Forward, per row and group G of g = group_size columns (fp32 math):
//   x <- x + residual                               (when a residual is given; stored in residual_out)
//   norm_before_gate: r_G = (mean_G x^2 + eps)^-1/2,  y = (x*r_G*w + b) * act(z)
//   gate first:       u = x*silu(z), r_G = (mean_G u^2 + eps)^-1/2,  y = u*r_G*w + b
// with w = 1, b = 0, act(z) = 1 where weight, bias or z are not given.
//   x:            [..., D] fp32/bf16/fp16 (ref: any floating dtype); last dim stride 1, leading dims
//                 collapsing to one row stride (the same holds for z, residual, dy below).
//   z:            x's shape and dtype, or undefined (a plain RMSNorm).
//   weight, bias: [D], dtype of x or fp32, or undefined.
//   residual:     x's shape, dtype of x or fp32, or undefined; only with norm_before_gate.
//   y:            x's shape and dtype, contiguous.
//   residual_out: required with a residual (else undefined): x's shape, dtype of x or fp32,
//                 contiguous; written with x + residual (the sum is normalised in fp32).
//   rstd:         [..., D/g] (x's leading shape, then one per group) fp32 (ref also fp64),
//                 contiguous.
//   group_size:   divides D; 0 means D.
// Saved for backward: residual_out (or x when there is no residual), z, weight, bias, rstd.
struct RmsNormGatedFwdArgs {
  TensorView x;
  TensorView z;
  TensorView weight;
  TensorView bias;
  TensorView residual;
  TensorView y;
  TensorView residual_out;
  TensorView rstd;
  double eps = 1e-6;
  int64_t group_size = 0;
  bool norm_before_gate = true;
  GateActivation activation = GateActivation::kSilu;
};

// Backward (the exact derivative of the forward, per group; x^ = x*r, h = x^*w + b, a = act(z)):
//   norm_before_gate: dh = dy*a, dx = r*(dh*w - x^*mean_G(x^*w*dh)) [+ dresidual],
//                     dz = dy*h*act'(z), dweight = sum_rows dh*x^, dbias = sum_rows dh
//   gate first:       du = r*(dy*w - u^*mean_G(u^*w*dy)), dz = du*x*silu'(z), dx = du*silu(z),
//                     dweight = sum_rows dy*u^, dbias = sum_rows dy
// silu'(z) = s*(1 + z*(1-s)), sigmoid'(z) = s*(1-s) with s = sigmoid(z).
//   dy:           [..., D] (y's shape and dtype: the forward's x dtype, called T below).
//   x:            what the forward saved: its x, or residual_out after a residual; dtype T or fp32.
//   z, weight, bias, rstd, group_size, norm_before_gate, activation: as in the forward.
//   dresidual:    the gradient of residual_out (prenorm), x's shape and dtype, or undefined.
//   dx:           x's shape, dtype T, contiguous, overwritten (also the residual's gradient).
//   dz:           required with z: x's shape, dtype T, contiguous, overwritten.
//   dweight/dbias: optional, only with weight/bias: [D], their dtype, overwritten (not
//                 accumulated). Deterministic: per-block fp32 partial sums, then a fixed-order sum.
//   dresidual_in: optional copy of dx in the saved x's dtype (for an fp32 residual).
//   workspace:    uint8 of at least rmsnorm_gated_bwd_workspace_size(args) bytes on the device
//                 (0 bytes on the CPU or without weight and bias).
struct RmsNormGatedBwdArgs {
  TensorView dy;
  TensorView x;
  TensorView z;
  TensorView weight;
  TensorView bias;
  TensorView rstd;
  TensorView dresidual;
  TensorView dx;
  TensorView dz;
  TensorView dweight;
  TensorView dbias;
  TensorView dresidual_in;
  TensorView workspace;
  int64_t group_size = 0;
  bool norm_before_gate = true;
  GateActivation activation = GateActivation::kSilu;
};

// Bytes of device workspace rmsnorm_gated_bwd needs for these arguments (the per-block partial
// sums of dweight and dbias on CUDA); 0 on the CPU or when neither is asked for. Reads the
// device, shape and defined-ness of x, dweight and dbias only.
int64_t rmsnorm_gated_bwd_workspace_size(const RmsNormGatedBwdArgs& args);

void rmsnorm_gated_fwd(const Context& ctx, const RmsNormGatedFwdArgs& args);
void rmsnorm_gated_bwd(const Context& ctx, const RmsNormGatedBwdArgs& args);
// The float64 reference (plain loops; CPU tensors of any floating dtype).
void rmsnorm_gated_fwd_ref(const Context& ctx, const RmsNormGatedFwdArgs& args);
void rmsnorm_gated_bwd_ref(const Context& ctx, const RmsNormGatedBwdArgs& args);

}  // namespace fusedops
