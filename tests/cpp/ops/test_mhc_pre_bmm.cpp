// mhc_pre_bmm: every runnable backend against an extended-precision oracle written here (plain
// loops of docs/specs/ops.md 9.2), forward and both gradients, n = 1..16 (n = 4 is the CUDA fast path),
// odd C (scalar path), strided and misaligned x, fp32 and input-dtype outputs, empty inputs,
// many blocks, determinism and the errors of docs/specs/ops.md 9.2.
#include <cmath>
#include <string>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "mhc_pre_bmm";

std::vector<DType> dtypes_of(const BackendCase& b) {
  return dtypes_taken(kOp, Direction::kForward, b);
}

struct Dims {
  int64_t tokens, n, C;
};
Dims dims_of(const std::vector<int64_t>& shape) {
  Dims d{1, shape[shape.size() - 2], shape.back()};
  for (size_t i = 0; i + 2 < shape.size(); ++i) d.tokens *= shape[i];
  return d;
}

// y, dx, dh in precision F; outputs rounded to their dtypes.
template <class F>
void oracle(const std::vector<double>& h, const std::vector<double>& x, const std::vector<double>& dy,
            Dims d, DType ydt, DType xdt, DType hdt, std::vector<double>& y,
            std::vector<double>& dx, std::vector<double>& dh) {
  y.assign(d.tokens * d.C, 0);
  dx.assign(d.tokens * d.n * d.C, 0);
  dh.assign(d.tokens * d.n, 0);
  for (int64_t t = 0; t < d.tokens; ++t) {
    for (int64_t c = 0; c < d.C; ++c) {
      F acc = 0;
      for (int64_t i = 0; i < d.n; ++i)
        acc += static_cast<F>(h[t * d.n + i]) * static_cast<F>(x[(t * d.n + i) * d.C + c]);
      y[t * d.C + c] = round_to(ydt, static_cast<double>(acc));
    }
    for (int64_t i = 0; i < d.n; ++i) {
      F acc = 0;
      for (int64_t c = 0; c < d.C; ++c) {
        const F g = static_cast<F>(dy[t * d.C + c]);
        acc += static_cast<F>(x[(t * d.n + i) * d.C + c]) * g;
        dx[(t * d.n + i) * d.C + c] = round_to(xdt, static_cast<double>(static_cast<F>(h[t * d.n + i]) * g));
      }
      dh[t * d.n + i] = round_to(hdt, static_cast<double>(acc));
    }
  }
}

