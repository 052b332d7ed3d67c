// Gated delta rule sub-operators: argument checks, then dispatch to the selected backend. The top
// levels (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule) are in
// gated_delta_rule_top.cpp; the sub-operators shared with KDA in linear_attention_api.cpp.
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/linear_attention/la_check.h"

namespace fusedops {
namespace {

using la::Check;

// ---------------------------------------------------------------------------------------------

void check(const Context& ctx, const ChunkScaledDotKktArgs& a) {
  Check c("chunk_scaled_dot_kkt", ctx);
  auto ks = c.rank4(a.k, "k");
  const int64_t B = ks[0], T = ks[1], H = ks[2], K = ks[3];
  c.input(a.k, "k", ks);
  c.base().rank(a.beta, "beta", 3);
  const int64_t HV = a.beta.size(2);
  c.input(a.beta, "beta", {B, T, HV});
  c.groups(HV, H, "beta", "k");
  c.opt_input(a.g, "g", {B, T, HV});
  c.chunk_size(a.chunk_size);
  c.value(K >= 1, "K must be >= 1");
  c.output(a.A, "A", {B, T, HV, a.chunk_size});
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, B, T, a.chunk_size);
}

void check(const Context& ctx, const SolveTrilArgs& a) {
  Check c("solve_tril", ctx);
  auto s = c.rank4(a.A, "A");
  c.input(a.A, "A", s);
  c.value(s[3] == 16 || s[3] == 32 || s[3] == 64,
          "A's last dimension (the chunk size BT) must be 16, 32 or 64, got " + std::to_string(s[3]));
  c.output(a.Ai, "Ai", s);
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, s[0], s[1], s[3]);
}

struct WYDims {
  int64_t B, T, H, K, HV, V, BT;
};

WYDims check_wy_inputs(const Check& c, const TensorView& k, const TensorView& v,
                       const TensorView& beta, const TensorView& A, const TensorView& g) {
  auto ks = c.rank4(k, "k");
  c.input(k, "k", ks);
  auto vs = c.rank4(v, "v");
  WYDims d{ks[0], ks[1], ks[2], ks[3], vs[2], vs[3], 0};
  c.input(v, "v", {d.B, d.T, d.HV, d.V});
  c.groups(d.HV, d.H, "v", "k");
  c.input(beta, "beta", {d.B, d.T, d.HV});
  c.base().rank(A, "A", 4);
  d.BT = A.size(3);
  c.value(d.BT == 16 || d.BT == 32 || d.BT == 64,
          "A's last dimension (the chunk size BT) must be 16, 32 or 64, got " + std::to_string(d.BT));
  c.input(A, "A", {d.B, d.T, d.HV, d.BT});
  c.opt_input(g, "g", {d.B, d.T, d.HV});
  c.value(d.K >= 1 && d.V >= 1, "K and V must be >= 1");
  return d;
}

void check(const Context& ctx, const RecomputeWUFwdArgs& a) {
  Check c("recompute_w_u", ctx);
  const WYDims d = check_wy_inputs(c, a.k, a.v, a.beta, a.A, a.g);
  c.output(a.w, "w", {d.B, d.T, d.HV, d.K});
  c.output(a.u, "u", {d.B, d.T, d.HV, d.V});
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, d.B, d.T, d.BT);
}

void check(const Context& ctx, const PrepareWyReprBwdArgs& a) {
  Check c("prepare_wy_repr_bwd", ctx);
  const WYDims d = check_wy_inputs(c, a.k, a.v, a.beta, a.A, a.g);
  c.input(a.dw, "dw", {d.B, d.T, d.HV, d.K});
  c.input(a.du, "du", {d.B, d.T, d.HV, d.V});
  c.output(a.dk, "dk", {d.B, d.T, d.H, d.K});
  c.output(a.dv, "dv", {d.B, d.T, d.HV, d.V});
  c.output(a.dbeta, "dbeta", {d.B, d.T, d.HV});
  c.value(a.g.defined() == a.dg.defined(),
          a.g.defined() ? "dg is required when g is given" : "dg must not be given without g");
  c.opt_output(a.dg, "dg", {d.B, d.T, d.HV});
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, d.B, d.T, d.BT);
}

struct QKDims {
  int64_t B, T, H, K, HV, V;
  int64_t NT;  // second dimension of h / dh
};

