// chunk_loss: every runnable backend against a float64 oracle written here (logits = h W^T in
// double, the cross-entropy of docs/specs/ops.md section 1, dH and dW by the chain rule), the loss, z-loss,
// grad_hidden, grad_weight (overwritten and accumulated) and grad_loss_weight, for row counts
// that are not a multiple of the chunk, V = 32003, all rows ignored, per-sample alpha, large
// logits; the backward rescaling; determinism; the error messages.
#include <cmath>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "src/cpu/amx.h"
#include "src/ops/cross_entropy/ce_common.h"
#include "tests/common/tolerance.h"
#include "tests/cpp/ops/cross_entropy_harness.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

using namespace cross_entropy;

constexpr const char* kOp = "chunk_loss";

struct Grads {
  std::vector<double> loss, z_loss, dh, dw, dlw;
};

// dtype kFloat64: exact. Otherwise the plain composite in dtype: matmuls accumulated one term at
// a time in fp32 and rounded to dtype (a linear layer in dtype), the cross-entropy with every
// intermediate rounded.
Grads oracle(const std::vector<double>& h, const std::vector<double>& W, int64_t N, int64_t H, int64_t V,
             const std::vector<int64_t>& y, const std::vector<double>* w, const std::vector<double>& alpha_row,
             const CrossEntropyOptions& o, DType dtype) {
  auto rd = [&](double v) { return round_to(dtype, v); };
  auto rd32 = [&](double v) { return dtype == DType::kFloat64 ? v : round_to(DType::kFloat32, v); };
  const double mean_div = mean_divisor(y, o);
  Grads g;
  g.dh.assign(N * H, 0.0);
  g.dw.assign(V * H, 0.0);
  g.dlw.assign(N, 0.0);
  double loss = 0, zl = 0;
  std::vector<double> x(V), gz(V);
  for (int64_t i = 0; i < N; ++i) {
    if (y[i] == o.ignore_index) continue;
    const double inv = 1.0 / (mean_div * alpha_row[i]);
    for (int64_t v = 0; v < V; ++v) {  // the row's logits
      double s = 0;
      for (int64_t k = 0; k < H; ++k) s = rd32(s + h[i * H + k] * W[v * H + k]);
      x[v] = rd(s);
    }
    const double wi = w ? (*w)[i] : 1.0;
    const RowLoss r = row_cross_entropy(x.data(), V, y[i], o, wi * inv, dtype, gz.data());
    loss += wi * inv * r.loss;
    zl += inv * r.z_loss;
    g.dlw[i] = rd(r.loss * inv);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t k = 0; k < H; ++k) {
        g.dh[i * H + k] = rd32(g.dh[i * H + k] + gz[v] * W[v * H + k]);
        g.dw[v * H + k] = rd32(g.dw[v * H + k] + gz[v] * h[i * H + k]);
      }
  }
  for (auto& v : g.dh) v = rd(v);
  for (auto& v : g.dw) v = rd(v);
  g.loss = {rd32(loss)};
  g.z_loss = {rd32(zl)};
  return g;
}

struct Case {
  const char* name;
  std::vector<int64_t> hidden_shape;  // [N, H] or [B, S, H]
  int64_t V;
  int64_t chunk;
  CrossEntropyOptions o;
  bool weights;
  int ignore_every;
  bool per_sample_alpha;
  double alpha;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  CrossEntropyOptions sum;
  sum.reduction = LossReduction::kSum;
  CrossEntropyOptions mean;
  out.push_back({"one row", {1, 8}, 5, 0, mean, false, 0, false, 1.0});
  out.push_back({"sum, 37 rows in chunks of 8", {37, 16}, 129, 8, sum, true, 3, false, 1.0});
  out.push_back({"mean, chunks of 16, scalar alpha", {70, 24}, 1003, 16, mean, false, 5, false, 2.5});
  CrossEntropyOptions all = sum;
  all.label_smoothing = 0.1;
  all.lse_square_scale = 1e-3;
  all.logit_softcapping = 4.0;
  all.logit_scale = 0.8;
  out.push_back({"everything, per-sample alpha", {2, 19, 12}, 257, 7, all, true, 4, true, 1.0});
  out.push_back({"V = 32003", {9, 8}, 32003, 4, mean, true, 0, false, 1.0});
  CrossEntropyOptions ign = mean;
  ign.ignore_index = 3;
  out.push_back({"all rows ignored", {6, 8}, 11, 4, ign, true, 1, false, 1.0});
  out.push_back({"no rows", {0, 8}, 11, 0, mean, false, 0, false, 1.0});
  // On CUDA with 16-bit operands the default plan is compact here (V * H * 4 = 2 MiB does not fit
  // half of the 4 MiB default workspace): 16-bit logits, dW accumulated in 3 chunks of <= 128 rows.
  out.push_back({"compact default plan", {260, 64}, 8192, 0, sum, true, 7, false, 1.0});
  return out;
}

