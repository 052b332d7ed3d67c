// Invalid and extreme inputs of the linear-attention gates (gdn_gate, kda_gate, beta_sigmoid),
// the varlen index helpers (prepare_chunk_indices / prepare_chunk_offsets) and the
// context-parallel entry points (la_cp_fwd_summary, la_cp_bwd_summary, la_cp_fold_fwd,
// la_cp_fold_bwd): the C++ side of the "Invalid inputs" tables of
// src/ops/{gated_delta_rule,kda,linear_attention}/README.md (issue 39, item 2).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fusedops/ops/context_parallel.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr int64_t kH = 2, kHV = 2, kK = 8, kV = 8, kBT = 32;

TestTensor ints(DType dt, std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  TestTensor t(dt, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kInt32)
      static_cast<int32_t*>(t.data())[i] = static_cast<int32_t>(v[i]);
    else
      static_cast<int64_t*>(t.data())[i] = v[i];
  }
  return t;
}

std::vector<double> read_ints(const TestTensor& t) {
  std::vector<double> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i)
    out[i] = t.dtype() == DType::kInt32
                 ? static_cast<const int32_t*>(t.data())[i]
                 : static_cast<double>(static_cast<const int64_t*>(t.data())[i]);
  return out;
}

TestTensor normal(std::vector<int64_t> shape, uint64_t seed, double mean = 0.0, double sd = 1.0,
                  DType dt = DType::kFloat32) {
  TestTensor t(dt, std::move(shape));
  t.fill_normal(seed, mean, sd);
  return t;
}

// A view of t's memory with t's shape and strides on `device`; with `halve_last`, its last
// dimension halved and read with stride 2 (a strided last dimension).
TensorView review(const TestTensor& t, Device device, bool halve_last) {
  const TensorView v = t.view();
  std::vector<int64_t> shape(v.ndim()), strides(v.ndim());
  for (int d = 0; d < v.ndim(); ++d) {
    shape[d] = v.size(d);
    strides[d] = v.stride(d);
  }
  if (halve_last) {
    shape.back() /= 2;
    strides.back() = 2;
  }
  return TensorView(t.data(), t.dtype(), device, v.ndim(), shape.data(), strides.data());
}

// A view of t that claims to live on cuda:0 (for the device checks; never dereferenced).
TensorView on_cuda(const TestTensor& t) { return review(t, Device::cuda(0), false); }

// t's first half along the last dimension, read with stride 2 there.
TensorView every_other(const TestTensor& t) { return review(t, t.view().device(), true); }

// ---------------------------------------------------------------------------------------------
// The context-parallel summaries.

struct FwdSeg {
  int64_t Ts;
  TestTensor k, v, g, beta, summary, ws;
  LaCpFwdSummaryArgs a;
  explicit FwdSeg(int64_t ts, bool kda = false, uint64_t seed = 1) : Ts(ts) {
    k = normal({1, Ts, kH, kK}, seed, 0.0, 0.3);
    v = normal({1, Ts, kHV, kV}, seed + 1);
    g = kda ? normal({1, Ts, kHV, kK}, seed + 2, -0.5, 0.1)
            : normal({1, Ts, kHV}, seed + 2, -0.5, 0.1);
    beta = normal({1, Ts, kHV}, seed + 3, 0.5, 0.1);
    summary = TestTensor(DType::kFloat32, {la_cp_summary_size(kHV, kK, kV)});
    summary.set(std::vector<double>(summary.numel(), NAN));
    a.k = k.view();
    a.v = v.view();
    a.g = g.view();
    a.beta = beta.view();
    a.summary = summary.view();
    a.chunk_size = kBT;
  }
  void run(const Context& ctx) {
    ws = TestTensor(DType::kUInt8, {std::max<int64_t>(la_cp_fwd_summary_workspace_size(a), 1)});
    a.workspace = ws.view();
    la_cp_fwd_summary(ctx, a);
  }
};

struct BwdSeg {
  int64_t Ts;
  TestTensor q, k, v, beta, gc, A, dout, dht, dh0, ws;
  LaCpBwdSummaryArgs a;
  explicit BwdSeg(int64_t ts, uint64_t seed = 11) : Ts(ts) {
    q = normal({1, Ts, kH, kK}, seed);
    k = normal({1, Ts, kH, kK}, seed + 1, 0.0, 0.3);
    v = normal({1, Ts, kHV, kV}, seed + 2);
    beta = normal({1, Ts, kHV}, seed + 3, 0.5, 0.1);
    gc = normal({1, Ts, kHV}, seed + 4, -0.1, 0.01);
    A = normal({1, Ts, kHV, kBT}, seed + 5, 0.0, 0.1);
    dout = normal({1, Ts, kHV, kV}, seed + 6);
    dht = normal({1, kHV, kK, kV}, seed + 7);
    dh0 = TestTensor(DType::kFloat32, {1, kHV, kK, kV});
    dh0.set(std::vector<double>(dh0.numel(), NAN));
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.beta = beta.view();
    a.g_cumsum = gc.view();
    a.A = A.view();
    a.dout = dout.view();
    a.dh0 = dh0.view();
    a.scale = 0.5;
    a.chunk_size = kBT;
  }
  void run(const Context& ctx) {
    ws = TestTensor(DType::kUInt8, {std::max<int64_t>(la_cp_bwd_summary_workspace_size(a), 1)});
    a.workspace = ws.view();
    la_cp_bwd_summary(ctx, a);
  }
};

