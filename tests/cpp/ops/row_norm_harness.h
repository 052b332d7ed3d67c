// The row loop both weightless row normalisations' C++ tests (test_l2norm.cpp, test_rmsnorm.cpp)
// build their float64 oracle and their base on: y = x * rstd with rstd = 1 / sqrt(stat + eps) per
// row, stat the op's statistic of the row's sum of squares.
#pragma once

#include <cmath>
#include <vector>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing::row_norm {

// y and rstd of the rows s of x with every intermediate rounded to `dtype` and y to `out_dtype`
// (float64 for both gives the oracle). stat(ss) is the op's statistic (rounded to `dtype`) of ss,
// the row's sum of the rounded squares x*x.
template <class Stat>
void forward(const std::vector<double>& x, Rows s, double eps, DType dtype, DType out_dtype,
             Stat&& stat, std::vector<double>& y, std::vector<double>& rstd) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  y.assign(x.size(), 0);
  rstd.assign(s.rows, 0);
  for (int64_t r = 0; r < s.rows; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < s.D; ++d) ss += rd(x[r * s.D + d] * x[r * s.D + d]);
    rstd[r] = rd(1.0 / std::sqrt(rd(stat(ss) + eps)));
    for (int64_t d = 0; d < s.D; ++d)
      y[r * s.D + d] = round_to(out_dtype, rd(x[r * s.D + d] * rstd[r]));
  }
}

}  // namespace fusedops::testing::row_norm
