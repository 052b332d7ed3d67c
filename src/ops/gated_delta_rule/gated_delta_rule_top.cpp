// chunk_gated_delta_rule (section 1) composed of the sub-operator entry points, and
// fused_recurrent_gated_delta_rule's checks and entry points. The composition is backend-neutral:
// every step is an entry point dispatched through the registry, so a device backend only has to
// register the sub-operator kernels (and the top level pointing at compose_fwd / compose_bwd).
#include <algorithm>
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "fusedops/ops/l2norm.h"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/linear_attention/la_check.h"

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
    const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
    TensorView t(base_ ? base_ + used_ : nullptr, dtype, device_, shape);
    used_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return t;
  }
  int64_t used() const { return used_; }
  // Moves the cursor (to a mark from used()): the takes after it reuse the bytes from there on.
  void seek(int64_t at) { used_ = at; }

 private:
  char* base_;
  Device device_;
  int64_t used_ = 0;
};

struct TopDims {
  int64_t B, T, H, K, HV, V, N, NT, BT;
  DType qdt, vdt, ddt;  // q/k dtype, v dtype, dout dtype (bwd)
  DType acc;            // fp32 scratch (float64 for float64 inputs: the reference stays exact)
  bool varlen;
};

TopDims dims_of(const TensorView& q, const TensorView& v, const TensorView& cu,
                const TensorView& ci, int64_t BT) {
  TopDims d{};
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

// Checks shared by the forward and the backward: inputs, flags, varlen indices, saved tensors.
template <class Args>
TopDims check_common(const la::Check& c, const Args& a, bool backward) {
  c.base().rank(a.q, "q", 4).rank(a.k, "k", 4);
  c.value(a.q.size(2) == a.k.size(2),
          "q and k must have the same number of heads (q.shape[2] == k.shape[2]), got " +
              std::to_string(a.q.size(2)) + " and " + std::to_string(a.k.size(2)));
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
  c.input(a.g, "g", {B, T, HV});
  c.input(a.beta, "beta", {B, T, HV});
  c.chunk_size(a.chunk_size);
  c.value(!a.allow_neg_eigval || a.use_beta_sigmoid_in_kernel,
          "allow_neg_eigval requires use_beta_sigmoid_in_kernel");
  c.value(!a.use_gate_in_kernel || a.A_log.defined(), "use_gate_in_kernel requires A_log");
  if (a.use_gate_in_kernel) {
    c.input(a.A_log, "A_log", {HV});
    c.opt_input(a.dt_bias, "dt_bias", {HV});
  }
  c.value(std::isfinite(a.scale), "scale must be finite");
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, B, T, a.chunk_size);
  c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size);
  c.opt_input(a.initial_state, "initial_state", {N, HV, K, V});
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
  saved(a.g_cumsum, "g_cumsum", {B, T, HV});
  saved(a.A, "A", {B, T, HV, a.chunk_size});
  if (a.use_beta_sigmoid_in_kernel) saved(a.beta_sigmoid, "beta_sigmoid", {B, T, HV});
  const TopDims d = dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  const int kept = a.w.defined() + a.u.defined() + a.h.defined() + a.v_new.defined();
  c.value(kept == 0 || kept == 4, "w, u, h and v_new are given together or not at all");
  if (kept == 4) {
    c.output(a.w, "w", {B, T, HV, K});
    c.output(a.u, "u", {B, T, HV, V});
    c.output(a.h, "h", {d.varlen ? 1 : B, d.NT, HV, K, V});
    c.output(a.v_new, "v_new", {B, T, HV, V});
    c.base().same_dtype(a.w, "w", a.q, "q").same_dtype(a.h, "h", a.q, "q");
    c.base().same_dtype(a.u, "u", a.v, "v").same_dtype(a.v_new, "v_new", a.v, "v");
  }
  return d;
}

