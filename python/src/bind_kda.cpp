#include "fusedops/ops/kda.h"
#include "python/src/bind_linear_attention.h"

namespace fusedops::py {

void bind_kda(nb::module_& m) {
  using la::v;
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

  // Top level: the shared tensors and flags as bind_linear_attention.h's fill() takes them, then
  // Aqk and Akk; the gate options as keywords.
  m.def("chunk_kda_fwd",
        [](const Context& ctx, const std::vector<OptArray>& t, const la::TopFlags& flags, bool safe, bool has_lb,
           double lb) {
          ChunkKdaFwdArgs a;
          la::fill(a, t, flags, {&a.Aqk, &a.Akk}, "chunk_kda");
          a.safe_gate = safe;
          a.has_lower_bound = has_lb;
          a.lower_bound = lb;
          chunk_kda_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("flags"), nb::arg("safe_gate"), nb::arg("has_lower_bound"),
        nb::arg("lower_bound"), release_gil());
  m.def("chunk_kda_bwd",
        [](const Context& ctx, const std::vector<OptArray>& t, const la::TopFlags& flags, bool safe, bool has_lb,
           double lb) {
          ChunkKdaBwdArgs a;
          la::fill(a, t, flags, {&a.Aqk, &a.Akk}, "chunk_kda");
          a.safe_gate = safe;
          a.has_lower_bound = has_lb;
          a.lower_bound = lb;
          chunk_kda_bwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("flags"), nb::arg("safe_gate"), nb::arg("has_lower_bound"),
        nb::arg("lower_bound"), release_gil());
  la::def_workspace_sizes(m, "chunk_kda", chunk_kda_fwd_workspace_size, chunk_kda_bwd_workspace_size);
  la::def_recurrent(m, "fused_recurrent_kda", fused_recurrent_kda_fwd, fused_recurrent_kda_bwd,
                    fused_recurrent_kda_bwd_workspace_size);
}

}  // namespace fusedops::py
