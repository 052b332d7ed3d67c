// l2norm: argument checks, then dispatch to the selected backend.
#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/l2norm.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "l2norm";

void check_fwd(const Context& ctx, const L2NormFwdArgs& a) {
  ArgCheck c(kOp);
  c.min_rank(a.x, "x", 1).floating(a.x, "x").on_device(a.x, "x", ctx).rows_addressable(a.x, "x");
  c.same_shape(a.y, "y", a.x, "x").floating(a.y, "y").on_device(a.y, "y", ctx).contiguous(a.y, "y");
  c.row_stats(a.rstd, "rstd", a.x, "x", ctx).eps(a.eps);
}

void check_bwd(const Context& ctx, const L2NormBwdArgs& a) {
  ArgCheck c(kOp);
  c.min_rank(a.y, "y", 1).floating(a.y, "y").on_device(a.y, "y", ctx).rows_addressable(a.y, "y");
  c.row_stats(a.rstd, "rstd", a.y, "y", ctx);
  c.same_shape(a.dy, "dy", a.y, "y").same_dtype(a.dy, "dy", a.y, "y").on_device(a.dy, "dy", ctx)
      .rows_addressable(a.dy, "dy");
  c.same_shape(a.dx, "dx", a.y, "y").floating(a.dx, "dx").on_device(a.dx, "dx", ctx)
      .contiguous(a.dx, "dx");
}

}  // namespace

void l2norm_fwd(const Context& ctx, const L2NormFwdArgs& args) {
  check_fwd(ctx, args);
  if (args.x.rows() == 0) return;
  dispatch(kOp, Direction::kForward, ctx, args.x.dtype(), args);
}

void l2norm_bwd(const Context& ctx, const L2NormBwdArgs& args) {
  check_bwd(ctx, args);
  if (args.y.numel() == 0) return;
  dispatch(kOp, Direction::kBackward, ctx, args.dx.dtype(), args);
}

void l2norm_fwd_ref(const Context& ctx, const L2NormFwdArgs& args) {
  l2norm_fwd(with_backend(ctx, "ref"), args);
}

void l2norm_bwd_ref(const Context& ctx, const L2NormBwdArgs& args) {
  l2norm_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
