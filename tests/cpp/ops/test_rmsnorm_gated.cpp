// rmsnorm_gated: every runnable backend against a float64 oracle written here (plain loops, not the
// library's ref backend), forward and every gradient (x, z, weight, bias, residual), both gate
// positions, silu and sigmoid, group sizes, optional weight / bias / z, a residual in x's dtype or
// fp32, odd and empty shapes, strided rows, NaN-poisoned outputs, determinism and the error
// messages of docs/specs/ops.md section 5.5.
#include <cmath>
#include <optional>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "rmsnorm_gated";
constexpr double kEps = 1e-6;

struct Config {
  const char* name;
  bool nbg = true;
  GateActivation act = GateActivation::kSilu;
  bool z = true, w = true, b = false;
  bool residual = false;
  bool f32_params = false;  // weight, bias, residual (and so residual_out, dresidual) in fp32
};

const std::vector<Config> kConfigs = {
    {"gate-after silu, weight", true, GateActivation::kSilu, true, true, false},
    {"gate-after sigmoid, weight+bias", true, GateActivation::kSigmoid, true, true, true},
    {"gate-first silu, weight+bias", false, GateActivation::kSilu, true, true, true},
    {"no gate, weight", true, GateActivation::kSilu, false, true, false},
    {"gate-first, no weight", false, GateActivation::kSilu, true, false, false},
    {"gate-after, residual", true, GateActivation::kSilu, true, false, true, true},
    {"gate-after, fp32 weight/bias/residual", true, GateActivation::kSilu, true, true, true, true, true},
};

struct Shape {
  std::vector<int64_t> shape;
  std::vector<int64_t> groups;  // group sizes to try (0: D)
};

const std::vector<Shape> kShapes = {
    {{1, 1}, {0}},       {{3, 129}, {0, 43}},   {{2, 256}, {0, 64}},     {{5, 3, 128}, {0, 32}},
    {{7}, {0}},          {{257, 64}, {0, 16}},  {{96, 1024}, {0, 256}},  {{4, 2560}, {0}},
    {{0, 16}, {0}},      {{4, 0}, {0}}};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double act_of(GateActivation a, double z) { return a == GateActivation::kSilu ? z * sigmoid(z) : sigmoid(z); }
double act_grad(GateActivation a, double z) {
  const double s = sigmoid(z);
  return a == GateActivation::kSilu ? s * (1.0 + z * (1.0 - s)) : s * (1.0 - s);
}

struct Inputs {
  int64_t rows, D, g;
  std::vector<double> x, z, w, b, res, dy, dres;
};

struct Outputs {
  std::vector<double> y, res_out, rstd, dx, dz, dw, db;
};

// Forward and backward with every intermediate rounded to `dtype` (the plain PyTorch composite
// in that dtype); kFloat64 gives the oracle. The backward starts from the saved x (x + residual
// as stored in residual_out's dtype `rdt`).
Outputs math(const Inputs& in, const Config& c, DType dtype, DType rdt) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  const int64_t D = in.D, g = in.g, G = g ? D / g : 0;
  Outputs o;
  o.y.assign(in.rows * D, 0);
  o.res_out.assign(in.rows * D, 0);
  o.rstd.assign(in.rows * G, 0);
  o.dx.assign(in.rows * D, 0);
  o.dz.assign(in.rows * D, 0);
  o.dw.assign(D, 0);
  o.db.assign(D, 0);
  auto W = [&](int64_t d) { return c.w ? in.w[d] : 1.0; };
  auto B = [&](int64_t d) { return c.b ? in.b[d] : 0.0; };
  for (int64_t r = 0; r < in.rows; ++r) {
    std::vector<double> x(D), v(D), sz(D, 1.0);
    for (int64_t d = 0; d < D; ++d) {
      const int64_t i = r * D + d;
      x[d] = c.residual ? round_to(rdt, in.x[i] + in.res[i]) : in.x[i];
      o.res_out[i] = x[d];
      if (c.z) sz[d] = rd(act_of(c.nbg ? c.act : GateActivation::kSilu, in.z[i]));
      v[d] = (c.z && !c.nbg) ? rd(x[d] * sz[d]) : x[d];
    }
    for (int64_t s = 0; s < G; ++s) {
      double ss = 0;
      for (int64_t d = s * g; d < (s + 1) * g; ++d) ss += rd(v[d] * v[d]);
      const double rs = rd(1.0 / std::sqrt(rd(rd(ss / g) + kEps)));
      o.rstd[r * G + s] = rs;
      // backward pieces
      double dot = 0;
      std::vector<double> t(D), vh(D);
      for (int64_t d = s * g; d < (s + 1) * g; ++d) {
        const int64_t i = r * D + d;
        vh[d] = rd(v[d] * rs);
        const double h = rd(rd(vh[d] * W(d)) + B(d));
        o.y[i] = (c.z && c.nbg) ? rd(h * sz[d]) : h;
        t[d] = (c.z && c.nbg) ? rd(in.dy[i] * sz[d]) : in.dy[i];  // gradient reaching h
        dot += rd(vh[d] * rd(t[d] * W(d)));
      }
      const double mean = rd(dot / g);
      for (int64_t d = s * g; d < (s + 1) * g; ++d) {
        const int64_t i = r * D + d;
        const double dv = rd(rs * rd(rd(t[d] * W(d)) - rd(vh[d] * mean)));
        o.dw[d] += rd(t[d] * vh[d]);
        o.db[d] += t[d];
        if (c.z && c.nbg) {
          const double h = rd(rd(vh[d] * W(d)) + B(d));
          o.dz[i] = rd(rd(in.dy[i] * h) * rd(act_grad(c.act, in.z[i])));
          o.dx[i] = dv;
        } else if (c.z) {
          o.dz[i] = rd(rd(dv * x[d]) * rd(act_grad(GateActivation::kSilu, in.z[i])));
          o.dx[i] = rd(dv * sz[d]);
        } else {
          o.dx[i] = dv;
        }
        if (c.residual) o.dx[i] = rd(o.dx[i] + in.dres[i]);
      }
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    o.dw[d] = rd(o.dw[d]);
    o.db[d] = rd(o.db[d]);
  }
  return o;
}

