// KDA sub-operators, gate and fused_recurrent_kda: argument checks, then dispatch to the selected
// backend. The top level chunk_kda is in kda_top.cpp.
#include <cmath>
#include <string>

#include "fusedops/core/registry.h"
#include "fusedops/ops/kda.h"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops {
namespace {

using la::Check;

void chunk_size_kda(const Check& c, int64_t bt) {
  c.value(bt == 16 || bt == 32 || bt == 64,
          "chunk_size must be 32 or 64 (16 for the sub-operators), got " + std::to_string(bt));
}

struct Dims {
  int64_t B, T, H, K, HV, V;
};

// q/k [B,T,H,K] (q optional) and a per-value-head tensor [B,T,HV,...] that gives HV.
Dims qk_dims(const Check& c, const TensorView& q, const TensorView& k, const TensorView& hvt,
             const char* hv_name) {
  auto ks = c.rank4(k, "k");
  c.input(k, "k", ks);
  if (q.defined()) {
    c.base().rank(q, "q", 4);
    c.value(q.size(2) == ks[2], "q and k must have the same number of heads, got " +
                                    std::to_string(q.size(2)) + " and " + std::to_string(ks[2]));
    c.input(q, "q", ks);
  }
  c.base().min_rank(hvt, hv_name, 3);
  Dims d{ks[0], ks[1], ks[2], ks[3], hvt.size(2), 0};
  c.groups(d.HV, d.H, hv_name, "q and k");
  c.value(d.K >= 1, "K must be >= 1");
  return d;
}

void check(const Context& ctx, const ChunkKdaFwdIntraArgs& a) {
  Check c("chunk_kda_fwd_intra", ctx);
  c.base().defined(a.gk, "gk").defined(a.q, "q");
  const Dims d = qk_dims(c, a.q, a.k, a.gk, "gk");
  c.input(a.gk, "gk", {d.B, d.T, d.HV, d.K});
  c.input(a.beta, "beta", {d.B, d.T, d.HV});
  chunk_size_kda(c, a.chunk_size);
  c.output(a.Aqk, "Aqk", {d.B, d.T, d.HV, a.chunk_size});
  c.output(a.Akk, "Akk", {d.B, d.T, d.HV, a.chunk_size});
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, d.B, d.T, a.chunk_size);
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check(const Context& ctx, const KdaRecomputeWUFwdArgs& a) {
  Check c("kda_recompute_w_u", ctx);
  c.base().defined(a.v, "v");
  Dims d = qk_dims(c, a.q, a.k, a.v, "v");
  c.base().rank(a.v, "v", 4);
  d.V = a.v.size(3);
  c.input(a.v, "v", {d.B, d.T, d.HV, d.V});
  c.value(d.V >= 1, "V must be >= 1");
  c.input(a.beta, "beta", {d.B, d.T, d.HV});
  c.input(a.gk, "gk", {d.B, d.T, d.HV, d.K});
  c.base().rank(a.Akk, "Akk", 4);
  const int64_t BT = a.Akk.size(3);
  chunk_size_kda(c, BT);
  c.input(a.Akk, "Akk", {d.B, d.T, d.HV, BT});
  c.output(a.w, "w", {d.B, d.T, d.HV, d.K});
  c.output(a.u, "u", {d.B, d.T, d.HV, d.V});
  c.output(a.kg, "kg", {d.B, d.T, d.HV, d.K});
  c.value(a.q.defined() == a.qg.defined(),
          a.q.defined() ? "qg is required when q is given" : "qg must not be given without q");
  c.opt_output(a.qg, "qg", {d.B, d.T, d.HV, d.K});
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, d.B, d.T, BT);
}

