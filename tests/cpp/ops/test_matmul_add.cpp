// matmul_add: main_grad += grad_output^T @ input on every runnable backend, against a float64
// oracle written here (double loops over the stored operands); the tolerance base is the plain
// composite main_grad.add_(grad_output.t() @ input) with fp32 accumulation and the product
// rounded to the operand dtype, as PyTorch eager computes it. Odd sizes, leading dims, strided
// rows, one token, no tokens, several token blocks (the CPU path's conversion blocks),
// determinism, and the argument errors.
#include <cmath>

#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

constexpr const char* kOp = "matmul_add";

struct Shape {
  std::vector<int64_t> lead;  // the token dims
  int64_t out, in;
  int64_t pad = 0;  // extra elements per operand row (strided rows)
};

int64_t tokens_of(const Shape& s) {
  int64_t t = 1;
  for (int64_t d : s.lead) t *= d;
  return t;
}

const std::vector<Shape> kShapes = {
    {{1}, 1, 1},        {{37}, 33, 65},     {{129}, 16, 8},  {{2, 3, 5}, 7, 9},
    {{300}, 64, 48, 5}, {{0}, 5, 7},        {{4}, 0, 3},     {{3}, 6, 0},
    {{1100}, 8200, 8},  // two conversion blocks of the CPU path (bf16 only: slow to check)
};

// oracle[o,i] = mg[o,i] + sum_t g[t,o] x[t,i] in double; base: the product accumulated in fp32
// and rounded to `dtype`, then added to main_grad in fp32.
void expected(const std::vector<double>& g, const std::vector<double>& x, const std::vector<double>& mg,
              int64_t T, int64_t O, int64_t I, int64_t ldg, int64_t ldx, DType dtype,
              std::vector<double>& oracle, std::vector<double>& base) {
  oracle.assign(O * I, 0);
  base.assign(O * I, 0);
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      double exact = 0;
      float acc = 0;
      for (int64_t t = 0; t < T; ++t) {
        const double p = g[t * ldg + o] * x[t * ldx + i];
        exact += p;
        acc = static_cast<float>(acc + static_cast<float>(p));
      }
      oracle[o * I + i] = mg[o * I + i] + exact;
      base[o * I + i] = static_cast<float>(mg[o * I + i] + round_to(dtype, acc));
    }
}

TestTensor workspace_for(const Context& ctx) {
  return TestTensor(DType::kUInt8, {static_cast<int64_t>(matmul_add_workspace_size(ctx))}, ctx.device);
}

TEST(MatmulAdd, AccumulatesTheProductOnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dt)) continue;
      for (const auto& s : kShapes) {
        const int64_t T = tokens_of(s);
        if (T * s.out * s.in > (int64_t{1} << 24) && (b.id == "ref" || dt != DType::kBFloat16)) continue;
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/T" + std::to_string(T) + "/O" +
                     std::to_string(s.out) + "/I" + std::to_string(s.in) + "/pad" + std::to_string(s.pad));
        const DType acc_t = dt == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
        const int64_t ldg = s.out + s.pad, ldx = s.in + s.pad;
        TestTensor gbuf(dt, {T, ldg}, b.device), xbuf(dt, {T, ldx}, b.device);
        TestTensor mg(acc_t, {s.out, s.in}, b.device);
        const auto gv = gbuf.fill_normal(11 + checked), xv = xbuf.fill_normal(12 + checked);
        const auto mg0 = mg.fill_normal(13 + checked, 0.5, 3.0);
        std::vector<int64_t> gshape = s.lead, xshape = s.lead;
        gshape.push_back(s.out);
        xshape.push_back(s.in);
        // Leading dims with the padded row stride, last dim contiguous.
        auto strides = [&](const std::vector<int64_t>& shape, int64_t ld) {
          std::vector<int64_t> st(shape.size());
          st.back() = 1;
          int64_t acc = ld;
          for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
            st[d] = acc;
            acc *= shape[d];
          }
          return st;
        };
        const TensorView g = gbuf.strided_view(gshape, strides(gshape, ldg));
        const TensorView x = xbuf.strided_view(xshape, strides(xshape, ldx));
        TestTensor ws = workspace_for(b.ctx());
        matmul_add_fwd(b.ctx(), {g, x, mg.view(), ws.view()});
        std::vector<double> oracle, base;
        expected(gv, xv, mg0, T, s.out, s.in, ldg, ldx, dt, oracle, base);
        const Verdict v = check_close(mg.to_double(), base, oracle, dt);
        EXPECT_TRUE(v.pass) << v.describe();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(MatmulAdd, RepeatedRunsAreBitwiseEqual) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dt)) continue;
      SCOPED_TRACE(b.id + "/" + dtype_name(dt));
      TestTensor g(dt, {257, 96}, b.device), x(dt, {257, 80}, b.device);
      TestTensor m1(DType::kFloat32, {96, 80}, b.device), m2(DType::kFloat32, {96, 80}, b.device);
      g.fill_normal(1);
      x.fill_normal(2);
      m1.fill_normal(3);
      m2.fill_normal(3);
      TestTensor ws = workspace_for(b.ctx());
      matmul_add_fwd(b.ctx(), {g.view(), x.view(), m1.view(), ws.view()});
      matmul_add_fwd(b.ctx(), {g.view(), x.view(), m2.view(), ws.view()});
      EXPECT_TRUE(m1.bytes() == m2.bytes());
    }
  }
}

