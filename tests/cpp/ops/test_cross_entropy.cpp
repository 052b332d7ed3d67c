// fused_cross_entropy_loss: every runnable backend against a float64 oracle written here (not
// the library's ref backend), forward (loss, z-loss) and every gradient (logits, loss weights),
// every option, NaN-poisoned outputs, odd / empty / long rows (the CUDA register, shared-memory,
// streamed and scalar paths), strided and in-place logits, the backward rescaling, determinism,
// and the error messages.
#include <cmath>
#include <cstring>

#include "tests/common/tolerance.h"
#include "tests/cpp/ops/cross_entropy_harness.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

using namespace cross_entropy;

constexpr const char* kOp = "fused_cross_entropy_loss";

struct Outputs {
  std::vector<double> loss, z_loss, grad, grad_lw;
};

// The loss and its gradients. dtype kFloat64: exact (the oracle); otherwise every intermediate
// is rounded to dtype, as a plain composite in the input dtype computes it (the base).
Outputs oracle(const std::vector<double>& x, int64_t N, int64_t V, const std::vector<int64_t>& y,
               const std::vector<double>* w, const CrossEntropyOptions& o, DType dtype) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  const bool none = o.reduction == LossReduction::kNone;
  const double norm = mean_divisor(y, o);
  Outputs out;
  out.grad.assign(N * V, 0.0);
  out.grad_lw.assign(N, 0.0);
  std::vector<double> row_loss(N, 0.0), row_z(N, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    if (y[i] == o.ignore_index) continue;
    const double c = (w ? (*w)[i] : 1.0) / norm;
    const RowLoss r = row_cross_entropy(&x[i * V], V, y[i], o, c, dtype, &out.grad[i * V]);
    row_loss[i] = r.loss;
    row_z[i] = r.z_loss;
    out.grad_lw[i] = rd(row_loss[i] / norm);
  }
  if (none) {
    out.loss.resize(N);
    out.z_loss = row_z;
    for (int64_t i = 0; i < N; ++i) out.loss[i] = rd((w ? (*w)[i] : 1.0) * row_loss[i]);
  } else {
    double l = 0, zl = 0;
    for (int64_t i = 0; i < N; ++i) {
      l += (w ? (*w)[i] : 1.0) * row_loss[i];
      zl += row_z[i];
    }
    out.loss = {rd(l / norm)};
    out.z_loss = {rd(zl / norm)};
  }
  return out;
}

struct Options {
  const char* name;
  CrossEntropyOptions o;
  bool weights;
  int ignore_every;  // every k-th row is ignored (0: none; 1: all)
};

std::vector<Options> option_sets() {
  std::vector<Options> out;
  CrossEntropyOptions o;
  out.push_back({"mean", o, false, 0});
  o.reduction = LossReduction::kSum;
  out.push_back({"sum+weights+ignore", o, true, 3});
  o.reduction = LossReduction::kNone;
  out.push_back({"none+weights+ignore", o, true, 4});
  o = CrossEntropyOptions{};
  o.label_smoothing = 0.1;
  o.lse_square_scale = 1e-3;
  out.push_back({"mean+smoothing+zloss+ignore", o, false, 2});
  o = CrossEntropyOptions{};
  o.reduction = LossReduction::kSum;
  o.logit_softcapping = 3.0;
  o.logit_scale = 0.5;
  o.ignore_index = 7;
  out.push_back({"sum+softcap+scale+ignore7", o, true, 5});
  o = CrossEntropyOptions{};
  o.reduction = LossReduction::kNone;
  o.label_smoothing = 0.25;
  o.lse_square_scale = 1e-2;
  o.logit_softcapping = 5.0;
  o.logit_scale = 1.7;
  out.push_back({"none+everything", o, true, 3});
  o = CrossEntropyOptions{};
  o.label_smoothing = 0.2;
  out.push_back({"mean+all-ignored", o, true, 1});
  // No softcap and no smoothing: the CUDA plain pass, here with a logit scale and z-loss.
  o = CrossEntropyOptions{};
  o.reduction = LossReduction::kSum;
  o.logit_scale = 0.7;
  o.lse_square_scale = 1e-2;
  out.push_back({"sum+scale+zloss+weights", o, true, 0});
  return out;
}