TEST(LaCpInvalid, SummariesRejectBadInputs) {
  const Context ctx = Context::cpu();
  const std::string F = "la_cp_fwd_summary: ", B = "la_cp_bwd_summary: ";
  auto fwd_err = [&](auto change, ErrorKind kind, const std::string& text) {
    FwdSeg s(20);
    change(s);
    expect_error([&] { s.run(ctx); }, kind, F + text);
  };
  auto bwd_err = [&](auto change, ErrorKind kind, const std::string& text) {
    BwdSeg s(20);
    change(s);
    expect_error([&] { s.run(ctx); }, kind, B + text);
  };
  // rank, shape
  TestTensor k3 = normal({20, kH, kK}, 1), k2b = normal({2, 20, kH, kK}, 1),
             v19 = normal({1, 19, kHV, kV}, 1);
  TestTensor g3 = normal({1, 20, 3}, 1), sum10(DType::kFloat32, {10}),
             kbig = normal({1, 20, kH, 300}, 1);
  fwd_err([&](FwdSeg& s) { s.a.k = k3.view(); }, ErrorKind::kValue,
          "k must have rank 4, got rank 3");
  fwd_err([&](FwdSeg& s) { s.a.k = k2b.view(); }, ErrorKind::kValue,
          "the segment must have batch size 1 (one sequence), got B=2");
  fwd_err([&](FwdSeg& s) { s.a.v = v19.view(); }, ErrorKind::kValue,
          "v must have shape [1,20,2,8], got [1,19,2,8]");
  fwd_err([&](FwdSeg& s) { s.a.g = g3.view(); }, ErrorKind::kValue,
          "g must have shape [1,20,2], got [1,20,3]");
  fwd_err([&](FwdSeg& s) { s.a.summary = sum10.view(); }, ErrorKind::kValue,
          "summary must have shape [256], got [10]");
  fwd_err([&](FwdSeg& s) { s.a.k = kbig.view(); }, ErrorKind::kValue, "K must be in [1, 256]");
  TestTensor q3 = normal({20, kH, kK}, 1), A16 = normal({1, 20, kHV, 16}, 1),
             dht9 = normal({1, kHV, kK, 9}, 1);
  bwd_err([&](BwdSeg& s) { s.a.q = q3.view(); }, ErrorKind::kValue,
          "q must have rank 4, got rank 3");
  bwd_err([&](BwdSeg& s) { s.a.A = A16.view(); }, ErrorKind::kValue,
          "A must have shape [1,20,2,32], got [1,20,2,16]");
  bwd_err([&](BwdSeg& s) { s.a.dht = dht9.view(); }, ErrorKind::kValue,
          "dht must have shape [1,2,8,8], got [1,2,8,9]");
  bwd_err([&](BwdSeg& s) { s.a.Aqk = s.A.view(); }, ErrorKind::kValue, "Aqk is KDA's");
  // dtype
  TestTensor ki(DType::kInt32, {1, 20, kH, kK}),
      vb = normal({1, 20, kHV, kV}, 1, 0, 1, DType::kBFloat16);
  TestTensor s64(DType::kFloat64, {la_cp_summary_size(kHV, kK, kV)}),
      di(DType::kInt32, {1, 20, kHV, kV});
  fwd_err([&](FwdSeg& s) { s.a.k = ki.view(); }, ErrorKind::kType, "k must have dtype in");
  fwd_err([&](FwdSeg& s) { s.a.v = vb.view(); }, ErrorKind::kType,
          "v must have the dtype of k (float32), got bfloat16");
  fwd_err([&](FwdSeg& s) { s.a.summary = s64.view(); }, ErrorKind::kValue,
          "summary must be float32, got float64");
  bwd_err([&](BwdSeg& s) { s.a.dout = di.view(); }, ErrorKind::kType, "dout must have dtype in");
  // device
  fwd_err([&](FwdSeg& s) { s.a.v = on_cuda(s.v); }, ErrorKind::kValue, "v must be on cpu");
  bwd_err([&](BwdSeg& s) { s.a.dout = on_cuda(s.dout); }, ErrorKind::kValue, "dout must be on cpu");
  // layout: a strided last dimension; non-contiguous outputs
  TestTensor kw = normal({1, 20, kH, 2 * kK}, 1),
             sw(DType::kFloat32, {2 * la_cp_summary_size(kHV, kK, kV)});
  TestTensor qw = normal({1, 20, kH, 2 * kK}, 1), dhw(DType::kFloat32, {1, kHV, kK, 2 * kV});
  fwd_err([&](FwdSeg& s) { s.a.k = every_other(kw); }, ErrorKind::kValue,
          "k must have a contiguous last dimension (stride 1)");
  fwd_err([&](FwdSeg& s) { s.a.summary = every_other(sw); }, ErrorKind::kValue,
          "summary must be contiguous");
  bwd_err([&](BwdSeg& s) { s.a.q = every_other(qw); }, ErrorKind::kValue,
          "q must have a contiguous last dimension (stride 1)");
  bwd_err([&](BwdSeg& s) { s.a.dh0 = every_other(dhw); }, ErrorKind::kValue,
          "dh0 must be contiguous");
  // values: chunk sizes (0 divided the dimensions before the check: SIGFPE), flags, scale,
  // workspace
  for (int64_t bad : {0, -1, 7}) {
    fwd_err([&](FwdSeg& s) { s.a.chunk_size = bad; }, ErrorKind::kValue,
            "chunk_size must be 16, 32 or 64, got " + std::to_string(bad));
    bwd_err([&](BwdSeg& s) { s.a.chunk_size = bad; }, ErrorKind::kValue,
            "chunk_size must be 16, 32 or 64, got " + std::to_string(bad));
  }
  fwd_err([&](FwdSeg& s) { s.a.allow_neg_eigval = true; }, ErrorKind::kValue,
          "allow_neg_eigval requires use_beta_sigmoid_in_kernel");
  fwd_err([&](FwdSeg& s) { s.a.use_gate_in_kernel = true; }, ErrorKind::kValue,
          "use_gate_in_kernel requires A_log");
  bwd_err([&](BwdSeg& s) { s.a.scale = NAN; }, ErrorKind::kValue, "scale must be finite");
  {
    FwdSeg s(20);
    TestTensor small(DType::kUInt8, {10});
    s.a.workspace = small.view();
    expect_error([&] { la_cp_fwd_summary(ctx, s.a); }, ErrorKind::kValue,
                 F + "workspace must hold at least");
  }
}

