// rmsnorm_without_weight: every runnable backend against a float64 oracle written here (not the
// library's ref backend), forward and backward, NaN-poisoned outputs, odd and empty shapes,
// strided rows, determinism, and the error messages.
#include <cmath>

#include "tests/common/tolerance.h"
#include "tests/cpp/ops/row_norm_harness.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "rmsnorm_without_weight";
constexpr double kEps = 1e-6;

const std::vector<std::vector<int64_t>> kShapes = {
    {1, 1}, {1, 7}, {3, 129}, {2, 4097}, {257, 64}, {5, 3, 128}, {7}, {1024, 256}, {2, 40000},
    {0, 16}, {4, 0}};

// y and rstd in float64 when dtype is kFloat64; otherwise every intermediate is rounded to dtype
// (the plain composite x * rsqrt(mean(x*x) + eps) in the input dtype).
void forward_math(const std::vector<double>& x, Rows s, DType dtype, std::vector<double>& y,
                  std::vector<double>& rstd) {
  const auto mean = [&](double ss) {
    return s.D > 0 ? round_to(dtype, ss / static_cast<double>(s.D)) : 0.0;
  };
  row_norm::forward(x, s, kEps, dtype, dtype, mean, y, rstd);
}

// dx = rstd*dy - rstd^3 * x * (sum(dy*x) + g) / D, rounded like forward_math.
std::vector<double> backward_math(const std::vector<double>& x, const std::vector<double>* dy,
                                  const std::vector<double>* drstd, Rows s, DType dtype) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  std::vector<double> y, rstd, dx(x.size());
  forward_math(x, s, dtype, y, rstd);
  for (int64_t r = 0; r < s.rows; ++r) {
    double dot = 0;
    if (dy)
      for (int64_t d = 0; d < s.D; ++d) dot += rd((*dy)[r * s.D + d] * x[r * s.D + d]);
    const double g = drstd ? (*drstd)[r] : 0.0;
    const double coef = rd(rd(rstd[r] * rstd[r] * rstd[r]) * rd(rd(dot) + g) / static_cast<double>(s.D));
    for (int64_t d = 0; d < s.D; ++d)
      dx[r * s.D + d] = rd((dy ? rd(rstd[r] * (*dy)[r * s.D + d]) : 0.0) - rd(coef * x[r * s.D + d]));
  }
  return dx;
}

