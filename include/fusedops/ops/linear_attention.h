// The chunked linear-attention core shared by the gated delta rule (gated_delta_rule.h) and Kimi
// delta attention (kda.h): the conventions both families follow, the varlen index helpers, the
// sub-operators both pipelines run (the chunk-local gate cumsum, the inter-chunk state recurrence
// and its backward, the beta sigmoid) and the argument fields both top levels share.
//
// Conventions (every operator of both families):
//   * Layout "seq-first": q, k [B,T,H,K]; v [B,T,HV,V]; beta [B,T,HV]; the gate g [B,T,HV] (GDN,
//     one decay per head) or [B,T,HV,K] (KDA, one per key channel). HV % H == 0 and value head hv
//     reads q/k head hv / (HV/H). Token-major inputs may have any strides for B, T and the head
//     dimension as long as the last dimension has stride 1; outputs must be contiguous.
//   * Varlen: cu_seqlens [N+1] (int32 or int64, B == 1) gives the sequences' bounds in the packed
//     T dimension: it starts at 0, never decreases and ends at T. Chunk-parallel operators also
//     take chunk_indices [NT,2] (rows (sequence, chunk within it) in sequence order, the dtype of
//     cu_seqlens; prepare_chunk_indices); state operators take chunk_offsets [N+1] (the exclusive
//     prefix sum of the per-sequence chunk counts; prepare_chunk_offsets). Without cu_seqlens,
//     N = B, every sequence has T tokens and NT = B * ceil(T/BT).
//   * Chunk n of a sequence covers its local tokens [n*BT, min((n+1)*BT, len)); the last chunk may
//     be partial. Per-chunk matrices are stored token-major: [B,T,H,BT], row t holds row
//     t - chunk_start of its chunk's matrix; columns >= the chunk's length are written as 0.
//   * States are [K,V], fp32 while running; the per-chunk snapshots h / dh are [B,NT,HV,K,V]
//     ([1,NT,HV,K,V] with cu_seqlens) in the caller's dtype; h0, ht, dh0 are [N,HV,K,V].
//   * Gates are natural-log per-step decays; g_cumsum is their chunk-local inclusive cumsum.
//   * Every output is overwritten unless an Args field says it accumulates. Every backend computes
//     in fp32 (ref: float64) whatever the storage dtypes; output dtypes are the caller's choice
//     among fp32/bf16/fp16 (ref also fp64) unless stated.
//   * Index tensors live on ctx.device; their contents follow the bad-input contract
//     (fusedops/core/device_errors.h). On the CPU they are checked (cu_seqlens from 0 to T,
//     non-decreasing; chunk_indices / chunk_offsets consistent with it) before any work, and so
//     on CUDA under the debug checks (debug_checks(ctx): a copy and a synchronisation). Otherwise
//     a CUDA call checks cu_seqlens on the device and reports a bad entry (check_device_errors),
//     and the kernels clamp every position they read from the three tensors, so a bad one never
//     addresses memory outside the call's tensors (the result is then meaningless; tables that do
//     not match a valid cu_seqlens are not reported).
#pragma once

#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

// ---------------------------------------------------------------------------------------------
// Varlen index helpers (host side: cu_seqlens must be a CPU tensor; its contents are checked).

// sum_n ceil(len_n / chunk_size): the number of rows of chunk_indices.
int64_t varlen_chunk_count(const TensorView& cu_seqlens, int64_t chunk_size);
// Fills chunk_indices [NT,2] (dtype of cu_seqlens) with (sequence, local chunk) rows.
void prepare_chunk_indices(const TensorView& cu_seqlens, int64_t chunk_size,
                           const TensorView& chunk_indices);
// Fills chunk_offsets [N+1] (dtype of cu_seqlens) with the exclusive prefix sum of chunk counts.
void prepare_chunk_offsets(const TensorView& cu_seqlens, int64_t chunk_size,
                           const TensorView& chunk_offsets);

// ---------------------------------------------------------------------------------------------
// chunk_local_cumsum. Per chunk and channel, on fp32 values:
//   forward  out_i = scale * sum_{s=0..i} g_s;   reverse  out_i = scale * sum_{s=i..last} g_s
// (the reverse form is a true suffix sum). g: [B,T,H] (scalar) or [B,T,H,S] (vector), any float;
// out: same shape, contiguous, any float dtype. chunk_size: a power of two.
struct ChunkLocalCumsumArgs {
  TensorView g;
  TensorView out;
  TensorView cu_seqlens;     // optional
  TensorView chunk_indices;  // required with cu_seqlens
  int64_t chunk_size = 64;
  bool reverse = false;
  double scale = 1.0;  // applied after the sum
};
void chunk_local_cumsum(const Context& ctx, const ChunkLocalCumsumArgs& args);
void chunk_local_cumsum_ref(const Context& ctx, const ChunkLocalCumsumArgs& args);

