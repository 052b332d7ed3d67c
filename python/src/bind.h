// Shared helpers of the binding files: DLPack arrays -> TensorViews. Each operator family has
// its own bind_<family>.cpp defining bind_<family>(m); bindings.cpp calls them all.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <vector>

#include "fusedops/fusedops.h"

namespace fusedops::py {

namespace nb = nanobind;

using Array = nb::ndarray<>;
using OptArray = std::optional<nb::ndarray<>>;

DType to_dtype(nb::dlpack::dtype t);
TensorView view(const Array& a);
inline TensorView view(const OptArray& a) { return a ? view(*a) : TensorView(); }

// Releases the GIL while the op runs (arguments are converted before).
inline auto release_gil() { return nb::call_guard<nb::gil_scoped_release>(); }

void bind_rmsnorm(nb::module_& m);
void bind_l2norm(nb::module_& m);
void bind_cross_entropy(nb::module_& m);
void bind_chunk_loss(nb::module_& m);
void bind_causal_conv1d(nb::module_& m);
void bind_sort_chunks(nb::module_& m);
void bind_matmul_add(nb::module_& m);
void bind_clipped_swiglu(nb::module_& m);
void bind_rmsnorm_gated(nb::module_& m);
void bind_mhc(nb::module_& m);
void bind_gated_delta_rule(nb::module_& m);
void bind_kda(nb::module_& m);

}  // namespace fusedops::py
