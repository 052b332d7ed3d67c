// Invalid and extreme inputs of the linear-attention operators (issue 39; the "Invalid inputs"
// tables of src/ops/{gated_delta_rule,kda,linear_attention}/README.md name these tests):
//   LinearAttentionInvalid.*: bad varlen index contents (cu_seqlens, chunk_indices, chunk_offsets)
//   raise on the CPU before any work and are reported on CUDA; index tensors of another dtype or
//   device; inputs on another device; strided last dimensions and outputs; empty inputs (T = 0,
//   B = 0, empty sequences); NaN / Inf propagating like the float64 reference; element counts past
//   2^31 (CUDA only).
// Every call goes through the public entry points of both families' top levels, their per-token
// forms and the shared sub-operators.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

enum class Form { kChunkGdn, kChunkKda, kRecurrentGdn, kRecurrentKda };

const char* op_name(Form f) {
  switch (f) {
    case Form::kChunkGdn: return "chunk_gated_delta_rule";
    case Form::kChunkKda: return "chunk_kda";
    case Form::kRecurrentGdn: return "fused_recurrent_gated_delta_rule";
    default: return "fused_recurrent_kda";
  }
}

bool is_kda(Form f) { return f == Form::kChunkKda || f == Form::kRecurrentKda; }
bool is_chunk(Form f) { return f == Form::kChunkGdn || f == Form::kChunkKda; }

