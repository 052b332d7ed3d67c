// chunk_loss (docs/specs/ops.md section 10): the LM head and cross-entropy without materialized logits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"
#include "fusedops/ops/cross_entropy.h"

namespace fusedops {

// Forward, with the rows of hidden ([B,S,H] or [N,H], N rows) taken in chunks of C rows:
//   Z_c = hidden_c @ weight^T                       [C, V], fp32, one chunk at a time
//   per row: the loss l_i and the logits gradient G_c of fused_cross_entropy_loss (every option
//   of CrossEntropyOptions; reduction "sum" or "mean" only), with the normaliser
//   norm_i = (#non-ignored rows of the whole batch for "mean", else 1) * alpha_i
//   loss          = sum_i w_i l_i / norm_i           (0-d fp32)
//   grad_hidden_c = G_c @ weight                    (dtype of hidden, overwritten)
//   grad_weight  (+)= sum_c G_c^T @ hidden_c         (fp32 accumulation)
// so the [N, V] logits never exist: peak extra memory is O(C * V) plus, for a 16-bit weight
// gradient, one fp32 [V, H] accumulator. Like fused_cross_entropy_loss the gradients are for an
// upstream gradient of 1 and chunk_loss_bwd only rescales them.
//
//   hidden:      [..., H] fp32/bf16/fp16 (ref: also fp64), rows addressable (last dim stride 1).
//   weight:      [V, H], hidden's dtype, contiguous.
//   bias:        must be left undefined: a bias is rejected (MindSpeed's chunk loss has none).
//   labels:      hidden's shape without H, int32/int64, contiguous.
//   loss_weight: optional, labels' shape, floating, contiguous.
//   alpha:       MindSpeed's normaliser: the loss (and every gradient) is divided by it.
//                alpha_per_sample (optional, [B] fp32, hidden [B,S,H]) divides sample b's rows
//                by alpha_per_sample[b] instead; a zero in it gives inf/NaN (validate mode
//                raises).
//   loss, z_loss (optional): 0-d fp32 (ref: also fp64). z_loss = sum_i lambda lse_i^2 / norm_i.
//   grad_hidden: optional (leave undefined when no gradient is wanted), hidden's shape/dtype,
//                contiguous.
//   grad_weight: optional, [V, H] contiguous: the weight's dtype (overwritten) or, with
//                accumulate_grad_weight, fp32 (the gradient is added to it, e.g. a main_grad
//                buffer; the upstream gradient must then be 1, since the backward cannot
//                rescale what was added).
//   grad_loss_weight: optional, labels' shape, fp32 (ref: also fp64): l_i / norm_i.
//   chunk_size:  rows per chunk; 0 = chosen from memory_budget (bytes for the per-chunk logits
//                and gradient buffers; 0 = the default, 2 GiB on CUDA and 32 MiB on the CPU).
//                On CUDA with 16-bit operands a chunk's fp32 logits may be computed in
//                sub-chunks (ce::chunk_layout): by the budget when chunk_size is 0, and when both
//                are given, in sub-chunks that fit what the chunk's gradient leaves of the budget.
//                On CUDA with a 16-bit grad_weight and neither chunk_size nor memory_budget, the
//                workspace is held to Liger-Kernel's logits chunk (about N x H values) and, when an
//                fp32 accumulator does not fit it, the plan is compact: 16-bit logits replaced by
//                their gradient in place, grad_weight accumulated in its own dtype (the family
//                README).
//   workspace:   uint8 bytes on the device, at least chunk_loss_workspace_size(ctx, args)
//                (0 on the CPU).
struct ChunkLossFwdArgs {
  TensorView hidden;
  TensorView weight;
  TensorView bias;
  TensorView labels;
  TensorView loss_weight;
  double alpha = 1.0;
  TensorView alpha_per_sample;
  TensorView loss;
  TensorView z_loss;
  TensorView grad_hidden;
  TensorView grad_weight;
  bool accumulate_grad_weight = false;
  TensorView grad_loss_weight;
  int64_t chunk_size = 0;
  int64_t memory_budget = 0;
  TensorView workspace;
  CrossEntropyOptions options;
};

// Backward: multiplies the saved gradients by the upstream gradient g (0-d fp32):
//   grad_x = g * saved_grad_x for x in hidden, weight, loss_weight (each pair optional).
// An output may be its saved input itself (in place; untouched when g == 1). Outputs are
// overwritten and contiguous, with their saved input's shape and dtype.
struct ChunkLossBwdArgs {
  TensorView grad_loss;
  TensorView saved_grad_hidden;
  TensorView grad_hidden;
  TensorView saved_grad_weight;
  TensorView grad_weight;
  TensorView saved_grad_loss_weight;
  TensorView grad_loss_weight;
};

void chunk_loss_fwd(const Context& ctx, const ChunkLossFwdArgs& args);
void chunk_loss_bwd(const Context& ctx, const ChunkLossBwdArgs& args);
// The float64 reference (plain loops; CPU tensors of any floating dtype).
void chunk_loss_fwd_ref(const Context& ctx, const ChunkLossFwdArgs& args);
void chunk_loss_bwd_ref(const Context& ctx, const ChunkLossBwdArgs& args);

// The rows per chunk a call with these arguments uses on ctx.device.
int64_t chunk_loss_chunk_rows(const Context& ctx, const ChunkLossFwdArgs& args);
// Bytes of device workspace the forward needs (0 on the CPU). Reads only the shapes and dtypes
// of hidden, weight and grad_weight, accumulate_grad_weight, chunk_size and memory_budget.
size_t chunk_loss_workspace_size(const Context& ctx, const ChunkLossFwdArgs& args);

}  // namespace fusedops
