// causal_conv1d: every runnable backend against a float64 oracle written here (not the library's
// ref backend), forward and every gradient, NaN-poisoned outputs, L < W, L = 1, varlen with
// zero-length and length-1 sequences, odd channel counts, strided inputs, empty inputs, state
// chaining, determinism, and the error messages of docs/specs/ops.md section 4.5.
#include <cmath>
#include <cstring>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "causal_conv1d";

// Integer tensors (cu_seqlens) on the host or a device.
class IndexTensor {
 public:
  IndexTensor(DType dtype, const std::vector<int64_t>& values, Device device)
      : dtype_(dtype), n_(static_cast<int64_t>(values.size())), device_(device) {
    host_.resize(values.size() * 8 + 8);
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kInt32) {
        const int32_t v = static_cast<int32_t>(values[i]);
        std::memcpy(host_.data() + 4 * i, &v, 4);
      } else {
        std::memcpy(host_.data() + 8 * i, &values[i], 8);
      }
    }
    if (device.kind == DeviceKind::kCUDA) {
#ifdef FUSEDOPS_WITH_CUDA
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, host_.size()), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(p, host_.data(), host_.size(), cudaMemcpyHostToDevice), cudaSuccess);
      dev_ = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
#endif
    }
  }
  TensorView view() const {
    void* p = device_.kind == DeviceKind::kCUDA ? dev_.get() : const_cast<uint8_t*>(host_.data());
    return TensorView(p, dtype_, device_, {n_});
  }

 private:
  DType dtype_;
  int64_t n_;
  Device device_;
  std::vector<uint8_t> host_;
  std::shared_ptr<void> dev_;
};

struct Config {
  std::string name;
  std::vector<int64_t> xshape;  // [B, T, channel dims...]
  int64_t W;
  std::vector<int64_t> cu;  // empty: not varlen
  bool bias, residual, h0, final_state, silu;
};

int64_t channels(const std::vector<int64_t>& s) {
  int64_t d = 1;
  for (size_t i = 2; i < s.size(); ++i) d *= s[i];
  return d;
}

const std::vector<Config>& configs() {
  static const std::vector<Config> c = {
      {"basic", {2, 37, 67}, 4, {}, true, true, true, true, true},
      {"no_options", {2, 19, 32}, 4, {}, false, false, false, false, false},
      {"L1", {3, 1, 24}, 4, {}, true, false, true, true, true},
      {"L_lt_W", {2, 2, 13}, 4, {}, true, true, true, true, true},
      {"W1", {2, 9, 16}, 1, {}, true, false, true, true, true},
      {"W2", {1, 33, 40}, 2, {}, false, true, true, true, true},
      {"W3_linear", {2, 21, 9}, 3, {}, true, false, true, true, false},
      {"W5", {2, 17, 24}, 5, {}, true, false, true, true, true},
      {"W8", {1, 30, 16}, 8, {}, true, true, true, true, true},
      {"long_many_tiles", {2, 300, 40}, 4, {}, true, false, true, true, true},
      {"wide_D", {1, 20, 1100}, 4, {}, true, true, false, false, true},
      {"rank4", {2, 11, 3, 5}, 3, {}, true, true, true, true, true},
      {"varlen", {1, 40, 24}, 4, {0, 0, 1, 5, 5, 9, 40}, true, true, true, true, true},
      {"varlen_no_state", {1, 300, 19}, 3, {0, 3, 260, 261, 300}, true, false, false, false, true},
      {"varlen_states_only_out", {1, 12, 8}, 4, {0, 2, 12}, false, false, false, true, false},
      {"empty_T", {2, 0, 16}, 4, {}, true, false, true, true, true},
      {"empty_varlen", {1, 0, 8}, 3, {0, 0, 0}, true, false, true, true, true},
      {"empty_B", {0, 5, 8}, 4, {}, true, false, false, true, true},
  };
  return c;
}

// Values of every input as stored (rounded to their dtype), in contiguous layout.
struct Values {
  std::vector<double> x, w, b, r, h0, dy, dht;
};

struct Results {
  std::vector<double> y, fin, dx, dw, db, dh0;
};

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

