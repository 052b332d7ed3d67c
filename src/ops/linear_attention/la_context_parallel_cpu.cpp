// Context-parallel folds, CPU backend: fp32 state updates X = M X + S (forward) and
// X = M^T X + L (backward), one value head per task, the sums over the key channels in a fixed
// order (the same result for any thread count).
#include <algorithm>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/context_parallel.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/ops/linear_attention/la_context_parallel.h"

namespace fusedops {
namespace {

using la_cp::Dims;

Dims dims_of(const TensorView& state) { return {state.size(0), state.size(1), state.size(2)}; }

// y[i,:] = add[i,:] + sum_k a(i,k) x[k,:]  for i < K, rows of V values; a(i,k) = m[i*K+k], or
// m[k*K+i] when transposed. k runs in order for every element.
void affine(const float* m, bool transposed, const float* x, const float* add, float* y, int64_t K,
            int64_t V) {
  for (int64_t i = 0; i < K; ++i) {
    float* yi = y + i * V;
    std::copy(add + i * V, add + (i + 1) * V, yi);
    for (int64_t k = 0; k < K; ++k) {
      const float a = transposed ? m[k * K + i] : m[i * K + k];
      const float* xk = x + k * V;
      for (int64_t c = 0; c < V; ++c) yi[c] += a * xk[c];
    }
  }
}

void fold_fwd(const Context&, const LaCpFoldFwdArgs& a) {
  const Dims d = dims_of(a.state);
  const int64_t KV = d.K * d.V;
  const float* sum = a.summaries.data_as<const float>();
  float* out = a.state.data_as<float>();
  cpu::parallel_for(0, d.HV, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> x(KV), y(KV);
    for (int64_t h = h0; h < h1; ++h) {
      if (a.h0.defined()) {
        visit_float(a.h0.dtype(), [&](auto tag) {
          using T = decltype(tag);
          const T* p = a.h0.data_as<const T>() + h * KV;
          for (int64_t e = 0; e < KV; ++e) x[e] = to_float(p[e]);
        });
      } else {
        std::fill(x.begin(), x.end(), 0.0f);
      }
      for (int64_t j = a.lo; j < a.hi; ++j) {
        const float* base = sum + j * d.size();
        affine(base + h * d.K * d.K, false, x.data(), base + d.m_size() + h * KV, y.data(), d.K, d.V);
        x.swap(y);
      }
      std::copy(x.begin(), x.end(), out + h * KV);
    }
  });
}

void fold_bwd(const Context&, const LaCpFoldBwdArgs& a) {
  const Dims d = dims_of(a.dstate);
  const int64_t KV = d.K * d.V;
  const float* sum = a.summaries.data_as<const float>();
  const float* L = a.dh0s.data_as<const float>();
  float* out = a.dstate.data_as<float>();
  cpu::parallel_for(0, d.HV, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> x(KV), y(KV);
    for (int64_t h = h0; h < h1; ++h) {
      std::fill(x.begin(), x.end(), 0.0f);
      for (int64_t j = a.hi - 1; j >= a.lo; --j) {
        affine(sum + j * d.size() + h * d.K * d.K, true, x.data(), L + j * d.HV * KV + h * KV, y.data(), d.K,
               d.V);
        x.swap(y);
      }
      std::copy(x.begin(), x.end(), out + h * KV);
    }
  });
}

}  // namespace

void register_context_parallel_cpu(Registry& r) {
  const BackendSpec cpu{"cpu", DeviceKind::kCPU, 0, INT_MAX, {DType::kFloat32}, kPriorityCpu};
  r.add<LaCpFoldFwdArgs>("la_cp_fold", Direction::kForward, cpu, nullptr, fold_fwd);
  r.add<LaCpFoldBwdArgs>("la_cp_fold", Direction::kBackward, cpu, nullptr, fold_bwd);
  r.add<la_cp::FillArgs>("la_cp_fill", Direction::kForward,
                         {"cpu", DeviceKind::kCPU, 0, INT_MAX,
                          {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}, kPriorityCpu},
                         nullptr, la_cp::fill_host);
}

}  // namespace fusedops
