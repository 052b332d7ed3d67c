// clipped_swiglu: argument checks (docs/specs/ops.md section 7.5), then dispatch to the selected backend.
#include <cmath>
#include <string>
#include <vector>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/clipped_swiglu.h"
#include "src/ops/clipped_swiglu/clipped_swiglu_common.h"

namespace fusedops {
namespace {

using clipped_swiglu::kOp;

std::string num(double v) { return detail::concat(v); }

// Checks shared by both directions; returns the output shape (x's with shape[dim] halved).
std::vector<int64_t> check_common(const Context& ctx, const TensorView& x, const TensorView& gi,
                                  int dim, double limit, int clamp_mode) {
  ArgCheck c(kOp);
  c.min_rank(x, "x", 1);
  c.dtype_in(x, "x", {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64});
  c.on_device(x, "x", ctx).contiguous(x, "x");
  const int rank = x.ndim();
  c.value(dim >= -rank && dim < rank, "dim must be in [" + std::to_string(-rank) + ", " +
                                          std::to_string(rank) + ") for x of rank " +
                                          std::to_string(rank) + ", got " + std::to_string(dim));
  const int d = clipped_swiglu::wrap_dim(dim, rank);
  c.value(x.size(d) % 2 == 0, "x.shape[dim] (the split size) must be even, got " +
                                  std::to_string(x.size(d)) + " at dim " + std::to_string(dim) +
                                  " of shape " + x.shape_string());
  c.value(limit > 0 && std::isfinite(limit), "limit must be a finite number > 0, got " + num(limit));
  c.value(clamp_mode == 0 || clamp_mode == 1,
          "clamp_mode must be 0 or 1, got " + std::to_string(clamp_mode));
  if (gi.defined()) {
    c.rank(gi, "group_index", 1).dtype_in(gi, "group_index", {DType::kInt64});
    c.on_device(gi, "group_index", ctx);
    c.value(gi.size(0) <= kClippedSwigluMaxGroups,
            "group_index must have at most " + std::to_string(kClippedSwigluMaxGroups) +
                " entries, got " + std::to_string(gi.size(0)));
  }
  std::vector<int64_t> out = shape_vector(x);
  out[d] /= 2;
  return out;
}

void check_fwd(const Context& ctx, const ClippedSwigluFwdArgs& a) {
  const auto out = check_common(ctx, a.x, a.group_index, a.dim, a.limit, a.clamp_mode);
  ArgCheck c(kOp);
  c.shape(a.y, "y", out, "x's shape with shape[dim] halved")
      .same_dtype(a.y, "y", a.x, "x")
      .on_device(a.y, "y", ctx)
      .contiguous(a.y, "y");
}

void check_bwd(const Context& ctx, const ClippedSwigluBwdArgs& a) {
  const auto out = check_common(ctx, a.x, a.group_index, a.dim, a.limit, a.clamp_mode);
  ArgCheck c(kOp);
  c.shape(a.dy, "dy", out, "x's shape with shape[dim] halved")
      .same_dtype(a.dy, "dy", a.x, "x")
      .on_device(a.dy, "dy", ctx)
      .contiguous(a.dy, "dy");
  c.same_shape(a.dx, "dx", a.x, "x").same_dtype(a.dx, "dx", a.x, "x").on_device(a.dx, "dx", ctx)
      .contiguous(a.dx, "dx");
}

// group_index entries >= 0: checked before any work on the CPU, and on CUDA with debug checks
// (a copy to the host and a synchronisation); otherwise the CUDA kernels count a negative entry
// as 0 and report it.
void check_group_index_values(const Context& ctx, const TensorView& gi) {
  if (!gi.defined() || gi.size(0) == 0) return;
  if (ctx.device.kind != DeviceKind::kCPU && !debug_checks(ctx)) return;
  const std::vector<int64_t> g = read_index_values(kOp, ctx, gi);
  for (size_t i = 0; i < g.size(); ++i)
    FUSEDOPS_REQUIRE(g[i] >= 0, kValue, kOp, "group_index entries must be >= 0, got ", g[i],
                     " at index ", i);
}

}  // namespace

void clipped_swiglu_fwd(const Context& ctx, const ClippedSwigluFwdArgs& args) {
  check_fwd(ctx, args);
  if (args.y.numel() == 0) return;
  check_group_index_values(ctx, args.group_index);
  dispatch(kOp, Direction::kForward, ctx, args.x.dtype(), args);
}

void clipped_swiglu_bwd(const Context& ctx, const ClippedSwigluBwdArgs& args) {
  check_bwd(ctx, args);
  if (args.dx.numel() == 0) return;
  check_group_index_values(ctx, args.group_index);
  dispatch(kOp, Direction::kBackward, ctx, args.x.dtype(), args);
}

void clipped_swiglu_fwd_ref(const Context& ctx, const ClippedSwigluFwdArgs& args) {
  clipped_swiglu_fwd(with_backend(ctx, "ref"), args);
}

void clipped_swiglu_bwd_ref(const Context& ctx, const ClippedSwigluBwdArgs& args) {
  clipped_swiglu_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
