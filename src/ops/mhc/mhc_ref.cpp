// mhc_pre_bmm and mhc_post, float64 reference: plain loops over tokens, streams and channels,
// the executable form of docs/specs/ops.md 9.2 and 9.3.
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/core/ref_util.h"

namespace fusedops {
namespace {

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

struct Dims {
  int64_t tokens, n, C;
};
Dims dims_of(const TensorView& x) {
  Dims d{1, x.size(-2), x.size(-1)};
  for (int i = 0; i + 2 < x.ndim(); ++i) d.tokens *= x.size(i);
  return d;
}

void pre_fwd(const Context&, const MhcPreBmmFwdArgs& a) {
  const Dims d = dims_of(a.x);
  const int64_t rs = a.x.row_stride();
  for (int64_t t = 0; t < d.tokens; ++t)
    for (int64_t c = 0; c < d.C; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < d.n; ++i)
        acc += ref::load(a.h_pre, t * d.n + i) * ref::load(a.x, (t * d.n + i) * rs + c);
      ref::store(a.y, t * d.C + c, acc);
    }
}

void pre_bwd(const Context&, const MhcPreBmmBwdArgs& a) {
  const Dims d = dims_of(a.x);
  const int64_t rs = d.C > 0 ? a.x.row_stride() : 0, drs = d.C > 0 ? a.dy.row_stride() : 0;
  for (int64_t t = 0; t < d.tokens; ++t)
    for (int64_t i = 0; i < d.n; ++i) {
      const double h = ref::load(a.h_pre, t * d.n + i);
      double dh = 0;
      for (int64_t c = 0; c < d.C; ++c) {
        const double dy = ref::load(a.dy, t * drs + c);
        dh += ref::load(a.x, (t * d.n + i) * rs + c) * dy;
        ref::store(a.dx, (t * d.n + i) * d.C + c, h * dy);
      }
      ref::store(a.dh_pre, t * d.n + i, dh);
    }
}

void post_fwd(const Context&, const MhcPostFwdArgs& a) {
  const Dims d = dims_of(a.x);
  const int64_t rs = a.x.row_stride(), ors = a.h_out.row_stride();
  const int64_t n = d.n;
  for (int64_t t = 0; t < d.tokens; ++t)
    for (int64_t k = 0; k < n; ++k)
      for (int64_t c = 0; c < d.C; ++c) {
        double acc = ref::load(a.h_post, t * n + k) * ref::load(a.h_out, t * ors + c);
        for (int64_t j = 0; j < n; ++j)
          acc += ref::load(a.h_res, (t * n + j) * n + k) * ref::load(a.x, (t * n + j) * rs + c);
        ref::store(a.out, (t * n + k) * d.C + c, acc);
      }
}

void post_bwd(const Context&, const MhcPostBwdArgs& a) {
  const Dims d = dims_of(a.x);
  const bool any = d.C > 0;
  const int64_t rs = any ? a.x.row_stride() : 0, ors = any ? a.h_out.row_stride() : 0;
  const int64_t drs = any ? a.dy.row_stride() : 0;
  const int64_t n = d.n;
  auto dy = [&](int64_t t, int64_t k, int64_t c) { return ref::load(a.dy, (t * n + k) * drs + c); };
  for (int64_t t = 0; t < d.tokens; ++t) {
    for (int64_t c = 0; c < d.C; ++c) {
      double dho = 0;
      for (int64_t k = 0; k < n; ++k) dho += ref::load(a.h_post, t * n + k) * dy(t, k, c);
      ref::store(a.dh_out, t * d.C + c, dho);
      for (int64_t j = 0; j < n; ++j) {
        double dx = 0;
        for (int64_t k = 0; k < n; ++k) dx += ref::load(a.h_res, (t * n + j) * n + k) * dy(t, k, c);
        ref::store(a.dx, (t * n + j) * d.C + c, dx);
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      double dhp = 0;
      for (int64_t c = 0; c < d.C; ++c) dhp += ref::load(a.h_out, t * ors + c) * dy(t, k, c);
      ref::store(a.dh_post, t * n + k, dhp);
    }
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < n; ++k) {
        double dhr = 0;
        for (int64_t c = 0; c < d.C; ++c) dhr += ref::load(a.x, (t * n + j) * rs + c) * dy(t, k, c);
        ref::store(a.dh_res, (t * n + j) * n + k, dhr);
      }
  }
}

}  // namespace

void register_mhc_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<MhcPreBmmFwdArgs>("mhc_pre_bmm", Direction::kForward, spec, nullptr, pre_fwd);
  r.add<MhcPreBmmBwdArgs>("mhc_pre_bmm", Direction::kBackward, spec, nullptr, pre_bwd);
  r.add<MhcPostFwdArgs>("mhc_post", Direction::kForward, spec, nullptr, post_fwd);
  r.add<MhcPostBwdArgs>("mhc_post", Direction::kBackward, spec, nullptr, post_bwd);
}

}  // namespace fusedops