TEST(LaCpInvalid, SummariesOfEmptySegmentsAndNonFiniteInputs) {
  const Context ctx = Context::cpu();
  const int64_t M = kHV * kK * kK;
  for (bool kda : {false, true}) {  // no tokens: M = I, S_loc = 0
    FwdSeg s(0, kda);
    s.run(ctx);
    const auto got = s.summary.to_double();
    for (int64_t i = 0; i < M; ++i) EXPECT_EQ(got[i], (i % kK) == ((i / kK) % kK) ? 1.0 : 0.0) << i;
    for (size_t i = M; i < got.size(); ++i) EXPECT_EQ(got[i], 0.0) << i;
  }
  {
    BwdSeg s(0);
    s.run(ctx);
    for (double x : s.dh0.to_double()) EXPECT_EQ(x, 0.0);
    BwdSeg t(0);
    t.a.dht = t.dht.view();
    t.run(ctx);
    EXPECT_EQ(t.dh0.to_double(), t.dht.to_double());
  }
  // NaN in value channel 5 of one token (head 0): S_loc NaN in that column only, M clean.
  FwdSeg clean(20);
  clean.run(ctx);
  FwdSeg s(20);
  float* v = static_cast<float*>(s.v.data());
  v[((0 * 20 + 3) * kHV + 0) * kV + 5] = NAN;
  s.run(ctx);
  const auto c = clean.summary.to_double(), got = s.summary.to_double();
  int nans = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool want_nan =
        static_cast<int64_t>(i) >= M && (i - M) / (kK * kV) == 0 && (i - M) % kV == 5;
    EXPECT_EQ(std::isnan(got[i]), want_nan) << i;
    nans += std::isnan(got[i]);
    if (!want_nan) {
      EXPECT_EQ(got[i], c[i]) << i;
    }
  }
  EXPECT_EQ(nans, kK);
  // NaN in one token's dout of head 0: L NaN in head 0 only.
  BwdSeg b(20);
  static_cast<float*>(b.dout.data())[((0 * 20 + 3) * kHV + 0) * kV + 0] = NAN;
  b.run(ctx);
  const auto L = b.dh0.to_double();
  bool head0 = false;
  for (size_t i = 0; i < L.size(); ++i) {
    if (static_cast<int64_t>(i) < kK * kV)
      head0 = head0 || std::isnan(L[i]);
    else
      EXPECT_FALSE(std::isnan(L[i])) << i;
  }
  EXPECT_TRUE(head0);
}

// ---------------------------------------------------------------------------------------------
// The folds.