// An int64 tensor holding `v`.
TestTensor ints(std::vector<int64_t> shape, const std::vector<int64_t>& v) {
  TestTensor t(DType::kInt64, std::move(shape));
  std::memcpy(t.data(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

// One forward call of a top level or a per-token form with every tensor it needs (fp32 or the
// given dtype; CPU unless dev), the varlen tables built by the library's host helpers.
struct Call {
  Form form;
  int64_t B, T, H = 2, HV = 2, K = 8, V = 8, BT = 32;
  std::vector<int64_t> cu;
  DType dt;
  Device dev;
  TestTensor q, k, v, g, beta, h0, o, ht, gc, A, Aqk, Akk, ws, cu_t, ci, co;

  Call(Form f, int64_t b, int64_t t, std::vector<int64_t> cu_ = {}, DType d = DType::kFloat32,
       Device dv = Device::cpu())
      : form(f), B(b), T(t), cu(std::move(cu_)), dt(d), dev(dv) {
    const int64_t N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
    const DType f32 = DType::kFloat32;
    q = TestTensor(dt, {B, T, H, K}, dev);
    k = TestTensor(dt, {B, T, H, K}, dev);
    v = TestTensor(dt, {B, T, HV, V}, dev);
    const std::vector<int64_t> gshape = is_kda(form) ? std::vector<int64_t>{B, T, HV, K} : std::vector<int64_t>{B, T, HV};
    g = TestTensor(f32, gshape, dev);
    beta = TestTensor(f32, {B, T, HV}, dev);
    h0 = TestTensor(f32, {N, HV, K, V}, dev);
    o = TestTensor(dt, {B, T, HV, V}, dev);
    ht = TestTensor(f32, {N, HV, K, V}, dev);
    gc = TestTensor(f32, gshape, dev);
    A = TestTensor(dt, {B, T, HV, BT}, dev);
    Aqk = TestTensor(dt, {B, T, HV, BT}, dev);
    Akk = TestTensor(dt, {B, T, HV, BT}, dev);
    if (!cu.empty()) {
      TestTensor c(DType::kInt64, {static_cast<int64_t>(cu.size())});
      std::memcpy(c.data(), cu.data(), cu.size() * 8);
      bool valid = cu[0] == 0 && cu.back() == T;
      for (size_t i = 1; i < cu.size(); ++i) valid = valid && cu[i] >= cu[i - 1];
      // Tables of a valid cu_seqlens from the host helpers; for an invalid one, of its last
      // valid form (the tables' shapes only matter: the contents check fails first).
      std::vector<int64_t> fixed = cu;
      if (!valid) {
        fixed.assign(cu.size(), 0);
        fixed.back() = T;
        for (size_t i = 1; i + 1 < cu.size(); ++i) fixed[i] = std::min(std::max(cu[i], fixed[i - 1]), T);
      }
      TestTensor fc(DType::kInt64, {static_cast<int64_t>(fixed.size())});
      std::memcpy(fc.data(), fixed.data(), fixed.size() * 8);
      const int64_t NT = varlen_chunk_count(fc.view(), BT);
      TestTensor cit(DType::kInt64, {NT, 2}), cot(DType::kInt64, {N + 1});
      prepare_chunk_indices(fc.view(), BT, cit.view());
      prepare_chunk_offsets(fc.view(), BT, cot.view());
      cu_t = c.to(dev);
      ci = cit.to(dev);
      co = cot.to(dev);
    }
    fill(1);
  }

  void fill(uint64_t seed) {
    q.fill_normal(seed, 0.0, 0.3);
    k.fill_normal(seed + 1, 0.0, 0.3);
    v.fill_normal(seed + 2);
    std::vector<double> gv = g.fill_normal(seed + 3);
    for (double& x : gv) x = -0.05 - 0.1 * std::fabs(x);
    g.set(gv);
    std::vector<double> bv = beta.fill_normal(seed + 4);
    for (double& x : bv) x = 1.0 / (1.0 + std::exp(-x));
    beta.set(bv);
    h0.fill_normal(seed + 5, 0.0, 0.5);
    o.set(std::vector<double>(o.numel(), NAN));
    ht.set(std::vector<double>(ht.numel(), NAN));
  }

  template <class Args>
  void shared(Args& a) const {
    a.q = q.view(); a.k = k.view(); a.v = v.view(); a.g = g.view(); a.beta = beta.view();
    a.initial_state = h0.view(); a.cu_seqlens = cu.empty() ? TensorView() : cu_t.view();
    a.scale = 0.3;
    a.o = o.view(); a.final_state = ht.view();
  }

  void run(const Context& ctx) {
    switch (form) {
      case Form::kChunkGdn: {
        ChunkGatedDeltaRuleFwdArgs a;
        shared(a);
        chunk_args(a);
        a.A = A.view();
        run_chunk(ctx, a, chunk_gated_delta_rule_fwd_workspace_size(a), chunk_gated_delta_rule_fwd);
        break;
      }
      case Form::kChunkKda: {
        ChunkKdaFwdArgs a;
        shared(a);
        chunk_args(a);
        a.Aqk = Aqk.view();
        a.Akk = Akk.view();
        run_chunk(ctx, a, chunk_kda_fwd_workspace_size(a), chunk_kda_fwd);
        break;
      }
      case Form::kRecurrentGdn: {
        FusedRecurrentGatedDeltaRuleFwdArgs a;
        shared(a);
        fused_recurrent_gated_delta_rule_fwd(ctx, a);
        break;
      }
      default: {
        FusedRecurrentKdaFwdArgs a;
        shared(a);
        fused_recurrent_kda_fwd(ctx, a);
      }
    }
  }

  template <class Args>
  void chunk_args(Args& a) const {
    a.chunk_size = BT;
    a.g_cumsum = gc.view();
    if (!cu.empty()) {
      a.chunk_indices = ci.view();
      a.chunk_offsets = co.view();
    }
  }

  template <class Args, class Fn>
  void run_chunk(const Context& ctx, Args& a, int64_t bytes, Fn fn) {
    ws = TestTensor(DType::kUInt8, {std::max<int64_t>(bytes, 1)}, dev);
    a.workspace = ws.view();
    fn(ctx, a);
  }
};

// The CPU backends registered for op in either direction (never empty: a loop over them must not
// pass vacuously).
std::vector<BackendCase> cpu_backends(const std::string& op) {
  std::vector<BackendCase> out;
  for (Direction d : {Direction::kForward, Direction::kBackward})
    for (const auto& b : runnable_backends(op, d)) {
      bool seen = false;
      for (const auto& o : out) seen = seen || o.id == b.id;
      if (b.device.kind == DeviceKind::kCPU && !seen) out.push_back(b);
    }
  EXPECT_FALSE(out.empty()) << "no CPU backend of " << op;
  return out;
}

const Form kForms[] = {Form::kChunkGdn, Form::kChunkKda, Form::kRecurrentGdn, Form::kRecurrentKda};

bool all_nan(const TestTensor& t) {
  for (double x : t.to_double())
    if (!std::isnan(x)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Varlen index contents.

TEST(LinearAttentionInvalid, BadCuSeqlensRaiseOnTheCpuBeforeAnyWork) {
  struct Bad {
    std::vector<int64_t> cu;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{2, 5, 9}, "cu_seqlens must start at 0, got 2"},
      {{0, 6, 3, 9}, "cu_seqlens must be non-decreasing, got cu_seqlens[1]=6 > cu_seqlens[2]=3"},
      {{0, 4, 8}, "cu_seqlens must end at T=9 (the packed length), got cu_seqlens[2]=8"},
      {{0, 4, 12}, "cu_seqlens must end at T=9 (the packed length), got cu_seqlens[2]=12"},
  };
  for (Form f : kForms)
    for (const auto& b : runnable_backends(op_name(f), Direction::kForward)) {
      if (b.device.kind != DeviceKind::kCPU) continue;
      for (const Bad& x : bad) {
        SCOPED_TRACE(std::string(op_name(f)) + " " + b.id + " " + x.message);
        Call c(f, 1, 9, x.cu);
        expect_error([&] { c.run(b.ctx()); }, ErrorKind::kValue, std::string(op_name(f)) + ": " + x.message);
        EXPECT_TRUE(all_nan(c.o) && all_nan(c.ht)) << "the call wrote its outputs before raising";
      }
    }
}

// The shared sub-operators that take the tables: a table that does not match cu_seqlens raises on
// the CPU before any work (the outputs keep their NaN).
TEST(LinearAttentionInvalid, ChunkTablesThatDoNotMatchCuSeqlensRaiseOnTheCpu) {
  const Context ctx = Context::cpu();
  Call c(Form::kChunkGdn, 1, 70, {0, 30, 30, 70});  // 1 + 0 + 2 chunks of 32
  TestTensor out(DType::kFloat32, {1, 70, 2});
  out.set(std::vector<double>(out.numel(), NAN));
  ChunkLocalCumsumArgs cs;
  cs.g = c.g.view();
  cs.out = out.view();
  cs.cu_seqlens = c.cu_t.view();
  cs.chunk_size = 32;
  TestTensor ci = ints({3, 2}, {0, 0, 2, 0, 2, 7});  // row 2 names chunk 7 of sequence 2
  cs.chunk_indices = ci.view();
  expect_error([&] { chunk_local_cumsum(ctx, cs); }, ErrorKind::kValue,
               "chunk_local_cumsum: chunk_indices row 2 is (2,7), expected (2,1) for these cu_seqlens");
  TestTensor ci4(DType::kInt64, {4, 2});
  cs.chunk_indices = ci4.view();
  expect_error([&] { chunk_local_cumsum(ctx, cs); }, ErrorKind::kValue,
               "chunk_indices has 4 rows but cu_seqlens with chunk_size 32 gives 3 chunks");
  cs.chunk_indices = TensorView();
  expect_error([&] { chunk_local_cumsum(ctx, cs); }, ErrorKind::kValue, "chunk_indices is required with cu_seqlens");
  EXPECT_TRUE(all_nan(out));

  // chunk_gated_delta_rule_fwd_h with offsets off by one.
  TestTensor w(DType::kFloat32, {1, 70, 2, 8}), u(DType::kFloat32, {1, 70, 2, 8});
  TestTensor h(DType::kFloat32, {1, 3, 2, 8, 8}), vn(DType::kFloat32, {1, 70, 2, 8});
  h.set(std::vector<double>(h.numel(), NAN));
  TestTensor co = ints({4}, {0, 1, 1, 4});
  ChunkGatedDeltaRuleFwdHArgs fh;
  fh.k = c.k.view(); fh.w = w.view(); fh.u = u.view(); fh.g = c.g.view(); fh.h = h.view();
  fh.v_new = vn.view(); fh.cu_seqlens = c.cu_t.view(); fh.chunk_offsets = co.view(); fh.chunk_size = 32;
  expect_error([&] { chunk_gated_delta_rule_fwd_h(ctx, fh); }, ErrorKind::kValue,
               "chunk_gated_delta_rule_fwd_h: chunk_offsets[3] is 4, expected 3 for these cu_seqlens");
  EXPECT_TRUE(all_nan(h));
  // ... and the backward recurrence.
  TestTensor dout(DType::kFloat32, {1, 70, 2, 8}), dv(DType::kFloat32, {1, 70, 2, 8});
  TestTensor dh(DType::kFloat32, {1, 3, 2, 8, 8}), dv2(DType::kFloat32, {1, 70, 2, 8});
  dh.set(std::vector<double>(dh.numel(), NAN));
  ChunkGatedDeltaRuleBwdDhuArgs bd;
  bd.q = c.q.view(); bd.k = c.k.view(); bd.w = w.view(); bd.dout = dout.view(); bd.dv = dv.view();
  bd.g = c.g.view(); bd.dh = dh.view(); bd.dv2 = dv2.view(); bd.cu_seqlens = c.cu_t.view();
  bd.chunk_offsets = co.view(); bd.chunk_size = 32;
  expect_error([&] { chunk_gated_delta_rule_bwd_dhu(ctx, bd); }, ErrorKind::kValue,
               "chunk_gated_delta_rule_bwd_dhu: chunk_offsets[3] is 4, expected 3 for these cu_seqlens");
  EXPECT_TRUE(all_nan(dh));
  // The host helpers reject a bad cu_seqlens too.
  TestTensor badcu = ints({3}, {0, 5, 2});
  expect_error([&] { varlen_chunk_count(badcu.view(), 32); }, ErrorKind::kValue,
               "varlen_chunk_count: cu_seqlens must be non-decreasing, got cu_seqlens[1]=5 > cu_seqlens[2]=2");
}

// Index tensors of another dtype, rank or device, and inputs on another device than the call's:
// raised before anything is read (a CUDA device view is never dereferenced on a CPU call).
TEST(LinearAttentionInvalid, IndexDtypesAndDevicesRaise) {
  const Context ctx = Context::cpu();
  for (Form f : kForms) {
    SCOPED_TRACE(op_name(f));
    {
      Call c(f, 1, 9, {0, 4, 9});
      TestTensor fcu(DType::kFloat32, {3});
      c.cu_t = fcu;
      expect_error([&] { c.run(ctx); }, ErrorKind::kType, "cu_seqlens must have dtype in {int32, int64}, got float32");
    }
    {
      Call c(f, 1, 9, {0, 4, 9});
      TestTensor cu2(DType::kInt64, {1, 3});
      c.cu_t = cu2;
      expect_error([&] { c.run(ctx); }, ErrorKind::kValue, "cu_seqlens must have rank 1");
    }
    {  // a view that claims to live on cuda:0 (never dereferenced)
      Call c(f, 1, 9, {0, 4, 9});
      int64_t fake[3] = {0, 4, 9};
      Call* p = &c;
      const TensorView cuda_cu(fake, DType::kInt64, Device::cuda(0), {3});
      FusedRecurrentGatedDeltaRuleFwdArgs a;
      p->shared(a);
      a.cu_seqlens = cuda_cu;
      if (f == Form::kRecurrentGdn)
        expect_error([&] { fused_recurrent_gated_delta_rule_fwd(ctx, a); }, ErrorKind::kValue, "cu_seqlens must be on cpu");
      a.cu_seqlens = c.cu_t.view();
      float qf = 0;
      const TensorView cuda_q(&qf, DType::kFloat32, Device::cuda(0), {1, 9, 2, 8});
      a.q = cuda_q;
      if (f == Form::kRecurrentGdn)
        expect_error([&] { fused_recurrent_gated_delta_rule_fwd(ctx, a); }, ErrorKind::kValue, "q must be on cpu");
    }
  }
  {  // the same through the chunk form and the shared sub-operator
    Call c(Form::kChunkGdn, 1, 9, {0, 4, 9});
    int64_t fake[3] = {0, 4, 9};
    c.cu_t = TestTensor(DType::kInt64, {3});
    ChunkLocalCumsumArgs cs;
    TestTensor out(DType::kFloat32, {1, 9, 2});
    cs.g = c.g.view();
    cs.out = out.view();
    cs.cu_seqlens = TensorView(fake, DType::kInt64, Device::cuda(0), {3});
    cs.chunk_indices = c.ci.view();
    cs.chunk_size = 32;
    expect_error([&] { chunk_local_cumsum(ctx, cs); }, ErrorKind::kValue, "cu_seqlens must be on cpu");
    TestTensor ci32(DType::kInt32, {1, 2});
    cs.cu_seqlens = TensorView(fake, DType::kInt64, Device::cpu(), {3});
    cs.chunk_indices = ci32.view();
    expect_error([&] { chunk_local_cumsum(ctx, cs); }, ErrorKind::kType, "chunk_indices must have the dtype of cu_seqlens");
  }
}

// Rank, shape and dtype of the inputs, the initial state and the outputs, before any work.
TEST(LinearAttentionInvalid, RankShapeAndDtypeRaise) {
  const Context ctx = Context::cpu();
  for (Form f : kForms) {
    SCOPED_TRACE(op_name(f));
    const std::string op = std::string(op_name(f)) + ": ";
    {
      Call c(f, 2, 9);
      c.q = TestTensor(DType::kFloat32, {2, 9, 16});
      expect_error([&] { c.run(ctx); }, ErrorKind::kValue, op + "q must have rank 4");
    }
    {
      Call c(f, 2, 9);
      c.g = TestTensor(DType::kFloat32, is_kda(f) ? std::vector<int64_t>{2, 9, 2, 3} : std::vector<int64_t>{2, 9, 1});
      expect_error([&] { c.run(ctx); }, ErrorKind::kValue, op + "g must have shape");
    }
    {
      Call c(f, 2, 9);
      c.h0 = TestTensor(DType::kFloat32, {3, 2, 8, 8});
      expect_error([&] { c.run(ctx); }, ErrorKind::kValue, op + "initial_state must have shape [2,2,8,8], got [3,2,8,8]");
    }
    if (is_chunk(f)) {
      Call c(f, 2, 9);
      c.v = TestTensor(DType::kBFloat16, {2, 9, 2, 8});
      expect_error([&] { c.run(ctx); }, ErrorKind::kType, op + "v must have the dtype of q (float32), got bfloat16");
    } else {  // the per-token forms read every tensor in its own float dtype
      Call c(f, 2, 9), same(f, 2, 9);
      TestTensor v16(DType::kBFloat16, {2, 9, 2, 8});
      const std::vector<double> vals = v16.set(c.v.to_double());
      c.v = v16;
      same.v.set(vals);
      c.run(ctx);
      same.run(ctx);
      EXPECT_EQ(c.o.to_double(), same.o.to_double());
    }
    {
      Call c(f, 2, 9);
      c.q = TestTensor(DType::kInt32, {2, 9, 2, 8});
      c.k = TestTensor(DType::kInt32, {2, 9, 2, 8});
      c.v = TestTensor(DType::kInt32, {2, 9, 2, 8});
      c.o = TestTensor(DType::kInt32, {2, 9, 2, 8});
      expect_error([&] { c.run(ctx); }, ErrorKind::kType, op);
    }
    {
      Call c(f, 2, 9);
      c.o = TestTensor(DType::kFloat32, {2, 9, 2, 7});
      expect_error([&] { c.run(ctx); }, ErrorKind::kValue, op + "o must have shape [2,9,2,8], got [2,9,2,7]");
    }
  }
}

// A strided last dimension of an input, and any non-contiguous output, raise (the Python layer
// copies such inputs); strided leading dimensions are read in place (the families' own tests).
TEST(LinearAttentionInvalid, StridedLastDimensionsAndOutputsRaise) {
  const Context ctx = Context::cpu();
  for (Form f : kForms) {
    SCOPED_TRACE(op_name(f));
    Call c(f, 2, 9);
    TestTensor wide(DType::kFloat32, {2, 9, 2, 16});
    FusedRecurrentGatedDeltaRuleFwdArgs a;
    c.shared(a);
    a.q = wide.strided_view({2, 9, 2, 8}, {9 * 32, 32, 16, 2});
    if (f == Form::kRecurrentGdn) {
      expect_error([&] { fused_recurrent_gated_delta_rule_fwd(ctx, a); }, ErrorKind::kValue,
                   "q must have a contiguous last dimension (stride 1)");
      a.q = c.q.view();
      TestTensor big(DType::kFloat32, {2, 9, 2, 16});
      a.o = big.strided_view({2, 9, 2, 8}, {9 * 32, 32, 16, 1});
      expect_error([&] { fused_recurrent_gated_delta_rule_fwd(ctx, a); }, ErrorKind::kValue, "o must be contiguous");
    }
    if (f == Form::kChunkKda) {
      ChunkKdaFwdArgs k;
      c.shared(k);
      c.chunk_args(k);
      k.Aqk = c.Aqk.view();
      k.Akk = c.Akk.view();
      k.v = wide.strided_view({2, 9, 2, 8}, {9 * 32, 32, 16, 2});
      TestTensor ws(DType::kUInt8, {1 << 20});
      k.workspace = ws.view();
      expect_error([&] { chunk_kda_fwd(ctx, k); }, ErrorKind::kValue, "v must have a contiguous last dimension (stride 1)");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Empty inputs: T = 0, B = 0 and empty sequences give empty outputs and final states equal to the
// initial states (the empty sequences' too) on every CPU backend.

TEST(LinearAttentionInvalid, EmptyInputsPassTheStateThrough) {
  struct Shape {
    int64_t B, T;
    std::vector<int64_t> cu;
  };
  const std::vector<Shape> shapes = {{2, 0, {}}, {0, 9, {}}, {1, 0, {0, 0, 0}}, {1, 40, {0, 0, 40, 40}}};
  for (Form f : kForms)
    for (const auto& b : runnable_backends(op_name(f), Direction::kForward)) {
      if (b.device.kind != DeviceKind::kCPU) continue;
      for (const Shape& s : shapes) {
        SCOPED_TRACE(std::string(op_name(f)) + " " + b.id + " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) +
                     " N+1=" + std::to_string(s.cu.size()));
        Call c(f, s.B, s.T, s.cu);
        c.run(b.ctx());
        const auto h0 = c.h0.to_double(), ht = c.ht.to_double();
        const int64_t per = c.HV * c.K * c.V;
        for (size_t n = 0; n + 1 < std::max<size_t>(s.cu.size(), 1); ++n) {
          if (s.cu.empty() || s.cu[n + 1] != s.cu[n]) continue;  // only the empty sequences
          for (int64_t i = 0; i < per; ++i) ASSERT_EQ(ht[n * per + i], h0[n * per + i]) << "sequence " << n;
        }
        if (s.T == 0) {
          for (size_t i = 0; i < ht.size(); ++i) ASSERT_EQ(ht[i], h0[i]);
        }
        for (double x : c.o.to_double()) ASSERT_TRUE(std::isfinite(x));
      }
    }
}

// ---------------------------------------------------------------------------------------------
// NaN / Inf: every backend gives the reference backend's pattern in o and final_state, and the
// sequences the poisoned token does not reach are exactly a clean call's.

int64_t c_row(const Call& c) { return c.T * c.HV * c.V; }

std::vector<uint8_t> pattern(const std::vector<double>& v) {
  std::vector<uint8_t> m(v.size());
  for (size_t i = 0; i < v.size(); ++i) m[i] = std::isnan(v[i]) ? 1 : (std::isinf(v[i]) ? (v[i] > 0 ? 2 : 3) : 0);
  return m;
}

TEST(LinearAttentionInvalid, NonFinitePropagatesLikeTheReference) {
  // Batch row 0: NaN in k at token 5 (its state: every later output of row 0 and its final
  // state); row 1: +Inf in v at token 7; row 2 clean.
  auto poison = [](Call& c) {
    std::vector<double> kv = c.k.to_double(), vv = c.v.to_double();
    kv[5 * c.H * c.K + 3] = NAN;                // b 0, t 5, head 0
    vv[(c.T + 7) * c.HV * c.V + 2] = INFINITY;  // b 1, t 7, head 0
    c.k.set(kv);
    c.v.set(vv);
  };
  auto nonfinite = [](const std::vector<double>& v) {
    std::vector<uint8_t> m(v.size());
    for (size_t i = 0; i < v.size(); ++i) m[i] = !std::isfinite(v[i]);
    return m;
  };
  for (Form f : kForms)
    for (const auto& b : runnable_backends(op_name(f), Direction::kForward)) {
      if (b.id == "ref") continue;
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        if (!backend_takes(op_name(f), Direction::kForward, b.id, dt)) continue;
        SCOPED_TRACE(std::string(op_name(f)) + " " + b.id + " " + dtype_name(dt));
        Call ref(f, 3, 40, {}, dt);
        poison(ref);
        Context rctx = Context::cpu();
        rctx.backend = "ref";
        ref.run(rctx);
        Call ours(f, 3, 40, {}, dt, b.device);
        poison(ours);
        ours.run(b.ctx());
        Call clean(f, 3, 40, {}, dt, b.device);
        clean.run(b.ctx());
        const auto got = ours.o.to_double(), want = ref.o.to_double(), base = clean.o.to_double();
        const auto gm = nonfinite(got), wm = nonfinite(want);
        // The final states: exactly the reference's pattern.
        EXPECT_EQ(pattern(ours.ht.to_double()), pattern(ref.ht.to_double())) << "final_state";
        if (!is_chunk(f)) {
          EXPECT_EQ(pattern(got), pattern(want)) << "o";
        } else {
          // Every output the reference makes non-finite is non-finite; besides those, only
          // outputs of the poisoned chunk itself (its earlier tokens: the chunk products multiply
          // the poisoned rows by zero weights, 0 * NaN = NaN).
          const int64_t row = c_row(ours), tok = ours.HV * ours.V;
          for (size_t i = 0; i < gm.size(); ++i) {
            if (wm[i]) { ASSERT_TRUE(gm[i]) << "o[" << i << "] finite where the reference is not"; }
            const int64_t t = (static_cast<int64_t>(i) % row) / tok, bi = static_cast<int64_t>(i) / row;
            if (gm[i] && !wm[i]) { ASSERT_TRUE(bi < 2 && t < ours.BT) << "o[" << i << "] non-finite outside the poisoned chunk"; }
          }
        }
        // Batch row 2 never meets the poison: bit for bit a clean call's.
        const size_t row = got.size() / 3;
        for (size_t i = 2 * row; i < got.size(); ++i) ASSERT_EQ(got[i], base[i]) << "row 2 changed at " << i;
      }
    }
}

// The shared sub-operators chunk_local_cumsum, chunk_gated_delta_rule_fwd_h / _bwd_dhu: rank,
// shape, empty inputs (T = 0, empty sequences) and NaN / Inf against the ref backend's pattern
// (exact: their products never meet a zero weight), on every CPU backend.
struct Sub {
  int64_t B, T;
  std::vector<int64_t> cu;
  TestTensor g, q, k, w, u, dout, dv, h0, dht, cs, h, vn, ht, dh, dh0, dv2, cu_t, ci, co;
  Sub(int64_t b, int64_t t, std::vector<int64_t> c = {}) : B(b), T(t), cu(std::move(c)) {
    const DType f = DType::kFloat32;
    const int64_t N = cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1;
    g = TestTensor(f, {B, T, 2});
    std::vector<double> gv = g.fill_normal(3);
    for (double& x : gv) x = -0.05 - 0.1 * std::fabs(x);
    g.set(gv);
    for (TestTensor* x : {&q, &k, &w, &u, &dout, &dv, &vn, &dv2}) *x = TestTensor(f, {B, T, 2, 8});
    q.fill_normal(4, 0, 0.3); k.fill_normal(5, 0, 0.3); w.fill_normal(6, 0, 0.3); u.fill_normal(7);
    dout.fill_normal(8); dv.fill_normal(9);
    for (TestTensor* x : {&h0, &dht, &ht, &dh0}) *x = TestTensor(f, {N, 2, 8, 8});
    h0.fill_normal(10); dht.fill_normal(11);
    cs = TestTensor(f, {B, T, 2});
    int64_t NT = (T + 31) / 32;  // per batch row
    if (!cu.empty()) {
      cu_t = ints({static_cast<int64_t>(cu.size())}, cu);
      NT = varlen_chunk_count(cu_t.view(), 32);
      ci = TestTensor(DType::kInt64, {NT, 2});
      co = TestTensor(DType::kInt64, {N + 1});
      prepare_chunk_indices(cu_t.view(), 32, ci.view());
      prepare_chunk_offsets(cu_t.view(), 32, co.view());
    }
    h = TestTensor(f, {cu.empty() ? B : 1, NT, 2, 8, 8});
    dh = TestTensor(f, {cu.empty() ? B : 1, NT, 2, 8, 8});
  }
  TensorView cuv() const { return cu.empty() ? TensorView() : cu_t.view(); }
  void cumsum(const Context& ctx) {
    chunk_local_cumsum(ctx, {g.view(), cs.view(), cuv(), cu.empty() ? TensorView() : ci.view(), 32, false, 1.0});
  }
  void fwd_h(const Context& ctx) {
    ChunkGatedDeltaRuleFwdHArgs a;
    a.k = k.view(); a.w = w.view(); a.u = u.view(); a.g = g.view(); a.h0 = h0.view(); a.h = h.view();
    a.v_new = vn.view(); a.ht = ht.view(); a.cu_seqlens = cuv(); a.chunk_size = 32;
    if (!cu.empty()) a.chunk_offsets = co.view();
    chunk_gated_delta_rule_fwd_h(ctx, a);
  }
  void bwd_dhu(const Context& ctx) {
    ChunkGatedDeltaRuleBwdDhuArgs a;
    a.q = q.view(); a.k = k.view(); a.w = w.view(); a.dout = dout.view(); a.dv = dv.view(); a.g = g.view();
    a.dht = dht.view(); a.dh = dh.view(); a.dh0 = dh0.view(); a.dv2 = dv2.view(); a.cu_seqlens = cuv();
    a.scale = 0.3; a.chunk_size = 32;
    if (!cu.empty()) a.chunk_offsets = co.view();
    chunk_gated_delta_rule_bwd_dhu(ctx, a);
  }
  std::vector<std::vector<double>> outputs() const {
    return {cs.to_double(), h.to_double(), vn.to_double(), ht.to_double(), dh.to_double(), dh0.to_double(),
            dv2.to_double()};
  }
};

TEST(LinearAttentionInvalid, SharedSubOperatorsRankShapeEmptyAndNonFinite) {
  const Context ctx = Context::cpu();
  {  // rank and shape
    Sub s(1, 70);
    s.k = TestTensor(DType::kFloat32, {1, 70, 16});
    expect_error([&] { s.fwd_h(ctx); }, ErrorKind::kValue, "chunk_gated_delta_rule_fwd_h: k must have rank 4");
    expect_error([&] { s.bwd_dhu(ctx); }, ErrorKind::kValue, "chunk_gated_delta_rule_bwd_dhu: k must have rank 4");
    Sub t(1, 70);
    t.u = TestTensor(DType::kFloat32, {1, 69, 2, 8});
    expect_error([&] { t.fwd_h(ctx); }, ErrorKind::kValue, "chunk_gated_delta_rule_fwd_h: u must have shape [1,70,2,8]");
    t.cs = TestTensor(DType::kFloat32, {1, 70, 3});
    expect_error([&] { t.cumsum(ctx); }, ErrorKind::kValue, "chunk_local_cumsum: out must have shape [1,70,2]");
    t.dh = TestTensor(DType::kFloat32, {1, 2, 2, 8, 8});
    expect_error([&] { t.bwd_dhu(ctx); }, ErrorKind::kValue, "chunk_gated_delta_rule_bwd_dhu: dh must have shape [1,3,2,8,8]");
  }
  for (const char* op : {"chunk_local_cumsum", "chunk_gated_delta_rule_fwd_h", "chunk_gated_delta_rule_bwd_dhu"})
    for (const auto& b : cpu_backends(op)) {
      SCOPED_TRACE(std::string(op) + " " + b.id);
      const std::string o = op;
      auto run = [&](Sub& s, const Context& c) {
        if (o == "chunk_local_cumsum") s.cumsum(c);
        else if (o == "chunk_gated_delta_rule_fwd_h") s.fwd_h(c);
        else s.bwd_dhu(c);
      };
      // empty: T = 0 and empty sequences pass the state through
      for (const auto& cu : {std::vector<int64_t>{}, std::vector<int64_t>{0, 0, 70, 70}}) {
        Sub s(cu.empty() ? 2 : 1, cu.empty() ? 0 : 70, cu);
        run(s, b.ctx());
        if (o == "chunk_local_cumsum") continue;
        const auto end = o == "chunk_gated_delta_rule_fwd_h" ? s.ht.to_double() : s.dh0.to_double();
        const auto start = o == "chunk_gated_delta_rule_fwd_h" ? s.h0.to_double() : s.dht.to_double();
        for (int64_t n : cu.empty() ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0, 2})
          for (int64_t i = 0; i < 128; ++i) ASSERT_EQ(end[n * 128 + i], start[n * 128 + i]) << "sequence " << n;
      }
      // nonfinite: NaN in a gate (cumsum) or key of batch row 0, +Inf in row 1; the ref pattern
      auto poison = [&](Sub& s) {
        TestTensor& t = o == "chunk_local_cumsum" ? s.g : s.k;
        std::vector<double> v = t.to_double();
        const int64_t row = t.numel() / 3;
        v[40 * (row / 70)] = NAN;
        v[row + 7 * (row / 70) + 1] = INFINITY;
        t.set(v);
      };
      Sub ours(3, 70), ref(3, 70), clean(3, 70);
      poison(ours);
      poison(ref);
      Context rctx = Context::cpu();
      rctx.backend = "ref";
      run(ref, rctx);
      run(ours, b.ctx());
      run(clean, b.ctx());
      const auto a = ours.outputs(), r = ref.outputs(), c = clean.outputs();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(pattern(a[i]), pattern(r[i])) << "output " << i;
        const size_t third = a[i].size() / 3;
        for (size_t j = 2 * third; j < a[i].size(); ++j)
          if (!(std::isnan(a[i][j]) && std::isnan(c[i][j]))) { ASSERT_EQ(a[i][j], c[i][j]) << "output " << i << " row 2"; }
      }
    }
}

// One output [3,70,...] of a chunk sub-operator whose main input was poisoned at token 40 of batch
// row 0 and token 7 of row 1 (got), the ref backend's (ref) and a clean call's (clean): non-finite
// wherever the reference is, besides those only inside the poisoned chunks of 32 rows (a zero
// weight of the chunk products times NaN), and row 2 bit for bit the clean call's.
void expect_poisoned_chunks(const std::vector<double>& got, const std::vector<double>& ref,
                            const std::vector<double>& clean) {
  const int64_t row = static_cast<int64_t>(got.size()) / 3, tok = row / 70;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
    const int64_t bi = i / row, t = (i % row) / tok;
    if (!std::isfinite(ref[i])) {
      ASSERT_FALSE(std::isfinite(got[i])) << "finite where the reference is not, at " << i;
    }
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) {
      ASSERT_TRUE((bi == 0 && t >= 32 && t < 64) || (bi == 1 && t < 32)) << "non-finite outside the poisoned chunks, at " << i;
    }
    if (bi == 2 && !(std::isnan(got[i]) && std::isnan(clean[i]))) {
      ASSERT_EQ(got[i], clean[i]) << "row 2 at " << i;
    }
  }
}

// GDN's chunk sub-operators (chunk_scaled_dot_kkt_fwd, solve_tril, recompute_w_u_fwd,
// prepare_wy_repr_bwd, chunk_fwd_o, chunk_bwd_dv_local, chunk_bwd_dqkwg): rank, chunk tables that do
// not match cu_seqlens (raised before any work), T = 0, and NaN / Inf against the ref backend's
// pattern (up to the rows of the poisoned chunk), on every CPU backend.
struct GdnSub {
  int64_t B, T, NT;
  TestTensor q, k, v, g, beta, A, h, dh, dout, dv, dw, du, w, o1, o2, o3, o4;
  explicit GdnSub(int64_t b, int64_t t) : B(b), T(t), NT((t + 31) / 32) {
    const DType f = DType::kFloat32;
    for (TestTensor* x : {&q, &k, &v, &dout, &dv, &dw, &du, &w}) *x = TestTensor(f, {B, T, 2, 8});
    q.fill_normal(1, 0, 0.3); k.fill_normal(2, 0, 0.3); v.fill_normal(3); dout.fill_normal(4); dv.fill_normal(5);
    dw.fill_normal(6); du.fill_normal(7); w.fill_normal(8, 0, 0.3);
    g = TestTensor(f, {B, T, 2});
    std::vector<double> gv = g.fill_normal(9);
    for (int64_t i = 0; i < static_cast<int64_t>(gv.size()); ++i) gv[i] = -0.02 * ((i / 2) % 32 + 1);  // a cumsum
    g.set(gv);
    beta = TestTensor(f, {B, T, 2});
    std::vector<double> bv = beta.fill_normal(10);
    for (double& x : bv) x = 1.0 / (1.0 + std::exp(-x));
    beta.set(bv);
    A = TestTensor(f, {B, T, 2, 32});
    std::vector<double> av = A.fill_normal(11, 0, 0.1);
    for (int64_t i = 0; i < static_cast<int64_t>(av.size()); ++i)
      if (i % 32 >= (i / 64) % 32) av[i] = 0;  // strictly lower per chunk row (t % 32 = row)
    A.set(av);
    h = TestTensor(f, {B, NT, 2, 8, 8});
    h.fill_normal(12);
    dh = TestTensor(f, {B, NT, 2, 8, 8});
    dh.fill_normal(13);
    o1 = TestTensor(f, {B, T, 2, 32});
    o2 = TestTensor(f, {B, T, 2, 8});
    o3 = TestTensor(f, {B, T, 2, 8});
    o4 = TestTensor(f, {B, T, 2});
  }
  // Runs `op`; its outputs are o1..o4 as the op has them.
  void run(const std::string& op, const Context& ctx, const TensorView& cu = {}, const TensorView& ci = {}) {
    if (op == "chunk_scaled_dot_kkt") {
      chunk_scaled_dot_kkt_fwd(ctx, {k.view(), beta.view(), g.view(), o1.view(), cu, ci, 32});
    } else if (op == "solve_tril") {
      solve_tril(ctx, {A.view(), o1.view(), cu, ci});
    } else if (op == "recompute_w_u") {
      recompute_w_u_fwd(ctx, {k.view(), v.view(), beta.view(), A.view(), g.view(), o2.view(), o3.view(), cu, ci});
    } else if (op == "prepare_wy_repr_bwd") {
      PrepareWyReprBwdArgs a;
      a.k = k.view(); a.v = v.view(); a.beta = beta.view(); a.A = A.view(); a.g = g.view(); a.dw = dw.view();
      a.du = du.view(); a.dk = o2.view(); a.dv = o3.view(); a.dbeta = o4.view(); a.dg = TensorView();
      a.g = TensorView();
      a.cu_seqlens = cu; a.chunk_indices = ci;
      prepare_wy_repr_bwd(ctx, a);
    } else if (op == "chunk_fwd_o") {
      chunk_fwd_o(ctx, {q.view(), k.view(), v.view(), h.view(), g.view(), o2.view(), cu, ci, 0.3, 32});
    } else if (op == "chunk_bwd_dv_local") {
      chunk_bwd_dv_local(ctx, {q.view(), k.view(), dout.view(), g.view(), o2.view(), cu, ci, 0.3, 32});
    } else {
      ChunkBwdDqkwgArgs a;
      a.q = q.view(); a.k = k.view(); a.v = v.view(); a.dout = dout.view(); a.h = h.view(); a.dh = dh.view();
      a.w = w.view(); a.dv = dv.view(); a.g = g.view(); a.dq = o2.view(); a.dk = o3.view(); a.dw = dw.view();
      a.dg = o4.view(); a.cu_seqlens = cu; a.chunk_indices = ci; a.scale = 0.3; a.chunk_size = 32;
      chunk_bwd_dqkwg(ctx, a);
    }
  }
  std::vector<TestTensor*> outputs() { return {&o1, &o2, &o3, &o4}; }
  // The tensor the test poisons / makes of the wrong rank.
  TestTensor& main(const std::string& op) {
    if (op == "solve_tril") return A;
    if (op == "chunk_scaled_dot_kkt" || op == "recompute_w_u" || op == "prepare_wy_repr_bwd") return k;
    return q;
  }
};

// The checks both families' chunk sub-operators get (Sub: GdnSub or KdaSub; reg: the registry's
// name): the main input of rank 3 raises `rank_msg`; a chunk_indices row that does not match
// cu_seqlens raises before any work; T = 0 and an empty sequence among others run on every CPU
// backend; NaN / Inf as expect_poisoned_chunks says.
template <class Sub>
void check_chunk_sub_operator(const std::string& op, const std::string& reg, const std::string& rank_msg) {
  const Context ctx = Context::cpu();
  {
    Sub s(1, 70);
    s.main(op) = TestTensor(DType::kFloat32, {1, 70, 16});
    expect_error([&] { s.run(op, ctx); }, ErrorKind::kValue, rank_msg);
  }
  {
    Sub s(1, 70);
    TestTensor cu = ints({3}, {0, 30, 70}), ci = ints({3, 2}, {0, 0, 1, 0, 1, 5});
    for (TestTensor* t : s.outputs()) t->set(std::vector<double>(t->numel(), NAN));
    expect_error([&] { s.run(op, ctx, cu.view(), ci.view()); }, ErrorKind::kValue,
                 "chunk_indices row 2 is (1,5), expected (1,1) for these cu_seqlens");
    for (TestTensor* t : s.outputs()) EXPECT_TRUE(all_nan(*t));
  }
  for (const auto& b : cpu_backends(reg)) {
    SCOPED_TRACE(b.id);
    {
      Sub e(2, 0);
      e.run(op, b.ctx());
      Sub v(1, 70);
      TestTensor cu = ints({5}, {0, 0, 30, 30, 70}), ci = ints({3, 2}, {1, 0, 3, 0, 3, 1});
      v.run(op, b.ctx(), cu.view(), ci.view());
    }
    // NaN at token 40 of batch row 0, +Inf at token 7 of row 1; row 2 clean.
    Sub ours(3, 70), ref(3, 70), clean(3, 70);
    for (Sub* s : {&ours, &ref}) {
      TestTensor& m = s->main(op);
      std::vector<double> x = m.to_double();
      const int64_t row = m.numel() / 3, tok = row / 70;
      x[40 * tok + 3] = NAN;
      x[row + 7 * tok + 9] = INFINITY;
      m.set(x);
    }
    Context rctx = Context::cpu();
    rctx.backend = "ref";
    ref.run(op, rctx);
    ours.run(op, b.ctx());
    clean.run(op, b.ctx());
    const auto a = ours.outputs(), r = ref.outputs(), c = clean.outputs();
    for (size_t k = 0; k < a.size(); ++k) {
      SCOPED_TRACE("output " + std::to_string(k));
      expect_poisoned_chunks(a[k]->to_double(), r[k]->to_double(), c[k]->to_double());
    }
  }
}

TEST(LinearAttentionInvalid, GdnSubOperators) {
  for (const std::string op : {"chunk_scaled_dot_kkt", "solve_tril", "recompute_w_u", "prepare_wy_repr_bwd",
                               "chunk_fwd_o", "chunk_bwd_dv_local", "chunk_bwd_dqkwg"}) {
    SCOPED_TRACE(op);
    check_chunk_sub_operator<GdnSub>(op, op == "prepare_wy_repr_bwd" ? "recompute_w_u" : op, "must have rank");
  }
}

// State inputs (h / dh snapshots, h0, dht, initial_state) are read as dense [K, V] blocks: a view
// with a unit last stride that is not contiguous (here batch rows sharing one state, stride 0, as
// torch's expand gives) is an error naming the tensor, not a read past the state's memory (the
// CUDA kernels' illegal address at 2^21 expanded batch rows, H100 run of a440a2f).
TEST(LinearAttentionInvalid, StateInputsMustBeContiguous) {
  auto broadcast_rows = [](const TestTensor& t, int64_t B) {  // t's batch row 0, B times
    const TensorView v = t.view();
    std::vector<int64_t> shape(v.ndim()), strides(v.ndim());
    for (int d = 0; d < v.ndim(); ++d) {
      shape[d] = v.size(d);
      strides[d] = v.stride(d);
    }
    shape[0] = B;
    strides[0] = 0;
    return TensorView(t.data(), t.dtype(), v.device(), v.ndim(), shape.data(), strides.data());
  };
  const Context ctx = Context::cpu();
  GdnSub s(2, 40);
  const TensorView h2 = broadcast_rows(s.h, 2), dh2 = broadcast_rows(s.dh, 2);
  expect_error([&] { chunk_fwd_o(ctx, {s.q.view(), s.k.view(), s.v.view(), h2, s.g.view(), s.o2.view(), {}, {}, 0.3,
                                       32}); },
               ErrorKind::kValue, "h must be contiguous (states are read as dense [K, V] blocks)");
  ChunkBwdDqkwgArgs a;
  a.q = s.q.view(); a.k = s.k.view(); a.v = s.v.view(); a.dout = s.dout.view(); a.h = s.h.view(); a.dh = dh2;
  a.dv = s.dv.view(); a.dq = s.o2.view(); a.dk = s.o3.view(); a.scale = 0.3; a.chunk_size = 32;
  expect_error([&] { chunk_bwd_dqkwg(ctx, a); }, ErrorKind::kValue, "dh must be contiguous");
  // The state recurrence's h0 and the top level's initial_state: [N, HV, K, V] broadcast over N.
  TestTensor h0(DType::kFloat32, {1, 2, 8, 8});
  h0.fill_normal(3);
  const TensorView h0b = broadcast_rows(h0, 2);
  ChunkGatedDeltaRuleFwdHArgs f;
  f.k = s.k.view(); f.w = s.w.view(); f.u = s.v.view(); f.g = s.g.view(); f.h0 = h0b; f.h = s.h.view();
  f.chunk_size = 32;
  expect_error([&] { chunk_gated_delta_rule_fwd_h(ctx, f); }, ErrorKind::kValue, "h0 must be contiguous");
}

// KDA's chunk sub-operators (chunk_kda_fwd_intra, kda_recompute_w_u_fwd, chunk_kda_fwd_o,
// chunk_kda_bwd_dAv, chunk_kda_bwd_wy_dqkg_fused, chunk_kda_bwd_intra): as GdnSubOperators.
struct KdaSub {
  int64_t B, T, NT;
  // inputs
  TestTensor q, k, v, gk, beta, Aqk, Akk, h, dh, dout, dvn, vnew, dAqk, dAkk, dq, dk, db, dg;
  // outputs (fp32; each op uses the first few)
  std::vector<TestTensor> out;
  explicit KdaSub(int64_t b, int64_t t) : B(b), T(t), NT((t + 31) / 32) {
    const DType f = DType::kFloat32;
    for (TestTensor* x : {&q, &k, &v, &dout, &dvn, &vnew, &dq, &dk, &dg, &gk}) *x = TestTensor(f, {B, T, 2, 8});
    uint64_t seed = 1;
    for (TestTensor* x : {&q, &k}) x->fill_normal(seed++, 0, 0.3);
    for (TestTensor* x : {&v, &dout, &dvn, &vnew, &dq, &dk, &dg}) x->fill_normal(seed++);
    std::vector<double> gv(gk.numel());
    for (int64_t i = 0; i < gk.numel(); ++i) gv[i] = -0.02 * (((i / 16) % T) % 32 + 1) * (1 + (i % 8) * 0.1);
    gk.set(gv);
    beta = TestTensor(f, {B, T, 2});
    std::vector<double> bv = beta.fill_normal(seed++);
    for (double& x : bv) x = 1.0 / (1.0 + std::exp(-x));
    beta.set(bv);
    db = TestTensor(f, {B, T, 2});
    db.fill_normal(seed++);
    for (TestTensor* x : {&Aqk, &Akk, &dAqk, &dAkk}) {
      *x = TestTensor(f, {B, T, 2, 32});
      x->fill_normal(seed++, 0, 0.1);
    }
    h = TestTensor(f, {B, NT, 2, 8, 8});
    h.fill_normal(seed++);
    dh = TestTensor(f, {B, NT, 2, 8, 8});
    dh.fill_normal(seed++);
    for (int i = 0; i < 6; ++i) out.emplace_back(f, std::vector<int64_t>{B, T, 2, 8});
    out.emplace_back(f, std::vector<int64_t>{B, T, 2, 32});
    out.emplace_back(f, std::vector<int64_t>{B, T, 2, 32});
    out.emplace_back(f, std::vector<int64_t>{B, T, 2});
  }
  TensorView o(int i) const { return out[i].view(); }
  std::vector<TestTensor*> outputs() {
    std::vector<TestTensor*> v;
    for (TestTensor& t : out) v.push_back(&t);
    return v;
  }
  void run(const std::string& op, const Context& ctx, const TensorView& cu = {}, const TensorView& ci = {}) {
    if (op == "chunk_kda_fwd_intra") {
      chunk_kda_fwd_intra(ctx, {q.view(), k.view(), gk.view(), beta.view(), o(6), o(7), cu, ci, 0.3, 32, false});
    } else if (op == "kda_recompute_w_u") {
      kda_recompute_w_u_fwd(ctx, {q.view(), k.view(), v.view(), beta.view(), Akk.view(), gk.view(), o(0), o(1), o(2),
                                  o(3), cu, ci});
    } else if (op == "chunk_kda_fwd_o") {
      chunk_kda_fwd_o(ctx, {q.view(), Aqk.view(), v.view(), h.view(), o(0), cu, ci, 0.3});
    } else if (op == "chunk_kda_bwd_dAv") {
      chunk_kda_bwd_dAv(ctx, {Aqk.view(), v.view(), dout.view(), o(6), o(0), cu, ci, 0.3});
    } else if (op == "chunk_kda_bwd_wy_dqkg_fused") {
      chunk_kda_bwd_wy_dqkg_fused(ctx, {q.view(), k.view(), v.view(), vnew.view(), gk.view(), beta.view(), Akk.view(),
                                        h.view(), dh.view(), dout.view(), dvn.view(), o(0), o(1), o(2), o(8), o(3),
                                        o(7), cu, ci, 0.3, 32});
    } else {
      chunk_kda_bwd_intra(ctx, {q.view(), k.view(), gk.view(), beta.view(), dAqk.view(), dAkk.view(), dq.view(),
                                dk.view(), db.view(), dg.view(), o(0), o(1), o(8), o(2), cu, ci, 32, false});
    }
  }
  TestTensor& main(const std::string& op) {
    if (op == "chunk_kda_fwd_o") return v;
    if (op == "chunk_kda_bwd_dAv") return dout;
    return k;
  }
};

TEST(LinearAttentionInvalid, KdaSubOperators) {
  for (const std::string op : {"chunk_kda_fwd_intra", "kda_recompute_w_u", "chunk_kda_fwd_o", "chunk_kda_bwd_dAv",
                               "chunk_kda_bwd_wy_dqkg_fused", "chunk_kda_bwd_intra"}) {
    SCOPED_TRACE(op);
    check_chunk_sub_operator<KdaSub>(op, op, op == "chunk_kda_bwd_dAv" ? "dout must have shape" : "must have rank");
  }
}

// ---------------------------------------------------------------------------------------------
// CUDA: cu_seqlens is not read on the host; the device check reports a bad one (raised by
// check_device_errors) and the kernels clamp every offset; debug checks raise the CPU's error.

TEST(LinearAttentionInvalid, CudaReportsBadCuSeqlensAndRaisesUnderDebugChecks) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "needs a CUDA build";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (Form f : kForms) {
    SCOPED_TRACE(op_name(f));
    Call c(f, 1, 70, {0, 30, 90}, DType::kBFloat16, Device::cuda(0));
    const Context ctx = Context::cuda(0);
    c.run(ctx);  // in bounds (clamped), reported
    expect_error([&] { check_device_errors(ctx); }, ErrorKind::kValue, "cu_seqlens[2] = 90 is not");
    check_device_errors(ctx);  // cleared
    Context debug = ctx;
    debug.validate = true;
    expect_error([&] { c.run(debug); }, ErrorKind::kValue, "cu_seqlens must end at T=70 (the packed length), got cu_seqlens[2]=90");
  }
  // The shared sub-operator with a chunk_indices row naming a sequence past N: clamped, no fault.
  Call c(Form::kChunkGdn, 1, 70, {0, 30, 70}, DType::kFloat32, Device::cuda(0));
  TestTensor out(DType::kFloat32, {1, 70, 2}, Device::cuda(0));
  TestTensor ci = ints({3, 2}, {0, 0, 1, 0, 1000000, 5});
  TestTensor cid = ci.to(Device::cuda(0));
  ChunkLocalCumsumArgs cs;
  cs.g = c.g.view(); cs.out = out.view(); cs.cu_seqlens = c.cu_t.view(); cs.chunk_indices = cid.view(); cs.chunk_size = 32;
  chunk_local_cumsum(Context::cuda(0), cs);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  check_device_errors(Context::cuda(0));
#endif
}

#ifdef FUSEDOPS_WITH_CUDA
// t (contiguous, on device d) seen as B copies of its first row along dimension 0: stride 0 there,
// no memory.
TensorView repeat_rows(const TestTensor& t, int64_t B, Device d) {
  std::vector<int64_t> shape = t.shape(), strides(shape.size());
  int64_t n = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) strides[i] = n, n *= shape[i];
  shape[0] = B;
  strides[0] = 0;
  return TensorView(t.data(), t.dtype(), d, static_cast<int>(shape.size()), shape.data(), strides.data());
}
#endif

