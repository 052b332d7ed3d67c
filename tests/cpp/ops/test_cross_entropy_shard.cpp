// The vocabulary-parallel cross-entropy pieces (fused_cross_entropy_loss_shard_stats / _bwd) on
// every runnable backend against a float64 oracle written here, base = the same formulas with each
// result rounded to the input dtype: statistics of a shard (labels inside and outside it, ignored
// rows, logit_scale, soft-capping), the shard gradient for given row gradients (also in place),
// and the errors.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "cross_entropy_shard";
constexpr int64_t kIgnore = -100;

struct Shard {
  int64_t N, Vs, start;
};

std::vector<int64_t> make_labels(const Shard& s, int64_t V) {
  std::vector<int64_t> y(s.N);
  for (int64_t i = 0; i < s.N; ++i) {
    if (i % 5 == 4) y[i] = kIgnore;
    else if (i % 3 == 0) y[i] = s.start + (i * 7) % s.Vs;  // in the shard
    else y[i] = (s.start + s.Vs + i * 11) % V;             // usually outside it
  }
  return y;
}

CrossEntropyOptions options(double scale, std::optional<double> cap) {
  CrossEntropyOptions o;
  o.ignore_index = kIgnore;
  o.logit_scale = scale;
  o.logit_softcapping = cap;
  return o;
}

// z and dz/dx of one logit, rounded to `r`.
double zval(double x, const CrossEntropyOptions& o, DType r, double* dzdx) {
  double z = round_to(r, x * o.logit_scale), d = o.logit_scale;
  if (o.logit_softcapping) {
    const double c = *o.logit_softcapping, t = round_to(r, std::tanh(round_to(r, z / c)));
    z = round_to(r, c * t);
    d = round_to(r, d * round_to(r, 1 - t * t));
  }
  if (dzdx) *dzdx = d;
  return z;
}

std::vector<double> stats_oracle(const std::vector<double>& x, const std::vector<int64_t>& y, const Shard& s,
                                 const CrossEntropyOptions& o, DType r) {
  std::vector<double> out(s.N * 4, 0.0);
  for (int64_t i = 0; i < s.N; ++i) {
    if (y[i] == kIgnore) continue;
    double m = -std::numeric_limits<double>::infinity(), sz = 0, se = 0;
    for (int64_t v = 0; v < s.Vs; ++v) {
      const double z = zval(x[i * s.Vs + v], o, r, nullptr);
      m = std::max(m, z);
      sz = round_to(r, sz + z);
    }
    for (int64_t v = 0; v < s.Vs; ++v) se = round_to(r, se + round_to(r, std::exp(zval(x[i * s.Vs + v], o, r, nullptr) - m)));
    const int64_t local = y[i] - s.start;
    out[i * 4] = m;
    out[i * 4 + 1] = se;
    out[i * 4 + 2] = local >= 0 && local < s.Vs ? zval(x[i * s.Vs + local], o, r, nullptr) : 0.0;
    out[i * 4 + 3] = sz;
  }
  return out;
}

std::vector<double> bwd_oracle(const std::vector<double>& x, const std::vector<int64_t>& y, const std::vector<double>& rg,
                               const Shard& s, const CrossEntropyOptions& o, DType r) {
  std::vector<double> g(s.N * s.Vs, 0.0);
  for (int64_t i = 0; i < s.N; ++i) {
    if (y[i] == kIgnore) continue;
    for (int64_t v = 0; v < s.Vs; ++v) {
      double d;
      const double z = zval(x[i * s.Vs + v], o, r, &d);
      double t = round_to(r, rg[i * 4 + 1] * round_to(r, std::exp(round_to(r, z - rg[i * 4]))));
      if (v + s.start == y[i]) t = round_to(r, t + rg[i * 4 + 2]);
      g[i * s.Vs + v] = round_to(r, d * round_to(r, t + rg[i * 4 + 3]));
    }
  }
  return g;
}