// ---------------------------------------------------------------------------------------------
// chunk_gated_delta_rule_fwd_h: the inter-chunk state recurrence, per sequence and value head,
// X = h0 (or 0):
//   for each chunk n:  h[n] = X;  Vn = U_n - W_n X  (stored as v_new);
//     g:  Vg = diag(exp(g_last - g)) Vn,  X *= exp(g_last)      gk: X[c,:] *= exp(gk_last,c), Vg = Vn
//     X += K_n^T Vg
//   ht = X.
// k: [B,T,Hk,K] with HV % Hk == 0 (q/k heads for GDN, or HV for the KDA form where k is already
// gated); w: [B,T,HV,K]; u: [B,T,HV,V]; g: [B,T,HV] or gk: [B,T,HV,K] (chunk-local cumsums, at
// most one); h0: [N,HV,K,V] any float. Outputs: h [B,NT,HV,K,V]; v_new [B,T,HV,V] (optional);
// ht [N,HV,K,V] (optional, any float; fp32 by convention). K <= 256.
struct ChunkGatedDeltaRuleFwdHArgs {
  TensorView k, w, u, g, gk, h0;
  TensorView h, v_new, ht;
  TensorView cu_seqlens, chunk_offsets;
  int64_t chunk_size = 64;
};
void chunk_gated_delta_rule_fwd_h(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& args);
void chunk_gated_delta_rule_fwd_h_ref(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& args);

// chunk_gated_delta_rule_bwd_dhu: reverse over chunks, X = dht (or 0):
//   dh[n] = X;  dv2 = dv + diag(exp(g_last - g)) K X;
//   X = exp(g_last) X + scale (diag(exp(g)) Q)^T dO - W^T dv2;     dh0 = X after chunk 0.
// With gk: dv2 = dv + K X; X = diag(exp(gk_last)) X + scale Q^T dO - W^T dv2 (q, k pre-gated).
// q, k: [B,T,Hk,K]; w: [B,T,HV,K]; dout, dv (the local dVloc): [B,T,HV,V]; g/gk as in fwd_h;
// dht: [N,HV,K,V] optional (0 when absent). Outputs: dh [B,NT,HV,K,V]; dv2 [B,T,HV,V];
// dh0 [N,HV,K,V] optional.
struct ChunkGatedDeltaRuleBwdDhuArgs {
  TensorView q, k, w, dout, dv, g, gk, dht;
  TensorView dh, dh0, dv2;
  TensorView cu_seqlens, chunk_offsets;
  double scale = 1.0;
  int64_t chunk_size = 64;
};
void chunk_gated_delta_rule_bwd_dhu(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& args);
void chunk_gated_delta_rule_bwd_dhu_ref(const Context& ctx,
                                        const ChunkGatedDeltaRuleBwdDhuArgs& args);

// ---------------------------------------------------------------------------------------------
// beta_sigmoid: y = c * sigmoid(x), c = 2 with allow_neg_eigval else 1;
// dx = dy * c * s * (1 - s). x, y, dy, dx: same shape, any float.
struct BetaSigmoidFwdArgs {
  TensorView x, y;
  bool allow_neg_eigval = false;
};
struct BetaSigmoidBwdArgs {
  TensorView x, dy, dx;
  bool allow_neg_eigval = false;
};
void beta_sigmoid_fwd(const Context& ctx, const BetaSigmoidFwdArgs& args);
void beta_sigmoid_fwd_ref(const Context& ctx, const BetaSigmoidFwdArgs& args);
void beta_sigmoid_bwd(const Context& ctx, const BetaSigmoidBwdArgs& args);
void beta_sigmoid_bwd_ref(const Context& ctx, const BetaSigmoidBwdArgs& args);