struct Outcome {
  Grads got, ref, base;
  std::vector<uint8_t> dh_bytes, dw_bytes, loss_bytes;
};

// The dtypes b takes (those of the forward, in the backward's test too).
std::vector<DType> dtypes_of(const BackendCase& b) {
  return dtypes_taken(kOp, Direction::kForward, b);
}

// One forward on backend b. accumulate: grad_weight is an fp32 buffer holding `acc0` first.
// grads false: no gradient is asked for (the loss and z-loss only, torch.no_grad's call).
Outcome run(const BackendCase& b, DType dtype, const Case& c, uint64_t seed, bool accumulate = false,
        double spread = 1.0, bool labels64 = true, int64_t chunk_override = -1, int64_t memory_budget = 0,
        bool grads = true) {
  const int64_t N = rows_of(c.hidden_shape).rows, H = c.hidden_shape.back(), V = c.V;
  const std::vector<int64_t> lead = lead_shape(c.hidden_shape);
  const DType od = fp32_or_f64(dtype);
  TestTensor hidden(dtype, c.hidden_shape, b.device), weight(dtype, {V, H}, b.device);
  const auto hv = hidden.fill_normal(seed, 0.0, spread);
  const auto wv = weight.fill_normal(seed + 1, 0.0, 1.0 / std::sqrt(static_cast<double>(H)));
  std::mt19937_64 gen(seed + 2);
  const std::vector<int64_t> y = draw_labels(gen, N, V, c.ignore_every, c.o.ignore_index);
  const TestTensor labels = labels_tensor(y, lead, labels64, b.device);
  TestTensor lw(DType::kFloat32, lead, b.device);
  std::vector<double> wv0(N);
  for (auto& v : wv0) v = 0.5 + static_cast<double>(gen() % 1000) / 1000.0;
  const auto wv_stored = lw.set(wv0);
  const int64_t B = c.hidden_shape.size() == 3 ? c.hidden_shape[0] : 1;
  TestTensor alpha(od, {B}, b.device);
  std::vector<double> av(B);
  for (int64_t i = 0; i < B; ++i) av[i] = 1.5 + i;
  const auto av_stored = alpha.set(av);
  std::vector<double> alpha_row(N, c.alpha);
  if (c.per_sample_alpha)
    for (int64_t i = 0; i < N; ++i) alpha_row[i] = av_stored[i / c.hidden_shape[1]];

  TestTensor loss(od, {}, b.device), z(od, {}, b.device), dh(dtype, c.hidden_shape, b.device);
  TestTensor dw(accumulate ? fp32_or_f64(dtype) : dtype, {V, H}, b.device);
  TestTensor dlw(od, lead, b.device);
  poison(loss, z, dh, dlw);
  std::vector<double> acc0;
  if (accumulate)
    acc0 = dw.fill_normal(seed + 3);
  else
    dw.fill_nan();

  ChunkLossFwdArgs a;
  a.hidden = hidden.view();
  a.weight = weight.view();
  a.labels = labels.view();
  a.loss_weight = c.weights ? lw.view() : TensorView();
  a.alpha = c.alpha;
  a.alpha_per_sample = c.per_sample_alpha ? alpha.view() : TensorView();
  a.loss = loss.view();
  a.z_loss = z.view();
  if (grads) {
    a.grad_hidden = dh.view();
    a.grad_weight = dw.view();
    a.accumulate_grad_weight = accumulate;
    a.grad_loss_weight = dlw.view();
  }
  a.chunk_size = chunk_override >= 0 ? chunk_override : c.chunk;
  a.memory_budget = memory_budget;
  a.options = c.o;
  const Context ctx = b.ctx();
  const Workspace ws = workspace(chunk_loss_workspace_size(ctx, a), b.device);
  a.workspace = ws.view();
  chunk_loss_fwd(ctx, a);

  Outcome r;
  r.got.loss = loss.to_double();
  r.got.z_loss = z.to_double();
  r.got.dh = dh.to_double();
  r.got.dw = dw.to_double();
  r.got.dlw = dlw.to_double();
  r.dh_bytes = dh.bytes();
  r.dw_bytes = dw.bytes();
  r.loss_bytes = loss.bytes();
  const std::vector<double>* w = c.weights ? &wv_stored : nullptr;
  r.ref = oracle(hv, wv, N, H, V, y, w, alpha_row, c.o, DType::kFloat64);
  r.base = oracle(hv, wv, N, H, V, y, w, alpha_row, c.o, dtype);
  if (accumulate) {
    for (size_t i = 0; i < acc0.size(); ++i) {
      r.ref.dw[i] += acc0[i];
      r.base.dw[i] += acc0[i];
    }
  }
  return r;
}

