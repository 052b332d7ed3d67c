// Invalid and extreme inputs across the operator families (issue 39; the family READMEs' "Invalid
// inputs" tables name these tests):
//   NonFinite: NaN and +-Inf in one row of an input give every backend the reference backend's
//     pattern of NaN and Inf in every output (NaN propagates; nothing crashes).
//   LargeInputs: element counts past 2^31 (32-bit indexing) on CUDA with real tensors whose rows
//     repeat with a short period, so that the last row's output must equal an early row's (the
//     CPU would need the same memory in RAM: skipped there, with the reason).
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

// One forward call: its tensors (inputs first) and a runner.
struct Call {
  std::vector<std::unique_ptr<TestTensor>> inputs, outputs;
  std::function<void(const Context&)> run;
  TestTensor& in(size_t i) { return *inputs[i]; }
  TestTensor& out(size_t i) { return *outputs[i]; }
};

using CallPtr = std::unique_ptr<Call>;

struct OpCase {
  std::string op;
  // Builds the call for `rows` rows (the leading dim of the first input and of every output that
  // has one per row) on `device`.
  std::function<CallPtr(DType, int64_t rows, Device)> make;
  int64_t rows = 6;
};

std::unique_ptr<TestTensor> tensor(DType dt, std::vector<int64_t> shape, Device d) {
  return std::make_unique<TestTensor>(dt, std::move(shape), d);
}

std::vector<OpCase> op_cases() {
  const DType f32 = DType::kFloat32;
  std::vector<OpCase> c;
  c.push_back({"rmsnorm_without_weight", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 40}, d));
                 k->outputs.push_back(tensor(dt, {n, 40}, d));
                 k->outputs.push_back(tensor(f32, {n}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   rmsnorm_without_weight_fwd(ctx, {k->in(0).view(), k->out(0).view(), k->out(1).view(), 1e-6});
                 };
                 return k;
               }});
  c.push_back({"l2norm", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 40}, d));
                 k->outputs.push_back(tensor(dt, {n, 40}, d));
                 k->outputs.push_back(tensor(f32, {n}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   l2norm_fwd(ctx, {k->in(0).view(), k->out(0).view(), k->out(1).view(), 1e-6});
                 };
                 return k;
               }});
  c.push_back({"rmsnorm_gated", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 40}, d));
                 k->inputs.push_back(tensor(dt, {n, 40}, d));
                 k->inputs.push_back(tensor(dt, {40}, d));
                 k->outputs.push_back(tensor(dt, {n, 40}, d));
                 k->outputs.push_back(tensor(f32, {n, 1}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   RmsNormGatedFwdArgs a;
                   a.x = k->in(0).view();
                   a.z = k->in(1).view();
                   a.weight = k->in(2).view();
                   a.y = k->out(0).view();
                   a.rstd = k->out(1).view();
                   rmsnorm_gated_fwd(ctx, a);
                 };
                 return k;
               }});
  c.push_back({"causal_conv1d", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {2, n, 16}, d));
                 k->inputs.push_back(tensor(dt, {4, 16}, d));
                 k->outputs.push_back(tensor(dt, {2, n, 16}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   CausalConv1dFwdArgs a;
                   a.x = k->in(0).view();
                   a.weight = k->in(1).view();
                   a.y = k->out(0).view();
                   a.activation = CausalConv1dActivation::kSilu;
                   causal_conv1d_fwd(ctx, a);
                 };
                 return k;
               }});
  c.push_back({"clipped_swiglu", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 32}, d));
                 k->outputs.push_back(tensor(dt, {n, 16}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   ClippedSwigluFwdArgs a;
                   a.x = k->in(0).view();
                   a.y = k->out(0).view();
                   clipped_swiglu_fwd(ctx, a);
                 };
                 return k;
               }});
  c.push_back({"fused_cross_entropy_loss", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 50}, d));
                 TestTensor labels(DType::kInt64, {n});  // a period of 8 rows, as LargeInputs fills
                 for (int64_t i = 0; i < n; ++i) static_cast<int64_t*>(labels.data())[i] = (i % 8) * 6;
                 k->inputs.push_back(std::make_unique<TestTensor>(labels.to(d)));
                 k->outputs.push_back(tensor(f32, {n}, d));
                 Context on;
                 on.device = d;
                 const size_t ws = cross_entropy_workspace_size(on, n, 50);
                 k->inputs.push_back(tensor(DType::kUInt8, {static_cast<int64_t>(ws)}, d));
                 k->run = [k = k.get(), ws](const Context& ctx) {
                   CrossEntropyFwdArgs a;
                   a.logits = k->in(0).view();
                   a.labels = k->in(1).view();
                   a.loss = k->out(0).view();
                   a.options.reduction = LossReduction::kNone;
                   a.workspace = ws ? k->in(2).view() : TensorView();
                   fused_cross_entropy_loss_fwd(ctx, a);
                 };
                 return k;
               }});
  c.push_back({"sinkhorn", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 4, 4}, d));
                 k->outputs.push_back(tensor(dt, {n, 4, 4}, d));
                 k->run = [k = k.get()](const Context& ctx) { sinkhorn_fwd(ctx, {k->in(0).view(), k->out(0).view()}); };
                 return k;
               }});
  c.push_back({"hc_split_sinkhorn", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 24}, d));
                 k->inputs.push_back(tensor(f32, {3}, d));
                 k->inputs.push_back(tensor(f32, {24}, d));
                 k->outputs.push_back(tensor(dt, {n, 4}, d));
                 k->outputs.push_back(tensor(dt, {n, 4}, d));
                 k->outputs.push_back(tensor(dt, {n, 4, 4}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   hc_split_sinkhorn_fwd(ctx, {k->in(0).view(), k->in(1).view(), k->in(2).view(), k->out(0).view(),
                                               k->out(1).view(), k->out(2).view()});
                 };
                 return k;
               }});
  c.push_back({"mhc_pre_bmm", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 4, 16}, d));
                 k->inputs.push_back(tensor(f32, {n, 4}, d));
                 k->outputs.push_back(tensor(dt, {n, 16}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   mhc_pre_bmm_fwd(ctx, {k->in(1).view(), k->in(0).view(), k->out(0).view()});
                 };
                 return k;
               }});
  c.push_back({"mhc_post", [=](DType dt, int64_t n, Device d) {
                 auto k = std::make_unique<Call>();
                 k->inputs.push_back(tensor(dt, {n, 4, 16}, d));
                 k->inputs.push_back(tensor(f32, {n, 4, 4}, d));
                 k->inputs.push_back(tensor(dt, {n, 16}, d));
                 k->inputs.push_back(tensor(f32, {n, 4}, d));
                 k->outputs.push_back(tensor(dt, {n, 4, 16}, d));
                 k->run = [k = k.get()](const Context& ctx) {
                   mhc_post_fwd(ctx, {k->in(0).view(), k->in(1).view(), k->in(2).view(), k->in(3).view(),
                                      k->out(0).view()});
                 };
                 return k;
               }});
  return c;
}

