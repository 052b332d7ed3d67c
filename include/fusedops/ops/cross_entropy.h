// Cross-entropy family. This header: fused_cross_entropy_loss (docs/specs/ops.md section 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

enum class LossReduction : uint8_t { kNone, kSum, kMean };

const char* loss_reduction_name(LossReduction reduction);
// "none", "sum" or "mean"; anything else raises a kValue Error naming `op` and the choices.
LossReduction parse_loss_reduction(const std::string& name, const char* op);

// The options of docs/specs/ops.md section 1.2 shared by fused_cross_entropy_loss and chunk_loss.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  LossReduction reduction = LossReduction::kMean;
  double label_smoothing = 0.0;               // epsilon in [0, 1]
  double logit_scale = 1.0;                   // logits are multiplied by it before everything
  std::optional<double> logit_softcapping;    // s > 0: z = s * tanh(z / s); nullopt: off
  double lse_square_scale = 0.0;              // lambda >= 0: z-loss lambda * lse^2
};

// Forward, per row i of logits [..., V] (leading dims flattened to N rows), all in fp32
// (float64 in the ref backend):
//   z_v  = logit_scale * logits[i,v];  with softcapping s: t_v = tanh(z_v / s), z_v = s * t_v
//   lse  = log sum_v exp(z_v)
//   l_i  = (1-eps) (lse - z_y) + eps (lse - mean_v z_v) + lambda lse^2,   y = labels[i]
//   l_i  = 0 for rows with y == ignore_index
// With w_i = loss_weight[i] (1 when absent) and norm = max(1, #non-ignored rows) for "mean",
// 1 otherwise:
//   sum / mean:  loss = sum_i w_i l_i / norm            (0-d)
//   none:        loss[i] = w_i l_i                       (labels' shape)
//   z_loss:      the same reduction of lambda lse_i^2, unweighted (0 for ignored rows)
// The gradient is computed here, for an upstream gradient of 1 (docs/specs/ops.md 1.4):
//   grad_logits[i,v] = logit_scale (1 - t_v^2 if softcapping) * w_i / norm *
//                      ((1 + 2 lambda lse) softmax(z)_v - (1-eps) [v == y] - eps / V)
//   grad_loss_weight[i] = l_i / norm
// and the backward (cross_entropy_bwd) only rescales them. A label outside [0, V) that is not
// ignore_index raises (kValue) on the CPU before any work; on CUDA it gives a NaN loss for its
// row (no target term in its gradient, nothing outside the row read) and is reported into the
// device's bad-input record (fusedops/core/device_errors.h); with debug checks the CUDA call reads
// the labels on the host (a synchronisation) and raises like the CPU.
//
//   logits:      [..., V], V >= 1, fp32/bf16/fp16 (ref: also fp64); last dim stride 1 and the
//                leading dims flattening to rows with one stride.
//   labels:      logits' shape without V, int32/int64, contiguous.
//   loss_weight: optional, labels' shape, any floating dtype, contiguous.
//   loss:        fp32 (ref: also fp64); 0-d for sum/mean, labels' shape for none. Overwritten.
//   z_loss:      optional, loss's shape and dtype. Overwritten.
//   grad_logits: optional (leave undefined when no gradient is wanted: the forward then reads
//                the logits once and writes nothing else), logits' shape and dtype, contiguous.
//                It may be logits itself (inplace_backward: the gradient replaces the logits,
//                which must then be contiguous); any other overlap is an error.
//   grad_loss_weight: optional, labels' shape, fp32 (ref: also fp64), contiguous.
//   workspace:   uint8 bytes on the device, at least cross_entropy_workspace_size(ctx, N, V)
//                (0 on the CPU: may be left undefined there).
// Saved for the backward: grad_logits and grad_loss_weight (nothing else).
struct CrossEntropyFwdArgs {
  TensorView logits;
  TensorView labels;
  TensorView loss_weight;
  TensorView loss;
  TensorView z_loss;
  TensorView grad_logits;
  TensorView grad_loss_weight;
  TensorView workspace;
  CrossEntropyOptions options;
};

