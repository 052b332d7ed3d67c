// clipped_swiglu: every runnable backend against a float64 oracle written here (plain loops, not
// the library's ref backend), forward and backward, both clamp modes, interleaved and split
// halves, dim != -1, group_index row masks, values exactly at +-limit, odd and empty shapes,
// NaN-poisoned outputs, determinism and the error messages of docs/specs/ops.md section 7.5.
#include <cmath>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "clipped_swiglu";
constexpr double kAlpha = 1.702, kLimit = 7.0, kBias = 1.0;

struct Geometry {
  std::vector<int64_t> shape;
  int dim;
};

const std::vector<Geometry> kGeometries = {
    {{1, 2}, -1},    {{3, 130}, -1},   {{5, 256}, -1},     {{4, 6, 20}, 1},  {{4, 6, 20}, -2},
    {{10}, 0},       {{2, 3, 8}, 0},   {{64, 1152}, -1},   {{7, 34}, 1},     {{0, 8}, -1},
    {{3, 0}, -1},    {{129, 40}, -1}};

struct Flat {
  int64_t M, K, half;
};
Flat flat_of(const Geometry& g) {
  const int rank = static_cast<int>(g.shape.size());
  const int d = g.dim < 0 ? g.dim + rank : g.dim;
  Flat f{1, 1, 0};
  for (int i = 0; i < d; ++i) f.M *= g.shape[i];
  for (int i = d; i < rank; ++i) f.K *= g.shape[i];
  f.half = f.K / 2;
  return f;
}
std::vector<int64_t> out_shape(const Geometry& g) {
  std::vector<int64_t> s = g.shape;
  const int rank = static_cast<int>(s.size());
  s[g.dim < 0 ? g.dim + rank : g.dim] /= 2;
  return s;
}

// Random inputs wide enough to cross +-limit, with every 5th value of each half set exactly to
// +limit or -limit (the boundary of torch.clamp's closed pass-through interval).
std::vector<double> make_x(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(0.5, 4.5);
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = dist(gen);
  for (int64_t i = 0; i < n; i += 5) v[i] = (i / 5) % 2 ? -kLimit : kLimit;
  for (int64_t i = 1; i < n; i += 11) v[i] = (i / 11) % 2 ? -kLimit : kLimit;
  return v;
}

struct Options {
  bool interleaved = true;
  int mode = 0;
  int64_t m_eff = -1;  // rows computed (-1: all)
};

// The math with every intermediate rounded to `dtype` (the plain composite as PyTorch eager
// runs it in that dtype); kFloat64 gives the oracle. Returns y.
std::vector<double> forward_math(const std::vector<double>& x, Flat f, const Options& o,
                                 DType dtype) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  auto sig = [&](double v) { return rd(1.0 / (1.0 + std::exp(-v))); };
  std::vector<double> y(f.M * f.half, 0.0);
  const int64_t rows = o.m_eff < 0 ? f.M : o.m_eff;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < f.half; ++c) {
      const double A = o.interleaved ? x[r * f.K + 2 * c] : x[r * f.K + c];
      const double B = o.interleaved ? x[r * f.K + 2 * c + 1] : x[r * f.K + f.half + c];
      const double b = std::min(std::max(B, -kLimit), kLimit);
      if (o.mode == 0) {
        const double a = std::min(A, kLimit);
        const double s = sig(rd(kAlpha * a));
        y[r * f.half + c] = rd(rd(a * s) * rd(b + kBias));
      } else {
        const double q = std::min(rd(A * sig(A)), kLimit);
        y[r * f.half + c] = rd(q * b);
      }
    }
  }
  return y;
}

