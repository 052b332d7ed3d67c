// hc_split_sinkhorn: every runnable backend against an extended-precision oracle written in the
// test (docs/specs/ops.md 3.4 with the Sinkhorn of tests/cpp/ops/mhc_oracle.h), forward, dmixes and the
// parameter gradients (reduced over rows), n = 1..16, the three variants, strided mixes, missing
// output gradients, many rows (many partial sums), empty input, determinism and the errors of
// docs/specs/ops.md 3.5.
#include <cmath>
#include <string>

#include "tests/common/tolerance.h"
#include "tests/cpp/ops/mhc_oracle.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

using mhc_oracle::Sinkhorn;

constexpr const char* kOp = "hc_split_sinkhorn";
constexpr double kEps = 1e-6;

const SinkhornVariant kVariants[] = {SinkhornVariant::kMindSpeed, SinkhornVariant::kDeepSeek,
                                     SinkhornVariant::kLog};

std::vector<DType> dtypes_of(const BackendCase& b) {
  return dtypes_taken(kOp, Direction::kForward, b);
}

struct Inputs {
  std::vector<double> mixes, scale, base, gpre, gpost, gcomb;  // mixes: rows x w
  bool has_pre = true, has_post = true, has_comb = true;
};

struct Outputs {
  std::vector<double> pre, post, comb, dmixes, dscale, dbase;
  // Sum of |terms| of each parameter gradient (the scale of a sum's rounding error).
  std::vector<double> dscale_abs, dbase_abs;
};

// The oracle in precision F; outputs rounded to `out` (the dtype of mixes), parameter gradients
// to `par` (their dtype).
template <class F>
Outputs oracle(const Inputs& in, int64_t rows, int n, int iters, SinkhornVariant v, DType out,
               DType par) {
  const int w = (2 + n) * n;
  Outputs o;
  o.pre.assign(rows * n, 0);
  o.post.assign(rows * n, 0);
  o.comb.assign(rows * n * n, 0);
  o.dmixes.assign(rows * w, 0);
  std::vector<F> ds(3, F(0)), db(w, F(0)), dsa(3, F(0)), dba(w, F(0));
  const F a0 = in.scale[0], a1 = in.scale[1], a2 = in.scale[2], eps = static_cast<F>(kEps);
  auto sig = [](F u) { return F(1) / (F(1) + std::exp(-u)); };
  for (int64_t r = 0; r < rows; ++r) {
    auto m = [&](int e) { return static_cast<F>(in.mixes[r * w + e]); };
    for (int i = 0; i < n; ++i) {
      const F sp = sig(a0 * m(i) + static_cast<F>(in.base[i]));
      const F sq = sig(a1 * m(n + i) + static_cast<F>(in.base[n + i]));
      o.pre[r * n + i] = round_to(out, static_cast<double>(sp + eps));
      o.post[r * n + i] = round_to(out, static_cast<double>(F(2) * sq));
      const F du = (in.has_pre ? static_cast<F>(in.gpre[r * n + i]) : F(0)) * sp * (F(1) - sp);
      const F dv = (in.has_post ? static_cast<F>(in.gpost[r * n + i]) : F(0)) * F(2) * sq * (F(1) - sq);
      o.dmixes[r * w + i] = round_to(out, static_cast<double>(du * a0));
      o.dmixes[r * w + n + i] = round_to(out, static_cast<double>(dv * a1));
      ds[0] += du * m(i);
      ds[1] += dv * m(n + i);
      db[i] += du;
      db[n + i] += dv;
      dsa[0] += std::abs(du * m(i));
      dsa[1] += std::abs(dv * m(n + i));
      dba[i] += std::abs(du);
      dba[n + i] += std::abs(dv);
    }
    std::vector<F> l(n * n), dp(n * n);
    for (int e = 0; e < n * n; ++e) {
      l[e] = a2 * m(2 * n + e) + static_cast<F>(in.base[2 * n + e]);
      dp[e] = in.has_comb ? static_cast<F>(in.gcomb[r * n * n + e]) : F(0);
    }
    Sinkhorn<F> sk(l, n, iters, eps, v);
    const std::vector<F> dz = sk.backward(dp);
    for (int e = 0; e < n * n; ++e) {
      o.comb[r * n * n + e] = round_to(out, static_cast<double>(sk.p[e]));
      o.dmixes[r * w + 2 * n + e] = round_to(out, static_cast<double>(dz[e] * a2));
      ds[2] += dz[e] * m(2 * n + e);
      db[2 * n + e] += dz[e];
      dsa[2] += std::abs(dz[e] * m(2 * n + e));
      dba[2 * n + e] += std::abs(dz[e]);
    }
  }
  for (F x : ds) o.dscale.push_back(round_to(par, static_cast<double>(x)));
  for (F x : db) o.dbase.push_back(round_to(par, static_cast<double>(x)));
  for (F x : dsa) o.dscale_abs.push_back(static_cast<double>(x));
  for (F x : dba) o.dbase_abs.push_back(static_cast<double>(x));
  return o;
}

