// sinkhorn: every runnable backend against an extended-precision oracle written in the test
// (tests/cpp/ops/mhc_oracle.h, itself checked against finite differences), forward and backward,
// the three variants, n = 1..16, num_iters = 1 and many (including more iterations than the CUDA
// history holds at once), NaN-poisoned outputs, empty batches, determinism, and the errors of
// docs/specs/ops.md 3.5.
#include <cmath>
#include <string>

#include "tests/common/tolerance.h"
#include "tests/cpp/ops/mhc_oracle.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

using mhc_oracle::Sinkhorn;

constexpr const char* kOp = "sinkhorn";
constexpr double kEps = 1e-6;

const SinkhornVariant kVariants[] = {SinkhornVariant::kMindSpeed, SinkhornVariant::kDeepSeek,
                                     SinkhornVariant::kLog};

std::vector<DType> dtypes_of(const BackendCase& b, Direction dir) {
  return dtypes_taken(kOp, dir, b);
}

// Oracle (long double) and base (the composite in fp32, or float64 for float64 inputs; outputs
// rounded to the dtype) for every matrix of a batch.
struct Expected {
  std::vector<double> p_ref, p_base, dl_ref, dl_base;
};

template <class F>
void run_oracle(const std::vector<double>& l, const std::vector<double>& dp, int n, int iters,
                SinkhornVariant v, DType round, std::vector<double>& p, std::vector<double>& dl) {
  const int64_t nn = static_cast<int64_t>(n) * n, mats = nn ? static_cast<int64_t>(l.size()) / nn : 0;
  p.assign(l.size(), 0.0);
  dl.assign(l.size(), 0.0);
  for (int64_t b = 0; b < mats; ++b) {
    std::vector<F> lm(l.begin() + b * nn, l.begin() + (b + 1) * nn);
    std::vector<F> dm(dp.begin() + b * nn, dp.begin() + (b + 1) * nn);
    Sinkhorn<F> sk(lm, n, iters, static_cast<F>(kEps), v);
    const std::vector<F> g = sk.backward(dm);
    for (int64_t e = 0; e < nn; ++e) {
      p[b * nn + e] = round_to(round, static_cast<double>(sk.p[e]));
      dl[b * nn + e] = round_to(round, static_cast<double>(g[e]));
    }
  }
}

Expected expected(const std::vector<double>& l, const std::vector<double>& dp, int n, int iters,
                  SinkhornVariant v, DType dtype) {
  Expected e;
  run_oracle<long double>(l, dp, n, iters, v, DType::kFloat64, e.p_ref, e.dl_ref);
  if (dtype == DType::kFloat64)
    run_oracle<double>(l, dp, n, iters, v, DType::kFloat64, e.p_base, e.dl_base);
  else
    run_oracle<float>(l, dp, n, iters, v, dtype, e.p_base, e.dl_base);
  return e;
}

std::vector<int64_t> shape_of(const std::vector<int64_t>& batch, int n) {
  std::vector<int64_t> s = batch;
  s.push_back(n);
  s.push_back(n);
  return s;
}

// Runs forward and backward of one case on one backend and checks both.
void check_case(const BackendCase& b, DType dtype, const std::vector<int64_t>& batch, int n,
                int iters, SinkhornVariant v, uint64_t seed, double scale = 1.5) {
  const auto shape = shape_of(batch, n);
  SCOPED_TRACE(case_name(b.id, dtype, shape) + " " + sinkhorn_variant_name(v) + " iters " +
               std::to_string(iters));
  TestTensor logits(dtype, shape, b.device), dout(dtype, shape, b.device);
  TestTensor out(dtype, shape, b.device), dl(dtype, shape, b.device);
  const auto lv = logits.fill_normal(seed, 0.2, scale);
  const auto dv = dout.fill_normal(seed + 1);
  out.fill_nan();
  dl.fill_nan();
  Context ctx = b.ctx();
  sinkhorn_fwd(ctx, {logits.view(), out.view(), iters, kEps, v});
  sinkhorn_bwd(ctx, {logits.view(), dout.view(), dl.view(), iters, kEps, v});
  const Expected e = expected(lv, dv, n, iters, v, dtype);
  Verdict vp = check_close(out.to_double(), e.p_base, e.p_ref, dtype);
  EXPECT_TRUE(vp.pass) << "P: " << vp.describe();
  Verdict vd = check_close(dl.to_double(), e.dl_base, e.dl_ref, dtype);
  EXPECT_TRUE(vd.pass) << "dlogits: " << vd.describe();
}

