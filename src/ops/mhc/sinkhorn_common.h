// Constants shared by the Sinkhorn backends and the API (host and device code).
#pragma once

#include <cstdint>

#include "fusedops/core/tensor.h"

namespace fusedops::mhc {

// Threads per block of the CUDA Sinkhorn kernels. A group of sinkhorn_group(n) threads owns one
// matrix, so a block holds kSinkhornBlockThreads / group matrices (rows); the parameter
// gradients of hc_split_sinkhorn are summed per block of rows (the same partition on every
// backend, so the workspace size depends only on the shape).
inline constexpr int kSinkhornBlockThreads = 128;

// Threads per matrix: the next power of two >= n, at least 4 (so 4 <= group <= 16).
inline constexpr int sinkhorn_group(int n) {
  int g = 4;
  while (g < n) g <<= 1;
  return g;
}

// Parameters of hc_split_sinkhorn that receive gradients: (a0, a1, a2) and the (2+n)n biases,
// in this order in the workspace partials.
inline constexpr int split_param_count(int n) { return 3 + (2 + n) * n; }

// Elements between consecutive tokens of a gradient of hc_split_sinkhorn's outputs: dpre / dpost
// [..., n] (trailing = 1) or dcomb [..., n, n] (trailing = 2), each token's values contiguous and
// the tokens at one stride (e.g. column slices of one [tokens, (2+n)n] gradient). 0 when t is not
// addressable that way.
inline int64_t token_stride(const TensorView& t, int trailing) {
  const int nd = t.ndim();
  if (nd < trailing || nd < 1) return 0;
  if (trailing == 1) return t.row_stride();
  const int64_t a = t.size(-2), b = t.size(-1);
  if (t.numel() == 0) return a * b;
  if ((b > 1 && t.stride(-1) != 1) || (a > 1 && t.stride(-2) != b)) return 0;
  int64_t shape[TensorView::kMaxDims], strides[TensorView::kMaxDims];
  for (int d = 0; d < nd - 2; ++d) {
    shape[d] = t.size(d);
    strides[d] = t.stride(d);
  }
  shape[nd - 2] = a * b;
  strides[nd - 2] = 1;
  return TensorView(t.data(), t.dtype(), t.device(), nd - 1, shape, strides).row_stride();
}

}  // namespace fusedops::mhc
