// Context-parallel summaries and folds (include/fusedops/ops/context_parallel.h) against float64
// oracles written here from the per-token recurrence:
//   S_t = A_t S_{t-1} + beta_t k_t v_t^T,  A_t = (I - beta_t k_t k_t^T) D_t,  D_t = e^{g_t} I (GDN)
//   or diag(e^{g_t,c}) (KDA);  o_t = scale S_t^T q_t.
// la_cp_fwd_summary gives M = A_T...A_1 and S_loc (the end state from 0); la_cp_bwd_summary gives
// L = dS_0 for dout and dht (X = dht; for t = T..1: X += scale q_t dO_t^T; X = A_t^T X); the folds
// chain them. Every runnable backend of the folds; the summaries on each CPU backend (they are
// compositions of sub-operators dispatched on the context's backend).
#include <cmath>
#include <vector>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

struct Seg {
  int64_t T, H, HV, K, V;
  bool kda;
};

// Inputs of one segment, as doubles and as tensors of `dtype` (B = 1).
struct SegData {
  TestTensor q, k, v, g, beta, dout, dht;
  std::vector<double> qd, kd, vd, gd, bd, dod, dhd;
};

SegData make_seg(const Seg& s, DType dtype, uint64_t seed) {
  SegData d;
  d.q = TestTensor(dtype, {1, s.T, s.H, s.K});
  d.k = TestTensor(dtype, {1, s.T, s.H, s.K});
  d.v = TestTensor(dtype, {1, s.T, s.HV, s.V});
  d.g = TestTensor(dtype, s.kda ? std::vector<int64_t>{1, s.T, s.HV, s.K} : std::vector<int64_t>{1, s.T, s.HV});
  d.beta = TestTensor(dtype, {1, s.T, s.HV});
  d.dout = TestTensor(dtype, {1, s.T, s.HV, s.V});
  const DType acc = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  d.dht = TestTensor(acc, {1, s.HV, s.K, s.V});
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> n01(0, 1);
  std::uniform_real_distribution<double> u01(0, 1);
  std::vector<double> k(s.T * s.H * s.K), q(k.size()), g(d.g.numel()), b(s.T * s.HV);
  for (int64_t i = 0; i < s.T * s.H; ++i) {  // unit-norm keys, scaled queries
    double nn = 0;
    for (int64_t c = 0; c < s.K; ++c) nn += (k[i * s.K + c] = n01(gen)) * k[i * s.K + c];
    for (int64_t c = 0; c < s.K; ++c) k[i * s.K + c] /= std::sqrt(nn);
    for (int64_t c = 0; c < s.K; ++c) q[i * s.K + c] = n01(gen) / std::sqrt(double(s.K));
  }
  for (auto& x : g) x = -0.3 * u01(gen);
  for (auto& x : b) x = u01(gen);
  d.kd = d.k.set(k);
  d.qd = d.q.set(q);
  d.gd = d.g.set(g);
  d.bd = d.beta.set(b);
  d.vd = d.v.fill_normal(seed + 1);
  d.dod = d.dout.fill_normal(seed + 2);
  d.dhd = d.dht.fill_normal(seed + 3, 0, 0.3);
  return d;
}

// Per value head h: M [K,K], S [K,V] (forward) and L [K,V] (backward) in float64.
struct Oracle {
  std::vector<double> M, S, L;  // [HV,K,K], [HV,K,V], [HV,K,V]
};