struct Problem {
  int64_t N, V;
  std::vector<double> x, w;
  std::vector<int64_t> y;
};

Problem make_problem(int64_t N, int64_t V, const Options& opt, uint64_t seed, double spread = 2.0) {
  Problem p{N, V, {}, {}, {}};
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> nd(0.0, spread);
  p.x.resize(N * V);
  for (auto& v : p.x) v = nd(gen);
  p.w.resize(N);
  for (auto& v : p.w) v = 0.5 + std::abs(nd(gen)) / spread;
  p.y = draw_labels(gen, N, V, opt.ignore_every, opt.o.ignore_index);
  return p;
}

// Runs the forward on backend b; returns the outputs as doubles (and the inputs as stored).
struct Outcome {
  Outputs out;
  std::vector<double> x, w;
  std::vector<uint8_t> grad_bytes, loss_bytes;
};

Outcome run_forward(const BackendCase& b, DType dtype, const Problem& p, const Options& opt, bool labels64,
                bool in_place = false, int64_t row_pad = 0, bool validate = false) {
  const int64_t N = p.N, V = p.V, stride = V + row_pad;
  const bool none = opt.o.reduction == LossReduction::kNone;
  TestTensor xbuf(dtype, {N, stride}, b.device);
  std::vector<double> xs(N * stride, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t v = 0; v < V; ++v) xs[i * stride + v] = p.x[i * V + v];
  const auto xstored = xbuf.set(xs);
  TensorView x = xbuf.strided_view({N, V}, {stride, 1});
  const TestTensor labels = labels_tensor(p.y, {N}, labels64, b.device);
  TestTensor w(DType::kFloat32, {N}, b.device);
  const auto wstored = w.set(p.w);
  const DType od = fp32_or_f64(dtype);
  TestTensor loss(od, none ? std::vector<int64_t>{N} : std::vector<int64_t>{}, b.device);
  TestTensor z(od, none ? std::vector<int64_t>{N} : std::vector<int64_t>{}, b.device);
  TestTensor grad(dtype, {N, V}, b.device), glw(od, {N}, b.device);
  poison(loss, z, grad, glw);
  Context ctx = b.ctx();
  ctx.validate = validate;
  const Workspace ws = workspace(cross_entropy_workspace_size(ctx, N, V), b.device);
  CrossEntropyFwdArgs a;
  a.logits = x;
  a.labels = labels.view();
  a.loss_weight = opt.weights ? w.view() : TensorView();
  a.loss = loss.view();
  a.z_loss = z.view();
  a.grad_logits = in_place ? x : grad.view();
  a.grad_loss_weight = glw.view();
  a.workspace = ws.view();
  a.options = opt.o;
  fused_cross_entropy_loss_fwd(ctx, a);
  Outcome r;
  r.out.loss = loss.to_double();
  r.out.z_loss = z.to_double();
  r.out.grad_lw = glw.to_double();
  if (in_place) {
    const auto all = xbuf.to_double();
    r.out.grad.resize(N * V);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t v = 0; v < V; ++v) r.out.grad[i * V + v] = all[i * stride + v];
    r.grad_bytes = xbuf.bytes();
  } else {
    r.out.grad = grad.to_double();
    r.grad_bytes = grad.bytes();
  }
  r.loss_bytes = loss.bytes();
  r.x.resize(N * V);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t v = 0; v < V; ++v) r.x[i * V + v] = xstored[i * stride + v];
  r.w = wstored;
  return r;
}

// The precision policy on every output; `what` names the case.
void expect_matches(const Outcome& r, const Problem& p, const Options& opt, DType dtype, const std::string& what) {
  const Outputs ref = oracle(r.x, p.N, p.V, p.y, opt.weights ? &r.w : nullptr, opt.o, DType::kFloat64);
  const Outputs base = oracle(r.x, p.N, p.V, p.y, opt.weights ? &r.w : nullptr, opt.o, dtype);
  const std::pair<const char*, std::vector<double> Outputs::*> fields[] = {
      {"loss", &Outputs::loss}, {"z_loss", &Outputs::z_loss}, {"grad_logits", &Outputs::grad},
      {"grad_loss_weight", &Outputs::grad_lw}};
  for (const auto& [name, field] : fields)
    expect_policy(what + " " + name, r.out.*field, base.*field, ref.*field, dtype);
}

