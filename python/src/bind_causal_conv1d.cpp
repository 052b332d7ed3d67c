#include "python/src/bind.h"

namespace fusedops::py {

void bind_causal_conv1d(nb::module_& m) {
  m.def("causal_conv1d_fwd",
        [](const Context& ctx, const Array& x, const Array& weight, const OptArray& bias,
           const OptArray& residual, const OptArray& initial_state, const OptArray& cu_seqlens,
           const Array& y, const OptArray& final_state, const std::string& activation) {
          CausalConv1dFwdArgs a;
          a.x = view(x);
          a.weight = view(weight);
          a.bias = view(bias);
          a.residual = view(residual);
          a.initial_state = view(initial_state);
          a.cu_seqlens = view(cu_seqlens);
          a.y = view(y);
          a.final_state = view(final_state);
          a.activation = causal_conv1d_activation(activation);
          causal_conv1d_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("residual").none(), nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(),
        nb::arg("y"), nb::arg("final_state").none(), nb::arg("activation"), release_gil());

  auto bwd_args = [](const Array& x, const Array& weight, const OptArray& bias,
                     const OptArray& initial_state, const OptArray& cu_seqlens, const Array& dy,
                     const OptArray& d_final_state, const OptArray& dx, const OptArray& dweight,
                     const OptArray& dbias, const OptArray& d_initial_state,
                     const OptArray& workspace, const std::string& activation) {
    CausalConv1dBwdArgs a;
    a.x = view(x);
    a.weight = view(weight);
    a.bias = view(bias);
    a.initial_state = view(initial_state);
    a.cu_seqlens = view(cu_seqlens);
    a.dy = view(dy);
    a.d_final_state = view(d_final_state);
    a.dx = view(dx);
    a.dweight = view(dweight);
    a.dbias = view(dbias);
    a.d_initial_state = view(d_initial_state);
    a.workspace = view(workspace);
    a.activation = causal_conv1d_activation(activation);
    return a;
  };

  m.def("causal_conv1d_bwd",
        [bwd_args](const Context& ctx, const Array& x, const Array& weight, const OptArray& bias,
                   const OptArray& initial_state, const OptArray& cu_seqlens, const Array& dy,
                   const OptArray& d_final_state, const Array& dx, const OptArray& dweight,
                   const OptArray& dbias, const OptArray& d_initial_state,
                   const OptArray& workspace, const std::string& activation) {
          causal_conv1d_bwd(ctx, bwd_args(x, weight, bias, initial_state, cu_seqlens, dy,
                                          d_final_state, dx, dweight, dbias, d_initial_state,
                                          workspace, activation));
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("initial_state").none(), nb::arg("cu_seqlens").none(), nb::arg("dy"),
        nb::arg("d_final_state").none(), nb::arg("dx"), nb::arg("dweight").none(),
        nb::arg("dbias").none(), nb::arg("d_initial_state").none(), nb::arg("workspace").none(),
        nb::arg("activation"), release_gil());

  // Bytes of device workspace causal_conv1d_bwd needs for these arguments (0 on the CPU).
  m.def("causal_conv1d_bwd_workspace_size",
        [](const Context& ctx, const Array& x, const Array& weight, const OptArray& bias,
           const OptArray& cu_seqlens, bool dweight, bool dbias) {
          CausalConv1dBwdArgs a;
          a.x = view(x);
          a.weight = view(weight);
          a.bias = view(bias);
          a.cu_seqlens = view(cu_seqlens);
          // Only definedness matters for the size: stand-ins for the gradients.
          if (dweight) a.dweight = a.weight;
          if (dbias) a.dbias = a.bias;
          return causal_conv1d_bwd_workspace_size(ctx, a);
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(),
        nb::arg("cu_seqlens").none(), nb::arg("dweight"), nb::arg("dbias"));
}

}  // namespace fusedops::py