// The parameter gradients are sums over rows of per-row gradients whose elementwise accuracy the
// policy checks through dmixes. Their error is a random walk of those elementwise errors (the
// plain composite's as much as ours), so against the float64 oracle they are held to the policy
// with the floor applied to the magnitude of the reduction, sum |terms| (the quantity a sum's
// rounding error is proportional to), instead of max |result|.
Verdict check_reduction(const std::vector<double>& ours, const std::vector<double>& base,
                        const std::vector<double>& ref, const std::vector<double>& abs_terms,
                        DType dtype) {
  Verdict v = check_close(ours, base, ref, dtype);
  double scale = 1;
  for (double a : abs_terms) scale = std::max(scale, a);
  double ref_max = 1;
  for (double r : ref) ref_max = std::max(ref_max, std::abs(r));
  v.tol += floor_for(dtype) * (scale - ref_max);
  v.pass = v.err <= v.tol;
  return v;
}

struct CaseOpts {
  int64_t extra_stride = 0;  // mixes rows padded by this many elements (a strided view)
  bool has_pre = true, has_post = true, has_comb = true;
  int64_t grad_pad = 0;  // output gradients' tokens padded by this many elements (strided views)
};

void check_case(const BackendCase& b, DType dtype, std::vector<int64_t> lead, int n, int iters,
                SinkhornVariant v, uint64_t seed, CaseOpts opt = {}) {
  const int w = (2 + n) * n;
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  std::vector<int64_t> mshape = lead, pshape = lead, cshape = lead;
  mshape.push_back(w);
  pshape.push_back(n);
  cshape.push_back(n);
  cshape.push_back(n);
  SCOPED_TRACE(case_name(b.id, dtype, mshape) + " " + sinkhorn_variant_name(v) + " iters " +
               std::to_string(iters) + " stride+" + std::to_string(opt.extra_stride));
  const DType pdt = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  // mixes as a (possibly strided) view of rows of w + extra_stride elements
  TestTensor mbuf(dtype, {rows, w + opt.extra_stride}, b.device);
  const auto mb = mbuf.fill_normal(seed, 0.0, 1.0);
  std::vector<int64_t> mstrides(mshape.size());
  {
    int64_t s = w + opt.extra_stride;
    mstrides.back() = 1;
    for (int d = static_cast<int>(mshape.size()) - 2; d >= 0; --d) {
      mstrides[d] = s;
      s *= mshape[d];
    }
  }
  TensorView mixes = mbuf.strided_view(mshape, mstrides);
  Inputs in;
  in.mixes.resize(rows * w);
  for (int64_t r = 0; r < rows; ++r)
    for (int e = 0; e < w; ++e) in.mixes[r * w + e] = mb[r * (w + opt.extra_stride) + e];
  TestTensor scale(pdt, {3}, b.device), base(pdt, {w}, b.device);
  in.scale = scale.set({0.8, 1.1, 1.3});
  in.base = base.fill_normal(seed + 1, 0.0, 0.5);
  // Output gradients: each token's values contiguous, tokens grad_pad elements apart beyond them.
  const int64_t gp = opt.grad_pad;
  TestTensor gpre(dtype, {rows, n + gp}, b.device), gpost(dtype, {rows, n + gp}, b.device);
  TestTensor gcomb(dtype, {rows, n * n + gp}, b.device);
  auto used = [&](const std::vector<double>& all, int64_t width) {
    std::vector<double> out(rows * width);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < width; ++e) out[r * width + e] = all[r * (width + gp) + e];
    return out;
  };
  auto token_view = [&](const TestTensor& t, const std::vector<int64_t>& shape, int trailing, int64_t width) {
    std::vector<int64_t> st(shape.size());
    int64_t s = 1;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (d == static_cast<int>(shape.size()) - 1 - trailing) s = width + gp;
      st[d] = s;
      s *= shape[d];
    }
    return t.strided_view(shape, st);
  };
  in.gpre = used(gpre.fill_normal(seed + 2), n);
  in.gpost = used(gpost.fill_normal(seed + 3), n);
  in.gcomb = used(gcomb.fill_normal(seed + 4), n * n);
  in.has_pre = opt.has_pre;
  in.has_post = opt.has_post;
  in.has_comb = opt.has_comb;

  TestTensor pre(dtype, pshape, b.device), post(dtype, pshape, b.device), comb(dtype, cshape, b.device);
  TestTensor dmixes(dtype, mshape, b.device), dscale(pdt, {3}, b.device), dbase(pdt, {w}, b.device);
  for (TestTensor* t : {&pre, &post, &comb, &dmixes, &dscale, &dbase}) t->fill_nan();
  const Context ctx = b.ctx();
  hc_split_sinkhorn_fwd(ctx, {mixes, scale.view(), base.view(), pre.view(), post.view(), comb.view(),
                              n, iters, kEps, v});
  HcSplitSinkhornBwdArgs a{mixes, scale.view(), base.view(),
                           opt.has_pre ? token_view(gpre, pshape, 1, n) : TensorView(),
                           opt.has_post ? token_view(gpost, pshape, 1, n) : TensorView(),
                           opt.has_comb ? token_view(gcomb, cshape, 2, n * n) : TensorView(),
                           dmixes.view(), dscale.view(), dbase.view(), TensorView(), n, iters, kEps, v};
  const int64_t ws_bytes = hc_split_sinkhorn_bwd_workspace_size(a);
  TestTensor ws(DType::kFloat32, {std::max<int64_t>(1, ws_bytes / 4)}, b.device);
  ws.fill_nan();
  a.workspace = ws.view();
  hc_split_sinkhorn_bwd(ctx, a);

  const Outputs ref = oracle<long double>(in, rows, n, iters, v, DType::kFloat64, DType::kFloat64);
  const Outputs base_out = dtype == DType::kFloat64
                               ? oracle<double>(in, rows, n, iters, v, DType::kFloat64, DType::kFloat64)
                               : oracle<float>(in, rows, n, iters, v, dtype, DType::kFloat32);
  struct Item {
    const char* name;
    const TestTensor* got;
    const std::vector<double>& base;
    const std::vector<double>& ref;
    DType dt;
  };
  const Item items[] = {{"pre", &pre, base_out.pre, ref.pre, dtype},
                        {"post", &post, base_out.post, ref.post, dtype},
                        {"comb", &comb, base_out.comb, ref.comb, dtype},
                        {"dmixes", &dmixes, base_out.dmixes, ref.dmixes, dtype},
                        {"dhc_scale", &dscale, base_out.dscale, ref.dscale, pdt},
                        {"dhc_base", &dbase, base_out.dbase, ref.dbase, pdt}};
  for (const Item& it : items) {
    const bool reduction = it.got == &dscale || it.got == &dbase;
    Verdict vd = reduction ? check_reduction(it.got->to_double(), it.base, it.ref,
                                             it.got == &dscale ? ref.dscale_abs : ref.dbase_abs, it.dt)
                           : check_close(it.got->to_double(), it.base, it.ref, it.dt);
    EXPECT_TRUE(vd.pass) << it.name << ": " << vd.describe();
  }
  // The two-stage reduction itself: with fp32 mixes, dmixes gives our own per-row gradients
  // (dz = dmixes / a, exact to one rounding), and the parameter gradients must be their sums up
  // to fp32 summation error (a bound of 128 units in the last place of sum |terms|: a dropped or
  // doubled row would be off by a whole row's contribution).
  if (dtype == DType::kFloat32) {
    const auto dm = dmixes.to_double();
    std::vector<long double> ss(3, 0), sb(w, 0), as(3, 0), ab(w, 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int e = 0; e < w; ++e) {
        const int which = e < n ? 0 : e < 2 * n ? 1 : 2;
        const long double dz = dm[r * w + e] / static_cast<long double>(in.scale[which]);
        const long double term = dz * in.mixes[r * w + e];
        ss[which] += term;
        as[which] += std::abs(term);
        sb[e] += dz;
        ab[e] += std::abs(dz);
      }
    const auto got_s = dscale.to_double(), got_b = dbase.to_double();
    const double u = std::ldexp(1.0, -24);
    for (int p = 0; p < 3; ++p)
      EXPECT_LE(std::abs(got_s[p] - static_cast<double>(ss[p])), 128 * u * static_cast<double>(as[p]) + 1e-30)
          << "dhc_scale[" << p << "] is not the sum of the per-row gradients";
    for (int e = 0; e < w; ++e)
      EXPECT_LE(std::abs(got_b[e] - static_cast<double>(sb[e])), 128 * u * static_cast<double>(ab[e]) + 1e-30)
          << "dhc_base[" << e << "] is not the sum of the per-row gradients";
  }
}