TEST(Sinkhorn, OracleGradientMatchesFiniteDifferences) {
  // The oracle's backward against central differences of its own forward (long double). The
  // backward treats rowmax as a constant (docs/specs/ops.md 3.3), exact only for eps = 0 in mindspeed (the
  // first row step then removes any row scaling); otherwise the rowmax path adds O(eps).
  for (SinkhornVariant v : kVariants) {
    const double eps = v == SinkhornVariant::kMindSpeed ? 0.0 : kEps;
    for (int n : {1, 3, 4}) {
      for (int iters : {1, 5}) {
        SCOPED_TRACE(std::string(sinkhorn_variant_name(v)) + " n " + std::to_string(n));
        TestTensor lt(DType::kFloat64, {n, n}), gt(DType::kFloat64, {n, n});
        const auto l = lt.fill_normal(7 + n + iters, 0.0, 1.2);
        const auto dp = gt.fill_normal(8 + n);
        std::vector<long double> ll(l.begin(), l.end()), dd(dp.begin(), dp.end());
        Sinkhorn<long double> sk(ll, n, iters, eps, v);
        const auto dl = sk.backward(dd);
        const long double h = 1e-6L;
        for (int e = 0; e < n * n; ++e) {
          auto plus = ll, minus = ll;
          plus[e] += h;
          minus[e] -= h;
          const auto pp = Sinkhorn<long double>(plus, n, iters, eps, v).p;
          const auto pm = Sinkhorn<long double>(minus, n, iters, eps, v).p;
          long double fd = 0;
          for (int k = 0; k < n * n; ++k) fd += dd[k] * (pp[k] - pm[k]) / (2 * h);
          EXPECT_NEAR(static_cast<double>(dl[e]), static_cast<double>(fd), 1e-7) << "element " << e;
        }
      }
    }
  }
}

TEST(Sinkhorn, MatchesOracleOnEveryBackendVariantAndSize) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b, Direction::kForward)) {
      for (SinkhornVariant v : kVariants) {
        for (int n : {1, 2, 3, 4, 5, 8, 16}) {
          check_case(b, dtype, {7}, n, 20, v, 100 + checked);
          ++checked;
        }
        for (int iters : {1, 2, 3}) check_case(b, dtype, {3, 5}, 4, iters, v, 200 + checked++);
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(Sinkhorn, ManyIterationsAndManyBlocks) {
  // More iterations than the CUDA backward keeps in shared memory at once (24 per segment in the
  // n = 4 one-thread kernel, 48 in the group kernels), at n = 4 and n = 16; and a batch spanning
  // many CUDA blocks.
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.id == "ref") continue;  // the plain loops have no segments or blocks
    for (SinkhornVariant v : kVariants) {
      check_case(b, DType::kFloat32, {3}, 4, 100, v, 31);
      check_case(b, DType::kFloat32, {2}, 16, 60, v, 32);
      check_case(b, DType::kFloat32, {1000}, 4, 20, v, 33);
      check_case(b, DType::kBFloat16, {129}, 6, 20, v, 34);
    }
  }
}

TEST(Sinkhorn, LargeLogitSpreadStaysFinite) {
  // Logits spread by tens of units: exp(L - rowmax) underflows for some entries; the log
  // variant is made for this, the others must stay finite and accurate too at moderate spreads.
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (SinkhornVariant v : kVariants) check_case(b, DType::kFloat32, {9}, 4, 20, v, 41, 12.0);
  }
}

TEST(Sinkhorn, EmptyBatchesAreNoOps) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (const auto& shape : std::vector<std::vector<int64_t>>{{0, 4, 4}, {3, 0, 0}, {2, 0, 5, 5}}) {
      SCOPED_TRACE(case_name(b.id, DType::kFloat32, shape));
      TestTensor l(DType::kFloat32, shape, b.device), o(DType::kFloat32, shape, b.device);
      sinkhorn_fwd(b.ctx(), {l.view(), o.view(), 20, kEps, SinkhornVariant::kMindSpeed});
      sinkhorn_bwd(b.ctx(), {l.view(), l.view(), o.view(), 20, kEps, SinkhornVariant::kMindSpeed});
    }
  }
}

TEST(Sinkhorn, RepeatedRunsAreBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (SinkhornVariant v : kVariants) {
      SCOPED_TRACE(b.id + " " + sinkhorn_variant_name(v));
      const std::vector<int64_t> shape = {257, 4, 4};
      TestTensor l(DType::kFloat32, shape, b.device), g(DType::kFloat32, shape, b.device);
      l.fill_normal(3);
      g.fill_normal(4);
      TestTensor p1(DType::kFloat32, shape, b.device), p2(DType::kFloat32, shape, b.device);
      TestTensor d1(DType::kFloat32, shape, b.device), d2(DType::kFloat32, shape, b.device);
      for (auto* pair : {&p1, &p2}) sinkhorn_fwd(b.ctx(), {l.view(), pair->view(), 20, kEps, v});
      for (auto* pair : {&d1, &d2}) sinkhorn_bwd(b.ctx(), {l.view(), g.view(), pair->view(), 20, kEps, v});
      EXPECT_EQ(p1.bytes(), p2.bytes());
      EXPECT_EQ(d1.bytes(), d2.bytes());
    }
  }
}