// A decoding step (one token per sequence) of more states than a grid dimension holds (65535):
// the recurrent forward's grid then folds the (sequence, head) index over y and z, and the last
// z slice runs past the states. Every token input is one row repeated (stride 0) and every initial
// state a copy of the first, so the last sequence's o and final state must equal the first's; the
// outputs start as 0xFF bytes (NaN), so a state no CTA wrote shows.
TEST(LinearAttentionInvalid, DecodingStepPast65535StatesOnCuda) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "the grid limits are CUDA's";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Device d = Device::cuda(0);
  for (bool kda : {false, true}) {
    SCOPED_TRACE(kda ? "fused_recurrent_kda" : "fused_recurrent_gated_delta_rule");
    Call one(kda ? Form::kRecurrentKda : Form::kRecurrentGdn, 1, 1, {}, DType::kFloat32, d);
    const int64_t B = 65535 / one.HV + 7;  // N HV = 65548 states: z = 2, the second slice 13 deep
    auto bcast = [&](const TestTensor& t) { return repeat_rows(t, B, d); };
    const int64_t orow = one.HV * one.V, hrow = one.HV * one.K * one.V;
    void* o = nullptr;
    void* ht = nullptr;
    void* h0 = nullptr;
    std::vector<float> h0_host(static_cast<size_t>(B * hrow));
    ASSERT_EQ(cudaMemcpy(h0_host.data(), one.h0.data(), hrow * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t b = 1; b < B; ++b) std::memcpy(h0_host.data() + b * hrow, h0_host.data(), hrow * 4);
    ASSERT_EQ(cudaMalloc(&h0, h0_host.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(h0, h0_host.data(), h0_host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&o, static_cast<size_t>(B * orow) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ht, static_cast<size_t>(B * hrow) * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(o, 0xFF, static_cast<size_t>(B * orow) * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(ht, 0xFF, static_cast<size_t>(B * hrow) * 4), cudaSuccess);
    const int64_t oshape[4] = {B, 1, one.HV, one.V}, ostr[4] = {orow, orow, one.V, 1};
    const int64_t hshape[4] = {B, one.HV, one.K, one.V}, hstr[4] = {hrow, one.K * one.V, one.V, 1};
    auto fill = [&](auto& a) {
      one.shared(a);
      a.q = bcast(one.q); a.k = bcast(one.k); a.v = bcast(one.v); a.g = bcast(one.g); a.beta = bcast(one.beta);
      a.initial_state = TensorView(h0, DType::kFloat32, d, 4, hshape, hstr);
      a.o = TensorView(o, DType::kFloat32, d, 4, oshape, ostr);
      a.final_state = TensorView(ht, DType::kFloat32, d, 4, hshape, hstr);
    };
    if (kda) {
      FusedRecurrentKdaFwdArgs a;
      fill(a);
      fused_recurrent_kda_fwd(Context::cuda(0), a);
    } else {
      FusedRecurrentGatedDeltaRuleFwdArgs a;
      fill(a);
      fused_recurrent_gated_delta_rule_fwd(Context::cuda(0), a);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (auto [p, row] : {std::pair<void*, int64_t>{o, orow}, std::pair<void*, int64_t>{ht, hrow}}) {
      std::vector<float> first(static_cast<size_t>(row)), last(static_cast<size_t>(row));
      ASSERT_EQ(cudaMemcpy(first.data(), p, row * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(last.data(), static_cast<float*>(p) + (B - 1) * row, row * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (float x : first) ASSERT_TRUE(std::isfinite(x));
      EXPECT_EQ(0, std::memcmp(first.data(), last.data(), static_cast<size_t>(row) * 4));
    }
    cudaFree(o);
    cudaFree(ht);
    cudaFree(h0);
  }
#endif
}

// Element counts past 2^31: o [B,T,HV,V] of more than 2^31 elements, written from inputs whose
// batch rows are one row repeated (stride 0: no memory), so the last row must equal the first.
TEST(LinearAttentionInvalid, OutputsPast2Pow31ElementsOnCuda) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "2^31 output elements need >= 4 GiB: CUDA only (a CPU run would need the same "
                  "host memory and minutes of CI time)";
#else
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "2^31 output elements need >= 4 GiB: CUDA only (a CPU run would need the same "
                    "host memory and minutes of CI time)";
  const Device d = Device::cuda(0);
  const int64_t T = 64;
  Call one(Form::kRecurrentGdn, 1, T, {}, DType::kBFloat16, d);
  const int64_t B = (int64_t(1) << 31) / (T * one.HV * one.V) + 2;
  void* out = nullptr;
  const size_t bytes = static_cast<size_t>(B * T * one.HV * one.V) * 2;
  ASSERT_EQ(cudaMalloc(&out, bytes), cudaSuccess);
  auto bcast = [&](const TestTensor& t) { return repeat_rows(t, B, d); };
  FusedRecurrentGatedDeltaRuleFwdArgs a;
  one.shared(a);
  a.q = bcast(one.q); a.k = bcast(one.k); a.v = bcast(one.v); a.g = bcast(one.g); a.beta = bcast(one.beta);
  a.initial_state = TensorView();
  a.final_state = TensorView();
  const int64_t oshape[4] = {B, T, one.HV, one.V}, ostr[4] = {T * one.HV * one.V, one.HV * one.V, one.V, 1};
  a.o = TensorView(out, DType::kBFloat16, d, 4, oshape, ostr);
  fused_recurrent_gated_delta_rule_fwd(Context::cuda(0), a);
  const size_t row = static_cast<size_t>(T * one.HV * one.V) * 2;
  std::vector<uint8_t> first(row), last(row);
  ASSERT_EQ(cudaMemcpy(first.data(), out, row, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(last.data(), static_cast<uint8_t*>(out) + (B - 1) * row, row, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(first, last);
  cudaFree(out);
  {  // the shared chunk_local_cumsum: g [B,64,2] broadcast along B, out of more than 2^31 elements
    const int64_t Bc = (int64_t(1) << 31) / (64 * 2) + 2;
    TestTensor g1(DType::kFloat32, {1, 64, 2}, d);
    g1.fill_normal(3);
    const int64_t gs[3] = {Bc, 64, 2}, gst[3] = {0, 2, 1}, ost[3] = {64 * 2, 2, 1};
    void* o2 = nullptr;
    ASSERT_EQ(cudaMalloc(&o2, static_cast<size_t>(Bc) * 128 * 4), cudaSuccess);
    ChunkLocalCumsumArgs cs;
    cs.g = TensorView(g1.data(), DType::kFloat32, d, 3, gs, gst);
    cs.out = TensorView(o2, DType::kFloat32, d, 3, gs, ost);
    cs.chunk_size = 64;
    chunk_local_cumsum(Context::cuda(0), cs);
    std::vector<uint8_t> a(512), z(512);
    ASSERT_EQ(cudaMemcpy(a.data(), o2, 512, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(z.data(), static_cast<uint8_t*>(o2) + (Bc - 1) * 512, 512, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(a, z);
    cudaFree(o2);
  }
#endif
}

}  // namespace
}  // namespace fusedops::testing