// The float64 oracle when dt == kFloat64; otherwise the plain composite in dtype dt, as PyTorch
// eager runs it: conv (fp32 accumulation, one rounding), then silu, then + residual, each
// rounded; backward likewise, reductions accumulated sequentially in fp32.
Results oracle(const Config& c, const Values& v, DType dt, bool with_dht) {
  auto rd = [&](double x) { return round_to(dt, x); };
  const bool exact = dt == DType::kFloat64;
  const int64_t B = c.xshape[0], T = c.xshape[1], D = channels(c.xshape), W = c.W;
  const bool varlen = !c.cu.empty();
  const int64_t N = varlen ? static_cast<int64_t>(c.cu.size()) - 1 : B;
  Results out;
  out.y.assign(B * T * D, 0);
  out.dx.assign(B * T * D, 0);
  out.fin.assign(N * D * W, 0);
  out.dh0.assign(N * D * W, 0);
  std::vector<double> dw_acc(W * D, 0), db_acc(D, 0);
  std::vector<float> dw_f(W * D, 0), db_f(D, 0);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t batch = varlen ? 0 : n, begin = varlen ? c.cu[n] : 0;
    const int64_t L = varlen ? c.cu[n + 1] - c.cu[n] : T;
    for (int64_t d = 0; d < D; ++d) {
      auto xi = [&](int64_t tau) { return ((batch * T) + begin + tau) * D + d; };
      auto xt = [&](int64_t tau) -> double {
        if (tau >= 0) return v.x[xi(tau)];
        return c.h0 ? v.h0[(n * D + d) * W + tau + W] : 0.0;
      };
      auto dht = [&](int64_t j) { return with_dht ? v.dht[(n * D + d) * W + j] : 0.0; };
      std::vector<double> g(L);
      for (int64_t t = 0; t < L; ++t) {
        double acc = c.bias ? v.b[d] : 0.0;
        for (int64_t k = 0; k < W; ++k) acc += v.w[k * D + d] * xt(t - W + 1 + k);
        const double a = rd(acc);
        double y = c.silu ? rd(a * sigmoid(a)) : a;
        if (c.residual) y = rd(y + v.r[xi(t)]);
        out.y[xi(t)] = y;
        const double deriv = c.silu ? sigmoid(a) * (1 + a * (1 - sigmoid(a))) : 1.0;
        g[t] = rd(v.dy[xi(t)] * deriv);
      }
      for (int64_t j = 0; j < W; ++j) out.fin[(n * D + d) * W + j] = xt(L - W + j);
      for (int64_t tau = 0; tau < L; ++tau) {
        double acc = 0;
        for (int64_t k = 0; k < W; ++k) {
          const int64_t t = tau + W - 1 - k;
          if (t < L) acc += v.w[k * D + d] * g[t];
        }
        double dx = rd(acc);
        if (with_dht && tau >= L - W) dx = rd(dx + dht(tau - L + W));
        out.dx[xi(tau)] = dx;
      }
      for (int64_t t = 0; t < L; ++t) {
        if (exact) {
          db_acc[d] += g[t];
        } else {
          db_f[d] += static_cast<float>(g[t]);
        }
        for (int64_t k = 0; k < W; ++k) {
          const double p = g[t] * xt(t - W + 1 + k);
          if (exact) {
            dw_acc[k * D + d] += p;
          } else {
            dw_f[k * D + d] += static_cast<float>(p);
          }
        }
      }
      for (int64_t s = 0; s < W; ++s) {
        double acc = 0;
        for (int64_t t = 0; t < std::min(s, L); ++t) acc += v.w[(s - 1 - t) * D + d] * g[t];
        double r = rd(acc);
        if (s >= L && with_dht) r = rd(r + dht(s - L));
        out.dh0[(n * D + d) * W + s] = r;
      }
    }
  }
  out.dw.resize(W * D);
  out.db.resize(D);
  for (int64_t i = 0; i < W * D; ++i) out.dw[i] = exact ? dw_acc[i] : rd(dw_f[i]);
  for (int64_t d = 0; d < D; ++d) out.db[d] = exact ? db_acc[d] : rd(db_f[d]);
  return out;
}

std::vector<DType> dtypes_of(const BackendCase& b, Direction dir) {
  return dtypes_taken(kOp, dir, b);
}

// The tensors of one call on one device, filled with fresh random values.
struct Tensors {
  TestTensor x, w, b, r, h0, dy, dht, y, fin, dx, dw, db, dh0, ws;
  std::unique_ptr<IndexTensor> cu;
  Values v;

