// chunk_kda (section 9) composed of sub-operator entry points (the KDA ones of kda.h and the
// shared ones of gated_delta_rule.h / l2norm.h). The composition is backend-neutral: every step
// is dispatched through the registry with ctx, whose backend (when set) forces the sub-operators'.
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "fusedops/ops/kda.h"
#include "fusedops/ops/l2norm.h"
#include "src/ops/linear_attention/la_check.h"
#include "src/ops/kda/kda_top.h"

namespace fusedops {
namespace {

constexpr double kL2NormEps = 1e-6;
constexpr int64_t kAlign = 64;

// Hands out aligned sub-tensors of a uint8 workspace (or only counts bytes when base is null).
class Carver {
 public:
  Carver(char* base, Device device) : base_(base), device_(device) {}
  TensorView take(DType dtype, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    TensorView t(base_ ? base_ + used_ : nullptr, dtype, device_, shape);
    used_ += (n * static_cast<int64_t>(dtype_size(dtype)) + kAlign - 1) / kAlign * kAlign;
    return t;
  }
  int64_t used() const { return used_; }

 private:
  char* base_;
  Device device_;
  int64_t used_ = 0;
};

struct Dims {
  int64_t B, T, H, K, HV, V, N, NT, BT;
  DType qdt, vdt, ddt, acc;
  bool varlen;
};

Dims dims_of(const TensorView& q, const TensorView& v, const TensorView& cu, const TensorView& ci,
             int64_t BT) {
  Dims d{};
  d.B = q.size(0);
  d.T = q.size(1);
  d.H = q.size(2);
  d.K = q.size(3);
  d.HV = v.size(2);
  d.V = v.size(3);
  d.varlen = cu.defined();
  d.N = d.varlen ? cu.size(0) - 1 : d.B;
  d.NT = d.varlen ? ci.size(0) : la::ceil_div(d.T, BT);
  d.BT = BT;
  d.qdt = q.dtype();
  d.vdt = v.dtype();
  d.ddt = v.dtype();
  d.acc = q.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  return d;
}

template <class Args>
Dims check_common(const la::Check& c, const Args& a, bool backward) {
  c.base().rank(a.q, "q", 4).rank(a.k, "k", 4);
  c.value(a.q.size(2) == a.k.size(2),
          "q and k must have the same shape (q.shape[2] == k.shape[2]), got " +
              std::to_string(a.q.size(2)) + " and " + std::to_string(a.k.size(2)) + " heads");
  const auto qs = shape_vector(a.q);
  const int64_t B = qs[0], T = qs[1], H = qs[2], K = qs[3];
  c.input(a.q, "q", qs);
  c.input(a.k, "k", qs);
  c.base().dtype_in(a.q, "q", {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64});
  c.base().same_dtype(a.k, "k", a.q, "q");
  c.base().rank(a.v, "v", 4);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  c.input(a.v, "v", {B, T, HV, V});
  c.base().same_dtype(a.v, "v", a.q, "q");
  c.groups(HV, H, "v", "q and k");
  c.head_dims(K, V);
  c.input(a.g, "g", {B, T, HV, K});
  c.input(a.beta, "beta", {B, T, HV});
  c.value(a.chunk_size == 32 || a.chunk_size == 64,
          "chunk_size must be 32 or 64, got " + std::to_string(a.chunk_size));
  c.value(!a.allow_neg_eigval || a.use_beta_sigmoid_in_kernel,
          "allow_neg_eigval requires use_beta_sigmoid_in_kernel");
  if (a.use_gate_in_kernel) {
    c.value(a.A_log.defined() || a.has_lower_bound,
            "use_gate_in_kernel requires A_log unless lower_bound is set");
    c.opt_input(a.A_log, "A_log", {HV});
    if (a.dt_bias.defined()) {
      c.base().floating(a.dt_bias, "dt_bias");
      c.value(a.dt_bias.numel() == HV * K && (a.dt_bias.numel() == 0 || a.dt_bias.is_contiguous()),
              "dt_bias must be a contiguous tensor of HV*K=" + std::to_string(HV * K) +
                  " elements, got shape " + a.dt_bias.shape_string());
    }
    if (a.safe_gate)
      c.value(a.has_lower_bound && a.lower_bound >= -5.0 && a.lower_bound < 0.0,
              "safe_gate with use_gate_in_kernel requires lower_bound in [-5, 0)");
  }
  c.value(!a.has_lower_bound || std::isfinite(a.lower_bound), "lower_bound must be finite");
  c.value(std::isfinite(a.scale), "scale must be finite");
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, B, T, a.chunk_size);
  c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size);
  c.opt_input(a.initial_state, "initial_state", {N, HV, K, V});
  if (a.initial_state.defined()) {
    const DType want = a.q.dtype() == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
    c.value(a.initial_state.dtype() == want,
            std::string("initial_state must be ") + dtype_name(want) + " (the state is kept in " +
                dtype_name(want) + "), got " + dtype_name(a.initial_state.dtype()));
  }
  if (a.use_qk_l2norm_in_kernel) {
    c.base().rows_addressable(a.q, "q").rows_addressable(a.k, "k");
    for (auto [t, name] : {std::pair{&a.q_normed, "q_normed"}, std::pair{&a.k_normed, "k_normed"}}) {
      if (backward) c.input(*t, name, {B, T, H, K});
      else c.output(*t, name, {B, T, H, K});
      c.base().same_dtype(*t, name, a.q, "q");
      c.base().rows_addressable(*t, name);
    }
    for (auto [t, name] : {std::pair{&a.q_rstd, "q_rstd"}, std::pair{&a.k_rstd, "k_rstd"}}) {
      c.output(*t, name, {B, T, H});
      c.base().dtype_in(*t, name, {DType::kFloat32, DType::kFloat64});
    }
  }
  auto saved = [&](const TensorView& t, const char* name, std::vector<int64_t> shape) {
    if (backward) c.input(t, name, shape);
    else c.output(t, name, shape);
  };
  saved(a.g_cumsum, "g_cumsum", {B, T, HV, K});
  saved(a.Aqk, "Aqk", {B, T, HV, a.chunk_size});
  saved(a.Akk, "Akk", {B, T, HV, a.chunk_size});
  if (a.use_beta_sigmoid_in_kernel) saved(a.beta_sigmoid, "beta_sigmoid", {B, T, HV});
  return dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size);
}