struct Shape {
  int64_t N, V;
  bool all_options;
};

// Long rows exercise the CUDA plans: 129 and 1000 registers only, 32000 shared memory,
// 32003 the scalar path (rows not 16-byte aligned), 70000 and 200000 shared memory plus
// streamed units, 128256 the target vocabulary.
const std::vector<Shape> kShapes = {{1, 1, true},   {1, 7, true},    {3, 129, true},   {33, 1000, true},
                                    {0, 16, true},  {64, 300, false}, {2, 32000, false}, {3, 32003, false},
                                    {2, 70000, false}, {2, 128256, false}, {1, 200000, false}};

TEST(FusedCrossEntropyLoss, ForwardAndGradientsMatchFloat64OnEveryBackend) {
  int checked = 0;
  const auto sets = option_sets();
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kForward, b)) {
      for (const auto& s : kShapes) {
        for (size_t k = 0; k < sets.size(); ++k) {
          if (!s.all_options && k != 0 && k != 5) continue;
          if (dtype == DType::kFloat64 && s.V > 40000) continue;
          // Rows past 64K elements exist for the CUDA plans (shared memory + streaming).
          if (b.device.kind != DeviceKind::kCUDA && s.V > 40000 && dtype != DType::kBFloat16) continue;
          const Options& opt = sets[k];
          SCOPED_TRACE(case_name(b.id, dtype, {s.N, s.V}) + " " + opt.name);
          const Problem p = make_problem(s.N, s.V, opt, 1000 + checked);
          const Outcome r = run_forward(b, dtype, p, opt, checked % 2 == 0);
          expect_matches(r, p, opt, dtype, case_name(b.id, dtype, {s.N, s.V}) + " " + opt.name);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(FusedCrossEntropyLoss, InPlaceAndStridedLogitsGiveTheSameResults) {
  const auto sets = option_sets();
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      for (const auto& [N, V, pad] : {std::tuple<int64_t, int64_t, int64_t>{5, 1000, 8}, {3, 70001, 7},
                                      {2, 128256, 64}, {4, 129, 3}}) {
        if (b.device.kind != DeviceKind::kCUDA && V > 40000 && dtype != DType::kBFloat16) continue;
        for (int k : {0, 5}) {
          const Options& opt = sets[k];
          const std::string what = case_name(b.id, dtype, {N, V}) + " " + opt.name + " pad " + std::to_string(pad);
          SCOPED_TRACE(what);
          const Problem p = make_problem(N, V, opt, 77 + N + k);
          const Outcome plain = run_forward(b, dtype, p, opt, true);
          const Outcome in_place = run_forward(b, dtype, p, opt, false, true);
          const Outcome strided = run_forward(b, dtype, p, opt, true, false, pad);
          expect_matches(in_place, p, opt, dtype, what + " in place");
          expect_matches(strided, p, opt, dtype, what + " strided");
          // The same math whatever the layout, up to the order of a vector/scalar path.
          for (size_t i = 0; i < plain.out.grad.size(); ++i) {
            ASSERT_NEAR(in_place.out.grad[i], plain.out.grad[i], 1e-6 + 1e-5 * std::abs(plain.out.grad[i])) << i;
          }
          EXPECT_EQ(plain.loss_bytes, in_place.loss_bytes);
          EXPECT_EQ(plain.grad_bytes, in_place.grad_bytes);
        }
      }
    }
  }
}

// Labels on the first and last column, the last column of the last whole 16-byte unit and the
// first of the trailing elements (the CUDA plans find the label's owner by its unit), with and
// without a row pad, in place and not.
TEST(FusedCrossEntropyLoss, LabelsAtTheEdgesOfARowMatchFloat64) {
  const auto sets = option_sets();
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      for (const auto& [V, pad] : {std::pair<int64_t, int64_t>{9, 7}, {1003, 5}, {70001, 7}, {128256, 0}}) {
        if (b.device.kind != DeviceKind::kCUDA && V > 40000 && dtype != DType::kBFloat16) continue;
        for (int k : {0, 5}) {
          const Options& opt = sets[k];
          Problem p = make_problem(5, V, opt, 31 + V + k);
          const int64_t whole = V / 8 * 8;
          p.y = {0, V - 1, std::max<int64_t>(whole - 1, 0), std::min(whole, V - 1), V / 2};
          for (bool in_place : {false, true}) {
            const std::string what = case_name(b.id, dtype, {p.N, V}) + " " + opt.name + " pad " +
                                     std::to_string(pad) + (in_place ? " in place" : "");
            SCOPED_TRACE(what);
            expect_matches(run_forward(b, dtype, p, opt, true, in_place, in_place ? 0 : pad), p, opt, dtype, what);
          }
        }
      }
    }
  }
}

