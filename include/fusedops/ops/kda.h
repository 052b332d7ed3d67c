// Kimi delta attention (KDA, docs/specs/linear_attention.md section 9 with sections 0, 10-15): the gated
// delta rule with a per-key-channel decay. The chunked operator chunk_kda, the KDA-specific chunk
// sub-operators, the per-channel gate and the per-token form fused_recurrent_kda.
//
// Conventions are those of linear_attention.h (layout [B,T,H,D] seq-first, HV % H == 0, value
// head hv reads q/k head hv / (HV/H), varlen through cu_seqlens + chunk_indices / chunk_offsets,
// per-chunk matrices stored token-major [B,T,HV,BT], snapshots [B,NT,HV,K,V], states fp32 while
// running, natural-log gates). The gate g and its chunk-local cumsum gk are [B,T,HV,K].
// The KDA pipeline also runs the shared sub-operators of linear_attention.h: chunk_local_cumsum
// (vector variant), chunk_gated_delta_rule_fwd_h / _bwd_dhu (gk variant) and beta_sigmoid_fwd/bwd,
// and l2norm_fwd/bwd.
//
// Exponentials: inside a chunk only exp(gk_i - gk_j) for i >= j is ever needed. Off-diagonal
// 16-row sub-blocks (I > J) are factorised against the first row r of block I,
//   exp(gk_i - gk_j) = exp(gk_i - gk_r) * exp(gk_r - gk_j),
// both factors <= 1 for non-positive gates; diagonal sub-blocks use element-wise exponentials of
// the differences. A per-step gate of -1000 underflows to 0 without NaN.
#pragma once

#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"
#include "fusedops/ops/linear_attention.h"

