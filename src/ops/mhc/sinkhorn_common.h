// Constants shared by the Sinkhorn backends and the API (host and device code).
#pragma once

#include <cstdint>

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

}  // namespace fusedops::mhc