TEST(HcSplitSinkhorn, MatchesOracleOnEveryBackendVariantAndSize) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b)) {
      for (SinkhornVariant v : kVariants) {
        for (int n : {1, 2, 4, 6, 16}) check_case(b, dtype, {45}, n, 20, v, 10 + checked++);
        check_case(b, dtype, {2, 3}, 4, 1, v, 10 + checked++);
        check_case(b, dtype, {1}, 4, 3, v, 10 + checked++);
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(HcSplitSinkhornSlow, ManyRowsStridesMissingGradientsAndLongRuns) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (SinkhornVariant v : kVariants) {
      // many partial sums (32 rows each at n = 4, 8 at n = 16); a partial last block
      check_case(b, DType::kFloat32, {301}, 4, 20, v, 51);
      check_case(b, DType::kFloat32, {77}, 16, 20, v, 52);
      // strided rows
      check_case(b, DType::kFloat32, {33}, 4, 20, v, 53, {3});
      check_case(b, DType::kBFloat16, {2, 17}, 3, 20, v, 54, {5});
      // output gradients at a token stride (column slices of one gradient, as autograd gives)
      check_case(b, DType::kFloat32, {70}, 4, 20, v, 60, {0, true, true, true, 7});
      check_case(b, DType::kBFloat16, {3, 11}, 6, 20, v, 61, {2, true, true, true, 3});
      // gradients of some outputs only
      check_case(b, DType::kFloat32, {21}, 4, 20, v, 55, {0, true, false, false});
      check_case(b, DType::kFloat32, {21}, 4, 20, v, 56, {0, false, false, true});
      check_case(b, DType::kFloat32, {21}, 4, 20, v, 57, {0, false, false, false});
      // more iterations than one CUDA history segment holds (20 in the n = 4 one-thread kernel,
      // 44 in the group kernel at n = 4 (log variant), 38 at n = 16)
      if (b.id != "ref") {
        check_case(b, DType::kFloat32, {40}, 4, 100, v, 58);
        check_case(b, DType::kFloat32, {9}, 16, 45, v, 59);
      }
    }
  }
}