TEST(LaCpInvalid, FoldsRejectBadInputsAndHandleEmptyAndNonFinite) {
  const Context ctx = Context::cpu();
  const int64_t R = 3, W = la_cp_summary_size(kHV, kK, kV);
  TestTensor S = normal({R, W}, 21, 0.0, 0.3), L = normal({R, kHV * kK * kV}, 22),
             h0 = normal({kHV, kK, kV}, 23);
  TestTensor st(DType::kFloat32, {kHV, kK, kV});
  auto ff = [&](TensorView s, TensorView h, int64_t lo, int64_t hi, TensorView out) {
    la_cp_fold_fwd(ctx, {s, h, lo, hi, out});
  };
  auto fb = [&](TensorView s, TensorView l, int64_t lo, int64_t hi, TensorView out) {
    la_cp_fold_bwd(ctx, {s, l, lo, hi, out});
  };
  const TensorView none;
  const std::string F = "la_cp_fold_fwd: ", B = "la_cp_fold_bwd: ";
  // rank, shape, dtype, device, layout
  TestTensor s1(DType::kFloat32, {W}), sw(DType::kFloat32, {R, W - 1}),
      st2(DType::kFloat32, {kHV * kK, kV});
  TestTensor h9(DType::kFloat32, {kHV, kK, kV + 1}), sb(DType::kBFloat16, {R, W}),
      hi32(DType::kInt32, {kHV, kK, kV});
  TestTensor st64(DType::kFloat64, {kHV, kK, kV}), L2(DType::kFloat32, {2, kHV * kK * kV}),
      L64(DType::kFloat64, {R, kHV * kK * kV});
  TestTensor S2 = normal({R, 2 * W}, 1), h2 = normal({kHV, kK, 2 * kV}, 1),
             st2w(DType::kFloat32, {kHV, kK, 2 * kV});
  expect_error([&] { ff(s1.view(), none, 0, 1, st.view()); }, ErrorKind::kValue,
               F + "summaries must have rank 2, got rank 1");
  expect_error([&] { ff(S.view(), none, 0, 1, st2.view()); }, ErrorKind::kValue,
               F + "state must have rank 3");
  expect_error([&] { ff(sw.view(), none, 0, 1, st.view()); }, ErrorKind::kValue,
               F + "summaries must have shape [3,256]");
  expect_error([&] { ff(S.view(), h9.view(), 0, 1, st.view()); }, ErrorKind::kValue,
               F + "h0 must have shape [2,8,8], got [2,8,9]");
  expect_error([&] { fb(S.view(), L2.view(), 0, 1, st.view()); }, ErrorKind::kValue,
               B + "dh0s must have shape [3,128]");
  expect_error([&] { ff(sb.view(), none, 0, 1, st.view()); }, ErrorKind::kType,
               F + "summaries must have dtype in {float32, float64}");
  expect_error([&] { ff(S.view(), hi32.view(), 0, 1, st.view()); }, ErrorKind::kType,
               F + "h0 must have dtype in");
  expect_error([&] { ff(S.view(), none, 0, 1, st64.view()); }, ErrorKind::kValue,
               F + "state must be float32, got float64");
  expect_error([&] { fb(S.view(), L64.view(), 0, 1, st.view()); }, ErrorKind::kType,
               B + "dh0s must have the dtype of summaries");
  expect_error([&] { ff(on_cuda(S), none, 0, 1, st.view()); }, ErrorKind::kValue,
               F + "summaries must be on cpu");
  expect_error([&] { fb(S.view(), on_cuda(L), 0, 1, st.view()); }, ErrorKind::kValue,
               B + "dh0s must be on cpu");
  expect_error([&] { ff(every_other(S2), none, 0, 1, st.view()); }, ErrorKind::kValue,
               F + "summaries must be contiguous");
  expect_error([&] { ff(S.view(), every_other(h2), 0, 1, st.view()); }, ErrorKind::kValue,
               F + "h0 must be contiguous");
  expect_error([&] { ff(S.view(), none, 0, 1, every_other(st2w)); }, ErrorKind::kValue,
               F + "state must be contiguous");
  // values: the range
  for (auto [lo, hi] : std::vector<std::pair<int64_t, int64_t>>{{2, 1}, {0, 4}, {-1, 1}}) {
    const std::string msg =
        "the fold range must satisfy 0 <= lo <= hi <= R=3, got lo=" + std::to_string(lo) +
        ", hi=" + std::to_string(hi);
    expect_error([&] { ff(S.view(), none, lo, hi, st.view()); }, ErrorKind::kValue, F + msg);
    expect_error([&] { fb(S.view(), L.view(), lo, hi, st.view()); }, ErrorKind::kValue, B + msg);
  }
  // empty: an empty range gives h0 (0 without it) and a zero gradient; R = 0; HV = 0
  for (int64_t lo = 0; lo <= R; ++lo) {
    ff(S.view(), h0.view(), lo, lo, st.view());
    EXPECT_EQ(st.to_double(), h0.to_double());
    fb(S.view(), L.view(), lo, lo, st.view());
    for (double x : st.to_double()) EXPECT_EQ(x, 0.0);
  }
  const TensorView none_rows(S.data(), DType::kFloat32, Device::cpu(), {0, W});
  ff(none_rows, h0.view(), 0, 0, st.view());
  EXPECT_EQ(st.to_double(), h0.to_double());
  TestTensor s0(DType::kFloat32, {R, 0}), st0(DType::kFloat32, {0, kK, kV});
  ff(s0.view(), none, 0, R, st0.view());
  // nonfinite: a NaN in rank 1's summary reaches the folds that cross rank 1 only
  static_cast<float*>(S.data())[W + 5] = NAN;
  ff(S.view(), none, 0, 3, st.view());
  bool any = false;
  for (double x : st.to_double()) any = any || std::isnan(x);
  EXPECT_TRUE(any);
  ff(S.view(), none, 2, 3, st.view());
  for (double x : st.to_double()) EXPECT_TRUE(std::isfinite(x));
  static_cast<float*>(L.data())[kHV * kK * kV + 7] = INFINITY;
  fb(S.view(), L.view(), 2, 3, st.view());
  for (double x : st.to_double()) EXPECT_TRUE(std::isfinite(x));
  fb(S.view(), L.view(), 1, 3, st.view());
  any = false;
  for (double x : st.to_double()) any = any || !std::isfinite(x);
  EXPECT_TRUE(any);
}