// Backward: multiplies the forward's gradients by the upstream gradient g of `loss`.
//   sum / mean: grad_loss is 0-d; none: grad_loss has labels' shape (one factor per row).
//   grad_logits[i,:] = g_i * saved_grad_logits[i,:],  grad_loss_weight[i] = g_i * saved[i]
// Each output may be its saved input itself (in place); an in-place row whose factor is exactly
// 1 is then not touched, so the common `loss.backward()` costs no pass over the logits. Outputs
// are overwritten. grad_loss is fp32 (ref: also fp64); outputs have their saved input's shape,
// the saved logits gradient's dtype resp. any floating dtype for grad_loss_weight; contiguous.
struct CrossEntropyBwdArgs {
  TensorView grad_loss;
  TensorView saved_grad_logits;
  TensorView grad_logits;
  TensorView saved_grad_loss_weight;
  TensorView grad_loss_weight;
  LossReduction reduction = LossReduction::kMean;
};

void fused_cross_entropy_loss_fwd(const Context& ctx, const CrossEntropyFwdArgs& args);
void fused_cross_entropy_loss_bwd(const Context& ctx, const CrossEntropyBwdArgs& args);
// The float64 reference (plain loops; CPU tensors of any floating dtype).
void fused_cross_entropy_loss_fwd_ref(const Context& ctx, const CrossEntropyFwdArgs& args);
void fused_cross_entropy_loss_bwd_ref(const Context& ctx, const CrossEntropyBwdArgs& args);

// Bytes of device workspace the forward needs for `rows` rows of `vocab` logits on ctx.device
// (0 on the CPU).
size_t cross_entropy_workspace_size(const Context& ctx, int64_t rows, int64_t vocab);

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel pieces (fusedops.distributed): each row's logits are split along V over the
// ranks of a group; this rank's shard logits [..., Vs] holds the vocabulary entries
// [vocab_start, vocab_start + Vs) of V. z_v is computed as in fused_cross_entropy_loss (logit_scale,
// then softcapping); ignore_index, logit_scale and logit_softcapping are read from `options`.
//
// Statistics of the shard, per row i with label y (fp32 math; float64 in ref):
//   stats[i] = ( max_v z_v,  sum_v exp(z_v - max_v z_v),  z_{y - vocab_start} if the label falls
//                in the shard else 0,  sum_v z_v ),       all 0 for rows with y == ignore_index.
// The ranks combine them into the row's log-sum-exp, target logit and sum of z over the whole
// vocabulary (one MAX and one SUM all-reduce).
//   logits: [..., Vs], Vs >= 1, fp32/bf16/fp16 (ref: also fp64), rows addressable.
//   labels: logits' shape without Vs, int32/int64, contiguous (global vocabulary indices).
//   stats:  [rows, 4] fp32 (ref: also fp64), contiguous. Overwritten.
struct CrossEntropyShardStatsArgs {
  TensorView logits;
  TensorView labels;
  TensorView stats;
  int64_t vocab_start = 0;
  CrossEntropyOptions options;
};

// The shard's gradient for given per-row gradients of the combined statistics:
//   grad_logits[i,v] = dz_v/dx_v * ( d_lse_i exp(z_v - lse_i) + d_zy_i [v + vocab_start == y_i]
//                                    + d_sz_i ),     dz/dx = logit_scale (1 - t_v^2 with softcapping),
// 0 for rows with y == ignore_index. row_grads: [rows, 4] fp32 (ref: also fp64), contiguous, the
// columns (lse_i, d_lse_i, d_zy_i, d_sz_i). grad_logits: logits' shape and dtype, contiguous; it may
// be logits itself (in place), any other overlap is an error. Overwritten.
struct CrossEntropyShardBwdArgs {
  TensorView logits;
  TensorView labels;
  TensorView row_grads;
  TensorView grad_logits;
  int64_t vocab_start = 0;
  CrossEntropyOptions options;
};

void fused_cross_entropy_loss_shard_stats(const Context& ctx, const CrossEntropyShardStatsArgs& args);
void fused_cross_entropy_loss_shard_bwd(const Context& ctx, const CrossEntropyShardBwdArgs& args);
void fused_cross_entropy_loss_shard_stats_ref(const Context& ctx, const CrossEntropyShardStatsArgs& args);
void fused_cross_entropy_loss_shard_bwd_ref(const Context& ctx, const CrossEntropyShardBwdArgs& args);

}  // namespace fusedops