QKDims check_qk(const Check& c, const TensorView& q, const TensorView& k, const TensorView& vlike,
                const char* vname, const TensorView& g, const TensorView& cu,
                const TensorView& ci, int64_t BT) {
  auto qs = c.rank4(q, "q");
  c.input(q, "q", qs);
  c.base().rank(k, "k", 4);
  c.value(k.size(2) == qs[2], "q and k must have the same number of heads, got " +
                                  std::to_string(qs[2]) + " and " + std::to_string(k.size(2)));
  c.input(k, "k", qs);
  auto vs = c.rank4(vlike, vname);
  QKDims d{qs[0], qs[1], qs[2], qs[3], vs[2], vs[3], 0};
  c.input(vlike, vname, {d.B, d.T, d.HV, d.V});
  c.groups(d.HV, d.H, vname, "q and k");
  c.value(d.K >= 1 && d.V >= 1, "K and V must be >= 1");
  c.opt_input(g, "g", {d.B, d.T, d.HV});
  c.chunk_size(BT);
  const int64_t nt = c.chunk_indices(cu, ci, d.B, d.T, BT);
  d.NT = cu.defined() ? nt : la::ceil_div(d.T, BT);
  return d;
}

void check(const Context& ctx, const ChunkFwdOArgs& a) {
  Check c("chunk_fwd_o", ctx);
  const QKDims d = check_qk(c, a.q, a.k, a.v, "v", a.g, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  c.state(a.h, "h", {a.cu_seqlens.defined() ? 1 : d.B, d.NT, d.HV, d.K, d.V});
  c.output(a.o, "o", {d.B, d.T, d.HV, d.V});
  c.value(std::isfinite(a.scale), "scale must be finite");
}


void check(const Context& ctx, const ChunkBwdDvLocalArgs& a) {
  Check c("chunk_bwd_dv_local", ctx);
  const QKDims d =
      check_qk(c, a.q, a.k, a.dout, "dout", a.g, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  c.output(a.dv, "dv", {d.B, d.T, d.HV, d.V});
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  Check c("chunk_bwd_dqkwg", ctx);
  const QKDims d = check_qk(c, a.q, a.k, a.v, "v", a.g, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  const std::vector<int64_t> snap{a.cu_seqlens.defined() ? 1 : d.B, d.NT, d.HV, d.K, d.V};
  c.input(a.dout, "dout", {d.B, d.T, d.HV, d.V});
  c.input(a.dv, "dv", {d.B, d.T, d.HV, d.V});
  c.state(a.h, "h", snap);
  c.state(a.dh, "dh", snap);
  c.opt_input(a.w, "w", {d.B, d.T, d.HV, d.K});
  c.output(a.dq, "dq", {d.B, d.T, d.H, d.K});
  c.output(a.dk, "dk", {d.B, d.T, d.H, d.K});
  c.value(a.w.defined() == a.dw.defined(),
          a.w.defined() ? "dw is required when w is given" : "dw must not be given without w");
  c.opt_output(a.dw, "dw", {d.B, d.T, d.HV, d.K});
  c.value(a.g.defined() == a.dg.defined(),
          a.g.defined() ? "dg is required when g is given" : "dg must not be given without g");
  c.opt_output(a.dg, "dg", {d.B, d.T, d.HV});
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check_gate_params(const Check& c, const TensorView& g, const TensorView& A_log,
                       const TensorView& dt_bias) {
  c.base().min_rank(g, "g", 1);
  c.base().rows_addressable(g, "g");
  c.input(g, "g", shape_vector(g));
  const int64_t HV = g.size(-1);
  c.input(A_log, "A_log", {HV});
  c.value(A_log.numel() == 0 || A_log.is_contiguous(), "A_log must be contiguous");
  c.opt_input(dt_bias, "dt_bias", {HV});
  c.value(!dt_bias.defined() || dt_bias.numel() == 0 || dt_bias.is_contiguous(),
          "dt_bias must be contiguous");
}

void check(const Context& ctx, const GdnGateFwdArgs& a) {
  Check c("gdn_gate", ctx);
  check_gate_params(c, a.g, a.A_log, a.dt_bias);
  c.output(a.y, "y", shape_vector(a.g));
}

void check(const Context& ctx, const GdnGateBwdArgs& a) {
  Check c("gdn_gate", ctx);
  check_gate_params(c, a.g, a.A_log, a.dt_bias);
  c.base().rows_addressable(a.dy, "dy");
  c.input(a.dy, "dy", shape_vector(a.g));
  c.output(a.dg, "dg", shape_vector(a.g));
  c.output(a.dA_log, "dA_log", {a.g.size(-1)});
  c.value(a.dt_bias.defined() == a.ddt_bias.defined(),
          a.dt_bias.defined() ? "ddt_bias is required when dt_bias is given"
                              : "ddt_bias must not be given without dt_bias");
  c.opt_output(a.ddt_bias, "ddt_bias", {a.g.size(-1)});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points. Zero-size calls return after the checks; the state operators still run when
// there are sequences (a length-0 sequence has ht = h0 and dh0 = dht).

void chunk_scaled_dot_kkt_fwd(const Context& ctx, const ChunkScaledDotKktArgs& a) {
  check(ctx, a);
  if (a.A.numel() == 0) return;
  dispatch("chunk_scaled_dot_kkt", Direction::kForward, ctx, a.k.dtype(), a);
}

void solve_tril(const Context& ctx, const SolveTrilArgs& a) {
  check(ctx, a);
  if (a.A.numel() == 0) return;
  dispatch("solve_tril", Direction::kForward, ctx, a.A.dtype(), a);
}

void recompute_w_u_fwd(const Context& ctx, const RecomputeWUFwdArgs& a) {
  check(ctx, a);
  if (a.beta.numel() == 0) return;
  dispatch("recompute_w_u", Direction::kForward, ctx, a.k.dtype(), a);
}

void prepare_wy_repr_bwd(const Context& ctx, const PrepareWyReprBwdArgs& a) {
  check(ctx, a);
  if (a.beta.numel() == 0) return;
  dispatch("recompute_w_u", Direction::kBackward, ctx, a.k.dtype(), a);
}

void chunk_fwd_o(const Context& ctx, const ChunkFwdOArgs& a) {
  check(ctx, a);
  if (a.o.numel() == 0) return;
  dispatch("chunk_fwd_o", Direction::kForward, ctx, a.q.dtype(), a);
}

void chunk_bwd_dv_local(const Context& ctx, const ChunkBwdDvLocalArgs& a) {
  check(ctx, a);
  if (a.dv.numel() == 0) return;
  dispatch("chunk_bwd_dv_local", Direction::kBackward, ctx, a.q.dtype(), a);
}

void chunk_bwd_dqkwg(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  check(ctx, a);
  if (a.dout.numel() == 0) return;
  dispatch("chunk_bwd_dqkwg", Direction::kBackward, ctx, a.q.dtype(), a);
}

void gdn_gate_fwd(const Context& ctx, const GdnGateFwdArgs& a) {
  check(ctx, a);
  if (a.g.numel() == 0) return;
  dispatch("gdn_gate", Direction::kForward, ctx, a.g.dtype(), a);
}

void gdn_gate_bwd(const Context& ctx, const GdnGateBwdArgs& a) {
  check(ctx, a);
  dispatch("gdn_gate", Direction::kBackward, ctx, a.g.dtype(), a);
}

void chunk_scaled_dot_kkt_fwd_ref(const Context& ctx, const ChunkScaledDotKktArgs& a) {
  chunk_scaled_dot_kkt_fwd(with_backend(ctx, "ref"), a);
}
void solve_tril_ref(const Context& ctx, const SolveTrilArgs& a) { solve_tril(with_backend(ctx, "ref"), a); }
void recompute_w_u_fwd_ref(const Context& ctx, const RecomputeWUFwdArgs& a) {
  recompute_w_u_fwd(with_backend(ctx, "ref"), a);
}
void prepare_wy_repr_bwd_ref(const Context& ctx, const PrepareWyReprBwdArgs& a) {
  prepare_wy_repr_bwd(with_backend(ctx, "ref"), a);
}
void chunk_fwd_o_ref(const Context& ctx, const ChunkFwdOArgs& a) { chunk_fwd_o(with_backend(ctx, "ref"), a); }
void chunk_bwd_dv_local_ref(const Context& ctx, const ChunkBwdDvLocalArgs& a) {
  chunk_bwd_dv_local(with_backend(ctx, "ref"), a);
}
void chunk_bwd_dqkwg_ref(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  chunk_bwd_dqkwg(with_backend(ctx, "ref"), a);
}
void gdn_gate_fwd_ref(const Context& ctx, const GdnGateFwdArgs& a) { gdn_gate_fwd(with_backend(ctx, "ref"), a); }
void gdn_gate_bwd_ref(const Context& ctx, const GdnGateBwdArgs& a) { gdn_gate_bwd(with_backend(ctx, "ref"), a); }
}  // namespace fusedops