void expect_matches(const Outcome& r, DType dtype, const std::string& what, bool grads = true) {
  const std::pair<const char*, std::vector<double> Grads::*> fields[] = {
      {"loss", &Grads::loss}, {"z_loss", &Grads::z_loss}, {"grad_hidden", &Grads::dh},
      {"grad_weight", &Grads::dw}, {"grad_loss_weight", &Grads::dlw}};
  for (const auto& [name, field] : fields) {
    if (!grads && field != &Grads::loss && field != &Grads::z_loss) continue;
    expect_policy(what + " " + name, r.got.*field, r.base.*field, r.ref.*field, dtype);
  }
}

// body(amx_off_again) with the CPU's AMX product on (where the CPU has it) and then off: without
// gradients the bf16 CPU backend takes cpu::amx's logits blocks when on and oneDNN's when off, the
// path of CPUs without AMX. amx_off_again is true only for that second run on a CPU with AMX, where
// callers skip the backends it does not change (CUDA's).
template <class F>
void with_and_without_amx(F&& body) {
  const bool has_amx = cpu::amx::available();
  body(false);
  if (!has_amx) return;
  cpu::amx::set_enabled(false);
  body(true);
  cpu::amx::set_enabled(true);
}

TEST(ChunkLoss, MatchesLinearPlusCrossEntropyInFloat64OnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b)) {
      for (const auto& c : cases()) {
        if (dtype == DType::kFloat64 && c.V > 10000) continue;
        const std::string what = case_name(b.id, dtype, c.hidden_shape) + " V=" + std::to_string(c.V) + " " + c.name;
        SCOPED_TRACE(what);
        expect_matches(run(b, dtype, c, 100 + checked, false, 1.0, checked % 2 == 0), dtype, what);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// Without gradients the CPU backend computes the loss from blocks of the logits (1024 columns,
// 256 rows) merged per row; every case and dtype, and logits of magnitude ~1e4 in the cases
// LargeLogitsAndSoftcapStayFinite uses (1 and 3). In the one-row case such a loss is a difference
// of two ~1e4 logits whose fp32 base can be exact by chance while another product order differs
// by a part of the logits' ulp: CUDA measured 2.2e-5 there on an H100 (stop 47).
// On a CPU with AMX the bf16 blocks take the AMX product and the vocabulary-major statistics;
// the oneDNN path beside it (the path of CPUs without AMX) runs here too, with the kernel turned off.
TEST(ChunkLoss, LossWithoutGradientsMatchesTheOracle) {
  int checked = 0;
  const auto& all = cases();
  with_and_without_amx([&](bool amx_off_again) {
    for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
      if (amx_off_again && b.device.kind != DeviceKind::kCPU) continue;
      for (DType dtype : dtypes_of(b)) {
        for (size_t k = 0; k < all.size(); ++k) {
          const Case& c = all[k];
          if (dtype == DType::kFloat64 && c.V > 10000) continue;
          for (double spread : {1.0, 3000.0}) {
            if (spread > 1.0 && k != 1 && k != 3) continue;
            const std::string what = case_name(b.id, dtype, c.hidden_shape) + " V=" + std::to_string(c.V) +
                                     " " + c.name + " no gradient, spread " + std::to_string(spread) +
                                     (amx_off_again ? ", AMX off" : "");
            SCOPED_TRACE(what);
            const Outcome r = run(b, dtype, c, 300 + checked, false, spread, checked % 2 == 0, -1, 0, false);
            expect_matches(r, dtype, what, false);
            ++checked;
          }
        }
      }
    }
  });
  EXPECT_GT(checked, 0);
}

#ifdef _OPENMP
// The loss-only blocks are merged in block order, and the products and the cross-entropy with
// gradients split their outputs, not their sums: the same bits on one thread as on several.
TEST(ChunkLoss, LossAndGradientsDoNotDependOnTheThreadCount) {
  const int threads = omp_get_max_threads();
  with_and_without_amx([&](bool amx_off_again) {
    for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
      if (b.device.kind != DeviceKind::kCPU) continue;
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        for (int k : {2, 3, 4}) {
          for (bool grads : {false, true}) {
            if (grads && amx_off_again) continue;  // AMX serves no gradient product
            const Case c = cases()[k];
            SCOPED_TRACE(b.id + "/" + dtype_name(dtype) + " " + c.name + (grads ? " with" : " without") +
                         " gradients" + (amx_off_again ? ", AMX off" : ""));
            omp_set_num_threads(1);
            const Outcome one = run(b, dtype, c, 41, false, 1.0, true, -1, 0, grads);
            omp_set_num_threads(std::max(threads, 2));
            const Outcome many = run(b, dtype, c, 41, false, 1.0, true, -1, 0, grads);
            omp_set_num_threads(threads);
            EXPECT_EQ(one.loss_bytes, many.loss_bytes);
            EXPECT_EQ(one.dh_bytes, many.dh_bytes);
            EXPECT_EQ(one.dw_bytes, many.dw_bytes);
          }
        }
      }
    }
  });
}
#endif

