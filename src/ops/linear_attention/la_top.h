// The top-level composition both chunked families (chunk_gated_delta_rule, chunk_kda) build on:
// the call's sizes, the workspace carver, the checks of the fields they share, and the steps of the
// pipeline that do not depend on the family -- the forward's operands (l2norm, beta sigmoid, the
// family's gate), the state recurrence followed by the family's output (or a backend's fused form
// of both, keeping h and Vnew for the backward or not), the backward's recomputation of the states
// (skipped when the forward kept them) and its closing steps (gate, sigmoid and l2norm backward).
// Every step is a sub-operator entry point dispatched with ctx, whose backend (when set) forces the
// sub-operators' backend, so a composition runs on any backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "fusedops/core/context.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/l2norm.h"
#include "fusedops/ops/linear_attention.h"
#include "src/core/workspace.h"
#include "src/ops/linear_attention/la_check.h"

namespace fusedops::la {

constexpr double kL2NormEps = 1e-6;  // use_qk_l2norm_in_kernel's epsilon

// The gate's shape: one decay per value head (GDN, g [B,T,HV]) or per key channel (KDA,
// g [B,T,HV,K]).
enum class GateForm { kScalar, kPerChannel };

// The sizes of one top-level call.
struct Dims {
  int64_t B, T, H, K, HV, V, N, NT, BT;
  DType qdt, vdt, ddt;  // q/k dtype, v dtype, dout dtype (backward; v's in the forward)
  DType acc;            // fp32 scratch (float64 for float64 inputs: the reference stays exact)
  bool varlen;
  // The gate's shape ([B,T,HV] or [B,T,HV,K]): g, g_cumsum, dg and their workspaces.
  std::vector<int64_t> gate(GateForm form) const {
    if (form == GateForm::kScalar) return {B, T, HV};
    return {B, T, HV, K};
  }
};
Dims dims_of(const LinearAttentionFwdArgs& a);
Dims dims_of(const LinearAttentionBwdArgs& a);
// Whether dims_of can read the call (the workspace-size functions return 0 otherwise; the checks
// then say what is wrong).
bool dims_readable(const TensorView& q, const TensorView& v, const TensorView& cu,
                   const TensorView& ci);

// The workspace cursor of both top levels (and the context-parallel summaries): 64-byte aligned
// sub-tensors of the call's uint8 workspace, or only the byte count when it has none.
class Carver : public WorkspaceCarver {
 public:
  Carver(char* base, Device device) : WorkspaceCarver(base, device, 64) {}
  Carver(const TensorView& workspace, Device device) : WorkspaceCarver(workspace, device, 64) {}
};

// The checks of the fields both top levels share (inputs, flags, varlen indices, the saved
// tensors of linear_attention.h's base Args, the outputs and, backward, the gradients but the gate
// parameters'), with the family's gate form and chunk sizes; the family checks its gate
// parameters and own saved tensors. Return the call's sizes.
Dims check_top(const Check& c, const LinearAttentionFwdArgs& a, GateForm form,
               const std::vector<int64_t>& chunk_sizes);
Dims check_top(const Check& c, const LinearAttentionBwdArgs& a, GateForm form,
               const std::vector<int64_t>& chunk_sizes);
// True when none of the call's tensors is float64 (the predicate of the backends that take
// fp32/bf16/fp16 storage; float64 goes to ref): the shared fields and the family's own.
bool no_float64(const LinearAttentionFwdArgs& a, std::initializer_list<const TensorView*> own);
bool no_float64(const LinearAttentionBwdArgs& a, std::initializer_list<const TensorView*> own);
// The same, but g_cumsum may be float64 (the fp32 CPU kernels take its differences in double).
bool no_float64_but_gate_cumsum(const LinearAttentionFwdArgs& a, std::initializer_list<const TensorView*> own);
bool no_float64_but_gate_cumsum(const LinearAttentionBwdArgs& a, std::initializer_list<const TensorView*> own);
bool no_float64(const LinearAttentionRecurrentFwdArgs& a);
bool no_float64(const LinearAttentionRecurrentBwdArgs& a);

// ---------------------------------------------------------------------------------------------
// The steps.

// The tensors the chunk pipeline computes with: q, k (l2-normalised when asked), beta (after the
// sigmoid when asked) and g (the activated gate when the gate is in the kernel).
struct Operands {
  TensorView q, k, beta, g;
};

// Forward: [l2norm q, k] [beta_sigmoid]; with use_gate_in_kernel, gate(g_act) writes the activated
// gate (the family's gate operator) into g_act, the gate the pipeline then uses.
template <class GateFwd>
Operands forward_operands(const Context& ctx, const LinearAttentionFwdArgs& a, const TensorView& g_act,
                          GateFwd&& gate) {
  Operands op{a.q, a.k, a.beta, a.g};
  if (a.use_qk_l2norm_in_kernel) {
    l2norm_fwd(ctx, {a.q, a.q_normed, a.q_rstd, kL2NormEps});
    l2norm_fwd(ctx, {a.k, a.k_normed, a.k_rstd, kL2NormEps});
    op.q = a.q_normed;
    op.k = a.k_normed;
  }
  if (a.use_beta_sigmoid_in_kernel) {
    beta_sigmoid_fwd(ctx, {a.beta, a.beta_sigmoid, a.allow_neg_eigval});
    op.beta = a.beta_sigmoid;
  }
  if (a.use_gate_in_kernel) {
    gate(g_act);
    op.g = g_act;
  }
  return op;
}

// Backward: the forward's q, k and beta, from the saved tensors (g is not read again: the
// pipeline uses the saved g_cumsum).
Operands backward_operands(const LinearAttentionBwdArgs& a);

// The backward's workspaces for the gradients of the forward's operand steps, carved last by
// both families: dbeta before the sigmoid, dg before the gate (the gate's shape), dq and dk before
// l2norm.
struct OperandGrads {
  TensorView dbeta, dg, dq, dk;
};
OperandGrads carve_operand_grads(Carver& cv, const Dims& d, GateForm form,
                                 const LinearAttentionBwdArgs& a);
// Where the pipeline writes dq, dk, dbeta and dg: the caller's outputs, or the workspaces above
// where a closing step follows.
OperandGrads pipeline_grads(const LinearAttentionBwdArgs& a, const OperandGrads& ws);
// The closing steps: [gate(dg_act) -- the family's gate backward from ws.dg into a.dg and the
// parameters' gradients] [beta_sigmoid_bwd] [l2norm_bwd of q, k].
template <class GateBwd>
void close_backward(const Context& ctx, const LinearAttentionBwdArgs& a, const OperandGrads& ws,
                    GateBwd&& gate) {
  if (a.use_gate_in_kernel) gate(ws.dg);
  if (a.use_beta_sigmoid_in_kernel) beta_sigmoid_bwd(ctx, {a.beta, ws.dbeta, a.dbeta, a.allow_neg_eigval});
  if (a.use_qk_l2norm_in_kernel) {
    l2norm_bwd(ctx, {a.q_normed, a.q_rstd, ws.dq, a.dq});
    l2norm_bwd(ctx, {a.k_normed, a.k_rstd, ws.dk, a.dk});
  }
}

// The forward's state recurrence and the family's output step (chunk_fwd_o, chunk_kda_fwd_o):
// the backend's fused form of both when it takes them, else the two entry points. The fused form
// writes h and Vnew only when `keep` (the caller keeps them for the backward); otherwise they are
// workspaces that only the unfused output step reads.
template <class OutArgs>
using FusedStateOut = bool (*)(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& h_args,
                               const OutArgs& o_args);
template <class OutArgs>
void state_then_output(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& h_args, const OutArgs& o_args,
                       bool keep, FusedStateOut<OutArgs> fused, void (*output)(const Context&, const OutArgs&)) {
  if (fused) {
    ChunkGatedDeltaRuleFwdHArgs fa = h_args;
    if (!keep) fa.h = fa.v_new = TensorView();
    if (fused(ctx, fa, o_args)) return;
  }
  chunk_gated_delta_rule_fwd_h(ctx, h_args);
  output(ctx, o_args);
}

// The backward's first step: W, U (the family's recompute from the saved solve) and then h and
// Vnew by the state recurrence -- or the backend's kernels for both when it takes them. Not run
// when the forward kept W, U, h and Vnew.
template <class WUArgs>
using StateFwdHook = bool (*)(const Context& ctx, const WUArgs& wu_args, const ChunkGatedDeltaRuleFwdHArgs& h_args);
template <class WUArgs>
void recompute_states(const Context& ctx, const WUArgs& wu_args, void (*wu)(const Context&, const WUArgs&),
                      const ChunkGatedDeltaRuleFwdHArgs& h_args, StateFwdHook<WUArgs> hook = nullptr) {
  if (hook && hook(ctx, wu_args, h_args)) return;
  wu(ctx, wu_args);
  chunk_gated_delta_rule_fwd_h(ctx, h_args);
}

// q, k [B,T,H,K] (the same number of heads) and v [B,T,HV,V] with HV a multiple of H, inputs on
// ctx's device with a unit-stride last dimension.
struct QKV {
  int64_t B, T, H, K, HV, V;
};
template <class Args>
QKV check_qkv(const Check& c, const Args& a) {
  c.base().rank(a.q, "q", 4).rank(a.k, "k", 4);
  c.value(a.q.size(2) == a.k.size(2),
          "q and k must have the same number of heads (q.shape[2] == k.shape[2]), got " +
              std::to_string(a.q.size(2)) + " and " + std::to_string(a.k.size(2)));
  const auto qs = shape_vector(a.q);
  c.input(a.q, "q", qs);
  c.input(a.k, "k", qs);
  c.base().rank(a.v, "v", 4);
  const QKV s{qs[0], qs[1], qs[2], qs[3], a.v.size(2), a.v.size(3)};
  c.input(a.v, "v", {s.B, s.T, s.HV, s.V});
  c.groups(s.HV, s.H, "v", "q and k");
  return s;
}

// ---------------------------------------------------------------------------------------------
// The per-token forms (fused_recurrent_gated_delta_rule, fused_recurrent_kda: the same fields, g
// in the family's form, g and beta optional).

// q, k [B,T,H,K], v [B,T,HV,V], g, beta, cu_seqlens, initial_state [N,HV,K,V]; returns N.
template <class Args>
int64_t check_recurrent_inputs(const Check& c, const Args& a, GateForm form) {
  const QKV s = check_qkv(c, a);
  const int64_t B = s.B, T = s.T, K = s.K, HV = s.HV, V = s.V;
  c.value(K >= 1 && V >= 1, "K and V must be >= 1");
  c.opt_input(a.g, "g", form == GateForm::kScalar ? std::vector<int64_t>{B, T, HV} : std::vector<int64_t>{B, T, HV, K});
  c.opt_input(a.beta, "beta", {B, T, HV});
  c.value(std::isfinite(a.scale), "scale must be finite");
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  c.opt_state(a.initial_state, "initial_state", {N, HV, K, V});
  return N;
}

// The forward's checks; false when there is nothing to compute (no output elements).
template <class Args>
bool check_recurrent_fwd(const Check& c, const Args& a, GateForm form) {
  const int64_t N = check_recurrent_inputs(c, a, form);
  c.output(a.o, "o", shape_vector(a.v));
  c.opt_output(a.final_state, "final_state", {N, a.v.size(2), a.q.size(3), a.v.size(3)});
  return a.o.numel() != 0 || (a.final_state.defined() && a.final_state.numel() != 0);
}

// The per-token backward's workspace: on a device that cuda_sm90 serves (sm_90, the arch range of
// its registration in linear_attention_recurrent_bwd_sm90.cu), when a sequence can be longer than
// one segment of kRecurrentBwdSegment tokens (T, or the packed length with cu_seqlens), one fp32
// [K, V] state per value head and checkpoint slot for that backend's kernel. The state before
// token t = S j (j >= 1, S the segment) of a sequence whose first token has the packed index t0
// goes to slot (t0 + t) / S: a sequence's checkpoints are at least S packed tokens past its first
// token and S apart, so no two of a call share a slot, and ceil(B T / S) slots hold them all. At
// [1, 1024] tokens with 16 value heads and K = V = 128: 64 MiB. 0 on the CPU (its backend keeps its
// checkpoints in its own scratch) and on other GPUs (the cuda_sm80 kernels read no workspace, and
// leave it unread when forced onto an sm_90 device).
constexpr int64_t kRecurrentBwdSegment = 16;
constexpr int kRecurrentBwdArch = 90;  // cuda_sm90's range: [90, 90]
inline int64_t recurrent_bwd_workspace_size(const LinearAttentionRecurrentBwdArgs& a) {
  if (!a.q.defined() || !a.v.defined() || a.q.ndim() != 4 || a.v.ndim() != 4) return 0;
  if (a.q.device().kind != DeviceKind::kCUDA || cuda_arch(a.q.device().index) != kRecurrentBwdArch) return 0;
  const int64_t B = a.q.size(0), T = a.q.size(1), K = a.q.size(3), HV = a.v.size(2), V = a.v.size(3);
  const int64_t longest = a.cu_seqlens.defined() ? B * T : T;
  if (longest <= kRecurrentBwdSegment) return 0;
  const int64_t slots = (B * T + kRecurrentBwdSegment - 1) / kRecurrentBwdSegment;
  return slots * HV * K * V * static_cast<int64_t>(sizeof(float));
}

// The backward's checks (dg iff g, dbeta iff beta); false when there is nothing to compute.
template <class Args>
bool check_recurrent_bwd(const Check& c, const Args& a, GateForm form, const char* workspace_size_fn) {
  const int64_t N = check_recurrent_inputs(c, a, form);
  const int64_t B = a.q.size(0), T = a.q.size(1), HV = a.v.size(2), K = a.q.size(3), V = a.v.size(3);
  c.input(a.dout, "dout", shape_vector(a.v));
  c.opt_state(a.dht, "dht", {N, HV, K, V});
  c.output(a.dq, "dq", shape_vector(a.q));
  c.output(a.dk, "dk", shape_vector(a.q));
  c.output(a.dv, "dv", shape_vector(a.v));
  c.value(a.g.defined() == a.dg.defined(),
          a.g.defined() ? "dg is required when g is given" : "dg must not be given without g");
  c.opt_output(a.dg, "dg", form == GateForm::kScalar ? std::vector<int64_t>{B, T, HV} : std::vector<int64_t>{B, T, HV, K});
  c.value(a.beta.defined() == a.dbeta.defined(), a.beta.defined()
                                                     ? "dbeta is required when beta is given"
                                                     : "dbeta must not be given without beta");
  c.opt_output(a.dbeta, "dbeta", {B, T, HV});
  c.opt_output(a.dh0, "dh0", {N, HV, K, V});
  c.base().workspace(a.workspace, c.ctx(), recurrent_bwd_workspace_size(a), workspace_size_fn, 16);
  return a.dv.numel() != 0 || (a.dh0.defined() && a.dh0.numel() != 0);
}

}  // namespace fusedops::la