TEST(HcSplitSinkhorn, EmptyInputZeroesTheParameterGradients) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    SCOPED_TRACE(b.id);
    const int n = 4, w = 24;
    TestTensor mixes(DType::kFloat32, {0, w}, b.device), scale(DType::kFloat32, {3}, b.device);
    TestTensor base(DType::kFloat32, {w}, b.device), dm(DType::kFloat32, {0, w}, b.device);
    TestTensor ds(DType::kFloat32, {3}, b.device), db(DType::kFloat32, {w}, b.device);
    TestTensor pre(DType::kFloat32, {0, n}, b.device), comb(DType::kFloat32, {0, n, n}, b.device);
    scale.fill_normal(1);
    base.fill_normal(2);
    ds.fill_nan();
    db.fill_nan();
    hc_split_sinkhorn_fwd(b.ctx(), {mixes.view(), scale.view(), base.view(), pre.view(), pre.view(),
                                    comb.view(), n, 20, kEps, SinkhornVariant::kMindSpeed});
    HcSplitSinkhornBwdArgs a{mixes.view(), scale.view(), base.view(), TensorView(), TensorView(),
                             TensorView(), dm.view(), ds.view(), db.view(), TensorView(), n, 20, kEps,
                             SinkhornVariant::kMindSpeed};
    EXPECT_EQ(hc_split_sinkhorn_bwd_workspace_size(a), 0);
    hc_split_sinkhorn_bwd(b.ctx(), a);
    EXPECT_EQ(ds.to_double(), std::vector<double>(3, 0.0));
    EXPECT_EQ(db.to_double(), std::vector<double>(w, 0.0));
  }
}

