// Context parallelism (CP) for the chunked linear-attention family (chunk_gated_delta_rule, GDN,
// and chunk_kda, KDA): the per-rank affine summary of a sequence's segment, its backward
// counterpart, and the folds that turn the summaries gathered from every rank into a rank's
// initial state (forward) and the gradient of its last segment's end state (backward).
//
// The recurrence of one sequence and value head is affine in its state: over a segment of
// tokens t = 1..T,
//   S_t = A_t S_{t-1} + beta_t k_t v_t^T,   A_t = (I - beta_t k_t k_t^T) diag(exp(g_t))
// (GDN: the scalar gate g_t times I; KDA: one gate per key channel), so
//   S_end = M S_init + S_loc,   M = A_T ... A_1 [K,K],   S_loc = S_end from S_init = 0 [K,V].
// In chunk form the state recurrence is X <- gamma X + K~^T (U - W X) (chunk_gated_delta_rule_fwd_h),
// which is linear in (X, U): M is the end state of that recurrence from X = I with U = 0, S_loc
// the end state from X = 0 with the segment's U.
//
// A rank holds a contiguous range of the packed tokens. Only two of its segments talk to other
// ranks: the first, when its sequence started on an earlier rank (incoming), and the last, when
// its sequence continues on a later rank (outgoing). The protocol per layer:
//   forward:  la_cp_fwd_summary on the outgoing segment -> all-gather of the [HV*K*(K+V)] fp32
//             summaries -> la_cp_fold_fwd over the ranks the incoming sequence crossed ->
//             the ordinary chunk forward with that initial state.
//   backward: la_cp_bwd_summary on the incoming segment (L = the gradient of its initial state
//             with no gradient arriving at its end) -> all-gather of the [HV*K*V] fp32 L ->
//             la_cp_fold_bwd over the ranks after this one -> the ordinary chunk backward with
//             that gradient at the outgoing segment's end. dS_init = M^T dS_end + L.
//
// Summary layout (one rank's payload): fp32 (fp64 for fp64 inputs, on the reference backend),
// contiguous, HV*K*K values of M ([HV,K,K], row i = output key channel) followed by HV*K*V values
// of S_loc ([HV,K,V]). A segment with no tokens has M = I and S_loc = 0.
#pragma once

#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// Number of values of one rank's forward summary: HV*K*(K+V).
inline int64_t la_cp_summary_size(int64_t HV, int64_t K, int64_t V) { return HV * K * (K + V); }

// ---------------------------------------------------------------------------------------------
// la_cp_fwd_summary: (M, S_loc) of one segment, composed of the forward's sub-operator entry
// points: [l2norm k] [beta_sigmoid] [gdn_gate | kda_gate] chunk_local_cumsum, then
//   GDN (g [1,Ts,HV]):    chunk_scaled_dot_kkt_fwd -> solve_tril -> recompute_w_u_fwd
//   KDA (g [1,Ts,HV,K]):  chunk_kda_fwd_intra -> kda_recompute_w_u_fwd
// and chunk_gated_delta_rule_fwd_h twice (X = I, U = 0 -> M; X = 0, U -> S_loc).
// The segment is one sequence, B = 1, Ts >= 0 tokens, given as the top level takes it (any
// strides for T and the head dimension, last dimension stride 1): k [1,Ts,H,K]; v [1,Ts,HV,V];
// g [1,Ts,HV] (GDN) or [1,Ts,HV,K] (KDA), the per-step log decay or, with use_gate_in_kernel,
// the gate's raw input; beta [1,Ts,HV]; A_log, dt_bias as for chunk_gated_delta_rule / chunk_kda.
// The flags mean what they mean there (q is not needed: the summary does not depend on it).
// summary: [HV*K*(K+V)] contiguous, fp32 (fp64 for fp64 inputs). K <= 256, V <= 256.
// workspace: uint8 [la_cp_fwd_summary_workspace_size(args)].
struct LaCpFwdSummaryArgs {
  TensorView k, v, g, beta, A_log, dt_bias;
  int64_t chunk_size = 64;
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  bool use_beta_sigmoid_in_kernel = false;
  bool allow_neg_eigval = false;
  // KDA's gate options (chunk_kda): the lower-bound form and the safe-gate promise.
  bool safe_gate = false;
  bool has_lower_bound = false;
  double lower_bound = 0.0;
  TensorView summary;
  TensorView workspace;
};
int64_t la_cp_fwd_summary_workspace_size(const LaCpFwdSummaryArgs& args);
void la_cp_fwd_summary(const Context& ctx, const LaCpFwdSummaryArgs& args);

