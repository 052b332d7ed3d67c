// causal_conv1d: argument checks, then dispatch to the selected backend.
#include <string>
#include <vector>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/causal_conv1d.h"
#include "src/ops/causal_conv1d/causal_conv1d_common.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "causal_conv1d";

// Contiguous, also for zero-size tensors (whose strides torch leaves arbitrary).
void dense(const ArgCheck& c, const TensorView& t, const char* name) {
  if (t.numel() == 0) return;
  c.contiguous(t, name);
}

// The dims after T form one dense block of D channels (B and T may have any strides).
void dense_channels(const TensorView& t, const char* name) {
  if (t.numel() == 0) return;
  int64_t expected = 1;
  bool ok = true;
  for (int d = t.ndim() - 1; d >= 2; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) ok = false;
    expected *= t.size(d);
  }
  FUSEDOPS_REQUIRE(ok, kValue, kOp, name,
                   " must have dense channel dimensions (the dims after T contiguous), got strides ",
                   shape_string(t.strides(), t.ndim()), " for shape ", t.shape_string());
}

void check_sequence_input(const ArgCheck& c, const Context& ctx, const TensorView& t,
                          const char* name, const TensorView& x) {
  c.same_shape(t, name, x, "x").same_dtype(t, name, x, "x").on_device(t, name, ctx);
  dense_channels(t, name);
}

// Checks x, weight, bias, initial_state and cu_seqlens (common to both directions); returns
// the geometry.
conv1d::Geometry check_inputs(const Context& ctx, const TensorView& x, const TensorView& weight,
                              const TensorView& bias, const TensorView& h0, const TensorView& cu) {
  ArgCheck c(kOp);
  c.min_rank(x, "x", 3).floating(x, "x").on_device(x, "x", ctx);
  dense_channels(x, "x");
  const int64_t D = conv1d::channels_of(x);
  c.defined(weight, "weight").floating(weight, "weight").on_device(weight, "weight", ctx);
  FUSEDOPS_REQUIRE(weight.ndim() == 2 && weight.size(1) == D && weight.size(0) >= 1, kValue, kOp,
                   "weight must have shape [W,D] with D = ", D,
                   " (x's channels) and W >= 1, got ", weight.shape_string());
  if (bias.defined()) {
    c.floating(bias, "bias").on_device(bias, "bias", ctx);
    c.shape(bias, "bias", {D}, "[D], D = x's channels");
  }
  if (cu.defined()) {
    c.rank(cu, "cu_seqlens", 1)
        .dtype_in(cu, "cu_seqlens", {DType::kInt32, DType::kInt64})
        .on_device(cu, "cu_seqlens", ctx);
    FUSEDOPS_REQUIRE(cu.size(0) >= 1, kValue, kOp,
                     "cu_seqlens must have N+1 >= 1 entries, got shape ", cu.shape_string());
    FUSEDOPS_REQUIRE(x.size(0) == 1, kValue, kOp,
                     "cu_seqlens requires x with batch size B == 1, got x of shape ",
                     x.shape_string());
  }
  const conv1d::Geometry g = conv1d::geometry(x, weight, cu);
  if (h0.defined()) {
    c.floating(h0, "initial_state").on_device(h0, "initial_state", ctx);
    c.shape(h0, "initial_state", {g.N, g.D, g.W}, "[N,D,W]");
    dense(c, h0, "initial_state");
  }
  // The offsets' contents: before any work on the CPU, with debug checks on CUDA (a copy and a
  // sync); otherwise the CUDA backend checks them on the device and reports.
  if (cu.defined() && (ctx.device.kind == DeviceKind::kCPU || debug_checks(ctx)))
    c.offsets(read_index_values(kOp, ctx, cu), "cu_seqlens", g.T, "T", "x's time steps");
  return g;
}

void check_state_output(const ArgCheck& c, const Context& ctx, const TensorView& t,
                        const char* name, const conv1d::Geometry& g) {
  c.floating(t, name).on_device(t, name, ctx);
  c.shape(t, name, {g.N, g.D, g.W}, "[N,D,W]");
  dense(c, t, name);
}

conv1d::Geometry check_fwd(const Context& ctx, const CausalConv1dFwdArgs& a) {
  ArgCheck c(kOp);
  const conv1d::Geometry g = check_inputs(ctx, a.x, a.weight, a.bias, a.initial_state, a.cu_seqlens);
  if (a.residual.defined()) check_sequence_input(c, ctx, a.residual, "residual", a.x);
  c.same_shape(a.y, "y", a.x, "x").same_dtype(a.y, "y", a.x, "x").on_device(a.y, "y", ctx);
  dense(c, a.y, "y");
  if (a.final_state.defined()) check_state_output(c, ctx, a.final_state, "final_state", g);
  return g;
}

