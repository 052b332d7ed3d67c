#include "fusedops/core/check.h"

namespace fusedops {

std::vector<int64_t> shape_vector(const TensorView& t) {
  return std::vector<int64_t>(t.shape(), t.shape() + t.ndim());
}

const ArgCheck& ArgCheck::defined(const TensorView& t, const char* name) const {
  FUSEDOPS_REQUIRE(t.defined(), kValue, op_, name, " is required but was not given");
  return *this;
}

const ArgCheck& ArgCheck::rank(const TensorView& t, const char* name, int ndim) const {
  defined(t, name);
  FUSEDOPS_REQUIRE(t.ndim() == ndim, kValue, op_, name, " must have rank ", ndim, ", got rank ",
                   t.ndim(), " with shape ", t.shape_string());
  return *this;
}

const ArgCheck& ArgCheck::min_rank(const TensorView& t, const char* name, int ndim) const {
  defined(t, name);
  FUSEDOPS_REQUIRE(t.ndim() >= ndim, kValue, op_, name, " must have rank >= ", ndim,
                   ", got rank ", t.ndim(), " with shape ", t.shape_string());
  return *this;
}

const ArgCheck& ArgCheck::dtype_in(const TensorView& t, const char* name,
                                   std::initializer_list<DType> allowed) const {
  defined(t, name);
  for (DType d : allowed)
    if (t.dtype() == d) return *this;
  std::string list;
  for (DType d : allowed) list += std::string(list.empty() ? "" : ", ") + dtype_name(d);
  FUSEDOPS_FAIL(kType, op_, name, " must have dtype in {", list, "}, got ", dtype_name(t.dtype()));
}

const ArgCheck& ArgCheck::floating(const TensorView& t, const char* name) const {
  return dtype_in(t, name, {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64});
}

const ArgCheck& ArgCheck::same_dtype(const TensorView& t, const char* name, const TensorView& like,
                                     const char* like_name) const {
  defined(t, name);
  FUSEDOPS_REQUIRE(t.dtype() == like.dtype(), kType, op_, name, " must have the dtype of ",
                   like_name, " (", dtype_name(like.dtype()), "), got ", dtype_name(t.dtype()));
  return *this;
}

const ArgCheck& ArgCheck::on_device(const TensorView& t, const char* name,
                                    const Context& ctx) const {
  defined(t, name);
  FUSEDOPS_REQUIRE(t.device() == ctx.device, kValue, op_, name, " must be on ",
                   to_string(ctx.device), " (the call's device), got ", to_string(t.device()));
  return *this;
}

const ArgCheck& ArgCheck::shape(const TensorView& t, const char* name,
                                const std::vector<int64_t>& shape, const char* what) const {
  defined(t, name);
  bool ok = t.ndim() == static_cast<int>(shape.size());
  for (int d = 0; ok && d < t.ndim(); ++d) ok = t.size(d) == shape[d];
  FUSEDOPS_REQUIRE(ok, kValue, op_, name, " must have shape ",
                   shape_string(shape.data(), static_cast<int>(shape.size())),
                   what ? std::string(" (") + what + ")" : std::string(), ", got ",
                   t.shape_string());
  return *this;
}

const ArgCheck& ArgCheck::same_shape(const TensorView& t, const char* name, const TensorView& like,
                                     const char* like_name) const {
  std::string what = std::string("same as ") + like_name;
  return shape(t, name, shape_vector(like), what.c_str());
}

const ArgCheck& ArgCheck::leading_shape(const TensorView& t, const char* name,
                                        const TensorView& like, const char* like_name) const {
  std::vector<int64_t> s = shape_vector(like);
  if (!s.empty()) s.pop_back();
  std::string what = std::string(like_name) + "'s shape without its last dimension";
  return shape(t, name, s, what.c_str());
}

const ArgCheck& ArgCheck::contiguous(const TensorView& t, const char* name) const {
  defined(t, name);
  FUSEDOPS_REQUIRE(t.is_contiguous(), kValue, op_, name, " must be contiguous, got shape ",
                   t.shape_string(), " with strides ",
                   shape_string(t.strides(), t.ndim()));
  return *this;
}

const ArgCheck& ArgCheck::rows_addressable(const TensorView& t, const char* name) const {
  defined(t, name);
  FUSEDOPS_REQUIRE(t.ndim() == 0 || t.numel() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1, kValue, op_, name,
                   " must have a contiguous last dimension (stride 1), got strides ",
                   shape_string(t.strides(), t.ndim()), " for shape ", t.shape_string());
  FUSEDOPS_REQUIRE(t.rows_collapsible(nullptr), kValue, op_, name,
                   " must have leading dimensions that flatten to rows with one stride, got "
                   "strides ",
                   shape_string(t.strides(), t.ndim()), " for shape ", t.shape_string(),
                   " (make it contiguous)");
  return *this;
}

const ArgCheck& ArgCheck::value(bool ok, const std::string& message) const {
  FUSEDOPS_REQUIRE(ok, kValue, op_, message);
  return *this;
}

}  // namespace fusedops
