// Binding helpers shared by the two linear-attention families (bind_gated_delta_rule.cpp,
// bind_kda.cpp): the top levels' tensor lists and flags, their workspace sizes, and the per-token
// forms, whose bindings differ only in the family's Args and entry points.
#pragma once

#include <nanobind/stl/tuple.h>

#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "fusedops/ops/linear_attention.h"
#include "python/src/bind.h"

namespace fusedops::py::la {

// view() in the few letters the long argument lists of the sub-operator bindings want.
inline TensorView v(const Array& a) { return view(a); }
inline TensorView v(const OptArray& a) { return view(a); }

// The flags both top levels take, in this order: scale, chunk_size, use_qk_l2norm_in_kernel,
// use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval.
using TopFlags = std::tuple<double, int64_t, bool, bool, bool, bool>;

// A top level's tensors arrive as one list (None for absent ones): the fields of
// LinearAttentionFwdArgs / LinearAttentionBwdArgs in the order of shared_fields, then the family's
// own in the order the family gives. Fills both and the flags.
void fill(LinearAttentionFwdArgs& a, const std::vector<OptArray>& t, const TopFlags& flags,
          std::initializer_list<TensorView*> family, const char* op);
void fill(LinearAttentionBwdArgs& a, const std::vector<OptArray>& t, const TopFlags& flags,
          std::initializer_list<TensorView*> family, const char* op);

// <op>_fwd_workspace_size(q, v, cu_seqlens, chunk_indices, chunk_size, use_gate_in_kernel, w) and
// <op>_bwd_workspace_size(q, v, dout, cu_seqlens, chunk_indices, chunk_size, l2, gate, sigmoid, w):
// w (given: the forward keeps W, U, h, Vnew) only for a family whose Args have it.
template <class Fwd, class Bwd>
void def_workspace_sizes(nb::module_& m, const std::string& op, int64_t (*fwd)(const Fwd&),
                         int64_t (*bwd)(const Bwd&)) {
  m.def((op + "_fwd_workspace_size").c_str(),
        [fwd, op](const Array& q, const Array& v, const OptArray& cu, const OptArray& ci, int64_t chunk_size,
                  bool gate, const OptArray& w) {
          Fwd a;
          a.q = view(q);
          a.v = view(v);
          a.cu_seqlens = view(cu);
          a.chunk_indices = view(ci);
          a.chunk_size = chunk_size;
          a.use_gate_in_kernel = gate;
          if constexpr (requires { a.w; }) a.w = view(w);
          else FUSEDOPS_REQUIRE(!w, kValue, op.c_str(), "keeps no intermediates (w must be None)");
          return fwd(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("cu_seqlens").none(), nb::arg("chunk_indices").none(),
        nb::arg("chunk_size"), nb::arg("use_gate_in_kernel"), nb::arg("w").none() = nb::none());
  m.def((op + "_bwd_workspace_size").c_str(),
        [bwd, op](const Array& q, const Array& v, const Array& dout, const OptArray& cu, const OptArray& ci,
                  int64_t chunk_size, bool l2, bool gate, bool sig, const OptArray& w) {
          Bwd a;
          a.q = view(q);
          a.v = view(v);
          a.dout = view(dout);
          a.cu_seqlens = view(cu);
          a.chunk_indices = view(ci);
          a.chunk_size = chunk_size;
          a.use_qk_l2norm_in_kernel = l2;
          a.use_gate_in_kernel = gate;
          a.use_beta_sigmoid_in_kernel = sig;
          if constexpr (requires { a.w; }) a.w = view(w);
          else FUSEDOPS_REQUIRE(!w, kValue, op.c_str(), "keeps no intermediates (w must be None)");
          return bwd(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("dout"), nb::arg("cu_seqlens").none(),
        nb::arg("chunk_indices").none(), nb::arg("chunk_size"), nb::arg("use_qk_l2norm_in_kernel"),
        nb::arg("use_gate_in_kernel"), nb::arg("use_beta_sigmoid_in_kernel"),
        nb::arg("w").none() = nb::none());
}

// <op>_fwd(ctx, q, k, v, g, beta, initial_state, cu_seqlens, scale, o, final_state), <op>_bwd
// (..., dout, dht, dq, dk, dv, dg, dbeta, dh0, workspace) and <op>_bwd_workspace_size(q, v,
// cu_seqlens) of a per-token form.
template <class Fwd, class Bwd>
void def_recurrent(nb::module_& m, const std::string& op, void (*fwd)(const Context&, const Fwd&),
                   void (*bwd)(const Context&, const Bwd&), int64_t (*ws_size)(const Bwd&)) {
  m.def((op + "_fwd").c_str(),
        [fwd](const Context& ctx, const Array& q, const Array& k, const Array& v, const OptArray& g,
              const OptArray& beta, const OptArray& h0, const OptArray& cu, double scale, const Array& o,
              const OptArray& ht) {
          fwd(ctx, {view(q), view(k), view(v), view(g), view(beta), view(h0), view(cu), scale, view(o), view(ht)});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("scale"), nb::arg("o"), nb::arg("final_state").none(), release_gil());
  m.def((op + "_bwd").c_str(),
        [bwd](const Context& ctx, const Array& q, const Array& k, const Array& v, const OptArray& g,
              const OptArray& beta, const OptArray& h0, const OptArray& cu, double scale, const Array& dout,
              const OptArray& dht, const Array& dq, const Array& dk, const Array& dv, const OptArray& dg,
              const OptArray& dbeta, const OptArray& dh0, const OptArray& ws) {
          bwd(ctx, {view(q), view(k), view(v), view(g), view(beta), view(h0), view(cu), scale, view(dout),
                    view(dht), view(dq), view(dk), view(dv), view(dg), view(dbeta), view(dh0), view(ws)});
        },
        nb::arg("ctx"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g").none(),
        nb::arg("beta").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("scale"), nb::arg("dout"), nb::arg("dht").none(), nb::arg("dq"), nb::arg("dk"),
        nb::arg("dv"), nb::arg("dg").none(), nb::arg("dbeta").none(), nb::arg("dh0").none(),
        nb::arg("workspace").none(), release_gil());
  m.def((op + "_bwd_workspace_size").c_str(),
        [ws_size](const Array& q, const Array& v, const OptArray& cu) {
          Bwd a;
          a.q = view(q);
          a.v = view(v);
          a.cu_seqlens = view(cu);
          return ws_size(a);
        },
        nb::arg("q"), nb::arg("v"), nb::arg("cu_seqlens").none());
}

}  // namespace fusedops::py::la