void check_workspace(const la::Check& c, const TensorView& ws, int64_t need) {
  if (need == 0 && !ws.defined()) return;
  c.base().defined(ws, "workspace").dtype_in(ws, "workspace", {DType::kUInt8});
  c.value(ws.numel() == 0 || ws.is_contiguous(), "workspace must be contiguous");
  c.value(ws.numel() >= need, "workspace must hold at least " + std::to_string(need) +
                                  " bytes (chunk_gated_delta_rule_*_workspace_size), got " +
                                  std::to_string(ws.numel()));
}

// Fwd workspace: [g_act fp32] kkt fp32, w, u, h, v_new (these four unless the caller keeps them).
// h shares kkt's bytes: kkt is dead once solve_tril has read it, before the state recurrence
// writes h (a backend's fused prepare step does not use kkt at all).
struct FwdWork {
  TensorView g_act, kkt, w, u, h, v_new;
};

FwdWork carve_fwd(Carver& cv, const TopDims& d, bool gate, bool kept) {
  FwdWork w;
  const int64_t Bh = d.varlen ? 1 : d.B;
  if (gate) w.g_act = cv.take(d.acc, {d.B, d.T, d.HV});
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

// Bwd workspace: w, u, h, v_new (unless the forward kept them), dv_local, dh, dv2, dw, dg (partial, fp32), [dbeta fp32],
// [dg_act fp32], [dq_normed, dk_normed].
struct BwdWork {
  TensorView w, u, h, v_new, dvl, dh, dv2, dw, dg_part, dbeta, dg_act, dqn, dkn;
};

BwdWork carve_bwd(Carver& cv, const TopDims& d, bool gate, bool sigmoid, bool l2, bool kept) {
  BwdWork w;
  const int64_t Bh = d.varlen ? 1 : d.B;
  if (!kept) {  // else the forward's, given by the caller
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
  if (sigmoid) w.dbeta = cv.take(d.acc, {d.B, d.T, d.HV});
  if (gate) w.dg_act = cv.take(d.acc, {d.B, d.T, d.HV});
  if (l2) {
    w.dqn = cv.take(d.qdt, {d.B, d.T, d.H, d.K});
    w.dkn = cv.take(d.qdt, {d.B, d.T, d.H, d.K});
  }
  return w;
}

TopDims bwd_dims(const ChunkGatedDeltaRuleBwdArgs& a) {
  TopDims d = dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  if (a.dout.defined()) d.ddt = a.dout.dtype();
  return d;
}

void check_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  la::Check c("chunk_gated_delta_rule", ctx);
  const TopDims d = check_common(c, a, false);
  c.output(a.o, "o", {d.B, d.T, d.HV, d.V});
  c.opt_output(a.final_state, "final_state", {d.N, d.HV, d.K, d.V});
  check_workspace(c, a.workspace, chunk_gated_delta_rule_fwd_workspace_size(a));
}

void check_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  la::Check c("chunk_gated_delta_rule", ctx);
  const TopDims d = check_common(c, a, true);
  c.input(a.dout, "dout", {d.B, d.T, d.HV, d.V});
  c.opt_input(a.dht, "dht", {d.N, d.HV, d.K, d.V});
  c.output(a.dq, "dq", {d.B, d.T, d.H, d.K});
  c.output(a.dk, "dk", {d.B, d.T, d.H, d.K});
  c.output(a.dv, "dv", {d.B, d.T, d.HV, d.V});
  c.output(a.dg, "dg", {d.B, d.T, d.HV});
  c.output(a.dbeta, "dbeta", {d.B, d.T, d.HV});
  c.opt_output(a.dh0, "dh0", {d.N, d.HV, d.K, d.V});
  if (a.use_gate_in_kernel) {
    c.output(a.dA_log, "dA_log", {d.HV});
    c.value(a.dt_bias.defined() == a.ddt_bias.defined(),
            a.dt_bias.defined() ? "ddt_bias is required when dt_bias is given"
                                : "ddt_bias must not be given without dt_bias");
    c.opt_output(a.ddt_bias, "ddt_bias", {d.HV});
  }
  check_workspace(c, a.workspace, chunk_gated_delta_rule_bwd_workspace_size(a));
}