  Tensors(const Config& c, DType dt, Device dev, uint64_t seed) {
    const int64_t D = channels(c.xshape), W = c.W;
    const int64_t N = c.cu.empty() ? c.xshape[0] : static_cast<int64_t>(c.cu.size()) - 1;
    x = TestTensor(dt, c.xshape, dev);
    v.x = x.fill_normal(seed, 0.3, 1.0);
    w = TestTensor(dt, {W, D}, dev);
    v.w = w.fill_normal(seed + 1, 0.0, 0.6);
    b = TestTensor(dt, {D}, dev);
    v.b = b.fill_normal(seed + 2, 0.1, 0.5);
    r = TestTensor(dt, c.xshape, dev);
    v.r = r.fill_normal(seed + 3);
    h0 = TestTensor(dt, {N, D, W}, dev);
    v.h0 = h0.fill_normal(seed + 4, -0.2, 1.0);
    dy = TestTensor(dt, c.xshape, dev);
    v.dy = dy.fill_normal(seed + 5);
    dht = TestTensor(dt, {N, D, W}, dev);
    v.dht = dht.fill_normal(seed + 6);
    y = TestTensor(dt, c.xshape, dev);
    fin = TestTensor(dt, {N, D, W}, dev);
    dx = TestTensor(dt, c.xshape, dev);
    dw = TestTensor(dt, {W, D}, dev);
    db = TestTensor(dt, {D}, dev);
    dh0 = TestTensor(dt, {N, D, W}, dev);
    for (TestTensor* t : {&y, &fin, &dx, &dw, &db, &dh0}) t->fill_nan();
    if (!c.cu.empty()) cu = std::make_unique<IndexTensor>(DType::kInt32, c.cu, dev);
  }

  CausalConv1dFwdArgs fwd_args(const Config& c) const {
    CausalConv1dFwdArgs a;
    a.x = x.view();
    a.weight = w.view();
    if (c.bias) a.bias = b.view();
    if (c.residual) a.residual = r.view();
    if (c.h0) a.initial_state = h0.view();
    if (cu) a.cu_seqlens = cu->view();
    a.y = y.view();
    if (c.final_state) a.final_state = fin.view();
    a.activation = c.silu ? CausalConv1dActivation::kSilu : CausalConv1dActivation::kNone;
    return a;
  }

  // Every gradient requested; the workspace allocated as the backend asks.
  CausalConv1dBwdArgs bwd_args(const Config& c, const Context& ctx, bool with_dht) {
    CausalConv1dBwdArgs a;
    a.x = x.view();
    a.weight = w.view();
    if (c.bias) a.bias = b.view();
    if (c.h0) a.initial_state = h0.view();
    if (cu) a.cu_seqlens = cu->view();
    a.dy = dy.view();
    if (with_dht) a.d_final_state = dht.view();
    a.dx = dx.view();
    a.dweight = dw.view();
    if (c.bias) a.dbias = db.view();
    if (c.h0) a.d_initial_state = dh0.view();
    a.activation = c.silu ? CausalConv1dActivation::kSilu : CausalConv1dActivation::kNone;
    const size_t bytes = causal_conv1d_bwd_workspace_size(ctx, a);
    if (bytes) {
      ws = TestTensor(DType::kUInt8, {static_cast<int64_t>(bytes)}, ctx.device);
      a.workspace = ws.view();
    }
    return a;
  }
};

void expect_close(const char* what, const std::vector<double>& ours, const std::vector<double>& base,
                  const std::vector<double>& ref, DType dt) {
  const Verdict v = check_close(ours, base, ref, dt);
  EXPECT_TRUE(v.pass) << what << ": " << v.describe();
}

