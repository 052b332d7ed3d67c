// chunk_loss: argument checks, chunk size and workspace queries, then dispatch.
#include <cmath>
#include <cstring>
#include <vector>
#include <string>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/chunk_loss.h"
#include "src/ops/cross_entropy/ce_common.h"

#ifdef FUSEDOPS_WITH_CUDA
#include "src/cuda/gemm.h"
#endif

namespace fusedops {
namespace {

constexpr const char* kOp = "chunk_loss";

size_t gemm_workspace() {
#ifdef FUSEDOPS_WITH_CUDA
  return cuda::gemm_workspace_bytes();
#else
  return 0;
#endif
}

bool needs_logits_grad(const ChunkLossFwdArgs& a) { return a.grad_hidden.defined() || a.grad_weight.defined(); }

bool owns_dw(const ChunkLossFwdArgs& a) {
  return a.grad_weight.defined() && a.grad_weight.dtype() != DType::kFloat32;
}

ce::ChunkLayout layout_of(const ChunkLossFwdArgs& a) {
  const int64_t V = a.weight.ndim() == 2 ? a.weight.size(0) : 0;
  const int64_t H = a.hidden.ndim() >= 1 ? a.hidden.size(-1) : 0;
  return ce::chunk_layout(a.hidden.rows(), V, H, a.hidden.dtype(), needs_logits_grad(a), owns_dw(a),
                          a.chunk_size, a.memory_budget, gemm_workspace());
}

// Debug checks: every per-sample alpha finite and nonzero (else its rows' losses are inf/NaN).
void check_alpha_values(const Context& ctx, const TensorView& alpha) {
  const std::vector<uint8_t> bytes = read_tensor_bytes(kOp, ctx, alpha);
  const int64_t n = alpha.numel(), stride = n > 1 ? alpha.stride(0) : 0;
  for (int64_t i = 0; i < n; ++i) {
    double a;
    if (alpha.dtype() == DType::kFloat64) {
      std::memcpy(&a, bytes.data() + i * stride * 8, 8);
    } else {
      float f;
      std::memcpy(&f, bytes.data() + i * stride * 4, 4);
      a = f;
    }
    FUSEDOPS_REQUIRE(std::isfinite(a) && a != 0, kValue, kOp, "alpha[", i,
                     "] must be a finite nonzero number, got ", a);
  }
}

void check_fwd(const Context& ctx, const ChunkLossFwdArgs& a) {
  ArgCheck c(kOp);
  ce::check_options(kOp, a.options);
  c.value(a.options.reduction != LossReduction::kNone,
          "reduction 'none' is not supported: the weight gradient, summed over the rows in the "
          "forward, cannot be rescaled per row afterwards; use 'sum' or 'mean'");
  c.value(!a.bias.defined(),
          "a bias is not supported (as in MindSpeed's chunk loss, head_bias must be None); add "
          "it to the logits outside or fold it into the weight");
  c.min_rank(a.hidden, "hidden", 2).floating(a.hidden, "hidden").on_device(a.hidden, "hidden", ctx)
      .rows_addressable(a.hidden, "hidden");
  const int64_t N = a.hidden.rows(), H = a.hidden.size(-1);
  c.value(H >= 1, "hidden must have a hidden dimension of size >= 1, got shape " + a.hidden.shape_string());
  c.rank(a.weight, "weight", 2).same_dtype(a.weight, "weight", a.hidden, "hidden")
      .on_device(a.weight, "weight", ctx);
  c.value(a.weight.size(1) == H && a.weight.size(0) >= 1,
          "weight must have shape [V, H] with V >= 1 and H = " + std::to_string(H) +
              " (hidden's last dimension), got " + a.weight.shape_string());
  ce::check_dense(c, a.weight, "weight");
  const int64_t V = a.weight.size(0);
  c.leading_shape(a.labels, "labels", a.hidden, "hidden")
      .dtype_in(a.labels, "labels", {DType::kInt32, DType::kInt64})
      .on_device(a.labels, "labels", ctx);
  ce::check_dense(c, a.labels, "labels");
  if (a.loss_weight.defined()) {
    c.same_shape(a.loss_weight, "loss_weight", a.labels, "labels").floating(a.loss_weight, "loss_weight")
        .on_device(a.loss_weight, "loss_weight", ctx);
    ce::check_dense(c, a.loss_weight, "loss_weight");
  }
  c.value(std::isfinite(a.alpha) && a.alpha != 0,
          "alpha must be a finite nonzero number, got " + std::to_string(a.alpha));
  if (a.alpha_per_sample.defined()) {
    c.dtype_in(a.alpha_per_sample, "alpha", {DType::kFloat32, DType::kFloat64})
        .on_device(a.alpha_per_sample, "alpha", ctx);
    c.value(a.hidden.ndim() == 3 && a.alpha_per_sample.ndim() == 1 &&
                a.alpha_per_sample.size(0) == a.hidden.size(0),
            "alpha must be a scalar or have shape [B] for hidden [B, S, H]" +
                std::string(a.hidden.ndim() == 3 ? " (B = " + std::to_string(a.hidden.size(0)) + ")" : "") +
                ", got alpha " + a.alpha_per_sample.shape_string() + " with hidden " +
                a.hidden.shape_string());
    ce::check_dense(c, a.alpha_per_sample, "alpha");
  }
  c.defined(a.loss, "loss").dtype_in(a.loss, "loss", {DType::kFloat32, DType::kFloat64})
      .on_device(a.loss, "loss", ctx).shape(a.loss, "loss", {}, "a scalar");
  if (a.z_loss.defined())
    c.same_shape(a.z_loss, "z_loss", a.loss, "loss").same_dtype(a.z_loss, "z_loss", a.loss, "loss")
        .on_device(a.z_loss, "z_loss", ctx);
  if (a.grad_hidden.defined()) {
    c.same_shape(a.grad_hidden, "grad_hidden", a.hidden, "hidden")
        .same_dtype(a.grad_hidden, "grad_hidden", a.hidden, "hidden")
        .on_device(a.grad_hidden, "grad_hidden", ctx);
    ce::check_dense(c, a.grad_hidden, "grad_hidden");
  }
  if (a.grad_weight.defined()) {
    c.same_shape(a.grad_weight, "grad_weight", a.weight, "weight").on_device(a.grad_weight, "grad_weight", ctx);
    if (a.accumulate_grad_weight) {
      c.dtype_in(a.grad_weight, "grad_weight (accumulated)", {DType::kFloat32, DType::kFloat64});
      c.value(a.grad_weight.dtype() == DType::kFloat32 || a.weight.dtype() == DType::kFloat64,
              "an accumulated grad_weight must be float32");
    } else {
      c.same_dtype(a.grad_weight, "grad_weight", a.weight, "weight");
    }
    ce::check_dense(c, a.grad_weight, "grad_weight");
  } else {
    c.value(!a.accumulate_grad_weight, "accumulate_grad_weight is set but grad_weight is not given");
  }
  if (a.grad_loss_weight.defined()) {
    c.same_shape(a.grad_loss_weight, "grad_loss_weight", a.labels, "labels")
        .dtype_in(a.grad_loss_weight, "grad_loss_weight", {DType::kFloat32, DType::kFloat64})
        .on_device(a.grad_loss_weight, "grad_loss_weight", ctx);
    ce::check_dense(c, a.grad_loss_weight, "grad_loss_weight");
  }
  c.value(a.chunk_size >= 0, "chunk_size must be > 0 (or 0 to choose it from memory_budget), got " +
                                 std::to_string(a.chunk_size));
  c.value(a.memory_budget >= 0, "memory_budget must be >= 0 bytes (0 = the default), got " +
                                    std::to_string(a.memory_budget));
  (void)N;
  (void)V;
  c.workspace(a.workspace, ctx, static_cast<int64_t>(chunk_loss_workspace_size(ctx, a)),
              "chunk_loss_workspace_size", 256);
}

void check_pair(const ArgCheck& c, const Context& ctx, const TensorView& saved, const char* saved_name,
                const TensorView& out, const char* out_name, bool any_float_out) {
  if (!saved.defined()) {
    c.value(!out.defined(), std::string(out_name) + " is given without " + saved_name);
    return;
  }
  c.floating(saved, saved_name).on_device(saved, saved_name, ctx);
  ce::check_dense(c, saved, saved_name);
  c.same_shape(out, out_name, saved, saved_name).on_device(out, out_name, ctx);
  if (any_float_out)
    c.floating(out, out_name);
  else
    c.same_dtype(out, out_name, saved, saved_name);
  ce::check_dense(c, out, out_name);
  ce::check_in_place_or_apart(c, out, out_name, saved, saved_name);
}

void check_bwd(const Context& ctx, const ChunkLossBwdArgs& a) {
  ArgCheck c(kOp);
  c.defined(a.grad_loss, "grad_loss").dtype_in(a.grad_loss, "grad_loss", {DType::kFloat32, DType::kFloat64})
      .on_device(a.grad_loss, "grad_loss", ctx);
  c.value(a.grad_loss.numel() == 1, "grad_loss must be a scalar, got shape " + a.grad_loss.shape_string());
  check_pair(c, ctx, a.saved_grad_hidden, "saved_grad_hidden", a.grad_hidden, "grad_hidden", false);
  check_pair(c, ctx, a.saved_grad_weight, "saved_grad_weight", a.grad_weight, "grad_weight", false);
  check_pair(c, ctx, a.saved_grad_loss_weight, "saved_grad_loss_weight", a.grad_loss_weight,
             "grad_loss_weight", true);
  if (a.saved_grad_loss_weight.defined())
    c.dtype_in(a.saved_grad_loss_weight, "saved_grad_loss_weight", {DType::kFloat32, DType::kFloat64});
}

}  // namespace

int64_t chunk_loss_chunk_rows(const Context& ctx, const ChunkLossFwdArgs& args) {
  if (ctx.device.kind == DeviceKind::kCUDA) return layout_of(args).chunk;
  const int64_t V = args.weight.ndim() == 2 ? args.weight.size(0) : 0;
  // fp32 logits (the gradient overwrites them), plus a bf16 copy of the gradient for the bf16
  // GEMMs when the operands are bf16 (counted even where the CPU has no bf16 GEMM and the copy
  // is not made: the budget stays an upper bound).
  const bool bf16_grad = args.hidden.dtype() == DType::kBFloat16 && needs_logits_grad(args);
  return ce::chunk_rows(args.hidden.rows(), args.chunk_size,
                        args.memory_budget > 0 ? args.memory_budget : ce::kChunkBudgetCpu,
                        V * (bf16_grad ? 6 : 4));
}

size_t chunk_loss_workspace_size(const Context& ctx, const ChunkLossFwdArgs& args) {
  if (ctx.device.kind != DeviceKind::kCUDA) return 0;
  return layout_of(args).total;
}

void chunk_loss_fwd(const Context& ctx, const ChunkLossFwdArgs& args) {
  check_fwd(ctx, args);
  ce::check_label_values(kOp, ctx, args.labels, args.weight.size(0), args.options.ignore_index);
  if (debug_checks(ctx) && args.alpha_per_sample.defined()) check_alpha_values(ctx, args.alpha_per_sample);
  // Zero rows still give loss 0 and an overwritten (zero) weight gradient: backends handle it.
  dispatch(kOp, Direction::kForward, ctx, args.hidden.dtype(), args);
}

void chunk_loss_bwd(const Context& ctx, const ChunkLossBwdArgs& args) {
  check_bwd(ctx, args);
  const DType key = args.saved_grad_hidden.defined()   ? args.saved_grad_hidden.dtype()
                    : args.saved_grad_weight.defined() ? args.saved_grad_weight.dtype()
                                                       : args.grad_loss.dtype();
  dispatch(kOp, Direction::kBackward, ctx, key, args);
}

void chunk_loss_fwd_ref(const Context& ctx, const ChunkLossFwdArgs& args) {
  chunk_loss_fwd(with_backend(ctx, "ref"), args);
}

void chunk_loss_bwd_ref(const Context& ctx, const ChunkLossBwdArgs& args) {
  chunk_loss_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