TEST(CrossEntropyShard, StatsAndGradientMatchFloat64OnEveryBackend) {
  int checked = 0;
  const int64_t V = 3 * 700 + 1;
  for (const Shard& s : {Shard{7, 700, 0}, Shard{33, 701, 1400}, Shard{3, 1, 5}, Shard{1, 16003, 0}}) {
    for (const auto& [scale, cap] : {std::pair<double, std::optional<double>>{1.0, std::nullopt},
                                     {0.7, 6.0}}) {
      const CrossEntropyOptions o = options(scale, cap);
      const std::vector<int64_t> y = make_labels(s, std::max<int64_t>(V, s.start + s.Vs));
      for (Direction dir : {Direction::kForward, Direction::kBackward}) {
        for (const auto& bc : runnable_backends(kOp, dir)) {
          for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
            if (!backend_takes(kOp, dir, bc.id, dtype)) continue;
            const DType acc = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
            TestTensor x(dtype, {s.N, s.Vs}), lab(DType::kInt64, {s.N}), rows(acc, {s.N, 4});
            const auto xd = x.fill_normal(21 + checked, 0, 3);
            std::memcpy(lab.data(), y.data(), y.size() * sizeof(int64_t));
            const TestTensor dx = x.to(bc.device), dlab = lab.to(bc.device);
            std::vector<double> ours, ref, base;
            if (dir == Direction::kForward) {
              TestTensor st = rows.to(bc.device);
              st.fill_nan();
              fused_cross_entropy_loss_shard_stats(bc.ctx(), {dx.view(), dlab.view(), st.view(), s.start, o});
              ours = st.to_double();
              ref = stats_oracle(xd, y, s, o, DType::kFloat64);
              base = stats_oracle(xd, y, s, o, dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32);
            } else {
              // Row gradients around a plausible lse (the row max + log Vs).
              std::vector<double> rg(s.N * 4);
              const auto st = stats_oracle(xd, y, s, o, DType::kFloat64);
              for (int64_t i = 0; i < s.N; ++i) {
                rg[i * 4] = st[i * 4] + std::log(double(s.Vs)) + 0.3;
                rg[i * 4 + 1] = 0.5 + 0.1 * i;
                rg[i * 4 + 2] = -0.7;
                rg[i * 4 + 3] = -0.01;
              }
              const auto rgd = rows.set(rg);
              const TestTensor drg = rows.to(bc.device);
              for (bool in_place : {false, true}) {
                TestTensor g = in_place ? x.to(bc.device) : TestTensor(dtype, {s.N, s.Vs}, bc.device);
                if (!in_place) g.fill_nan();
                const TensorView src = in_place ? g.view() : dx.view();
                fused_cross_entropy_loss_shard_bwd(bc.ctx(), {src, dlab.view(), drg.view(), g.view(), s.start, o});
                const auto got = g.to_double();
                ref = bwd_oracle(xd, y, rgd, s, o, DType::kFloat64);
                base = bwd_oracle(xd, y, rgd, s, o, dtype);
                const Verdict v = check_close(got, base, ref, dtype);
                EXPECT_TRUE(v.pass) << bc.id << "/" << dtype_name(dtype) << " bwd" << (in_place ? " in place" : "")
                                    << " Vs=" << s.Vs << ": " << v.describe();
              }
              ++checked;
              continue;
            }
            const Verdict v = check_close(ours, base, ref, acc);
            EXPECT_TRUE(v.pass) << bc.id << "/" << dtype_name(dtype) << " stats Vs=" << s.Vs << ": " << v.describe();
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 30);
}

TEST(CrossEntropyShard, Errors) {
  Context ctx;
  TestTensor x(DType::kFloat32, {4, 10}), lab(DType::kInt64, {4}), st(DType::kFloat32, {4, 3});
  expect_error([&] { fused_cross_entropy_loss_shard_stats(ctx, {x.view(), lab.view(), st.view(), 0, {}}); },
               ErrorKind::kValue, "cross_entropy_shard: stats must have shape [4,4]");
  TestTensor st4(DType::kFloat32, {4, 4}), lab3(DType::kInt64, {3});
  expect_error([&] { fused_cross_entropy_loss_shard_stats(ctx, {x.view(), lab3.view(), st4.view(), 0, {}}); },
               ErrorKind::kValue, "labels must have one entry per row of logits (4)");
  expect_error([&] { fused_cross_entropy_loss_shard_stats(ctx, {x.view(), lab.view(), st4.view(), -1, {}}); },
               ErrorKind::kValue, "vocab_start must be >= 0");
  TestTensor g(DType::kBFloat16, {4, 10});
  expect_error([&] { fused_cross_entropy_loss_shard_bwd(ctx, {x.view(), lab.view(), st4.view(), g.view(), 0, {}}); },
               ErrorKind::kType, "grad_logits");
}

}  // namespace
}  // namespace fusedops::testing