TEST(CausalConv1d, ForwardMatchesFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& be : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : dtypes_of(be, Direction::kForward)) {
      for (const Config& c : configs()) {
        SCOPED_TRACE(case_name(be.id, dt, c.xshape) + " " + c.name);
        Tensors t(c, dt, be.device, 1000 + checked);
        causal_conv1d_fwd(be.ctx(), t.fwd_args(c));
        const Results ref = oracle(c, t.v, DType::kFloat64, false);
        const Results base = oracle(c, t.v, dt, false);
        expect_close("y", t.y.to_double(), base.y, ref.y, dt);
        if (c.final_state) {
          // The final state is a copy of stored values: exact.
          EXPECT_EQ(t.fin.to_double(), ref.fin);
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CausalConv1d, BackwardMatchesFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& be : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dt : dtypes_of(be, Direction::kBackward)) {
      for (const Config& c : configs()) {
        for (bool with_dht : {false, true}) {
          SCOPED_TRACE(case_name(be.id, dt, c.xshape) + " " + c.name +
                       (with_dht ? " +d_final_state" : ""));
          Tensors t(c, dt, be.device, 5000 + checked);
          const Context ctx = be.ctx();
          causal_conv1d_bwd(ctx, t.bwd_args(c, ctx, with_dht));
          const Results ref = oracle(c, t.v, DType::kFloat64, with_dht);
          const Results base = oracle(c, t.v, dt, with_dht);
          expect_close("dx", t.dx.to_double(), base.dx, ref.dx, dt);
          expect_close("dweight", t.dw.to_double(), base.dw, ref.dw, dt);
          if (c.bias) expect_close("dbias", t.db.to_double(), base.db, ref.db, dt);
          if (c.h0) expect_close("d_initial_state", t.dh0.to_double(), base.dh0, ref.dh0, dt);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Partial requests: only dx (no parameter gradients, no workspace), or dx + dbias; a float32
// weight and bias with 16-bit activations (mixed precision); int64 cu_seqlens.
TEST(CausalConv1d, OptionalGradientsMixedDtypesAndInt64Offsets) {
  for (const auto& be : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dt : {DType::kBFloat16, DType::kFloat32}) {
      if (!backend_takes(kOp, Direction::kBackward, be.id, dt)) continue;
      SCOPED_TRACE(be.id + "/" + dtype_name(dt));
      const Config c{"mixed", {1, 50, 20}, 4, {0, 7, 50}, true, false, true, true, true};
      Tensors t(c, dt, be.device, 77);
      IndexTensor cu64(DType::kInt64, c.cu, be.device);
      TestTensor w32(DType::kFloat32, {4, 20}, be.device), b32(DType::kFloat32, {20}, be.device);
      t.v.w = w32.fill_normal(3, 0.0, 0.6);
      t.v.b = b32.fill_normal(4, 0.1, 0.5);
      TestTensor dw32(DType::kFloat32, {4, 20}, be.device), db32(DType::kFloat32, {20}, be.device);
      dw32.fill_nan();
      db32.fill_nan();
      const Context ctx = be.ctx();
      CausalConv1dFwdArgs fa = t.fwd_args(c);
      fa.weight = w32.view();
      fa.bias = b32.view();
      fa.cu_seqlens = cu64.view();
      causal_conv1d_fwd(ctx, fa);
      const Results ref = oracle(c, t.v, DType::kFloat64, true);
      const Results base = oracle(c, t.v, dt, true);
      expect_close("y", t.y.to_double(), base.y, ref.y, dt);

      for (int mode = 0; mode < 2; ++mode) {
        t.dx.fill_nan();
        CausalConv1dBwdArgs ba = t.bwd_args(c, ctx, true);
        ba.weight = w32.view();
        ba.bias = b32.view();
        ba.cu_seqlens = cu64.view();
        ba.dweight = mode == 0 ? TensorView() : dw32.view();
        ba.dbias = db32.view();
        ba.d_initial_state = TensorView();
        ba.workspace = TensorView();
        TestTensor ws;
        if (size_t bytes = causal_conv1d_bwd_workspace_size(ctx, ba)) {
          ws = TestTensor(DType::kUInt8, {static_cast<int64_t>(bytes)}, ctx.device);
          ba.workspace = ws.view();
        }
        causal_conv1d_bwd(ctx, ba);
        expect_close("dx", t.dx.to_double(), base.dx, ref.dx, dt);
        expect_close("dbias", db32.to_double(), base.db, ref.db, dt);
        if (mode == 1) expect_close("dweight", dw32.to_double(), base.dw, ref.dw, dt);
      }
    }
  }
}

// x, residual and dy as slices of wider buffers (time stride 2D), the weight as the transposed
// view of a [D, W] tensor: the same results as contiguous inputs.
TEST(CausalConv1d, StridedInputsAndTransposedWeight) {
  for (const auto& be : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, be.id, dt)) continue;
      SCOPED_TRACE(be.id + "/" + dtype_name(dt));
      const int64_t B = 2, T = 45, D = 64, W = 4;
      const Config c{"strided", {B, T, D}, W, {}, true, true, true, true, true};
      Tensors t(c, dt, be.device, 31);
      TestTensor xb(dt, {B, T, 2 * D}, be.device), rb(dt, {B, T, 2 * D}, be.device),
          dyb(dt, {B, T, 2 * D}, be.device), wdw(dt, {D, W}, be.device);
      std::vector<double> xv(B * T * 2 * D), rv(xv.size()), dyv(xv.size()), wv(D * W);
      for (int64_t i = 0; i < B * T; ++i)
        for (int64_t d = 0; d < D; ++d) {
          xv[i * 2 * D + d] = t.v.x[i * D + d];
          rv[i * 2 * D + d] = t.v.r[i * D + d];
          dyv[i * 2 * D + d] = t.v.dy[i * D + d];
          xv[i * 2 * D + D + d] = rv[i * 2 * D + D + d] = dyv[i * 2 * D + D + d] = 1e30;
        }
      for (int64_t d = 0; d < D; ++d)
        for (int64_t k = 0; k < W; ++k) wv[d * W + k] = t.v.w[k * D + d];
      xb.set(xv);
      rb.set(rv);
      dyb.set(dyv);
      wdw.set(wv);
      const std::vector<int64_t> shape{B, T, D}, strides{T * 2 * D, 2 * D, 1};
      const TensorView wt = wdw.strided_view({W, D}, {1, W});
      const Context ctx = be.ctx();

      causal_conv1d_fwd(ctx, t.fwd_args(c));
      TestTensor y2(dt, c.xshape, be.device), f2(dt, {B, D, W}, be.device);
      CausalConv1dFwdArgs fa = t.fwd_args(c);
      fa.x = xb.strided_view(shape, strides);
      fa.residual = rb.strided_view(shape, strides);
      fa.weight = wt;
      fa.y = y2.view();
      fa.final_state = f2.view();
      causal_conv1d_fwd(ctx, fa);
      const Results ref = oracle(c, t.v, DType::kFloat64, true);
      const Results base = oracle(c, t.v, dt, true);
      expect_close("y strided", y2.to_double(), base.y, ref.y, dt);
      EXPECT_EQ(f2.to_double(), ref.fin);

      CausalConv1dBwdArgs ba = t.bwd_args(c, ctx, true);
      ba.x = fa.x;
      ba.weight = wt;
      ba.dy = dyb.strided_view(shape, strides);
      causal_conv1d_bwd(ctx, ba);
      expect_close("dx strided", t.dx.to_double(), base.dx, ref.dx, dt);
      expect_close("dweight strided", t.dw.to_double(), base.dw, ref.dw, dt);
      expect_close("dh0 strided", t.dh0.to_double(), base.dh0, ref.dh0, dt);
    }
  }
}

// A prefix and then the suffix started from the prefix's final state give the outputs of the
// whole sequence (bitwise: every output element sees the same inputs in the same order), and
// the backward chained through d_final_state / d_initial_state gives the whole's dx.
TEST(CausalConv1d, StateChainingEqualsTheWholeSequence) {
  for (const auto& be : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, be.id, dt)) continue;
      for (int64_t split : {1, 2, 7, 20}) {
        SCOPED_TRACE(be.id + "/" + dtype_name(dt) + " split " + std::to_string(split));
        const int64_t B = 2, T = 23, D = 24, W = 4;
        const Config whole{"whole", {B, T, D}, W, {}, true, true, true, true, true};
        Tensors t(whole, dt, be.device, 91 + split);
        const Context ctx = be.ctx();
        causal_conv1d_fwd(ctx, t.fwd_args(whole));
        const std::vector<double> y_whole = t.y.to_double(), f_whole = t.fin.to_double();

        const Config pre{"pre", {B, split, D}, W, {}, true, true, true, true, true};
        const Config suf{"suf", {B, T - split, D}, W, {}, true, true, true, true, true};
        Tensors tp(pre, dt, be.device, 1), ts(suf, dt, be.device, 2);
        auto copy_time = [&](const std::vector<double>& src, int64_t t0, int64_t len) {
          std::vector<double> out(B * len * D);
          for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < len; ++i)
              for (int64_t d = 0; d < D; ++d)
                out[(b * len + i) * D + d] = src[(b * T + t0 + i) * D + d];
          return out;
        };
        for (auto* p : {&tp, &ts}) {
          p->w.set(t.v.w);
          p->b.set(t.v.b);
        }
        tp.x.set(copy_time(t.v.x, 0, split));
        tp.r.set(copy_time(t.v.r, 0, split));
        tp.h0.set(t.v.h0);
        ts.x.set(copy_time(t.v.x, split, T - split));
        ts.r.set(copy_time(t.v.r, split, T - split));
        causal_conv1d_fwd(ctx, tp.fwd_args(pre));
        ts.h0.set(tp.fin.to_double());
        causal_conv1d_fwd(ctx, ts.fwd_args(suf));
        EXPECT_EQ(tp.y.to_double(), copy_time(y_whole, 0, split));
        EXPECT_EQ(ts.y.to_double(), copy_time(y_whole, split, T - split));
        EXPECT_EQ(ts.fin.to_double(), f_whole);

        // Backward: whole with dy, dht; suffix with its dy slice and dht, then the prefix with
        // the suffix's d_initial_state as its d_final_state.
        t.dy.set(t.v.dy);
        causal_conv1d_bwd(ctx, t.bwd_args(whole, ctx, true));
        ts.dy.set(copy_time(t.v.dy, split, T - split));
        ts.dht.set(t.v.dht);
        causal_conv1d_bwd(ctx, ts.bwd_args(suf, ctx, true));
        tp.dy.set(copy_time(t.v.dy, 0, split));
        tp.dht.set(ts.dh0.to_double());
        causal_conv1d_bwd(ctx, tp.bwd_args(pre, ctx, true));
        const Results ref = oracle(whole, t.v, DType::kFloat64, true);
        const Results base = oracle(whole, t.v, dt, true);
        std::vector<double> dx_chain(B * T * D);
        const std::vector<double> dxp = tp.dx.to_double(), dxs = ts.dx.to_double();
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < T; ++i)
            for (int64_t d = 0; d < D; ++d)
              dx_chain[(b * T + i) * D + d] = i < split ? dxp[(b * split + i) * D + d]
                                                        : dxs[(b * (T - split) + i - split) * D + d];
        expect_close("dx whole", t.dx.to_double(), base.dx, ref.dx, dt);
        expect_close("dx chained", dx_chain, base.dx, ref.dx, dt);
        expect_close("dh0 chained", tp.dh0.to_double(), base.dh0, ref.dh0, dt);
        std::vector<double> dw_chain(W * D);
        const std::vector<double> dwp = tp.dw.to_double(), dws = ts.dw.to_double();
        for (int64_t i = 0; i < W * D; ++i) dw_chain[i] = dwp[i] + dws[i];
        // The sum of two rounded partial gradients (one more rounding than the whole): within
        // the floor.
        expect_close("dweight chained", dw_chain, base.dw, ref.dw, dt);
      }
    }
  }
}

