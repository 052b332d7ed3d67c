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

// A DLPack array argument. Its caster hands a CPU or CUDA torch.Tensor to nanobind as the capsule
// of torch._C._to_dlpack (one C call, ~0.4 us) instead of letting nanobind call the Python method
// Tensor.__dlpack__(max_version=...) (~8 us per tensor: 40 of a small op's 160 us per call on
// the CPU). Neither form synchronises streams (nanobind passes no stream; the ops run on the
// stream the Context names). Everything else (other devices, other frameworks' arrays) takes
// nanobind's own import.
struct Tensor : nb::ndarray<> {
  Tensor() = default;
  explicit Tensor(const nb::ndarray<>& a) : nb::ndarray<>(a) {}
};
// The _to_dlpack capsule of `src` when it is a CPU or CUDA torch.Tensor (torch already imported),
// else an invalid object.
nb::object torch_tensor_capsule(nb::handle src) noexcept;

using Array = Tensor;
using OptArray = std::optional<Tensor>;

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
void bind_linear_attention(nb::module_& m);
void bind_gated_delta_rule(nb::module_& m);
void bind_kda(nb::module_& m);
void bind_context_parallel(nb::module_& m);
void bind_trace(nb::module_& m);

}  // namespace fusedops::py

namespace nanobind::detail {
template <>
struct type_caster<fusedops::py::Tensor> {
  using Base = type_caster<ndarray<>>;
  NB_TYPE_CASTER(fusedops::py::Tensor, Base::Name)
  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    const object cap = fusedops::py::torch_tensor_capsule(src);
    Base base;
    if (!base.from_python(cap.is_valid() ? handle(cap) : src, flags, cleanup)) return false;
    value = fusedops::py::Tensor(base.value);
    return true;
  }
  static handle from_cpp(const fusedops::py::Tensor& v, rv_policy policy, cleanup_list* cleanup) noexcept {
    return Base::from_cpp(v, policy, cleanup);
  }
};
}  // namespace nanobind::detail