conv1d::Geometry check_bwd(const Context& ctx, const CausalConv1dBwdArgs& a) {
  ArgCheck c(kOp);
  const conv1d::Geometry g = check_inputs(ctx, a.x, a.weight, a.bias, a.initial_state, a.cu_seqlens);
  check_sequence_input(c, ctx, a.dy, "dy", a.x);
  if (a.d_final_state.defined()) {
    c.floating(a.d_final_state, "d_final_state").on_device(a.d_final_state, "d_final_state", ctx);
    c.shape(a.d_final_state, "d_final_state", {g.N, g.D, g.W}, "[N,D,W]");
    dense(c, a.d_final_state, "d_final_state");
  }
  c.same_shape(a.dx, "dx", a.x, "x").same_dtype(a.dx, "dx", a.x, "x").on_device(a.dx, "dx", ctx);
  dense(c, a.dx, "dx");
  if (a.dweight.defined()) {
    c.floating(a.dweight, "dweight").on_device(a.dweight, "dweight", ctx);
    c.shape(a.dweight, "dweight", {g.W, g.D}, "[W,D], as weight");
    dense(c, a.dweight, "dweight");
  }
  if (a.dbias.defined()) {
    c.value(a.bias.defined(), "dbias was given but bias was not");
    c.floating(a.dbias, "dbias").on_device(a.dbias, "dbias", ctx);
    c.shape(a.dbias, "dbias", {g.D}, "[D]");
    dense(c, a.dbias, "dbias");
  }
  if (a.d_initial_state.defined()) {
    c.value(a.initial_state.defined(), "d_initial_state was given but initial_state was not");
    check_state_output(c, ctx, a.d_initial_state, "d_initial_state", g);
  }
  const size_t need = causal_conv1d_bwd_workspace_size(ctx, a);
  if (need > 0) {
    c.workspace(a.workspace, ctx, static_cast<int64_t>(need), "causal_conv1d_bwd_workspace_size", 16);
  }
  return g;
}

}  // namespace

CausalConv1dActivation causal_conv1d_activation(const std::string& name) {
  if (name.empty()) return CausalConv1dActivation::kNone;
  if (name == "silu" || name == "swish") return CausalConv1dActivation::kSilu;
  FUSEDOPS_FAIL(kValue, kOp, "activation must be one of None, 'silu', 'swish', got '", name, "'");
}

size_t causal_conv1d_bwd_workspace_size(const Context& ctx, const CausalConv1dBwdArgs& a) {
  if (ctx.device.kind != DeviceKind::kCUDA || !a.x.defined() || a.x.ndim() < 3 ||
      !a.weight.defined() || a.weight.ndim() != 2)
    return 0;
  const conv1d::Geometry g = conv1d::geometry(a.x, a.weight, a.cu_seqlens);
  const int64_t rows = conv1d::cuda_bwd_partial_rows(g, a.dweight.defined(), a.dbias.defined());
  return static_cast<size_t>(conv1d::cuda_bwd_tiles(g) * rows * g.D) * sizeof(float);
}

void causal_conv1d_fwd(const Context& ctx, const CausalConv1dFwdArgs& args) {
  const conv1d::Geometry g = check_fwd(ctx, args);
  const bool state_out = args.final_state.defined() && args.final_state.numel() > 0;
  if (g.D == 0 || (args.y.numel() == 0 && !state_out)) return;
  dispatch(kOp, Direction::kForward, ctx, args.x.dtype(), args);
}

void causal_conv1d_bwd(const Context& ctx, const CausalConv1dBwdArgs& args) {
  const conv1d::Geometry g = check_bwd(ctx, args);
  auto some = [](const TensorView& t) { return t.defined() && t.numel() > 0; };
  if (g.D == 0 || (args.dx.numel() == 0 && !some(args.dweight) && !some(args.dbias) &&
                   !some(args.d_initial_state)))
    return;
  dispatch(kOp, Direction::kBackward, ctx, args.x.dtype(), args);
}

void causal_conv1d_fwd_ref(const Context& ctx, const CausalConv1dFwdArgs& args) {
  causal_conv1d_fwd(with_backend(ctx, "ref"), args);
}

void causal_conv1d_bwd_ref(const Context& ctx, const CausalConv1dBwdArgs& args) {
  causal_conv1d_bwd(with_backend(ctx, "ref"), args);
}

}  // namespace fusedops