TEST(CausalConv1d, RepeatedBackwardIsBitwiseIdentical) {
  for (const auto& be : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kBackward, be.id, dt)) continue;
      SCOPED_TRACE(be.id + "/" + dtype_name(dt));
      const Config c{"det", {2, 300, 72}, 4, {}, true, false, true, true, true};
      Tensors t(c, dt, be.device, 5);
      const Context ctx = be.ctx();
      std::vector<std::vector<uint8_t>> first;
      for (int run = 0; run < 3; ++run) {
        causal_conv1d_bwd(ctx, t.bwd_args(c, ctx, true));
        std::vector<std::vector<uint8_t>> now{t.dx.bytes(), t.dw.bytes(), t.db.bytes(), t.dh0.bytes()};
        if (run == 0) {
          first = now;
        } else {
          EXPECT_EQ(now, first) << "run " << run << " differs from run 0";
        }
      }
    }
  }
}

TEST(CausalConv1d, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  const Config c{"err", {2, 5, 8}, 4, {}, true, true, true, true, true};
  Tensors t(c, DType::kFloat32, Device::cpu(), 1);
  auto fwd_with = [&](auto&& edit) {
    CausalConv1dFwdArgs a = t.fwd_args(c);
    edit(a);
    causal_conv1d_fwd(ctx, a);
  };
  TestTensor x2(DType::kFloat32, {2, 5});
  expect_error([&] { fwd_with([&](auto& a) { a.x = x2.view(); }); }, ErrorKind::kValue,
               "causal_conv1d: x must have rank >= 3, got rank 2");
  TestTensor w_bad(DType::kFloat32, {4, 9}), w_rank(DType::kFloat32, {4}), w_zero(DType::kFloat32, {0, 8});
  expect_error([&] { fwd_with([&](auto& a) { a.weight = w_bad.view(); }); }, ErrorKind::kValue,
               "weight must have shape [W,D] with D = 8 (x's channels) and W >= 1, got [4,9]");
  expect_error([&] { fwd_with([&](auto& a) { a.weight = w_rank.view(); }); }, ErrorKind::kValue,
               "weight must have shape [W,D] with D = 8 (x's channels) and W >= 1, got [4]");
  expect_error([&] { fwd_with([&](auto& a) { a.weight = w_zero.view(); }); }, ErrorKind::kValue,
               "weight must have shape [W,D] with D = 8 (x's channels) and W >= 1, got [0,8]");
  TestTensor b_bad(DType::kFloat32, {9});
  expect_error([&] { fwd_with([&](auto& a) { a.bias = b_bad.view(); }); }, ErrorKind::kValue,
               "bias must have shape [8] ([D], D = x's channels), got [9]");
  TestTensor r_bad(DType::kFloat32, {2, 6, 8});
  expect_error([&] { fwd_with([&](auto& a) { a.residual = r_bad.view(); }); }, ErrorKind::kValue,
               "residual must have shape [2,5,8] (same as x), got [2,6,8]");
  TestTensor r_half(DType::kFloat16, {2, 5, 8});
  expect_error([&] { fwd_with([&](auto& a) { a.residual = r_half.view(); }); }, ErrorKind::kType,
               "residual must have the dtype of x (float32), got float16");
  TestTensor h_bad(DType::kFloat32, {2, 8, 3});
  expect_error([&] { fwd_with([&](auto& a) { a.initial_state = h_bad.view(); }); }, ErrorKind::kValue,
               "initial_state must have shape [2,8,4] ([N,D,W]), got [2,8,3]");
  expect_error([] { causal_conv1d_activation("relu"); }, ErrorKind::kValue,
               "causal_conv1d: activation must be one of None, 'silu', 'swish', got 'relu'");
  EXPECT_EQ(causal_conv1d_activation("swish"), CausalConv1dActivation::kSilu);
  EXPECT_EQ(causal_conv1d_activation("silu"), CausalConv1dActivation::kSilu);
  EXPECT_EQ(causal_conv1d_activation(""), CausalConv1dActivation::kNone);

  IndexTensor cu_ok(DType::kInt32, {0, 2, 5}, Device::cpu());
  expect_error([&] { fwd_with([&](auto& a) { a.cu_seqlens = cu_ok.view(); }); }, ErrorKind::kValue,
               "cu_seqlens requires x with batch size B == 1, got x of shape [2,5,8]");
  const Config v{"errv", {1, 5, 8}, 4, {0, 2, 5}, true, true, true, true, true};
  Tensors tv(v, DType::kFloat32, Device::cpu(), 2);
  auto vfwd_with = [&](const std::vector<int64_t>& offs, DType dt = DType::kInt32) {
    IndexTensor cu(dt, offs, Device::cpu());
    CausalConv1dFwdArgs a = tv.fwd_args(v);
    a.cu_seqlens = cu.view();
    a.initial_state = TensorView();
    a.final_state = TensorView();
    causal_conv1d_fwd(ctx, a);
  };
  expect_error([&] { vfwd_with({0, 3, 2, 5}); }, ErrorKind::kValue,
               "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 2 < cu_seqlens[1] = 3");
  expect_error([&] { vfwd_with({1, 3, 5}); }, ErrorKind::kValue,
               "cu_seqlens must start at 0, got cu_seqlens[0] = 1");
  expect_error([&] { vfwd_with({0, 3, 4}, DType::kInt64); }, ErrorKind::kValue,
               "cu_seqlens must end at T = 5 (x's time steps), got cu_seqlens[2] = 4");
  TestTensor cu_f(DType::kFloat32, {3});
  expect_error([&] { fwd_with([&](auto& a) { a.cu_seqlens = cu_f.view(); }); }, ErrorKind::kType,
               "cu_seqlens must have dtype in {int32, int64}, got float32");
  // initial_state must be [N,D,W] with N = the number of sequences when varlen.
  expect_error([&] {
    CausalConv1dFwdArgs a = tv.fwd_args(v);
    a.initial_state = t.h0.view();  // [2,8,4] fits N = 2
    IndexTensor cu3(DType::kInt32, {0, 1, 2, 5}, Device::cpu());
    a.cu_seqlens = cu3.view();
    causal_conv1d_fwd(ctx, a);
  }, ErrorKind::kValue, "initial_state must have shape [3,8,4] ([N,D,W]), got [2,8,4]");

  TestTensor xi(DType::kInt32, {2, 5, 8});
  expect_error([&] { fwd_with([&](auto& a) { a.x = xi.view(); }); }, ErrorKind::kType,
               "x must have dtype in {float32, bfloat16, float16, float64}, got int32");
  TestTensor y_bad(DType::kFloat32, {2, 5, 9});
  expect_error([&] { fwd_with([&](auto& a) { a.y = y_bad.view(); }); }, ErrorKind::kValue,
               "y must have shape [2,5,8] (same as x), got [2,5,9]");
  TestTensor xwide(DType::kFloat32, {2, 5, 16});
  expect_error([&] {
    fwd_with([&](auto& a) { a.x = xwide.strided_view({2, 5, 8}, {80, 16, 2}); });
  }, ErrorKind::kValue, "x must have dense channel dimensions");
  expect_error([&] { causal_conv1d_fwd(Context::cuda(0), t.fwd_args(c)); }, ErrorKind::kValue,
               "x must be on cuda:0 (the call's device), got cpu");

  // Backward-only arguments.
  auto bwd_with = [&](auto&& edit) {
    CausalConv1dBwdArgs a = t.bwd_args(c, ctx, true);
    edit(a);
    causal_conv1d_bwd(ctx, a);
  };
  TestTensor dy_bad(DType::kFloat32, {2, 5, 7});
  expect_error([&] { bwd_with([&](auto& a) { a.dy = dy_bad.view(); }); }, ErrorKind::kValue,
               "dy must have shape [2,5,8] (same as x), got [2,5,7]");
  expect_error([&] { bwd_with([&](auto& a) { a.dx = TensorView(); }); }, ErrorKind::kValue,
               "dx is required but was not given");
  expect_error([&] { bwd_with([&](auto& a) { a.d_final_state = h_bad.view(); }); }, ErrorKind::kValue,
               "d_final_state must have shape [2,8,4] ([N,D,W]), got [2,8,3]");
  expect_error([&] { bwd_with([&](auto& a) { a.bias = TensorView(); }); }, ErrorKind::kValue,
               "dbias was given but bias was not");
  expect_error([&] { bwd_with([&](auto& a) { a.initial_state = TensorView(); }); }, ErrorKind::kValue,
               "d_initial_state was given but initial_state was not");
  TestTensor dw_bad(DType::kFloat32, {3, 8});
  expect_error([&] { bwd_with([&](auto& a) { a.dweight = dw_bad.view(); }); }, ErrorKind::kValue,
               "dweight must have shape [4,8] ([W,D], as weight), got [3,8]");
}

