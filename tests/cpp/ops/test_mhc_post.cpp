// mhc_post: every runnable backend against an extended-precision oracle written here (plain loops
// of docs/specs/ops.md 9.3), forward and all four gradients, n = 1..16 (n = 4 is the CUDA fast path, other n
// the multi-pass path), odd C (scalar path), strided and misaligned inputs, empty inputs, many
// blocks, determinism and the errors of docs/specs/ops.md 9.3.
#include <cmath>
#include <string>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "mhc_post";

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

struct Data {
  std::vector<double> x, hres, hout, hpost, dy;
};
struct Result {
  std::vector<double> out, dx, dhres, dhout, dhpost;
};

// The oracle in precision F; x-like outputs rounded to xdt, coefficient gradients to cdt.
template <class F>
Result oracle(const Data& a, Dims d, DType xdt, DType cdt) {
  const int64_t n = d.n, C = d.C;
  Result r;
  r.out.assign(d.tokens * n * C, 0);
  r.dx.assign(d.tokens * n * C, 0);
  r.dhout.assign(d.tokens * C, 0);
  r.dhres.assign(d.tokens * n * n, 0);
  r.dhpost.assign(d.tokens * n, 0);
  auto X = [&](int64_t t, int64_t j, int64_t c) { return static_cast<F>(a.x[(t * n + j) * C + c]); };
  auto DY = [&](int64_t t, int64_t k, int64_t c) { return static_cast<F>(a.dy[(t * n + k) * C + c]); };
  auto HR = [&](int64_t t, int64_t j, int64_t k) { return static_cast<F>(a.hres[(t * n + j) * n + k]); };
  for (int64_t t = 0; t < d.tokens; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      const F f = static_cast<F>(a.hout[t * C + c]);
      for (int64_t k = 0; k < n; ++k) {
        F acc = static_cast<F>(a.hpost[t * n + k]) * f;
        for (int64_t j = 0; j < n; ++j) acc += HR(t, j, k) * X(t, j, c);
        r.out[(t * n + k) * C + c] = round_to(xdt, static_cast<double>(acc));
      }
      F dho = 0;
      for (int64_t k = 0; k < n; ++k) dho += static_cast<F>(a.hpost[t * n + k]) * DY(t, k, c);
      r.dhout[t * C + c] = round_to(xdt, static_cast<double>(dho));
      for (int64_t j = 0; j < n; ++j) {
        F acc = 0;
        for (int64_t k = 0; k < n; ++k) acc += HR(t, j, k) * DY(t, k, c);
        r.dx[(t * n + j) * C + c] = round_to(xdt, static_cast<double>(acc));
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      F acc = 0;
      for (int64_t c = 0; c < C; ++c) acc += static_cast<F>(a.hout[t * C + c]) * DY(t, k, c);
      r.dhpost[t * n + k] = round_to(cdt, static_cast<double>(acc));
    }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < n; ++k) {
        F acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += X(t, j, c) * DY(t, k, c);
        r.dhres[(t * n + j) * n + k] = round_to(cdt, static_cast<double>(acc));
      }
  }
  return r;
}

// A view of `shape` over rows of C + pad elements starting `offset` elements into `buf`, and the
// values it shows (densely packed).
TensorView padded_view(const TestTensor& buf, const std::vector<double>& bv, DType dtype, Device dev,
                       const std::vector<int64_t>& shape, int64_t pad, int64_t offset,
                       std::vector<double>& values) {
  const int64_t C = shape.back(), rs = C + pad;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  std::vector<int64_t> str(shape.size());
  str.back() = 1;
  if (shape.size() >= 2) str[shape.size() - 2] = rs;
  for (int i = static_cast<int>(shape.size()) - 3; i >= 0; --i) str[i] = str[i + 1] * shape[i + 1];
  values.resize(rows * C);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) values[r * C + c] = bv[offset + r * rs + c];
  return TensorView(static_cast<char*>(buf.data()) + offset * dtype_size(dtype), dtype, dev,
                    static_cast<int>(shape.size()), shape.data(), str.data());
}

