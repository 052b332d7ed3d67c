// chunk_kda composed of sub-operator entry points (the KDA ones of kda.h and the shared ones of
// linear_attention.h / l2norm.h) on the shared linear-attention composition (la_top.h). The
// composition is backend-neutral: every step is dispatched through the registry with ctx, whose
// backend (when set) forces the sub-operators'.
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/kda.h"
#include "src/ops/kda/kda_top.h"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops {
namespace {

using la::Carver;
using la::Dims;
using la::GateForm;

constexpr GateForm kGate = GateForm::kPerChannel;  // g [B,T,HV,K]
const std::vector<int64_t> kChunkSizes{32, 64};

// The gate's options and parameters, the state's dtype, and KDA's saved Aqk, Akk [B,T,HV,BT].
template <class Args>
void check_family(const la::Check& c, const Args& a, const Dims& d, bool backward) {
  if (a.use_gate_in_kernel) {
    c.value(a.A_log.defined() || a.has_lower_bound,
            "use_gate_in_kernel requires A_log unless lower_bound is set");
    c.opt_input(a.A_log, "A_log", {d.HV});
    if (a.dt_bias.defined()) {
      c.base().floating(a.dt_bias, "dt_bias");
      c.value(a.dt_bias.numel() == d.HV * d.K && (a.dt_bias.numel() == 0 || a.dt_bias.is_contiguous()),
              "dt_bias must be a contiguous tensor of HV*K=" + std::to_string(d.HV * d.K) +
                  " elements, got shape " + a.dt_bias.shape_string());
    }
    if (a.safe_gate)
      c.value(a.has_lower_bound && a.lower_bound >= -5.0 && a.lower_bound < 0.0,
              "safe_gate with use_gate_in_kernel requires lower_bound in [-5, 0)");
  }
  c.value(!a.has_lower_bound || std::isfinite(a.lower_bound), "lower_bound must be finite");
  if (a.initial_state.defined()) {
    const DType want = a.q.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    c.value(a.initial_state.dtype() == want,
            std::string("initial_state must be ") + dtype_name(want) + " (the state is kept in " +
                dtype_name(want) + "), got " + dtype_name(a.initial_state.dtype()));
  }
  for (auto [t, name] : {std::pair{&a.Aqk, "Aqk"}, std::pair{&a.Akk, "Akk"}}) {
    if (backward) c.input(*t, name, {d.B, d.T, d.HV, d.BT});
    else c.output(*t, name, {d.B, d.T, d.HV, d.BT});
  }
}

// Recomputed per pass: w, u, kg, qg, h, v_new.
struct StateWork {
  TensorView w, u, kg, qg, h, v_new;
};
StateWork carve_state(Carver& cv, const Dims& d) {
  StateWork w;
  const int64_t Bh = d.varlen ? 1 : d.B;
  w.w = cv.take(d.qdt, {d.B, d.T, d.HV, d.K});
  w.u = cv.take(d.vdt, {d.B, d.T, d.HV, d.V});
  w.kg = cv.take(d.qdt, {d.B, d.T, d.HV, d.K});
  w.qg = cv.take(d.qdt, {d.B, d.T, d.HV, d.K});
  w.h = cv.take(d.qdt, {Bh, d.NT, d.HV, d.K, d.V});
  w.v_new = cv.take(d.vdt, {d.B, d.T, d.HV, d.V});
  return w;
}

struct FwdWork {
  TensorView g_act;
  StateWork st;
};
FwdWork carve_fwd(Carver& cv, const Dims& d, bool gate) {
  FwdWork w;
  if (gate) w.g_act = cv.take(d.acc, d.gate(kGate));
  w.st = carve_state(cv, d);
  return w;
}

struct BwdWork {
  StateWork st;
  TensorView dAqk, dvl, dh, dv2, dq, dk, dbeta, dg, dAkk;
  la::OperandGrads op;
};
BwdWork carve_bwd(Carver& cv, const Dims& d, const ChunkKdaBwdArgs& a) {
  BwdWork w;
  const int64_t Bh = d.varlen ? 1 : d.B;
  w.st = carve_state(cv, d);
  w.dAqk = cv.take(d.acc, {d.B, d.T, d.HV, d.BT});
  w.dvl = cv.take(d.ddt, {d.B, d.T, d.HV, d.V});
  w.dh = cv.take(d.qdt, {Bh, d.NT, d.HV, d.K, d.V});
  w.dv2 = cv.take(d.ddt, {d.B, d.T, d.HV, d.V});
  w.dq = cv.take(d.acc, {d.B, d.T, d.H, d.K});
  w.dk = cv.take(d.acc, {d.B, d.T, d.H, d.K});
  w.dbeta = cv.take(d.acc, {d.B, d.T, d.HV});
  w.dg = cv.take(d.acc, {d.B, d.T, d.HV, d.K});
  w.dAkk = cv.take(d.acc, {d.B, d.T, d.HV, d.BT});
  w.op = la::carve_operand_grads(cv, d, kGate, a);
  return w;
}

void check_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  la::Check c("chunk_kda", ctx);
  const Dims d = la::check_top(c, a, kGate, kChunkSizes);
  check_family(c, a, d, false);
  c.base().workspace(a.workspace, ctx, chunk_kda_fwd_workspace_size(a), "chunk_kda_fwd_workspace_size");
}