// dx by the chain rule of the composite, every step rounded like forward_math.
std::vector<double> backward_math(const std::vector<double>& x, const std::vector<double>& dy,
                                  Flat f, const Options& o, DType dtype) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  auto sig = [&](double v) { return rd(1.0 / (1.0 + std::exp(-v))); };
  std::vector<double> dx(f.M * f.K, 0.0);
  const int64_t rows = o.m_eff < 0 ? f.M : o.m_eff;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < f.half; ++c) {
      const int64_t ia = o.interleaved ? r * f.K + 2 * c : r * f.K + c;
      const int64_t ib = o.interleaved ? ia + 1 : ia + f.half;
      const double A = x[ia], B = x[ib], g = dy[r * f.half + c];
      const double b = std::min(std::max(B, -kLimit), kLimit);
      const bool b_pass = B >= -kLimit && B <= kLimit;
      if (o.mode == 0) {
        const double a = std::min(A, kLimit);
        const double s = sig(rd(kAlpha * a));
        const double as = rd(a * s), bb = rd(b + kBias);
        const double d_as = rd(g * bb), d_bb = rd(g * as);
        const double d_a1 = rd(d_as * s), d_s = rd(d_as * a);
        const double d_t = rd(d_s * s * (1.0 - s));
        const double d_a = rd(d_a1 + rd(d_t * kAlpha));
        dx[ia] = A <= kLimit ? d_a : 0.0;
        dx[ib] = b_pass ? d_bb : 0.0;
      } else {
        const double sA = sig(A);
        const double silu = rd(A * sA);
        const double q = std::min(silu, kLimit);
        const double d_q = rd(g * b), d_b = rd(g * q);
        const double d_silu = silu <= kLimit ? d_q : 0.0;
        const double d_a1 = rd(d_silu * sA), d_sA = rd(d_silu * A);
        dx[ia] = rd(d_a1 + rd(d_sA * sA * (1.0 - sA)));
        dx[ib] = b_pass ? d_b : 0.0;
      }
    }
  }
  return dx;
}

std::vector<DType> dtypes_of(const BackendCase& b, Direction dir) {
  return dtypes_taken(kOp, dir, b);
}

// group_index variants: none, a total below M, a total above M (every row), and zeros.
std::vector<std::vector<int64_t>> group_variants(int64_t M) {
  return {{}, {M / 3, 0, M / 4}, {M, 5, 1}, {0, 0}};
}
int64_t m_eff_of(const std::vector<int64_t>& gi, int64_t M) {
  if (gi.empty()) return -1;
  int64_t s = 0;
  for (int64_t v : gi) s += v;
  return std::min(std::max<int64_t>(s, 0), M);
}

std::string describe(const Options& o, const std::vector<int64_t>& gi, int dim) {
  std::string s = std::string(o.interleaved ? " interleaved" : " split") + " mode " +
                  std::to_string(o.mode) + " dim " + std::to_string(dim) + " groups [";
  for (int64_t v : gi) s += std::to_string(v) + ",";
  return s + "]";
}