DType coeff_dtype(DType x) { return x == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

// x is a view of a buffer whose rows (streams) have C + pad elements, starting `offset` elements
// into it (offset 1 makes 16-byte accesses impossible).
void check_case(const BackendCase& b, DType dtype, DType ydt, const std::vector<int64_t>& shape,
                uint64_t seed, int64_t pad = 0, int64_t offset = 0) {
  SCOPED_TRACE(case_name(b.id, dtype, shape) + " y " + dtype_name(ydt) + " pad " + std::to_string(pad) +
               " offset " + std::to_string(offset));
  const Dims d = dims_of(shape);
  const DType cdt = coeff_dtype(dtype);
  const int64_t rs = d.C + pad;
  TestTensor xbuf(dtype, {d.tokens * d.n * rs + offset + 1}, b.device);
  const auto xb = xbuf.fill_normal(seed, 0.1, 1.2);
  std::vector<int64_t> xstr(shape.size());
  xstr.back() = 1;
  xstr[shape.size() - 2] = rs;
  for (int i = static_cast<int>(shape.size()) - 3; i >= 0; --i) xstr[i] = xstr[i + 1] * shape[i + 1];
  TensorView x(static_cast<char*>(xbuf.data()) + offset * dtype_size(dtype), dtype, b.device,
               static_cast<int>(shape.size()), shape.data(), xstr.data());
  std::vector<double> xv(d.tokens * d.n * d.C);
  for (int64_t r = 0; r < d.tokens * d.n; ++r)
    for (int64_t c = 0; c < d.C; ++c) xv[r * d.C + c] = xb[offset + r * rs + c];
  std::vector<int64_t> hshape(shape.begin(), shape.end() - 1), yshape(shape.begin(), shape.end() - 2);
  yshape.push_back(d.C);
  TestTensor h(cdt, hshape, b.device), dy(ydt, yshape, b.device);
  const auto hv = h.fill_normal(seed + 1, 0.3, 1.0);
  const auto dyv = dy.fill_normal(seed + 2);
  TestTensor y(ydt, yshape, b.device), dx(dtype, shape, b.device), dh(cdt, hshape, b.device);
  y.fill_nan();
  dx.fill_nan();
  dh.fill_nan();
  mhc_pre_bmm_fwd(b.ctx(), {h.view(), x, y.view()});
  mhc_pre_bmm_bwd(b.ctx(), {h.view(), x, dy.view(), dh.view(), dx.view()});
  std::vector<double> y64, dx64, dh64, yb, dxb, dhb;
  const DType f64 = DType::kFloat64;
  oracle<long double>(hv, xv, dyv, d, f64, f64, f64, y64, dx64, dh64);
  if (dtype == DType::kFloat64) {
    oracle<double>(hv, xv, dyv, d, f64, f64, f64, yb, dxb, dhb);
  } else {
    oracle<float>(hv, xv, dyv, d, ydt, dtype, cdt, yb, dxb, dhb);
  }
  Verdict vy = check_close(y.to_double(), yb, y64, ydt);
  EXPECT_TRUE(vy.pass) << "y: " << vy.describe();
  Verdict vx = check_close(dx.to_double(), dxb, dx64, dtype);
  EXPECT_TRUE(vx.pass) << "dx: " << vx.describe();
  Verdict vh = check_close(dh.to_double(), dhb, dh64, cdt);
  EXPECT_TRUE(vh.pass) << "dh_pre: " << vh.describe();
}

const std::vector<std::vector<int64_t>> kShapes = {
    {1, 4, 1},  {3, 4, 7},  {5, 4, 64},  {2, 3, 4, 129}, {7, 1, 8},  {4, 2, 33},
    {3, 3, 16}, {2, 5, 40}, {6, 8, 24},  {2, 16, 8},     {2, 6, 4, 56}};

TEST(MhcPreBmm, MatchesOracleOnEveryBackendAndShape) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b)) {
      for (const auto& shape : kShapes) {
        check_case(b, dtype, dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32, shape,
                   300 + checked);
        ++checked;
      }
      // the output in x's dtype
      check_case(b, dtype, dtype, {3, 4, 64}, 400 + checked++);
      check_case(b, dtype, dtype, {3, 6, 17}, 400 + checked++);
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(MhcPreBmm, StridedMisalignedAndLargeInputs) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      check_case(b, dtype, DType::kFloat32, {5, 4, 64}, 11, 8);       // padded rows, aligned
      check_case(b, dtype, DType::kFloat32, {5, 4, 64}, 12, 3);       // padded rows, unaligned
      check_case(b, dtype, DType::kFloat32, {5, 4, 64}, 13, 0, 1);    // misaligned start
      check_case(b, dtype, DType::kFloat32, {3, 5, 48}, 14, 0, 1);
    }
    if (b.id != "ref") check_case(b, DType::kBFloat16, DType::kFloat32, {300, 4, 512}, 15);
  }
}

TEST(MhcPreBmm, EmptyInputs) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    SCOPED_TRACE(b.id);
    // no tokens: nothing to do
    TestTensor x(DType::kFloat32, {0, 4, 16}, b.device), h(DType::kFloat32, {0, 4}, b.device);
    TestTensor y(DType::kFloat32, {0, 16}, b.device);
    mhc_pre_bmm_fwd(b.ctx(), {h.view(), x.view(), y.view()});
    mhc_pre_bmm_bwd(b.ctx(), {h.view(), x.view(), y.view(), h.view(), x.view()});
    // C == 0: y is empty, dh_pre is a sum over nothing
    TestTensor x0(DType::kFloat32, {3, 4, 0}, b.device), h0(DType::kFloat32, {3, 4}, b.device);
    TestTensor y0(DType::kFloat32, {3, 0}, b.device), dh0(DType::kFloat32, {3, 4}, b.device);
    h0.fill_normal(1);
    dh0.fill_nan();
    mhc_pre_bmm_fwd(b.ctx(), {h0.view(), x0.view(), y0.view()});
    mhc_pre_bmm_bwd(b.ctx(), {h0.view(), x0.view(), y0.view(), dh0.view(), x0.view()});
    EXPECT_EQ(dh0.to_double(), std::vector<double>(12, 0.0));
  }
}

