// fused_cross_entropy_loss: argument checks, then dispatch to the selected backend.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/ops/cross_entropy/ce_common.h"

namespace fusedops {

const char* loss_reduction_name(LossReduction reduction) {
  switch (reduction) {
    case LossReduction::kNone: return "none";
    case LossReduction::kSum: return "sum";
    case LossReduction::kMean: return "mean";
  }
  return "?";
}

LossReduction parse_loss_reduction(const std::string& name, const char* op) {
  if (name == "none") return LossReduction::kNone;
  if (name == "sum") return LossReduction::kSum;
  if (name == "mean") return LossReduction::kMean;
  FUSEDOPS_FAIL(kValue, op, "reduction must be one of 'none', 'sum', 'mean', got '", name, "'");
}

namespace ce {

// Checks shared with chunk_loss (declared in its API file).
void check_options(const char* op, const CrossEntropyOptions& o) {
  ArgCheck c(op);
  const int r = static_cast<int>(o.reduction);
  c.value(r >= 0 && r <= 2, "reduction must be none, sum or mean");
  c.value(std::isfinite(o.label_smoothing) && o.label_smoothing >= 0 && o.label_smoothing <= 1,
          "label_smoothing must be in [0, 1], got " + std::to_string(o.label_smoothing));
  c.value(std::isfinite(o.logit_scale),
          "logit_scale must be finite, got " + std::to_string(o.logit_scale));
  if (o.logit_softcapping)
    c.value(std::isfinite(*o.logit_softcapping) && *o.logit_softcapping > 0,
            "logit_softcapping must be a finite number > 0 (or None), got " +
                std::to_string(*o.logit_softcapping));
  c.value(std::isfinite(o.lse_square_scale) && o.lse_square_scale >= 0,
          "lse_square_scale must be a finite number >= 0, got " +
              std::to_string(o.lse_square_scale));
}

// Contiguity that also accepts empty tensors (torch gives them arbitrary strides).
void check_dense(const ArgCheck& c, const TensorView& t, const char* name) {
  if (t.numel() > 0) c.contiguous(t, name);
}

// [first, last) byte range a rows-addressable [..., D] view touches.
void byte_range(const TensorView& t, uintptr_t* first, uintptr_t* last) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data());
  const int64_t rows = t.rows(), d = t.ndim() ? t.size(-1) : 1;
  const int64_t span = rows > 0 && d > 0 ? (rows - 1) * t.row_stride() + d : 0;
  *first = base;
  *last = base + static_cast<uintptr_t>(span) * dtype_size(t.dtype());
}

bool overlaps(const TensorView& a, const TensorView& b) {
  uintptr_t a0, a1, b0, b1;
  byte_range(a, &a0, &a1);
  byte_range(b, &b0, &b1);
  return a0 < b1 && b0 < a1;
}

// `out` is `in` itself, or does not overlap it.
void check_in_place_or_apart(const ArgCheck& c, const TensorView& out, const char* out_name,
                             const TensorView& in, const char* in_name) {
  if (out.numel() == 0 || in.numel() == 0 || out.data() == in.data()) return;
  c.value(!overlaps(out, in), std::string(out_name) + " must be " + in_name +
                                  " itself (in place) or not overlap it");
}

void check_label_values(const char* op, const Context& ctx, const TensorView& labels,
                        int64_t vocab, int64_t ignore_index) {
  const int64_t n = labels.numel();
  if (n == 0) return;
  if (ctx.device.kind == DeviceKind::kCPU) {  // contiguous (checked): read in place
    if (labels.dtype() == DType::kInt64)
      check_labels_host(op, labels.data_as<const int64_t>(), n, vocab, ignore_index);
    else
      check_labels_host(op, labels.data_as<const int32_t>(), n, vocab, ignore_index);
  } else if (debug_checks(ctx)) {
    const TensorView flat(labels.data(), labels.dtype(), labels.device(), {n});
    const std::vector<int64_t> host = read_index_values(op, ctx, flat);
    check_labels_host(op, host.data(), n, vocab, ignore_index);
  }
}

}  // namespace ce

