// matmul_add: argument checks, then dispatch to the selected backend.
#include <string>

#include "fusedops/core/check.h"
#include "fusedops/core/registry.h"
#include "fusedops/ops/matmul_add.h"

#ifdef FUSEDOPS_WITH_CUDA
#include "src/cuda/gemm.h"
#endif

namespace fusedops {
namespace {

constexpr const char* kOp = "matmul_add";

std::string leading_string(const TensorView& t) {
  std::string s = "[";
  for (int d = 0; d + 1 < t.ndim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
  return s + ",*]";
}

// [..., D] operand: floating, on the device, rows addressable with non-overlapping rows.
void check_operand(const ArgCheck& c, const Context& ctx, const TensorView& t, const char* name) {
  c.min_rank(t, name, 2).floating(t, name).on_device(t, name, ctx);
  if (t.numel() == 0) return;  // addresses nothing (torch gives some empty tensors odd strides)
  c.rows_addressable(t, name);
  c.value(t.rows() <= 1 || t.row_stride() >= t.size(-1),
          std::string(name) + " rows must not overlap: row stride " + std::to_string(t.row_stride()) +
              " is below the row length " + std::to_string(t.size(-1)) + " (make it contiguous)");
}

void check_fwd(const Context& ctx, const MatmulAddFwdArgs& a) {
  ArgCheck c(kOp);
  check_operand(c, ctx, a.grad_output, "grad_output");
  check_operand(c, ctx, a.input, "input");
  c.same_dtype(a.input, "input", a.grad_output, "grad_output");
  bool same_lead = a.input.ndim() == a.grad_output.ndim();
  for (int d = 0; same_lead && d + 1 < a.input.ndim(); ++d)
    same_lead = a.input.size(d) == a.grad_output.size(d);
  c.value(same_lead, "input must have the leading dims of grad_output " +
                         leading_string(a.grad_output) + ", got " + a.input.shape_string());
  c.rank(a.main_grad, "main_grad", 2)
      .dtype_in(a.main_grad, "main_grad", {DType::kFloat32, DType::kFloat64})
      .on_device(a.main_grad, "main_grad", ctx)
      .shape(a.main_grad, "main_grad", {a.grad_output.size(-1), a.input.size(-1)},
             "[out, in] of grad_output [..., out] and input [..., in]");
  if (a.main_grad.numel() > 0) c.contiguous(a.main_grad, "main_grad");
  if (ctx.device.kind == DeviceKind::kCUDA) {
    c.workspace(a.workspace, ctx, static_cast<int64_t>(matmul_add_workspace_size(ctx)),
                "matmul_add_workspace_size");
  }
}

}  // namespace

size_t matmul_add_workspace_size(const Context& ctx) {
#ifdef FUSEDOPS_WITH_CUDA
  if (ctx.device.kind == DeviceKind::kCUDA) return cuda::gemm_workspace_bytes();
#endif
  return 0;
}

void matmul_add_fwd(const Context& ctx, const MatmulAddFwdArgs& args) {
  check_fwd(ctx, args);
  // No tokens adds nothing; an empty main_grad has nothing to add to.
  if (args.grad_output.rows() == 0 || args.main_grad.numel() == 0) return;
  dispatch(kOp, Direction::kForward, ctx, args.grad_output.dtype(), args);
}

void matmul_add_fwd_ref(const Context& ctx, const MatmulAddFwdArgs& args) {
  Context c = ctx;
  c.backend = "ref";
  matmul_add_fwd(c, args);
}

}  // namespace fusedops
