// Gated delta rule sub-operators: argument checks, then dispatch to the selected backend. The top
// levels (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule) are in
// gated_delta_rule_top.cpp.
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/gated_delta_rule/gdn_check.h"

namespace fusedops {
namespace {

using gdn::Check;

Context forced(const Context& ctx, const char* backend) {
  Context c = ctx;
  c.backend = backend;
  return c;
}

bool is_pow2(int64_t x) { return x >= 1 && (x & (x - 1)) == 0; }

// Second dimension of the snapshot tensors h / dh: ceil(T/BT) per batch row, or the total chunk
// count for varlen (taken from `snap` itself when the indices could not be read).
int64_t snapshot_nt(const Check& c, const TensorView& snap, const char* name, int64_t T,
                    int64_t BT, const TensorView& cu, int64_t nt_read) {
  if (!cu.defined()) return gdn::ceil_div(T, BT);
  if (nt_read >= 0) return nt_read;
  c.base().rank(snap, name, 5);
  return snap.size(1);
}

// ---------------------------------------------------------------------------------------------

void check(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  Check c("chunk_local_cumsum", ctx);
  c.base().defined(a.g, "g");
  c.value(a.g.ndim() == 3 || a.g.ndim() == 4,
          "g must have rank 3 ([B,T,H], scalar gate) or 4 ([B,T,H,S], vector gate), got rank " +
              std::to_string(a.g.ndim()) + " with shape " + a.g.shape_string());
  c.input(a.g, "g", shape_vector(a.g));
  c.value(is_pow2(a.chunk_size), "chunk_size must be a power of 2, got " + std::to_string(a.chunk_size));
  c.output(a.out, "out", shape_vector(a.g));
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, a.g.size(0), a.g.size(1), a.chunk_size);
  c.value(std::isfinite(a.scale), "scale must be finite");
}

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

void check_gates(const Check& c, const TensorView& g, const TensorView& gk, int64_t B, int64_t T,
                 int64_t HV, int64_t K) {
  c.value(!(g.defined() && gk.defined()), "give at most one of g (scalar gate) and gk (per-channel gate)");
  c.opt_input(g, "g", {B, T, HV});
  c.opt_input(gk, "gk", {B, T, HV, K});
}

void check(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  Check c("chunk_gated_delta_rule_fwd_h", ctx);
  auto ks = c.rank4(a.k, "k");
  const int64_t B = ks[0], T = ks[1], Hk = ks[2], K = ks[3];
  c.input(a.k, "k", ks);
  auto us = c.rank4(a.u, "u");
  const int64_t HV = us[2], V = us[3];
  c.input(a.u, "u", {B, T, HV, V});
  c.groups(HV, Hk, "u", "k");
  c.input(a.w, "w", {B, T, HV, K});
  c.head_dims(K, V);
  check_gates(c, a.g, a.gk, B, T, HV, K);
  c.chunk_size(a.chunk_size);
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  const int64_t NT = snapshot_nt(c, a.h, "h", T, a.chunk_size, a.cu_seqlens,
                                 c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size));
  c.output(a.h, "h", {a.cu_seqlens.defined() ? 1 : B, NT, HV, K, V});
  c.opt_input(a.h0, "h0", {N, HV, K, V});
  c.opt_output(a.v_new, "v_new", {B, T, HV, V});
  c.opt_output(a.ht, "ht", {N, HV, K, V});
}

void check(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  Check c("chunk_gated_delta_rule_bwd_dhu", ctx);
  auto ks = c.rank4(a.k, "k");
  const int64_t B = ks[0], T = ks[1], Hk = ks[2], K = ks[3];
  c.input(a.k, "k", ks);
  c.input(a.q, "q", ks);
  auto ds = c.rank4(a.dout, "dout");
  const int64_t HV = ds[2], V = ds[3];
  c.input(a.dout, "dout", {B, T, HV, V});
  c.groups(HV, Hk, "dout", "q and k");
  c.input(a.dv, "dv", {B, T, HV, V});
  c.input(a.w, "w", {B, T, HV, K});
  c.head_dims(K, V);
  check_gates(c, a.g, a.gk, B, T, HV, K);
  c.chunk_size(a.chunk_size);
  const int64_t N = c.seqlens(a.cu_seqlens, B, T);
  const int64_t NT = snapshot_nt(c, a.dh, "dh", T, a.chunk_size, a.cu_seqlens,
                                 c.chunk_offsets(a.cu_seqlens, a.chunk_offsets, B, T, a.chunk_size));
  c.output(a.dh, "dh", {a.cu_seqlens.defined() ? 1 : B, NT, HV, K, V});
  c.opt_input(a.dht, "dht", {N, HV, K, V});
  c.opt_output(a.dh0, "dh0", {N, HV, K, V});
  c.output(a.dv2, "dv2", {B, T, HV, V});
  c.value(std::isfinite(a.scale), "scale must be finite");
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
  d.NT = cu.defined() ? nt : gdn::ceil_div(d.T, BT);
  return d;
}

