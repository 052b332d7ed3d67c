// chunk_gated_delta_rule composed of the sub-operator entry points on the shared linear-attention
// composition (la_top.h), and fused_recurrent_gated_delta_rule's checks and entry points. The
// composition is backend-neutral: every step is an entry point dispatched through the registry,
// so a device backend only has to register the sub-operator kernels (and the top level pointing
// at compose_fwd / compose_bwd, with its fused steps as hooks).
#include <algorithm>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops {
namespace {

using la::Carver;
using la::Dims;
using la::GateForm;

constexpr GateForm kGate = GateForm::kScalar;  // g [B,T,HV]
const std::vector<int64_t> kChunkSizes{16, 32, 64};

// The gate's parameters and GDN's saved solve A [B,T,HV,BT]; the kept W, U, h, Vnew (all four or
// none).
template <class Args>
void check_family(const la::Check& c, const Args& a, const Dims& d, bool backward) {
  c.value(!a.use_gate_in_kernel || a.A_log.defined(), "use_gate_in_kernel requires A_log");
  if (a.use_gate_in_kernel) {
    c.input(a.A_log, "A_log", {d.HV});
    c.opt_input(a.dt_bias, "dt_bias", {d.HV});
  }
  if (backward) c.input(a.A, "A", {d.B, d.T, d.HV, d.BT});
  else c.output(a.A, "A", {d.B, d.T, d.HV, d.BT});
  const int kept = a.w.defined() + a.u.defined() + a.h.defined() + a.v_new.defined();
  c.value(kept == 0 || kept == 4, "w, u, h and v_new are given together or not at all");
  if (kept == 4) {
    c.output(a.w, "w", {d.B, d.T, d.HV, d.K});
    c.output(a.u, "u", {d.B, d.T, d.HV, d.V});
    c.output(a.h, "h", {d.varlen ? 1 : d.B, d.NT, d.HV, d.K, d.V});
    c.output(a.v_new, "v_new", {d.B, d.T, d.HV, d.V});
    c.base().same_dtype(a.w, "w", a.q, "q").same_dtype(a.h, "h", a.q, "q");
    c.base().same_dtype(a.u, "u", a.v, "v").same_dtype(a.v_new, "v_new", a.v, "v");
  }
}

// Fwd workspace: [g_act fp32] kkt fp32, w, u, h, v_new (these four unless the caller keeps them).
// h shares kkt's bytes: kkt is dead once solve_tril has read it, before the state recurrence
// writes h (a backend's fused prepare step does not use kkt at all).
struct FwdWork {
  TensorView g_act, kkt, w, u, h, v_new;
};

FwdWork carve_fwd(Carver& cv, const Dims& d, bool gate, bool kept) {
  FwdWork w;
  const int64_t Bh = d.varlen ? 1 : d.B;
  if (gate) w.g_act = cv.take(d.acc, d.gate(kGate));
  const int64_t shared = cv.used();
  w.kkt = cv.take(d.acc, {d.B, d.T, d.HV, d.BT});
  if (kept) return w;  // w, u, h, v_new are the caller's
  const int64_t after_kkt = cv.used();
  cv.seek(shared);
  w.h = cv.take(d.qdt, {Bh, d.NT, d.HV, d.K, d.V});
  cv.seek(std::max(after_kkt, cv.used()));
  w.w = cv.take(d.qdt, {d.B, d.T, d.HV, d.K});
  w.u = cv.take(d.vdt, {d.B, d.T, d.HV, d.V});
  w.v_new = cv.take(d.vdt, {d.B, d.T, d.HV, d.V});
  return w;
}

// Bwd workspace: w, u, h, v_new (unless the forward kept them), dv_local, dh, dv2, dw, dg
// (partial, fp32), then the operand steps' gradients (la::carve_operand_grads).
struct BwdWork {
  TensorView w, u, h, v_new, dvl, dh, dv2, dw, dg_part;
  la::OperandGrads op;
};

BwdWork carve_bwd(Carver& cv, const Dims& d, const ChunkGatedDeltaRuleBwdArgs& a) {
  BwdWork w;
  const int64_t Bh = d.varlen ? 1 : d.B;
  if (!a.w.defined()) {  // else the forward's, given by the caller
    w.w = cv.take(d.qdt, {d.B, d.T, d.HV, d.K});
    w.u = cv.take(d.vdt, {d.B, d.T, d.HV, d.V});
    w.h = cv.take(d.qdt, {Bh, d.NT, d.HV, d.K, d.V});
    w.v_new = cv.take(d.vdt, {d.B, d.T, d.HV, d.V});
  }
  w.dvl = cv.take(d.ddt, {d.B, d.T, d.HV, d.V});
  w.dh = cv.take(d.qdt, {Bh, d.NT, d.HV, d.K, d.V});
  w.dv2 = cv.take(d.ddt, {d.B, d.T, d.HV, d.V});
  w.dw = cv.take(d.qdt, {d.B, d.T, d.HV, d.K});
  w.dg_part = cv.take(d.acc, {d.B, d.T, d.HV});
  w.op = la::carve_operand_grads(cv, d, kGate, a);
  return w;
}

void check_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  la::Check c("chunk_gated_delta_rule", ctx);
  const Dims d = la::check_top(c, a, kGate, kChunkSizes);
  check_family(c, a, d, false);
  c.base().workspace(a.workspace, ctx, chunk_gated_delta_rule_fwd_workspace_size(a),
                      "chunk_gated_delta_rule_fwd_workspace_size");
}

