#include "python/src/bind.h"

namespace fusedops::py {

void bind_l2norm(nb::module_& m) {
  m.def("l2norm_fwd",
        [](const Context& ctx, const Array& x, const Array& y, const Array& rstd, double eps) {
          l2norm_fwd(ctx, {view(x), view(y), view(rstd), eps});
        },
        nb::arg("ctx"), nb::arg("x"), nb::arg("y"), nb::arg("rstd"), nb::arg("eps"), release_gil());
  m.def("l2norm_bwd",
        [](const Context& ctx, const Array& y, const Array& rstd, const Array& dy, const Array& dx) {
          l2norm_bwd(ctx, {view(y), view(rstd), view(dy), view(dx)});
        },
        nb::arg("ctx"), nb::arg("y"), nb::arg("rstd"), nb::arg("dy"), nb::arg("dx"), release_gil());
}

}  // namespace fusedops::py
