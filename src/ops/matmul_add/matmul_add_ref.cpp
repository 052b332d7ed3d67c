// matmul_add, float64 reference: plain loops, main_grad[o,i] += sum_t grad_output[t,o]*input[t,i].
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/matmul_add.h"
#include "src/core/ref_util.h"

namespace fusedops {
namespace {

void fwd(const Context&, const MatmulAddFwdArgs& a) {
  const int64_t T = a.grad_output.rows(), O = a.grad_output.size(-1), I = a.input.size(-1);
  std::vector<std::vector<double>> g(T), x(T);
  for (int64_t t = 0; t < T; ++t) {
    g[t] = ref::load_row(a.grad_output, t);
    x[t] = ref::load_row(a.input, t);
  }
  for (int64_t o = 0; o < O; ++o) {
    for (int64_t i = 0; i < I; ++i) {
      double acc = 0;
      for (int64_t t = 0; t < T; ++t) acc += g[t][o] * x[t][i];
      ref::store(a.main_grad, o * I + i, ref::load(a.main_grad, o * I + i) + acc);
    }
  }
}

}  // namespace

void register_matmul_add_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64},
                   kPriorityRef};
  r.add<MatmulAddFwdArgs>("matmul_add", Direction::kForward, spec, nullptr, fwd);
}

}  // namespace fusedops