void check_case(const BackendCase& b, DType dtype, const std::vector<int64_t>& shape, uint64_t seed,
                int64_t pad = 0, int64_t offset = 0) {
  SCOPED_TRACE(case_name(b.id, dtype, shape) + " pad " + std::to_string(pad) + " offset " +
               std::to_string(offset));
  const Dims d = dims_of(shape);
  const DType cdt = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  std::vector<int64_t> lead(shape.begin(), shape.end() - 2);
  std::vector<int64_t> rshape = lead, oshape = lead, pshape = lead;
  rshape.insert(rshape.end(), {d.n, d.n});
  oshape.push_back(d.C);
  pshape.push_back(d.n);
  const int64_t rs = d.C + pad;
  Data a;
  TestTensor xbuf(dtype, {d.tokens * d.n * rs + offset + 1}, b.device);
  TestTensor dybuf(dtype, {d.tokens * d.n * rs + offset + 1}, b.device);
  TestTensor hobuf(dtype, {d.tokens * rs + offset + 1}, b.device);
  const auto xb = xbuf.fill_normal(seed, 0.1, 1.1);
  const auto dyb = dybuf.fill_normal(seed + 1);
  const auto hob = hobuf.fill_normal(seed + 2, -0.2, 1.0);
  TensorView x = padded_view(xbuf, xb, dtype, b.device, shape, pad, offset, a.x);
  TensorView dy = padded_view(dybuf, dyb, dtype, b.device, shape, pad, offset, a.dy);
  TensorView hout = padded_view(hobuf, hob, dtype, b.device, oshape, pad, offset, a.hout);
  TestTensor hres(cdt, rshape, b.device), hpost(cdt, pshape, b.device);
  a.hres = hres.fill_normal(seed + 3, 0.2, 0.6);
  a.hpost = hpost.fill_normal(seed + 4, 1.0, 0.5);
  TestTensor out(dtype, shape, b.device), dx(dtype, shape, b.device), dhout(dtype, oshape, b.device);
  TestTensor dhres(cdt, rshape, b.device), dhpost(cdt, pshape, b.device);
  for (TestTensor* t : {&out, &dx, &dhout, &dhres, &dhpost}) t->fill_nan();
  mhc_post_fwd(b.ctx(), {x, hres.view(), hout, hpost.view(), out.view()});
  mhc_post_bwd(b.ctx(), {x, hres.view(), hout, hpost.view(), dy, dx.view(), dhres.view(),
                         dhout.view(), dhpost.view()});
  const DType f64 = DType::kFloat64;
  const Result ref = oracle<long double>(a, d, f64, f64);
  const Result base = dtype == f64 ? oracle<double>(a, d, f64, f64) : oracle<float>(a, d, dtype, cdt);
  struct Item {
    const char* name;
    const TestTensor* got;
    const std::vector<double>& base;
    const std::vector<double>& ref;
    DType dt;
  };
  const Item items[] = {{"out", &out, base.out, ref.out, dtype},
                        {"dx", &dx, base.dx, ref.dx, dtype},
                        {"dh_out", &dhout, base.dhout, ref.dhout, dtype},
                        {"dh_res", &dhres, base.dhres, ref.dhres, cdt},
                        {"dh_post", &dhpost, base.dhpost, ref.dhpost, cdt}};
  for (const Item& it : items) {
    Verdict v = check_close(it.got->to_double(), it.base, it.ref, it.dt);
    EXPECT_TRUE(v.pass) << it.name << ": " << v.describe();
  }
}

const std::vector<std::vector<int64_t>> kShapes = {
    {1, 4, 1},  {3, 4, 7},  {5, 4, 64},  {2, 3, 4, 129}, {7, 1, 8},  {4, 2, 33},
    {3, 3, 16}, {2, 5, 40}, {6, 8, 24},  {2, 16, 8},     {2, 6, 4, 56}};

