#include "python/src/bind.h"

namespace fusedops::py {

void bind_matmul_add(nb::module_& m) {
  m.def("matmul_add_workspace_size", &matmul_add_workspace_size, nb::arg("ctx"));
  m.def("matmul_add_fwd",
        [](const Context& ctx, const Array& grad_output, const Array& input, const Array& main_grad,
           const OptArray& workspace) {
          matmul_add_fwd(ctx, {view(grad_output), view(input), view(main_grad), view(workspace)});
        },
        nb::arg("ctx"), nb::arg("grad_output"), nb::arg("input"), nb::arg("main_grad"),
        nb::arg("workspace").none(), release_gil());
}

}  // namespace fusedops::py