TEST(FusedCrossEntropyLoss, LargeLogitsAndSoftcapStayFinite) {
  const auto sets = option_sets();
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kForward, b)) {
      for (int k : {0, 4, 5, 7}) {
        const Options& opt = sets[k];
        SCOPED_TRACE(b.id + "/" + dtype_name(dtype) + " " + opt.name);
        // Logits of magnitude ~1e4 (and an exact +-1e4 in every row).
        Problem p = make_problem(6, 517, opt, 5 + k, 4000.0);
        for (int64_t i = 0; i < p.N; ++i) {
          p.x[i * p.V] = 1e4;
          p.x[i * p.V + 1] = -1e4;
        }
        const Outcome r = run_forward(b, dtype, p, opt, true);
        for (double v : r.out.loss) EXPECT_TRUE(std::isfinite(v)) << v;
        for (double v : r.out.grad) ASSERT_TRUE(std::isfinite(v)) << v;
        expect_matches(r, p, opt, dtype, b.id + " large logits " + opt.name);
      }
    }
  }
}

TEST(FusedCrossEntropyLoss, RepeatedRunsAreBitwiseIdentical) {
  const auto sets = option_sets();
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      for (const auto& [N, V] : {std::pair<int64_t, int64_t>{300, 1000}, {4, 128256}}) {
        SCOPED_TRACE(case_name(b.id, dtype, {N, V}));
        for (int k : {3, 0}) {  // the general and the plain CUDA pass
          const Problem p = make_problem(N, V, sets[k], 9);
          const Outcome a = run_forward(b, dtype, p, sets[k], true);
          const Outcome c = run_forward(b, dtype, p, sets[k], true);
          EXPECT_EQ(a.loss_bytes, c.loss_bytes) << sets[k].name;
          EXPECT_EQ(a.grad_bytes, c.grad_bytes) << sets[k].name;
        }
      }
    }
  }
}

// A label outside [0, V) that is not ignore_index (issue 39: 10 with V = 10, and -5): the CPU
// raises before any work; CUDA gives that row a NaN loss, the others theirs, and reports it (raised
// by check_device_errors, once); with debug checks CUDA raises at the call.
TEST(FusedCrossEntropyLoss, OutOfRangeLabelRaisesOnTheCpuAndIsNaNAndReportedOnCuda) {
  CrossEntropyOptions o;
  o.reduction = LossReduction::kNone;
  const Options opt{"none", o, false, 0};
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    SCOPED_TRACE(b.id);
    Problem p = make_problem(4, 10, opt, 3);
    for (int64_t bad : {10, -5}) {
      p.y[2] = bad;
      const std::string message = "labels[2] = " + std::to_string(bad) +
                                  " is outside [0, 10) and is not ignore_index (-100)";
      if (b.device.kind == DeviceKind::kCPU) {
        expect_error([&] { run_forward(b, DType::kFloat32, p, opt, true); }, ErrorKind::kValue, message);
        continue;
      }
      check_device_errors(b.ctx());
      const Outcome r = run_forward(b, DType::kFloat32, p, opt, true);
      EXPECT_TRUE(std::isnan(r.out.loss[2]));
      EXPECT_TRUE(std::isfinite(r.out.loss[1]));
      expect_error([&] { check_device_errors(b.ctx()); }, ErrorKind::kValue,
                   "fused_cross_entropy_loss: labels[2] = " + std::to_string(bad) + " is outside [0, V)");
      EXPECT_NO_THROW(check_device_errors(b.ctx()));
      expect_error([&] { run_forward(b, DType::kFloat32, p, opt, true, false, 0, true); }, ErrorKind::kValue,
                   message);
    }
  }
}

