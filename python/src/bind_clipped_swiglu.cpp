#include "python/src/bind.h"

namespace fusedops::py {

void bind_clipped_swiglu(nb::module_& m) {
  m.def("clipped_swiglu_fwd",
        [](const Context& ctx, const Array& x, const OptArray& group_index, const Array& y, int dim,
           double alpha, double limit, double bias, bool interleaved, int clamp_mode) {
          clipped_swiglu_fwd(ctx, {view(x), view(group_index), view(y), dim, alpha, limit, bias,
                                   interleaved, clamp_mode});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("group_index").none(), nb::arg("y"), nb::arg("dim"),
        nb::arg("alpha"), nb::arg("limit"), nb::arg("bias"), nb::arg("interleaved"),
        nb::arg("clamp_mode"), release_gil());
  m.def("clipped_swiglu_bwd",
        [](const Context& ctx, const Array& dy, const Array& x, const OptArray& group_index,
           const Array& dx, int dim, double alpha, double limit, double bias, bool interleaved,
           int clamp_mode) {
          clipped_swiglu_bwd(ctx, {view(dy), view(x), view(group_index), view(dx), dim, alpha,
                                   limit, bias, interleaved, clamp_mode});
        },
        nb::arg("ctx"), nb::arg("dy"), nb::arg("x"), nb::arg("group_index").none(), nb::arg("dx"),
        nb::arg("dim"), nb::arg("alpha"), nb::arg("limit"), nb::arg("bias"), nb::arg("interleaved"),
        nb::arg("clamp_mode"), release_gil());
}

}  // namespace fusedops::py
