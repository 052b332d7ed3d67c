#include "python/src/bind.h"

namespace fusedops::py {

void bind_mhc(nb::module_& m) {
  m.def("sinkhorn_fwd",
        [](const Context& ctx, const Array& logits, const Array& out, int num_iters, double eps,
           const std::string& variant) {
          sinkhorn_fwd(ctx, {view(logits), view(out), num_iters, eps,
                             parse_sinkhorn_variant(variant, "sinkhorn")});
        },
        nb::arg("ctx"), nb::arg("logits"), nb::arg("out"), nb::arg("num_iters"), nb::arg("eps"),
        nb::arg("variant"), release_gil());
  m.def("sinkhorn_bwd",
        [](const Context& ctx, const Array& logits, const Array& dout, const Array& dlogits,
           int num_iters, double eps, const std::string& variant) {
          sinkhorn_bwd(ctx, {view(logits), view(dout), view(dlogits), num_iters, eps,
                             parse_sinkhorn_variant(variant, "sinkhorn")});
        },
        nb::arg("ctx"), nb::arg("logits"), nb::arg("dout"), nb::arg("dlogits"),
        nb::arg("num_iters"), nb::arg("eps"), nb::arg("variant"), release_gil());
  m.def("hc_split_sinkhorn_fwd",
        [](const Context& ctx, const Array& mixes, const Array& hc_scale, const Array& hc_base,
           const Array& pre, const Array& post, const Array& comb, int hc_mult, int iters,
           double eps, const std::string& variant) {
          hc_split_sinkhorn_fwd(ctx, {view(mixes), view(hc_scale), view(hc_base), view(pre),
                                      view(post), view(comb), hc_mult, iters, eps,
                                      parse_sinkhorn_variant(variant, "hc_split_sinkhorn")});
        },
        nb::arg("ctx"), nb::arg("mixes"), nb::arg("hc_scale"), nb::arg("hc_base"), nb::arg("pre"),
        nb::arg("post"), nb::arg("comb"), nb::arg("hc_mult"), nb::arg("sinkhorn_iters"),
        nb::arg("eps"), nb::arg("variant"), release_gil());
  m.def("hc_split_sinkhorn_bwd",
        [](const Context& ctx, const Array& mixes, const Array& hc_scale, const Array& hc_base,
           const OptArray& dpre, const OptArray& dpost, const OptArray& dcomb, const Array& dmixes,
           const Array& dhc_scale, const Array& dhc_base, const OptArray& workspace, int hc_mult,
           int iters, double eps, const std::string& variant) {
          HcSplitSinkhornBwdArgs a{view(mixes),     view(hc_scale), view(hc_base),
                                   view(dpre),      view(dpost),    view(dcomb),
                                   view(dmixes),    view(dhc_scale), view(dhc_base),
                                   view(workspace), hc_mult,        iters,
                                   eps,             parse_sinkhorn_variant(variant, "hc_split_sinkhorn")};
          hc_split_sinkhorn_bwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("mixes"), nb::arg("hc_scale"), nb::arg("hc_base"),
        nb::arg("dpre").none(), nb::arg("dpost").none(), nb::arg("dcomb").none(), nb::arg("dmixes"),
        nb::arg("dhc_scale"), nb::arg("dhc_base"), nb::arg("workspace").none(), nb::arg("hc_mult"),
        nb::arg("sinkhorn_iters"), nb::arg("eps"), nb::arg("variant"), release_gil());
  m.def("hc_split_sinkhorn_bwd_workspace_size",
        [](const Array& mixes, int hc_mult) {
          HcSplitSinkhornBwdArgs a;
          a.mixes = view(mixes);
          a.hc_mult = hc_mult;
          return hc_split_sinkhorn_bwd_workspace_size(a);
        },
        nb::arg("mixes"), nb::arg("hc_mult"));
  m.def("mhc_pre_bmm_fwd",
        [](const Context& ctx, const Array& h_pre, const Array& x, const Array& y) {
          mhc_pre_bmm_fwd(ctx, {view(h_pre), view(x), view(y)});
        },
        nb::arg("ctx"), nb::arg("h_pre"), nb::arg("x"), nb::arg("y"), release_gil());
  m.def("mhc_pre_bmm_bwd",
        [](const Context& ctx, const Array& h_pre, const Array& x, const Array& dy,
           const Array& dh_pre, const Array& dx) {
          mhc_pre_bmm_bwd(ctx, {view(h_pre), view(x), view(dy), view(dh_pre), view(dx)});
        },
        nb::arg("ctx"), nb::arg("h_pre"), nb::arg("x"), nb::arg("dy"), nb::arg("dh_pre"),
        nb::arg("dx"), release_gil());
  m.def("mhc_post_fwd",
        [](const Context& ctx, const Array& x, const Array& h_res, const Array& h_out,
           const Array& h_post, const Array& out) {
          mhc_post_fwd(ctx, {view(x), view(h_res), view(h_out), view(h_post), view(out)});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("h_res"), nb::arg("h_out"), nb::arg("h_post"),
        nb::arg("out"), release_gil());
  m.def("mhc_post_bwd",
        [](const Context& ctx, const Array& x, const Array& h_res, const Array& h_out,
           const Array& h_post, const Array& dy, const Array& dx, const Array& dh_res,
           const Array& dh_out, const Array& dh_post) {
          mhc_post_bwd(ctx, {view(x), view(h_res), view(h_out), view(h_post), view(dy), view(dx),
                             view(dh_res), view(dh_out), view(dh_post)});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("h_res"), nb::arg("h_out"), nb::arg("h_post"),
        nb::arg("dy"), nb::arg("dx"), nb::arg("dh_res"), nb::arg("dh_out"), nb::arg("dh_post"),
        release_gil());
}

}  // namespace fusedops::py