// Every arithmetic result rounded to `round` (float64: the oracle; the input dtype: the base of
// the precision policy, the plain per-token recurrence in that dtype).
Oracle oracle(const Seg& s, const SegData& d, double scale, bool with_dht, DType round) {
  const int64_t K = s.K, V = s.V, G = s.HV / s.H;
  auto rd = [&](double x) { return round_to(round, x); };
  Oracle o;
  o.M.assign(s.HV * K * K, 0);
  o.S.assign(s.HV * K * V, 0);
  o.L.assign(s.HV * K * V, 0);
  for (int64_t h = 0; h < s.HV; ++h) {
    const int64_t hk = h / G;
    auto kk = [&](int64_t t, int64_t c) { return d.kd[(t * s.H + hk) * K + c]; };
    auto qq = [&](int64_t t, int64_t c) { return d.qd[(t * s.H + hk) * K + c]; };
    auto decay = [&](int64_t t, int64_t c) {
      return rd(std::exp(s.kda ? d.gd[(t * s.HV + h) * K + c] : d.gd[t * s.HV + h]));
    };
    // X <- A_t X for an [K, C] state: X = D X, then X -= beta k (k^T X).
    auto apply_A = [&](int64_t t, std::vector<double>& X, int64_t C) {
      const double b = d.bd[t * s.HV + h];
      for (int64_t r = 0; r < K; ++r)
        for (int64_t c = 0; c < C; ++c) X[r * C + c] = rd(X[r * C + c] * decay(t, r));
      for (int64_t c = 0; c < C; ++c) {
        double p = 0;
        for (int64_t r = 0; r < K; ++r) p = rd(p + rd(kk(t, r) * X[r * C + c]));
        for (int64_t r = 0; r < K; ++r) X[r * C + c] = rd(X[r * C + c] - rd(rd(b * kk(t, r)) * p));
      }
    };
    std::vector<double> M(K * K, 0), S(K * V, 0);
    for (int64_t r = 0; r < K; ++r) M[r * K + r] = 1;
    for (int64_t t = 0; t < s.T; ++t) {
      apply_A(t, M, K);
      apply_A(t, S, V);
      for (int64_t r = 0; r < K; ++r)
        for (int64_t c = 0; c < V; ++c)
          S[r * V + c] = rd(S[r * V + c] + rd(rd(d.bd[t * s.HV + h] * kk(t, r)) * d.vd[(t * s.HV + h) * V + c]));
    }
    // Backward: X = dht; X += scale q dO^T; X = A^T X = D (I - beta k k^T) X.
    std::vector<double> X(K * V, 0);
    if (with_dht) X.assign(d.dhd.begin() + h * K * V, d.dhd.begin() + (h + 1) * K * V);
    for (int64_t t = s.T - 1; t >= 0; --t) {
      for (int64_t r = 0; r < K; ++r)
        for (int64_t c = 0; c < V; ++c)
          X[r * V + c] = rd(X[r * V + c] + rd(rd(scale * qq(t, r)) * d.dod[(t * s.HV + h) * V + c]));
      const double b = d.bd[t * s.HV + h];
      for (int64_t c = 0; c < V; ++c) {
        double p = 0;
        for (int64_t r = 0; r < K; ++r) p = rd(p + rd(kk(t, r) * X[r * V + c]));
        for (int64_t r = 0; r < K; ++r) X[r * V + c] = rd(X[r * V + c] - rd(rd(b * kk(t, r)) * p));
      }
      for (int64_t r = 0; r < K; ++r)
        for (int64_t c = 0; c < V; ++c) X[r * V + c] = rd(X[r * V + c] * decay(t, r));
    }
    std::copy(M.begin(), M.end(), o.M.begin() + h * K * K);
    std::copy(S.begin(), S.end(), o.S.begin() + h * K * V);
    std::copy(X.begin(), X.end(), o.L.begin() + h * K * V);
  }
  return o;
}

std::vector<double> slice(const std::vector<double>& v, size_t a, size_t b) {
  return std::vector<double>(v.begin() + a, v.begin() + b);
}

TestTensor workspace(int64_t bytes) { return TestTensor(DType::kUInt8, {std::max<int64_t>(bytes, 1)}); }

// The forward summary of one segment on `backend`.
std::vector<double> run_fwd_summary(const Seg& s, const SegData& d, DType dtype, const std::string& backend,
                                    int64_t bt) {
  const DType acc = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  TestTensor summary(acc, {la_cp_summary_size(s.HV, s.K, s.V)});
  summary.fill_nan();
  LaCpFwdSummaryArgs a;
  a.k = d.k.view();
  a.v = d.v.view();
  a.g = d.g.view();
  a.beta = d.beta.view();
  a.chunk_size = bt;
  a.summary = summary.view();
  TestTensor ws = workspace(la_cp_fwd_summary_workspace_size(a));
  a.workspace = ws.view();
  Context ctx;
  ctx.backend = backend;
  la_cp_fwd_summary(ctx, a);
  return summary.to_double();
}

