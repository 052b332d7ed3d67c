// rmsnorm_gated: argument checks (docs/specs/ops.md section 5.5), then dispatch to the selected backend.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/ops/rmsnorm/rmsnorm_gated_common.h"

namespace fusedops {
namespace {

using rmsnorm_gated::kOp;

// dtype of `ref_name`'s tensor or float32 (the storage a caller may keep weights or a residual in).
void dtype_same_or_f32(const ArgCheck& c, const TensorView& t, const char* name, const TensorView& like,
                       const char* like_name) {
  if (t.dtype() == like.dtype() || t.dtype() == DType::kFloat32) return;
  c.value(false, std::string(name) + " must have the dtype of " + like_name + " (" +
                     dtype_name(like.dtype()) + ") or float32, got " + dtype_name(t.dtype()));
}

// Checks shared by both directions: D, the group size, weight and bias. Returns the number of
// groups per row.
int64_t check_params(const ArgCheck& c, const Context& ctx, const TensorView& x, const TensorView& key,
                     const char* key_name, const TensorView& z, const TensorView& weight,
                     const TensorView& bias, int64_t group_size, bool norm_before_gate,
                     GateActivation act) {
  const int64_t D = x.size(-1);
  c.value(act == GateActivation::kSilu || act == GateActivation::kSigmoid,
          "activation must be silu/swish or sigmoid, got code " + std::to_string(static_cast<int>(act)));
  c.value(group_size >= 0, "group_size must be > 0 (or 0 for D), got " + std::to_string(group_size));
  const int64_t g = rmsnorm_gated::group_cols(D, group_size);
  c.value(g == 0 || D % g == 0, "group_size must divide D: D = " + std::to_string(D) +
                                    ", group_size = " + std::to_string(group_size));
  c.value(norm_before_gate || act == GateActivation::kSilu,
          "activation 'sigmoid' needs norm_before_gate=True (the gate-first form uses silu)");
  if (z.defined()) {
    c.same_shape(z, "z", x, "x").same_dtype(z, "z", key, key_name).on_device(z, "z", ctx)
        .rows_addressable(z, "z");
  }
  for (auto [t, name] : {std::pair{weight, "weight"}, std::pair{bias, "bias"}}) {
    if (!t.defined()) continue;
    c.shape(t, name, {D}, "[D]").on_device(t, name, ctx).contiguous(t, name);
    c.floating(t, name);
    dtype_same_or_f32(c, t, name, key, key_name);
  }
  return g > 0 ? D / g : 0;
}

void check_fwd(const Context& ctx, const RmsNormGatedFwdArgs& a) {
  ArgCheck c(kOp);
  c.min_rank(a.x, "x", 1).floating(a.x, "x").on_device(a.x, "x", ctx).rows_addressable(a.x, "x");
  const int64_t groups = check_params(c, ctx, a.x, a.x, "x", a.z, a.weight, a.bias, a.group_size,
                                      a.norm_before_gate, a.activation);
  c.eps(a.eps);
  if (a.residual.defined()) {
    c.value(a.norm_before_gate, "residual needs norm_before_gate=True");
    c.same_shape(a.residual, "residual", a.x, "x").floating(a.residual, "residual")
        .on_device(a.residual, "residual", ctx).rows_addressable(a.residual, "residual");
    dtype_same_or_f32(c, a.residual, "residual", a.x, "x");
    c.defined(a.residual_out, "residual_out");
  }
  if (a.residual_out.defined()) {
    c.value(a.residual.defined(), "residual_out is written only with a residual");
    c.same_shape(a.residual_out, "residual_out", a.x, "x").floating(a.residual_out, "residual_out")
        .on_device(a.residual_out, "residual_out", ctx).contiguous(a.residual_out, "residual_out");
    dtype_same_or_f32(c, a.residual_out, "residual_out", a.x, "x");
  }
  c.same_shape(a.y, "y", a.x, "x").same_dtype(a.y, "y", a.x, "x").on_device(a.y, "y", ctx)
      .contiguous(a.y, "y");
  std::vector<int64_t> rshape = shape_vector(a.x);
  rshape.back() = groups;
  c.shape(a.rstd, "rstd", rshape, "x's leading shape, then D / group_size")
      .dtype_in(a.rstd, "rstd", {DType::kFloat32, DType::kFloat64})
      .on_device(a.rstd, "rstd", ctx)
      .contiguous(a.rstd, "rstd");
}

void check_bwd(const Context& ctx, const RmsNormGatedBwdArgs& a) {
  ArgCheck c(kOp);
  c.min_rank(a.dy, "dy", 1).floating(a.dy, "dy").on_device(a.dy, "dy", ctx)
      .rows_addressable(a.dy, "dy");
  c.same_shape(a.x, "x", a.dy, "dy").floating(a.x, "x").on_device(a.x, "x", ctx)
      .rows_addressable(a.x, "x");
  dtype_same_or_f32(c, a.x, "x", a.dy, "dy");
  const int64_t groups = check_params(c, ctx, a.x, a.dy, "dy", a.z, a.weight, a.bias, a.group_size,
                                      a.norm_before_gate, a.activation);
  std::vector<int64_t> rshape = shape_vector(a.x);
  rshape.back() = groups;
  c.shape(a.rstd, "rstd", rshape, "x's leading shape, then D / group_size")
      .dtype_in(a.rstd, "rstd", {DType::kFloat32, DType::kFloat64})
      .on_device(a.rstd, "rstd", ctx)
      .contiguous(a.rstd, "rstd");
  if (a.dresidual.defined()) {
    c.value(a.norm_before_gate, "dresidual (a residual) needs norm_before_gate=True");
    c.same_shape(a.dresidual, "dresidual", a.x, "x").same_dtype(a.dresidual, "dresidual", a.x, "x")
        .on_device(a.dresidual, "dresidual", ctx).rows_addressable(a.dresidual, "dresidual");
  }
  c.same_shape(a.dx, "dx", a.x, "x").same_dtype(a.dx, "dx", a.dy, "dy").on_device(a.dx, "dx", ctx)
      .contiguous(a.dx, "dx");
  if (a.z.defined()) {
    c.same_shape(a.dz, "dz", a.x, "x").same_dtype(a.dz, "dz", a.dy, "dy").on_device(a.dz, "dz", ctx)
        .contiguous(a.dz, "dz");
  } else {
    c.value(!a.dz.defined(), "dz is written only with z");
  }
  for (auto [p, g, pname, gname] :
       {std::tuple{a.weight, a.dweight, "weight", "dweight"}, std::tuple{a.bias, a.dbias, "bias", "dbias"}}) {
    if (p.defined()) {
      if (g.defined())
        c.shape(g, gname, {a.x.size(-1)}, "[D]").same_dtype(g, gname, p, pname).on_device(g, gname, ctx)
            .contiguous(g, gname);
    } else {
      c.value(!g.defined(), std::string(gname) + " is written only with " + pname);
    }
  }
  if (a.dresidual_in.defined()) {
    c.same_shape(a.dresidual_in, "dresidual_in", a.x, "x")
        .same_dtype(a.dresidual_in, "dresidual_in", a.x, "x")
        .on_device(a.dresidual_in, "dresidual_in", ctx)
        .contiguous(a.dresidual_in, "dresidual_in");
  }
  const int64_t need = rmsnorm_gated_bwd_workspace_size(a);
  if (need > 0) c.workspace(a.workspace, ctx, need, "rmsnorm_gated_bwd_workspace_size", 16);
}

}  // namespace

int64_t rmsnorm_gated_bwd_workspace_size(const RmsNormGatedBwdArgs& args) {
  if (!args.x.defined() || args.x.device().kind != DeviceKind::kCUDA) return 0;
  const int64_t params = (args.dweight.defined() ? 1 : 0) + (args.dbias.defined() ? 1 : 0);
  if (params == 0 || args.x.ndim() == 0) return 0;
  return rmsnorm_gated::max_partials(args.x.rows()) * args.x.size(-1) * 4 * params;
}

void rmsnorm_gated_fwd(const Context& ctx, const RmsNormGatedFwdArgs& args) {
  check_fwd(ctx, args);
  if (args.x.numel() == 0) return;
  dispatch(kOp, Direction::kForward, ctx, args.x.dtype(), args);
}

void rmsnorm_gated_bwd(const Context& ctx, const RmsNormGatedBwdArgs& args) {
  check_bwd(ctx, args);
  // With rows == 0 the weight and bias gradients are still written (as zeros).
  const bool params = args.dweight.defined() || args.dbias.defined();
  if (args.x.size(-1) == 0 || (args.x.numel() == 0 && !params)) return;
  dispatch(kOp, Direction::kBackward, ctx, args.dy.dtype(), args);
}

void rmsnorm_gated_fwd_ref(const Context& ctx, const RmsNormGatedFwdArgs& args) {
  rmsnorm_gated_fwd(with_backend(ctx, "ref"), args);
}

void rmsnorm_gated_bwd_ref(const Context& ctx, const RmsNormGatedBwdArgs& args) {
  rmsnorm_gated_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