void check(const Context& ctx, const ChunkKdaFwdOArgs& a) {
  Check c("chunk_kda_fwd_o", ctx);
  auto vs = c.rank4(a.v, "v");
  const int64_t B = vs[0], T = vs[1], HV = vs[2], V = vs[3];
  c.input(a.v, "v", vs);
  c.base().rank(a.qg, "qg", 4);
  const int64_t K = a.qg.size(3);
  c.input(a.qg, "qg", {B, T, HV, K});
  c.head_dims(K, V);
  c.base().rank(a.Aqk, "Aqk", 4);
  const int64_t BT = a.Aqk.size(3);
  chunk_size_kda(c, BT);
  c.input(a.Aqk, "Aqk", {B, T, HV, BT});
  const int64_t NT = c.snapshots(a.h, "h", T, BT, a.cu_seqlens,
                                 c.chunk_indices(a.cu_seqlens, a.chunk_indices, B, T, BT));
  c.state(a.h, "h", {a.cu_seqlens.defined() ? 1 : B, NT, HV, K, V});
  c.output(a.o, "o", {B, T, HV, V});
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check(const Context& ctx, const ChunkKdaBwdDAvArgs& a) {
  Check c("chunk_kda_bwd_dAv", ctx);
  auto vs = c.rank4(a.v, "v");
  const int64_t B = vs[0], T = vs[1], HV = vs[2];
  c.input(a.v, "v", vs);
  c.input(a.dout, "dout", vs);
  c.base().rank(a.Aqk, "Aqk", 4);
  const int64_t BT = a.Aqk.size(3);
  chunk_size_kda(c, BT);
  c.input(a.Aqk, "Aqk", {B, T, HV, BT});
  c.output(a.dAqk, "dAqk", {B, T, HV, BT});
  c.output(a.dv, "dv", vs);
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, B, T, BT);
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& a) {
  Check c("chunk_kda_bwd_wy_dqkg_fused", ctx);
  c.base().defined(a.q, "q").defined(a.v, "v");
  Dims d = qk_dims(c, a.q, a.k, a.v, "v");
  c.base().rank(a.v, "v", 4);
  d.V = a.v.size(3);
  c.head_dims(d.K, d.V);
  const std::vector<int64_t> vsh{d.B, d.T, d.HV, d.V};
  c.input(a.v, "v", vsh);
  c.input(a.v_new, "v_new", vsh);
  c.input(a.dout, "dout", vsh);
  c.input(a.dvn, "dvn", vsh);
  c.input(a.gk, "gk", {d.B, d.T, d.HV, d.K});
  c.input(a.beta, "beta", {d.B, d.T, d.HV});
  chunk_size_kda(c, a.chunk_size);
  c.input(a.Akk, "Akk", {d.B, d.T, d.HV, a.chunk_size});
  const int64_t NT = c.snapshots(a.h, "h", d.T, a.chunk_size, a.cu_seqlens,
                                 c.chunk_indices(a.cu_seqlens, a.chunk_indices, d.B, d.T, a.chunk_size));
  const std::vector<int64_t> snap{a.cu_seqlens.defined() ? 1 : d.B, NT, d.HV, d.K, d.V};
  c.state(a.h, "h", snap);
  c.state(a.dh, "dh", snap);
  c.output(a.dq, "dq", {d.B, d.T, d.H, d.K});
  c.output(a.dk, "dk", {d.B, d.T, d.H, d.K});
  c.output(a.dv, "dv", vsh);
  c.output(a.dbeta, "dbeta", {d.B, d.T, d.HV});
  c.output(a.dg, "dg", {d.B, d.T, d.HV, d.K});
  c.output(a.dAkk, "dAkk", {d.B, d.T, d.HV, a.chunk_size});
  c.value(std::isfinite(a.scale), "scale must be finite");
}

void check(const Context& ctx, const ChunkKdaBwdIntraArgs& a) {
  Check c("chunk_kda_bwd_intra", ctx);
  c.base().defined(a.q, "q").defined(a.gk, "gk");
  const Dims d = qk_dims(c, a.q, a.k, a.gk, "gk");
  const std::vector<int64_t> qsh{d.B, d.T, d.H, d.K}, gsh{d.B, d.T, d.HV, d.K}, bsh{d.B, d.T, d.HV};
  c.input(a.gk, "gk", gsh);
  c.input(a.beta, "beta", bsh);
  chunk_size_kda(c, a.chunk_size);
  c.input(a.dAqk, "dAqk", {d.B, d.T, d.HV, a.chunk_size});
  c.input(a.dAkk, "dAkk", {d.B, d.T, d.HV, a.chunk_size});
  c.input(a.dq, "dq", qsh);
  c.input(a.dk, "dk", qsh);
  c.input(a.dbeta, "dbeta", bsh);
  c.input(a.dg, "dg", gsh);
  c.output(a.dq_out, "dq_out", qsh);
  c.output(a.dk_out, "dk_out", qsh);
  c.output(a.dbeta_out, "dbeta_out", bsh);
  c.output(a.dg_out, "dg_out", gsh);
  c.chunk_indices(a.cu_seqlens, a.chunk_indices, d.B, d.T, a.chunk_size);
}