TEST(ChunkLoss, AccumulatesIntoAnFp32WeightGradientBuffer) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      const Case c = cases()[1];
      const std::string what = b.id + "/" + dtype_name(dtype) + " accumulate";
      SCOPED_TRACE(what);
      expect_matches(run(b, dtype, c, 7, true), dtype, what);
    }
  }
}

TEST(ChunkLoss, LargeLogitsAndSoftcapStayFinite) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : dtypes_of(b)) {
      for (int k : {1, 3}) {
        const Case c = cases()[k];
        const std::string what = b.id + "/" + dtype_name(dtype) + " large logits " + c.name;
        SCOPED_TRACE(what);
        // hidden ~ N(0, 3000^2) and weight ~ N(0, 1/H): logits of magnitude ~1e4.
        const Outcome r = run(b, dtype, c, 11 + k, false, 3000.0);
        ASSERT_TRUE(std::isfinite(r.got.loss[0])) << r.got.loss[0];
        for (double v : r.got.dh) ASSERT_TRUE(std::isfinite(v));
        for (double v : r.got.dw) ASSERT_TRUE(std::isfinite(v));
        expect_matches(r, dtype, what);
      }
    }
  }
}

TEST(ChunkLoss, ChunkSizeChangesOnlyRoundingAndRepeatedRunsAreBitwiseIdentical) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      const Case c = cases()[2];
      SCOPED_TRACE(b.id + "/" + dtype_name(dtype));
      const Outcome a = run(b, dtype, c, 21);
      const Outcome again = run(b, dtype, c, 21);
      EXPECT_EQ(a.loss_bytes, again.loss_bytes);
      EXPECT_EQ(a.dh_bytes, again.dh_bytes);
      EXPECT_EQ(a.dw_bytes, again.dw_bytes);
      for (int64_t chunk : {0, 1, 64, 1000}) {
        const Outcome other = run(b, dtype, c, 21, false, 1.0, true, chunk);
        expect_matches(other, dtype, b.id + " chunk " + std::to_string(chunk));
      }
    }
  }
}