// The backward summary, after the forward pieces it reads (g_cumsum, A / Aqk and Akk).
std::vector<double> run_bwd_summary(const Seg& s, const SegData& d, DType dtype, const std::string& backend,
                                    int64_t bt, double scale, bool with_dht) {
  const DType acc = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  Context ctx;
  ctx.backend = backend;
  TestTensor gc(acc, shape_vector(d.g.view()));
  chunk_local_cumsum(ctx, {d.g.view(), gc.view(), {}, {}, bt, false, 1.0});
  TestTensor A(dtype, {1, s.T, s.HV, bt}), Aqk(dtype, {1, s.T, s.HV, bt});
  if (s.kda) {
    chunk_kda_fwd_intra(ctx, {d.q.view(), d.k.view(), gc.view(), d.beta.view(), Aqk.view(), A.view(), {}, {},
                              scale, bt, false});
  } else {
    TestTensor kkt(acc, {1, s.T, s.HV, bt});
    chunk_scaled_dot_kkt_fwd(ctx, {d.k.view(), d.beta.view(), gc.view(), kkt.view(), {}, {}, bt});
    solve_tril(ctx, {kkt.view(), A.view(), {}, {}});
  }
  TestTensor L(acc, {1, s.HV, s.K, s.V});
  L.fill_nan();
  LaCpBwdSummaryArgs a;
  a.q = d.q.view();
  a.k = d.k.view();
  a.v = d.v.view();
  a.beta = d.beta.view();
  a.g_cumsum = gc.view();
  a.A = A.view();
  if (s.kda) a.Aqk = Aqk.view();
  a.dout = d.dout.view();
  if (with_dht) a.dht = d.dht.view();
  a.scale = scale;
  a.chunk_size = bt;
  a.dh0 = L.view();
  TestTensor ws = workspace(la_cp_bwd_summary_workspace_size(a));
  a.workspace = ws.view();
  la_cp_bwd_summary(ctx, a);
  return L.to_double();
}

struct SummaryCase {
  Seg seg;
  int64_t bt;
};

const SummaryCase kSummaryCases[] = {
    {{150, 1, 2, 8, 6, false}, 64}, {{70, 2, 4, 16, 8, false}, 32}, {{1, 1, 1, 4, 4, false}, 16},
    {{150, 1, 2, 8, 6, true}, 64},  {{70, 2, 4, 16, 8, true}, 32},  {{33, 1, 1, 4, 12, true}, 32}};