TEST(ClippedSwiglu, ForwardAndBackwardMatchFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b, Direction::kForward)) {
      for (const auto& geo : kGeometries) {
        const Flat f = flat_of(geo);
        auto groups = group_variants(f.M);
        if (f.M * f.K > 10000) groups.resize(2);  // keep the large case quick on the ref backend
        for (const auto& gi : groups) {
          for (bool interleaved : {true, false}) {
            for (int mode : {0, 1}) {
              const Options o{interleaved, mode, m_eff_of(gi, f.M)};
              SCOPED_TRACE(case_name(b.id, dtype, geo.shape) + describe(o, gi, geo.dim));
              TestTensor x(dtype, geo.shape, b.device);
              const auto xv = x.set(make_x(x.numel(), 1000 + checked));
              TestTensor y(dtype, out_shape(geo), b.device);
              TestTensor dy(dtype, out_shape(geo), b.device), dx(dtype, geo.shape, b.device);
              const auto dyv = dy.fill_normal(2000 + checked, 0.1, 1.0);
              y.fill_nan();
              dx.fill_nan();
              TestTensor g(DType::kInt64, {static_cast<int64_t>(gi.size())});
              if (!gi.empty()) std::memcpy(g.data(), gi.data(), gi.size() * sizeof(int64_t));
              const TestTensor gd = g.to(b.device);
              const TensorView gv = gi.empty() ? TensorView() : gd.view();

              clipped_swiglu_fwd(b.ctx(), {x.view(), gv, y.view(), geo.dim, kAlpha, kLimit, kBias,
                                           interleaved, mode});
              const auto y64 = forward_math(xv, f, o, DType::kFloat64);
              const auto yb = forward_math(xv, f, o, dtype);
              Verdict vy = check_close(y.to_double(), yb, y64, dtype);
              EXPECT_TRUE(vy.pass) << "y: " << vy.describe();

              clipped_swiglu_bwd(b.ctx(), {dy.view(), x.view(), gv, dx.view(), geo.dim, kAlpha,
                                           kLimit, kBias, interleaved, mode});
              const auto dx64 = backward_math(xv, dyv, f, o, DType::kFloat64);
              const auto dxb = backward_math(xv, dyv, f, o, dtype);
              Verdict vd = check_close(dx.to_double(), dxb, dx64, dtype);
              EXPECT_TRUE(vd.pass) << "dx: " << vd.describe();
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// The boundary convention alone: A = limit passes its gradient, B = +-limit pass theirs, and
// just outside they do not (a strict comparison or a min/max split would fail here).
TEST(ClippedSwiglu, GradientAtExactlyTheLimitFollowsTorchClamp) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dtype : dtypes_of(b, Direction::kBackward)) {
      SCOPED_TRACE(b.id + "/" + dtype_name(dtype));
      // pairs (A, B), interleaved
      const std::vector<double> xs = {kLimit, kLimit, kLimit, -kLimit, 8.0, 1.0, 1.0, 8.0, 1.0, -8.0, -kLimit, 0.5};
      TestTensor x(dtype, {1, 12}, b.device), dy(dtype, {1, 6}, b.device), dx(dtype, {1, 12}, b.device);
      const auto xv = x.set(xs);
      const auto dyv = dy.set(std::vector<double>(6, 1.0));
      dx.fill_nan();
      clipped_swiglu_bwd(b.ctx(), {dy.view(), x.view(), TensorView(), dx.view(), -1, kAlpha, kLimit,
                                   kBias, true, 0});
      const auto got = dx.to_double();
      const auto want = backward_math(xv, dyv, {1, 12, 6}, Options{true, 0, -1}, DType::kFloat64);
      for (int i = 0; i < 12; ++i) {
        EXPECT_EQ(got[i] == 0.0, want[i] == 0.0) << "element " << i << ": got " << got[i]
                                                 << ", float64 " << want[i];
        EXPECT_NEAR(got[i], want[i], 0.02 * std::max(1.0, std::abs(want[i]))) << "element " << i;
      }
      EXPECT_NE(got[0], 0.0);   // A == limit passes
      EXPECT_NE(got[1], 0.0);   // B == limit passes
      EXPECT_NE(got[3], 0.0);   // B == -limit passes
      EXPECT_EQ(got[4], 0.0);   // A > limit blocks
      EXPECT_EQ(got[7], 0.0);   // B > limit blocks
      EXPECT_EQ(got[9], 0.0);   // B < -limit blocks
      EXPECT_NE(got[10], 0.0);  // A = -limit is not clamped from below
    }
  }
}

TEST(ClippedSwiglu, RepeatedRunsAreBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kBackward, b.id, dtype)) continue;
      SCOPED_TRACE(b.id + "/" + dtype_name(dtype));
      const std::vector<int64_t> shape = {97, 576};
      TestTensor x(dtype, shape, b.device), dy(dtype, {97, 288}, b.device);
      x.set(make_x(x.numel(), 7));
      dy.fill_normal(8);
      TestTensor y1(dtype, {97, 288}, b.device), y2(dtype, {97, 288}, b.device);
      TestTensor d1(dtype, shape, b.device), d2(dtype, shape, b.device);
      for (auto* pair : {&y1, &y2}) {
        clipped_swiglu_fwd(b.ctx(), {x.view(), TensorView(), pair->view(), -1, kAlpha, kLimit, kBias, true, 0});
      }
      clipped_swiglu_bwd(b.ctx(), {dy.view(), x.view(), TensorView(), d1.view(), -1, kAlpha, kLimit, kBias, false, 0});
      clipped_swiglu_bwd(b.ctx(), {dy.view(), x.view(), TensorView(), d2.view(), -1, kAlpha, kLimit, kBias, false, 0});
      EXPECT_EQ(y1.bytes(), y2.bytes());
      EXPECT_EQ(d1.bytes(), d2.bytes());
    }
  }
}