namespace {

constexpr const char* kOp = "fused_cross_entropy_loss";

void check_fwd(const Context& ctx, const CrossEntropyFwdArgs& a) {
  ArgCheck c(kOp);
  ce::check_options(kOp, a.options);
  c.min_rank(a.logits, "logits", 2).floating(a.logits, "logits").on_device(a.logits, "logits", ctx)
      .rows_addressable(a.logits, "logits");
  const int64_t N = a.logits.rows(), V = a.logits.size(-1);
  c.value(V >= 1, "logits must have a vocabulary dimension of size >= 1, got shape " +
                      a.logits.shape_string());
  c.defined(a.labels, "labels").dtype_in(a.labels, "labels", {DType::kInt32, DType::kInt64})
      .on_device(a.labels, "labels", ctx);
  c.value(a.labels.numel() == N, "labels must have one entry per row of logits (" +
                                     std::to_string(N) + "), got shape " + a.labels.shape_string());
  ce::check_dense(c, a.labels, "labels");
  if (a.loss_weight.defined()) {
    c.floating(a.loss_weight, "loss_weight").on_device(a.loss_weight, "loss_weight", ctx);
    c.value(a.loss_weight.numel() == N, "loss_weight must have one entry per row of logits (" +
                                            std::to_string(N) + "), got shape " +
                                            a.loss_weight.shape_string());
    ce::check_dense(c, a.loss_weight, "loss_weight");
  }
  const bool none = a.options.reduction == LossReduction::kNone;
  c.defined(a.loss, "loss").dtype_in(a.loss, "loss", {DType::kFloat32, DType::kFloat64})
      .on_device(a.loss, "loss", ctx);
  if (none) {
    c.same_shape(a.loss, "loss", a.labels, "labels");
  } else {
    c.shape(a.loss, "loss", {}, "a scalar for reduction 'sum' / 'mean'");
  }
  ce::check_dense(c, a.loss, "loss");
  if (a.z_loss.defined()) {
    c.same_shape(a.z_loss, "z_loss", a.loss, "loss").same_dtype(a.z_loss, "z_loss", a.loss, "loss")
        .on_device(a.z_loss, "z_loss", ctx);
    ce::check_dense(c, a.z_loss, "z_loss");
  }
  if (a.grad_logits.defined()) {
    c.same_shape(a.grad_logits, "grad_logits", a.logits, "logits")
        .same_dtype(a.grad_logits, "grad_logits", a.logits, "logits")
        .on_device(a.grad_logits, "grad_logits", ctx);
    if (a.grad_logits.data() == a.logits.data() && a.logits.numel() > 0)
      c.value(a.logits.is_contiguous(),
              "inplace_backward (grad_logits == logits) needs contiguous logits, got strides " +
                  shape_string(a.logits.strides(), a.logits.ndim()) + " for shape " +
                  a.logits.shape_string());
    ce::check_dense(c, a.grad_logits, "grad_logits");
    ce::check_in_place_or_apart(c, a.grad_logits, "grad_logits", a.logits, "logits");
  }
  if (a.grad_loss_weight.defined()) {
    c.same_shape(a.grad_loss_weight, "grad_loss_weight", a.labels, "labels")
        .dtype_in(a.grad_loss_weight, "grad_loss_weight", {DType::kFloat32, DType::kFloat64})
        .on_device(a.grad_loss_weight, "grad_loss_weight", ctx);
    ce::check_dense(c, a.grad_loss_weight, "grad_loss_weight");
  }
  c.workspace(a.workspace, ctx, static_cast<int64_t>(cross_entropy_workspace_size(ctx, N, V)),
              "cross_entropy_workspace_size", 256);
}

void check_bwd(const Context& ctx, const CrossEntropyBwdArgs& a) {
  ArgCheck c(kOp);
  c.defined(a.grad_loss, "grad_loss").dtype_in(a.grad_loss, "grad_loss", {DType::kFloat32, DType::kFloat64})
      .on_device(a.grad_loss, "grad_loss", ctx);
  ce::check_dense(c, a.grad_loss, "grad_loss");
  int64_t rows = -1;
  if (a.saved_grad_logits.defined()) {
    c.min_rank(a.saved_grad_logits, "saved_grad_logits", 2)
        .floating(a.saved_grad_logits, "saved_grad_logits")
        .on_device(a.saved_grad_logits, "saved_grad_logits", ctx);
    ce::check_dense(c, a.saved_grad_logits, "saved_grad_logits");
    c.same_shape(a.grad_logits, "grad_logits", a.saved_grad_logits, "saved_grad_logits")
        .same_dtype(a.grad_logits, "grad_logits", a.saved_grad_logits, "saved_grad_logits")
        .on_device(a.grad_logits, "grad_logits", ctx);
    ce::check_dense(c, a.grad_logits, "grad_logits");
    ce::check_in_place_or_apart(c, a.grad_logits, "grad_logits", a.saved_grad_logits,
                                "saved_grad_logits");
    rows = a.saved_grad_logits.rows();
  } else {
    c.value(!a.grad_logits.defined(), "grad_logits is given without saved_grad_logits");
  }
  if (a.saved_grad_loss_weight.defined()) {
    c.dtype_in(a.saved_grad_loss_weight, "saved_grad_loss_weight", {DType::kFloat32, DType::kFloat64})
        .on_device(a.saved_grad_loss_weight, "saved_grad_loss_weight", ctx);
    ce::check_dense(c, a.saved_grad_loss_weight, "saved_grad_loss_weight");
    if (rows >= 0)
      c.value(a.saved_grad_loss_weight.numel() == rows,
              "saved_grad_loss_weight must have one entry per row of saved_grad_logits (" +
                  std::to_string(rows) + "), got shape " + a.saved_grad_loss_weight.shape_string());
    rows = a.saved_grad_loss_weight.numel();
    c.same_shape(a.grad_loss_weight, "grad_loss_weight", a.saved_grad_loss_weight, "saved_grad_loss_weight")
        .floating(a.grad_loss_weight, "grad_loss_weight")
        .on_device(a.grad_loss_weight, "grad_loss_weight", ctx);
    ce::check_dense(c, a.grad_loss_weight, "grad_loss_weight");
    ce::check_in_place_or_apart(c, a.grad_loss_weight, "grad_loss_weight", a.saved_grad_loss_weight,
                                "saved_grad_loss_weight");
  } else {
    c.value(!a.grad_loss_weight.defined(), "grad_loss_weight is given without saved_grad_loss_weight");
  }
  if (a.reduction == LossReduction::kNone) {
    if (rows >= 0)
      c.value(a.grad_loss.numel() == rows, "grad_loss must have one entry per row (" +
                                               std::to_string(rows) + ") for reduction 'none', got shape " +
                                               a.grad_loss.shape_string());
  } else {
    c.value(a.grad_loss.numel() == 1, std::string("grad_loss must be a scalar for reduction '") +
                                          loss_reduction_name(a.reduction) + "', got shape " +
                                          a.grad_loss.shape_string());
  }
}

}  // namespace