namespace fusedops {

// ---------------------------------------------------------------------------------------------
// chunk_kda_fwd_intra (section 9.4): per chunk, with E_ijc = exp(gk_ic - gk_jc),
//   Aqk_ij = scale * sum_c q_ic k_jc E_ijc   (j <= i; 0 above the diagonal and in columns >= len)
//   L_ij   = beta_i * sum_c k_ic k_jc E_ijc  (j < i),   Akk = (I + L)^{-1}
// q, k: [B,T,H,K]; gk: [B,T,HV,K] (the chunk-local cumsum); beta: [B,T,HV]. Aqk, Akk:
// [B,T,HV,BT] contiguous, BT = chunk_size in {32, 64} (16 also accepted). safe_gate is a promise
// that every per-step gate lies in [lower_bound, 0); it does not change the math here.
struct ChunkKdaFwdIntraArgs {
  TensorView q, k, gk, beta;
  TensorView Aqk, Akk;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
  int64_t chunk_size = 64;
  bool safe_gate = false;
};
void chunk_kda_fwd_intra(const Context& ctx, const ChunkKdaFwdIntraArgs& args);
void chunk_kda_fwd_intra_ref(const Context& ctx, const ChunkKdaFwdIntraArgs& args);

// kda_recompute_w_u_fwd (section 9.3): per chunk with Akk the solved inverse,
//   W = Akk (beta * exp(gk) * K),   U = Akk (beta * V),
//   kg = K * exp(gk_last - gk) (the chunk's last valid row),   qg = Q * exp(gk) (iff q given).
// k, q: [B,T,H,K]; v: [B,T,HV,V]; beta [B,T,HV]; Akk [B,T,HV,BT]; gk [B,T,HV,K].
// Outputs w, kg, qg [B,T,HV,K]; u [B,T,HV,V].
struct KdaRecomputeWUFwdArgs {
  TensorView q, k, v, beta, Akk, gk;
  TensorView w, u, kg, qg;
  TensorView cu_seqlens, chunk_indices;
};
void kda_recompute_w_u_fwd(const Context& ctx, const KdaRecomputeWUFwdArgs& args);
void kda_recompute_w_u_fwd_ref(const Context& ctx, const KdaRecomputeWUFwdArgs& args);

// chunk_kda_fwd_o (chunk_gla_fwd_o_gk): O = scale * qg h[n] + (M>= . Aqk) Vnew.
// qg [B,T,HV,K]; Aqk [B,T,HV,BT]; v (= Vnew) [B,T,HV,V]; h [B,NT,HV,K,V]. o [B,T,HV,V].
struct ChunkKdaFwdOArgs {
  TensorView qg, Aqk, v, h;
  TensorView o;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
};
void chunk_kda_fwd_o(const Context& ctx, const ChunkKdaFwdOArgs& args);
void chunk_kda_fwd_o_ref(const Context& ctx, const ChunkKdaFwdOArgs& args);

// chunk_kda_bwd_dAv (K1): dAqk = scale * M>= . (dO Vnew^T) (the gradient w.r.t. the unscaled
// score; 0 above the diagonal), dv = (M>= . Aqk)^T dO. Aqk [B,T,HV,BT]; v (= Vnew), dout
// [B,T,HV,V]. Outputs dAqk [B,T,HV,BT] (fp32 by convention), dv [B,T,HV,V].
struct ChunkKdaBwdDAvArgs {
  TensorView Aqk, v, dout;
  TensorView dAqk, dv;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
};
void chunk_kda_bwd_dAv(const Context& ctx, const ChunkKdaBwdDAvArgs& args);
void chunk_kda_bwd_dAv_ref(const Context& ctx, const ChunkKdaBwdDAvArgs& args);

// chunk_kda_bwd_wy_dqkg_fused (K3), per chunk and value head with S = h[n], dH = dh[n],
// dVn = dvn (the total gradient of Vnew from bwd_dhu):
//   dQ = scale exp(gk) . (dO S^T);   dKi = exp(gk_last - gk) . (Vnew dH^T);   dW = -dVn S^T
//   dA = (dVn V^T + dW (K . exp(gk))^T) diag(beta);  R = Akk^T dW;  P = Akk^T dVn
//   dv = beta . P;   dbeta = rowsum(P . V) + rowsum(R . K . exp(gk))
//   dg = Q.dQ - K.dKi + beta (K . exp(gk)) . R,  dg[last,c] += exp(gk_last,c) sum_v S dH + sum_i K dKi
//   dK = dKi + beta exp(gk) . R;     dAkk = -M> . (Akk^T (M> . dA) Akk^T)  (gradient w.r.t. L)
// q, k [B,T,H,K]; v, v_new, dout, dvn [B,T,HV,V]; gk [B,T,HV,K]; beta [B,T,HV];
// Akk [B,T,HV,BT]; h, dh [B,NT,HV,K,V]. Outputs: dq, dk [B,T,H,K] (summed over each group of
// value heads); dv [B,T,HV,V]; dbeta [B,T,HV]; dg [B,T,HV,K] (w.r.t. the cumsum gk);
// dAkk [B,T,HV,BT] (fp32 by convention).
struct ChunkKdaBwdWyDqkgArgs {
  TensorView q, k, v, v_new, gk, beta, Akk, h, dh, dout, dvn;
  TensorView dq, dk, dv, dbeta, dg, dAkk;
  TensorView cu_seqlens, chunk_indices;
  double scale = 1.0;
  int64_t chunk_size = 64;
};
void chunk_kda_bwd_wy_dqkg_fused(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& args);
void chunk_kda_bwd_wy_dqkg_fused_ref(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& args);

// chunk_kda_bwd_intra (K4): the gradients through Aqk and L (both built from q, k, beta, gk):
//   dq_i += sum_{j<=i} dAqk_ij k_j . E_ij
//   r_i   = sum_{j<i} dAkk_ij k_j . E_ij;   dbeta_i += r_i . k_i;   r_i *= beta_i
//   c_j   = sum_{i>=j} dAqk_ij q_i . E_ij + sum_{i>j} dAkk_ij beta_i k_i . E_ij
//   dg   += Q . dq_intra + (r - c) . K   (the diagonal Aqk terms cancel and are left out);
//   dk   += r + c.
// Inputs q, k [B,T,H,K]; gk [B,T,HV,K]; beta [B,T,HV]; dAqk, dAkk [B,T,HV,BT] (lower parts
// read); the partial gradients dq, dk [B,T,H,K], dbeta [B,T,HV], dg [B,T,HV,K]. Outputs
// dq_out, dk_out, dbeta_out, dg_out (same shapes; each may be the same tensor as its input).
struct ChunkKdaBwdIntraArgs {
  TensorView q, k, gk, beta, dAqk, dAkk;
  TensorView dq, dk, dbeta, dg;
  TensorView dq_out, dk_out, dbeta_out, dg_out;
  TensorView cu_seqlens, chunk_indices;
  int64_t chunk_size = 64;
  bool safe_gate = false;
};
void chunk_kda_bwd_intra(const Context& ctx, const ChunkKdaBwdIntraArgs& args);
void chunk_kda_bwd_intra_ref(const Context& ctx, const ChunkKdaBwdIntraArgs& args);

// ---------------------------------------------------------------------------------------------
// kda_gate (section 11), per value head hv and key channel c (x = g + dt_bias[hv*K + c]):
//   softplus form:   y = -exp(A_log[hv]) * softplus(x)      (A_log required)
//   lower-bound form (has_lower_bound): y = lower_bound * sigmoid(a * x), a = exp(A_log[hv]) or
//   1 without A_log.
// g [B,T,HV,K] any float; A_log [HV]; dt_bias [HV*K] (any shape with HV*K elements, contiguous).
// Backward from dy: dg; dA_log[hv] = sum over tokens and channels of dy*y (softplus form) or of
// dg*x (lower-bound form); ddt_bias[hv*K+c] = sum over tokens of dg (fixed-order sums).
struct KdaGateFwdArgs {
  TensorView g, A_log, dt_bias;
  TensorView y;
  bool has_lower_bound = false;
  double lower_bound = 0.0;
};
struct KdaGateBwdArgs {
  TensorView g, A_log, dt_bias, dy;
  TensorView dg, dA_log, ddt_bias;
  bool has_lower_bound = false;
  double lower_bound = 0.0;
};
void kda_gate_fwd(const Context& ctx, const KdaGateFwdArgs& args);
void kda_gate_fwd_ref(const Context& ctx, const KdaGateFwdArgs& args);
void kda_gate_bwd(const Context& ctx, const KdaGateBwdArgs& args);
void kda_gate_bwd_ref(const Context& ctx, const KdaGateBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// chunk_kda (section 9): the top level, composed of sub-operator entry points:
//   [l2norm q,k] [beta_sigmoid] [kda_gate] chunk_local_cumsum (vector) -> chunk_kda_fwd_intra ->
//   kda_recompute_w_u_fwd -> chunk_gated_delta_rule_fwd_h (k = kg, gk) -> chunk_kda_fwd_o.
// The fields shared with chunk_gated_delta_rule are LinearAttentionFwdArgs' (linear_attention.h),
// with g [B,T,HV,K], initial_state fp32 (fp64 for fp64 inputs) and the gate's A_log [HV] and
// dt_bias [HV*K] (A_log optional in the lower-bound form). Saved besides for the backward: Aqk,
// Akk [B,T,HV,BT] (dtype of k). The gate options are kda_gate's; safe_gate as in
// chunk_kda_fwd_intra. workspace: uint8 [chunk_kda_fwd_workspace_size(args)]. K <= 256;
// chunk_size 32 or 64.
struct ChunkKdaFwdArgs : LinearAttentionFwdArgs {
  TensorView Aqk, Akk;
  bool safe_gate = false;
  bool has_lower_bound = false;
  double lower_bound = 0.0;
};

// Backward (section 9.5): recomputes W, U, kg, qg (from the saved Akk), h and Vnew, then
//   chunk_kda_bwd_dAv -> chunk_gated_delta_rule_bwd_dhu (q = qg, k = kg, gk) ->
//   chunk_kda_bwd_wy_dqkg_fused -> chunk_kda_bwd_intra -> chunk_local_cumsum (vector, reverse)
//   [kda_gate_bwd] [beta_sigmoid_bwd] [l2norm_bwd].
// Fields as LinearAttentionBwdArgs' (dg [B,T,HV,K]; dA_log [HV] iff A_log and ddt_bias [HV*K] iff
// dt_bias, with the gate) and the forward's Aqk, Akk and gate options.
struct ChunkKdaBwdArgs : LinearAttentionBwdArgs {
  TensorView Aqk, Akk;
  bool safe_gate = false;
  bool has_lower_bound = false;
  double lower_bound = 0.0;
};

int64_t chunk_kda_fwd_workspace_size(const ChunkKdaFwdArgs& args);
int64_t chunk_kda_bwd_workspace_size(const ChunkKdaBwdArgs& args);
void chunk_kda_fwd(const Context& ctx, const ChunkKdaFwdArgs& args);
void chunk_kda_fwd_ref(const Context& ctx, const ChunkKdaFwdArgs& args);
void chunk_kda_bwd(const Context& ctx, const ChunkKdaBwdArgs& args);
void chunk_kda_bwd_ref(const Context& ctx, const ChunkKdaBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// fused_recurrent_kda (section 9.1): the per-token recurrence, per sequence and value head,
// S = h0 (or 0):
//   S = diag(exp(g_t)) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = scale S^T q_t
// q, k [B,T,H,K]; v [B,T,HV,V]; g [B,T,HV,K] optional (no decay); beta [B,T,HV] optional (1);
// initial_state [N,HV,K,V] optional. Outputs o [B,T,HV,V]; final_state [N,HV,K,V] optional.
// The backward recomputes the states from checkpoints (on CUDA kept in its workspace where the
// backend uses one: fused_recurrent_kda_bwd_workspace_size).
// The fields are LinearAttentionRecurrentFwdArgs' / BwdArgs' (linear_attention.h), g [B,T,HV,K].
struct FusedRecurrentKdaFwdArgs : LinearAttentionRecurrentFwdArgs {};
struct FusedRecurrentKdaBwdArgs : LinearAttentionRecurrentBwdArgs {};
void fused_recurrent_kda_fwd(const Context& ctx, const FusedRecurrentKdaFwdArgs& args);
void fused_recurrent_kda_fwd_ref(const Context& ctx, const FusedRecurrentKdaFwdArgs& args);
void fused_recurrent_kda_bwd(const Context& ctx, const FusedRecurrentKdaBwdArgs& args);
void fused_recurrent_kda_bwd_ref(const Context& ctx, const FusedRecurrentKdaBwdArgs& args);
// Bytes of the backward's workspace (LinearAttentionRecurrentBwdArgs::workspace): 0 but on sm_90.
int64_t fused_recurrent_kda_bwd_workspace_size(const FusedRecurrentKdaBwdArgs& args);

}  // namespace fusedops