void check_gate_params(const Check& c, const TensorView& g, const TensorView& A_log,
                       const TensorView& dt_bias, bool has_lb, double lb) {
  auto gs = c.rank4(g, "g");
  c.input(g, "g", gs);
  const int64_t HV = gs[2], K = gs[3];
  c.value(has_lb || A_log.defined(), "A_log is required unless lower_bound is set");
  c.opt_input(A_log, "A_log", {HV});
  c.value(!A_log.defined() || A_log.numel() == 0 || A_log.is_contiguous(), "A_log must be contiguous");
  if (dt_bias.defined()) {
    c.base().floating(dt_bias, "dt_bias");
    c.value(dt_bias.numel() == HV * K && (dt_bias.numel() == 0 || dt_bias.is_contiguous()),
            "dt_bias must be a contiguous tensor of HV*K=" + std::to_string(HV * K) +
                " elements, got shape " + dt_bias.shape_string());
  }
  c.value(!has_lb || std::isfinite(lb), "lower_bound must be finite");
}

void check(const Context& ctx, const KdaGateFwdArgs& a) {
  Check c("kda_gate", ctx);
  check_gate_params(c, a.g, a.A_log, a.dt_bias, a.has_lower_bound, a.lower_bound);
  c.output(a.y, "y", shape_vector(a.g));
}

