// Gated delta rule (GDN, docs/specs/linear_attention.md sections 0-8, 10-11): the chunked operator
// chunk_gated_delta_rule, every chunk sub-operator it is composed of, and the per-token
// recurrent form fused_recurrent_gated_delta_rule.
//
// The conventions (layout, varlen indices, chunks, states, dtypes) and the sub-operators the
// pipeline shares with KDA (chunk_local_cumsum, chunk_gated_delta_rule_fwd_h / _bwd_dhu,
// beta_sigmoid, the varlen index helpers) are in linear_attention.h. Here g, beta are [B,T,HV].
#pragma once

#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"
#include "fusedops/ops/linear_attention.h"

namespace fusedops {

// ---------------------------------------------------------------------------------------------
// chunk_scaled_dot_kkt_fwd (section 3): per chunk, the strictly lower matrix
//   A_ij = beta_i * (k_i . k_j) * exp(g_i - g_j)   for j < i (both valid), else 0.
// k: [B,T,H,K]; beta: [B,T,HV]; g (optional, the chunk-local cumsum): [B,T,HV]; the exp factor is
// 1 without g. A: [B,T,HV,BT] contiguous, BT = chunk_size in {16,32,64}.
struct ChunkScaledDotKktArgs {
  TensorView k, beta, g;
  TensorView A;
  TensorView cu_seqlens, chunk_indices;
  int64_t chunk_size = 64;
};
void chunk_scaled_dot_kkt_fwd(const Context& ctx, const ChunkScaledDotKktArgs& args);
void chunk_scaled_dot_kkt_fwd_ref(const Context& ctx, const ChunkScaledDotKktArgs& args);

// ---------------------------------------------------------------------------------------------
// solve_tril (section 4): Ai = (I + A)^{-1} per chunk, A strictly lower triangular (its upper part
// and diagonal are ignored). A, Ai: [B,T,H,BT], BT = A.size(-1) in {16,32,64}; Ai is unit lower
// triangular, zero above the diagonal and in columns >= the chunk's length.
struct SolveTrilArgs {
  TensorView A;
  TensorView Ai;
  TensorView cu_seqlens, chunk_indices;
};
void solve_tril(const Context& ctx, const SolveTrilArgs& args);
void solve_tril_ref(const Context& ctx, const SolveTrilArgs& args);

// ---------------------------------------------------------------------------------------------
// recompute_w_u_fwd / prepare_wy_repr_bwd (section 5), per chunk with A the solved inverse:
//   U = A (beta * V),   W = A (beta * exp(g) * K)        (exp(g) omitted without g)
// k: [B,T,H,K]; v: [B,T,HV,V]; beta, g: [B,T,HV]; A: [B,T,HV,BT]; w: [B,T,HV,K]; u: [B,T,HV,V].
// The backward is block B5 of section 1.5 for given dW, dU: dk [B,T,H,K] (summed over each group
// of value heads), dv [B,T,HV,V], dbeta [B,T,HV], dg [B,T,HV] (required iff g is given).
// With accumulate_dk_dg, dk and dg are added to (dv and dbeta are always overwritten).
struct RecomputeWUFwdArgs {
  TensorView k, v, beta, A, g;
  TensorView w, u;
  TensorView cu_seqlens, chunk_indices;
};
struct PrepareWyReprBwdArgs {
  TensorView k, v, beta, A, g;
  TensorView dw, du;
  TensorView dk, dv, dbeta, dg;
  TensorView cu_seqlens, chunk_indices;
  bool accumulate_dk_dg = false;
};
void recompute_w_u_fwd(const Context& ctx, const RecomputeWUFwdArgs& args);
void recompute_w_u_fwd_ref(const Context& ctx, const RecomputeWUFwdArgs& args);
void prepare_wy_repr_bwd(const Context& ctx, const PrepareWyReprBwdArgs& args);
void prepare_wy_repr_bwd_ref(const Context& ctx, const PrepareWyReprBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// chunk_fwd_o (section 7): O = scale * ( diag(exp(g)) Q h[n] + (M>= . Gamma . Q K^T) Vnew ),
// Gamma_ij = exp(g_i - g_j) (1 without g). q, k: [B,T,H,K]; v (= Vnew): [B,T,HV,V];
// h: [B,NT,HV,K,V]; g: [B,T,HV] optional. o: [B,T,HV,V].
struct ChunkFwdOArgs {
  TensorView q, k, v, h, g;
  TensorView o;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
  int64_t chunk_size = 64;
};
void chunk_fwd_o(const Context& ctx, const ChunkFwdOArgs& args);
void chunk_fwd_o_ref(const Context& ctx, const ChunkFwdOArgs& args);

// chunk_bwd_dv_local (section 8): dv_j = sum_{i >= j, same chunk} scale (q_i . k_j) Gamma_ij dO_i.
// q, k: [B,T,H,K]; dout: [B,T,HV,V]; g optional. dv: [B,T,HV,V].
struct ChunkBwdDvLocalArgs {
  TensorView q, k, dout, g;
  TensorView dv;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
  int64_t chunk_size = 64;
};
void chunk_bwd_dv_local(const Context& ctx, const ChunkBwdDvLocalArgs& args);
void chunk_bwd_dv_local_ref(const Context& ctx, const ChunkBwdDvLocalArgs& args);

// chunk_bwd_dqkwg (section 8 / B4), per chunk and value head with S = h[n], dH = dh[n]:
//   Ds = scale M>= . Gamma . (dO Vnew^T);   dQ = scale diag(exp(g)) dO S^T + Ds K
//   dKi = diag(exp(g_last - g)) Vnew dH^T;  dK = dKi + Ds^T Q;   dW = -dv S^T
//   dg = rowsum(dQ.Q) - rowsum(dK.K);  dg[last] += exp(g_last) <S,dH> + sum(dKi.K)
// dq, dk [B,T,H,K] are summed over each group of value heads. q, k: [B,T,H,K]; v (= Vnew), dout,
// dv (= dv2): [B,T,HV,V]; h, dh: [B,NT,HV,K,V]; w: optional (only decides whether dw is
// produced); g optional. Outputs dq, dk; dw [B,T,HV,K] (iff w); dg [B,T,HV] (iff g; the partial
// gradient w.r.t. the chunk-local cumsum).
struct ChunkBwdDqkwgArgs {
  TensorView q, k, v, dout, h, dh, w, dv, g;
  TensorView dq, dk, dw, dg;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
  int64_t chunk_size = 64;
};
void chunk_bwd_dqkwg(const Context& ctx, const ChunkBwdDqkwgArgs& args);
void chunk_bwd_dqkwg_ref(const Context& ctx, const ChunkBwdDqkwgArgs& args);

// ---------------------------------------------------------------------------------------------
// gdn_gate (section 11): y = -exp(A_log[h]) * softplus(g + dt_bias[h]),
// softplus(x) = x if x > 20 else log(1 + exp(x)). g: [B,T,HV] any float; A_log, dt_bias
// (optional): [HV]; y: [B,T,HV]. Backward from dy: dg = -exp(A_log) sigmoid(g + dt_bias) dy,
// dA_log[h] = sum_tokens dy*y, ddt_bias[h] = sum_tokens dg (fixed-order sums); dA_log, ddt_bias
// [HV] (ddt_bias iff dt_bias).
struct GdnGateFwdArgs {
  TensorView g, A_log, dt_bias;
  TensorView y;
};
struct GdnGateBwdArgs {
  TensorView g, A_log, dt_bias, dy;
  TensorView dg, dA_log, ddt_bias;
};
void gdn_gate_fwd(const Context& ctx, const GdnGateFwdArgs& args);
void gdn_gate_fwd_ref(const Context& ctx, const GdnGateFwdArgs& args);
void gdn_gate_bwd(const Context& ctx, const GdnGateBwdArgs& args);
void gdn_gate_bwd_ref(const Context& ctx, const GdnGateBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// chunk_gated_delta_rule (section 1): the top level. Forward pipeline (section 1.4), each step
// one sub-operator entry point dispatched through the registry:
//   [l2norm q,k] [beta_sigmoid] [gdn_gate] chunk_local_cumsum -> chunk_scaled_dot_kkt_fwd ->
//   solve_tril -> recompute_w_u_fwd -> chunk_gated_delta_rule_fwd_h -> chunk_fwd_o.
// The fields shared with chunk_kda (inputs, flags, outputs, the saved l2norm / g_cumsum /
// beta_sigmoid tensors, the workspace) are LinearAttentionFwdArgs' (linear_attention.h), with
// g [B,T,HV] and the gate's A_log, dt_bias [HV] (dt_bias optional). Saved besides for the
// backward: A [B,T,HV,BT] in k's dtype ((I+L)^{-1} per chunk).
// workspace: uint8 [chunk_gated_delta_rule_fwd_workspace_size(args)] (w, u, h, v_new, ...).
// K <= 256; chunk_size in {16,32,64}.
struct ChunkGatedDeltaRuleFwdArgs : LinearAttentionFwdArgs {
  TensorView A;
  // Optional, all four or none: W [B,T,HV,K] (q's dtype), U and Vnew [B,T,HV,V] (v's dtype) and
  // the h snapshots [B (1 with cu_seqlens),NT,HV,K,V] (q's dtype), contiguous, kept here instead
  // of in the workspace, so that a backward given them skips its recomputation (step B1).
  TensorView w, u, h, v_new;
};

// Backward (section 1.5): recomputes W, U (from the saved A), h and Vnew (unless the forward kept
// them: the w, u, h, v_new fields), then
//   chunk_bwd_dv_local -> chunk_gated_delta_rule_bwd_dhu -> chunk_bwd_dqkwg ->
//   prepare_wy_repr_bwd (accumulating into dk and dg) -> chunk_local_cumsum (reverse)
//   [gdn_gate_bwd] [beta_sigmoid_bwd] [l2norm_bwd].
// Fields as LinearAttentionBwdArgs' (the forward's inputs, flags and saved tensors, dout, dht, the
// gradients; dg, dbeta [B,T,HV], dA_log [HV] with the gate, ddt_bias [HV] iff dt_bias) and the
// forward's A. workspace: uint8 [chunk_gated_delta_rule_bwd_workspace_size(args)].
struct ChunkGatedDeltaRuleBwdArgs : LinearAttentionBwdArgs {
  TensorView A;
  // Optional, all four or none: the forward's kept W, U, h, Vnew (see the forward's fields); given,
  // step B1 (recompute_w_u_fwd and chunk_gated_delta_rule_fwd_h) is skipped.
  TensorView w, u, h, v_new;
};

int64_t chunk_gated_delta_rule_fwd_workspace_size(const ChunkGatedDeltaRuleFwdArgs& args);
int64_t chunk_gated_delta_rule_bwd_workspace_size(const ChunkGatedDeltaRuleBwdArgs& args);
void chunk_gated_delta_rule_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& args);
void chunk_gated_delta_rule_fwd_ref(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& args);
void chunk_gated_delta_rule_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& args);
void chunk_gated_delta_rule_bwd_ref(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// fused_recurrent_gated_delta_rule (section 1.1): the per-token recurrence, per sequence and value
// head, S = h0 (or 0):
//   S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = scale S^T q_t
// q, k [B,T,H,K]; v [B,T,HV,V]; g, beta [B,T,HV] optional (no decay / beta = 1 when absent);
// initial_state [N,HV,K,V] optional. Outputs: o [B,T,HV,V]; final_state [N,HV,K,V] optional.
// Nothing is saved: the backward recomputes the states from checkpoints (on CUDA kept in its
// workspace where the backend uses one: fused_recurrent_gated_delta_rule_bwd_workspace_size).
// The fields are LinearAttentionRecurrentFwdArgs' / BwdArgs' (linear_attention.h), g [B,T,HV].
struct FusedRecurrentGatedDeltaRuleFwdArgs : LinearAttentionRecurrentFwdArgs {};
// Backward: dq, dk [B,T,H,K] (summed over groups); dv [B,T,HV,V]; dg (iff g), dbeta (iff beta)
// [B,T,HV]; dh0 [N,HV,K,V] optional. dht optional (0 when absent).
struct FusedRecurrentGatedDeltaRuleBwdArgs : LinearAttentionRecurrentBwdArgs {};
void fused_recurrent_gated_delta_rule_fwd(const Context& ctx,
                                          const FusedRecurrentGatedDeltaRuleFwdArgs& args);
void fused_recurrent_gated_delta_rule_fwd_ref(const Context& ctx,
                                              const FusedRecurrentGatedDeltaRuleFwdArgs& args);
void fused_recurrent_gated_delta_rule_bwd(const Context& ctx,
                                          const FusedRecurrentGatedDeltaRuleBwdArgs& args);
void fused_recurrent_gated_delta_rule_bwd_ref(const Context& ctx,
                                              const FusedRecurrentGatedDeltaRuleBwdArgs& args);
// Bytes of the backward's workspace (LinearAttentionRecurrentBwdArgs::workspace): 0 but on sm_90.
int64_t fused_recurrent_gated_delta_rule_bwd_workspace_size(const FusedRecurrentGatedDeltaRuleBwdArgs& args);

}  // namespace fusedops