TEST(MatmulAdd, NoTokensLeavesMainGradUnchanged) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    SCOPED_TRACE(b.id);
    TestTensor g(DType::kBFloat16, {0, 6}, b.device), x(DType::kBFloat16, {0, 5}, b.device);
    TestTensor mg(DType::kFloat32, {6, 5}, b.device);
    mg.fill_normal(4);
    const auto before = mg.bytes();
    TestTensor ws = workspace_for(b.ctx());
    matmul_add_fwd(b.ctx(), {g.view(), x.view(), mg.view(), ws.view()});
    EXPECT_TRUE(mg.bytes() == before);
  }
}

TEST(MatmulAdd, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor g(DType::kBFloat16, {8, 6}), x(DType::kBFloat16, {8, 5}), mg(DType::kFloat32, {6, 5});
  auto run = [&](const MatmulAddFwdArgs& a, const Context& c = Context::cpu()) { matmul_add_fwd(c, a); };
  const MatmulAddFwdArgs good{g.view(), x.view(), mg.view(), TensorView()};
  EXPECT_NO_THROW(run(good));

  TestTensor mg_wrong(DType::kFloat32, {5, 6});
  auto a = good;
  a.main_grad = mg_wrong.view();
  expect_error([&] { run(a); }, ErrorKind::kValue,
               "matmul_add: main_grad must have shape [6,5] ([out, in] of grad_output [..., out] and "
               "input [..., in]), got [5,6]");
  TestTensor x7(DType::kBFloat16, {7, 5});
  a = good;
  a.input = x7.view();
  expect_error([&] { run(a); }, ErrorKind::kValue,
               "input must have the leading dims of grad_output [8,*], got [7,5]");
  TestTensor x16(DType::kFloat16, {8, 5});
  a = good;
  a.input = x16.view();
  expect_error([&] { run(a); }, ErrorKind::kType,
               "input must have the dtype of grad_output (bfloat16), got float16");
  TestTensor mg16(DType::kBFloat16, {6, 5});
  a = good;
  a.main_grad = mg16.view();
  expect_error([&] { run(a); }, ErrorKind::kType,
               "main_grad must have dtype in {float32, float64}, got bfloat16");
  TestTensor mg_t(DType::kFloat32, {5, 6});
  a = good;
  a.main_grad = mg_t.strided_view({6, 5}, {1, 6});
  expect_error([&] { run(a); }, ErrorKind::kValue, "main_grad must be contiguous");
  TestTensor g1(DType::kBFloat16, {6});
  a = good;
  a.grad_output = g1.view();
  expect_error([&] { run(a); }, ErrorKind::kValue, "grad_output must have rank >= 2, got rank 1");
  TestTensor gi(DType::kInt32, {8, 6});
  a = good;
  a.grad_output = gi.view();
  expect_error([&] { run(a); }, ErrorKind::kType,
               "grad_output must have dtype in {float32, bfloat16, float16, float64}, got int32");
  a = good;
  a.input = x.strided_view({8, 5}, {0, 1});
  expect_error([&] { run(a); }, ErrorKind::kValue, "input rows must not overlap");
  a = good;
  a.main_grad = TensorView(mg.data(), DType::kFloat32, Device::cuda(0), {6, 5});
  expect_error([&] { run(a); }, ErrorKind::kValue,
               "main_grad must be on cpu (the call's device), got cuda:0");
}

TEST(MatmulAdd, CudaChecksWorkspaceAndAlignment) {
  bool any = false;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    if (b.device.kind != DeviceKind::kCUDA) continue;
    any = true;
    TestTensor g(DType::kBFloat16, {8, 64}, b.device), x(DType::kBFloat16, {8, 40}, b.device);
    TestTensor mg(DType::kFloat32, {64, 40}, b.device);
    g.fill_normal(1);
    x.fill_normal(2);
    mg.fill_normal(3);
    expect_error([&] { matmul_add_fwd(b.ctx(), {g.view(), x.view(), mg.view(), TensorView()}); },
                 ErrorKind::kValue, "workspace is required but was not given");
    TestTensor ws = workspace_for(b.ctx());
    // grad_output starting one element into its buffer: refused with the reason.
    TensorView g_off(static_cast<uint16_t*>(g.data()) + 1, DType::kBFloat16, b.device, {7, 64});
    TensorView x7(x.data(), DType::kBFloat16, b.device, {7, 40});
    expect_error([&] { matmul_add_fwd(b.ctx(), {g_off, x7, mg.view(), ws.view()}); }, ErrorKind::kValue,
                 "grad_output must start at a 256-byte aligned address for cuBLASLt");
  }
  if (!any) GTEST_SKIP() << "no CUDA backend can run here";
}

}  // namespace
}  // namespace fusedops::testing