void check_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  la::Check c("chunk_kda", ctx);
  const Dims d = la::check_top(c, a, kGate, kChunkSizes);
  check_family(c, a, d, true);
  if (a.use_gate_in_kernel) {
    c.value(a.A_log.defined() == a.dA_log.defined(),
            a.A_log.defined() ? "dA_log is required when A_log is given"
                              : "dA_log must not be given without A_log");
    if (a.dA_log.defined()) c.output(a.dA_log, "dA_log", {d.HV});
    c.value(a.dt_bias.defined() == a.ddt_bias.defined(),
            a.dt_bias.defined() ? "ddt_bias is required when dt_bias is given"
                                : "ddt_bias must not be given without dt_bias");
    if (a.ddt_bias.defined()) {
      c.base().floating(a.ddt_bias, "ddt_bias");
      c.value(a.ddt_bias.numel() == d.HV * d.K && a.ddt_bias.is_contiguous(),
              "ddt_bias must be contiguous with HV*K elements");
    }
  }
  c.base().workspace(a.workspace, ctx, chunk_kda_bwd_workspace_size(a), "chunk_kda_bwd_workspace_size");
}

// kda_recompute_w_u_fwd's arguments: W, U, kg, qg into ws from the saved Akk.
KdaRecomputeWUFwdArgs wu_args(const la::Operands& op, const TensorView& v, const TensorView& Akk,
                              const TensorView& gc, const StateWork& ws, const TensorView& cu,
                              const TensorView& ci) {
  return {op.q, op.k, v, op.beta, Akk, gc, ws.w, ws.u, ws.kg, ws.qg, cu, ci};
}
// The gk state recurrence's arguments (chunk_gated_delta_rule_fwd_h) over ws's W, U, kg, writing
// ws.h and ws.v_new (and ht).
ChunkGatedDeltaRuleFwdHArgs state_args(const TensorView& gc, const TensorView& h0, const TensorView& ht,
                                       const StateWork& ws, const TensorView& cu, const TensorView& co, int64_t BT) {
  return {ws.kg, ws.w, ws.u, TensorView(), gc, h0, ws.h, ws.v_new, ht, cu, co, BT};
}

}  // namespace