// ---------------------------------------------------------------------------------------------
// The gates and beta_sigmoid.

TEST(LaGateInvalid, GatesAndBetaSigmoid) {
  const Context ctx = Context::cpu();
  const int64_t Bn = 2, T = 5, HV = 3, K = 4;
  TestTensor g = normal({Bn, T, HV}, 31), A = normal({HV}, 32), b = normal({HV}, 35),
             y(DType::kFloat32, {Bn, T, HV});
  TestTensor gk = normal({Bn, T, HV, K}, 33), bk = normal({HV * K}, 34),
             yk(DType::kFloat32, {Bn, T, HV, K});
  TestTensor A4 = normal({4}, 1), gi(DType::kInt64, {Bn, T, HV}), Ai(DType::kInt64, {HV}),
             y4(DType::kFloat32, {Bn, T, 4});
  TestTensor r0(DType::kFloat32, {}), yi(DType::kInt32, {Bn, T, HV}), g3k = normal({Bn, T, HV}, 1);
  const TensorView none;
  auto gdn = [&](TensorView gg, TensorView aa, TensorView bb, TensorView yy) {
    gdn_gate_fwd(ctx, {gg, aa, bb, yy});
  };
  auto kdag = [&](TensorView gg, TensorView aa, TensorView bb, TensorView yy, bool lb = false,
                  double l = 0.0) {
    kda_gate_fwd(ctx, {gg, aa, bb, yy, lb, l});
  };
  auto bs = [&](TensorView x, TensorView yy, bool neg = false) {
    beta_sigmoid_fwd(ctx, {x, yy, neg});
  };
  // rank, shape, dtype
  expect_error([&] { gdn(r0.view(), A.view(), b.view(), r0.view()); }, ErrorKind::kValue,
               "gdn_gate: g must have rank >= 1");
  expect_error([&] { kdag(g3k.view(), A.view(), bk.view(), y.view()); }, ErrorKind::kValue,
               "kda_gate: g must have rank 4");
  expect_error([&] { bs(r0.view(), r0.view()); }, ErrorKind::kValue,
               "beta_sigmoid: x must have rank >= 1");
  expect_error([&] { gdn(g.view(), A4.view(), b.view(), y.view()); }, ErrorKind::kValue,
               "gdn_gate: A_log must have shape [3], got [4]");
  expect_error([&] { kdag(gk.view(), A4.view(), bk.view(), yk.view()); }, ErrorKind::kValue,
               "kda_gate: A_log must have shape [3], got [4]");
  expect_error([&] { kdag(gk.view(), A.view(), b.view(), yk.view()); }, ErrorKind::kValue,
               "kda_gate: dt_bias must be a contiguous tensor of HV*K=12 elements");
  expect_error([&] { bs(g.view(), y4.view()); }, ErrorKind::kValue,
               "beta_sigmoid: y must have shape [2,5,3], got [2,5,4]");
  {  // the backwards' dy of another shape than g
    TestTensor dA(DType::kFloat32, {HV}), db(DType::kFloat32, {HV}), dbk(DType::kFloat32, {HV * K});
    TestTensor yk5(DType::kFloat32, {Bn, T, HV, K + 1});
    expect_error(
        [&] {
          gdn_gate_bwd(ctx,
                       {g.view(), A.view(), b.view(), y4.view(), y.view(), dA.view(), db.view()});
        },
        ErrorKind::kValue, "gdn_gate: dy must have shape [2,5,3], got [2,5,4]");
    expect_error(
        [&] {
          kda_gate_bwd(
              ctx, {gk.view(), A.view(), bk.view(), yk5.view(), yk.view(), dA.view(), dbk.view()});
        },
        ErrorKind::kValue, "kda_gate: dy must have shape [2,5,3,4], got [2,5,3,5]");
  }
  expect_error([&] { gdn(gi.view(), A.view(), b.view(), y.view()); }, ErrorKind::kType,
               "gdn_gate: g must have dtype in");
  expect_error([&] { gdn(g.view(), Ai.view(), b.view(), y.view()); }, ErrorKind::kType,
               "gdn_gate: A_log must have dtype in");
  expect_error([&] { bs(g.view(), yi.view()); }, ErrorKind::kType,
               "beta_sigmoid: y must have dtype in");
  // device
  expect_error([&] { gdn(g.view(), on_cuda(A), b.view(), y.view()); }, ErrorKind::kValue,
               "gdn_gate: A_log must be on cpu");
  expect_error([&] { kdag(on_cuda(gk), A.view(), bk.view(), yk.view()); }, ErrorKind::kValue,
               "kda_gate: g must be on cpu");
  expect_error([&] { bs(g.view(), on_cuda(y)); }, ErrorKind::kValue,
               "beta_sigmoid: y must be on cpu");
  // layout: a strided last dimension of the input; a non-contiguous output
  TestTensor gw = normal({Bn, T, 2 * HV}, 1), yw(DType::kFloat32, {Bn, T, 2 * HV});
  expect_error([&] { gdn(every_other(gw), A.view(), b.view(), y.view()); }, ErrorKind::kValue,
               "gdn_gate: g must have a contiguous last dimension");
  expect_error([&] { bs(every_other(gw), y.view()); }, ErrorKind::kValue,
               "beta_sigmoid: x must have a contiguous last dimension");
  expect_error([&] { bs(g.view(), every_other(yw)); }, ErrorKind::kValue,
               "beta_sigmoid: y must be contiguous");
  // empty
  TestTensor e(DType::kFloat32, {0, T, HV}), ek(DType::kFloat32, {Bn, 0, HV, K});
  gdn(e.view(), A.view(), b.view(), e.view());
  kdag(ek.view(), A.view(), bk.view(), ek.view());
  bs(e.view(), e.view());
  // values: the lower-bound form's options
  expect_error([&] { kdag(gk.view(), A.view(), bk.view(), yk.view(), true, NAN); },
               ErrorKind::kValue, "kda_gate: lower_bound must be finite");
  expect_error([&] { kdag(gk.view(), none, bk.view(), yk.view()); }, ErrorKind::kValue,
               "kda_gate: A_log is required unless lower_bound is set");
  TestTensor big(DType::kFloat32, {1, 5, 1}), Az(DType::kFloat32, {1}),
      yb(DType::kFloat32, {1, 5, 1});
  big.set({-1e4, -88.0, 0.0, 88.0, 1e4});
  Az.set({0.0});
  gdn(big.view(), Az.view(), none, yb.view());
  for (double x : yb.to_double()) EXPECT_TRUE(std::isfinite(x) && x <= 0.0) << x;
  bs(big.view(), yb.view(), true);
  for (double x : yb.to_double()) EXPECT_TRUE(x >= 0.0 && x <= 2.0) << x;
  // nonfinite: NaN stays NaN; +Inf saturates like the float64 reference; clean entries untouched
  TestTensor nf(DType::kFloat32, {1, 1, 3}), yn(DType::kFloat32, {1, 1, 3}),
      yr(DType::kFloat64, {1, 1, 3});
  nf.set({NAN, INFINITY, -INFINITY});
  TestTensor A3(DType::kFloat32, {3});
  A3.set({0.0, 0.0, 0.0});
  for (auto fn : {0, 1}) {
    if (fn == 0) {
      gdn(nf.view(), A3.view(), none, yn.view());
      gdn_gate_fwd_ref(ctx, {nf.view(), A3.view(), none, yr.view()});
    } else {
      bs(nf.view(), yn.view());
      beta_sigmoid_fwd_ref(ctx, {nf.view(), yr.view(), false});
    }
    const auto got = yn.to_double(), want = yr.to_double();
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i])) << fn << " " << i;
      if (!std::isnan(want[i])) {
        EXPECT_EQ(got[i], want[i]) << fn << " " << i;
      }
    }
    EXPECT_TRUE(std::isnan(got[0]));
  }
}

