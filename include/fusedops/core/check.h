// Argument checks for operator entry points. Every message names the op, the tensor, what was
// expected and what was given, e.g.
//   fusedops: l2norm: y must have shape [4,129] (same as x), got [4,128]
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "fusedops/core/context.h"
#include "fusedops/core/error.h"
#include "fusedops/core/tensor.h"

namespace fusedops {

class ArgCheck {
 public:
  explicit ArgCheck(const char* op) : op_(op) {}

  const char* op() const { return op_; }
  // The tensor is given (not an undefined optional).
  const ArgCheck& defined(const TensorView& t, const char* name) const;
  const ArgCheck& rank(const TensorView& t, const char* name, int ndim) const;
  const ArgCheck& min_rank(const TensorView& t, const char* name, int ndim) const;
  const ArgCheck& dtype_in(const TensorView& t, const char* name,
                           std::initializer_list<DType> allowed) const;
  const ArgCheck& floating(const TensorView& t, const char* name) const;
  const ArgCheck& same_dtype(const TensorView& t, const char* name, const TensorView& like,
                             const char* like_name) const;
  // The tensor lives on ctx.device.
  const ArgCheck& on_device(const TensorView& t, const char* name, const Context& ctx) const;
  const ArgCheck& shape(const TensorView& t, const char* name, const std::vector<int64_t>& shape,
                        const char* what = nullptr) const;
  const ArgCheck& same_shape(const TensorView& t, const char* name, const TensorView& like,
                             const char* like_name) const;
  // Shape equals like's shape without its last dimension ([..., D] -> [...]).
  const ArgCheck& leading_shape(const TensorView& t, const char* name, const TensorView& like,
                                const char* like_name) const;
  const ArgCheck& contiguous(const TensorView& t, const char* name) const;
  // Last dimension has stride 1 and the leading dimensions collapse into one row stride.
  const ArgCheck& rows_addressable(const TensorView& t, const char* name) const;
  const ArgCheck& value(bool ok, const std::string& message) const;

 private:
  const char* op_;
};

std::vector<int64_t> shape_vector(const TensorView& t);

}  // namespace fusedops
