// rmsnorm_without_weight: argument checks, then dispatch to the selected backend.
#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "rmsnorm_without_weight";

void check_fwd(const Context& ctx, const RmsNormWithoutWeightFwdArgs& a) {
  ArgCheck c(kOp);
  c.min_rank(a.x, "x", 1).floating(a.x, "x").on_device(a.x, "x", ctx).rows_addressable(a.x, "x");
  if (a.y.defined())
    c.same_shape(a.y, "y", a.x, "x").same_dtype(a.y, "y", a.x, "x").on_device(a.y, "y", ctx)
        .contiguous(a.y, "y");
  c.row_stats(a.rstd, "rstd", a.x, "x", ctx).eps(a.eps);
}

void check_bwd(const Context& ctx, const RmsNormWithoutWeightBwdArgs& a) {
  ArgCheck c(kOp);
  c.min_rank(a.x, "x", 1).floating(a.x, "x").on_device(a.x, "x", ctx).rows_addressable(a.x, "x");
  c.row_stats(a.rstd, "rstd", a.x, "x", ctx);
  if (a.dy.defined())
    c.same_shape(a.dy, "dy", a.x, "x").same_dtype(a.dy, "dy", a.x, "x").on_device(a.dy, "dy", ctx)
        .rows_addressable(a.dy, "dy");
  if (a.drstd.defined()) c.row_stats(a.drstd, "drstd", a.x, "x", ctx);
  c.same_shape(a.dx, "dx", a.x, "x").same_dtype(a.dx, "dx", a.x, "x").on_device(a.dx, "dx", ctx)
      .contiguous(a.dx, "dx");
}

}  // namespace

void rmsnorm_without_weight_fwd(const Context& ctx, const RmsNormWithoutWeightFwdArgs& args) {
  check_fwd(ctx, args);
  if (args.x.rows() == 0) return;
  dispatch(kOp, Direction::kForward, ctx, args.x.dtype(), args);
}

void rmsnorm_without_weight_bwd(const Context& ctx, const RmsNormWithoutWeightBwdArgs& args) {
  check_bwd(ctx, args);
  if (args.x.numel() == 0) return;
  dispatch(kOp, Direction::kBackward, ctx, args.x.dtype(), args);
}

void rmsnorm_without_weight_fwd_ref(const Context& ctx, const RmsNormWithoutWeightFwdArgs& args) {
  rmsnorm_without_weight_fwd(with_backend(ctx, "ref"), args);
}

void rmsnorm_without_weight_bwd_ref(const Context& ctx, const RmsNormWithoutWeightBwdArgs& args) {
  rmsnorm_without_weight_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
