#include "python/src/bind.h"

namespace fusedops::py {

namespace {

GateActivation activation_of(int code) { return static_cast<GateActivation>(code); }

RmsNormGatedBwdArgs bwd_args(const Array& dy, const Array& x, const OptArray& z, const OptArray& weight,
                             const OptArray& bias, const Array& rstd, const OptArray& dresidual,
                             const Array& dx, const OptArray& dz, const OptArray& dweight,
                             const OptArray& dbias, const OptArray& dresidual_in,
                             const OptArray& workspace, int64_t group_size, bool norm_before_gate,
                             int activation) {
  RmsNormGatedBwdArgs a;
  a.dy = view(dy);
  a.x = view(x);
  a.z = view(z);
  a.weight = view(weight);
  a.bias = view(bias);
  a.rstd = view(rstd);
  a.dresidual = view(dresidual);
  a.dx = view(dx);
  a.dz = view(dz);
  a.dweight = view(dweight);
  a.dbias = view(dbias);
  a.dresidual_in = view(dresidual_in);
  a.workspace = view(workspace);
  a.group_size = group_size;
  a.norm_before_gate = norm_before_gate;
  a.activation = activation_of(activation);
  return a;
}

}  // namespace

void bind_rmsnorm_gated(nb::module_& m) {
  m.def("rmsnorm_gated_fwd",
        [](const Context& ctx, const Array& x, const OptArray& z, const OptArray& weight,
           const OptArray& bias, const OptArray& residual, const Array& y,
           const OptArray& residual_out, const Array& rstd, double eps, int64_t group_size,
           bool norm_before_gate, int activation) {
          RmsNormGatedFwdArgs a;
          a.x = view(x);
          a.z = view(z);
          a.weight = view(weight);
          a.bias = view(bias);
          a.residual = view(residual);
          a.y = view(y);
          a.residual_out = view(residual_out);
          a.rstd = view(rstd);
          a.eps = eps;
          a.group_size = group_size;
          a.norm_before_gate = norm_before_gate;
          a.activation = activation_of(activation);
          rmsnorm_gated_fwd(ctx, a);
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("z").none(), nb::arg("weight").none(),
        nb::arg("bias").none(), nb::arg("residual").none(), nb::arg("y"),
        nb::arg("residual_out").none(), nb::arg("rstd"), nb::arg("eps"), nb::arg("group_size"),
        nb::arg("norm_before_gate"), nb::arg("activation"), release_gil());
  m.def("rmsnorm_gated_bwd",
        [](const Context& ctx, const Array& dy, const Array& x, const OptArray& z,
           const OptArray& weight, const OptArray& bias, const Array& rstd,
           const OptArray& dresidual, const Array& dx, const OptArray& dz,
           const OptArray& dweight, const OptArray& dbias, const OptArray& dresidual_in,
           const OptArray& workspace, int64_t group_size, bool norm_before_gate, int activation) {
          rmsnorm_gated_bwd(ctx, bwd_args(dy, x, z, weight, bias, rstd, dresidual, dx, dz, dweight,
                                          dbias, dresidual_in, workspace, group_size,
                                          norm_before_gate, activation));
        },
        nb::arg("ctx"), nb::arg("dy"), nb::arg("x"), nb::arg("z").none(), nb::arg("weight").none(),
        nb::arg("bias").none(), nb::arg("rstd"), nb::arg("dresidual").none(), nb::arg("dx"),
        nb::arg("dz").none(), nb::arg("dweight").none(), nb::arg("dbias").none(),
        nb::arg("dresidual_in").none(), nb::arg("workspace").none(), nb::arg("group_size"),
        nb::arg("norm_before_gate"), nb::arg("activation"), release_gil());
  m.def("rmsnorm_gated_bwd_workspace_size",
        [](const Array& x, const OptArray& dweight, const OptArray& dbias) {
          RmsNormGatedBwdArgs a;
          a.x = view(x);
          a.dweight = view(dweight);
          a.dbias = view(dbias);
          return rmsnorm_gated_bwd_workspace_size(a);
        },
        nb::arg("x"), nb::arg("dweight").none(), nb::arg("dbias").none());
}

}  // namespace fusedops::py
