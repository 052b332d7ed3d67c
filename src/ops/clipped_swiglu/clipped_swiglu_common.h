// Pieces shared by the clipped_swiglu backends: the [M, K] view of x and the row count M_eff.
#pragma once

#include <algorithm>
#include <cstdint>

#include "fusedops/core/error.h"
#include "fusedops/core/tensor.h"

namespace fusedops::clipped_swiglu {

inline constexpr const char* kOp = "clipped_swiglu";

// x as [M, K]: M = prod(shape[:dim]), K = prod(shape[dim:]); each row gives K/2 outputs.
struct Rows2d {
  int64_t M = 0, K = 0, half = 0;
};

inline int wrap_dim(int dim, int rank) { return dim < 0 ? dim + rank : dim; }

inline Rows2d rows_2d(const TensorView& x, int dim) {
  const int d = wrap_dim(dim, x.ndim());
  Rows2d r;
  r.M = 1;
  for (int i = 0; i < d; ++i) r.M *= x.size(i);
  r.K = 1;
  for (int i = d; i < x.ndim(); ++i) r.K *= x.size(i);
  r.half = r.K / 2;
  return r;
}

// clamp(sum(group_index), 0, M) for a host int64 group_index (entries checked >= 0 by the API;
// the sum saturates at M, so that no entry can overflow it); M when it is undefined.
inline int64_t effective_rows_host(const TensorView& group_index, int64_t M) {
  if (!group_index.defined()) return M;
  const int64_t* g = group_index.data_as<const int64_t>();
  const int64_t n = group_index.size(0), stride = group_index.stride(0);
  int64_t total = 0;
  for (int64_t i = 0; i < n && total < M; ++i) total += std::clamp<int64_t>(g[i * stride], 0, M - total);
  return total;
}

}  // namespace fusedops::clipped_swiglu