// ---------------------------------------------------------------------------------------------
// prepare_chunk_indices / prepare_chunk_offsets.

TEST(LaGateInvalid, IndexHelpers) {
  TestTensor cu = ints(DType::kInt64, {4}, {0, 5, 5, 9}), ci(DType::kInt64, {3, 2}),
             co(DType::kInt64, {4});
  const std::string I = "prepare_chunk_indices: ", O = "prepare_chunk_offsets: ";
  // rank, shape, dtype, device, layout
  TestTensor cu2 = ints(DType::kInt64, {1, 3}, {0, 5, 9}), cuf(DType::kFloat32, {3}),
             ci32(DType::kInt32, {3, 2});
  TestTensor ci4(DType::kInt64, {4, 2}), co3(DType::kInt64, {3}), cu0(DType::kInt64, {0});
  expect_error([&] { prepare_chunk_indices(cu2.view(), 4, ci.view()); }, ErrorKind::kValue,
               I + "cu_seqlens must have rank 1");
  expect_error([&] { prepare_chunk_offsets(cu0.view(), 4, co.view()); }, ErrorKind::kValue,
               O + "cu_seqlens must be a contiguous [N+1] tensor with N+1 >= 1");
  expect_error([&] { prepare_chunk_indices(cu.view(), 4, ci4.view()); }, ErrorKind::kValue,
               I + "chunk_indices must have shape [3,2], got [4,2]");
  expect_error([&] { prepare_chunk_offsets(cu.view(), 4, co3.view()); }, ErrorKind::kValue,
               O + "chunk_offsets must have shape [4], got [3]");
  expect_error([&] { prepare_chunk_indices(cuf.view(), 4, ci.view()); }, ErrorKind::kType,
               I + "cu_seqlens must have dtype in {int32, int64}");
  expect_error([&] { prepare_chunk_indices(cu.view(), 4, ci32.view()); }, ErrorKind::kType,
               I + "chunk_indices must have the dtype of cu_seqlens");
  expect_error([&] { prepare_chunk_indices(on_cuda(cu), 4, ci.view()); }, ErrorKind::kValue,
               I + "cu_seqlens must be a CPU tensor here");
  expect_error([&] { prepare_chunk_offsets(cu.view(), 4, on_cuda(co)); }, ErrorKind::kValue,
               O + "chunk_offsets must be a contiguous CPU tensor");
  TestTensor cuw = ints(DType::kInt64, {8}, {0, 0, 5, 0, 5, 0, 9, 0}), cow(DType::kInt64, {8});
  expect_error([&] { prepare_chunk_indices(every_other(cuw), 4, ci.view()); }, ErrorKind::kValue,
               I + "cu_seqlens must be a contiguous [N+1] tensor");
  expect_error([&] { prepare_chunk_offsets(cu.view(), 4, every_other(cow)); }, ErrorKind::kValue,
               O + "chunk_offsets must be a contiguous CPU tensor");
  // values
  for (int64_t bad : {0, -4}) {
    expect_error([&] { prepare_chunk_indices(cu.view(), bad, ci.view()); }, ErrorKind::kValue,
                 I + "chunk_size must be >= 1, got " + std::to_string(bad));
    expect_error([&] { prepare_chunk_offsets(cu.view(), bad, co.view()); }, ErrorKind::kValue,
                 O + "chunk_size must be >= 1, got " + std::to_string(bad));
  }
  TestTensor dec = ints(DType::kInt64, {3}, {0, 5, 2}), start = ints(DType::kInt64, {2}, {1, 5});
  expect_error([&] { prepare_chunk_offsets(dec.view(), 4, co3.view()); }, ErrorKind::kValue,
               O + "cu_seqlens must be non-decreasing, got cu_seqlens[1]=5 > cu_seqlens[2]=2");
  expect_error([&] { prepare_chunk_indices(start.view(), 4, ci.view()); }, ErrorKind::kValue,
               I + "cu_seqlens must start at 0, got 1");
  // the tables, with an empty sequence; N = 0 sequences
  prepare_chunk_indices(cu.view(), 4, ci.view());
  prepare_chunk_offsets(cu.view(), 4, co.view());
  EXPECT_EQ(read_ints(ci), (std::vector<double>{0, 0, 0, 1, 2, 0}));
  EXPECT_EQ(read_ints(co), (std::vector<double>{0, 2, 2, 3}));
  TestTensor one = ints(DType::kInt64, {1}, {0}), ci0(DType::kInt64, {0, 2}),
             co1(DType::kInt64, {1});
  prepare_chunk_indices(one.view(), 4, ci0.view());
  prepare_chunk_offsets(one.view(), 4, co1.view());
  EXPECT_EQ(read_ints(co1), std::vector<double>{0});
  // int32: a sequence of 2^31 - 1 tokens in an int32 cu_seqlens (the chunk count without overflow)
  TestTensor big = ints(DType::kInt32, {2}, {0, 2147483647}), cib(DType::kInt32, {2, 2}),
             cob(DType::kInt32, {2});
  EXPECT_EQ(varlen_chunk_count(big.view(), int64_t(1) << 30), 2);
  prepare_chunk_indices(big.view(), int64_t(1) << 30, cib.view());
  prepare_chunk_offsets(big.view(), int64_t(1) << 30, cob.view());
  EXPECT_EQ(read_ints(cib), (std::vector<double>{0, 0, 0, 1}));
  EXPECT_EQ(read_ints(cob), (std::vector<double>{0, 2}));
}

