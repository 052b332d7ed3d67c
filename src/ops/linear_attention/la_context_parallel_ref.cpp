// Context-parallel folds, float64 reference: plain loops over the summaries (fp32 or fp64), the
// executable form of include/fusedops/ops/context_parallel.h; and the identity / zero fill of
// host memory (every float dtype, exact: the cpu backend registers the same function).
#include <algorithm>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/context_parallel.h"
#include "src/core/ref_util.h"
#include "src/ops/linear_attention/la_context_parallel.h"

namespace fusedops {
namespace {

using la_cp::Dims;

Dims dims_of(const TensorView& state) { return {state.size(0), state.size(1), state.size(2)}; }

void fold_fwd(const Context&, const LaCpFoldFwdArgs& a) {
  const Dims d = dims_of(a.state);
  const int64_t KV = d.K * d.V;
  std::vector<double> x(KV), y(KV);
  for (int64_t h = 0; h < d.HV; ++h) {
    for (int64_t e = 0; e < KV; ++e) x[e] = a.h0.defined() ? ref::load(a.h0, h * KV + e) : 0.0;
    for (int64_t j = a.lo; j < a.hi; ++j) {
      const int64_t base = j * d.size();
      for (int64_t i = 0; i < d.K; ++i)
        for (int64_t c = 0; c < d.V; ++c) {
          double s = ref::load(a.summaries, base + d.m_size() + h * KV + i * d.V + c);
          for (int64_t k = 0; k < d.K; ++k)
            s += ref::load(a.summaries, base + (h * d.K + i) * d.K + k) * x[k * d.V + c];
          y[i * d.V + c] = s;
        }
      x.swap(y);
    }
    for (int64_t e = 0; e < KV; ++e) ref::store(a.state, h * KV + e, x[e]);
  }
}

void fold_bwd(const Context&, const LaCpFoldBwdArgs& a) {
  const Dims d = dims_of(a.dstate);
  const int64_t KV = d.K * d.V;
  std::vector<double> x(KV), y(KV);
  for (int64_t h = 0; h < d.HV; ++h) {
    std::fill(x.begin(), x.end(), 0.0);
    for (int64_t j = a.hi - 1; j >= a.lo; --j) {
      const int64_t base = j * d.size();
      for (int64_t i = 0; i < d.K; ++i)
        for (int64_t c = 0; c < d.V; ++c) {
          double s = ref::load(a.dh0s, j * d.HV * KV + h * KV + i * d.V + c);
          for (int64_t k = 0; k < d.K; ++k)
            s += ref::load(a.summaries, base + (h * d.K + k) * d.K + i) * x[k * d.V + c];
          y[i * d.V + c] = s;
        }
      x.swap(y);
    }
    for (int64_t e = 0; e < KV; ++e) ref::store(a.dstate, h * KV + e, x[e]);
  }
}

}  // namespace

void la_cp::fill_host(const Context&, const la_cp::FillArgs& a) {
  const int64_t R = a.out.size(-2), C = a.out.size(-1), n = a.out.numel();
  visit_float(a.out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = a.out.data_as<T>();
    const T zero = ref::from_double<T>(0.0), diag = ref::from_double<T>(a.diag);
    for (int64_t e = 0; e < n; ++e) p[e] = zero;
    if (a.diag != 0.0)
      for (int64_t m = 0; m < n / (R * C); ++m)
        for (int64_t i = 0; i < std::min(R, C); ++i) p[m * R * C + i * C + i] = diag;
  });
}

void register_context_parallel_ref(Registry& r) {
  const std::vector<DType> all{DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};
  const BackendSpec ref{"ref", DeviceKind::kCPU, 0, INT_MAX, {DType::kFloat32, DType::kFloat64}, kPriorityRef};
  r.add<LaCpFoldFwdArgs>("la_cp_fold", Direction::kForward, ref, nullptr, fold_fwd);
  r.add<LaCpFoldBwdArgs>("la_cp_fold", Direction::kBackward, ref, nullptr, fold_bwd);
  r.add<la_cp::FillArgs>("la_cp_fill", Direction::kForward, {"ref", DeviceKind::kCPU, 0, INT_MAX, all, kPriorityRef},
                         nullptr, la_cp::fill_host);
}

}  // namespace fusedops