void check_workspace(const la::Check& c, const TensorView& ws, int64_t need) {
  if (need == 0 && !ws.defined()) return;
  c.base().defined(ws, "workspace").dtype_in(ws, "workspace", {DType::kUInt8});
  c.value(ws.numel() == 0 || ws.is_contiguous(), "workspace must be contiguous");
  c.value(ws.numel() >= need, "workspace must hold at least " + std::to_string(need) +
                                  " bytes (chunk_kda_*_workspace_size), got " +
                                  std::to_string(ws.numel()));
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
  if (gate) w.g_act = cv.take(d.acc, {d.B, d.T, d.HV, d.K});
  w.st = carve_state(cv, d);
  return w;
}

struct BwdWork {
  StateWork st;
  TensorView dAqk, dvl, dh, dv2, dq, dk, dbeta, dg, dAkk, dbeta_s, dg_act, dqn, dkn;
};
BwdWork carve_bwd(Carver& cv, const Dims& d, bool gate, bool sigmoid, bool l2) {
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
  if (sigmoid) w.dbeta_s = cv.take(d.acc, {d.B, d.T, d.HV});
  if (gate) w.dg_act = cv.take(d.acc, {d.B, d.T, d.HV, d.K});
  if (l2) {
    w.dqn = cv.take(d.qdt, {d.B, d.T, d.H, d.K});
    w.dkn = cv.take(d.qdt, {d.B, d.T, d.H, d.K});
  }
  return w;
}

Dims bwd_dims(const ChunkKdaBwdArgs& a) {
  Dims d = dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  if (a.dout.defined()) d.ddt = a.dout.dtype();
  return d;
}

