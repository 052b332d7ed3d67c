#include "fusedops/core/tensor.h"

#include "fusedops/core/error.h"

namespace fusedops {

TensorView::TensorView(void* data, DType dtype, Device device,
                       std::initializer_list<int64_t> shape)
    : data_(data), dtype_(dtype), device_(device), ndim_(static_cast<int>(shape.size())), defined_(true) {
  FUSEDOPS_REQUIRE(ndim_ <= kMaxDims, kValue, "", "TensorView supports at most ", kMaxDims,
                   " dimensions, got ", ndim_);
  int i = 0;
  for (int64_t s : shape) shape_[i++] = s;
  int64_t stride = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    strides_[d] = stride;
    stride *= shape_[d];
  }
}

TensorView::TensorView(void* data, DType dtype, Device device, int ndim, const int64_t* shape,
                       const int64_t* strides)
    : data_(data), dtype_(dtype), device_(device), ndim_(ndim), defined_(true) {
  FUSEDOPS_REQUIRE(ndim >= 0 && ndim <= kMaxDims, kValue, "", "TensorView supports at most ",
                   kMaxDims, " dimensions, got ", ndim);
  for (int d = 0; d < ndim; ++d) {
    shape_[d] = shape[d];
    strides_[d] = strides[d];
  }
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // frameworks give empty tensors arbitrary strides
  int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

int64_t TensorView::rows() const {
  int64_t n = 1;
  for (int d = 0; d + 1 < ndim_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::rows_collapsible(int64_t* row_stride) const {
  if (ndim_ == 0) return false;
  if (numel() == 0) {  // nothing is addressed: any strides will do
    if (row_stride) *row_stride = shape_[ndim_ - 1];
    return true;
  }
  if (shape_[ndim_ - 1] > 1 && strides_[ndim_ - 1] != 1) return false;
  // Walk the leading dims from the innermost out; each (non-unit) dim must step exactly
  // size*stride of the one inside it.
  int64_t stride = -1;
  int64_t expected = -1;
  for (int d = ndim_ - 2; d >= 0; --d) {
    if (shape_[d] == 1) continue;
    if (stride < 0) {
      stride = strides_[d];
      expected = stride * shape_[d];
    } else {
      if (strides_[d] != expected) return false;
      expected *= shape_[d];
    }
  }
  if (stride < 0) stride = shape_[ndim_ - 1];  // a single row
  if (row_stride) *row_stride = stride;
  return true;
}

int64_t TensorView::row_stride() const {
  int64_t s = 0;
  return rows_collapsible(&s) ? s : 0;
}

std::string shape_string(const int64_t* shape, int ndim) {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) {
    if (d) s += ",";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

std::string TensorView::shape_string() const { return fusedops::shape_string(shape_, ndim_); }

}  // namespace fusedops
