#include "python/src/bind.h"

namespace fusedops::py {

void bind_rmsnorm(nb::module_& m) {
  m.def("rmsnorm_without_weight_fwd",
        [](const Context& ctx, const Array& x, const OptArray& y, const Array& rstd, double eps) {
          rmsnorm_without_weight_fwd(ctx, {view(x), view(y), view(rstd), eps});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("y").none(), nb::arg("rstd"), nb::arg("eps"), release_gil());
  m.def("rmsnorm_without_weight_bwd",
        [](const Context& ctx, const Array& x, const Array& rstd, const OptArray& dy,
           const OptArray& drstd, const Array& dx) {
          rmsnorm_without_weight_bwd(ctx, {view(x), view(rstd), view(dy), view(drstd), view(dx)});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("rstd"), nb::arg("dy").none(), nb::arg("drstd").none(),
        nb::arg("dx"), release_gil());
}

}  // namespace fusedops::py