// The dtypes backend b takes in both directions.
std::vector<DType> dtypes_of(const BackendCase& b) {
  return dtypes_taken(kOp, Direction::kBackward, b, dtypes_taken(kOp, Direction::kForward, b));
}

DType stat_dtype(DType x) { return x == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

void expect_close(const char* what, const std::vector<double>& got, const std::vector<double>& base,
                  const std::vector<double>& ref, DType dtype) {
  Verdict v = check_close(got, base, ref, dtype);
  EXPECT_TRUE(v.pass) << what << ": " << v.describe();
}

TEST(RmsNormGated, ForwardAndBackwardMatchFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& bk : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : dtypes_of(bk)) {
      for (const auto& sh : kShapes) {
        for (int64_t gs : sh.groups) {
          for (const Config& c : kConfigs) {
            const auto& shape = sh.shape;
            SCOPED_TRACE(case_name(bk.id, dt, shape) + " group " + std::to_string(gs) + " " + c.name);
            const Device dev = bk.device;
            const DType pdt = c.f32_params ? DType::kFloat32 : dt;  // weight / bias / residual
            std::vector<int64_t> lead(shape.begin(), shape.end() - 1);
            const int64_t D = shape.back();
            Inputs in;
            in.D = D;
            in.g = gs ? gs : D;
            in.rows = 1;
            for (int64_t s : lead) in.rows *= s;
            const int64_t G = in.g ? D / in.g : 0;
            std::vector<int64_t> rshape = lead;
            rshape.push_back(G);
            const uint64_t seed = 100 * checked;
            TestTensor x(dt, shape, dev), z(dt, shape, dev), w(pdt, {D}, dev), b(pdt, {D}, dev);
            TestTensor res(pdt, shape, dev), dy(dt, shape, dev), dres(pdt, shape, dev);
            in.x = x.fill_normal(seed + 1, 0.2, 1.3);
            in.z = z.fill_normal(seed + 2, 0.1, 2.0);
            in.w = w.fill_normal(seed + 3, 1.0, 0.3);
            in.b = b.fill_normal(seed + 4, 0.0, 0.5);
            in.res = res.fill_normal(seed + 5, -0.1, 1.0);
            in.dy = dy.fill_normal(seed + 6, 0.0, 1.0);
            in.dres = dres.fill_normal(seed + 7, 0.0, 1.0);
            TestTensor y(dt, shape, dev), res_out(pdt, shape, dev), rstd(stat_dtype(dt), rshape, dev);
            y.fill_nan();
            res_out.fill_nan();
            rstd.fill_nan();

            RmsNormGatedFwdArgs fa;
            fa.x = x.view();
            fa.z = c.z ? z.view() : TensorView();
            fa.weight = c.w ? w.view() : TensorView();
            fa.bias = c.b ? b.view() : TensorView();
            fa.residual = c.residual ? res.view() : TensorView();
            fa.y = y.view();
            fa.residual_out = c.residual ? res_out.view() : TensorView();
            fa.rstd = rstd.view();
            fa.eps = kEps;
            fa.group_size = gs;
            fa.norm_before_gate = c.nbg;
            fa.activation = c.act;
            rmsnorm_gated_fwd(bk.ctx(), fa);

            const Outputs ref = math(in, c, DType::kFloat64, pdt);
            const Outputs base = math(in, c, dt, pdt);
            expect_close("y", y.to_double(), base.y, ref.y, dt);
            expect_close("rstd", rstd.to_double(), base.rstd, ref.rstd, dt);
            if (c.residual) expect_close("residual_out", res_out.to_double(), ref.res_out, ref.res_out, pdt);

            // Backward from what the forward saved.
            const TestTensor& saved = c.residual ? res_out : x;
            TestTensor dx(dt, shape, dev), dz(dt, shape, dev), dw(pdt, {D}, dev), db(pdt, {D}, dev);
            TestTensor dres_in(pdt, shape, dev);
            for (auto* t : {&dx, &dz, &dw, &db, &dres_in}) t->fill_nan();
            RmsNormGatedBwdArgs ba;
            ba.dy = dy.view();
            ba.x = saved.view();
            ba.z = fa.z;
            ba.weight = fa.weight;
            ba.bias = fa.bias;
            ba.rstd = rstd.view();
            ba.dresidual = c.residual ? dres.view() : TensorView();
            ba.dx = dx.view();
            ba.dz = c.z ? dz.view() : TensorView();
            ba.dweight = c.w ? dw.view() : TensorView();
            ba.dbias = c.b ? db.view() : TensorView();
            ba.dresidual_in = c.residual ? dres_in.view() : TensorView();
            ba.group_size = gs;
            ba.norm_before_gate = c.nbg;
            ba.activation = c.act;
            const int64_t ws_bytes = rmsnorm_gated_bwd_workspace_size(ba);
            TestTensor ws(DType::kUInt8, {std::max<int64_t>(ws_bytes, 1)}, dev);
            if (ws_bytes > 0) ba.workspace = ws.view();
            rmsnorm_gated_bwd(bk.ctx(), ba);

            expect_close("dx", dx.to_double(), base.dx, ref.dx, dt);
            if (c.z) expect_close("dz", dz.to_double(), base.dz, ref.dz, dt);
            // Outputs stored in the parameters' dtype are held to the coarser of the two floors.
            const DType pt = floor_for(pdt) > floor_for(dt) ? pdt : dt;
            if (c.w) expect_close("dweight", dw.to_double(), base.dw, ref.dw, pt);
            if (c.b) expect_close("dbias", db.to_double(), base.db, ref.db, pt);
            if (c.residual) expect_close("dresidual_in", dres_in.to_double(), base.dx, ref.dx, pt);
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Strided rows of x, z and dy; and bitwise-equal weight gradients over repeated runs.
TEST(RmsNormGated, StridedRowsAndRepeatedRunsAreBitwiseEqual) {
  for (const auto& bk : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kBackward, bk.id, dt)) continue;
      SCOPED_TRACE(bk.id + "/" + dtype_name(dt));
      const int64_t rows = 1000, D = 128;
      TestTensor xz(dt, {rows, 2 * D}, bk.device), dy(dt, {rows, D}, bk.device), w(dt, {D}, bk.device);
      const auto xzv = xz.fill_normal(3, 0.1, 1.2);
      w.fill_normal(4, 1.0, 0.2);
      dy.fill_normal(5);
      TensorView x = xz.strided_view({rows, D}, {2 * D, 1});
      TensorView z = TensorView(static_cast<char*>(xz.data()) + D * dtype_size(dt), dt, bk.device, 2,
                                std::vector<int64_t>{rows, D}.data(), std::vector<int64_t>{2 * D, 1}.data());
      TestTensor y(dt, {rows, D}, bk.device), rstd(DType::kFloat32, {rows, 1}, bk.device);
      RmsNormGatedFwdArgs fa;
      fa.x = x;
      fa.z = z;
      fa.weight = w.view();
      fa.y = y.view();
      fa.rstd = rstd.view();
      rmsnorm_gated_fwd(bk.ctx(), fa);
      // the contiguous copy gives the same result
      TestTensor xc(dt, {rows, D}, bk.device), zc(dt, {rows, D}, bk.device), y2(dt, {rows, D}, bk.device);
      std::vector<double> xv(rows * D), zv(rows * D);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < D; ++d) {
          xv[r * D + d] = xzv[r * 2 * D + d];
          zv[r * D + d] = xzv[r * 2 * D + D + d];
        }
      xc.set(xv);
      zc.set(zv);
      fa.x = xc.view();
      fa.z = zc.view();
      fa.y = y2.view();
      rmsnorm_gated_fwd(bk.ctx(), fa);
      EXPECT_EQ(y.bytes(), y2.bytes());

      std::vector<std::vector<uint8_t>> runs;
      for (int rep = 0; rep < 2; ++rep) {
        TestTensor dx(dt, {rows, D}, bk.device), dz(dt, {rows, D}, bk.device), dw(dt, {D}, bk.device);
        RmsNormGatedBwdArgs ba;
        ba.dy = dy.view();
        ba.x = x;
        ba.z = z;
        ba.weight = w.view();
        ba.rstd = rstd.view();
        ba.dx = dx.view();
        ba.dz = dz.view();
        ba.dweight = dw.view();
        const int64_t ws_bytes = rmsnorm_gated_bwd_workspace_size(ba);
        TestTensor ws(DType::kUInt8, {std::max<int64_t>(ws_bytes, 1)}, bk.device);
        if (ws_bytes > 0) ba.workspace = ws.view();
        rmsnorm_gated_bwd(bk.ctx(), ba);
        auto bytes = dw.bytes();
        auto bx = dx.bytes(), bz = dz.bytes();
        bytes.insert(bytes.end(), bx.begin(), bx.end());
        bytes.insert(bytes.end(), bz.begin(), bz.end());
        runs.push_back(bytes);
      }
      EXPECT_EQ(runs[0], runs[1]);
    }
  }
}

TEST(RmsNormGated, EmptyBatchGivesZeroParameterGradients) {
  for (const auto& bk : runnable_backends(kOp, Direction::kBackward)) {
    SCOPED_TRACE(bk.id);
    TestTensor dy(DType::kFloat32, {0, 8}, bk.device), x(DType::kFloat32, {0, 8}, bk.device);
    TestTensor w(DType::kFloat32, {8}, bk.device), b(DType::kFloat32, {8}, bk.device);
    TestTensor rstd(DType::kFloat32, {0, 1}, bk.device), dx(DType::kFloat32, {0, 8}, bk.device);
    TestTensor dw(DType::kFloat32, {8}, bk.device), db(DType::kFloat32, {8}, bk.device);
    w.fill_normal(1);
    dw.fill_nan();
    db.fill_nan();
    RmsNormGatedBwdArgs ba;
    ba.dy = dy.view();
    ba.x = x.view();
    ba.weight = w.view();
    ba.bias = b.view();
    ba.rstd = rstd.view();
    ba.dx = dx.view();
    ba.dweight = dw.view();
    ba.dbias = db.view();
    const int64_t ws_bytes = rmsnorm_gated_bwd_workspace_size(ba);
    TestTensor ws(DType::kUInt8, {std::max<int64_t>(ws_bytes, 1)}, bk.device);
    if (ws_bytes > 0) ba.workspace = ws.view();
    rmsnorm_gated_bwd(bk.ctx(), ba);
    EXPECT_EQ(dw.to_double(), std::vector<double>(8, 0.0));
    EXPECT_EQ(db.to_double(), std::vector<double>(8, 0.0));
  }
}

TEST(RmsNormGated, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor x(DType::kFloat32, {4, 8}), z(DType::kFloat32, {4, 8}), w(DType::kFloat32, {8});
  TestTensor y(DType::kFloat32, {4, 8}), rstd(DType::kFloat32, {4, 1});
  x.fill_normal(1);
  auto ok = [&] {
    RmsNormGatedFwdArgs a;
    a.x = x.view();
    a.z = z.view();
    a.weight = w.view();
    a.y = y.view();
    a.rstd = rstd.view();
    return a;
  };
  auto fwd = [&](const RmsNormGatedFwdArgs& a) { rmsnorm_gated_fwd(ctx, a); };
  TestTensor z_bad(DType::kFloat32, {4, 7});
  auto a = ok();
  a.z = z_bad.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "rmsnorm_gated: z must have shape [4,8] (same as x), got [4,7]");
  TestTensor w_bad(DType::kFloat32, {7});
  a = ok();
  a.weight = w_bad.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "weight must have shape [8] ([D]), got [7]");
  a = ok();
  a.bias = w_bad.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "bias must have shape [8] ([D]), got [7]");
  a = ok();
  a.group_size = 3;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "group_size must divide D: D = 8, group_size = 3");
  a = ok();
  a.activation = static_cast<GateActivation>(7);
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "activation must be silu/swish or sigmoid, got code 7");
  a = ok();
  a.norm_before_gate = false;
  a.activation = GateActivation::kSigmoid;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "activation 'sigmoid' needs norm_before_gate=True");
  TestTensor res(DType::kFloat32, {4, 8}), res_out(DType::kFloat32, {4, 8});
  a = ok();
  a.norm_before_gate = false;
  a.residual = res.view();
  a.residual_out = res_out.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "residual needs norm_before_gate=True");
  a = ok();
  a.residual = res.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "residual_out is required but was not given");
  TestTensor z16(DType::kFloat16, {4, 8});
  a = ok();
  a.z = z16.view();
  expect_error([&] { fwd(a); }, ErrorKind::kType, "z must have the dtype of x (float32), got float16");
  TestTensor xb(DType::kBFloat16, {4, 8}), yb(DType::kBFloat16, {4, 8}), w16(DType::kFloat16, {8});
  a = ok();
  a.x = xb.view();
  a.y = yb.view();
  a.z = TensorView();
  a.weight = w16.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "weight must have the dtype of x (bfloat16) or float32, got float16");
  TestTensor r_bad(DType::kFloat32, {4, 2});
  a = ok();
  a.rstd = r_bad.view();
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "rstd must have shape [4,1] (x's leading shape, then D / group_size), got [4,2]");
  a = ok();
  a.eps = -1;
  expect_error([&] { fwd(a); }, ErrorKind::kValue, "eps must be a finite number >= 0");
  TestTensor xi(DType::kInt32, {4, 8});
  a = ok();
  a.x = xi.view();
  expect_error([&] { fwd(a); }, ErrorKind::kType, "x must have dtype in {float32, bfloat16, float16, float64}, got int32");

  // backward
  TestTensor dy(DType::kFloat32, {4, 8}), dx(DType::kFloat32, {4, 8}), dz(DType::kFloat32, {4, 8});
  TestTensor dw(DType::kFloat32, {8});
  auto okb = [&] {
    RmsNormGatedBwdArgs b;
    b.dy = dy.view();
    b.x = x.view();
    b.z = z.view();
    b.weight = w.view();
    b.rstd = rstd.view();
    b.dx = dx.view();
    b.dz = dz.view();
    b.dweight = dw.view();
    return b;
  };
  auto bwd = [&](const RmsNormGatedBwdArgs& b) { rmsnorm_gated_bwd(ctx, b); };
  auto b = okb();
  b.dz = TensorView();
  expect_error([&] { bwd(b); }, ErrorKind::kValue, "dz is required but was not given");
  b = okb();
  b.z = TensorView();
  expect_error([&] { bwd(b); }, ErrorKind::kValue, "dz is written only with z");
  b = okb();
  b.weight = TensorView();
  expect_error([&] { bwd(b); }, ErrorKind::kValue, "dweight is written only with weight");
  b = okb();
  b.group_size = 5;
  expect_error([&] { bwd(b); }, ErrorKind::kValue, "group_size must divide D: D = 8, group_size = 5");
  b = okb();
  b.norm_before_gate = false;
  b.dresidual = dy.view();
  expect_error([&] { bwd(b); }, ErrorKind::kValue, "dresidual (a residual) needs norm_before_gate=True");
  for (const auto& bk : runnable_backends(kOp, Direction::kBackward)) {
    if (bk.device.kind != DeviceKind::kCUDA) continue;
    // On CUDA the weight gradient needs the workspace.
    TestTensor cdy(DType::kFloat32, {4, 8}, bk.device), cx(DType::kFloat32, {4, 8}, bk.device);
    TestTensor cw(DType::kFloat32, {8}, bk.device), cr(DType::kFloat32, {4, 1}, bk.device);
    TestTensor cdx(DType::kFloat32, {4, 8}, bk.device), cdw(DType::kFloat32, {8}, bk.device);
    TestTensor small(DType::kUInt8, {16}, bk.device);
    RmsNormGatedBwdArgs cb;
    cb.dy = cdy.view();
    cb.x = cx.view();
    cb.weight = cw.view();
    cb.rstd = cr.view();
    cb.dx = cdx.view();
    cb.dweight = cdw.view();
    expect_error([&] { rmsnorm_gated_bwd(bk.ctx(), cb); }, ErrorKind::kValue, "workspace is required but was not given");
    cb.workspace = small.view();
    expect_error([&] { rmsnorm_gated_bwd(bk.ctx(), cb); }, ErrorKind::kValue,
                 "workspace must hold at least 128 bytes (rmsnorm_gated_bwd_workspace_size), got 16");
  }
}

}  // namespace
}  // namespace fusedops::testing
