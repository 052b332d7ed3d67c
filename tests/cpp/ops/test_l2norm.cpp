// l2norm: every runnable backend against a float64 oracle written here, forward (every output
// dtype) and backward, NaN-poisoned outputs, odd and empty shapes, determinism, errors.
#include <cmath>

#include "tests/common/tolerance.h"
#include "tests/cpp/ops/row_norm_harness.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "l2norm";
constexpr double kEps = 1e-6;

const std::vector<std::vector<int64_t>> kShapes = {
    {1, 1}, {1, 7}, {3, 129}, {2, 4097}, {257, 64}, {4, 3, 128}, {5}, {2048, 128}, {2, 40000},
    {0, 16}, {4, 0}};

// The plain composite x * rsqrt(sum(x*x) + eps) with intermediates rounded to `dtype` and the
// output to `out_dtype` (float64 for both gives the oracle).
void forward_math(const std::vector<double>& x, Rows s, DType dtype, DType out_dtype,
                  std::vector<double>& y, std::vector<double>& rstd) {
  const auto sum = [&](double ss) { return round_to(dtype, ss); };
  row_norm::forward(x, s, kEps, dtype, out_dtype, sum, y, rstd);
}

// dx = rstd * (dy - y * sum(dy*y)) from y (as stored), rounded to `dtype`.
std::vector<double> backward_math(const std::vector<double>& y, const std::vector<double>& dy,
                                  const std::vector<double>& rstd, Rows s, DType dtype) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  std::vector<double> dx(y.size());
  for (int64_t r = 0; r < s.rows; ++r) {
    double dot = 0;
    for (int64_t d = 0; d < s.D; ++d) dot += rd(dy[r * s.D + d] * y[r * s.D + d]);
    dot = rd(dot);
    for (int64_t d = 0; d < s.D; ++d)
      dx[r * s.D + d] = rd(rstd[r] * rd(dy[r * s.D + d] - rd(y[r * s.D + d] * dot)));
  }
  return dx;
}

