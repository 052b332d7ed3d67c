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
  // Per-row statistics of `like` (a normalisation's rstd, its gradient): like's shape without its
  // last dimension, fp32 or fp64, on ctx.device, contiguous.
  const ArgCheck& row_stats(const TensorView& t, const char* name, const TensorView& like,
                            const char* like_name, const Context& ctx) const;
  // A normalisation's eps: a finite number >= 0.
  const ArgCheck& eps(double eps) const;
  // Offsets of packed sequences (cu_seqlens): offsets[0] == 0, non-decreasing, and the last
  // entry == total (the packed length; the message says "must end at <total_name> = <total>
  // (<total_note>)").
  const ArgCheck& offsets(const std::vector<int64_t>& offsets, const char* name, int64_t total,
                          const char* total_name, const char* total_note = nullptr) const;
  // A caller-allocated scratch buffer of at least `need` bytes, `size_fn` naming the query that
  // gives the size: nothing is required (or checked) when need is 0; otherwise it is given,
  // on ctx's device, contiguous (or empty), holds need bytes (numel * itemsize, any dtype) and its
  // data is `align`-byte aligned (the kernels' vector width or the carver's alignment).
  const ArgCheck& workspace(const TensorView& ws, const Context& ctx, int64_t need,
                            const char* size_fn, int64_t align = 1) const;

 private:
  const char* op_;
};

std::vector<int64_t> shape_vector(const TensorView& t);

// The bytes a view addresses (elements 0 .. 1 + sum((size_d - 1) * stride_d), strides >= 0), in
// host memory. On the CPU a copy; on CUDA a copy on ctx.stream followed by a synchronisation of
// the stream, so only the debug checks (debug_checks(ctx)) use it there.
std::vector<uint8_t> read_tensor_bytes(const char* op, const Context& ctx, const TensorView& t);
// The contents of a 1-D int32 / int64 tensor as int64 (any stride), read as above.
std::vector<int64_t> read_index_values(const char* op, const Context& ctx, const TensorView& t);

}  // namespace fusedops