// Backward: grad = g * saved (scalar g, or one factor per row for "none"), in place or not.
TEST(FusedCrossEntropyLoss, BackwardRescalesTheSavedGradients) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dtype : dtypes_taken(kOp, Direction::kBackward, b)) {
      for (const auto& [N, V] : {std::pair<int64_t, int64_t>{7, 33}, {3, 4096}, {2, 1001}}) {
        for (LossReduction red : {LossReduction::kMean, LossReduction::kNone}) {
          for (double scalar : {1.0, 0.37}) {
            for (bool in_place : {false, true}) {
              SCOPED_TRACE(case_name(b.id, dtype, {N, V}) + " " + loss_reduction_name(red) + " g " +
                           std::to_string(scalar) + (in_place ? " in place" : ""));
              const bool none = red == LossReduction::kNone;
              const DType od = fp32_or_f64(dtype);
              TestTensor saved(dtype, {N, V}, b.device), out(dtype, {N, V}, b.device);
              TestTensor saved_lw(od, {N}, b.device), out_lw(DType::kBFloat16, {N}, b.device);
              TestTensor g(od, none ? std::vector<int64_t>{N} : std::vector<int64_t>{}, b.device);
              const auto sv = saved.fill_normal(4);
              const auto slw = saved_lw.fill_normal(5);
              std::vector<double> gv(none ? N : 1, scalar);
              gv = (none && scalar != 1.0) ? g.fill_normal(6) : g.set(gv);
              poison(out, out_lw);
              CrossEntropyBwdArgs a{g.view(), saved.view(), in_place ? saved.view() : out.view(),
                                    saved_lw.view(), out_lw.view(), red};
              fused_cross_entropy_loss_bwd(b.ctx(), a);
              const auto got = in_place ? saved.to_double() : out.to_double();
              // g: one factor, or one per row for "none".
              expect_rescaled("grad_logits", got, sv, gv, V, dtype);
              expect_rescaled("grad_loss_weight", out_lw.to_double(), slw, gv, 1, DType::kBFloat16);
            }
          }
        }
      }
    }
  }
}

