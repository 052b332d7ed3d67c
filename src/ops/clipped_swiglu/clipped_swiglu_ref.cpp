// clipped_swiglu, float64 reference: plain loops, the executable form of docs/specs/ops.md section 7.
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/ops/clipped_swiglu.h"
#include "src/core/ref_util.h"
#include "src/ops/clipped_swiglu/clipped_swiglu_common.h"

namespace fusedops {
namespace {

using clipped_swiglu::Rows2d;

const std::vector<DType> kAllFloat = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                      DType::kFloat64};

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
// torch.clamp semantics: NaN stays NaN.
double clamp_max(double v, double hi) { return v > hi ? hi : v; }
double clamp_both(double v, double lo, double hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Offsets of A[r, c] and B[r, c] in the flattened [M, K] x.
struct Positions {
  int64_t a, b;
};
Positions positions(const Rows2d& s, bool interleaved, int64_t r, int64_t c) {
  return interleaved ? Positions{r * s.K + 2 * c, r * s.K + 2 * c + 1}
                     : Positions{r * s.K + c, r * s.K + s.half + c};
}

void fwd(const Context& ctx, const ClippedSwigluFwdArgs& p) {
  const Rows2d s = clipped_swiglu::rows_2d(p.x, p.dim);
  const int64_t m_eff = clipped_swiglu::effective_rows_host(p.group_index, s.M);
  const double lim = p.limit;
  for (int64_t r = 0; r < s.M; ++r) {
    for (int64_t c = 0; c < s.half; ++c) {
      double y = 0.0;
      if (r < m_eff) {
        const Positions at = positions(s, p.interleaved, r, c);
        const double A = ref::load(p.x, at.a), B = ref::load(p.x, at.b);
        const double b = clamp_both(B, -lim, lim);
        if (p.clamp_mode == 0) {
          const double a = clamp_max(A, lim);
          y = a * sigmoid(p.alpha * a) * (b + p.bias);
        } else {
          y = clamp_max(A * sigmoid(A), lim) * b;
        }
      }
      ref::store(p.y, r * s.half + c, y);
    }
  }
}

void bwd(const Context& ctx, const ClippedSwigluBwdArgs& p) {
  const Rows2d s = clipped_swiglu::rows_2d(p.x, p.dim);
  const int64_t m_eff = clipped_swiglu::effective_rows_host(p.group_index, s.M);
  const double lim = p.limit;
  for (int64_t r = 0; r < s.M; ++r) {
    for (int64_t c = 0; c < s.half; ++c) {
      const Positions at = positions(s, p.interleaved, r, c);
      double dA = 0.0, dB = 0.0;
      if (r < m_eff) {
        const double A = ref::load(p.x, at.a), B = ref::load(p.x, at.b);
        const double dy = ref::load(p.dy, r * s.half + c);
        const double b = clamp_both(B, -lim, lim);
        const double b_pass = (B >= -lim && B <= lim) ? 1.0 : 0.0;
        // The chain rule through the forward's steps, in the order autograd takes them.
        if (p.clamp_mode == 0) {
          const double a = clamp_max(A, lim);
          const double sg = sigmoid(p.alpha * a);
          const double as = a * sg, bb = b + p.bias;  // y = as * bb
          const double d_as = dy * bb, d_bb = dy * as;
          const double d_t = d_as * a * (1.0 - sg) * sg;  // through sg = sigmoid(alpha*a)
          const double d_a = d_as * sg + d_t * p.alpha;
          dA = A <= lim ? d_a : 0.0;
          dB = b_pass ? d_bb : 0.0;
        } else {
          const double sA = sigmoid(A);
          const double silu = A * sA;
          const double q = clamp_max(silu, lim);  // y = q * b
          const double d_silu = silu <= lim ? dy * b : 0.0;
          dA = d_silu * sA + d_silu * A * (1.0 - sA) * sA;
          dB = b_pass ? dy * q : 0.0;
        }
      }
      ref::store(p.dx, at.a, dA);
      ref::store(p.dx, at.b, dB);
    }
  }
}

}  // namespace

void register_clipped_swiglu_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX, kAllFloat, kPriorityRef};
  r.add<ClippedSwigluFwdArgs>("clipped_swiglu", Direction::kForward, spec, nullptr, fwd);
  r.add<ClippedSwigluBwdArgs>("clipped_swiglu", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