void check_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  la::Check c("chunk_gated_delta_rule", ctx);
  const Dims d = la::check_top(c, a, kGate, kChunkSizes);
  check_family(c, a, d, true);
  if (a.use_gate_in_kernel) {
    c.output(a.dA_log, "dA_log", {d.HV});
    c.value(a.dt_bias.defined() == a.ddt_bias.defined(),
            a.dt_bias.defined() ? "ddt_bias is required when dt_bias is given"
                                : "ddt_bias must not be given without dt_bias");
    c.opt_output(a.ddt_bias, "ddt_bias", {d.HV});
  }
  c.base().workspace(a.workspace, ctx, chunk_gated_delta_rule_bwd_workspace_size(a),
                      "chunk_gated_delta_rule_bwd_workspace_size");
}

}  // namespace

int64_t chunk_gated_delta_rule_fwd_workspace_size(const ChunkGatedDeltaRuleFwdArgs& a) {
  if (!la::dims_readable(a.q, a.v, a.cu_seqlens, a.chunk_indices)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_fwd(cv, la::dims_of(a), a.use_gate_in_kernel, a.w.defined());
  return cv.used();
}

int64_t chunk_gated_delta_rule_bwd_workspace_size(const ChunkGatedDeltaRuleBwdArgs& a) {
  if (!la::dims_readable(a.q, a.v, a.cu_seqlens, a.chunk_indices)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_bwd(cv, la::dims_of(a), a);
  return cv.used();
}

namespace gdn {

void compose_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a, FusedPrepareFwd fused_prepare,
                 FusedStateOutFwd fused_state_out) {
  Carver cv(a.workspace, ctx.device);
  const FwdWork ws = carve_fwd(cv, la::dims_of(a), a.use_gate_in_kernel, a.w.defined());
  const la::Operands op = la::forward_operands(ctx, a, ws.g_act, [&](const TensorView& y) {
    gdn_gate_fwd(ctx, {a.g, a.A_log, a.dt_bias, y});
  });
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const bool keep = a.w.defined();  // the caller keeps W, U, h, Vnew for the backward
  const TensorView& w = keep ? a.w : ws.w;
  const TensorView& u = keep ? a.u : ws.u;
  const TensorView& h = keep ? a.h : ws.h;
  const TensorView& vn = keep ? a.v_new : ws.v_new;
  chunk_local_cumsum(ctx, {op.g, a.g_cumsum, cu, ci, a.chunk_size, false, 1.0});
  const RecomputeWUFwdArgs wu{op.k, a.v, op.beta, a.A, a.g_cumsum, w, u, cu, ci};
  if (!fused_prepare || !fused_prepare(ctx, wu, a.chunk_size)) {
    chunk_scaled_dot_kkt_fwd(ctx, {op.k, op.beta, a.g_cumsum, ws.kkt, cu, ci, a.chunk_size});
    solve_tril(ctx, {ws.kkt, a.A, cu, ci});
    recompute_w_u_fwd(ctx, wu);
  }
  la::state_then_output<ChunkFwdOArgs>(
      ctx, {op.k, w, u, a.g_cumsum, TensorView(), a.initial_state, h, vn, a.final_state, cu, a.chunk_offsets, a.chunk_size},
      {op.q, op.k, vn, h, a.g_cumsum, a.o, cu, ci, a.scale, a.chunk_size}, keep, fused_state_out, chunk_fwd_o);
}

void compose_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a, StateFwdHook state_fwd,
                 StateDhuHook state_dhu, DqkwgHook dqkwg) {
  Carver cv(a.workspace, ctx.device);
  const BwdWork ws = carve_bwd(cv, la::dims_of(a), a);
  const la::Operands op = la::backward_operands(a);
  const la::OperandGrads grads = la::pipeline_grads(a, ws.op);
  const TensorView& gc = a.g_cumsum;
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const int64_t BT = a.chunk_size;
  // B1: W, U from the saved A; h and Vnew by the state recurrence (unless the forward kept them).
  const bool kept = a.w.defined();
  const TensorView& w = kept ? a.w : ws.w;
  const TensorView& h = kept ? a.h : ws.h;
  const TensorView& vn = kept ? a.v_new : ws.v_new;
  if (!kept)
    la::recompute_states<RecomputeWUFwdArgs>(
        ctx, {op.k, a.v, op.beta, a.A, gc, ws.w, ws.u, cu, ci}, recompute_w_u_fwd,
        {op.k, ws.w, ws.u, gc, TensorView(), a.initial_state, ws.h, ws.v_new, TensorView(), cu, a.chunk_offsets, BT},
        state_fwd);
  // B2, B3.
  ChunkGatedDeltaRuleBwdDhuArgs da{op.q, op.k, w, a.dout, TensorView(), gc, TensorView(), a.dht, ws.dh, a.dh0, ws.dv2, cu,
                                   a.chunk_offsets, a.scale, BT};
  if (!state_dhu || !state_dhu(ctx, da)) {  // the hook computes dvl itself when it takes the step
    chunk_bwd_dv_local(ctx, {op.q, op.k, a.dout, gc, ws.dvl, cu, ci, a.scale, BT});
    da.dv = ws.dvl;
    chunk_gated_delta_rule_bwd_dhu(ctx, da);
  }
  // B4, B5 (dk and dg accumulate).
  const ChunkBwdDqkwgArgs qa{op.q, op.k, vn, a.dout, h, ws.dh, w, ws.dv2, gc, grads.dq, grads.dk, ws.dw, ws.dg_part,
                             cu, ci, a.scale, BT};
  if (!dqkwg || !dqkwg(ctx, qa)) chunk_bwd_dqkwg(ctx, qa);
  prepare_wy_repr_bwd(ctx, {op.k, a.v, op.beta, a.A, gc, ws.dw, ws.dv2, grads.dk, a.dv, grads.dbeta, ws.dg_part, cu,
                            ci, true});
  // B6: dg = reverse chunk-local cumsum of dgamma; B8: the operand steps' backward.
  chunk_local_cumsum(ctx, {ws.dg_part, grads.dg, cu, ci, BT, true, 1.0});
  la::close_backward(ctx, a, ws.op, [&](const TensorView& dg_act) {
    gdn_gate_bwd(ctx, {a.g, a.A_log, a.dt_bias, dg_act, a.dg, a.dA_log, a.ddt_bias});
  });
}

}  // namespace gdn