Context with_backend(const Context& ctx, const char* backend) {
  Context c = ctx;
  c.backend = backend;
  return c;
}

}  // namespace

int64_t chunk_gated_delta_rule_fwd_workspace_size(const ChunkGatedDeltaRuleFwdArgs& a) {
  if (!a.q.defined() || !a.v.defined() || a.q.ndim() != 4 || a.v.ndim() != 4) return 0;
  if (a.cu_seqlens.defined() && (!a.chunk_indices.defined() || a.chunk_indices.ndim() != 2)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_fwd(cv, dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size), a.use_gate_in_kernel,
            a.w.defined());
  return cv.used();
}

int64_t chunk_gated_delta_rule_bwd_workspace_size(const ChunkGatedDeltaRuleBwdArgs& a) {
  if (!a.q.defined() || !a.v.defined() || a.q.ndim() != 4 || a.v.ndim() != 4) return 0;
  if (a.cu_seqlens.defined() && (!a.chunk_indices.defined() || a.chunk_indices.ndim() != 2)) return 0;
  Carver cv(nullptr, a.q.device());
  carve_bwd(cv, bwd_dims(a), a.use_gate_in_kernel, a.use_beta_sigmoid_in_kernel, a.use_qk_l2norm_in_kernel,
            a.w.defined());
  return cv.used();
}

namespace gdn {

void compose_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a, FusedPrepareFwd fused_prepare,
                 FusedStateOutFwd fused_state_out) {
  const TopDims d = dims_of(a.q, a.v, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  Carver cv(static_cast<char*>(a.workspace.defined() ? a.workspace.data() : nullptr), ctx.device);
  const FwdWork ws = carve_fwd(cv, d, a.use_gate_in_kernel, a.w.defined());
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
    gdn_gate_fwd(ctx, {a.g, a.A_log, a.dt_bias, ws.g_act});
    g = ws.g_act;
  }
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const bool keep = a.w.defined();  // the caller keeps W, U, h, Vnew for the backward
  const TensorView& w = keep ? a.w : ws.w;
  const TensorView& u = keep ? a.u : ws.u;
  const TensorView& h = keep ? a.h : ws.h;
  const TensorView& vn = keep ? a.v_new : ws.v_new;
  chunk_local_cumsum(ctx, {g, a.g_cumsum, cu, ci, a.chunk_size, false, 1.0});
  const RecomputeWUFwdArgs wu{k, a.v, beta, a.A, a.g_cumsum, w, u, cu, ci};
  if (!fused_prepare || !fused_prepare(ctx, wu, a.chunk_size)) {
    chunk_scaled_dot_kkt_fwd(ctx, {k, beta, a.g_cumsum, ws.kkt, cu, ci, a.chunk_size});
    solve_tril(ctx, {ws.kkt, a.A, cu, ci});
    recompute_w_u_fwd(ctx, wu);
  }
  const ChunkGatedDeltaRuleFwdHArgs ha{k, w, u, a.g_cumsum, TensorView(), a.initial_state, h, vn, a.final_state, cu,
                                      a.chunk_offsets, a.chunk_size};
  const ChunkFwdOArgs oa{q, k, vn, h, a.g_cumsum, a.o, cu, ci, a.scale, a.chunk_size};
  if (fused_state_out) {
    // h and Vnew are only written when the caller keeps them.
    ChunkGatedDeltaRuleFwdHArgs fa = ha;
    if (!keep) fa.h = fa.v_new = TensorView();
    if (fused_state_out(ctx, fa, oa)) return;
  }
  chunk_gated_delta_rule_fwd_h(ctx, ha);
  chunk_fwd_o(ctx, oa);
}