void check_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  la::Check c("chunk_kda", ctx);
  const Dims d = check_common(c, a, false);
  c.output(a.o, "o", {d.B, d.T, d.HV, d.V});
  c.opt_output(a.final_state, "final_state", {d.N, d.HV, d.K, d.V});
  check_workspace(c, a.workspace, chunk_kda_fwd_workspace_size(a));
}

void check_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  la::Check c("chunk_kda", ctx);
  const Dims d = check_common(c, a, true);
  c.input(a.dout, "dout", {d.B, d.T, d.HV, d.V});
  c.opt_input(a.dht, "dht", {d.N, d.HV, d.K, d.V});
  c.output(a.dq, "dq", {d.B, d.T, d.H, d.K});
  c.output(a.dk, "dk", {d.B, d.T, d.H, d.K});
  c.output(a.dv, "dv", {d.B, d.T, d.HV, d.V});
  c.output(a.dg, "dg", {d.B, d.T, d.HV, d.K});
  c.output(a.dbeta, "dbeta", {d.B, d.T, d.HV});
  c.opt_output(a.dh0, "dh0", {d.N, d.HV, d.K, d.V});
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
  check_workspace(c, a.workspace, chunk_kda_bwd_workspace_size(a));
}

Context with_backend(const Context& ctx, const char* backend) {
  Context c = ctx;
  c.backend = backend;
  return c;
}

// kda_recompute_w_u_fwd's arguments: W, U, kg, qg into ws from the saved Akk.
KdaRecomputeWUFwdArgs wu_args(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& beta,
                              const TensorView& Akk, const TensorView& gc, const StateWork& ws, const TensorView& cu,
                              const TensorView& ci) {
  return {q, k, v, beta, Akk, gc, ws.w, ws.u, ws.kg, ws.qg, cu, ci};
}
// The gk state recurrence's arguments (chunk_gated_delta_rule_fwd_h) over ws's W, U, kg, writing
// ws.h and ws.v_new (and ht).
ChunkGatedDeltaRuleFwdHArgs state_args(const TensorView& gc, const TensorView& h0, const TensorView& ht,
                                       const StateWork& ws, const TensorView& cu, const TensorView& co, int64_t BT) {
  return {ws.kg, ws.w, ws.u, TensorView(), gc, h0, ws.h, ws.v_new, ht, cu, co, BT};
}
// W, U, kg, qg from the saved Akk, then the state recurrence's arguments over them.
ChunkGatedDeltaRuleFwdHArgs recompute_w_u(const Context& ctx, const TensorView& q, const TensorView& k,
                                          const TensorView& v, const TensorView& beta, const TensorView& Akk,
                                          const TensorView& gc, const TensorView& h0, const TensorView& ht,
                                          const StateWork& ws, const TensorView& cu, const TensorView& ci,
                                          const TensorView& co, int64_t BT) {
  kda_recompute_w_u_fwd(ctx, wu_args(q, k, v, beta, Akk, gc, ws, cu, ci));
  return state_args(gc, h0, ht, ws, cu, co, BT);
}

void recompute_states(const Context& ctx, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& beta, const TensorView& Akk,
                      const TensorView& gc, const TensorView& h0, const TensorView& ht,
                      const StateWork& ws, const TensorView& cu, const TensorView& ci,
                      const TensorView& co, int64_t BT) {
  chunk_gated_delta_rule_fwd_h(ctx, recompute_w_u(ctx, q, k, v, beta, Akk, gc, h0, ht, ws, cu, ci, co, BT));
}

}  // namespace

int64_t chunk_kda_fwd_workspace_size(const ChunkKdaFwdArgs& a) {
  if (!a.q.defined() || !a.v.defined() || a.q.ndim() != 4 || a.v.ndim() != 4) return 0;
  if (a.cu_seqlens.defined() && (!a.chunk_indices.defined() || a.chunk_indices.ndim() != 2)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_fwd(cv, dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size), a.use_gate_in_kernel);
  return cv.used();
}

