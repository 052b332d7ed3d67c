// causal_conv1d (docs/specs/ops.md section 4): depthwise causal short convolution with optional bias,
// SiLU, residual, initial / final state and varlen sequences.
#pragma once

#include <cstddef>
#include <string>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

enum class CausalConv1dActivation : uint8_t { kNone = 0, kSilu = 1 };

// "" -> kNone; "silu" and "swish" -> kSilu; anything else raises a value error naming the set.
CausalConv1dActivation causal_conv1d_activation(const std::string& name);

// Forward. For sequence n of length L (local time t = 0..L-1) and channel d, with the extended
// input  x~[tau] = x[tau] for 0 <= tau < L,  x~[tau] = h0[n,d,tau+W] for -W < tau < 0 (0 when no
// initial_state):
//   a[t,d]  = sum_{k<W} weight[k,d] * x~[t-(W-1)+k, d] + bias[d]
//   y[t,d]  = act(a[t,d]) + residual[t,d]                    (act = silu or identity)
//   final_state[n,d,j] = x~[L-W+j, d],  j = 0..W-1            (slot j holds token L-W+j)
// Slot 0 of initial_state is never read by the convolution; it reaches final_state only when L=0.
//   x:             [B, T, D...] fp32/bf16/fp16 (ref: also fp64); the dims after T are flattened
//                  into D and must be dense (last stride 1); B and T may have any strides.
//                  Varlen: B == 1 and cu_seqlens [N+1] splits T into N sequences that never see
//                  each other's tokens; else N = B.
//   weight:        [W, D], W >= 1, any floating dtype, any strides (so a transposed [D, W] view
//                  of an FLA / nn.Conv1d weight works without a copy).
//   bias:          [D] any floating dtype, or undefined.
//   residual:      shape and dtype of x (same stride rules), or undefined; added after act.
//   initial_state: [N, D, W] any floating dtype, contiguous, or undefined.
//   cu_seqlens:    [N+1] int32/int64, or undefined. cu[0] = 0, non-decreasing, cu[N] = T:
//                  checked before any work on the CPU; on CUDA checked on the device: the
//                  kernels clamp every offset to [0, T] and a violation is reported into the
//                  device's bad-input record (fusedops/core/device_errors.h); with debug checks
//                  the CUDA call checks on the host first and raises like the CPU.
//   y:             shape and dtype of x, contiguous (written).
//   final_state:   [N, D, W] contiguous (fp32/bf16/fp16 or fp64), or undefined (written).
// Saved for the backward: x, weight, bias, initial_state, cu_seqlens (a is recomputed).
struct CausalConv1dFwdArgs {
  TensorView x;
  TensorView weight;
  TensorView bias;
  TensorView residual;
  TensorView initial_state;
  TensorView cu_seqlens;
  TensorView y;
  TensorView final_state;
  CausalConv1dActivation activation = CausalConv1dActivation::kNone;
};

// Backward, with g[t,d] = dy[t,d] * act'(a[t,d]) and dht = the gradient of final_state:
//   dx[tau,d]   = sum_{k: 0 <= tau+W-1-k < L} weight[k,d] * g[tau+W-1-k,d]
//                 + dht[n,d,tau-L+W]  (tau >= L-W)
//   dweight[k,d] = sum_n sum_t g[t,d] * x~[t-(W-1)+k, d]      (initial-state values included)
//   dbias[d]    = sum_n sum_t g[t,d]
//   dh0[n,d,s]  = sum_{t=0}^{min(s,L)-1} weight[s-1-t,d] * g[t,d]  +  dht[n,d,s-L] (s >= L)
// (slot 0 gets only the pass-through, i.e. dht[n,d,0] when L = 0). dresidual = dy is left to
// the caller. Every given output is overwritten; dweight and dbias are reduced in fp32 in a
// fixed order (per-tile partials, then a sequential sum over tiles): bitwise reproducible.
//   x, weight, bias, initial_state, cu_seqlens: as given to the forward.
//   dy:              shape and dtype of x (same stride rules as x).
//   d_final_state:   [N, D, W] any floating dtype contiguous, or undefined (= zero).
//   dx:              shape and dtype of x, contiguous (required).
//   dweight:         [W, D] contiguous, any floating dtype, or undefined (not computed).
//   dbias:           [D] contiguous, or undefined; needs bias.
//   d_initial_state: [N, D, W] contiguous, or undefined; needs initial_state.
//   workspace:       >= causal_conv1d_bwd_workspace_size(ctx, args) bytes on ctx.device,
//                    16-byte aligned (undefined when the size is 0).
struct CausalConv1dBwdArgs {
  TensorView x;
  TensorView weight;
  TensorView bias;
  TensorView initial_state;
  TensorView cu_seqlens;
  TensorView dy;
  TensorView d_final_state;
  TensorView dx;
  TensorView dweight;
  TensorView dbias;
  TensorView d_initial_state;
  TensorView workspace;
  CausalConv1dActivation activation = CausalConv1dActivation::kNone;
};

// Bytes of device scratch the backward needs (fp32 per-tile partial sums of dweight and dbias on
// CUDA; 0 on the CPU, whose backends use host memory). Depends on ctx.device, x's shape, W and
// which of dweight / dbias are requested.
size_t causal_conv1d_bwd_workspace_size(const Context& ctx, const CausalConv1dBwdArgs& args);

void causal_conv1d_fwd(const Context& ctx, const CausalConv1dFwdArgs& args);
void causal_conv1d_bwd(const Context& ctx, const CausalConv1dBwdArgs& args);
// The float64 reference (plain loops; CPU tensors of any floating dtype).
void causal_conv1d_fwd_ref(const Context& ctx, const CausalConv1dFwdArgs& args);
void causal_conv1d_bwd_ref(const Context& ctx, const CausalConv1dBwdArgs& args);

}  // namespace fusedops