TEST(ClippedSwiglu, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kFloat32, {4, 8}), y(DType::kFloat32, {4, 4}), dy(DType::kFloat32, {4, 4});
  TestTensor dx(DType::kFloat32, {4, 8});
  x.fill_normal(1);
  auto fwd = [&](ClippedSwigluFwdArgs a) { clipped_swiglu_fwd(ctx, a); };
  auto ok = [&] { return ClippedSwigluFwdArgs{x.view(), TensorView(), y.view()}; };

  TestTensor x_odd(DType::kFloat32, {4, 7}), y_odd(DType::kFloat32, {4, 3});
  expect_error([&] { fwd({x_odd.view(), TensorView(), y_odd.view()}); }, ErrorKind::kValue,
               "clipped_swiglu: x.shape[dim] (the split size) must be even, got 7 at dim -1 of shape [4,7]");
  auto a = ok();
  a.dim = 2;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "dim must be in [-2, 2) for x of rank 2, got 2");
  a = ok();
  a.dim = -3;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "dim must be in [-2, 2) for x of rank 2, got -3");
  a = ok();
  a.limit = 0.0;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "limit must be a finite number > 0, got 0");
  a.limit = -1.5;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "limit must be a finite number > 0, got -1.5");
  a = ok();
  a.clamp_mode = 2;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "clamp_mode must be 0 or 1, got 2");
  a = ok();
  TestTensor gi32(DType::kInt32, {3});
  a.group_index = gi32.view();
  expect_error([&] { fwd(a); }, ErrorKind::kType, "group_index must have dtype in {int64}, got int32");
  TestTensor gi2d(DType::kInt64, {2, 2});
  a.group_index = gi2d.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "group_index must have rank 1, got rank 2");
  TestTensor gi_long(DType::kInt64, {8193});
  a.group_index = gi_long.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "group_index must have at most 8192 entries, got 8193");
  TestTensor gi_neg(DType::kInt64, {3});
  const int64_t neg[3] = {2, -1, 1};
  std::memcpy(gi_neg.data(), neg, sizeof(neg));
  a.group_index = gi_neg.view();
  // Checked on the CPU before any work, without debug checks.
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.device.kind != DeviceKind::kCPU) continue;
    Context c = ctx;
    c.backend = b.id;
    expect_error([&] { clipped_swiglu_fwd(c, a); }, ErrorKind::kValue,
                 "group_index entries must be >= 0, got -1 at index 1");
    expect_error([&] {
      clipped_swiglu_bwd(c, {dy.view(), x.view(), gi_neg.view(), dx.view()});
    }, ErrorKind::kValue, "group_index entries must be >= 0, got -1 at index 1");
  }
  TestTensor xi(DType::kInt32, {4, 8});
  expect_error([&] { fwd({xi.view(), TensorView(), y.view()}); }, ErrorKind::kType,
               "x must have dtype in {float32, bfloat16, float16, float64}, got int32");
  TestTensor scalar(DType::kFloat32, {});
  expect_error([&] { fwd({scalar.view(), TensorView(), y.view()}); }, ErrorKind::kValue,
               "x must have rank >= 1, got rank 0");
  TestTensor y_bad(DType::kFloat32, {4, 8});
  expect_error([&] { fwd({x.view(), TensorView(), y_bad.view()}); }, ErrorKind::kValue,
               "y must have shape [4,4] (x's shape with shape[dim] halved), got [4,8]");
  TestTensor y_half(DType::kFloat16, {4, 4});
  expect_error([&] { fwd({x.view(), TensorView(), y_half.view()}); }, ErrorKind::kType,
               "y must have the dtype of x (float32), got float16");
  expect_error([&] { fwd({x.strided_view({4, 4}, {8, 2}), TensorView(), TestTensor(DType::kFloat32, {4, 2}).view()}); },
               ErrorKind::kValue, "x must be contiguous");
  TestTensor dy_bad(DType::kFloat32, {4, 5});
  expect_error([&] { clipped_swiglu_bwd(ctx, {dy_bad.view(), x.view(), TensorView(), dx.view()}); },
               ErrorKind::kValue, "dy must have shape [4,4] (x's shape with shape[dim] halved), got [4,5]");
  expect_error([&] { clipped_swiglu_bwd(ctx, {dy.view(), x.view(), TensorView(), TensorView()}); },
               ErrorKind::kValue, "dx is required but was not given");
  TestTensor x64(DType::kFloat64, {4, 8}), y64(DType::kFloat64, {4, 4});
  Context forced = ctx;
  forced.backend = "cpu";
  expect_error([&] { clipped_swiglu_fwd(forced, {x64.view(), TensorView(), y64.view()}); },
               ErrorKind::kRuntime, "cpu: does not take float64");
}

}  // namespace
}  // namespace fusedops::testing