// The CUDA chunk layout (ce::chunk_layout): with 16-bit operands the budget goes to the 16-bit
// gradient chunk first and the fp32 logits come in sub-chunks of it.
TEST(ChunkLoss, CudaLayoutSplitsTheBudgetBetweenGradientChunkAndLogitsSubChunks) {
  const int64_t N = 8192, V = 128256, H = 4096, ld = 128256;
  const int64_t gib = int64_t(1) << 30;
  // main_grad form at 1 GiB: 3 chunks of 2752 rows, logits in 4 sub-chunks of 704 rows.
  ce::ChunkLayout l = ce::chunk_layout(N, V, H, DType::kBFloat16, true, false, 0, gib, 0);
  EXPECT_EQ(l.chunk, 2752);
  EXPECT_EQ(l.sub, 704);
  EXPECT_LE(l.chunk * ld * 2 + l.sub * ld * 4, gib);
  EXPECT_EQ(l.g - l.z, static_cast<size_t>(ce::align_up(static_cast<size_t>(l.sub * ld * 4), 256)));
  // A budget of 2 GiB (the default before issue 39) with an fp32 accumulator of its own: 2 chunks
  // of 4096, sub-chunks of 2048.
  l = ce::chunk_layout(N, V, H, DType::kBFloat16, true, true, 0, 2 * gib, 0);
  EXPECT_EQ(l.chunk, 4096);
  EXPECT_EQ(l.sub, 2048);
  EXPECT_EQ(l.total - l.dw, static_cast<size_t>(V * H * 4));
  // fp32 operands (the gradient overwrites the logits) and forward-only calls: one level.
  for (const auto& [dt, grad] : {std::pair{DType::kFloat32, true}, std::pair{DType::kBFloat16, false}}) {
    l = ce::chunk_layout(N, V, H, dt, grad, false, 0, gib, 0);
    EXPECT_FALSE(l.separate_g);
    EXPECT_EQ(l.chunk, l.sub);
    EXPECT_LE(l.chunk * ld * 4, gib);
  }
  // chunk_size given: that chunk; sub-chunks only when a budget is given too; tiny budgets: 1 row.
  l = ce::chunk_layout(70, 1003, 24, DType::kFloat16, true, false, 16, 0, 0);
  EXPECT_EQ(l.chunk, 16);
  EXPECT_EQ(l.sub, 16);
  l = ce::chunk_layout(70, 1003, 24, DType::kFloat16, true, false, 16, 16 * 1008 * 2 + 5 * 1008 * 4, 0);
  EXPECT_EQ(l.chunk, 16);
  EXPECT_EQ(l.sub, 4);
  l = ce::chunk_layout(70, 1003, 24, DType::kBFloat16, true, false, 0, 1, 0);
  EXPECT_EQ(l.chunk, 1);
  EXPECT_EQ(l.sub, 1);
}

// Issue 39: the default call that returns a bf16 weight gradient, at N=8192 H=4096 V=128256,
// peaked at 5.35 GB on the H200 (an fp32 [V, H] accumulator and 2 GiB of chunks), Liger-Kernel's
// LigerFusedLinearCrossEntropyLoss at 1.18 GB: its bf16 weight and input gradients and one bf16
// logits chunk of next_pow2(ceil(N / ceil(V / H))) = 256 rows. The default plan's workspace plus
// the same two gradients must not exceed that, from the shapes alone, with GEMM-sized chunks.
TEST(ChunkLoss, DefaultPlanOfA16BitWeightGradientFitsLigersMemory) {
  const size_t gemm = size_t(32) << 20;  // cuda::gemm_workspace_bytes()
  struct Shape {
    int64_t N, H, V;
  };
  for (const Shape& s : {Shape{8192, 4096, 128256}, Shape{16384, 8192, 151936}, Shape{4096, 2048, 32000},
                         Shape{65536, 4096, 128256}}) {
    SCOPED_TRACE(std::to_string(s.N) + "x" + std::to_string(s.H) + " V " + std::to_string(s.V));
    int64_t inc = (s.V + s.H - 1) / s.H, want = (s.N + inc - 1) / inc, liger_rows = 1;
    while (liger_rows < want) liger_rows *= 2;
    liger_rows = std::min(liger_rows, s.N);
    const int64_t liger = (s.V * s.H + s.N * s.H + liger_rows * s.V) * 2;
    const ce::ChunkLayout l = ce::chunk_layout(s.N, s.V, s.H, DType::kBFloat16, true, true, 0, 0, gemm);
    const int64_t ours = (s.V * s.H + s.N * s.H) * 2 + static_cast<int64_t>(l.total);
    EXPECT_LE(ours, liger) << "workspace " << l.total << " bytes, " << l.chunk << " rows per chunk";
    EXPECT_TRUE(l.compact);
    EXPECT_FALSE(l.own_dw);
    EXPECT_GE(l.chunk, std::min<int64_t>(s.N, 128)) << "chunks too small for the GEMMs";
    EXPECT_LE(l.chunk * l.ld * 2, static_cast<int64_t>(l.total - l.g));
  }
  const ce::ChunkLayout at = ce::chunk_layout(8192, 128256, 4096, DType::kBFloat16, true, true, 0, 0, gemm);
  EXPECT_EQ(at.chunk, 192);
  EXPECT_LE(at.gemm_bytes, size_t(8) << 20);
  EXPECT_GE(at.gemm_bytes, size_t(7) << 20);
  // A small problem keeps the fp32 accumulator (it fits the least default workspace, 4 MiB).
  const ce::ChunkLayout small = ce::chunk_layout(512, 1000, 256, DType::kBFloat16, true, true, 0, 0, gemm);
  EXPECT_FALSE(small.compact);
  EXPECT_TRUE(small.own_dw);
  EXPECT_LE(small.total, static_cast<size_t>(ce::kMinDefaultWorkspace));
  // memory_budget overrides the default: the fp32 accumulator, chunks within the budget.
  const ce::ChunkLayout given = ce::chunk_layout(8192, 128256, 4096, DType::kBFloat16, true, true, 0,
                                                 int64_t(1) << 30, gemm);
  EXPECT_FALSE(given.compact);
  EXPECT_TRUE(given.own_dw);
  // A caller's fp32 weight gradient (grad_weight_buffer) keeps the 2 GiB default.
  const ce::ChunkLayout buffer = ce::chunk_layout(8192, 128256, 4096, DType::kBFloat16, true, false, 0, 0, gemm);
  EXPECT_FALSE(buffer.compact);
  EXPECT_EQ(buffer.chunk * buffer.ld * 2 + buffer.sub * buffer.ld * 4 <= ce::kChunkBudgetCuda, true);
  EXPECT_GT(buffer.chunk, 2000);
}