// ---------------------------------------------------------------------------------------------
// The fields both chunked top levels (chunk_gated_delta_rule, chunk_kda) take; each family's Args
// add what is its own (the saved intra-chunk matrices, gate options). Shapes with G = 1 (GDN's
// gate [B,T,HV]) or G = K (KDA's [B,T,HV,K]):
//   inputs   q, k [B,T,H,K]; v [B,T,HV,V] (one dtype: fp32/bf16/fp16, ref also fp64); g (per-step
//            log decay, or the raw gate input with use_gate_in_kernel); beta [B,T,HV] (or its
//            logits with use_beta_sigmoid_in_kernel); initial_state [N,HV,K,V] optional; A_log
//            [HV] and dt_bias (the gate's parameters, use_gate_in_kernel only).
//   outputs  o [B,T,HV,V]; final_state [N,HV,K,V] optional (fp32 by convention).
//   saved    q_normed, k_normed [B,T,H,K] (q's dtype) and q_rstd, k_rstd [B,T,H] fp32 with
//            use_qk_l2norm_in_kernel; g_cumsum fp32 (the chunk-local cumsum of the activated
//            gate, g's shape); beta_sigmoid [B,T,HV] fp32 with use_beta_sigmoid_in_kernel.
//   workspace uint8 [<op>_fwd_workspace_size(args)] (the intermediates the call recomputes).
// K <= 256. Pipelines: l2norm -> beta_sigmoid -> the family's gate -> chunk_local_cumsum -> the
// family's intra-chunk step -> chunk_gated_delta_rule_fwd_h -> the family's output.
struct LinearAttentionFwdArgs {
  TensorView q, k, v, g, beta, initial_state, A_log, dt_bias;
  TensorView cu_seqlens, chunk_indices, chunk_offsets;
  double scale = 1.0;
  int64_t chunk_size = 64;
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  bool use_beta_sigmoid_in_kernel = false;
  bool allow_neg_eigval = false;  // beta = 2 sigmoid (needs use_beta_sigmoid_in_kernel)
  TensorView o, final_state;
  TensorView q_normed, k_normed, q_rstd, k_rstd, g_cumsum, beta_sigmoid;
  TensorView workspace;
};

// The backward's shared fields: the forward's inputs, flags and saved tensors (same names), and
//   inputs   dout [B,T,HV,V]; dht [N,HV,K,V] optional (0 when absent);
//   outputs  dq, dk [B,T,H,K]; dv [B,T,HV,V]; dg (g's shape; w.r.t. the raw gate input with
//            use_gate_in_kernel); dbeta [B,T,HV] (w.r.t. the logits with the sigmoid); dh0
//            [N,HV,K,V] optional; dA_log, ddt_bias with the gate (each iff its parameter).
//   workspace uint8 [<op>_bwd_workspace_size(args)].
struct LinearAttentionBwdArgs {
  TensorView q, k, v, g, beta, initial_state, A_log, dt_bias;
  TensorView q_normed, k_normed, q_rstd, k_rstd, g_cumsum, beta_sigmoid;
  TensorView cu_seqlens, chunk_indices, chunk_offsets;
  double scale = 1.0;
  int64_t chunk_size = 64;
  bool use_qk_l2norm_in_kernel = false;
  bool use_gate_in_kernel = false;
  bool use_beta_sigmoid_in_kernel = false;
  bool allow_neg_eigval = false;
  TensorView dout, dht;
  TensorView dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias;
  TensorView workspace;
};

// The per-token forms' fields (fused_recurrent_gated_delta_rule, fused_recurrent_kda): q, k
// [B,T,H,K]; v [B,T,HV,V]; g (the family's form: [B,T,HV] or [B,T,HV,K]) and beta [B,T,HV], both
// optional (no decay / beta = 1 when absent); initial_state [N,HV,K,V] optional; cu_seqlens (no
// chunk tables: these forms run token by token). Outputs o [B,T,HV,V]; final_state [N,HV,K,V]
// optional. Nothing is saved: the backward recomputes the states from checkpoints.
struct LinearAttentionRecurrentFwdArgs {
  TensorView q, k, v, g, beta, initial_state;
  TensorView cu_seqlens;
  double scale = 1.0;
  TensorView o, final_state;
};
// The backward's: the forward's inputs, dout, dht (optional, 0 when absent); outputs dq, dk
// [B,T,H,K] (summed over each group of value heads), dv, dg (iff g), dbeta (iff beta), dh0
// (optional); workspace uint8 [<op>_bwd_workspace_size(args)]: on an sm_90 GPU, when a sequence
// can be longer than 16 tokens, the states at the 16-token checkpoints (so that the backward does
// not recompute them from the initial state for every segment); 0 bytes otherwise (the CPU keeps
// its checkpoints in its own scratch; cuda_sm80's kernels recompute them from the initial state).
struct LinearAttentionRecurrentBwdArgs {
  TensorView q, k, v, g, beta, initial_state;
  TensorView cu_seqlens;
  double scale = 1.0;
  TensorView dout, dht;
  TensorView dq, dk, dv, dg, dbeta, dh0;
  TensorView workspace;
};

}  // namespace fusedops