TEST(Sinkhorn, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor l(DType::kFloat32, {2, 4, 4}), o(DType::kFloat32, {2, 4, 4});
  l.fill_normal(1);
  const auto ms = SinkhornVariant::kMindSpeed;
  TestTensor rect(DType::kFloat32, {2, 4, 3});
  expect_error([&] { sinkhorn_fwd(ctx, {rect.view(), rect.view(), 20, kEps, ms}); }, ErrorKind::kValue,
               "sinkhorn: logits must have square last two dims [..., n, n], got [2,4,3]");
  TestTensor big(DType::kFloat32, {1, 17, 17});
  expect_error([&] { sinkhorn_fwd(ctx, {big.view(), big.view(), 20, kEps, ms}); }, ErrorKind::kValue,
               "logits: n = 17 is above the supported maximum of 16");
  TestTensor vec(DType::kFloat32, {4});
  expect_error([&] { sinkhorn_fwd(ctx, {vec.view(), vec.view(), 20, kEps, ms}); }, ErrorKind::kValue,
               "logits must have rank >= 2, got rank 1");
  expect_error([&] { sinkhorn_fwd(ctx, {l.view(), o.view(), 0, kEps, ms}); }, ErrorKind::kValue,
               "num_iters must be >= 1, got 0");
  expect_error([&] { sinkhorn_fwd(ctx, {l.view(), o.view(), 20, -1e-6, ms}); }, ErrorKind::kValue,
               "eps must be a finite number >= 0");
  expect_error([&] { sinkhorn_fwd(ctx, {l.view(), o.view(), 20, std::nan(""), ms}); }, ErrorKind::kValue,
               "eps must be a finite number >= 0");
  expect_error([&] { sinkhorn_fwd(ctx, {l.view(), o.view(), 20, kEps, static_cast<SinkhornVariant>(7)}); },
               ErrorKind::kValue, "variant must be one of \"mindspeed\", \"deepseek\", \"log\"");
  expect_error([&] { parse_sinkhorn_variant("sinkhorn-knopp"); }, ErrorKind::kValue,
               "variant must be one of \"mindspeed\", \"deepseek\", \"log\", got \"sinkhorn-knopp\"");
  TestTensor o_bad(DType::kFloat32, {2, 5, 5});
  expect_error([&] { sinkhorn_fwd(ctx, {l.view(), o_bad.view(), 20, kEps, ms}); }, ErrorKind::kValue,
               "out must have shape [2,4,4] (same as logits), got [2,5,5]");
  TestTensor o_half(DType::kFloat16, {2, 4, 4});
  expect_error([&] { sinkhorn_fwd(ctx, {l.view(), o_half.view(), 20, kEps, ms}); }, ErrorKind::kType,
               "out must have the dtype of logits (float32), got float16");
  TestTensor li(DType::kInt32, {2, 4, 4});
  expect_error([&] { sinkhorn_fwd(ctx, {li.view(), li.view(), 20, kEps, ms}); }, ErrorKind::kType,
               "logits must have dtype in {float32, bfloat16, float16, float64}, got int32");
  TestTensor o42(DType::kFloat32, {2, 2, 2});
  TensorView l_nc = l.strided_view({2, 2, 2}, {16, 4, 1});
  expect_error([&] { sinkhorn_fwd(ctx, {l_nc, o42.view(), 20, kEps, ms}); }, ErrorKind::kValue,
               "logits must be contiguous");
  TestTensor d_bad(DType::kFloat32, {2, 4, 4}), dl(DType::kFloat32, {3, 4, 4});
  expect_error([&] { sinkhorn_bwd(ctx, {l.view(), d_bad.view(), dl.view(), 20, kEps, ms}); },
               ErrorKind::kValue, "dlogits must have shape [2,4,4] (same as logits), got [3,4,4]");
  expect_error([&] { sinkhorn_bwd(ctx, {l.view(), d_bad.view(), o.view(), 0, kEps, ms}); },
               ErrorKind::kValue, "sinkhorn: num_iters must be >= 1, got 0");
}

}  // namespace
}  // namespace fusedops::testing
