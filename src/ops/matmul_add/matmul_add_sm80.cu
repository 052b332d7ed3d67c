// matmul_add, CUDA backend (sm_80 and later): one cuBLASLt GEMM through src/cuda/gemm.h with
// beta = 1 and the fp32 main_grad as both C and D, so the accumulation happens in the GEMM's
// epilogue (no second pass over main_grad, no temporary product).
#include <cuda_runtime.h>

#include <cstdint>

#include "fusedops/core/registry.h"
#include "fusedops/ops/matmul_add.h"
#include "src/cuda/check.cuh"
#include "src/cuda/gemm.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "matmul_add";

bool supports(const MatmulAddFwdArgs& a) {
  const DType d = a.grad_output.dtype();
  return a.main_grad.dtype() == DType::kFloat32 &&
         (d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16);
}

// cuBLASLt picks algorithms assuming 256-byte aligned matrices unless told otherwise, which the
// shared GEMM wrapper does not do; a matrix that starts elsewhere is refused here rather than
// risking a launch failure (the Python layer passes aligned copies instead).
void require_aligned(const TensorView& t, const char* name) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(t.data());
  FUSEDOPS_REQUIRE(addr % 256 == 0, kValue, kOp, name,
                   " must start at a 256-byte aligned address for cuBLASLt, got one ",
                   addr % 256, " bytes past a 256-byte boundary (pass a fresh tensor)");
}

void fwd(const Context& ctx, const MatmulAddFwdArgs& a) {
  require_aligned(a.grad_output, "grad_output");
  require_aligned(a.input, "input");
  require_aligned(a.main_grad, "main_grad");
  cuda::GemmArgs g;
  // main_grad[O, I] (+)= grad_output[T, O]^T @ input[T, I]: A = grad_output transposed.
  g.trans_a = true;
  g.trans_b = false;
  g.M = a.grad_output.size(-1);
  g.N = a.input.size(-1);
  g.K = a.grad_output.rows();
  g.ab_type = a.grad_output.dtype();
  g.c_type = DType::kFloat32;
  g.alpha = 1.0f;
  g.beta = 1.0f;
  g.A = a.grad_output.data();
  g.lda = a.grad_output.rows() > 1 ? a.grad_output.row_stride() : g.M;
  g.B = a.input.data();
  g.ldb = a.input.rows() > 1 ? a.input.row_stride() : g.N;
  g.C = a.main_grad.data();
  g.ldc = g.N;
  // The workspace holds at least gemm_workspace_bytes() (checked); cuBLASLt is told exactly that
  // much so that its algorithm cache sees one size.
  cuda::gemm(kOp, g, a.workspace.data(), cuda::gemm_workspace_bytes(), ctx.stream,
             ctx.device.index);
}

}  // namespace

void register_matmul_add_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<MatmulAddFwdArgs>(kOp, Direction::kForward, spec, supports, fwd);
}

}  // namespace fusedops