size_t cross_entropy_workspace_size(const Context& ctx, int64_t rows, int64_t vocab) {
  if (ctx.device.kind != DeviceKind::kCUDA) return 0;
  return ce::rows_layout(rows).total;
}

void fused_cross_entropy_loss_fwd(const Context& ctx, const CrossEntropyFwdArgs& args) {
  check_fwd(ctx, args);
  ce::check_label_values(kOp, ctx, args.labels, args.logits.size(-1), args.options.ignore_index);
  // Zero rows still produce a loss (0 for sum / mean): the backends handle rows == 0.
  if (args.options.reduction == LossReduction::kNone && args.logits.rows() == 0) return;
  dispatch(kOp, Direction::kForward, ctx, args.logits.dtype(), args);
}

void fused_cross_entropy_loss_bwd(const Context& ctx, const CrossEntropyBwdArgs& args) {
  check_bwd(ctx, args);
  const bool logits_work = args.saved_grad_logits.defined() && args.saved_grad_logits.numel() > 0;
  const bool weight_work = args.saved_grad_loss_weight.defined() && args.saved_grad_loss_weight.numel() > 0;
  if (!logits_work && !weight_work) return;
  const DType key = args.saved_grad_logits.defined() ? args.saved_grad_logits.dtype() : args.grad_loss.dtype();
  dispatch(kOp, Direction::kBackward, ctx, key, args);
}

void fused_cross_entropy_loss_fwd_ref(const Context& ctx, const CrossEntropyFwdArgs& args) {
  fused_cross_entropy_loss_fwd(with_backend(ctx, "ref"), args);
}

void fused_cross_entropy_loss_bwd_ref(const Context& ctx, const CrossEntropyBwdArgs& args) {
  fused_cross_entropy_loss_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
