#include "fusedops/core/check.h"

#include <cmath>
#include <cstring>

#ifdef FUSEDOPS_WITH_CUDA
#include "src/cuda/check.cuh"
#endif

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

const ArgCheck& ArgCheck::row_stats(const TensorView& t, const char* name, const TensorView& like,
                                    const char* like_name, const Context& ctx) const {
  return leading_shape(t, name, like, like_name)
      .dtype_in(t, name, {DType::kFloat32, DType::kFloat64})
      .on_device(t, name, ctx)
      .contiguous(t, name);
}

const ArgCheck& ArgCheck::eps(double eps) const {
  return value(std::isfinite(eps) && eps >= 0,
               "eps must be a finite number >= 0, got " + std::to_string(eps));
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

const ArgCheck& ArgCheck::offsets(const std::vector<int64_t>& offs, const char* name,
                                  int64_t total, const char* total_name,
                                  const char* total_note) const {
  if (offs.empty()) return *this;
  FUSEDOPS_REQUIRE(offs[0] == 0, kValue, op_, name, " must start at 0, got ", name, "[0] = ",
                   offs[0]);
  for (size_t i = 1; i < offs.size(); ++i)
    FUSEDOPS_REQUIRE(offs[i] >= offs[i - 1], kValue, op_, name, " must be non-decreasing, got ",
                     name, "[", i, "] = ", offs[i], " < ", name, "[", i - 1, "] = ", offs[i - 1]);
  FUSEDOPS_REQUIRE(offs.back() == total, kValue, op_, name, " must end at ", total_name, " = ",
                   total, total_note ? std::string(" (") + total_note + ")" : std::string(),
                   ", got ", name, "[", offs.size() - 1, "] = ", offs.back());
  return *this;
}

const ArgCheck& ArgCheck::workspace(const TensorView& ws, const Context& ctx, int64_t need,
                                    const char* size_fn, int64_t align) const {
  if (need <= 0) return *this;  // nothing is read or written
  defined(ws, "workspace").on_device(ws, "workspace", ctx);
  FUSEDOPS_REQUIRE(ws.numel() == 0 || ws.is_contiguous(), kValue, op_,
                   "workspace must be contiguous, got strides ", shape_string(ws.strides(), ws.ndim()),
                   " for shape ", ws.shape_string());
  const int64_t have = ws.numel() * static_cast<int64_t>(dtype_size(ws.dtype()));
  FUSEDOPS_REQUIRE(have >= need, kValue, op_, "workspace must hold at least ", need, " bytes (",
                   size_fn, "), got ", have);
  FUSEDOPS_REQUIRE(need <= 0 || align <= 1 || reinterpret_cast<uintptr_t>(ws.data()) % align == 0,
                   kValue, op_, "workspace must start on a ", align, "-byte boundary");
  return *this;
}

std::vector<uint8_t> read_tensor_bytes(const char* op, const Context& ctx, const TensorView& t) {
  // Elements 0 .. 1 + sum((size_d - 1) * stride_d) of the view: everything it addresses.
  int64_t span = t.numel() > 0 ? 1 : 0;
  for (int d = 0; d < t.ndim() && span > 0; ++d) {
    FUSEDOPS_REQUIRE(t.stride(d) >= 0, kValue, op, "tensors with negative strides are not supported");
    span += (t.size(d) - 1) * t.stride(d);
  }
  std::vector<uint8_t> out(static_cast<size_t>(span) * dtype_size(t.dtype()));
  if (out.empty()) return out;
  if (t.device().kind == DeviceKind::kCPU) {
    std::memcpy(out.data(), t.data(), out.size());
    return out;
  }
#ifdef FUSEDOPS_WITH_CUDA
  cuda::DeviceGuard guard(op, t.device().index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  FUSEDOPS_CUDA_CHECK(op, cudaMemcpyAsync(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost,
                                          stream));
  FUSEDOPS_CUDA_CHECK(op, cudaStreamSynchronize(stream));
  return out;
#else
  FUSEDOPS_FAIL(kRuntime, op, "tensor on ", to_string(t.device()), " in a build without CUDA");
#endif
}

std::vector<int64_t> read_index_values(const char* op, const Context& ctx, const TensorView& t) {
  FUSEDOPS_REQUIRE(t.ndim() == 1 && (t.dtype() == DType::kInt32 || t.dtype() == DType::kInt64),
                   kValue, op, "read_index_values takes a 1-D int32/int64 tensor");
  const int64_t n = t.numel();
  const int64_t stride = n > 1 ? t.stride(0) : 0;
  const bool i64 = t.dtype() == DType::kInt64;
  const std::vector<uint8_t> bytes = read_tensor_bytes(op, ctx, t);
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = bytes.data() + i * stride * (i64 ? 8 : 4);
    if (i64) {
      int64_t v;
      std::memcpy(&v, p, 8);
      out[i] = v;
    } else {
      int32_t v;
      std::memcpy(&v, p, 4);
      out[i] = v;
    }
  }
  return out;
}

}  // namespace fusedops
