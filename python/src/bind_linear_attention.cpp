// Bindings of the shared linear-attention sub-operators (linear_attention.h) and the helpers of
// both families' top-level bindings (bind_linear_attention.h).
#include "python/src/bind_linear_attention.h"

namespace fusedops::py {

namespace la {

namespace {

template <class Args>
void fill_flags(Args& a, const TopFlags& f) {
  std::tie(a.scale, a.chunk_size, a.use_qk_l2norm_in_kernel, a.use_gate_in_kernel, a.use_beta_sigmoid_in_kernel,
           a.allow_neg_eigval) = f;
}

void fill_list(const std::vector<OptArray>& t, std::initializer_list<TensorView*> shared,
               std::initializer_list<TensorView*> family, const char* op) {
  FUSEDOPS_REQUIRE(t.size() == shared.size() + family.size(), kValue, op, "expected ",
                   shared.size() + family.size(), " tensors, got ", t.size());
  size_t i = 0;
  for (TensorView* f : shared) *f = view(t[i++]);
  for (TensorView* f : family) *f = view(t[i++]);
}

}  // namespace

void fill(LinearAttentionFwdArgs& a, const std::vector<OptArray>& t, const TopFlags& flags,
          std::initializer_list<TensorView*> family, const char* op) {
  fill_list(t,
            {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log, &a.dt_bias, &a.cu_seqlens,
             &a.chunk_indices, &a.chunk_offsets, &a.o, &a.final_state, &a.q_normed, &a.k_normed, &a.q_rstd,
             &a.k_rstd, &a.g_cumsum, &a.beta_sigmoid, &a.workspace},
            family, op);
  fill_flags(a, flags);
}

void fill(LinearAttentionBwdArgs& a, const std::vector<OptArray>& t, const TopFlags& flags,
          std::initializer_list<TensorView*> family, const char* op) {
  fill_list(t,
            {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log, &a.dt_bias, &a.q_normed, &a.k_normed,
             &a.q_rstd, &a.k_rstd, &a.g_cumsum, &a.beta_sigmoid, &a.cu_seqlens, &a.chunk_indices, &a.chunk_offsets,
             &a.dout, &a.dht, &a.dq, &a.dk, &a.dv, &a.dg, &a.dbeta, &a.dh0, &a.dA_log, &a.ddt_bias, &a.workspace},
            family, op);
  fill_flags(a, flags);
}

}  // namespace la

void bind_linear_attention(nb::module_& m) {
  using la::v;
  m.def("chunk_local_cumsum",
        [](const Context& ctx, const Array& g, const Array& out, const OptArray& cu,
           const OptArray& ci, int64_t chunk_size, bool reverse, double scale) {
          chunk_local_cumsum(ctx, {v(g), v(out), v(cu), v(ci), chunk_size, reverse, scale});
        },
        nb::arg("ctx"), nb::arg("g"), nb::arg("out"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("chunk_size"), nb::arg("reverse"),
        nb::arg("scale"), release_gil());
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
}

}  // namespace fusedops::py