TEST(FusedCrossEntropyLoss, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kFloat32, {4, 8}), grad(DType::kFloat32, {4, 8}), loss(DType::kFloat32, {});
  TestTensor lossN(DType::kFloat32, {4}), labels(DType::kInt64, {4}), labels5(DType::kInt64, {5});
  TestTensor flabels(DType::kFloat32, {4}), w5(DType::kFloat32, {5});
  x.fill_normal(1);
  std::memset(labels.data(), 0, 32);
  auto args = [&]() {
    CrossEntropyFwdArgs a;
    a.logits = x.view();
    a.labels = labels.view();
    a.loss = loss.view();
    return a;
  };
  auto expect = [&](CrossEntropyFwdArgs a, ErrorKind kind, const std::string& text) {
    expect_error([&] { fused_cross_entropy_loss_fwd(ctx, a); }, kind, text);
  };
  TestTensor x1(DType::kFloat32, {8});
  auto a = args();
  a.logits = x1.view();
  expect(a, ErrorKind::kValue, "fused_cross_entropy_loss: logits must have rank >= 2, got rank 1");
  TestTensor x0(DType::kFloat32, {4, 0});
  a = args();
  a.logits = x0.view();
  expect(a, ErrorKind::kValue, "logits must have a vocabulary dimension of size >= 1, got shape [4,0]");
  a = args();
  a.labels = labels5.view();
  expect(a, ErrorKind::kValue, "labels must have one entry per row of logits (4), got shape [5]");
  a = args();
  a.labels = flabels.view();
  expect(a, ErrorKind::kType, "labels must have dtype in {int32, int64}, got float32");
  a = args();
  a.loss_weight = w5.view();
  expect(a, ErrorKind::kValue, "loss_weight must have one entry per row of logits (4), got shape [5]");
  a = args();
  a.options.label_smoothing = 1.5;
  expect(a, ErrorKind::kValue, "label_smoothing must be in [0, 1], got 1.5");
  a = args();
  a.options.logit_softcapping = 0.0;
  expect(a, ErrorKind::kValue, "logit_softcapping must be a finite number > 0 (or None), got 0");
  a = args();
  a.options.lse_square_scale = -1;
  expect(a, ErrorKind::kValue, "lse_square_scale must be a finite number >= 0, got -1");
  a = args();
  a.options.reduction = LossReduction::kNone;
  expect(a, ErrorKind::kValue, "loss must have shape [4] (same as labels), got []");
  a = args();
  a.loss = lossN.view();
  expect(a, ErrorKind::kValue, "loss must have shape [] (a scalar for reduction 'sum' / 'mean'), got [4]");
  expect_error([] { parse_loss_reduction("avg", "fused_cross_entropy_loss"); }, ErrorKind::kValue,
               "reduction must be one of 'none', 'sum', 'mean', got 'avg'");
  // inplace_backward on strided logits, and a gradient buffer that partly overlaps the logits.
  TestTensor wide(DType::kFloat32, {4, 16});
  a = args();
  a.logits = wide.strided_view({4, 8}, {16, 1});
  a.grad_logits = a.logits;
  expect(a, ErrorKind::kValue, "inplace_backward (grad_logits == logits) needs contiguous logits");
  a = args();
  a.grad_logits = TensorView(static_cast<float*>(x.data()) + 3, DType::kFloat32, Device::cpu(), {4, 8});
  expect(a, ErrorKind::kValue, "grad_logits must be logits itself (in place) or not overlap it");
  TestTensor g16(DType::kBFloat16, {4, 8});
  a = args();
  a.grad_logits = g16.view();
  expect(a, ErrorKind::kType, "grad_logits must have the dtype of logits (float32), got bfloat16");
  a = args();
  expect_error([&] { fused_cross_entropy_loss_fwd(Context::cuda(0), a); }, ErrorKind::kValue,
               "logits must be on cuda:0 (the call's device), got cpu");
  // Backward.
  TestTensor g(DType::kFloat32, {}), g4(DType::kFloat32, {4});
  expect_error([&] {
    fused_cross_entropy_loss_bwd(ctx, {g4.view(), grad.view(), grad.view(), TensorView(), TensorView(),
                                       LossReduction::kSum});
  }, ErrorKind::kValue, "grad_loss must be a scalar for reduction 'sum', got shape [4]");
  expect_error([&] {
    fused_cross_entropy_loss_bwd(ctx, {g.view(), grad.view(), grad.view(), TensorView(), TensorView(),
                                       LossReduction::kNone});
  }, ErrorKind::kValue, "grad_loss must have one entry per row (4) for reduction 'none', got shape []");
  expect_error([&] {
    fused_cross_entropy_loss_bwd(ctx, {g.view(), grad.view(), TensorView(), TensorView(), TensorView(),
                                       LossReduction::kSum});
  }, ErrorKind::kValue, "grad_logits is required but was not given");
}

TEST(FusedCrossEntropyLoss, CudaWorkspaceIsChecked) {
  bool cuda = false;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) cuda |= b.device.kind == DeviceKind::kCUDA;
  if (!cuda) GTEST_SKIP() << "no CUDA backend runnable here";
  const Device dev = Device::cuda(0);
  TestTensor x(DType::kFloat32, {4, 8}, dev), labels(DType::kInt64, {4}, dev), loss(DType::kFloat32, {}, dev);
  TestTensor small(DType::kUInt8, {16}, dev);
  CrossEntropyFwdArgs a;
  a.logits = x.view();
  a.labels = labels.view();
  a.loss = loss.view();
  expect_error([&] { fused_cross_entropy_loss_fwd(Context::cuda(0), a); }, ErrorKind::kValue,
               "workspace is required but was not given");
  a.workspace = small.view();
  expect_error([&] { fused_cross_entropy_loss_fwd(Context::cuda(0), a); }, ErrorKind::kValue,
               "workspace must hold at least");
}

}  // namespace
}  // namespace fusedops::testing
