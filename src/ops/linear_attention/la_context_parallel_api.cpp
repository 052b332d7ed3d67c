// Context-parallel summaries of the linear-attention family: argument checks, the summaries
// composed of the GDN / KDA sub-operator entry points, and the dispatch of the folds.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/context_parallel.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "fusedops/ops/kda.h"
#include "fusedops/ops/l2norm.h"
#include "src/ops/linear_attention/la_context_parallel.h"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops {
namespace {

using la::Carver;

constexpr double kL2NormEps = 1e-6;  // the top levels' use_qk_l2norm_in_kernel epsilon
// A contiguous view of `n` elements of t's dtype at element offset `at` of a contiguous t.
TensorView sub(const TensorView& t, int64_t at, std::vector<int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t st = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = st;
    st *= shape[d];
  }
  char* p = static_cast<char*>(t.data()) + at * static_cast<int64_t>(dtype_size(t.dtype()));
  return TensorView(p, t.dtype(), t.device(), static_cast<int>(shape.size()), shape.data(),
                    strides.data());
}

DType acc_of(DType d) { return d == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

void check_token_major(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name,
                       const std::vector<int64_t>& shape) {
  c.defined(t, name).floating(t, name).on_device(t, name, ctx).shape(t, name, shape);
  c.value(t.numel() == 0 || t.stride(-1) == 1 || t.size(-1) <= 1,
          std::string(name) + " must have a contiguous last dimension (stride 1)");
}

void check_dense_out(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name,
                     const std::vector<int64_t>& shape, DType dtype) {
  c.defined(t, name).on_device(t, name, ctx).shape(t, name, shape).contiguous(t, name);
  c.value(t.dtype() == dtype, std::string(name) + " must be " + dtype_name(dtype) + ", got " +
                                  dtype_name(t.dtype()));
}

void check_chunk_size(const ArgCheck& c, int64_t bt) {
  c.value(bt == 16 || bt == 32 || bt == 64, "chunk_size must be 16, 32 or 64, got " + std::to_string(bt));
}

// ---------------------------------------------------------------------------------------------
// Forward summary.

// The dimensions of a segment: k (or q) [1,Ts,H,K], v [1,Ts,HV,V]; a [1,Ts,HV,K] gate is KDA's.
struct SegDims {
  int64_t Ts = 0, H = 0, K = 0, HV = 0, V = 0, BT = 64, NT = 0;
  bool kda = false;
  DType kdt = DType::kFloat32, vdt = DType::kFloat32, ddt = DType::kFloat32, acc = DType::kFloat32;
};

SegDims seg_dims(const TensorView& k, const TensorView& v, const TensorView& gate, int64_t chunk_size) {
  SegDims d;
  d.Ts = k.size(1);
  d.H = k.size(2);
  d.K = k.size(3);
  d.HV = v.size(2);
  d.V = v.size(3);
  d.BT = chunk_size;
  d.NT = (d.Ts + d.BT - 1) / d.BT;
  d.kda = gate.ndim() == 4;
  d.kdt = k.dtype();
  d.vdt = d.ddt = v.dtype();
  d.acc = acc_of(k.dtype());
  return d;
}

using FwdDims = SegDims;
FwdDims fwd_dims(const LaCpFwdSummaryArgs& a) { return seg_dims(a.k, a.v, a.g, a.chunk_size); }

struct FwdWork {
  TensorView kn, rstd, bs, ga, gc, kkt, A, Aqk, kg, w, u, u0, eye, hM, hS;
};

FwdWork carve_fwd(Carver& ar, const FwdDims& d, const LaCpFwdSummaryArgs& a) {
  FwdWork w;
  const std::vector<int64_t> gshape = d.kda ? std::vector<int64_t>{1, d.Ts, d.HV, d.K}
                                            : std::vector<int64_t>{1, d.Ts, d.HV};
  if (a.use_qk_l2norm_in_kernel) {
    w.kn = ar.take(d.kdt, {1, d.Ts, d.H, d.K});
    w.rstd = ar.take(d.acc, {1, d.Ts, d.H});
  }
  if (a.use_beta_sigmoid_in_kernel) w.bs = ar.take(d.acc, {1, d.Ts, d.HV});
  if (a.use_gate_in_kernel) w.ga = ar.take(d.acc, gshape);
  // float64 on the CPU, as the top levels' g_cumsum: the CPU kernels take its in-chunk
  // differences in double (exact for any gate; see the family READMEs' Numerics).
  w.gc = ar.take(a.k.device().kind == DeviceKind::kCPU ? DType::kFloat64 : d.acc, gshape);
  if (d.kda) {
    w.Aqk = ar.take(d.kdt, {1, d.Ts, d.HV, d.BT});
    w.kg = ar.take(d.kdt, {1, d.Ts, d.HV, d.K});
  } else {
    w.kkt = ar.take(d.acc, {1, d.Ts, d.HV, d.BT});
  }
  w.A = ar.take(d.kdt, {1, d.Ts, d.HV, d.BT});
  w.w = ar.take(d.kdt, {1, d.Ts, d.HV, d.K});
  w.u = ar.take(d.vdt, {1, d.Ts, d.HV, d.V});
  w.u0 = ar.take(d.vdt, {1, d.Ts, d.HV, d.K});
  w.eye = ar.take(d.acc, {1, d.HV, d.K, d.K});
  // The two passes' snapshots (written by fwd_h, never read) share one buffer.
  const TensorView h = ar.take(d.kdt, {1, d.NT, d.HV, d.K, std::max(d.K, d.V)});
  w.hM = sub(h, 0, {1, d.NT, d.HV, d.K, d.K});
  w.hS = sub(h, 0, {1, d.NT, d.HV, d.K, d.V});
  return w;
}

FwdDims check_fwd(const Context& ctx, const LaCpFwdSummaryArgs& a) {
  ArgCheck c("la_cp_fwd_summary");
  check_chunk_size(c, a.chunk_size);  // before the dimensions, which divide by it
  c.rank(a.k, "k", 4).rank(a.v, "v", 4);
  c.dtype_in(a.k, "k", {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64});
  c.same_dtype(a.v, "v", a.k, "k");
  c.value(a.k.size(0) == 1, "the segment must have batch size 1 (one sequence), got B=" +
                                std::to_string(a.k.size(0)));
  c.value(a.g.defined() && (a.g.ndim() == 3 || a.g.ndim() == 4),
          "g must be [1,Ts,HV] (gated delta rule) or [1,Ts,HV,K] (KDA)");
  const FwdDims d = fwd_dims(a);
  check_token_major(c, ctx, a.k, "k", {1, d.Ts, d.H, d.K});
  check_token_major(c, ctx, a.v, "v", {1, d.Ts, d.HV, d.V});
  c.value(d.H >= 1 && d.HV % d.H == 0, "v has HV=" + std::to_string(d.HV) +
                                           " heads, which is not a multiple of the " +
                                           std::to_string(d.H) + " heads of k");
  c.value(d.K >= 1 && d.K <= 256 && d.V >= 1, "K must be in [1, 256] and V >= 1, got K=" +
                                                   std::to_string(d.K) + ", V=" + std::to_string(d.V));
  if (d.kda) check_token_major(c, ctx, a.g, "g", {1, d.Ts, d.HV, d.K});
  else check_token_major(c, ctx, a.g, "g", {1, d.Ts, d.HV});
  check_token_major(c, ctx, a.beta, "beta", {1, d.Ts, d.HV});
  c.value(!a.allow_neg_eigval || a.use_beta_sigmoid_in_kernel,
          "allow_neg_eigval requires use_beta_sigmoid_in_kernel");
  c.value(!a.use_gate_in_kernel || a.A_log.defined() || (d.kda && a.has_lower_bound),
          "use_gate_in_kernel requires A_log");
  check_dense_out(c, ctx, a.summary, "summary", {la_cp_summary_size(d.HV, d.K, d.V)}, d.acc);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Backward summary.

using BwdDims = SegDims;
BwdDims bwd_dims(const LaCpBwdSummaryArgs& a) {
  BwdDims d = seg_dims(a.q, a.v, a.g_cumsum, a.chunk_size);
  if (a.dout.defined()) d.ddt = a.dout.dtype();
  return d;
}

struct BwdWork {
  TensorView w, u, kg, qg, dAqk, dvl, dh, dv2;
};

BwdWork carve_bwd(Carver& ar, const BwdDims& d, bool have_w) {
  BwdWork w;
  if (!have_w) w.w = ar.take(d.kdt, {1, d.Ts, d.HV, d.K});
  if (!have_w || d.kda) w.u = ar.take(d.vdt, {1, d.Ts, d.HV, d.V});
  if (d.kda) {
    w.kg = ar.take(d.kdt, {1, d.Ts, d.HV, d.K});
    w.qg = ar.take(d.kdt, {1, d.Ts, d.HV, d.K});
    w.dAqk = ar.take(d.acc, {1, d.Ts, d.HV, d.BT});
  }
  w.dvl = ar.take(d.ddt, {1, d.Ts, d.HV, d.V});
  w.dh = ar.take(d.kdt, {1, d.NT, d.HV, d.K, d.V});
  w.dv2 = ar.take(d.ddt, {1, d.Ts, d.HV, d.V});
  return w;
}

BwdDims check_bwd(const Context& ctx, const LaCpBwdSummaryArgs& a) {
  ArgCheck c("la_cp_bwd_summary");
  check_chunk_size(c, a.chunk_size);  // before the dimensions, which divide by it
  c.rank(a.q, "q", 4).rank(a.v, "v", 4);
  c.dtype_in(a.q, "q", {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64});
  c.value(a.q.size(0) == 1, "the segment must have batch size 1 (one sequence), got B=" +
                                std::to_string(a.q.size(0)));
  c.value(a.g_cumsum.defined() && (a.g_cumsum.ndim() == 3 || a.g_cumsum.ndim() == 4),
          "g_cumsum must be [1,Ts,HV] (gated delta rule) or [1,Ts,HV,K] (KDA)");
  const BwdDims d = bwd_dims(a);
  check_token_major(c, ctx, a.q, "q", {1, d.Ts, d.H, d.K});
  check_token_major(c, ctx, a.k, "k", {1, d.Ts, d.H, d.K});
  c.same_dtype(a.k, "k", a.q, "q").same_dtype(a.v, "v", a.q, "q");
  check_token_major(c, ctx, a.v, "v", {1, d.Ts, d.HV, d.V});
  c.value(d.H >= 1 && d.HV % d.H == 0, "v has HV=" + std::to_string(d.HV) +
                                           " heads, which is not a multiple of the " +
                                           std::to_string(d.H) + " heads of q and k");
  c.value(d.K >= 1 && d.K <= 256 && d.V >= 1, "K must be in [1, 256] and V >= 1, got K=" +
                                                   std::to_string(d.K) + ", V=" + std::to_string(d.V));
  check_token_major(c, ctx, a.beta, "beta", {1, d.Ts, d.HV});
  if (d.kda) check_token_major(c, ctx, a.g_cumsum, "g_cumsum", {1, d.Ts, d.HV, d.K});
  else check_token_major(c, ctx, a.g_cumsum, "g_cumsum", {1, d.Ts, d.HV});
  check_token_major(c, ctx, a.A, "A", {1, d.Ts, d.HV, d.BT});
  if (d.kda) {
    check_token_major(c, ctx, a.Aqk, "Aqk", {1, d.Ts, d.HV, d.BT});
    c.value(!a.w.defined(), "w is recomputed for KDA (with kg and qg) and must not be given");
  } else {
    c.value(!a.Aqk.defined(), "Aqk is KDA's (g_cumsum [1,Ts,HV,K]) and must not be given here");
    if (a.w.defined()) check_token_major(c, ctx, a.w, "w", {1, d.Ts, d.HV, d.K});
  }
  check_token_major(c, ctx, a.dout, "dout", {1, d.Ts, d.HV, d.V});
  if (a.dht.defined()) {
    c.floating(a.dht, "dht").on_device(a.dht, "dht", ctx).shape(a.dht, "dht", {1, d.HV, d.K, d.V});
    c.contiguous(a.dht, "dht");
  }
  c.value(std::isfinite(a.scale), "scale must be finite");
  check_dense_out(c, ctx, a.dh0, "dh0", {1, d.HV, d.K, d.V}, d.acc);
  return d;
}

// ---------------------------------------------------------------------------------------------
// Folds.

la_cp::Dims check_fold(const ArgCheck& c, const Context& ctx, const TensorView& summaries,
                       const TensorView& state, const char* state_name, int64_t lo, int64_t hi) {
  c.rank(summaries, "summaries", 2).rank(state, state_name, 3);
  c.dtype_in(summaries, "summaries", {DType::kFloat32, DType::kFloat64})
      .on_device(summaries, "summaries", ctx)
      .contiguous(summaries, "summaries");
  la_cp::Dims d{state.size(0), state.size(1), state.size(2)};
  c.shape(summaries, "summaries", {summaries.size(0), d.size()}, "[R, HV*K*(K+V)]");
  check_dense_out(c, ctx, state, state_name, {d.HV, d.K, d.V}, summaries.dtype());
  c.value(0 <= lo && lo <= hi && hi <= summaries.size(0),
          "the fold range must satisfy 0 <= lo <= hi <= R=" + std::to_string(summaries.size(0)) +
              ", got lo=" + std::to_string(lo) + ", hi=" + std::to_string(hi));
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

int64_t la_cp_fwd_summary_workspace_size(const LaCpFwdSummaryArgs& a) {
  if (!a.k.defined() || !a.v.defined() || !a.g.defined() || a.k.ndim() != 4 || a.v.ndim() != 4) return 0;
  if (a.k.size(1) == 0 || a.chunk_size <= 0) return 0;
  Carver ar(nullptr, a.k.device());
  carve_fwd(ar, fwd_dims(a), a);
  return ar.used();
}

void la_cp_fwd_summary(const Context& ctx, const LaCpFwdSummaryArgs& a) {
  const FwdDims d = check_fwd(ctx, a);
  const TensorView M = sub(a.summary, 0, {1, d.HV, d.K, d.K});
  const TensorView S = sub(a.summary, d.HV * d.K * d.K, {1, d.HV, d.K, d.V});
  if (d.Ts == 0) {  // nothing crosses the segment: M = I, S_loc = 0
    la_cp::fill(ctx, {M, 1.0});
    la_cp::fill(ctx, {S, 0.0});
    return;
  }
  ArgCheck("la_cp_fwd_summary").workspace(a.workspace, ctx, la_cp_fwd_summary_workspace_size(a), "la_cp_fwd_summary_workspace_size");
  Carver ar(a.workspace, ctx.device);
  const FwdWork ws = carve_fwd(ar, d, a);
  TensorView k = a.k, beta = a.beta, g = a.g;
  if (a.use_qk_l2norm_in_kernel) {
    l2norm_fwd(ctx, {a.k, ws.kn, ws.rstd, kL2NormEps});
    k = ws.kn;
  }
  if (a.use_beta_sigmoid_in_kernel) {
    beta_sigmoid_fwd(ctx, {a.beta, ws.bs, a.allow_neg_eigval});
    beta = ws.bs;
  }
  if (a.use_gate_in_kernel) {
    if (d.kda) kda_gate_fwd(ctx, {a.g, a.A_log, a.dt_bias, ws.ga, a.has_lower_bound, a.lower_bound});
    else gdn_gate_fwd(ctx, {a.g, a.A_log, a.dt_bias, ws.ga});
    g = ws.ga;
  }
  const TensorView none;
  chunk_local_cumsum(ctx, {g, ws.gc, none, none, d.BT, false, 1.0});
  TensorView kstate = k;  // the k of the state recurrence (KDA: the gated kg)
  if (d.kda) {
    // Aqk (with q = k) is a by-product of the intra kernel that the summary does not use.
    chunk_kda_fwd_intra(ctx, {k, k, ws.gc, beta, ws.Aqk, ws.A, none, none, 1.0, d.BT, a.safe_gate});
    kda_recompute_w_u_fwd(ctx, {none, k, a.v, beta, ws.A, ws.gc, ws.w, ws.u, ws.kg, none, none, none});
    kstate = ws.kg;
  } else {
    chunk_scaled_dot_kkt_fwd(ctx, {k, beta, ws.gc, ws.kkt, none, none, d.BT});
    solve_tril(ctx, {ws.kkt, ws.A, none, none});
    recompute_w_u_fwd(ctx, {k, a.v, beta, ws.A, ws.gc, ws.w, ws.u, none, none});
  }
  const TensorView gs = d.kda ? none : ws.gc, gks = d.kda ? ws.gc : none;
  // M: the recurrence from X = I with U = 0; S_loc: from X = 0 with the segment's U.
  la_cp::fill(ctx, {ws.eye, 1.0});
  la_cp::fill(ctx, {ws.u0, 0.0});
  chunk_gated_delta_rule_fwd_h(ctx, {kstate, ws.w, ws.u0, gs, gks, ws.eye, ws.hM, none, M, none, none, d.BT});
  chunk_gated_delta_rule_fwd_h(ctx, {kstate, ws.w, ws.u, gs, gks, none, ws.hS, none, S, none, none, d.BT});
}

int64_t la_cp_bwd_summary_workspace_size(const LaCpBwdSummaryArgs& a) {
  if (!a.q.defined() || !a.v.defined() || !a.g_cumsum.defined() || a.q.ndim() != 4 || a.v.ndim() != 4)
    return 0;
  if (a.q.size(1) == 0 || a.chunk_size <= 0) return 0;
  Carver ar(nullptr, a.q.device());
  carve_bwd(ar, bwd_dims(a), a.w.defined());
  return ar.used();
}

void la_cp_bwd_summary(const Context& ctx, const LaCpBwdSummaryArgs& a) {
  const BwdDims d = check_bwd(ctx, a);
  const TensorView none;
  if (d.Ts == 0) {  // dS_init = dS_end: an empty fold from h0 = dht
    const TensorView out = sub(a.dh0, 0, {d.HV, d.K, d.V});
    if (!a.dht.defined()) {
      la_cp::fill(ctx, {out, 0.0});
      return;
    }
    const la_cp::Dims pd{d.HV, d.K, d.V};
    const TensorView no_summaries(nullptr, d.acc, ctx.device, {0, pd.size()});
    la_cp_fold_fwd(ctx, {no_summaries, sub(a.dht, 0, {d.HV, d.K, d.V}), 0, 0, out});
    return;
  }
  ArgCheck("la_cp_bwd_summary").workspace(a.workspace, ctx, la_cp_bwd_summary_workspace_size(a), "la_cp_bwd_summary_workspace_size");
  Carver ar(a.workspace, ctx.device);
  const BwdWork ws = carve_bwd(ar, d, a.w.defined());
  if (d.kda) {
    kda_recompute_w_u_fwd(ctx, {a.q, a.k, a.v, a.beta, a.A, a.g_cumsum, ws.w, ws.u, ws.kg, ws.qg, none, none});
    // dv = (M>= . Aqk)^T dO; dAqk (which would read Vnew) is not used: dout stands in for Vnew.
    chunk_kda_bwd_dAv(ctx, {a.Aqk, a.dout, a.dout, ws.dAqk, ws.dvl, none, none, a.scale});
    chunk_gated_delta_rule_bwd_dhu(ctx, {ws.qg, ws.kg, ws.w, a.dout, ws.dvl, none, a.g_cumsum, a.dht, ws.dh,
                                         a.dh0, ws.dv2, none, none, a.scale, d.BT});
    return;
  }
  const TensorView w = a.w.defined() ? a.w : ws.w;
  if (!a.w.defined()) recompute_w_u_fwd(ctx, {a.k, a.v, a.beta, a.A, a.g_cumsum, ws.w, ws.u, none, none});
  chunk_bwd_dv_local(ctx, {a.q, a.k, a.dout, a.g_cumsum, ws.dvl, none, none, a.scale, d.BT});
  chunk_gated_delta_rule_bwd_dhu(ctx, {a.q, a.k, w, a.dout, ws.dvl, a.g_cumsum, none, a.dht, ws.dh, a.dh0,
                                       ws.dv2, none, none, a.scale, d.BT});
}

void la_cp_fold_fwd(const Context& ctx, const LaCpFoldFwdArgs& a) {
  ArgCheck c("la_cp_fold_fwd");
  const la_cp::Dims d = check_fold(c, ctx, a.summaries, a.state, "state", a.lo, a.hi);
  if (a.h0.defined()) {
    c.floating(a.h0, "h0").on_device(a.h0, "h0", ctx).shape(a.h0, "h0", {d.HV, d.K, d.V}).contiguous(a.h0, "h0");
  }
  if (a.state.numel() == 0) return;
  dispatch("la_cp_fold", Direction::kForward, ctx, a.summaries.dtype(), a);
}

void la_cp_fold_bwd(const Context& ctx, const LaCpFoldBwdArgs& a) {
  ArgCheck c("la_cp_fold_bwd");
  const la_cp::Dims d = check_fold(c, ctx, a.summaries, a.dstate, "dstate", a.lo, a.hi);
  c.rank(a.dh0s, "dh0s", 2).same_dtype(a.dh0s, "dh0s", a.summaries, "summaries")
      .on_device(a.dh0s, "dh0s", ctx).contiguous(a.dh0s, "dh0s")
      .shape(a.dh0s, "dh0s", {a.summaries.size(0), d.HV * d.K * d.V}, "[R, HV*K*V]");
  if (a.dstate.numel() == 0) return;
  dispatch("la_cp_fold", Direction::kBackward, ctx, a.summaries.dtype(), a);
}

void la_cp_fold_fwd_ref(const Context& ctx, const LaCpFoldFwdArgs& a) {
  la_cp_fold_fwd(with_backend(ctx, "ref"), a);
}

void la_cp_fold_bwd_ref(const Context& ctx, const LaCpFoldBwdArgs& a) {
  la_cp_fold_bwd(with_backend(ctx, "ref"), a);
}

namespace la_cp {

void fill(const Context& ctx, const FillArgs& a) {
  ArgCheck c("la_cp_fill");
  c.min_rank(a.out, "out", 2).floating(a.out, "out").on_device(a.out, "out", ctx).contiguous(a.out, "out");
  if (a.out.numel() == 0) return;
  dispatch("la_cp_fill", Direction::kForward, ctx, a.out.dtype(), a);
}

}  // namespace la_cp

}  // namespace fusedops