TEST(MhcPost, MatchesOracleOnEveryBackendAndShape) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b)) {
      for (const auto& shape : kShapes) check_case(b, dtype, shape, 500 + checked++);
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(MhcPost, StridedMisalignedAndLargeInputs) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t n : {4, 6}) {
        check_case(b, dtype, {5, n, 64}, 21, 8);     // padded rows, aligned
        check_case(b, dtype, {5, n, 64}, 22, 3);     // padded rows, unaligned
        check_case(b, dtype, {5, n, 64}, 23, 0, 1);  // misaligned start
      }
    }
    if (b.id != "ref") {
      check_case(b, DType::kBFloat16, {300, 4, 512}, 24);
      check_case(b, DType::kBFloat16, {100, 8, 264}, 25);
    }
  }
}

TEST(MhcPost, EmptyInputs) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    SCOPED_TRACE(b.id);
    TestTensor x(DType::kFloat32, {0, 4, 16}, b.device), hr(DType::kFloat32, {0, 4, 4}, b.device);
    TestTensor ho(DType::kFloat32, {0, 16}, b.device), hp(DType::kFloat32, {0, 4}, b.device);
    mhc_post_fwd(b.ctx(), {x.view(), hr.view(), ho.view(), hp.view(), x.view()});
    mhc_post_bwd(b.ctx(), {x.view(), hr.view(), ho.view(), hp.view(), x.view(), x.view(), hr.view(),
                           ho.view(), hp.view()});
    // C == 0: the per-token weight gradients are sums over nothing
    for (int64_t n : {4, 3}) {
      TestTensor x0(DType::kFloat32, {3, n, 0}, b.device), hr0(DType::kFloat32, {3, n, n}, b.device);
      TestTensor ho0(DType::kFloat32, {3, 0}, b.device), hp0(DType::kFloat32, {3, n}, b.device);
      TestTensor dhr(DType::kFloat32, {3, n, n}, b.device), dhp(DType::kFloat32, {3, n}, b.device);
      hr0.fill_normal(1);
      hp0.fill_normal(2);
      dhr.fill_nan();
      dhp.fill_nan();
      mhc_post_bwd(b.ctx(), {x0.view(), hr0.view(), ho0.view(), hp0.view(), x0.view(), x0.view(),
                             dhr.view(), ho0.view(), dhp.view()});
      EXPECT_EQ(dhr.to_double(), std::vector<double>(3 * n * n, 0.0));
      EXPECT_EQ(dhp.to_double(), std::vector<double>(3 * n, 0.0));
    }
  }
}

TEST(MhcPost, RepeatedBackwardIsBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (int64_t n : {4, 6}) {
      SCOPED_TRACE(b.id + " n " + std::to_string(n));
      const int64_t T = 33, C = 520;
      TestTensor x(DType::kBFloat16, {T, n, C}, b.device), dy(DType::kBFloat16, {T, n, C}, b.device);
      TestTensor ho(DType::kBFloat16, {T, C}, b.device), hr(DType::kFloat32, {T, n, n}, b.device);
      TestTensor hp(DType::kFloat32, {T, n}, b.device);
      x.fill_normal(1);
      dy.fill_normal(2);
      ho.fill_normal(3);
      hr.fill_normal(4);
      hp.fill_normal(5);
      std::vector<std::vector<uint8_t>> runs;
      for (int rep = 0; rep < 2; ++rep) {
        TestTensor dx(DType::kBFloat16, {T, n, C}, b.device), dho(DType::kBFloat16, {T, C}, b.device);
        TestTensor dhr(DType::kFloat32, {T, n, n}, b.device), dhp(DType::kFloat32, {T, n}, b.device);
        mhc_post_bwd(b.ctx(), {x.view(), hr.view(), ho.view(), hp.view(), dy.view(), dx.view(),
                               dhr.view(), dho.view(), dhp.view()});
        std::vector<uint8_t> all;
        for (auto* t : {&dx, &dho, &dhr, &dhp}) {
          auto bytes = t->bytes();
          all.insert(all.end(), bytes.begin(), bytes.end());
        }
        runs.push_back(all);
      }
      EXPECT_EQ(runs[0], runs[1]);
    }
  }
}