#ifdef FUSEDOPS_WITH_CUDA
// On CUDA the kernels clamp the offsets and report bad ones (raised by check_device_errors);
// with debug checks the call copies them to the host and raises the CPU's message.
TEST(CausalConv1d, CudaChecksOffsetsOnTheDeviceAndInDebugMode) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Config v{"errv", {1, 5, 8}, 4, {0, 2, 5}, true, false, false, false, true};
  Tensors t(v, DType::kFloat32, Device::cuda(0), 3);
  Context ctx = Context::cuda(0);
  check_device_errors(ctx);
  IndexTensor bad(DType::kInt32, {0, 4, 3}, Device::cuda(0));
  CausalConv1dFwdArgs a = t.fwd_args(v);
  a.cu_seqlens = bad.view();
  EXPECT_NO_THROW(causal_conv1d_fwd(ctx, a));
  expect_error([&] { check_device_errors(ctx); }, ErrorKind::kValue,
               "causal_conv1d: cu_seqlens must start at 0, be non-decreasing and end at T; "
               "cu_seqlens[2] = 3 is not");
  IndexTensor past(DType::kInt64, {0, 2, 7}, Device::cuda(0));
  a.cu_seqlens = past.view();
  EXPECT_NO_THROW(causal_conv1d_fwd(ctx, a));
  expect_error([&] { check_device_errors(ctx); }, ErrorKind::kValue, "cu_seqlens[2] = 7 is not");
  Context debug = ctx;
  debug.validate = true;
  a.cu_seqlens = bad.view();
  expect_error([&] { causal_conv1d_fwd(debug, a); }, ErrorKind::kValue,
               "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 3 < cu_seqlens[1] = 4");
  IndexTensor good(DType::kInt32, {0, 2, 5}, Device::cuda(0));
  a.cu_seqlens = good.view();
  causal_conv1d_fwd(debug, a);
  EXPECT_NO_THROW(check_device_errors(ctx));
}
#endif

}  // namespace
}  // namespace fusedops::testing