TEST(RmsNormWithoutWeight, ForwardMatchesFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kForward, b)) {
      for (const auto& shape : kShapes) {
        for (bool with_y : {true, false}) {
          SCOPED_TRACE(case_name(b.id, dtype, shape) + (with_y ? " y+rstd" : " rstd only"));
          const Rows s = rows_of(shape);
          TestTensor x(dtype, shape, b.device);
          const auto xv = x.fill_normal(17 + checked, 0.3, 1.5);
          TestTensor y(dtype, shape, b.device);
          TestTensor rstd(fp32_or_f64(dtype), lead_shape(shape), b.device);
          poison(y, rstd);
          RmsNormWithoutWeightFwdArgs args{x.view(), with_y ? y.view() : TensorView(), rstd.view(), kEps};
          rmsnorm_without_weight_fwd(b.ctx(), args);

          std::vector<double> y64, r64, yb, rb;
          forward_math(xv, s, DType::kFloat64, y64, r64);
          forward_math(xv, s, dtype, yb, rb);
          expect_policy("rstd", rstd.to_double(), rb, r64, dtype);
          if (with_y) expect_policy("y", y.to_double(), yb, y64, dtype);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(RmsNormWithoutWeight, BackwardMatchesFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kBackward, b)) {
      for (const auto& shape : kShapes) {
        for (int mode = 0; mode < 3; ++mode) {  // 0: dy, 1: drstd, 2: both
          SCOPED_TRACE(case_name(b.id, dtype, shape) + " mode " + std::to_string(mode));
          const Rows s = rows_of(shape);
          const std::vector<int64_t> lead = lead_shape(shape);
          TestTensor x(dtype, shape, b.device), dy(dtype, shape, b.device), dx(dtype, shape, b.device);
          TestTensor rstd(fp32_or_f64(dtype), lead, b.device);
          TestTensor drstd(fp32_or_f64(dtype), lead, b.device);
          const auto xv = x.fill_normal(100 + checked, -0.2, 1.3);
          const auto dyv = dy.fill_normal(200 + checked);
          const auto drv = drstd.fill_normal(300 + checked);
          std::vector<double> y64, r64;
          forward_math(xv, s, DType::kFloat64, y64, r64);
          rstd.set(r64);
          dx.fill_nan();
          const bool use_dy = mode != 1, use_dr = mode != 0;
          RmsNormWithoutWeightBwdArgs args{x.view(), rstd.view(), use_dy ? dy.view() : TensorView(),
                                           use_dr ? drstd.view() : TensorView(), dx.view()};
          rmsnorm_without_weight_bwd(b.ctx(), args);
          const auto ref = backward_math(xv, use_dy ? &dyv : nullptr, use_dr ? &drv : nullptr, s,
                                         DType::kFloat64);
          const auto base = backward_math(xv, use_dy ? &dyv : nullptr, use_dr ? &drv : nullptr, s, dtype);
          expect_policy("dx", dx.to_double(), base, ref, dtype);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(RmsNormWithoutWeight, StridedRowsAndRepeatedRunsAreBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      SCOPED_TRACE(b.id + "/" + dtype_name(dtype));
      const int64_t rows = 33, D = 256;
      TestTensor buf(dtype, {rows, 2 * D}, b.device);  // x = buf[:, :D]
      const auto bv = buf.fill_normal(5);
      TensorView x = buf.strided_view({rows, D}, {2 * D, 1});
      std::vector<double> xv(rows * D);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d) xv[r * D + d] = bv[r * 2 * D + d];
      TestTensor y1(dtype, {rows, D}, b.device), y2(dtype, {rows, D}, b.device);
      TestTensor r1(DType::kFloat32, {rows}, b.device), r2(DType::kFloat32, {rows}, b.device);
      rmsnorm_without_weight_fwd(b.ctx(), {x, y1.view(), r1.view(), kEps});
      rmsnorm_without_weight_fwd(b.ctx(), {x, y2.view(), r2.view(), kEps});
      EXPECT_EQ(y1.bytes(), y2.bytes());
      EXPECT_EQ(r1.bytes(), r2.bytes());
      std::vector<double> y64, r64, yb, rb;
      forward_math(xv, {rows, D}, DType::kFloat64, y64, r64);
      forward_math(xv, {rows, D}, dtype, yb, rb);
      expect_policy("y", y1.to_double(), yb, y64, dtype);

      TestTensor dy(dtype, {rows, D}, b.device), dx1(dtype, {rows, D}, b.device), dx2(dtype, {rows, D}, b.device);
      dy.fill_normal(6);
      RmsNormWithoutWeightBwdArgs args{x, r1.view(), dy.view(), TensorView(), dx1.view()};
      rmsnorm_without_weight_bwd(b.ctx(), args);
      args.dx = dx2.view();
      rmsnorm_without_weight_bwd(b.ctx(), args);
      EXPECT_EQ(dx1.bytes(), dx2.bytes());
    }
  }
}

TEST(RmsNormWithoutWeight, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kFloat32, {4, 8}), y(DType::kFloat32, {4, 8}), rstd(DType::kFloat32, {4});
  x.fill_normal(1);
  TestTensor scalar(DType::kFloat32, {});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {scalar.view(), TensorView(), rstd.view(), kEps}); },
               ErrorKind::kValue, "rmsnorm_without_weight: x must have rank >= 1, got rank 0");
  TestTensor xi(DType::kInt32, {4, 8});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {xi.view(), y.view(), rstd.view(), kEps}); },
               ErrorKind::kType, "x must have dtype in {float32, bfloat16, float16, float64}, got int32");
  TestTensor y_bad(DType::kFloat32, {4, 9});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {x.view(), y_bad.view(), rstd.view(), kEps}); },
               ErrorKind::kValue, "y must have shape [4,8] (same as x), got [4,9]");
  TestTensor y_half(DType::kFloat16, {4, 8});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {x.view(), y_half.view(), rstd.view(), kEps}); },
               ErrorKind::kType, "y must have the dtype of x (float32), got float16");
  TestTensor r_bad(DType::kFloat32, {5});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {x.view(), y.view(), r_bad.view(), kEps}); },
               ErrorKind::kValue, "rstd must have shape [4] (x's shape without its last dimension), got [5]");
  TestTensor r_half(DType::kFloat16, {4});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {x.view(), y.view(), r_half.view(), kEps}); },
               ErrorKind::kType, "rstd must have dtype in {float32, float64}, got float16");
  TensorView x_cols = x.strided_view({4, 4}, {8, 2});
  TestTensor y44(DType::kFloat32, {4, 4});
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {x_cols, y44.view(), rstd.view(), kEps}); },
               ErrorKind::kValue, "x must have a contiguous last dimension (stride 1), got strides [8,2]");
  expect_error([&] { rmsnorm_without_weight_fwd(ctx, {x.view(), y.view(), rstd.view(), -1.0}); },
               ErrorKind::kValue, "eps must be a finite number >= 0");
  expect_error([&] { rmsnorm_without_weight_fwd(Context::cuda(0), {x.view(), y.view(), rstd.view(), kEps}); },
               ErrorKind::kValue, "x must be on cuda:0 (the call's device), got cpu");
  Context forced = ctx;
  forced.backend = "nosuch";
  expect_error([&] { rmsnorm_without_weight_fwd(forced, {x.view(), y.view(), rstd.view(), kEps}); },
               ErrorKind::kValue, "backend 'nosuch' is not registered for fwd");
  TestTensor x64(DType::kFloat64, {4, 8}), y64(DType::kFloat64, {4, 8});
  forced.backend = "cpu";
  expect_error([&] { rmsnorm_without_weight_fwd(forced, {x64.view(), y64.view(), rstd.view(), kEps}); },
               ErrorKind::kRuntime, "cpu: does not take float64");
  TestTensor dx(DType::kFloat32, {4, 8}), dy_bad(DType::kFloat32, {4, 7});
  expect_error([&] {
    rmsnorm_without_weight_bwd(ctx, {x.view(), rstd.view(), dy_bad.view(), TensorView(), dx.view()});
  }, ErrorKind::kValue, "dy must have shape [4,8] (same as x), got [4,7]");
  expect_error([&] {
    rmsnorm_without_weight_bwd(ctx, {x.view(), rstd.view(), TensorView(), TensorView(), TensorView()});
  }, ErrorKind::kValue, "dx is required but was not given");
}

}  // namespace
}  // namespace fusedops::testing
