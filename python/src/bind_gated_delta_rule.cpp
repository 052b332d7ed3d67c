#include "python/src/bind.h"

namespace fusedops::py {

namespace {

TensorView v(const Array& a) { return view(a); }
TensorView v(const OptArray& a) { return view(a); }

}  // namespace

void bind_gated_delta_rule(nb::module_& m) {
  // Sub-operators.
  m.def("chunk_local_cumsum",
        [](const Context& ctx, const Array& g, const Array& out, const OptArray& cu,
           const OptArray& ci, int64_t chunk_size, bool reverse, double scale) {
          chunk_local_cumsum(ctx, {v(g), v(out), v(cu), v(ci), chunk_size, reverse, scale});
        },
        nb::arg("ctx"), nb::arg("g"), nb::arg("out"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("chunk_size"), nb::arg("reverse"),
        nb::arg("scale"), release_gil());
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
  m.def("chunk_gated_delta_rule_fwd_h",
        [](const Context& ctx, const Array& k, const Array& w, const Array& u, const OptArray& g,
           const OptArray& gk, const OptArray& h0, const Array& h, const OptArray& v_new,
           const OptArray& ht, const OptArray& cu, const OptArray& co, int64_t chunk_size) {
          chunk_gated_delta_rule_fwd_h(ctx, {v(k), v(w), v(u), v(g), v(gk), v(h0), v(h), v(v_new),
                                             v(ht), v(cu), v(co), chunk_size});
        },
        nb::arg("ctx"), nb::arg("k"), nb::arg("w"), nb::arg("u"), nb::arg("g").none(),
        nb::arg("gk").none(), nb::arg("h0").none(), nb::arg("h"), nb::arg("v_new").none(),
        nb::arg("ht").none(), nb::arg("cu_seqlens").none(), nb::arg("chunk_offsets").none(),
        nb::arg("chunk_size"), release_gil());
  m.def("chunk_gated_delta_rule_bwd_dhu",
        [](const Context& ctx, const Array& q, const Array& k, const Array& w, const Array& dout,
           const Array& dv, const OptArray& g, const OptArray& gk, const OptArray& dht,
           const Array& dh, const OptArray& dh0, const Array& dv2, const OptArray& cu,
           const OptArray& co, double scale, int64_t chunk_size) {
          chunk_gated_delta_rule_bwd_dhu(ctx, {v(q), v(k), v(w), v(dout), v(dv), v(g), v(gk), v(dht),
                                               v(dh), v(dh0), v(dv2), v(cu), v(co), scale, chunk_size});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("w"), nb::arg("dout"), nb::arg("dv"),
        nb::arg("g").none(), nb::arg("gk").none(), nb::arg("dht").none(), nb::arg("dh"),
        nb::arg("dh0").none(), nb::arg("dv2"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_offsets").none(), nb::arg("scale"), nb::arg("chunk_size"), release_gil());
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
  m.def("beta_sigmoid_fwd",
        [](const Context& ctx, const Array& x, const Array& y, bool neg) {
          beta_sigmoid_fwd(ctx, {v(x), v(y), neg});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("y"), nb::arg("allow_neg_eigval"), release_gil());
  m.def("beta_sigmoid_bwd",
        [](const Context& ctx, const Array& x, const Array& dy, const Array& dx, bool neg) {
          beta_sigmoid_bwd(ctx, {v(x), v(dy), v(dx), neg});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("dy"), nb::arg("dx"), nb::arg("allow_neg_eigval"),
        release_gil());

  // Top level. The tensors come as a list in the order of the Args fields below (None for
  // absent ones), the flags and scalars as keywords.
  m.def("chunk_gated_delta_rule_fwd",
        [](const Context& ctx, const std::vector<OptArray>& t, double scale, int64_t chunk_size,
           bool l2, bool gate, bool sig, bool neg) {
          FUSEDOPS_REQUIRE(t.size() == 25, kValue, "chunk_gated_delta_rule", "expected 25 tensors");
          ChunkGatedDeltaRuleFwdArgs a;
          TensorView* fields[] = {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log,
                                  &a.dt_bias, &a.cu_seqlens, &a.chunk_indices, &a.chunk_offsets,
                                  &a.o, &a.final_state, &a.q_normed, &a.k_normed, &a.q_rstd,
                                  &a.k_rstd, &a.g_cumsum, &a.A, &a.beta_sigmoid, &a.workspace,
                                  &a.w, &a.u, &a.h, &a.v_new};
          for (size_t i = 0; i < t.size(); ++i) *fields[i] = view(t[i]);
          a.scale = scale;
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          a.allow_neg_eigval = neg;
          chunk_gated_delta_rule_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("scale"), nb::arg("chunk_size"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("use_beta_sigmoid_in_kernel"), nb::arg("allow_neg_eigval"), release_gil());
  m.def("chunk_gated_delta_rule_fwd_workspace_size",
        [](const Array& q, const Array& vv, const OptArray& cu, const OptArray& ci,
           int64_t chunk_size, bool gate, const OptArray& w) {
          ChunkGatedDeltaRuleFwdArgs a;
          a.q = view(q);
          a.v = view(vv);
          a.cu_seqlens = view(cu);
          a.chunk_indices = view(ci);
          a.chunk_size = chunk_size;
          a.use_gate_in_kernel = gate;
          a.w = view(w);  // given: the caller keeps w, u, h, v_new
          return chunk_gated_delta_rule_fwd_workspace_size(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("chunk_size"), nb::arg("use_gate_in_kernel"), nb::arg("w").none() = nb::none());
  m.def("chunk_gated_delta_rule_bwd",
        [](const Context& ctx, const std::vector<OptArray>& t, double scale, int64_t chunk_size,
           bool l2, bool gate, bool sig, bool neg) {
          FUSEDOPS_REQUIRE(t.size() == 33, kValue, "chunk_gated_delta_rule", "expected 33 tensors");
          ChunkGatedDeltaRuleBwdArgs a;
          TensorView* fields[] = {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log,
                                  &a.dt_bias, &a.q_normed, &a.k_normed, &a.q_rstd, &a.k_rstd,
                                  &a.g_cumsum, &a.A, &a.beta_sigmoid, &a.cu_seqlens,
                                  &a.chunk_indices, &a.chunk_offsets, &a.dout, &a.dht, &a.dq,
                                  &a.dk, &a.dv, &a.dg, &a.dbeta, &a.dh0, &a.dA_log, &a.ddt_bias,
                                  &a.workspace, &a.w, &a.u, &a.h, &a.v_new};
          for (size_t i = 0; i < t.size(); ++i) *fields[i] = view(t[i]);
          a.scale = scale;
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          a.allow_neg_eigval = neg;
          chunk_gated_delta_rule_bwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("scale"), nb::arg("chunk_size"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("use_beta_sigmoid_in_kernel"), nb::arg("allow_neg_eigval"), release_gil());
  m.def("chunk_gated_delta_rule_bwd_workspace_size",
        [](const Array& q, const Array& vv, const Array& dout, const OptArray& cu,
           const OptArray& ci, int64_t chunk_size, bool l2, bool gate, bool sig, const OptArray& w) {
          ChunkGatedDeltaRuleBwdArgs a;
          a.q = view(q);
          a.v = view(vv);
          a.dout = view(dout);
          a.cu_seqlens = view(cu);
          a.chunk_indices = view(ci);
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          a.w = view(w);  // given: the forward kept w, u, h, v_new
          return chunk_gated_delta_rule_bwd_workspace_size(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("dout"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("chunk_size"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("use_beta_sigmoid_in_kernel"), nb::arg("w").none() = nb::none());

  m.def("fused_recurrent_gated_delta_rule_fwd",
        [](const Context& ctx, const Array& q, const Array& k, const Array& vv, const OptArray& g,
           const OptArray& beta, const OptArray& h0, const OptArray& cu, double scale,
           const Array& o, const OptArray& ht) {
          fused_recurrent_gated_delta_rule_fwd(
              ctx, {v(q), v(k), v(vv), v(g), v(beta), v(h0), v(cu), scale, v(o), v(ht)});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("scale"), nb::arg("o"), nb::arg("final_state").none(), release_gil());
  m.def("fused_recurrent_gated_delta_rule_bwd",
        [](const Context& ctx, const Array& q, const Array& k, const Array& vv, const OptArray& g,
           const OptArray& beta, const OptArray& h0, const OptArray& cu, double scale,
           const Array& dout, const OptArray& dht, const Array& dq, const Array& dk,
           const Array& dv, const OptArray& dg, const OptArray& dbeta, const OptArray& dh0) {
          fused_recurrent_gated_delta_rule_bwd(
              ctx, {v(q), v(k), v(vv), v(g), v(beta), v(h0), v(cu), scale, v(dout), v(dht), v(dq),
                    v(dk), v(dv), v(dg), v(dbeta), v(dh0)});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("scale"), nb::arg("dout"), nb::arg("dht").none(), nb::arg("dq"), nb::arg("dk"),
        nb::arg("dv"), nb::arg("dg").none(), nb::arg("dbeta").none(), nb::arg("dh0").none(),
        release_gil());
}

}  // namespace fusedops::py