TEST(MhcPost, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kBFloat16, {3, 4, 8}), hr(DType::kFloat32, {3, 4, 4}), ho(DType::kBFloat16, {3, 8});
  TestTensor hp(DType::kFloat32, {3, 4}), out(DType::kBFloat16, {3, 4, 8});
  auto fwd = [&](const TensorView& xv, const TensorView& r, const TensorView& o, const TensorView& p) {
    mhc_post_fwd(ctx, {xv, r, o, p, out.view()});
  };
  TestTensor hr45(DType::kFloat32, {3, 4, 5});
  expect_error([&] { fwd(x.view(), hr45.view(), ho.view(), hp.view()); }, ErrorKind::kValue,
               "mhc_post: h_res must have shape [3,4,4] (square n x n mixing matrix per token), got [3,4,5]");
  TestTensor ho32(DType::kFloat32, {3, 8});
  expect_error([&] { fwd(x.view(), hr.view(), ho32.view(), hp.view()); }, ErrorKind::kType,
               "h_out must have the dtype of x (bfloat16), got float32");
  TestTensor ho7(DType::kBFloat16, {3, 7});
  expect_error([&] { fwd(x.view(), hr.view(), ho7.view(), hp.view()); }, ErrorKind::kValue,
               "h_out must have shape [3,8] (x's shape without n), got [3,7]");
  TestTensor hp3(DType::kFloat32, {3, 3});
  expect_error([&] { fwd(x.view(), hr.view(), ho.view(), hp3.view()); }, ErrorKind::kValue,
               "h_post must have shape [3,4] (x's shape without C: one weight per stream), got [3,3]");
  TestTensor x2(DType::kBFloat16, {12, 8});
  expect_error([&] { fwd(x2.view(), hr.view(), ho.view(), hp.view()); }, ErrorKind::kValue,
               "x must have rank 3 ([T,n,C]) or 4 ([B,T,n,C]), got rank 2");
  TestTensor hr4(DType::kFloat32, {2, 4, 4});
  expect_error([&] { fwd(x.view(), hr4.view(), ho.view(), hp.view()); }, ErrorKind::kValue,
               "h_res must have shape [3,4,4]");
  TestTensor hp64(DType::kFloat64, {3, 4});
  expect_error([&] { fwd(x.view(), hr.view(), ho.view(), hp64.view()); }, ErrorKind::kType,
               "h_post must have the dtype of h_res (float32), got float64");
  TestTensor out_bad(DType::kFloat32, {3, 4, 8});
  expect_error([&] { mhc_post_fwd(ctx, {x.view(), hr.view(), ho.view(), hp.view(), out_bad.view()}); },
               ErrorKind::kType, "out must have the dtype of x (bfloat16), got float32");
  TestTensor dy_bad(DType::kBFloat16, {3, 4, 9});
  expect_error([&] {
    mhc_post_bwd(ctx, {x.view(), hr.view(), ho.view(), hp.view(), dy_bad.view(), out.view(), hr.view(),
                       ho.view(), hp.view()});
  }, ErrorKind::kValue, "dy must have shape [3,4,8] (same as x), got [3,4,9]");
  TestTensor dhr_bad(DType::kFloat32, {3, 16});
  expect_error([&] {
    mhc_post_bwd(ctx, {x.view(), hr.view(), ho.view(), hp.view(), out.view(), out.view(),
                       dhr_bad.view(), ho.view(), hp.view()});
  }, ErrorKind::kValue, "dh_res must have shape [3,4,4] (same as h_res), got [3,16]");
}

}  // namespace
}  // namespace fusedops::testing