TEST(L2Norm, ForwardMatchesFloat64OnEveryBackendAndOutputDtype) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kForward, b)) {
      for (DType out : kFloatDtypes) {
        if (out == DType::kFloat64 && b.id != "ref") continue;
        for (const auto& shape : kShapes) {
          SCOPED_TRACE(case_name(b.id, dtype, shape) + " -> " + dtype_name(out));
          const Rows s = rows_of(shape);
          TestTensor x(dtype, shape, b.device), y(out, shape, b.device);
          TestTensor rstd(fp32_or_f64(dtype), lead_shape(shape), b.device);
          const auto xv = x.fill_normal(31 + checked, 0.1, 2.0);
          poison(y, rstd);
          l2norm_fwd(b.ctx(), {x.view(), y.view(), rstd.view(), kEps});
          std::vector<double> y64, r64, yb, rb;
          forward_math(xv, s, DType::kFloat64, DType::kFloat64, y64, r64);
          // The base rounds like the input dtype and then the output dtype; the tolerance floor
          // comes from the coarser of the two.
          forward_math(xv, s, dtype, out, yb, rb);
          const DType coarse = floor_for(out) > floor_for(dtype) ? out : dtype;
          expect_policy("y", y.to_double(), yb, y64, coarse);
          expect_policy("rstd", rstd.to_double(), rb, r64, dtype);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(L2Norm, BackwardMatchesFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kBackward, b)) {  // dtype of x and dx
      for (DType out : {dtype, DType::kFloat32}) {  // dtype of y and dy
        for (const auto& shape : kShapes) {
          SCOPED_TRACE(case_name(b.id, dtype, shape) + " y " + dtype_name(out));
          const Rows s = rows_of(shape);
          TestTensor x(DType::kFloat64, shape);
          const auto xv = x.fill_normal(41 + checked, 0.0, 1.7);
          std::vector<double> y64, r64;
          forward_math(xv, s, DType::kFloat64, DType::kFloat64, y64, r64);
          TestTensor y(out, shape, b.device), dy(out, shape, b.device), dx(dtype, shape, b.device);
          TestTensor rstd(fp32_or_f64(dtype), lead_shape(shape), b.device);
          const auto ys = y.set(y64);  // the saved output, rounded to its dtype
          const auto rs = rstd.set(r64);
          const auto dyv = dy.fill_normal(51 + checked);
          dx.fill_nan();
          l2norm_bwd(b.ctx(), {y.view(), rstd.view(), dy.view(), dx.view()});
          // Oracle: exact gradient from the exact y; base: the formula on the stored y in dtype.
          const auto ref = backward_math(y64, dyv, r64, s, DType::kFloat64);
          const DType coarse = floor_for(out) > floor_for(dtype) ? out : dtype;
          const auto base = backward_math(ys, dyv, rs, s, coarse);
          expect_policy("dx", dx.to_double(), base, ref, coarse);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(L2Norm, RepeatedRunsAreBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    if (!backend_takes(kOp, Direction::kBackward, b.id, DType::kBFloat16)) continue;
    SCOPED_TRACE(b.id);
    const std::vector<int64_t> shape = {513, 128};
    TestTensor x(DType::kBFloat16, shape, b.device), y(DType::kBFloat16, shape, b.device);
    TestTensor rstd(DType::kFloat32, {513}, b.device), dy(DType::kBFloat16, shape, b.device);
    TestTensor dx1(DType::kBFloat16, shape, b.device), dx2(DType::kBFloat16, shape, b.device);
    x.fill_normal(3);
    dy.fill_normal(4);
    l2norm_fwd(b.ctx(), {x.view(), y.view(), rstd.view(), kEps});
    l2norm_bwd(b.ctx(), {y.view(), rstd.view(), dy.view(), dx1.view()});
    l2norm_bwd(b.ctx(), {y.view(), rstd.view(), dy.view(), dx2.view()});
    EXPECT_EQ(dx1.bytes(), dx2.bytes());
  }
}

TEST(L2Norm, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kFloat32, {4, 8}), y(DType::kFloat32, {4, 8}), rstd(DType::kFloat32, {4});
  x.fill_normal(1);
  TestTensor scalar(DType::kFloat32, {});
  expect_error([&] { l2norm_fwd(ctx, {scalar.view(), y.view(), rstd.view(), kEps}); },
               ErrorKind::kValue, "l2norm: x must have rank >= 1, got rank 0");
  TestTensor xi(DType::kInt64, {4, 8});
  expect_error([&] { l2norm_fwd(ctx, {xi.view(), y.view(), rstd.view(), kEps}); }, ErrorKind::kType,
               "x must have dtype in {float32, bfloat16, float16, float64}, got int64");
  expect_error([&] { l2norm_fwd(ctx, {x.view(), TensorView(), rstd.view(), kEps}); },
               ErrorKind::kValue, "y is required but was not given");
  TestTensor r3(DType::kFloat32, {4, 1});
  expect_error([&] { l2norm_fwd(ctx, {x.view(), y.view(), r3.view(), kEps}); }, ErrorKind::kValue,
               "rstd must have shape [4] (x's shape without its last dimension), got [4,1]");
  expect_error([&] { l2norm_fwd(ctx, {x.view(), y.view(), rstd.view(), std::nan("")}); },
               ErrorKind::kValue, "eps must be a finite number >= 0");
  TensorView x_cols = x.strided_view({4, 4}, {8, 2});
  TestTensor y44(DType::kFloat32, {4, 4});
  expect_error([&] { l2norm_fwd(ctx, {x_cols, y44.view(), rstd.view(), kEps}); }, ErrorKind::kValue,
               "x must have a contiguous last dimension (stride 1)");
  TestTensor dy16(DType::kFloat16, {4, 8}), dx(DType::kFloat32, {4, 8});
  expect_error([&] { l2norm_bwd(ctx, {y.view(), rstd.view(), dy16.view(), dx.view()}); },
               ErrorKind::kType, "dy must have the dtype of y (float32), got float16");
  expect_error([&] { l2norm_bwd(Context::cuda(0), {y.view(), rstd.view(), y.view(), dx.view()}); },
               ErrorKind::kValue, "y must be on cuda:0 (the call's device), got cpu");
}

}  // namespace
}  // namespace fusedops::testing