void check(const Context& ctx, const KdaGateBwdArgs& a) {
  Check c("kda_gate", ctx);
  check_gate_params(c, a.g, a.A_log, a.dt_bias, a.has_lower_bound, a.lower_bound);
  c.input(a.dy, "dy", shape_vector(a.g));
  c.output(a.dg, "dg", shape_vector(a.g));
  c.value(!a.dA_log.defined() || a.A_log.defined(), "dA_log must not be given without A_log");
  if (a.dA_log.defined()) c.output(a.dA_log, "dA_log", {a.g.size(2)});
  c.value(a.dt_bias.defined() == a.ddt_bias.defined(),
          a.dt_bias.defined() ? "ddt_bias is required when dt_bias is given"
                              : "ddt_bias must not be given without dt_bias");
  if (a.ddt_bias.defined()) {
    c.base().floating(a.ddt_bias, "ddt_bias");
    c.value(a.ddt_bias.numel() == a.dt_bias.numel() && (a.ddt_bias.numel() == 0 || a.ddt_bias.is_contiguous()),
            "ddt_bias must be contiguous with dt_bias's number of elements");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void chunk_kda_fwd_intra(const Context& ctx, const ChunkKdaFwdIntraArgs& a) {
  check(ctx, a);
  if (a.Aqk.numel() == 0) return;
  dispatch("chunk_kda_fwd_intra", Direction::kForward, ctx, a.k.dtype(), a);
}
void kda_recompute_w_u_fwd(const Context& ctx, const KdaRecomputeWUFwdArgs& a) {
  check(ctx, a);
  if (a.beta.numel() == 0) return;
  dispatch("kda_recompute_w_u", Direction::kForward, ctx, a.k.dtype(), a);
}
void chunk_kda_fwd_o(const Context& ctx, const ChunkKdaFwdOArgs& a) {
  check(ctx, a);
  if (a.o.numel() == 0) return;
  dispatch("chunk_kda_fwd_o", Direction::kForward, ctx, a.v.dtype(), a);
}
void chunk_kda_bwd_dAv(const Context& ctx, const ChunkKdaBwdDAvArgs& a) {
  check(ctx, a);
  if (a.dv.numel() == 0) return;
  dispatch("chunk_kda_bwd_dAv", Direction::kBackward, ctx, a.v.dtype(), a);
}
void chunk_kda_bwd_wy_dqkg_fused(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& a) {
  check(ctx, a);
  if (a.dv.numel() == 0) return;
  dispatch("chunk_kda_bwd_wy_dqkg_fused", Direction::kBackward, ctx, a.q.dtype(), a);
}
void chunk_kda_bwd_intra(const Context& ctx, const ChunkKdaBwdIntraArgs& a) {
  check(ctx, a);
  if (a.dg.numel() == 0) return;
  dispatch("chunk_kda_bwd_intra", Direction::kBackward, ctx, a.q.dtype(), a);
}
void kda_gate_fwd(const Context& ctx, const KdaGateFwdArgs& a) {
  check(ctx, a);
  if (a.g.numel() == 0) return;
  dispatch("kda_gate", Direction::kForward, ctx, a.g.dtype(), a);
}
void kda_gate_bwd(const Context& ctx, const KdaGateBwdArgs& a) {
  check(ctx, a);
  dispatch("kda_gate", Direction::kBackward, ctx, a.g.dtype(), a);
}

void fused_recurrent_kda_fwd(const Context& ctx, const FusedRecurrentKdaFwdArgs& a) {
  Check c("fused_recurrent_kda", ctx);
  if (!la::check_recurrent_fwd(c, a, la::GateForm::kPerChannel)) return;
  dispatch("fused_recurrent_kda", Direction::kForward, ctx, a.q.dtype(), a);
}

void fused_recurrent_kda_bwd(const Context& ctx, const FusedRecurrentKdaBwdArgs& a) {
  Check c("fused_recurrent_kda", ctx);
  if (!la::check_recurrent_bwd(c, a, la::GateForm::kPerChannel, "fused_recurrent_kda_bwd_workspace_size")) return;
  dispatch("fused_recurrent_kda", Direction::kBackward, ctx, a.q.dtype(), a);
}

int64_t fused_recurrent_kda_bwd_workspace_size(const FusedRecurrentKdaBwdArgs& a) {
  return la::recurrent_bwd_workspace_size(a);
}

void chunk_kda_fwd_intra_ref(const Context& ctx, const ChunkKdaFwdIntraArgs& a) {
  chunk_kda_fwd_intra(with_backend(ctx, "ref"), a);
}
void kda_recompute_w_u_fwd_ref(const Context& ctx, const KdaRecomputeWUFwdArgs& a) {
  kda_recompute_w_u_fwd(with_backend(ctx, "ref"), a);
}
void chunk_kda_fwd_o_ref(const Context& ctx, const ChunkKdaFwdOArgs& a) {
  chunk_kda_fwd_o(with_backend(ctx, "ref"), a);
}
void chunk_kda_bwd_dAv_ref(const Context& ctx, const ChunkKdaBwdDAvArgs& a) {
  chunk_kda_bwd_dAv(with_backend(ctx, "ref"), a);
}
void chunk_kda_bwd_wy_dqkg_fused_ref(const Context& ctx, const ChunkKdaBwdWyDqkgArgs& a) {
  chunk_kda_bwd_wy_dqkg_fused(with_backend(ctx, "ref"), a);
}
void chunk_kda_bwd_intra_ref(const Context& ctx, const ChunkKdaBwdIntraArgs& a) {
  chunk_kda_bwd_intra(with_backend(ctx, "ref"), a);
}
void kda_gate_fwd_ref(const Context& ctx, const KdaGateFwdArgs& a) { kda_gate_fwd(with_backend(ctx, "ref"), a); }
void kda_gate_bwd_ref(const Context& ctx, const KdaGateBwdArgs& a) { kda_gate_bwd(with_backend(ctx, "ref"), a); }
void fused_recurrent_kda_fwd_ref(const Context& ctx, const FusedRecurrentKdaFwdArgs& a) {
  fused_recurrent_kda_fwd(with_backend(ctx, "ref"), a);
}
void fused_recurrent_kda_bwd_ref(const Context& ctx, const FusedRecurrentKdaBwdArgs& a) {
  fused_recurrent_kda_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace fusedops