int64_t chunk_kda_fwd_workspace_size(const ChunkKdaFwdArgs& a) {
  if (!la::dims_readable(a.q, a.v, a.cu_seqlens, a.chunk_indices)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_fwd(cv, la::dims_of(a), a.use_gate_in_kernel);
  return cv.used();
}

int64_t chunk_kda_bwd_workspace_size(const ChunkKdaBwdArgs& a) {
  if (!la::dims_readable(a.q, a.v, a.cu_seqlens, a.chunk_indices)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_bwd(cv, la::dims_of(a), a);
  return cv.used();
}

namespace kda {

void compose_fwd(const Context& ctx, const ChunkKdaFwdArgs& a, FwdFusions fusions) {
  Carver cv(a.workspace, ctx.device);
  const FwdWork ws = carve_fwd(cv, la::dims_of(a), a.use_gate_in_kernel);
  const la::Operands op = la::forward_operands(ctx, a, ws.g_act, [&](const TensorView& y) {
    kda_gate_fwd(ctx, {a.g, a.A_log, a.dt_bias, y, a.has_lower_bound, a.lower_bound});
  });
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const ChunkLocalCumsumArgs sa{op.g, a.g_cumsum, cu, ci, a.chunk_size, false, 1.0};
  const ChunkKdaFwdIntraArgs ia{op.q, op.k, a.g_cumsum, op.beta, a.Aqk, a.Akk, cu, ci, a.scale, a.chunk_size,
                                a.safe_gate};
  // cumsum, intra and the w/u recompute (all three in one step, or the first two, where the backend can).
  const KdaRecomputeWUFwdArgs wa = wu_args(op, a.v, a.Akk, a.g_cumsum, ws.st, cu, ci);
  const bool wu_done = fusions.cumsum_intra_wu && fusions.cumsum_intra_wu(ctx, sa, ia, wa);
  if (!wu_done) {
    if (!fusions.cumsum_intra || !fusions.cumsum_intra(ctx, sa, ia)) {
      chunk_local_cumsum(ctx, sa);
      chunk_kda_fwd_intra(ctx, ia);
    }
    kda_recompute_w_u_fwd(ctx, wa);
  }
  // The state recurrence, and chunk_kda_fwd_o fused with it when the backend can (h and Vnew are
  // never kept: the backward recomputes them).
  la::state_then_output<ChunkKdaFwdOArgs>(
      ctx, state_args(a.g_cumsum, a.initial_state, a.final_state, ws.st, cu, a.chunk_offsets, a.chunk_size),
      {ws.st.qg, a.Aqk, ws.st.v_new, ws.st.h, a.o, cu, ci, a.scale}, false, fusions.state_out, chunk_kda_fwd_o);
}

void compose_bwd(const Context& ctx, const ChunkKdaBwdArgs& a, FusedIntraCumsumBwd intra_cumsum) {
  Carver cv(a.workspace, ctx.device);
  const BwdWork ws = carve_bwd(cv, la::dims_of(a), a);
  const la::Operands op = la::backward_operands(a);
  const la::OperandGrads grads = la::pipeline_grads(a, ws.op);
  const TensorView& gc = a.g_cumsum;
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const int64_t BT = a.chunk_size;
  // K0: W, U, kg, qg from the saved Akk; h and Vnew.
  la::recompute_states<KdaRecomputeWUFwdArgs>(ctx, wu_args(op, a.v, a.Akk, gc, ws.st, cu, ci), kda_recompute_w_u_fwd,
                                              state_args(gc, a.initial_state, TensorView(), ws.st, cu, a.chunk_offsets, BT));
  // K1, K2.
  chunk_kda_bwd_dAv(ctx, {a.Aqk, ws.st.v_new, a.dout, ws.dAqk, ws.dvl, cu, ci, a.scale});
  chunk_gated_delta_rule_bwd_dhu(ctx, {ws.st.qg, ws.st.kg, ws.st.w, a.dout, ws.dvl, TensorView(), gc,
                                       a.dht, ws.dh, a.dh0, ws.dv2, cu, a.chunk_offsets, a.scale, BT});
  // K3.
  chunk_kda_bwd_wy_dqkg_fused(ctx, {op.q, op.k, a.v, ws.st.v_new, gc, op.beta, a.Akk, ws.st.h, ws.dh, a.dout,
                                    ws.dv2, ws.dq, ws.dk, a.dv, ws.dbeta, ws.dg, ws.dAkk, cu, ci,
                                    a.scale, BT});
  // K4 and K5: dg = reverse chunk-local vector cumsum of K4's; then gate, sigmoid, l2norm backward.
  const ChunkKdaBwdIntraArgs ia{op.q, op.k, gc, op.beta, ws.dAqk, ws.dAkk, ws.dq, ws.dk, ws.dbeta, ws.dg,
                                grads.dq, grads.dk, grads.dbeta, ws.dg, cu, ci, BT, a.safe_gate};
  const ChunkLocalCumsumArgs sa{ws.dg, grads.dg, cu, ci, BT, true, 1.0};
  if (!intra_cumsum || !intra_cumsum(ctx, ia, sa)) {
    chunk_kda_bwd_intra(ctx, ia);
    chunk_local_cumsum(ctx, sa);
  }
  la::close_backward(ctx, a, ws.op, [&](const TensorView& dg_act) {
    kda_gate_bwd(ctx, {a.g, a.A_log, a.dt_bias, dg_act, a.dg, a.dA_log, a.ddt_bias, a.has_lower_bound,
                       a.lower_bound});
  });
}

}  // namespace kda

void chunk_kda_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  check_fwd(ctx, a);
  const la::NestedCalls nested;  // cu_seqlens was checked (or its device check launched) once
  dispatch("chunk_kda", Direction::kForward, ctx, a.q.dtype(), a);
}

void chunk_kda_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  check_bwd(ctx, a);
  const la::NestedCalls nested;  // cu_seqlens was checked (or its device check launched) once
  dispatch("chunk_kda", Direction::kBackward, ctx, a.q.dtype(), a);
}

void chunk_kda_fwd_ref(const Context& ctx, const ChunkKdaFwdArgs& a) {
  chunk_kda_fwd(with_backend(ctx, "ref"), a);
}

void chunk_kda_bwd_ref(const Context& ctx, const ChunkKdaBwdArgs& a) {
  chunk_kda_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace fusedops