std::vector<uint8_t> nan_mask(const std::vector<double>& v, bool inf) {
  std::vector<uint8_t> m(v.size());
  for (size_t i = 0; i < v.size(); ++i) m[i] = inf ? std::isinf(v[i]) * (v[i] > 0 ? 1 : 2) : std::isnan(v[i]);
  return m;
}

// Normal values in every floating input; in the first, NaN in row 0, +Inf / -Inf side by side in
// row 1 (each meets weights of both signs where there are weights), -Inf / +Inf in row 2.
void fill_poisoned(Call& k, uint64_t seed) {
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    TestTensor& t = k.in(i);
    if (!is_floating(t.dtype())) continue;
    std::vector<double> v = t.fill_normal(seed + i);
    if (i == 0) {
      const int64_t row = t.numel() / t.shape()[0];
      v[0] = std::nan("");
      v[row + 1] = INFINITY;
      v[row + 2] = -INFINITY;
      if (t.shape()[0] > 2) {
        v[2 * row] = -INFINITY;
        v[2 * row + 3] = INFINITY;
      }
      t.set(v);
    }
  }
}

TEST(NonFinite, PropagatesLikeTheReferenceOnEveryOperatorAndBackend) {
  for (const OpCase& oc : op_cases()) {
    for (const auto& b : runnable_backends(oc.op, Direction::kForward)) {
      if (b.id == "ref") continue;
      for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
        if (!backend_takes(oc.op, Direction::kForward, b.id, dt)) continue;
        SCOPED_TRACE(oc.op + " " + b.id + " " + dtype_name(dt));
        CallPtr ref = oc.make(dt, oc.rows, Device::cpu());
        fill_poisoned(*ref, 5);
        Context rctx = Context::cpu();
        rctx.backend = "ref";
        ref->run(rctx);
        CallPtr ours = oc.make(dt, oc.rows, b.device);
        fill_poisoned(*ours, 5);
        ours->run(b.ctx());
        for (size_t o = 0; o < ours->outputs.size(); ++o) {
          const auto got = ours->out(o).to_double(), want = ref->out(o).to_double();
          EXPECT_EQ(nan_mask(got, false), nan_mask(want, false)) << "NaN pattern of output " << o;
          EXPECT_EQ(nan_mask(got, true), nan_mask(want, true)) << "Inf pattern of output " << o;
        }
      }
    }
  }
}