TEST(MhcPreBmm, RepeatedBackwardIsBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (int n : {4, 5}) {
      SCOPED_TRACE(b.id + " n " + std::to_string(n));
      TestTensor x(DType::kBFloat16, {33, n, 520}, b.device), h(DType::kFloat32, {33, n}, b.device);
      TestTensor dy(DType::kFloat32, {33, 520}, b.device);
      x.fill_normal(1);
      h.fill_normal(2);
      dy.fill_normal(3);
      TestTensor dx1(DType::kBFloat16, {33, n, 520}, b.device), dx2(DType::kBFloat16, {33, n, 520}, b.device);
      TestTensor dh1(DType::kFloat32, {33, n}, b.device), dh2(DType::kFloat32, {33, n}, b.device);
      mhc_pre_bmm_bwd(b.ctx(), {h.view(), x.view(), dy.view(), dh1.view(), dx1.view()});
      mhc_pre_bmm_bwd(b.ctx(), {h.view(), x.view(), dy.view(), dh2.view(), dx2.view()});
      EXPECT_EQ(dx1.bytes(), dx2.bytes());
      EXPECT_EQ(dh1.bytes(), dh2.bytes());
    }
  }
}

TEST(MhcPreBmm, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kBFloat16, {3, 4, 8}), h(DType::kFloat32, {3, 4}), y(DType::kFloat32, {3, 8});
  TestTensor x2(DType::kBFloat16, {12, 8});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h.view(), x2.view(), y.view()}); }, ErrorKind::kValue,
               "mhc_pre_bmm: x must have rank 3 ([T,n,C]) or 4 ([B,T,n,C]), got rank 2 with shape [12,8]");
  TestTensor x5(DType::kBFloat16, {1, 1, 3, 4, 8});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h.view(), x5.view(), y.view()}); }, ErrorKind::kValue,
               "got rank 5");
  TestTensor h5(DType::kFloat32, {3, 5});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h5.view(), x.view(), y.view()}); }, ErrorKind::kValue,
               "h_pre must have shape [3,4] (x's shape without C: one weight per stream), got [3,5]");
  TestTensor h2(DType::kFloat32, {2, 4});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h2.view(), x.view(), y.view()}); }, ErrorKind::kValue,
               "h_pre must have shape [3,4]");
  TestTensor hb(DType::kBFloat16, {3, 4});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {hb.view(), x.view(), y.view()}); }, ErrorKind::kType,
               "h_pre must have dtype in {float32, float64}, got bfloat16");
  TestTensor y7(DType::kFloat32, {3, 7});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h.view(), x.view(), y7.view()}); }, ErrorKind::kValue,
               "y must have shape [3,8] (x's shape without n), got [3,7]");
  TestTensor xi(DType::kInt32, {3, 4, 8});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h.view(), xi.view(), y.view()}); }, ErrorKind::kType,
               "x must have dtype in {float32, bfloat16, float16, float64}, got int32");
  TestTensor x0(DType::kBFloat16, {3, 0, 8}), h0(DType::kFloat32, {3, 0});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h0.view(), x0.view(), y.view()}); }, ErrorKind::kValue,
               "x must have at least one stream (n >= 1)");
  TestTensor dx(DType::kBFloat16, {3, 4, 8}), dh(DType::kFloat32, {3, 4}), dy_bad(DType::kFloat32, {3, 9});
  expect_error([&] { mhc_pre_bmm_bwd(ctx, {h.view(), x.view(), dy_bad.view(), dh.view(), dx.view()}); },
               ErrorKind::kValue, "dy must have shape [3,8] (x's shape without n), got [3,9]");
  TestTensor dx32(DType::kFloat32, {3, 4, 8});
  expect_error([&] { mhc_pre_bmm_bwd(ctx, {h.view(), x.view(), y.view(), dh.view(), dx32.view()}); },
               ErrorKind::kType, "dx must have the dtype of x (bfloat16), got float32");
  TensorView x_cols = x.strided_view({3, 4, 4}, {32, 8, 2});
  TestTensor y4(DType::kFloat32, {3, 4});
  expect_error([&] { mhc_pre_bmm_fwd(ctx, {h.view(), x_cols, y4.view()}); }, ErrorKind::kValue,
               "x must have a contiguous last dimension (stride 1)");
}

}  // namespace
}  // namespace fusedops::testing