// ---------------------------------------------------------------------------------------------
// Element counts past 2^31 (CUDA only: a CPU run would need the same host memory and minutes of
// CI time).

constexpr const char* kLargeReason =
    "2^31 elements need >= 8 GiB: CUDA only (a CPU run would need the same host memory and "
    "minutes of CI time)";

bool large_tests_run() {
#ifdef FUSEDOPS_WITH_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

#ifdef FUSEDOPS_WITH_CUDA
void fold_past_2pow31() {
  const Device d = Device::cuda(0);
  const Context ctx = Context::cuda(0);
  // R = 2049 ranks of HV*K*(K+V) = 2^20 values: 2^31 + 2^20 elements. Folding the last rank alone
  // must equal folding a copy of it at row 0 (64-bit row offsets).
  const int64_t HV = 32, K = 128, V = 128, R = 2049, W = la_cp_summary_size(HV, K, V);
  void* big = nullptr;
  ASSERT_EQ(cudaMalloc(&big, static_cast<size_t>(R * W) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(big, 0, static_cast<size_t>(R * W) * 4), cudaSuccess);
  TestTensor last(DType::kFloat32, {1, W}, d), st(DType::kFloat32, {HV, K, V}, d),
      want(DType::kFloat32, {HV, K, V}, d);
  last.fill_normal(41, 0.0, 0.1);
  ASSERT_EQ(cudaMemcpy(static_cast<float*>(big) + (R - 1) * W, last.data(), W * 4,
                       cudaMemcpyDeviceToDevice),
            cudaSuccess);
  const TensorView summaries(big, DType::kFloat32, d, {R, W});
  la_cp_fold_fwd(ctx, {summaries, TensorView(), R - 1, R, st.view()});
  la_cp_fold_fwd(ctx, {last.view(), TensorView(), 0, 1, want.view()});
  const auto a = st.to_double(), b = want.to_double();
  EXPECT_EQ(a, b);
  double norm = 0;
  for (double x : b) norm += std::abs(x);
  EXPECT_GT(norm, 0.0);
  // The backward fold reads the same rows of M: L of R ranks (all zero but the last).
  void* Ls = nullptr;
  const int64_t WL = HV * K * V;
  ASSERT_EQ(cudaMalloc(&Ls, static_cast<size_t>(R * WL) * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(Ls, 0, static_cast<size_t>(R * WL) * 4), cudaSuccess);
  TestTensor l1(DType::kFloat32, {1, WL}, d);
  l1.fill_normal(44);
  ASSERT_EQ(cudaMemcpy(static_cast<float*>(Ls) + (R - 1) * WL, l1.data(), WL * 4,
                       cudaMemcpyDeviceToDevice),
            cudaSuccess);
  la_cp_fold_bwd(ctx,
                 {summaries, TensorView(Ls, DType::kFloat32, d, {R, WL}), R - 1, R, st.view()});
  la_cp_fold_bwd(ctx, {last.view(), l1.view(), 0, 1, want.view()});
  EXPECT_EQ(st.to_double(), want.to_double());
  cudaFree(Ls);
  cudaFree(big);
}

void gates_past_2pow31() {
  const Device d = Device::cuda(0);
  const Context ctx = Context::cuda(0);
  // g of one row [1,HV] broadcast (stride 0) to 2^31/HV + 2 rows; the outputs are real: their
  // last row must equal their first.
  const int64_t HV = 8, rows = (int64_t(1) << 31) / HV + 2;
  TestTensor g1(DType::kFloat32, {1, HV}, d), A(DType::kFloat32, {HV}, d);
  g1.fill_normal(42);
  A.fill_normal(43);
  const int64_t shape[2] = {rows, HV}, gst[2] = {0, 1}, yst[2] = {HV, 1};
  const TensorView g(g1.data(), DType::kFloat32, d, 2, shape, gst);
  void* y = nullptr;
  const size_t row = static_cast<size_t>(HV) * 4;
  ASSERT_EQ(cudaMalloc(&y, static_cast<size_t>(rows) * row), cudaSuccess);
  const TensorView yv(y, DType::kFloat32, d, 2, shape, yst);
  for (int op = 0; op < 2; ++op) {
    if (op == 0)
      gdn_gate_fwd(ctx, {g, A.view(), TensorView(), yv});
    else
      beta_sigmoid_fwd(ctx, {g, yv, false});
    std::vector<uint8_t> first(row), lastrow(row);
    ASSERT_EQ(cudaMemcpy(first.data(), y, row, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lastrow.data(), static_cast<uint8_t*>(y) + (rows - 1) * row, row,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(first, lastrow) << op;
  }
  cudaFree(y);
}
#endif

TEST(LaCpInvalid, FoldPast2Pow31ElementsOnCuda) {
  if (!large_tests_run()) GTEST_SKIP() << kLargeReason;
#ifdef FUSEDOPS_WITH_CUDA
  fold_past_2pow31();
#endif
}

TEST(LaGateInvalid, OutputsPast2Pow31ElementsOnCuda) {
  if (!large_tests_run()) GTEST_SKIP() << kLargeReason;
#ifdef FUSEDOPS_WITH_CUDA
  gates_past_2pow31();
#endif
}

}  // namespace
}  // namespace fusedops::testing