int64_t chunk_kda_bwd_workspace_size(const ChunkKdaBwdArgs& a) {
  if (!a.q.defined() || !a.v.defined() || a.q.ndim() != 4 || a.v.ndim() != 4) return 0;
  if (a.cu_seqlens.defined() && (!a.chunk_indices.defined() || a.chunk_indices.ndim() != 2)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_bwd(cv, bwd_dims(a), a.use_gate_in_kernel, a.use_beta_sigmoid_in_kernel,
            a.use_qk_l2norm_in_kernel);
  return cv.used();
}

namespace kda {

void compose_fwd(const Context& ctx, const ChunkKdaFwdArgs& a, FwdFusions fusions) {
  const Dims d = dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  Carver cv(static_cast<char*>(a.workspace.defined() ? a.workspace.data() : nullptr), ctx.device);
  const FwdWork ws = carve_fwd(cv, d, a.use_gate_in_kernel);
  TensorView q = a.q, k = a.k, beta = a.beta, g = a.g;
  if (a.use_qk_l2norm_in_kernel) {
    l2norm_fwd(ctx, {a.q, a.q_normed, a.q_rstd, kL2NormEps});
    l2norm_fwd(ctx, {a.k, a.k_normed, a.k_rstd, kL2NormEps});
    q = a.q_normed;
    k = a.k_normed;
  }
  if (a.use_beta_sigmoid_in_kernel) {
    beta_sigmoid_fwd(ctx, {a.beta, a.beta_sigmoid, a.allow_neg_eigval});
    beta = a.beta_sigmoid;
  }
  if (a.use_gate_in_kernel) {
    kda_gate_fwd(ctx, {a.g, a.A_log, a.dt_bias, ws.g_act, a.has_lower_bound, a.lower_bound});
    g = ws.g_act;
  }
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const ChunkLocalCumsumArgs sa{g, a.g_cumsum, cu, ci, a.chunk_size, false, 1.0};
  const ChunkKdaFwdIntraArgs ia{q, k, a.g_cumsum, beta, a.Aqk, a.Akk, cu, ci, a.scale, a.chunk_size, a.safe_gate};
  // cumsum, intra and the w/u recompute (all three in one step, or the first two, where the backend can).
  const KdaRecomputeWUFwdArgs wa = wu_args(q, k, a.v, beta, a.Akk, a.g_cumsum, ws.st, cu, ci);
  const bool wu_done = fusions.cumsum_intra_wu && fusions.cumsum_intra_wu(ctx, sa, ia, wa);
  if (!wu_done) {
    if (!fusions.cumsum_intra || !fusions.cumsum_intra(ctx, sa, ia)) {
      chunk_local_cumsum(ctx, sa);
      chunk_kda_fwd_intra(ctx, ia);
    }
    kda_recompute_w_u_fwd(ctx, wa);
  }
  // The state recurrence, and chunk_kda_fwd_o fused with it when the backend can.
  const ChunkGatedDeltaRuleFwdHArgs ha =
      state_args(a.g_cumsum, a.initial_state, a.final_state, ws.st, cu, a.chunk_offsets, a.chunk_size);
  const ChunkKdaFwdOArgs oa{ws.st.qg, a.Aqk, ws.st.v_new, ws.st.h, a.o, cu, ci, a.scale};
  if (fusions.state_out) {
    ChunkGatedDeltaRuleFwdHArgs fa = ha;
    fa.h = fa.v_new = TensorView();
    if (fusions.state_out(ctx, fa, oa)) return;
  }
  chunk_gated_delta_rule_fwd_h(ctx, ha);
  chunk_kda_fwd_o(ctx, oa);
}

void compose_bwd(const Context& ctx, const ChunkKdaBwdArgs& a, FusedIntraCumsumBwd intra_cumsum) {
  const Dims d = bwd_dims(a);
  Carver cv(static_cast<char*>(a.workspace.defined() ? a.workspace.data() : nullptr), ctx.device);
  const BwdWork ws = carve_bwd(cv, d, a.use_gate_in_kernel, a.use_beta_sigmoid_in_kernel,
                               a.use_qk_l2norm_in_kernel);
  const TensorView q = a.use_qk_l2norm_in_kernel ? a.q_normed : a.q;
  const TensorView k = a.use_qk_l2norm_in_kernel ? a.k_normed : a.k;
  const TensorView beta = a.use_beta_sigmoid_in_kernel ? a.beta_sigmoid : a.beta;
  const TensorView& gc = a.g_cumsum;
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const int64_t BT = a.chunk_size;
  // K0: W, U, kg, qg from the saved Akk; h and Vnew.
  recompute_states(ctx, q, k, a.v, beta, a.Akk, gc, a.initial_state, TensorView(), ws.st, cu, ci,
                   a.chunk_offsets, BT);
  // K1, K2.
  chunk_kda_bwd_dAv(ctx, {a.Aqk, ws.st.v_new, a.dout, ws.dAqk, ws.dvl, cu, ci, a.scale});
  chunk_gated_delta_rule_bwd_dhu(ctx, {ws.st.qg, ws.st.kg, ws.st.w, a.dout, ws.dvl, TensorView(), gc,
                                       a.dht, ws.dh, a.dh0, ws.dv2, cu, a.chunk_offsets, a.scale, BT});
  // K3.
  chunk_kda_bwd_wy_dqkg_fused(ctx, {q, k, a.v, ws.st.v_new, gc, beta, a.Akk, ws.st.h, ws.dh, a.dout,
                                    ws.dv2, ws.dq, ws.dk, a.dv, ws.dbeta, ws.dg, ws.dAkk, cu, ci,
                                    a.scale, BT});
  const TensorView dq = a.use_qk_l2norm_in_kernel ? ws.dqn : a.dq;
  const TensorView dk = a.use_qk_l2norm_in_kernel ? ws.dkn : a.dk;
  const TensorView dbeta = a.use_beta_sigmoid_in_kernel ? ws.dbeta_s : a.dbeta;
  // K4 and K5: dg = reverse chunk-local vector cumsum of K4's; then gate, sigmoid, l2norm backward.
  const TensorView dg = a.use_gate_in_kernel ? ws.dg_act : a.dg;
  const ChunkKdaBwdIntraArgs ia{q, k, gc, beta, ws.dAqk, ws.dAkk, ws.dq, ws.dk, ws.dbeta, ws.dg, dq, dk,
                                dbeta, ws.dg, cu, ci, BT, a.safe_gate};
  const ChunkLocalCumsumArgs sa{ws.dg, dg, cu, ci, BT, true, 1.0};
  if (!intra_cumsum || !intra_cumsum(ctx, ia, sa)) {
    chunk_kda_bwd_intra(ctx, ia);
    chunk_local_cumsum(ctx, sa);
  }
  if (a.use_gate_in_kernel)
    kda_gate_bwd(ctx, {a.g, a.A_log, a.dt_bias, ws.dg_act, a.dg, a.dA_log, a.ddt_bias,
                       a.has_lower_bound, a.lower_bound});
  if (a.use_beta_sigmoid_in_kernel)
    beta_sigmoid_bwd(ctx, {a.beta, ws.dbeta_s, a.dbeta, a.allow_neg_eigval});
  if (a.use_qk_l2norm_in_kernel) {
    l2norm_bwd(ctx, {a.q_normed, a.q_rstd, ws.dqn, a.dq});
    l2norm_bwd(ctx, {a.k_normed, a.k_rstd, ws.dkn, a.dk});
  }
}

}  // namespace kda

void chunk_kda_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  check_fwd(ctx, a);
  dispatch("chunk_kda", Direction::kForward, ctx, a.q.dtype(), a);
}

void chunk_kda_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  check_bwd(ctx, a);
  dispatch("chunk_kda", Direction::kBackward, ctx, a.q.dtype(), a);
}

void chunk_kda_fwd_ref(const Context& ctx, const ChunkKdaFwdArgs& a) {
  chunk_kda_fwd(with_backend(ctx, "ref"), a);
}

void chunk_kda_bwd_ref(const Context& ctx, const ChunkKdaBwdArgs& a) {
  chunk_kda_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace fusedops