// ---------------------------------------------------------------------------------------------
// la_cp_bwd_summary: L = dS_init of one segment for the given dout and end-state gradient dht
// (0 when absent), composed of the backward's entry points:
//   GDN: [recompute_w_u_fwd] -> chunk_bwd_dv_local -> chunk_gated_delta_rule_bwd_dhu (its dh0)
//   KDA: kda_recompute_w_u_fwd -> chunk_kda_bwd_dAv (its dv) -> chunk_gated_delta_rule_bwd_dhu
//        (gk form, q = qg, k = kg).
// The segment's tensors as the top-level forward saved them (B = 1, Ts tokens, one sequence):
// q, k [1,Ts,H,K] (the l2-normalised ones when the forward normalised them); v [1,Ts,HV,V];
// beta [1,Ts,HV] (after the sigmoid when the forward applied it); g_cumsum [1,Ts,HV] (GDN) or
// [1,Ts,HV,K] (KDA); A: GDN's solved A, or KDA's Akk [1,Ts,HV,BT]; Aqk: KDA's Aqk (required for
// KDA, absent for GDN); w: GDN only, optional, the forward's kept W [1,Ts,HV,K] (recomputed from
// A when absent); dout [1,Ts,HV,V]; dht [1,HV,K,V] optional. scale: the top level's.
// dh0: [1,HV,K,V] contiguous, fp32 (fp64 for fp64 inputs). A segment with no tokens gives
// dh0 = dht (0 when absent).
struct LaCpBwdSummaryArgs {
  TensorView q, k, v, beta, g_cumsum, A, Aqk, w, dout, dht;
  double scale = 1.0;
  int64_t chunk_size = 64;
  TensorView dh0;
  TensorView workspace;
};
int64_t la_cp_bwd_summary_workspace_size(const LaCpBwdSummaryArgs& args);
void la_cp_bwd_summary(const Context& ctx, const LaCpBwdSummaryArgs& args);

// ---------------------------------------------------------------------------------------------
// la_cp_fold_fwd: the state entering rank hi from the summaries of ranks lo..hi-1,
//   X = h0 (0 when absent);  for j = lo .. hi-1:  X = M_j X + S_loc_j;   state = X.
// summaries: [R, HV*K*(K+V)] contiguous (the all-gathered payloads), fp32 (fp64 on ref);
// h0: [HV,K,V] optional, any float, contiguous; 0 <= lo <= hi <= R. state: [HV,K,V] contiguous,
// the summaries' dtype. The sum over the K key channels runs in a fixed order (deterministic).
struct LaCpFoldFwdArgs {
  TensorView summaries, h0;
  int64_t lo = 0, hi = 0;
  TensorView state;
};
void la_cp_fold_fwd(const Context& ctx, const LaCpFoldFwdArgs& args);
void la_cp_fold_fwd_ref(const Context& ctx, const LaCpFoldFwdArgs& args);

// la_cp_fold_bwd: the gradient of the end state of a segment whose sequence continues over
// ranks lo..hi-1 (in this order), from their M and their L:
//   X = 0;  for j = hi-1 down to lo:  X = M_j^T X + L_j;   dstate = X.
// summaries: [R, HV*K*(K+V)] (forward payloads; only M is read); dh0s: [R, HV*K*V] contiguous
// (the all-gathered L), the summaries' dtype; 0 <= lo <= hi <= R. dstate: [HV,K,V] contiguous,
// the summaries' dtype.
struct LaCpFoldBwdArgs {
  TensorView summaries, dh0s;
  int64_t lo = 0, hi = 0;
  TensorView dstate;
};
void la_cp_fold_bwd(const Context& ctx, const LaCpFoldBwdArgs& args);
void la_cp_fold_bwd_ref(const Context& ctx, const LaCpFoldBwdArgs& args);

}  // namespace fusedops