void compose_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a, StateFwdHook state_fwd,
                 StateDhuHook state_dhu, DqkwgHook dqkwg) {
  const TopDims d = bwd_dims(a);
  Carver cv(static_cast<char*>(a.workspace.defined() ? a.workspace.data() : nullptr), ctx.device);
  const BwdWork ws = carve_bwd(cv, d, a.use_gate_in_kernel, a.use_beta_sigmoid_in_kernel, a.use_qk_l2norm_in_kernel,
                               a.w.defined());
  const TensorView q = a.use_qk_l2norm_in_kernel ? a.q_normed : a.q;
  const TensorView k = a.use_qk_l2norm_in_kernel ? a.k_normed : a.k;
  const TensorView beta = a.use_beta_sigmoid_in_kernel ? a.beta_sigmoid : a.beta;
  const TensorView& gc = a.g_cumsum;
  const TensorView& cu = a.cu_seqlens;
  const TensorView& ci = a.chunk_indices;
  const int64_t BT = a.chunk_size;
  // B1: W, U from the saved A; h and Vnew by the state recurrence (unless the forward kept them).
  const bool kept = a.w.defined();
  const TensorView& w = kept ? a.w : ws.w;
  const TensorView& h = kept ? a.h : ws.h;
  const TensorView& vn = kept ? a.v_new : ws.v_new;
  if (!kept) {
    const RecomputeWUFwdArgs wa{k, a.v, beta, a.A, gc, ws.w, ws.u, cu, ci};
    const ChunkGatedDeltaRuleFwdHArgs ha{k, ws.w, ws.u, gc, TensorView(), a.initial_state, ws.h, ws.v_new,
                                         TensorView(), cu, a.chunk_offsets, BT};
    if (!state_fwd || !state_fwd(ctx, wa, ha)) {
      recompute_w_u_fwd(ctx, wa);
      chunk_gated_delta_rule_fwd_h(ctx, ha);
    }
  }
  // B2, B3.
  ChunkGatedDeltaRuleBwdDhuArgs da{q, k, w, a.dout, TensorView(), gc, TensorView(), a.dht, ws.dh, a.dh0, ws.dv2, cu,
                                   a.chunk_offsets, a.scale, BT};
  if (!state_dhu || !state_dhu(ctx, da)) {  // the hook computes dvl itself when it takes the step
    chunk_bwd_dv_local(ctx, {q, k, a.dout, gc, ws.dvl, cu, ci, a.scale, BT});
    da.dv = ws.dvl;
    chunk_gated_delta_rule_bwd_dhu(ctx, da);
  }
  // B4, B5 (dk and dg accumulate).
  const TensorView dq = a.use_qk_l2norm_in_kernel ? ws.dqn : a.dq;
  const TensorView dk = a.use_qk_l2norm_in_kernel ? ws.dkn : a.dk;
  const ChunkBwdDqkwgArgs qa{q, k, vn, a.dout, h, ws.dh, w, ws.dv2, gc, dq, dk, ws.dw, ws.dg_part, cu, ci, a.scale, BT};
  if (!dqkwg || !dqkwg(ctx, qa)) chunk_bwd_dqkwg(ctx, qa);
  const TensorView dbeta = a.use_beta_sigmoid_in_kernel ? ws.dbeta : a.dbeta;
  prepare_wy_repr_bwd(ctx, {k, a.v, beta, a.A, gc, ws.dw, ws.dv2, dk, a.dv, dbeta, ws.dg_part, cu,
                            ci, true});
  // B6: dg = reverse chunk-local cumsum of dgamma.
  const TensorView dg = a.use_gate_in_kernel ? ws.dg_act : a.dg;
  chunk_local_cumsum(ctx, {ws.dg_part, dg, cu, ci, BT, true, 1.0});
  // B8.
  if (a.use_gate_in_kernel) gdn_gate_bwd(ctx, {a.g, a.A_log, a.dt_bias, ws.dg_act, a.dg, a.dA_log, a.ddt_bias});
  if (a.use_beta_sigmoid_in_kernel) beta_sigmoid_bwd(ctx, {a.beta, ws.dbeta, a.dbeta, a.allow_neg_eigval});
  if (a.use_qk_l2norm_in_kernel) {
    l2norm_bwd(ctx, {a.q_normed, a.q_rstd, ws.dqn, a.dq});
    l2norm_bwd(ctx, {a.k_normed, a.k_rstd, ws.dkn, a.dk});
  }
}

}  // namespace gdn