// CPU chunks: fp32 logits (4 bytes per logit) plus, with bf16 operands and a gradient wanted, the
// bf16 copy of the gradient (2 more), all within memory_budget.
TEST(ChunkLoss, CpuChunkRowsCountEveryBufferAgainstTheBudget) {
  const int64_t N = 4096, H = 64, V = 1000, budget = 128 * V * 6;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (bool grad : {false, true}) {
      TestTensor hidden(dt, {N, H}), weight(dt, {V, H}), dh(dt, {N, H});
      ChunkLossFwdArgs a;
      a.hidden = hidden.view();
      a.weight = weight.view();
      a.grad_hidden = grad ? dh.view() : TensorView();
      a.memory_budget = budget;
      const int64_t per_row = V * (dt == DType::kBFloat16 && grad ? 6 : 4);
      EXPECT_EQ(chunk_loss_chunk_rows(Context::cpu(), a), budget / per_row / 64 * 64)
          << dtype_name(dt) << (grad ? " with" : " without") << " gradient";
    }
  }
}

// The sub-chunked path against the oracle, on every backend (the CPU backends have one level and
// ignore the split; CUDA with 16-bit operands computes the logits 4 rows at a time).
TEST(ChunkLoss, LogitsSubChunksMatchTheOracle) {
  for (const auto& b : runnable_backends(kOp, Direction::kForward)) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      if (!backend_takes(kOp, Direction::kForward, b.id, dtype)) continue;
      const Case c = cases()[2];  // 70 rows, V = 1003 (ld 1008), chunks of 16
      for (bool accumulate : {false, true}) {
        const std::string what = b.id + "/" + dtype_name(dtype) + (accumulate ? " accumulate" : "");
        SCOPED_TRACE(what);
        expect_matches(run(b, dtype, c, 31, accumulate, 1.0, true, 16, 16 * 1008 * 2 + 5 * 1008 * 4),
                       dtype, what + " sub-chunks of 4");
      }
    }
  }
}

