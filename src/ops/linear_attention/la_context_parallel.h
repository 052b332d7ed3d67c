// Internal pieces of the context-parallel summaries (include/fusedops/ops/context_parallel.h)
// shared by the API file and the backends.
#pragma once

#include <cstdint>

#include "fusedops/core/context.h"
#include "fusedops/core/tensor.h"

namespace fusedops::la_cp {

// la_cp_fill: out[..., i, j] = (i == j) ? diag : 0 over a contiguous tensor of rank >= 2 (any
// float dtype): the identity initial state of the M pass (diag = 1) and its zero U (diag = 0).
struct FillArgs {
  TensorView out;
  double diag = 0.0;
};
void fill(const Context& ctx, const FillArgs& args);
// The host implementation (exact in every dtype), registered for both CPU backend ids.
void fill_host(const Context& ctx, const FillArgs& args);

// Geometry of the summary payload of a [HV,K,V] state: M block then S_loc block.
struct Dims {
  int64_t HV = 0, K = 0, V = 0;
  int64_t m_size() const { return HV * K * K; }
  int64_t size() const { return HV * K * (K + V); }
};

}  // namespace fusedops::la_cp
