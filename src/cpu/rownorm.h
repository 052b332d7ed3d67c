// The CPU engine behind the row normalisations (rmsnorm_without_weight, l2norm): one pass per
// row over the last dimension, fp32 math, threads over rows, lane-blocked reductions.
#pragma once

#include <cstdint>

#include "fusedops/core/dtype.h"

namespace fusedops::cpu {

// rstd = (sum_d x^2 * scale + eps)^(-1/2), y = x * rstd (y optional).
// scale = 1/D for RMSNorm, 1 for the L2 norm.
struct RowNormFwdParams {
  const void* x;
  DType x_dtype;
  int64_t x_row_stride;
  void* y;  // nullptr: rstd only; contiguous rows of D
  DType y_dtype;
  float* rstd;
  int64_t rows;
  int64_t D;
  float scale;
  float eps;
};

// dx = rstd*dy - coef*u with
//   kRmsFromX:  u = x, coef = rstd^3 * (sum(dy*u) + drstd) / D
//   kL2FromY:   u = y, coef = rstd * sum(dy*u)
// dy and drstd are optional (nullptr).
enum class RowNormBwdMode { kRmsFromX, kL2FromY };
struct RowNormBwdParams {
  RowNormBwdMode mode;
  const void* u;
  DType u_dtype;
  int64_t u_row_stride;
  const void* dy;  // dtype u_dtype
  int64_t dy_row_stride;
  const float* rstd;
  const float* drstd;
  void* dx;  // contiguous rows of D
  DType dx_dtype;
  int64_t rows;
  int64_t D;
};

void rownorm_fwd(const RowNormFwdParams& p);
void rownorm_bwd(const RowNormBwdParams& p);

}  // namespace fusedops::cpu
