// mhc_pre_bmm and mhc_post: argument checks, then dispatch to the selected backend.
#include <string>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"

namespace fusedops {
namespace {

constexpr const char* kPre = "mhc_pre_bmm";
constexpr const char* kPost = "mhc_post";

// Zero-size tensors may carry any strides (torch gives [4,0] the strides [1,1]); the layout
// rules apply to tensors with elements only.
void contiguous_unless_empty(const ArgCheck& c, const TensorView& t, const char* name) {
  if (t.numel() > 0) c.contiguous(t, name);
}
void rows_unless_empty(const ArgCheck& c, const TensorView& t, const char* name) {
  if (t.numel() > 0) c.rows_addressable(t, name);
}

// x: [B,T,n,C] or [T,n,C] residual streams.
void check_streams(const ArgCheck& c, const Context& ctx, const TensorView& x) {
  c.defined(x, "x");
  c.value(x.ndim() == 3 || x.ndim() == 4,
          "x must have rank 3 ([T,n,C]) or 4 ([B,T,n,C]), got rank " + std::to_string(x.ndim()) +
              " with shape " + x.shape_string());
  c.dtype_in(x, "x", {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64})
      .on_device(x, "x", ctx);
  c.value(x.size(-2) >= 1, "x must have at least one stream (n >= 1), got shape " + x.shape_string());
  rows_unless_empty(c, x, "x");
}

std::vector<int64_t> drop_dim(const TensorView& t, int dim) {
  std::vector<int64_t> s = shape_vector(t);
  s.erase(s.begin() + (dim < 0 ? dim + t.ndim() : dim));
  return s;
}

std::vector<int64_t> square_of(const TensorView& x) {
  std::vector<int64_t> s = shape_vector(x);
  s.back() = x.size(-2);
  return s;
}

void check_coeff(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name,
                 const std::vector<int64_t>& shape, const char* what) {
  c.defined(t, name);
  c.shape(t, name, shape, what);
  c.dtype_in(t, name, {DType::kFloat32, DType::kFloat64}).on_device(t, name, ctx);
  contiguous_unless_empty(c, t, name);
}

void check_pre_common(const ArgCheck& c, const Context& ctx, const TensorView& h_pre,
                      const TensorView& x) {
  check_streams(c, ctx, x);
  check_coeff(c, ctx, h_pre, "h_pre", drop_dim(x, -1), "x's shape without C: one weight per stream");
}

void check_pre_fwd(const Context& ctx, const MhcPreBmmFwdArgs& a) {
  ArgCheck c(kPre);
  check_pre_common(c, ctx, a.h_pre, a.x);
  c.shape(a.y, "y", drop_dim(a.x, -2), "x's shape without n").floating(a.y, "y").on_device(a.y, "y", ctx);
  contiguous_unless_empty(c, a.y, "y");
}

void check_pre_bwd(const Context& ctx, const MhcPreBmmBwdArgs& a) {
  ArgCheck c(kPre);
  check_pre_common(c, ctx, a.h_pre, a.x);
  c.shape(a.dy, "dy", drop_dim(a.x, -2), "x's shape without n").floating(a.dy, "dy")
      .on_device(a.dy, "dy", ctx);
  rows_unless_empty(c, a.dy, "dy");
  c.same_shape(a.dh_pre, "dh_pre", a.h_pre, "h_pre").same_dtype(a.dh_pre, "dh_pre", a.h_pre, "h_pre")
      .on_device(a.dh_pre, "dh_pre", ctx);
  contiguous_unless_empty(c, a.dh_pre, "dh_pre");
  c.same_shape(a.dx, "dx", a.x, "x").same_dtype(a.dx, "dx", a.x, "x").on_device(a.dx, "dx", ctx);
  contiguous_unless_empty(c, a.dx, "dx");
}

void check_post_common(const ArgCheck& c, const Context& ctx, const TensorView& x,
                       const TensorView& h_res, const TensorView& h_out, const TensorView& h_post) {
  check_streams(c, ctx, x);
  check_coeff(c, ctx, h_res, "h_res", square_of(x), "square n x n mixing matrix per token");
  c.shape(h_out, "h_out", drop_dim(x, -2), "x's shape without n")
      .same_dtype(h_out, "h_out", x, "x")
      .on_device(h_out, "h_out", ctx);
  rows_unless_empty(c, h_out, "h_out");
  check_coeff(c, ctx, h_post, "h_post", drop_dim(x, -1), "x's shape without C: one weight per stream");
  c.same_dtype(h_post, "h_post", h_res, "h_res");
}

void check_post_fwd(const Context& ctx, const MhcPostFwdArgs& a) {
  ArgCheck c(kPost);
  check_post_common(c, ctx, a.x, a.h_res, a.h_out, a.h_post);
  c.same_shape(a.out, "out", a.x, "x").same_dtype(a.out, "out", a.x, "x").on_device(a.out, "out", ctx);
  contiguous_unless_empty(c, a.out, "out");
}

void check_post_bwd(const Context& ctx, const MhcPostBwdArgs& a) {
  ArgCheck c(kPost);
  check_post_common(c, ctx, a.x, a.h_res, a.h_out, a.h_post);
  c.same_shape(a.dy, "dy", a.x, "x").same_dtype(a.dy, "dy", a.x, "x").on_device(a.dy, "dy", ctx);
  rows_unless_empty(c, a.dy, "dy");
  auto out_like = [&](const TensorView& t, const char* name, const TensorView& like, const char* like_name) {
    c.same_shape(t, name, like, like_name).same_dtype(t, name, like, like_name).on_device(t, name, ctx);
    contiguous_unless_empty(c, t, name);
  };
  out_like(a.dx, "dx", a.x, "x");
  out_like(a.dh_res, "dh_res", a.h_res, "h_res");
  out_like(a.dh_out, "dh_out", a.h_out, "h_out");
  out_like(a.dh_post, "dh_post", a.h_post, "h_post");
}

int64_t tokens_of(const TensorView& x) {
  int64_t t = 1;
  for (int d = 0; d + 2 < x.ndim(); ++d) t *= x.size(d);
  return t;
}

}  // namespace

void mhc_pre_bmm_fwd(const Context& ctx, const MhcPreBmmFwdArgs& args) {
  check_pre_fwd(ctx, args);
  if (args.y.numel() == 0) return;
  dispatch(kPre, Direction::kForward, ctx, args.x.dtype(), args);
}

void mhc_pre_bmm_bwd(const Context& ctx, const MhcPreBmmBwdArgs& args) {
  check_pre_bwd(ctx, args);
  // C == 0 still has dh_pre (= 0) to write; no tokens has nothing.
  if (tokens_of(args.x) == 0) return;
  dispatch(kPre, Direction::kBackward, ctx, args.x.dtype(), args);
}

void mhc_post_fwd(const Context& ctx, const MhcPostFwdArgs& args) {
  check_post_fwd(ctx, args);
  if (args.out.numel() == 0) return;
  dispatch(kPost, Direction::kForward, ctx, args.x.dtype(), args);
}

void mhc_post_bwd(const Context& ctx, const MhcPostBwdArgs& args) {
  check_post_bwd(ctx, args);
  if (tokens_of(args.x) == 0) return;
  dispatch(kPost, Direction::kBackward, ctx, args.x.dtype(), args);
}

void mhc_pre_bmm_fwd_ref(const Context& ctx, const MhcPreBmmFwdArgs& args) {
  mhc_pre_bmm_fwd(with_backend(ctx, "ref"), args);
}
void mhc_pre_bmm_bwd_ref(const Context& ctx, const MhcPreBmmBwdArgs& args) {
  mhc_pre_bmm_bwd(with_backend(ctx, "ref"), args);
}
void mhc_post_fwd_ref(const Context& ctx, const MhcPostFwdArgs& args) {
  mhc_post_fwd(with_backend(ctx, "ref"), args);
}
void mhc_post_bwd_ref(const Context& ctx, const MhcPostBwdArgs& args) {
  mhc_post_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