TEST(HcSplitSinkhorn, RepeatedBackwardIsBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (int n : {4, 16}) {
      SCOPED_TRACE(b.id + " n " + std::to_string(n));
      const int w = (2 + n) * n;
      const int64_t rows = 517;
      TestTensor mixes(DType::kFloat32, {rows, w}, b.device), scale(DType::kFloat32, {3}, b.device);
      TestTensor base(DType::kFloat32, {w}, b.device), gc(DType::kFloat32, {rows, n, n}, b.device);
      TestTensor gp(DType::kFloat32, {rows, n}, b.device);
      mixes.fill_normal(1);
      scale.set({0.5, 0.6, 0.7});
      base.fill_normal(2);
      gc.fill_normal(3);
      gp.fill_normal(4);
      std::vector<std::vector<uint8_t>> runs;
      for (int rep = 0; rep < 2; ++rep) {
        TestTensor dm(DType::kFloat32, {rows, w}, b.device), ds(DType::kFloat32, {3}, b.device);
        TestTensor db(DType::kFloat32, {w}, b.device);
        HcSplitSinkhornBwdArgs a{mixes.view(), scale.view(), base.view(), gp.view(), gp.view(),
                                 gc.view(), dm.view(), ds.view(), db.view(), TensorView(), n, 20,
                                 kEps, SinkhornVariant::kMindSpeed};
        TestTensor ws(DType::kFloat32, {hc_split_sinkhorn_bwd_workspace_size(a) / 4}, b.device);
        a.workspace = ws.view();
        hc_split_sinkhorn_bwd(b.ctx(), a);
        auto bytes = dm.bytes();
        for (auto* t : {&ds, &db}) {
          auto more = t->bytes();
          bytes.insert(bytes.end(), more.begin(), more.end());
        }
        runs.push_back(bytes);
      }
      EXPECT_EQ(runs[0], runs[1]);
    }
  }
}

