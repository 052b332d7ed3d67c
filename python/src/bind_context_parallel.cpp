#include "python/src/bind.h"

namespace fusedops::py {

void bind_context_parallel(nb::module_& m) {
  // The tensors of the summaries come as lists in the order of their Args fields (None for absent
  // ones); flags and scalars as keywords.
  auto fwd_args = [](const std::vector<OptArray>& t, int64_t chunk_size, bool l2, bool gate, bool sig,
                     bool neg, bool safe_gate, bool has_lb, double lb) {
    FUSEDOPS_REQUIRE(t.size() == 8, kValue, "la_cp_fwd_summary", "expected 8 tensors");
    LaCpFwdSummaryArgs a;
    TensorView* fields[] = {&a.k, &a.v, &a.g, &a.beta, &a.A_log, &a.dt_bias, &a.summary, &a.workspace};
    for (size_t i = 0; i < t.size(); ++i) *fields[i] = view(t[i]);
    a.chunk_size = chunk_size;
    a.use_qk_l2norm_in_kernel = l2;
    a.use_gate_in_kernel = gate;
    a.use_beta_sigmoid_in_kernel = sig;
    a.allow_neg_eigval = neg;
    a.safe_gate = safe_gate;
    a.has_lower_bound = has_lb;
    a.lower_bound = lb;
    return a;
  };
  m.def("la_cp_fwd_summary",
        [fwd_args](const Context& ctx, const std::vector<OptArray>& t, int64_t chunk_size, bool l2, bool gate,
                   bool sig, bool neg, bool safe_gate, bool has_lb, double lb) {
          la_cp_fwd_summary(ctx, fwd_args(t, chunk_size, l2, gate, sig, neg, safe_gate, has_lb, lb));
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("chunk_size"), nb::arg("use_qk_l2norm_in_kernel"),
        nb::arg("use_gate_in_kernel"), nb::arg("use_beta_sigmoid_in_kernel"), nb::arg("allow_neg_eigval"),
        nb::arg("safe_gate"), nb::arg("has_lower_bound"), nb::arg("lower_bound"), release_gil());
  m.def("la_cp_fwd_summary_workspace_size",
        [fwd_args](const std::vector<OptArray>& t, int64_t chunk_size, bool l2, bool gate, bool sig) {
          return la_cp_fwd_summary_workspace_size(fwd_args(t, chunk_size, l2, gate, sig, false, false, false, 0));
        },
        nb::arg("tensors"), nb::arg("chunk_size"), nb::arg("use_qk_l2norm_in_kernel"),
        nb::arg("use_gate_in_kernel"), nb::arg("use_beta_sigmoid_in_kernel"));
  auto bwd_args = [](const std::vector<OptArray>& t, double scale, int64_t chunk_size) {
    FUSEDOPS_REQUIRE(t.size() == 12, kValue, "la_cp_bwd_summary", "expected 12 tensors");
    LaCpBwdSummaryArgs a;
    TensorView* fields[] = {&a.q, &a.k, &a.v, &a.beta, &a.g_cumsum, &a.A, &a.Aqk, &a.w, &a.dout, &a.dht,
                            &a.dh0, &a.workspace};
    for (size_t i = 0; i < t.size(); ++i) *fields[i] = view(t[i]);
    a.scale = scale;
    a.chunk_size = chunk_size;
    return a;
  };
  m.def("la_cp_bwd_summary",
        [bwd_args](const Context& ctx, const std::vector<OptArray>& t, double scale, int64_t chunk_size) {
          la_cp_bwd_summary(ctx, bwd_args(t, scale, chunk_size));
        },
        nb::arg("ctx"), nb::arg("tensors"), nb::arg("scale"), nb::arg("chunk_size"), release_gil());
  m.def("la_cp_bwd_summary_workspace_size",
        [bwd_args](const std::vector<OptArray>& t, int64_t chunk_size) {
          return la_cp_bwd_summary_workspace_size(bwd_args(t, 1.0, chunk_size));
        },
        nb::arg("tensors"), nb::arg("chunk_size"));
  m.def("la_cp_fold_fwd",
        [](const Context& ctx, const Array& summaries, const OptArray& h0, int64_t lo, int64_t hi,
           const Array& state) { la_cp_fold_fwd(ctx, {view(summaries), view(h0), lo, hi, view(state)}); },
        nb::arg("ctx"), nb::arg("summaries"), nb::arg("h0").none(), nb::arg("lo"), nb::arg("hi"),
        nb::arg("state"), release_gil());
  m.def("la_cp_fold_bwd",
        [](const Context& ctx, const Array& summaries, const Array& dh0s, int64_t lo, int64_t hi,
           const Array& dstate) { la_cp_fold_bwd(ctx, {view(summaries), view(dh0s), lo, hi, view(dstate)}); },
        nb::arg("ctx"), nb::arg("summaries"), nb::arg("dh0s"), nb::arg("lo"), nb::arg("hi"), nb::arg("dstate"),
        release_gil());
}

}  // namespace fusedops::py