TEST(ContextParallel, SummariesMatchTheRecurrenceOracle) {
  int checked = 0;
  for (const auto& sc : kSummaryCases) {
    const Seg& s = sc.seg;
    const double scale = 1.0 / std::sqrt(double(s.K));
    for (DType dtype : {DType::kFloat64, DType::kFloat32, DType::kBFloat16}) {
      for (const char* backend : {"ref", "cpu"}) {
        if (dtype == DType::kFloat64 && std::string(backend) == "cpu") continue;
        const SegData d = make_seg(s, dtype, 100 + checked);
        for (bool with_dht : {false, true}) {
          const Oracle o = oracle(s, d, scale, with_dht, DType::kFloat64);
          const Oracle b = oracle(s, d, scale, with_dht, dtype);
          const auto fs = run_fwd_summary(s, d, dtype, backend, sc.bt);
          const auto L = run_bwd_summary(s, d, dtype, backend, sc.bt, scale, with_dht);
          const size_t m = o.M.size();
          const std::string name = std::string(backend) + "/" + dtype_name(dtype) + (s.kda ? "/kda" : "/gdn") +
                                   "/T=" + std::to_string(s.T) + (with_dht ? "/dht" : "");
          const Verdict vm = check_close(slice(fs, 0, m), b.M, o.M, dtype);
          const Verdict vs = check_close(slice(fs, m, fs.size()), b.S, o.S, dtype);
          const Verdict vl = check_close(L, b.L, o.L, dtype);
          EXPECT_TRUE(vm.pass) << name << " M: " << vm.describe();
          EXPECT_TRUE(vs.pass) << name << " S_loc: " << vs.describe();
          EXPECT_TRUE(vl.pass) << name << " L: " << vl.describe();
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(ContextParallel, EmptySegmentIsTheIdentity) {
  const Seg s{0, 1, 2, 4, 3, false};
  const SegData d = make_seg(s, DType::kFloat32, 7);
  const auto fs = run_fwd_summary(s, d, DType::kFloat32, "cpu", 64);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(fs[(h * 4 + i) * 4 + j], i == j ? 1.0 : 0.0);
  for (size_t e = 2 * 16; e < fs.size(); ++e) EXPECT_EQ(fs[e], 0.0);
  // The backward of an empty segment passes dht through.
  const auto L = run_bwd_summary(s, d, DType::kFloat32, "cpu", 64, 0.5, true);
  EXPECT_EQ(L, d.dhd);
  const auto L0 = run_bwd_summary(s, d, DType::kFloat32, "cpu", 64, 0.5, false);
  EXPECT_EQ(L0, std::vector<double>(L0.size(), 0.0));
}

// Fold oracles in float64 over summaries given as doubles; `round` rounds every step's result
// to fp32 when the base (the plain composite in fp32) is wanted.
std::vector<double> fold_fwd_oracle(const std::vector<double>& sum, const std::vector<double>* h0, int64_t lo,
                                    int64_t hi, int64_t HV, int64_t K, int64_t V, DType round) {
  const int64_t size = HV * K * (K + V), KV = K * V;
  std::vector<double> out(HV * KV);
  for (int64_t h = 0; h < HV; ++h) {
    std::vector<double> x(KV, 0.0), y(KV);
    if (h0) x.assign(h0->begin() + h * KV, h0->begin() + (h + 1) * KV);
    for (int64_t j = lo; j < hi; ++j) {
      for (int64_t i = 0; i < K; ++i)
        for (int64_t c = 0; c < V; ++c) {
          double a = sum[j * size + HV * K * K + h * KV + i * V + c];
          for (int64_t k = 0; k < K; ++k) a = round_to(round, a + round_to(round, sum[j * size + (h * K + i) * K + k] * x[k * V + c]));
          y[i * V + c] = a;
        }
      x = y;
    }
    std::copy(x.begin(), x.end(), out.begin() + h * KV);
  }
  return out;
}

std::vector<double> fold_bwd_oracle(const std::vector<double>& sum, const std::vector<double>& L, int64_t lo,
                                    int64_t hi, int64_t HV, int64_t K, int64_t V, DType round) {
  const int64_t size = HV * K * (K + V), KV = K * V;
  std::vector<double> out(HV * KV);
  for (int64_t h = 0; h < HV; ++h) {
    std::vector<double> x(KV, 0.0), y(KV);
    for (int64_t j = hi - 1; j >= lo; --j) {
      for (int64_t i = 0; i < K; ++i)
        for (int64_t c = 0; c < V; ++c) {
          double a = L[j * HV * KV + h * KV + i * V + c];
          for (int64_t k = 0; k < K; ++k) a = round_to(round, a + round_to(round, sum[j * size + (h * K + k) * K + i] * x[k * V + c]));
          y[i * V + c] = a;
        }
      x = y;
    }
    std::copy(x.begin(), x.end(), out.begin() + h * KV);
  }
  return out;
}

TEST(ContextParallel, FoldsMatchFloat64OnEveryBackend) {
  int checked = 0;
  struct Shape {
    int64_t R, HV, K, V, lo, hi;
  };
  for (const Shape& sh : {Shape{3, 2, 8, 6, 0, 3}, Shape{5, 1, 40, 70, 1, 4}, Shape{4, 3, 4, 33, 2, 2},
                          Shape{2, 2, 256, 8, 0, 2}}) {
    for (Direction dir : {Direction::kForward, Direction::kBackward}) {
      for (const auto& bc : runnable_backends("la_cp_fold", dir)) {
        for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
          if (!backend_takes("la_cp_fold", dir, bc.id, dtype)) continue;
          TestTensor sum(dtype, {sh.R, sh.HV * sh.K * (sh.K + sh.V)});
          TestTensor L(dtype, {sh.R, sh.HV * sh.K * sh.V});
          TestTensor h0(DType::kBFloat16, {sh.HV, sh.K, sh.V});
          const double amp = 1.0 / std::sqrt(double(sh.K));  // keeps the chained products O(1)
          const auto sd = sum.fill_normal(11 + checked, 0, amp), Ld = L.fill_normal(12 + checked),
                     hd = h0.fill_normal(13 + checked);
          TestTensor out(dtype, {sh.HV, sh.K, sh.V});
          out.fill_nan();
          const TestTensor dsum = sum.to(bc.device), dL = L.to(bc.device), dh0 = h0.to(bc.device);
          TestTensor dout = out.to(bc.device);
          std::vector<double> ref, base;
          if (dir == Direction::kForward) {
            la_cp_fold_fwd(bc.ctx(), {dsum.view(), dh0.view(), sh.lo, sh.hi, dout.view()});
            ref = fold_fwd_oracle(sd, &hd, sh.lo, sh.hi, sh.HV, sh.K, sh.V, DType::kFloat64);
            base = fold_fwd_oracle(sd, &hd, sh.lo, sh.hi, sh.HV, sh.K, sh.V, dtype);
          } else {
            la_cp_fold_bwd(bc.ctx(), {dsum.view(), dL.view(), sh.lo, sh.hi, dout.view()});
            ref = fold_bwd_oracle(sd, Ld, sh.lo, sh.hi, sh.HV, sh.K, sh.V, DType::kFloat64);
            base = fold_bwd_oracle(sd, Ld, sh.lo, sh.hi, sh.HV, sh.K, sh.V, dtype);
          }
          const Verdict v = check_close(dout.to_double(), base, ref, dtype);
          EXPECT_TRUE(v.pass) << bc.id << "/" << dtype_name(dtype) << (dir == Direction::kForward ? " fwd" : " bwd")
                              << " K=" << sh.K << ": " << v.describe();
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(ContextParallel, Errors) {
  Context ctx;
  TestTensor sum(DType::kFloat32, {2, 2 * 4 * 7}), st(DType::kFloat32, {2, 4, 3}), bad(DType::kFloat32, {2, 4, 4});
  expect_error([&] { la_cp_fold_fwd(ctx, {sum.view(), {}, 0, 3, st.view()}); }, ErrorKind::kValue,
               "la_cp_fold_fwd: the fold range must satisfy 0 <= lo <= hi <= R=2");
  expect_error([&] { la_cp_fold_fwd(ctx, {sum.view(), {}, 0, 1, bad.view()}); }, ErrorKind::kValue,
               "la_cp_fold_fwd: summaries must have shape");
  TestTensor L(DType::kFloat32, {1, 2 * 4 * 3});
  expect_error([&] { la_cp_fold_bwd(ctx, {sum.view(), L.view(), 0, 1, st.view()}); }, ErrorKind::kValue,
               "la_cp_fold_bwd: dh0s must have shape [2,24]");
  const Seg s{10, 1, 2, 4, 3, false};
  const SegData d = make_seg(s, DType::kFloat32, 3);
  TestTensor summary(DType::kFloat32, {5});
  LaCpFwdSummaryArgs a;
  a.k = d.k.view();
  a.v = d.v.view();
  a.g = d.g.view();
  a.beta = d.beta.view();
  a.summary = summary.view();
  expect_error([&] { la_cp_fwd_summary(ctx, a); }, ErrorKind::kValue,
               "la_cp_fwd_summary: summary must have shape [56]");
  a.chunk_size = 48;
  expect_error([&] { la_cp_fwd_summary(ctx, a); }, ErrorKind::kValue, "chunk_size must be 16, 32 or 64, got 48");
}

}  // namespace
}  // namespace fusedops::testing
