// matmul_add, CPU backend: one GEMM accumulating into main_grad (cpu::sgemm / cpu::bgemm, oneDNN's
// matmul with a sum post-op: fp32 sums, main_grad read and written once) straight on fp32 and bf16
// operands; fp16 operands are converted to fp32 a block of tokens at a time (never the whole
// tensors) and each block is accumulated with its own GEMM.
#include <algorithm>
#include <memory>

#include "fusedops/core/registry.h"
#include "fusedops/ops/matmul_add.h"
#include "src/core/visit.h"
#include "src/cpu/gemm.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"

namespace fusedops {
namespace {

// Tokens per converted block: the two fp32 blocks stay near 32 MiB, and each block's GEMM is
// deep enough (K >= 64) to run at full rate.
int64_t block_tokens(int64_t T, int64_t O, int64_t I) {
  constexpr int64_t kBudgetFloats = int64_t{8} << 20;
  const int64_t per_token = std::max<int64_t>(O + I, 1);
  return std::clamp<int64_t>(kBudgetFloats / per_token, 64, std::max<int64_t>(T, 1));
}

bool supports(const MatmulAddFwdArgs& a) {
  const DType d = a.grad_output.dtype();
  return a.main_grad.dtype() == DType::kFloat32 &&
         (d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16);
}

template <class T>
void run(const MatmulAddFwdArgs& a) {
  const int64_t tokens = a.grad_output.rows(), O = a.grad_output.size(-1), I = a.input.size(-1);
  const int64_t ldg = a.grad_output.row_stride(), ldx = a.input.row_stride();
  const T* g = a.grad_output.data_as<const T>();
  const T* x = a.input.data_as<const T>();
  float* C = a.main_grad.data_as<float>();
  if constexpr (std::is_same_v<T, float>) {
    // main_grad[O, I] += grad_output[T, O]^T @ input[T, I]
    cpu::sgemm(true, false, O, I, tokens, g, ldg, x, ldx, true, C, I);
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    cpu::bgemm(true, false, O, I, tokens, g, ldg, x, ldx, true, C, I);
  } else {
    const int64_t block = block_tokens(tokens, O, I);
    // Uninitialized: every element is written by the conversion before the GEMM reads it.
    std::unique_ptr<float[]> gb(new float[static_cast<size_t>(block * O)]);
    std::unique_ptr<float[]> xb(new float[static_cast<size_t>(block * I)]);
    for (int64_t t0 = 0; t0 < tokens; t0 += block) {
      const int64_t n = std::min(block, tokens - t0);
      // Threads only for blocks big enough to pay for waking them (the GEMM is the cost).
      const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 20) / std::max<int64_t>(O + I, 1));
      cpu::parallel_for(0, n, grain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          cpu::load_float(g + (t0 + r) * ldg, gb.get() + r * O, O);
          cpu::load_float(x + (t0 + r) * ldx, xb.get() + r * I, I);
        }
      });
      cpu::sgemm(true, false, O, I, n, gb.get(), O, xb.get(), I, true, C, I);
    }
  }
}

void fwd(const Context&, const MatmulAddFwdArgs& a) {
  switch (a.grad_output.dtype()) {
    case DType::kFloat32: run<float>(a); break;
    case DType::kBFloat16: run<bf16_t>(a); break;
    default: run<fp16_t>(a); break;
  }
}

}  // namespace

void register_matmul_add_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<MatmulAddFwdArgs>("matmul_add", Direction::kForward, spec, supports, fwd);
}

}  // namespace fusedops
