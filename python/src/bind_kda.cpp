#include "fusedops/ops/kda.h"
#include "python/src/bind.h"

namespace fusedops::py {

namespace {

TensorView v(const Array& a) { return view(a); }
TensorView v(const OptArray& a) { return view(a); }

}  // namespace

void bind_kda(nb::module_& m) {
  m.def("chunk_kda_fwd_intra",
        [](const Context& ctx, const Array& q, const Array& k, const Array& gk, const Array& beta,
           const Array& Aqk, const Array& Akk, const OptArray& cu, const OptArray& ci,
           double scale, int64_t chunk_size, bool safe_gate) {
          chunk_kda_fwd_intra(ctx, {v(q), v(k), v(gk), v(beta), v(Aqk), v(Akk), v(cu), v(ci), scale,
                                    chunk_size, safe_gate});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("gk"), nb::arg("beta"), nb::arg("Aqk"),
        nb::arg("Akk"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("scale"), nb::arg("chunk_size"), nb::arg("safe_gate"), release_gil());
  m.def("kda_recompute_w_u_fwd",
        [](const Context& ctx, const OptArray& q, const Array& k, const Array& vv, const Array& beta,
           const Array& Akk, const Array& gk, const Array& w, const Array& u, const Array& kg,
           const OptArray& qg, const OptArray& cu, const OptArray& ci) {
          kda_recompute_w_u_fwd(ctx, {v(q), v(k), v(vv), v(beta), v(Akk), v(gk), v(w), v(u), v(kg),
                                      v(qg), v(cu), v(ci)});
        },
        nb::arg("ctx"), nb::arg("q").none(), nb::arg("k"), nb::arg("v"), nb::arg("beta"),
        nb::arg("Akk"), nb::arg("gk"), nb::arg("w"), nb::arg("u"), nb::arg("kg"),
        nb::arg("qg").none(), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        release_gil());
  m.def("chunk_kda_fwd_o",
        [](const Context& ctx, const Array& qg, const Array& Aqk, const Array& vv, const Array& h,
           const Array& o, const OptArray& cu, const OptArray& ci, double scale) {
          chunk_kda_fwd_o(ctx, {v(qg), v(Aqk), v(vv), v(h), v(o), v(cu), v(ci), scale});
        },
        nb::arg("ctx"), nb::arg("qg"), nb::arg("Aqk"), nb::arg("v"), nb::arg("h"), nb::arg("o"),
        nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(), nb::arg("scale"),
        release_gil());
  m.def("chunk_kda_bwd_dAv",
        [](const Context& ctx, const Array& Aqk, const Array& vv, const Array& dout,
           const Array& dAqk, const Array& dv, const OptArray& cu, const OptArray& ci, double scale) {
          chunk_kda_bwd_dAv(ctx, {v(Aqk), v(vv), v(dout), v(dAqk), v(dv), v(cu), v(ci), scale});
        },
        nb::arg("ctx"), nb::arg("Aqk"), nb::arg("v"), nb::arg("dout"), nb::arg("dAqk"),
        nb::arg("dv"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("scale"), release_gil());
  m.def("chunk_kda_bwd_wy_dqkg_fused",
        [](const Context& ctx, const std::vector<OptArray>& t, double scale, int64_t chunk_size) {
          FUSEDOPS_REQUIRE(t.size() == 19, kValue, "chunk_kda_bwd_wy_dqkg_fused", "expected 19 tensors");
          ChunkKdaBwdWyDqkgArgs a;
          TensorView* f[] = {&a.q,  &a.k,  &a.v,  &a.v_new, &a.gk,    &a.beta, &a.Akk,
                             &a.h,  &a.dh, &a.dout, &a.dvn, &a.dq,   &a.dk,   &a.dv,
                             &a.dbeta, &a.dg, &a.dAkk, &a.cu_seqlens, &a.chunk_indices};
          for (size_t i = 0; i < t.size(); ++i) *f[i] = view(t[i]);
          a.scale = scale;
          a.chunk_size = chunk_size;
          chunk_kda_bwd_wy_dqkg_fused(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("scale"), nb::arg("chunk_size"), release_gil());
  m.def("chunk_kda_bwd_intra",
        [](const Context& ctx, const std::vector<OptArray>& t, int64_t chunk_size, bool safe_gate) {
          FUSEDOPS_REQUIRE(t.size() == 16, kValue, "chunk_kda_bwd_intra", "expected 16 tensors");
          ChunkKdaBwdIntraArgs a;
          TensorView* f[] = {&a.q,      &a.k,      &a.gk,        &a.beta,   &a.dAqk, &a.dAkk,
                             &a.dq,     &a.dk,     &a.dbeta,     &a.dg,     &a.dq_out,
                             &a.dk_out, &a.dbeta_out, &a.dg_out, &a.cu_seqlens, &a.chunk_indices};
          for (size_t i = 0; i < t.size(); ++i) *f[i] = view(t[i]);
          a.chunk_size = chunk_size;
          a.safe_gate = safe_gate;
          chunk_kda_bwd_intra(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("chunk_size"), nb::arg("safe_gate"),
        release_gil());
  m.def("kda_gate_fwd",
        [](const Context& ctx, const Array& g, const OptArray& A_log, const OptArray& dt_bias,
           const Array& y, bool has_lb, double lb) {
          kda_gate_fwd(ctx, {v(g), v(A_log), v(dt_bias), v(y), has_lb, lb});
        },
        nb::arg("ctx"), nb::arg("g"), nb::arg("A_log").none(), nb::arg("dt_bias").none(),
        nb::arg("y"), nb::arg("has_lower_bound"), nb::arg("lower_bound"), release_gil());
  m.def("kda_gate_bwd",
        [](const Context& ctx, const Array& g, const OptArray& A_log, const OptArray& dt_bias,
           const Array& dy, const Array& dg, const OptArray& dA_log, const OptArray& ddt_bias,
           bool has_lb, double lb) {
          kda_gate_bwd(ctx, {v(g), v(A_log), v(dt_bias), v(dy), v(dg), v(dA_log), v(ddt_bias),
                             has_lb, lb});
        },
        nb::arg("ctx"), nb::arg("g"), nb::arg("A_log").none(), nb::arg("dt_bias").none(),
        nb::arg("dy"), nb::arg("dg"), nb::arg("dA_log").none(), nb::arg("ddt_bias").none(),
        nb::arg("has_lower_bound"), nb::arg("lower_bound"), release_gil());

  // Top level: tensors as a list in the order of the Args fields below, flags as keywords.
  m.def("chunk_kda_fwd",
        [](const Context& ctx, const std::vector<OptArray>& t, double scale, int64_t chunk_size,
           bool l2, bool gate, bool sig, bool neg, bool safe, bool has_lb, double lb) {
          FUSEDOPS_REQUIRE(t.size() == 22, kValue, "chunk_kda", "expected 22 tensors");
          ChunkKdaFwdArgs a;
          TensorView* f[] = {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log,
                             &a.dt_bias, &a.cu_seqlens, &a.chunk_indices, &a.chunk_offsets, &a.o,
                             &a.final_state, &a.q_normed, &a.k_normed, &a.q_rstd, &a.k_rstd,
                             &a.g_cumsum, &a.Aqk, &a.Akk, &a.beta_sigmoid, &a.workspace};
          for (size_t i = 0; i < t.size(); ++i) *f[i] = view(t[i]);
          a.scale = scale;
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          a.allow_neg_eigval = neg;
          a.safe_gate = safe;
          a.has_lower_bound = has_lb;
          a.lower_bound = lb;
          chunk_kda_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("scale"), nb::arg("chunk_size"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("use_beta_sigmoid_in_kernel"), nb::arg("allow_neg_eigval"), nb::arg("safe_gate"),
        nb::arg("has_lower_bound"), nb::arg("lower_bound"), release_gil());
  m.def("chunk_kda_fwd_workspace_size",
        [](const Array& q, const Array& vv, const OptArray& cu, const OptArray& ci,
           int64_t chunk_size, bool gate) {
          ChunkKdaFwdArgs a;
          a.q = view(q);
          a.v = view(vv);
          a.cu_seqlens = view(cu);
          a.chunk_indices = view(ci);
          a.chunk_size = chunk_size;
          a.use_gate_in_kernel = gate;
          return chunk_kda_fwd_workspace_size(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("chunk_size"), nb::arg("use_gate_in_kernel"));
  m.def("chunk_kda_bwd",
        [](const Context& ctx, const std::vector<OptArray>& t, double scale, int64_t chunk_size,
           bool l2, bool gate, bool sig, bool neg, bool safe, bool has_lb, double lb) {
          FUSEDOPS_REQUIRE(t.size() == 30, kValue, "chunk_kda", "expected 30 tensors");
          ChunkKdaBwdArgs a;
          TensorView* f[] = {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.initial_state, &a.A_log,
                             &a.dt_bias, &a.q_normed, &a.k_normed, &a.q_rstd, &a.k_rstd,
                             &a.g_cumsum, &a.Aqk, &a.Akk, &a.beta_sigmoid, &a.cu_seqlens,
                             &a.chunk_indices, &a.chunk_offsets, &a.dout, &a.dht, &a.dq, &a.dk,
                             &a.dv, &a.dg, &a.dbeta, &a.dh0, &a.dA_log, &a.ddt_bias, &a.workspace};
          for (size_t i = 0; i < t.size(); ++i) *f[i] = view(t[i]);
          a.scale = scale;
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          a.allow_neg_eigval = neg;
          a.safe_gate = safe;
          a.has_lower_bound = has_lb;
          a.lower_bound = lb;
          chunk_kda_bwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("scale"), nb::arg("chunk_size"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("use_beta_sigmoid_in_kernel"), nb::arg("allow_neg_eigval"), nb::arg("safe_gate"),
        nb::arg("has_lower_bound"), nb::arg("lower_bound"), release_gil());
  m.def("chunk_kda_bwd_workspace_size",
        [](const Array& q, const Array& vv, const Array& dout, const OptArray& cu,
           const OptArray& ci, int64_t chunk_size, bool l2, bool gate, bool sig) {
          ChunkKdaBwdArgs a;
          a.q = view(q);
          a.v = view(vv);
          a.dout = view(dout);
          a.cu_seqlens = view(cu);
          a.chunk_indices = view(ci);
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          return chunk_kda_bwd_workspace_size(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("dout"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("chunk_size"),
        nb::arg("use_qk_l2norm_in_kernel"), nb::arg("use_gate_in_kernel"),
        nb::arg("use_beta_sigmoid_in_kernel"));

  m.def("fused_recurrent_kda_fwd",
        [](const Context& ctx, const Array& q, const Array& k, const Array& vv, const OptArray& g,
           const OptArray& beta, const OptArray& h0, const OptArray& cu, double scale,
           const Array& o, const OptArray& ht) {
          fused_recurrent_kda_fwd(ctx, {v(q), v(k), v(vv), v(g), v(beta), v(h0), v(cu), scale, v(o),
                                        v(ht)});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("scale"), nb::arg("o"), nb::arg("final_state").none(), release_gil());
  m.def("fused_recurrent_kda_bwd",
        [](const Context& ctx, const Array& q, const Array& k, const Array& vv, const OptArray& g,
           const OptArray& beta, const OptArray& h0, const OptArray& cu, double scale,
           const Array& dout, const OptArray& dht, const Array& dq, const Array& dk,
           const Array& dv, const OptArray& dg, const OptArray& dbeta, const OptArray& dh0) {
          fused_recurrent_kda_bwd(ctx, {v(q), v(k), v(vv), v(g), v(beta), v(h0), v(cu), scale,
                                        v(dout), v(dht), v(dq), v(dk), v(dv), v(dg), v(dbeta),
                                        v(dh0)});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("scale"), nb::arg("dout"), nb::arg("dht").none(), nb::arg("dq"), nb::arg("dk"),
        nb::arg("dv"), nb::arg("dg").none(), nb::arg("dbeta").none(), nb::arg("dh0").none(),
        release_gil());
}

}  // namespace fusedops::py