void chunk_gated_delta_rule_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  check_fwd(ctx, a);
  dispatch("chunk_gated_delta_rule", Direction::kForward, ctx, a.q.dtype(), a);
}

void chunk_gated_delta_rule_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  check_bwd(ctx, a);
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

namespace {

template <class Args>
void check_recurrent_inputs(const la::Check& c, const Args& a, int64_t& N) {
  c.base().rank(a.q, "q", 4).rank(a.k, "k", 4);
  c.value(a.q.size(2) == a.k.size(2),
          "q and k must have the same number of heads (q.shape[2] == k.shape[2]), got " +
              std::to_string(a.q.size(2)) + " and " + std::to_string(a.k.size(2)));
  const auto qs = shape_vector(a.q);
  const int64_t B = qs[0], T = qs[1], H = qs[2], K = qs[3];
  c.input(a.q, "q", qs);
  c.input(a.k, "k", qs);
  c.base().rank(a.v, "v", 4);
  const int64_t HV = a.v.size(2), V = a.v.size(3);
  c.input(a.v, "v", {B, T, HV, V});
  c.groups(HV, H, "v", "q and k");
  c.value(K >= 1 && V >= 1, "K and V must be >= 1");
  c.opt_input(a.g, "g", {B, T, HV});
  c.opt_input(a.beta, "beta", {B, T, HV});
  c.value(std::isfinite(a.scale), "scale must be finite");
  N = c.seqlens(a.cu_seqlens, B, T);
  c.opt_input(a.initial_state, "initial_state", {N, HV, K, V});
}

}  // namespace

void fused_recurrent_gated_delta_rule_fwd(const Context& ctx,
                                          const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  la::Check c("fused_recurrent_gated_delta_rule", ctx);
  int64_t N = 0;
  check_recurrent_inputs(c, a, N);
  c.output(a.o, "o", shape_vector(a.v));
  c.opt_output(a.final_state, "final_state", {N, a.v.size(2), a.q.size(3), a.v.size(3)});
  if (a.o.numel() == 0 && (!a.final_state.defined() || a.final_state.numel() == 0)) return;
  dispatch("fused_recurrent_gated_delta_rule", Direction::kForward, ctx, a.q.dtype(), a);
}

void fused_recurrent_gated_delta_rule_bwd(const Context& ctx,
                                          const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  la::Check c("fused_recurrent_gated_delta_rule", ctx);
  int64_t N = 0;
  check_recurrent_inputs(c, a, N);
  const int64_t HV = a.v.size(2), K = a.q.size(3), V = a.v.size(3);
  c.input(a.dout, "dout", shape_vector(a.v));
  c.opt_input(a.dht, "dht", {N, HV, K, V});
  c.output(a.dq, "dq", shape_vector(a.q));
  c.output(a.dk, "dk", shape_vector(a.q));
  c.output(a.dv, "dv", shape_vector(a.v));
  c.value(a.g.defined() == a.dg.defined(),
          a.g.defined() ? "dg is required when g is given" : "dg must not be given without g");
  c.opt_output(a.dg, "dg", {a.q.size(0), a.q.size(1), HV});
  c.value(a.beta.defined() == a.dbeta.defined(), a.beta.defined()
                                                     ? "dbeta is required when beta is given"
                                                     : "dbeta must not be given without beta");
  c.opt_output(a.dbeta, "dbeta", {a.q.size(0), a.q.size(1), HV});
  c.opt_output(a.dh0, "dh0", {N, HV, K, V});
  if (a.dv.numel() == 0 && (!a.dh0.defined() || a.dh0.numel() == 0)) return;
  dispatch("fused_recurrent_gated_delta_rule", Direction::kBackward, ctx, a.q.dtype(), a);
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