TEST(ChunkLoss, BackwardRescalesTheSavedGradients) {
  for (const auto& b : runnable_backends(kOp, Direction::kBackward)) {
    for (DType dtype : dtypes_of(b)) {
      for (double gval : {1.0, -0.75}) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(b.id + "/" + dtype_name(dtype) + " g " + std::to_string(gval) + (in_place ? " in place" : ""));
          const DType od = fp32_or_f64(dtype);
          TestTensor g(od, {}, b.device), sh(dtype, {3, 5, 24}, b.device), sw(dtype, {41, 24}, b.device);
          TestTensor slw(od, {3, 5}, b.device), oh(dtype, {3, 5, 24}, b.device), ow(dtype, {41, 24}, b.device);
          TestTensor olw(od, {3, 5}, b.device);
          const auto gv = g.set({gval});
          const auto shv = sh.fill_normal(1), swv = sw.fill_normal(2), slwv = slw.fill_normal(3);
          poison(oh, ow, olw);
          ChunkLossBwdArgs a{g.view(), sh.view(), in_place ? sh.view() : oh.view(), sw.view(),
                             in_place ? sw.view() : ow.view(), slw.view(), in_place ? slw.view() : olw.view()};
          chunk_loss_bwd(b.ctx(), a);
          expect_rescaled("grad_hidden", (in_place ? sh : oh).to_double(), shv, gv, 1, dtype);
          expect_rescaled("grad_weight", (in_place ? sw : ow).to_double(), swv, gv, 1, dtype);
          expect_rescaled("grad_loss_weight", (in_place ? slw : olw).to_double(), slwv, gv, 1, od);
        }
      }
    }
  }
}

TEST(ChunkLoss, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  TestTensor h(DType::kFloat32, {6, 8}), w(DType::kFloat32, {11, 8}), w9(DType::kFloat32, {11, 9});
  TestTensor labels(DType::kInt64, {6}), labels5(DType::kInt64, {5}), loss(DType::kFloat32, {});
  TestTensor bias(DType::kFloat32, {11}), dw16(DType::kBFloat16, {11, 8}), alpha(DType::kFloat32, {4});
  TestTensor h3(DType::kFloat32, {2, 3, 8}), labels3(DType::kInt64, {2, 3});
  auto args = [&]() {
    ChunkLossFwdArgs a;
    a.hidden = h.view();
    a.weight = w.view();
    a.labels = labels.view();
    a.loss = loss.view();
    return a;
  };
  auto expect = [&](const ChunkLossFwdArgs& a, ErrorKind kind, const std::string& text) {
    expect_error([&] { chunk_loss_fwd(ctx, a); }, kind, text);
  };
  auto a = args();
  a.bias = bias.view();
  expect(a, ErrorKind::kValue, "chunk_loss: a bias is not supported");
  a = args();
  a.options.reduction = LossReduction::kNone;
  expect(a, ErrorKind::kValue, "reduction 'none' is not supported");
  a = args();
  a.weight = w9.view();
  expect(a, ErrorKind::kValue, "weight must have shape [V, H] with V >= 1 and H = 8 (hidden's last dimension), got [11,9]");
  a = args();
  a.labels = labels5.view();
  expect(a, ErrorKind::kValue, "labels must have shape [6] (hidden's shape without its last dimension), got [5]");
  a = args();
  a.chunk_size = -1;
  expect(a, ErrorKind::kValue, "chunk_size must be > 0 (or 0 to choose it from memory_budget), got -1");
  a = args();
  a.alpha = 0;
  expect(a, ErrorKind::kValue, "alpha must be a finite nonzero number, got 0");
  a = args();
  a.alpha_per_sample = alpha.view();
  expect(a, ErrorKind::kValue, "alpha must be a scalar or have shape [B] for hidden [B, S, H], got alpha [4] with hidden [6,8]");
  a = args();
  a.hidden = h3.view();
  a.labels = labels3.view();
  a.alpha_per_sample = alpha.view();
  expect(a, ErrorKind::kValue, "alpha must be a scalar or have shape [B] for hidden [B, S, H] (B = 2), got alpha [4]");
  a = args();
  a.grad_weight = dw16.view();
  a.accumulate_grad_weight = true;
  expect(a, ErrorKind::kType, "grad_weight (accumulated) must have dtype in {float32, float64}, got bfloat16");
  a = args();
  a.grad_weight = dw16.view();
  expect(a, ErrorKind::kType, "grad_weight must have the dtype of weight (float32), got bfloat16");
  a = args();
  a.options.logit_softcapping = -2.0;
  expect(a, ErrorKind::kValue, "logit_softcapping must be a finite number > 0 (or None), got -2");
  TestTensor hi(DType::kInt32, {6, 8});
  a = args();
  a.hidden = hi.view();
  expect(a, ErrorKind::kType, "hidden must have dtype in {float32, bfloat16, float16, float64}, got int32");
}

}  // namespace
}  // namespace fusedops::testing
