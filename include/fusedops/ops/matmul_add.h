// matmul_add: the fused weight-gradient accumulation of gradient-accumulation fusion (MindSpeed's
// npu_matmul_add_fp32, Megatron's fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32):
//
//   main_grad[o, i] += sum_t grad_output[t, o] * input[t, i]      (main_grad += grad_output^T @ input)
//
// in place on the fp32 main_grad, with fp32 accumulation. It has no backward: it is itself the
// weight-gradient half of a linear layer's backward.
#pragma once

#include <cstddef>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

//   grad_output: [..., out] fp32/bf16/fp16 (ref: also fp64). The leading dims flatten into T
//                tokens; last dim stride 1 and one row stride for the leading dims.
//   input:       [..., in], the dtype and the leading dims of grad_output, same layout rules.
//   main_grad:   [out, in] fp32 (ref: also fp64), contiguous; accumulated into (+=), never
//                overwritten. T == 0 leaves it unchanged.
//   workspace:   CUDA only: uint8 [>= matmul_add_workspace_size(ctx)] bytes on the device (the
//                cuBLASLt workspace); ignored (may be undefined) on the CPU.
struct MatmulAddFwdArgs {
  TensorView grad_output;
  TensorView input;
  TensorView main_grad;
  TensorView workspace;
};

// Bytes of device workspace a call on ctx's device needs (0 on the CPU).
size_t matmul_add_workspace_size(const Context& ctx);

void matmul_add_fwd(const Context& ctx, const MatmulAddFwdArgs& args);
// The float64 reference (plain loops; CPU tensors).
void matmul_add_fwd_ref(const Context& ctx, const MatmulAddFwdArgs& args);

}  // namespace fusedops