#ifdef FUSEDOPS_WITH_CUDA
// Rows 0..P-1 of `t` (already on the device) copied over the rest, doubling.
void repeat_rows(TestTensor& t, int64_t period) {
  const size_t row = static_cast<size_t>(t.numel() / t.shape()[0]) * dtype_size(t.dtype());
  const size_t total = row * static_cast<size_t>(t.shape()[0]);
  size_t have = row * static_cast<size_t>(period);
  auto* p = static_cast<uint8_t*>(t.data());
  while (have < total) {
    const size_t n = std::min(have, total - have);
    ASSERT_EQ(cudaMemcpy(p + have, p, n, cudaMemcpyDeviceToDevice), cudaSuccess);
    have += n;
  }
}
#endif

TEST(LargeInputs, RowWiseOperatorsPast2Pow31ElementsOnCuda) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "2^31 elements need >= 4 GiB per tensor: CUDA only (a CPU run would need the "
                  "same host memory and minutes of CI time)";
#else
  if (cuda_device_count() == 0)
    GTEST_SKIP() << "2^31 elements need >= 4 GiB per tensor: CUDA only (a CPU run would need the "
                    "same host memory and minutes of CI time)";
  constexpr int64_t kPeriod = 8;
  for (const OpCase& oc : op_cases()) {
    if (oc.op == "causal_conv1d") continue;  // rows along T: LargeInputs.CausalConv1d* below
    for (const auto& b : runnable_backends(oc.op, Direction::kForward)) {
      if (b.device.kind != DeviceKind::kCUDA) continue;
      SCOPED_TRACE(oc.op + " " + b.id);
      // Rows so that the first input has more than 2^31 elements, a multiple of the period.
      const int64_t per_row = oc.make(DType::kBFloat16, kPeriod, Device::cpu())->in(0).numel() / kPeriod;
      const int64_t rows = ((int64_t(1) << 31) / per_row / kPeriod + 1) * kPeriod;
      CallPtr k = oc.make(DType::kBFloat16, rows, b.device);
      for (size_t i = 0; i < k->inputs.size(); ++i) {
        TestTensor& t = k->in(i);
        if (!is_floating(t.dtype())) continue;
        if (t.shape()[0] != rows) {
          t.fill_normal(11 + i);
          continue;
        }
        // The first period of rows from the host, then copies of it.
        std::vector<int64_t> shape = t.shape();
        shape[0] = kPeriod;
        TestTensor head(t.dtype(), shape);
        head.fill_normal(11 + i);
        ASSERT_EQ(cudaMemcpy(t.data(), head.data(), head.numel() * dtype_size(head.dtype()),
                             cudaMemcpyHostToDevice), cudaSuccess);
        repeat_rows(t, kPeriod);
      }
      k->run(b.ctx());
      check_device_errors(b.ctx());
      for (size_t o = 0; o < k->outputs.size(); ++o) {
        TestTensor& t = k->out(o);
        if (t.shape()[0] != rows) continue;
        const size_t row = static_cast<size_t>(t.numel() / rows) * dtype_size(t.dtype());
        std::vector<uint8_t> early(row), last(row);
        const auto* p = static_cast<const uint8_t*>(t.data());
        ASSERT_EQ(cudaMemcpy(early.data(), p + row * (kPeriod - 1), row, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(last.data(), p + row * (rows - 1), row, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(early, last) << "output " << o << ": the last row differs from row " << kPeriod - 1;
      }
    }
  }
#endif
}

#ifdef FUSEDOPS_WITH_CUDA
// A CUDA tensor of `rows` rows that all hold `row` (host values).
void fill_rows(TestTensor& t, const std::vector<double>& row) {
  TestTensor head(t.dtype(), {1, static_cast<int64_t>(row.size())});
  head.set(row);
  ASSERT_EQ(cudaMemcpy(t.data(), head.data(), row.size() * dtype_size(t.dtype()), cudaMemcpyHostToDevice),
            cudaSuccess);
  repeat_rows(t, 1);
}
#endif

// The reductions over rows: sums known exactly (matmul_add of ones: every entry is N; chunk_loss of
// zero hidden states: every row's loss is log V).
TEST(LargeInputs, ReductionsPast2Pow31ElementsOnCuda) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "2^31 elements need >= 4 GiB per tensor: CUDA only";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "2^31 elements need >= 4 GiB per tensor: CUDA only";
  const Device d = Device::cuda(0);
  const int64_t cols = 4096, n = (int64_t(1) << 31) / cols + 8;
  {
    TestTensor g(DType::kBFloat16, {n, 8}, d), x(DType::kBFloat16, {n, cols}, d), acc(DType::kFloat32, {8, cols}, d);
    fill_rows(g, std::vector<double>(8, 1.0));
    fill_rows(x, std::vector<double>(cols, 1.0));
    acc.set(std::vector<double>(8 * cols, 0.0));
    TestTensor ws(DType::kUInt8, {static_cast<int64_t>(matmul_add_workspace_size(Context::cuda(0)))}, d);
    matmul_add_fwd(Context::cuda(0), {g.view(), x.view(), acc.view(), ws.view()});
    for (double v : acc.to_double()) ASSERT_EQ(v, static_cast<double>(n));
  }
  {
    const int64_t h = cols / 2, V = 64, rows = (int64_t(1) << 31) / h + 8;
    TestTensor hid(DType::kBFloat16, {rows, h}, d), w(DType::kBFloat16, {V, h}, d), loss(DType::kFloat32, {}, d);
    TestTensor labels(DType::kInt64, {rows}, d);
    fill_rows(hid, std::vector<double>(h, 0.0));
    w.fill_normal(3);
    ASSERT_EQ(cudaMemset(labels.data(), 0, rows * 8), cudaSuccess);
    ChunkLossFwdArgs a;
    a.hidden = hid.view();
    a.weight = w.view();
    a.labels = labels.view();
    a.loss = loss.view();
    a.options.reduction = LossReduction::kSum;
    TestTensor ws(DType::kUInt8, {static_cast<int64_t>(chunk_loss_workspace_size(Context::cuda(0), a))}, d);
    a.workspace = ws.view();
    chunk_loss_fwd(Context::cuda(0), a);
    EXPECT_NEAR(loss.to_double()[0] / (static_cast<double>(rows) * std::log(64.0)), 1.0, 1e-5);
  }
#endif
}

// causal_conv1d's CUDA kernels index time in 32 bits: T >= 2^31 - 16 raises before any work (a
// view of one element reaches it).
TEST(LargeInputs, CausalConv1dTimeStepsPastInt32RaiseOnCuda) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "the limit is the CUDA kernels' (a build without CUDA)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "the limit is the CUDA kernels' (no CUDA device)";
  const int64_t T = int64_t(1) << 31;
  TestTensor one(DType::kBFloat16, {1, 1, 1}, Device::cuda(0)), w(DType::kFloat32, {4, 1}, Device::cuda(0));
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, static_cast<size_t>(T) * 2), cudaSuccess);
  const int64_t shape[3] = {1, T, 1}, strides[3] = {T, 0, 1}, dense[3] = {T, 1, 1};
  CausalConv1dFwdArgs a;
  a.x = TensorView(one.data(), DType::kBFloat16, Device::cuda(0), 3, shape, strides);
  a.weight = w.view();
  a.y = TensorView(out, DType::kBFloat16, Device::cuda(0), 3, shape, dense);
  expect_error([&] { causal_conv1d_fwd(Context::cuda(0), a); }, ErrorKind::kValue,
               "x must have fewer than 2^31 - 16 time steps");
  cudaFree(out);