void check(const Context& ctx, const ChunkFwdOArgs& a) {
  Check c("chunk_fwd_o", ctx);
  const QKDims d = check_qk(c, a.q, a.k, a.v, "v", a.g, a.cu_seqlens, a.chunk_indices, a.chunk_size);
  c.input(a.h, "h", {a.cu_seqlens.defined() ? 1 : d.B, d.NT, d.HV, d.K, d.V});
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
  c.input(a.h, "h", snap);
  c.input(a.dh, "dh", snap);
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

void check(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  Check c("beta_sigmoid", ctx);
  c.base().min_rank(a.x, "x", 1);
  c.base().rows_addressable(a.x, "x");
  c.input(a.x, "x", shape_vector(a.x));
  c.output(a.y, "y", shape_vector(a.x));
}

void check(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  Check c("beta_sigmoid", ctx);
  c.base().min_rank(a.x, "x", 1);
  c.base().rows_addressable(a.x, "x");
  c.input(a.x, "x", shape_vector(a.x));
  c.base().rows_addressable(a.dy, "dy");
  c.input(a.dy, "dy", shape_vector(a.x));
  c.output(a.dx, "dx", shape_vector(a.x));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points. Zero-size calls return after the checks; the state operators still run when
// there are sequences (a length-0 sequence has ht = h0 and dh0 = dht).

void chunk_local_cumsum(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  check(ctx, a);
  if (a.g.numel() == 0) return;
  dispatch("chunk_local_cumsum", Direction::kForward, ctx, a.g.dtype(), a);
}

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

void chunk_gated_delta_rule_fwd_h(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  check(ctx, a);
  if (a.h.numel() == 0 && (!a.ht.defined() || a.ht.numel() == 0)) return;
  dispatch("chunk_gated_delta_rule_fwd_h", Direction::kForward, ctx, a.k.dtype(), a);
}

void chunk_gated_delta_rule_bwd_dhu(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  check(ctx, a);
  if (a.dh.numel() == 0 && (!a.dh0.defined() || a.dh0.numel() == 0)) return;
  dispatch("chunk_gated_delta_rule_bwd_dhu", Direction::kBackward, ctx, a.k.dtype(), a);
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

void beta_sigmoid_fwd(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  check(ctx, a);
  if (a.x.numel() == 0) return;
  dispatch("beta_sigmoid", Direction::kForward, ctx, a.x.dtype(), a);
}

void beta_sigmoid_bwd(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  check(ctx, a);
  if (a.x.numel() == 0) return;
  dispatch("beta_sigmoid", Direction::kBackward, ctx, a.x.dtype(), a);
}

void chunk_local_cumsum_ref(const Context& ctx, const ChunkLocalCumsumArgs& a) {
  chunk_local_cumsum(forced(ctx, "ref"), a);
}
void chunk_scaled_dot_kkt_fwd_ref(const Context& ctx, const ChunkScaledDotKktArgs& a) {
  chunk_scaled_dot_kkt_fwd(forced(ctx, "ref"), a);
}
void solve_tril_ref(const Context& ctx, const SolveTrilArgs& a) { solve_tril(forced(ctx, "ref"), a); }
void recompute_w_u_fwd_ref(const Context& ctx, const RecomputeWUFwdArgs& a) {
  recompute_w_u_fwd(forced(ctx, "ref"), a);
}
void prepare_wy_repr_bwd_ref(const Context& ctx, const PrepareWyReprBwdArgs& a) {
  prepare_wy_repr_bwd(forced(ctx, "ref"), a);
}
void chunk_gated_delta_rule_fwd_h_ref(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a) {
  chunk_gated_delta_rule_fwd_h(forced(ctx, "ref"), a);
}
void chunk_gated_delta_rule_bwd_dhu_ref(const Context& ctx,
                                        const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  chunk_gated_delta_rule_bwd_dhu(forced(ctx, "ref"), a);
}
void chunk_fwd_o_ref(const Context& ctx, const ChunkFwdOArgs& a) { chunk_fwd_o(forced(ctx, "ref"), a); }
void chunk_bwd_dv_local_ref(const Context& ctx, const ChunkBwdDvLocalArgs& a) {
  chunk_bwd_dv_local(forced(ctx, "ref"), a);
}
void chunk_bwd_dqkwg_ref(const Context& ctx, const ChunkBwdDqkwgArgs& a) {
  chunk_bwd_dqkwg(forced(ctx, "ref"), a);
}
void gdn_gate_fwd_ref(const Context& ctx, const GdnGateFwdArgs& a) { gdn_gate_fwd(forced(ctx, "ref"), a); }
void gdn_gate_bwd_ref(const Context& ctx, const GdnGateBwdArgs& a) { gdn_gate_bwd(forced(ctx, "ref"), a); }
void beta_sigmoid_fwd_ref(const Context& ctx, const BetaSigmoidFwdArgs& a) {
  beta_sigmoid_fwd(forced(ctx, "ref"), a);
}
void beta_sigmoid_bwd_ref(const Context& ctx, const BetaSigmoidBwdArgs& a) {
  beta_sigmoid_bwd(forced(ctx, "ref"), a);
}

}  // namespace fusedops
