// TensorView: a non-owning view of a strided tensor (data pointer, dtype, device, shape and
// strides in elements). The caller owns the memory; fusedops never allocates on its behalf.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "fusedops/core/dtype.h"

namespace fusedops {

class TensorView {
 public:
  static constexpr int kMaxDims = 8;

  // An undefined view: stands for "no tensor" in optional arguments.
  TensorView() = default;
  // A contiguous view of the given shape.
  TensorView(void* data, DType dtype, Device device, std::initializer_list<int64_t> shape);
  // A strided view; shape and strides have ndim entries (strides in elements).
  TensorView(void* data, DType dtype, Device device, int ndim, const int64_t* shape,
             const int64_t* strides);

  bool defined() const { return defined_; }
  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  // size(i) and stride(i) accept negative i, counted from the last dimension.
  int64_t size(int i) const { return shape_[wrap(i)]; }
  int64_t stride(int i) const { return strides_[wrap(i)]; }
  const int64_t* shape() const { return shape_; }
  const int64_t* strides() const { return strides_; }
  int64_t numel() const;
  bool is_contiguous() const;
  // Product of all dimensions but the last (1 for a rank-1 tensor).
  int64_t rows() const;
  // When the leading dimensions can be addressed as one with a single stride, returns true
  // and sets *row_stride (elements between consecutive rows of the flattened [rows, last]).
  bool rows_collapsible(int64_t* row_stride) const;
  // The row stride of a rows-collapsible view (see above); 0 otherwise.
  int64_t row_stride() const;
  std::string shape_string() const;

 private:
  int wrap(int i) const { return i < 0 ? i + ndim_ : i; }

  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Device device_{};
  int ndim_ = 0;
  bool defined_ = false;
  int64_t shape_[kMaxDims] = {};
  int64_t strides_[kMaxDims] = {};
};

std::string shape_string(const int64_t* shape, int ndim);

}  // namespace fusedops
