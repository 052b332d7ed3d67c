// Carving a caller-allocated workspace into sub-tensors. The operators never allocate device
// memory: each has a *_workspace_size query, the caller (the Python layer) allocates one uint8
// buffer of that size, and the operator hands out its scratch tensors from it in the same order
// the query counted them. The same code does both: with a null base the carver only counts bytes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "fusedops/core/tensor.h"

namespace fusedops {

class WorkspaceCarver {
 public:
  // Each sub-tensor starts on an `align`-byte boundary of the workspace (the workspace itself is
  // checked by ArgCheck::workspace with the same alignment where the kernels need it).
  WorkspaceCarver(char* base, Device device, int64_t align)
      : base_(base), device_(device), align_(align) {}
  WorkspaceCarver(const TensorView& workspace, Device device, int64_t align)
      : WorkspaceCarver(workspace.defined() ? static_cast<char*>(workspace.data()) : nullptr, device,
                        align) {}

  // A contiguous [shape] tensor of dtype at the cursor; the cursor moves past it.
  TensorView take(DType dtype, const std::vector<int64_t>& shape) {
    const int nd = static_cast<int>(shape.size());
    std::vector<int64_t> strides(nd);
    int64_t n = 1;
    for (int d = nd - 1; d >= 0; --d) {
      strides[d] = n;
      n *= shape[d];
    }
    TensorView t(base_ ? base_ + used_ : nullptr, dtype, device_, nd, shape.data(), strides.data());
    used_ += (n * static_cast<int64_t>(dtype_size(dtype)) + align_ - 1) / align_ * align_;
    return t;
  }
  TensorView take(DType dtype, std::initializer_list<int64_t> shape) {
    return take(dtype, std::vector<int64_t>(shape));
  }
  // Bytes handed out so far (the workspace size once every take of the call has run).
  int64_t used() const { return used_; }
  // Moves the cursor back to a mark from used(): the takes after it reuse the bytes from there.
  void seek(int64_t at) { used_ = at; }

 private:
  char* base_;
  Device device_;
  int64_t align_;
  int64_t used_ = 0;
};

}  // namespace fusedops
