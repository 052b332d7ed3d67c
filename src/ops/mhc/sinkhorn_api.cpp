// sinkhorn and hc_split_sinkhorn: argument checks, then dispatch to the selected backend.
#include <string>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/ops/mhc/sinkhorn_common.h"

namespace fusedops {
namespace {

constexpr const char* kSinkhorn = "sinkhorn";
constexpr const char* kSplit = "hc_split_sinkhorn";

// Zero-size tensors may carry any strides; only non-empty ones must be contiguous.
void contiguous_unless_empty(const ArgCheck& c, const TensorView& t, const char* name) {
  if (t.numel() > 0) c.contiguous(t, name);
}

void check_scalars(const ArgCheck& c, int iters, const char* iters_name, double eps,
                   SinkhornVariant variant) {
  c.value(iters >= 1, std::string(iters_name) + " must be >= 1, got " + std::to_string(iters));
  c.eps(eps);
  const int v = static_cast<int>(variant);
  c.value(v >= 0 && v <= 2, "variant must be one of \"mindspeed\", \"deepseek\", \"log\", got "
                                "enum value " + std::to_string(v));
}

// logits-like [..., n, n] tensor: square last two dims, n within the supported range.
void check_square(const ArgCheck& c, const TensorView& t, const char* name) {
  c.min_rank(t, name, 2);
  c.value(t.size(-1) == t.size(-2), std::string(name) +
                                        " must have square last two dims [..., n, n], got " +
                                        t.shape_string());
  c.value(t.size(-1) <= kSinkhornMaxN,
          std::string(name) + ": n = " + std::to_string(t.size(-1)) +
              " is above the supported maximum of " + std::to_string(kSinkhornMaxN));
}

void check_fwd(const Context& ctx, const SinkhornFwdArgs& a) {
  ArgCheck c(kSinkhorn);
  check_square(c, a.logits, "logits");
  c.floating(a.logits, "logits").on_device(a.logits, "logits", ctx);
  contiguous_unless_empty(c, a.logits, "logits");
  c.same_shape(a.out, "out", a.logits, "logits").same_dtype(a.out, "out", a.logits, "logits")
      .on_device(a.out, "out", ctx);
  contiguous_unless_empty(c, a.out, "out");
  check_scalars(c, a.num_iters, "num_iters", a.eps, a.variant);
}

void check_bwd(const Context& ctx, const SinkhornBwdArgs& a) {
  ArgCheck c(kSinkhorn);
  check_square(c, a.logits, "logits");
  c.floating(a.logits, "logits").on_device(a.logits, "logits", ctx);
  contiguous_unless_empty(c, a.logits, "logits");
  c.same_shape(a.dout, "dout", a.logits, "logits").same_dtype(a.dout, "dout", a.logits, "logits")
      .on_device(a.dout, "dout", ctx);
  contiguous_unless_empty(c, a.dout, "dout");
  c.same_shape(a.dlogits, "dlogits", a.logits, "logits")
      .same_dtype(a.dlogits, "dlogits", a.logits, "logits")
      .on_device(a.dlogits, "dlogits", ctx);
  contiguous_unless_empty(c, a.dlogits, "dlogits");
  check_scalars(c, a.num_iters, "num_iters", a.eps, a.variant);
}

std::vector<int64_t> with_last(const TensorView& t, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> s = shape_vector(t);
  if (!s.empty()) s.pop_back();
  s.insert(s.end(), tail);
  return s;
}

// Checks shared by both directions of hc_split_sinkhorn.
void check_split_inputs(const ArgCheck& c, const Context& ctx, const TensorView& mixes,
                        const TensorView& scale, const TensorView& base, int n, int iters,
                        double eps, SinkhornVariant variant) {
  c.value(n >= 1 && n <= kSinkhornMaxN,
          "hc_mult = " + std::to_string(n) + " is outside the supported range [1, " +
              std::to_string(kSinkhornMaxN) + "]");
  const int64_t width = static_cast<int64_t>(2 + n) * n;
  c.min_rank(mixes, "mixes", 1).floating(mixes, "mixes").on_device(mixes, "mixes", ctx);
  c.value(mixes.size(-1) == width,
          "mixes must have last dim (2+n)*n = " + std::to_string(width) + " for hc_mult " +
              std::to_string(n) + ", got shape " + mixes.shape_string());
  c.rows_addressable(mixes, "mixes");
  c.dtype_in(scale, "hc_scale", {DType::kFloat32, DType::kFloat64}).on_device(scale, "hc_scale", ctx);
  c.shape(scale, "hc_scale", {3}, "alpha_pre, alpha_post, alpha_res").contiguous(scale, "hc_scale");
  c.same_dtype(base, "hc_base", scale, "hc_scale").on_device(base, "hc_base", ctx);
  c.shape(base, "hc_base", {width}, "(2+n)*n").contiguous(base, "hc_base");
  check_scalars(c, iters, "sinkhorn_iters", eps, variant);
}

void check_output(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name,
                  const std::vector<int64_t>& shape, const TensorView& like) {
  c.shape(t, name, shape).same_dtype(t, name, like, "mixes").on_device(t, name, ctx);
  contiguous_unless_empty(c, t, name);
}

void check_split_fwd(const Context& ctx, const HcSplitSinkhornFwdArgs& a) {
  ArgCheck c(kSplit);
  check_split_inputs(c, ctx, a.mixes, a.hc_scale, a.hc_base, a.hc_mult, a.sinkhorn_iters, a.eps,
                     a.variant);
  const int64_t n = a.hc_mult;
  check_output(c, ctx, a.pre, "pre", with_last(a.mixes, {n}), a.mixes);
  check_output(c, ctx, a.post, "post", with_last(a.mixes, {n}), a.mixes);
  check_output(c, ctx, a.comb, "comb", with_last(a.mixes, {n, n}), a.mixes);
}

// An output gradient: the output's shape and dtype, each token's values contiguous and the
// tokens at one stride (mhc::token_stride).
void check_output_grad(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name,
                       const std::vector<int64_t>& shape, const TensorView& like, int trailing) {
  c.shape(t, name, shape).same_dtype(t, name, like, "mixes").on_device(t, name, ctx);
  c.value(mhc::token_stride(t, trailing) > 0,
          std::string(name) + " must have each token's " + (trailing == 2 ? "n x n" : "n") +
              " values contiguous and its tokens at one stride, got strides " +
              shape_string(t.strides(), t.ndim()));
}

void check_split_bwd(const Context& ctx, const HcSplitSinkhornBwdArgs& a) {
  ArgCheck c(kSplit);
  check_split_inputs(c, ctx, a.mixes, a.hc_scale, a.hc_base, a.hc_mult, a.sinkhorn_iters, a.eps,
                     a.variant);
  const int64_t n = a.hc_mult;
  if (a.dpre.defined()) check_output_grad(c, ctx, a.dpre, "dpre", with_last(a.mixes, {n}), a.mixes, 1);
  if (a.dpost.defined())
    check_output_grad(c, ctx, a.dpost, "dpost", with_last(a.mixes, {n}), a.mixes, 1);
  if (a.dcomb.defined())
    check_output_grad(c, ctx, a.dcomb, "dcomb", with_last(a.mixes, {n, n}), a.mixes, 2);
  check_output(c, ctx, a.dmixes, "dmixes", shape_vector(a.mixes), a.mixes);
  c.same_shape(a.dhc_scale, "dhc_scale", a.hc_scale, "hc_scale")
      .same_dtype(a.dhc_scale, "dhc_scale", a.hc_scale, "hc_scale")
      .on_device(a.dhc_scale, "dhc_scale", ctx)
      .contiguous(a.dhc_scale, "dhc_scale");
  c.same_shape(a.dhc_base, "dhc_base", a.hc_base, "hc_base")
      .same_dtype(a.dhc_base, "dhc_base", a.hc_base, "hc_base")
      .on_device(a.dhc_base, "dhc_base", ctx)
      .contiguous(a.dhc_base, "dhc_base");
  const int64_t need = hc_split_sinkhorn_bwd_workspace_size(a);
  c.workspace(a.workspace, ctx, need, "hc_split_sinkhorn_bwd_workspace_size", 4);
}

}  // namespace

const char* sinkhorn_variant_name(SinkhornVariant variant) {
  switch (variant) {
    case SinkhornVariant::kMindSpeed: return "mindspeed";
    case SinkhornVariant::kDeepSeek: return "deepseek";
    case SinkhornVariant::kLog: return "log";
  }
  return "?";
}

SinkhornVariant parse_sinkhorn_variant(const std::string& name, const char* op) {
  if (name == "mindspeed") return SinkhornVariant::kMindSpeed;
  if (name == "deepseek") return SinkhornVariant::kDeepSeek;
  if (name == "log") return SinkhornVariant::kLog;
  FUSEDOPS_FAIL(kValue, op, "variant must be one of \"mindspeed\", \"deepseek\", \"log\", got \"",
                name, "\"");
}

int64_t hc_split_sinkhorn_partial_rows(int hc_mult) {
  return mhc::kSinkhornBlockThreads / mhc::sinkhorn_group(hc_mult);
}

int64_t hc_split_sinkhorn_bwd_workspace_size(const HcSplitSinkhornBwdArgs& args) {
  const int n = args.hc_mult;
  if (n < 1 || n > kSinkhornMaxN || !args.mixes.defined() || args.mixes.ndim() < 1) return 0;
  const int64_t rows = args.mixes.rows();
  const int64_t per = hc_split_sinkhorn_partial_rows(n);
  const int64_t partials = (rows + per - 1) / per;
  return partials * mhc::split_param_count(n) * static_cast<int64_t>(sizeof(float));
}

void sinkhorn_fwd(const Context& ctx, const SinkhornFwdArgs& args) {
  check_fwd(ctx, args);
  if (args.logits.numel() == 0) return;
  dispatch(kSinkhorn, Direction::kForward, ctx, args.logits.dtype(), args);
}

void sinkhorn_bwd(const Context& ctx, const SinkhornBwdArgs& args) {
  check_bwd(ctx, args);
  if (args.logits.numel() == 0) return;
  dispatch(kSinkhorn, Direction::kBackward, ctx, args.logits.dtype(), args);
}

void sinkhorn_fwd_ref(const Context& ctx, const SinkhornFwdArgs& args) {
  sinkhorn_fwd(with_backend(ctx, "ref"), args);
}

void sinkhorn_bwd_ref(const Context& ctx, const SinkhornBwdArgs& args) {
  sinkhorn_bwd(with_backend(ctx, "ref"), args);
}

void hc_split_sinkhorn_fwd(const Context& ctx, const HcSplitSinkhornFwdArgs& args) {
  check_split_fwd(ctx, args);
  if (args.mixes.rows() == 0) return;
  dispatch(kSplit, Direction::kForward, ctx, args.mixes.dtype(), args);
}

void hc_split_sinkhorn_bwd(const Context& ctx, const HcSplitSinkhornBwdArgs& args) {
  check_split_bwd(ctx, args);
  // Dispatched even without rows: the parameter gradients are then written as zeros.
  dispatch(kSplit, Direction::kBackward, ctx, args.mixes.dtype(), args);
}

void hc_split_sinkhorn_fwd_ref(const Context& ctx, const HcSplitSinkhornFwdArgs& args) {
  hc_split_sinkhorn_fwd(with_backend(ctx, "ref"), args);
}

void hc_split_sinkhorn_bwd_ref(const Context& ctx, const HcSplitSinkhornBwdArgs& args) {
  hc_split_sinkhorn_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
