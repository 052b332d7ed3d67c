// chunk_loss, generic CUDA backend (sm_80 and later). Per chunk of C rows, all on the caller's
// stream with no host synchronization (CUDA-graph capturable; every buffer is in the caller's
// workspace, see ce::chunk_layout):
//   Z   = H_s W^T            cuBLASLt, bf16/fp16/fp32 operands, fp32 output [S, ld], for each
//                            sub-chunk of S rows of the chunk (S = C unless the budget splits it)
//   G_s = CE gradient of Z    the cross-entropy row pass (fp32 in, operand dtype out)
//   dH_c = G W               cuBLASLt, output in hidden's dtype
//   dW  += G^T H_c           cuBLASLt, fp32 output, beta = 1 after the first chunk
// The compact plan (ce::ChunkLayout::compact, the default for a 16-bit weight gradient when an
// fp32 accumulator does not fit Liger-Kernel's memory) computes Z in the operand dtype, replaces
// it by G in place, and accumulates dW in the caller's 16-bit tensor (fp32 math, one rounding per
// chunk).
// The per-row scales (loss weights, the "mean" count, alpha) are computed once for the whole
// batch before the first chunk, and the loss is reduced once after the last.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/chunk_loss.h"
#include "src/cuda/check.cuh"
#include "src/cuda/gemm.h"
#include "src/ops/cross_entropy/ce_common.h"
#include "src/ops/cross_entropy/ce_cuda.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "chunk_loss";

bool supports_fwd(const ChunkLossFwdArgs& a) {
  return a.loss.dtype() == DType::kFloat32 &&
         (!a.grad_loss_weight.defined() || a.grad_loss_weight.dtype() == DType::kFloat32) &&
         (!a.alpha_per_sample.defined() || a.alpha_per_sample.dtype() == DType::kFloat32) &&
         (!a.loss_weight.defined() || a.loss_weight.dtype() != DType::kFloat64) &&
         (!a.grad_weight.defined() || a.grad_weight.dtype() != DType::kFloat64);
}

bool supports_bwd(const ChunkLossBwdArgs& a) {
  return a.grad_loss.dtype() == DType::kFloat32 &&
         (!a.saved_grad_loss_weight.defined() ||
          (a.saved_grad_loss_weight.dtype() == DType::kFloat32 &&
           a.grad_loss_weight.dtype() != DType::kFloat64));
}

