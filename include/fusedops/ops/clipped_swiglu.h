// clipped_swiglu (docs/specs/ops.md section 7): the GPT-OSS SwiGLU with clamped halves, as CANN's
// clipped_swiglu / clipped_swiglu_grad define it.
#pragma once

#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// Largest group_index length accepted (CANN's limit).
inline constexpr int64_t kClippedSwigluMaxGroups = 8192;

// Forward. x is viewed as [M, K] with M = prod(shape[:dim]) and K = prod(shape[dim:]) (the
// split acts on the flattened trailing block, as CANN's golden does), then
//   interleaved: A = x[:, 0::2], B = x[:, 1::2];   else A = x[:, :K/2], B = x[:, K/2:]
//   clamp_mode 0 (GPT-OSS): a = min(A, limit), b = clamp(B, -limit, limit),
//                           y = a * sigmoid(alpha * a) * (b + bias)
//   clamp_mode 1 (CANN V2): y = min(A * sigmoid(A), limit) * clamp(B, -limit, limit)
//                           (alpha and bias unused)
// With group_index, rows i >= M_eff = clamp(sum(group_index), 0, M) are not computed: y = 0
// there. fp32 math; NaN propagates through the clamps as in torch.clamp.
//   x:           rank 1..8, fp32/bf16/fp16 (ref: also fp64), contiguous; x.shape[dim] even.
//   group_index: int64 [G], G <= 8192, entries >= 0, or undefined. A negative entry raises on
//                the CPU (before any work); on CUDA it counts as 0 and is reported into the
//                device's bad-input record (fusedops/core/device_errors.h; with debug checks
//                the CUDA call raises like the CPU).
//   y:           x's shape with shape[dim] halved, dtype of x, contiguous; overwritten.
//   Saved for backward: x (and group_index).
struct ClippedSwigluFwdArgs {
  TensorView x;
  TensorView group_index;
  TensorView y;
  int dim = -1;
  double alpha = 1.702;
  double limit = 7.0;
  double bias = 1.0;
  bool interleaved = true;
  int clamp_mode = 0;
};

// Backward (CANN clipped_swiglu_grad), the exact derivative with torch.clamp's convention
// (the gradient passes where the input lies in the closed interval):
//   clamp_mode 0, s = sigmoid(alpha*a):
//     dA = dy * (b + bias) * (s + alpha*a*s*(1-s)) * 1[A <= limit]
//     dB = dy * a * s * 1[-limit <= B <= limit]
//   clamp_mode 1, sA = sigmoid(A), b_c = clamp(B, -limit, limit), q = min(A*sA, limit):
//     dA = dy * b_c * 1[A*sA <= limit] * sA*(1 + A*(1-sA)),   dB = dy * q * 1[|B| <= limit]
// scattered back to A's and B's positions; rows >= M_eff get 0.
//   dy: the shape and dtype of y, contiguous. x, group_index and the scalars: as in the forward.
//   dx: x's shape and dtype, contiguous; overwritten.
struct ClippedSwigluBwdArgs {
  TensorView dy;
  TensorView x;
  TensorView group_index;
  TensorView dx;
  int dim = -1;
  double alpha = 1.702;
  double limit = 7.0;
  double bias = 1.0;
  bool interleaved = true;
  int clamp_mode = 0;
};

void clipped_swiglu_fwd(const Context& ctx, const ClippedSwigluFwdArgs& args);
void clipped_swiglu_bwd(const Context& ctx, const ClippedSwigluBwdArgs& args);
// The float64 reference (plain loops; CPU tensors of any floating dtype).
void clipped_swiglu_fwd_ref(const Context& ctx, const ClippedSwigluFwdArgs& args);
void clipped_swiglu_bwd_ref(const Context& ctx, const ClippedSwigluBwdArgs& args);

}  // namespace fusedops