TEST(HcSplitSinkhorn, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  const auto ms = SinkhornVariant::kMindSpeed;
  TestTensor mixes(DType::kFloat32, {5, 24}), scale(DType::kFloat32, {3}), base(DType::kFloat32, {24});
  TestTensor pre(DType::kFloat32, {5, 4}), post(DType::kFloat32, {5, 4}), comb(DType::kFloat32, {5, 4, 4});
  mixes.fill_normal(1);
  auto fwd = [&](const TensorView& m, const TensorView& s, const TensorView& b, int n, int iters,
                 double eps) {
    hc_split_sinkhorn_fwd(ctx, {m, s, b, pre.view(), post.view(), comb.view(), n, iters, eps, ms});
  };
  TestTensor m23(DType::kFloat32, {5, 23});
  expect_error([&] { fwd(m23.view(), scale.view(), base.view(), 4, 20, kEps); }, ErrorKind::kValue,
               "hc_split_sinkhorn: mixes must have last dim (2+n)*n = 24 for hc_mult 4, got shape [5,23]");
  TestTensor s2(DType::kFloat32, {2});
  expect_error([&] { fwd(mixes.view(), s2.view(), base.view(), 4, 20, kEps); }, ErrorKind::kValue,
               "hc_scale must have shape [3] (alpha_pre, alpha_post, alpha_res), got [2]");
  TestTensor b20(DType::kFloat32, {20});
  expect_error([&] { fwd(mixes.view(), scale.view(), b20.view(), 4, 20, kEps); }, ErrorKind::kValue,
               "hc_base must have shape [24] ((2+n)*n), got [20]");
  expect_error([&] { fwd(mixes.view(), scale.view(), base.view(), 17, 20, kEps); }, ErrorKind::kValue,
               "hc_mult = 17 is outside the supported range [1, 16]");
  expect_error([&] { fwd(mixes.view(), scale.view(), base.view(), 0, 20, kEps); }, ErrorKind::kValue,
               "hc_mult = 0 is outside the supported range [1, 16]");
  expect_error([&] { fwd(mixes.view(), scale.view(), base.view(), 4, 0, kEps); }, ErrorKind::kValue,
               "sinkhorn_iters must be >= 1, got 0");
  expect_error([&] { fwd(mixes.view(), scale.view(), base.view(), 4, 20, -0.5); }, ErrorKind::kValue,
               "eps must be a finite number >= 0");
  TestTensor s16(DType::kBFloat16, {3});
  expect_error([&] { fwd(mixes.view(), s16.view(), base.view(), 4, 20, kEps); }, ErrorKind::kType,
               "hc_scale must have dtype in {float32, float64}, got bfloat16");
  TestTensor b64(DType::kFloat64, {24});
  expect_error([&] { fwd(mixes.view(), scale.view(), b64.view(), 4, 20, kEps); }, ErrorKind::kType,
               "hc_base must have the dtype of hc_scale (float32), got float64");
  TestTensor pre_bad(DType::kFloat32, {5, 3});
  expect_error([&] {
    hc_split_sinkhorn_fwd(ctx, {mixes.view(), scale.view(), base.view(), pre_bad.view(), post.view(),
                                comb.view(), 4, 20, kEps, ms});
  }, ErrorKind::kValue, "pre must have shape [5,4], got [5,3]");
  TestTensor dm(DType::kFloat32, {5, 24}), ds(DType::kFloat32, {3}), db(DType::kFloat32, {24});
  TestTensor ws_small(DType::kFloat32, {2});
  HcSplitSinkhornBwdArgs a{mixes.view(), scale.view(), base.view(), TensorView(), TensorView(),
                           TensorView(), dm.view(), ds.view(), db.view(), ws_small.view(), 4, 20,
                           kEps, ms};
  expect_error([&] { hc_split_sinkhorn_bwd(ctx, a); }, ErrorKind::kValue,
               "workspace must hold at least 108 bytes (hc_split_sinkhorn_bwd_workspace_size), got 8");
  a.workspace = TensorView();
  expect_error([&] { hc_split_sinkhorn_bwd(ctx, a); }, ErrorKind::kValue,
               "workspace is required but was not given");
  // Output gradients: each token's values contiguous, the tokens at one stride.
  TestTensor ws(DType::kFloat32, {27}), g(DType::kFloat32, {5, 4, 4});
  a.workspace = ws.view();
  a.dcomb = g.strided_view({5, 4, 4}, {16, 1, 4});
  expect_error([&] { hc_split_sinkhorn_bwd(ctx, a); }, ErrorKind::kValue,
               "dcomb must have each token's n x n values contiguous and its tokens at one stride, got "
               "strides [16,1,4]");
  a.dcomb = TensorView();
  a.dpre = g.strided_view({5, 4}, {16, 2});
  expect_error([&] { hc_split_sinkhorn_bwd(ctx, a); }, ErrorKind::kValue,
               "dpre must have each token's n values contiguous and its tokens at one stride, got strides [16,2]");
  EXPECT_EQ(hc_split_sinkhorn_partial_rows(4), 32);
  EXPECT_EQ(hc_split_sinkhorn_partial_rows(6), 16);
  EXPECT_EQ(hc_split_sinkhorn_partial_rows(16), 8);
}

}  // namespace
}  // namespace fusedops::testing
