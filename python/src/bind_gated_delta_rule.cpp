#include "fusedops/ops/gated_delta_rule.h"
#include "python/src/bind_linear_attention.h"

namespace fusedops::py {

void bind_gated_delta_rule(nb::module_& m) {
  using la::v;
  // Sub-operators (the shared ones are in bind_linear_attention.cpp).
  m.def("chunk_scaled_dot_kkt_fwd",
        [](const Context& ctx, const Array& k, const Array& beta, const OptArray& g, const Array& A,
           const OptArray& cu, const OptArray& ci, int64_t chunk_size) {
          chunk_scaled_dot_kkt_fwd(ctx, {v(k), v(beta), v(g), v(A), v(cu), v(ci), chunk_size});
        },
        nb::arg("ctx"), nb::arg("k"), nb::arg("beta"), nb::arg("g").none(), nb::arg("A"),
        nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(), nb::arg("chunk_size"),
        release_gil());
  m.def("solve_tril",
        [](const Context& ctx, const Array& A, const Array& Ai, const OptArray& cu,
           const OptArray& ci) { solve_tril(ctx, {v(A), v(Ai), v(cu), v(ci)}); },
        nb::arg("ctx"), nb::arg("A"), nb::arg("Ai"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), release_gil());
  m.def("recompute_w_u_fwd",
        [](const Context& ctx, const Array& k, const Array& vv, const Array& beta, const Array& A,
           const OptArray& g, const Array& w, const Array& u, const OptArray& cu,
           const OptArray& ci) {
          recompute_w_u_fwd(ctx, {v(k), v(vv), v(beta), v(A), v(g), v(w), v(u), v(cu), v(ci)});
        },
        nb::arg("ctx"), nb::arg("k"), nb::arg("v"), nb::arg("beta"), nb::arg("A"),
        nb::arg("g").none(), nb::arg("w"), nb::arg("u"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), release_gil());
  m.def("prepare_wy_repr_bwd",
        [](const Context& ctx, const Array& k, const Array& vv, const Array& beta, const Array& A,
           const OptArray& g, const Array& dw, const Array& du, const Array& dk, const Array& dv,
           const Array& dbeta, const OptArray& dg, const OptArray& cu, const OptArray& ci,
           bool accumulate) {
          prepare_wy_repr_bwd(ctx, {v(k), v(vv), v(beta), v(A), v(g), v(dw), v(du), v(dk), v(dv),
                                    v(dbeta), v(dg), v(cu), v(ci), accumulate});
        },
        nb::arg("ctx"), nb::arg("k"), nb::arg("v"), nb::arg("beta"), nb::arg("A"),
        nb::arg("g").none(), nb::arg("dw"), nb::arg("du"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("dbeta"), nb::arg("dg").none(), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("accumulate_dk_dg"), release_gil());
  m.def("chunk_fwd_o",
        [](const Context& ctx, const Array& q, const Array& k, const Array& vv, const Array& h,
           const OptArray& g, const Array& o, const OptArray& cu, const OptArray& ci, double scale,
           int64_t chunk_size) {
          chunk_fwd_o(ctx, {v(q), v(k), v(vv), v(h), v(g), v(o), v(cu), v(ci), scale, chunk_size});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("h"), nb::arg("g").none(),
        nb::arg("o"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("scale"), nb::arg("chunk_size"), release_gil());
  m.def("chunk_bwd_dv_local",
        [](const Context& ctx, const Array& q, const Array& k, const Array& dout, const OptArray& g,
           const Array& dv, const OptArray& cu, const OptArray& ci, double scale,
           int64_t chunk_size) {
          chunk_bwd_dv_local(ctx, {v(q), v(k), v(dout), v(g), v(dv), v(cu), v(ci), scale, chunk_size});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("dout"), nb::arg("g").none(),
        nb::arg("dv"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("scale"), nb::arg("chunk_size"), release_gil());
  m.def("chunk_bwd_dqkwg",
        [](const Context& ctx, const Array& q, const Array& k, const Array& vv, const Array& dout,
           const Array& h, const Array& dh, const OptArray& w, const Array& dv, const OptArray& g,
           const Array& dq, const Array& dk, const OptArray& dw, const OptArray& dg,
           const OptArray& cu, const OptArray& ci, double scale, int64_t chunk_size) {
          chunk_bwd_dqkwg(ctx, {v(q), v(k), v(vv), v(dout), v(h), v(dh), v(w), v(dv), v(g), v(dq),
                                v(dk), v(dw), v(dg), v(cu), v(ci), scale, chunk_size});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("dout"), nb::arg("h"),
        nb::arg("dh"), nb::arg("w").none(), nb::arg("dv"), nb::arg("g").none(), nb::arg("dq"),
        nb::arg("dk"), nb::arg("dw").none(), nb::arg("dg").none(), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("scale"), nb::arg("chunk_size"), release_gil());
  m.def("gdn_gate_fwd",
        [](const Context& ctx, const Array& g, const Array& A_log, const OptArray& dt_bias,
           const Array& y) { gdn_gate_fwd(ctx, {v(g), v(A_log), v(dt_bias), v(y)}); },
        nb::arg("ctx"), nb::arg("g"), nb::arg("A_log"), nb::arg("dt_bias").none(), nb::arg("y"),
        release_gil());
  m.def("gdn_gate_bwd",
        [](const Context& ctx, const Array& g, const Array& A_log, const OptArray& dt_bias,
           const Array& dy, const Array& dg, const Array& dA_log, const OptArray& ddt_bias) {
          gdn_gate_bwd(ctx, {v(g), v(A_log), v(dt_bias), v(dy), v(dg), v(dA_log), v(ddt_bias)});
        },
        nb::arg("ctx"), nb::arg("g"), nb::arg("A_log"), nb::arg("dt_bias").none(), nb::arg("dy"),
        nb::arg("dg"), nb::arg("dA_log"), nb::arg("ddt_bias").none(), release_gil());

  // Top level: the shared tensors and flags as bind_linear_attention.h's fill() takes them, then
  // A and the kept w, u, h, v_new (forward and backward alike).
  m.def("chunk_gated_delta_rule_fwd",
        [](const Context& ctx, const std::vector<OptArray>& t, const la::TopFlags& flags) {
          ChunkGatedDeltaRuleFwdArgs a;
          la::fill(a, t, flags, {&a.A, &a.w, &a.u, &a.h, &a.v_new}, "chunk_gated_delta_rule");
          chunk_gated_delta_rule_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("flags"), release_gil());
  m.def("chunk_gated_delta_rule_bwd",
        [](const Context& ctx, const std::vector<OptArray>& t, const la::TopFlags& flags) {
          ChunkGatedDeltaRuleBwdArgs a;
          la::fill(a, t, flags, {&a.A, &a.w, &a.u, &a.h, &a.v_new}, "chunk_gated_delta_rule");
          chunk_gated_delta_rule_bwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("flags"), release_gil());
  la::def_workspace_sizes(m, "chunk_gated_delta_rule", chunk_gated_delta_rule_fwd_workspace_size,
                          chunk_gated_delta_rule_bwd_workspace_size);
  la::def_recurrent(m, "fused_recurrent_gated_delta_rule", fused_recurrent_gated_delta_rule_fwd,
                    fused_recurrent_gated_delta_rule_bwd, fused_recurrent_gated_delta_rule_bwd_workspace_size);
}

}  // namespace fusedops::py