#endif
}

// sort_chunks_by_idx and its map forms: row_id_map is int32, so N < 2^31 is checked (a zero-width
// view reaches the limit without memory).
TEST(LargeInputs, SortChunksRowsPastInt32Raise) {
  const int64_t n = int64_t(1) << 31;
  float dummy = 0;
  int32_t map = 0;
  int64_t one = 1, zero = 0;
  const int64_t shape[2] = {n, 0}, strides[2] = {0, 1}, mshape[1] = {n}, mstride[1] = {1};
  const TensorView inp(&dummy, DType::kFloat32, Device::cpu(), 2, shape, strides);
  const TensorView sizes(&one, DType::kInt64, Device::cpu(), {1});
  const TensorView order(&zero, DType::kInt64, Device::cpu(), {1});
  const TensorView m(&map, DType::kInt32, Device::cpu(), 1, mshape, mstride);
  expect_error([&] { sort_chunks_by_idx_fwd(Context::cpu(), {inp, sizes, order, TensorView(), inp, TensorView(), m, TensorView()}); },
               ErrorKind::kValue, "inp has 2147483648 rows; row_id_map is int32, so at most 2^31-1 are supported");
  expect_error([&] { make_chunk_sort_map(Context::cpu(), {sizes, order, m, TensorView()}); },
               ErrorKind::kValue, "row_id_map has 2147483648 rows; at most 2^31-1 are supported");
}

}  // namespace
}  // namespace fusedops::testing