void fwd(const Context& ctx, const ChunkLossFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  void* stream = ctx.stream;
  const int device = ctx.device.index;
  const CrossEntropyOptions& o = a.options;
  const int64_t N = a.hidden.rows(), H = a.hidden.size(-1), V = a.weight.size(0);
  const DType dt = a.hidden.dtype();
  const size_t es = dtype_size(dt);
  const int int64 = a.labels.dtype() == DType::kInt64;
  const bool want_grad = a.grad_hidden.defined() || a.grad_weight.defined();
  const bool own_dw = a.grad_weight.defined() && a.grad_weight.dtype() != DType::kFloat32;
  const ce::ChunkLayout l = ce::chunk_layout(N, V, H, dt, want_grad, own_dw, a.chunk_size,
                                             a.memory_budget, cuda::gemm_workspace_bytes());
  const size_t gemm_bytes = l.gemm_bytes;
  uint8_t* ws = a.workspace.data_as<uint8_t>();
  void* gemm_ws = ws + l.gemm;
  float* row_scale = reinterpret_cast<float*>(ws + l.rows.row_scale);
  float* row_norm = reinterpret_cast<float*>(ws + l.rows.row_norm);
  float* row_loss = reinterpret_cast<float*>(ws + l.rows.row_loss);
  float* row_z = reinterpret_cast<float*>(ws + l.rows.row_z);
  float* z = reinterpret_cast<float*>(ws + l.z);
  void* g = l.separate_g || l.compact ? static_cast<void*>(ws + l.g) : static_cast<void*>(z);
  // The weight gradient's accumulator: ours (fp32), the caller's fp32 tensor, or (compact) the
  // caller's 16-bit tensor itself.
  void* dw = !a.grad_weight.defined() ? nullptr
             : l.own_dw               ? static_cast<void*>(ws + l.dw)
                                      : a.grad_weight.data();
  const DType dw_type = l.compact ? a.grad_weight.dtype() : DType::kFloat32;

  cuda::ce::ScaleParams sp{};
  sp.labels = a.labels.data();
  sp.labels_int64 = int64;
  sp.loss_weight = a.loss_weight.defined() ? a.loss_weight.data() : nullptr;
  sp.loss_weight_type = a.loss_weight.defined() ? cuda::ce::value_type(a.loss_weight.dtype()) : cuda::ce::kNoValue;
  sp.alpha_per_sample = a.alpha_per_sample.defined() ? a.alpha_per_sample.data_as<const float>() : nullptr;
  sp.rows_per_sample = a.alpha_per_sample.defined() ? a.hidden.size(1) : 1;
  sp.alpha = a.alpha;
  sp.rows = N;
  sp.ignore_index = o.ignore_index;
  sp.vocab = V;
  cuda::ce::set_label_report(kOp, sp);
  sp.mean = o.reduction == LossReduction::kMean;
  sp.row_scale = row_scale;
  sp.row_norm = row_norm;
  cuda::ce::row_scales(kOp, sp, stream);

  cuda::ce::RowParams rp{};
  rp.x = l.compact ? static_cast<const void*>(g) : static_cast<const void*>(z);
  rp.x_stride = l.ld;
  rp.g_stride = l.ld;
  rp.labels_int64 = int64;
  rp.vocab = V;
  rp.ignore_index = o.ignore_index;
  rp.scale = static_cast<float>(o.logit_scale);
  rp.cap = o.logit_softcapping ? static_cast<float>(*o.logit_softcapping) : 0.0f;
  rp.inv_cap = o.logit_softcapping ? 1.0f / rp.cap : 0.0f;
  rp.eps = static_cast<float>(o.label_smoothing);
  rp.inv_vocab = 1.0f / static_cast<float>(V);
  rp.lambda = static_cast<float>(o.lse_square_scale);

  const int64_t ldh = a.hidden.row_stride();
  const uint8_t* hidden = static_cast<const uint8_t*>(a.hidden.data());
  const uint8_t* labels = static_cast<const uint8_t*>(a.labels.data());
  bool dw_started = a.accumulate_grad_weight;
  for (int64_t r0 = 0; r0 < N; r0 += l.chunk) {
    const int64_t rows = std::min(l.chunk, N - r0);
    const void* hc = hidden + r0 * ldh * es;

    // Logits and their gradient, a sub-chunk at a time (into G's rows s0.. of this chunk).
    for (int64_t s0 = 0; s0 < rows; s0 += l.sub) {
      const int64_t srows = std::min(l.sub, rows - s0);
      cuda::GemmArgs logits;
      logits.trans_b = true;
      logits.M = srows, logits.N = V, logits.K = H;
      logits.ab_type = dt, logits.c_type = l.compact ? dt : DType::kFloat32;
      logits.A = hidden + (r0 + s0) * ldh * es, logits.lda = ldh;
      logits.B = a.weight.data(), logits.ldb = H;
      logits.C = l.compact ? g : static_cast<void*>(z), logits.ldc = l.ld;
      cuda::gemm(kOp, logits, gemm_ws, gemm_bytes, stream, device);

      rp.labels = labels + (r0 + s0) * (int64 ? 8 : 4);
      rp.row_scale = row_scale + r0 + s0;
      rp.row_loss = row_loss + r0 + s0;
      rp.row_z = row_z + r0 + s0;
      rp.rows = srows;
      rp.g = want_grad ? static_cast<uint8_t*>(g) + s0 * l.ld * (l.separate_g || l.compact ? es : 4) : nullptr;
      cuda::ce::rows(kOp, rp, l.compact ? dt : DType::kFloat32, want_grad ? dt : DType::kFloat32,
                     device, stream);
    }

    if (a.grad_hidden.defined()) {
      cuda::GemmArgs dh;
      dh.M = rows, dh.N = H, dh.K = V;
      dh.ab_type = dt, dh.c_type = dt;
      dh.A = g, dh.lda = l.ld;
      dh.B = a.weight.data(), dh.ldb = H;
      dh.C = static_cast<uint8_t*>(a.grad_hidden.data()) + r0 * H * es, dh.ldc = H;
      cuda::gemm(kOp, dh, gemm_ws, gemm_bytes, stream, device);
    }
    if (dw) {
      cuda::GemmArgs gw;
      gw.trans_a = true;
      gw.M = V, gw.N = H, gw.K = rows;
      gw.ab_type = dt, gw.c_type = dw_type;
      gw.beta = dw_started ? 1.0f : 0.0f;
      gw.A = g, gw.lda = l.ld;
      gw.B = hc, gw.ldb = ldh;
      gw.C = dw, gw.ldc = H;
      cuda::gemm(kOp, gw, gemm_ws, gemm_bytes, stream, device);
      dw_started = true;
    }
  }
  if (dw && !dw_started)  // no rows: the overwritten weight gradient is zero
    FUSEDOPS_CUDA_CHECK(kOp, cudaMemsetAsync(dw, 0, static_cast<size_t>(V) * H * dtype_size(dw_type),
                                             static_cast<cudaStream_t>(stream)));
  if (l.own_dw)
    cuda::ce::convert(kOp, static_cast<const float*>(dw), a.grad_weight.data(), a.grad_weight.dtype(),
                      V * H, stream);

  cuda::ce::FinalizeParams fp{};
  fp.row_scale = row_scale;
  fp.row_norm = row_norm;
  fp.row_loss = row_loss;
  fp.row_z = a.z_loss.defined() ? row_z : nullptr;
  fp.rows = N;
  fp.per_row = 0;
  fp.loss = a.loss.data_as<float>();
  fp.z_loss = a.z_loss.defined() ? a.z_loss.data_as<float>() : nullptr;
  fp.grad_loss_weight = a.grad_loss_weight.defined() ? a.grad_loss_weight.data_as<float>() : nullptr;
  cuda::ce::finalize(kOp, fp, stream);
}

void scale_pair(const TensorView& saved, const TensorView& out, const float* g, void* stream) {
  if (!saved.defined() || saved.numel() == 0) return;
  cuda::ce::ScaleRowsParams p{};
  p.in = saved.data();
  p.out = out.data();
  p.rows = saved.ndim() >= 2 ? saved.rows() : 1;
  p.cols = saved.ndim() >= 1 ? saved.size(-1) : 1;
  p.g = g;
  p.per_row = 0;
  cuda::ce::scale_rows(kOp, p, saved.dtype(), stream);
}

void bwd(const Context& ctx, const ChunkLossBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  const float* g = a.grad_loss.data_as<const float>();
  scale_pair(a.saved_grad_hidden, a.grad_hidden, g, ctx.stream);
  scale_pair(a.saved_grad_weight, a.grad_weight, g, ctx.stream);
  if (a.saved_grad_loss_weight.defined())
    cuda::ce::scale_values(kOp, a.saved_grad_loss_weight.data_as<const float>(), a.grad_loss_weight.data(),
                           cuda::ce::value_type(a.grad_loss_weight.dtype()),
                           a.saved_grad_loss_weight.numel(), g, 0, ctx.stream);
}

}  // namespace

void register_chunk_loss_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<ChunkLossFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<ChunkLossBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