void chunk_gated_delta_rule_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  check_fwd(ctx, a);
  const la::NestedCalls nested;  // cu_seqlens was checked (or its device check launched) once
  dispatch("chunk_gated_delta_rule", Direction::kForward, ctx, a.q.dtype(), a);
}

void chunk_gated_delta_rule_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  check_bwd(ctx, a);
  const la::NestedCalls nested;  // cu_seqlens was checked (or its device check launched) once
  dispatch("chunk_gated_delta_rule", Direction::kBackward, ctx, a.q.dtype(), a);
}

void chunk_gated_delta_rule_fwd_ref(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  chunk_gated_delta_rule_fwd(with_backend(ctx, "ref"), a);
}

void chunk_gated_delta_rule_bwd_ref(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  chunk_gated_delta_rule_bwd(with_backend(ctx, "ref"), a);
}

// ---------------------------------------------------------------------------------------------
// fused_recurrent_gated_delta_rule

void fused_recurrent_gated_delta_rule_fwd(const Context& ctx,
                                          const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  la::Check c("fused_recurrent_gated_delta_rule", ctx);
  if (!la::check_recurrent_fwd(c, a, kGate)) return;
  dispatch("fused_recurrent_gated_delta_rule", Direction::kForward, ctx, a.q.dtype(), a);
}

void fused_recurrent_gated_delta_rule_bwd(const Context& ctx,
                                          const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  la::Check c("fused_recurrent_gated_delta_rule", ctx);
  if (!la::check_recurrent_bwd(c, a, kGate, "fused_recurrent_gated_delta_rule_bwd_workspace_size")) return;
  dispatch("fused_recurrent_gated_delta_rule", Direction::kBackward, ctx, a.q.dtype(), a);
}

int64_t fused_recurrent_gated_delta_rule_bwd_workspace_size(const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  return la::recurrent_bwd_workspace_size(a);
}

void fused_recurrent_gated_delta_rule_fwd_ref(const Context& ctx,
                                              const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  fused_recurrent_gated_delta_rule_fwd(with_backend(ctx, "ref"), a);
}

void fused_recurrent_gated_delta_rule_bwd_ref(const Context& ctx,
                                              const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  fused_recurrent_gated_delta_rule_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace fusedops
