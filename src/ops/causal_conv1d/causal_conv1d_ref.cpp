// causal_conv1d, float64 reference: plain loops, the executable form of docs/specs/ops.md section 4.
#include <cmath>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/causal_conv1d.h"
#include "src/core/ref_util.h"
#include "src/ops/causal_conv1d/causal_conv1d_common.h"

namespace fusedops {
namespace {

using conv1d::Geometry;
using conv1d::Span;

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

// Element (b, t, d) of a [B, T, D...] view with dense channels.
struct SeqView {
  TensorView t;
  int64_t sb = 0, st = 0;
  explicit SeqView(const TensorView& v) : t(v) {
    if (v.defined()) {
      sb = conv1d::batch_stride(v);
      st = conv1d::time_stride(v);
    }
  }
  double load(int64_t b, int64_t i, int64_t d) const { return ref::load(t, b * sb + i * st + d); }
  void store(int64_t b, int64_t i, int64_t d, double v) const {
    ref::store(t, b * sb + i * st + d, v);
  }
};

double weight_at(const TensorView& w, int64_t k, int64_t d) {
  return ref::load(w, k * w.stride(0) + d * w.stride(1));
}

// The extended input x~[tau] of sequence n, channel d: x for 0 <= tau < L, the initial state
// (or 0) for -W <= tau < 0.
struct Extended {
  const SeqView& x;
  const TensorView& h0;
  Span s;
  int64_t n, D, W;
  double operator()(int64_t d, int64_t tau) const {
    if (tau >= 0) return x.load(s.batch, s.begin + tau, d);
    if (!h0.defined()) return 0.0;
    return ref::load(h0, (n * D + d) * W + tau + W);
  }
};

double preact(const Extended& xt, const TensorView& w, const TensorView& bias, int64_t d,
              int64_t t) {
  double a = bias.defined() ? ref::load(bias, d) : 0.0;
  for (int64_t k = 0; k < xt.W; ++k) a += weight_at(w, k, d) * xt(d, t - (xt.W - 1) + k);
  return a;
}

void fwd(const Context&, const CausalConv1dFwdArgs& a) {
  const Geometry g = conv1d::geometry(a.x, a.weight, a.cu_seqlens);
  const bool silu = a.activation == CausalConv1dActivation::kSilu;
  const SeqView x(a.x), r(a.residual), y(a.y);
  for (int64_t n = 0; n < g.N; ++n) {
    const Span s = conv1d::host_span(g, a.cu_seqlens, n);
    const int64_t L = s.end - s.begin;
    const Extended xt{x, a.initial_state, s, n, g.D, g.W};
    for (int64_t d = 0; d < g.D; ++d) {
      for (int64_t t = 0; t < L; ++t) {
        const double pre = preact(xt, a.weight, a.bias, d, t);
        double out = silu ? pre * sigmoid(pre) : pre;
        if (a.residual.defined()) out += r.load(s.batch, s.begin + t, d);
        // y is contiguous: batch stride T*D, time stride D.
        ref::store(a.y, (s.batch * g.T + s.begin + t) * g.D + d, out);
      }
      if (a.final_state.defined())
        for (int64_t j = 0; j < g.W; ++j)
          ref::store(a.final_state, (n * g.D + d) * g.W + j, xt(d, L - g.W + j));
    }
  }
}

void bwd(const Context&, const CausalConv1dBwdArgs& a) {
  const Geometry g = conv1d::geometry(a.x, a.weight, a.cu_seqlens);
  const bool silu = a.activation == CausalConv1dActivation::kSilu;
  const SeqView x(a.x), dy(a.dy);
  std::vector<double> dw(g.W * g.D, 0.0), db(g.D, 0.0);
  std::vector<double> gbuf, dxbuf;
  for (int64_t n = 0; n < g.N; ++n) {
    const Span s = conv1d::host_span(g, a.cu_seqlens, n);
    const int64_t L = s.end - s.begin;
    const Extended xt{x, a.initial_state, s, n, g.D, g.W};
    gbuf.assign(L, 0.0);
    dxbuf.assign(L, 0.0);
    for (int64_t d = 0; d < g.D; ++d) {
      auto dht = [&](int64_t j) {
        return a.d_final_state.defined() ? ref::load(a.d_final_state, (n * g.D + d) * g.W + j) : 0.0;
      };
      for (int64_t t = 0; t < L; ++t) {
        const double pre = preact(xt, a.weight, a.bias, d, t);
        double deriv = 1.0;
        if (silu) {
          const double sg = sigmoid(pre);
          deriv = sg * (1.0 + pre * (1.0 - sg));
        }
        gbuf[t] = dy.load(s.batch, s.begin + t, d) * deriv;
      }
      for (int64_t tau = 0; tau < L; ++tau) {
        double v = 0.0;
        for (int64_t k = 0; k < g.W; ++k) {
          const int64_t t = tau + g.W - 1 - k;
          if (t < L) v += weight_at(a.weight, k, d) * gbuf[t];
        }
        if (tau >= L - g.W) v += dht(tau - L + g.W);
        ref::store(a.dx, (s.batch * g.T + s.begin + tau) * g.D + d, v);
      }
      for (int64_t t = 0; t < L; ++t) {
        db[d] += gbuf[t];
        for (int64_t k = 0; k < g.W; ++k) dw[k * g.D + d] += gbuf[t] * xt(d, t - (g.W - 1) + k);
      }
      if (a.d_initial_state.defined()) {
        for (int64_t sl = 0; sl < g.W; ++sl) {
          double v = 0.0;
          for (int64_t t = 0; t < std::min(sl, L); ++t)
            v += weight_at(a.weight, sl - 1 - t, d) * gbuf[t];
          if (sl >= L) v += dht(sl - L);
          ref::store(a.d_initial_state, (n * g.D + d) * g.W + sl, v);
        }
      }
    }
  }
  if (a.dweight.defined())
    for (int64_t i = 0; i < g.W * g.D; ++i) ref::store(a.dweight, i, dw[i]);
  if (a.dbias.defined())
    for (int64_t d = 0; d < g.D; ++d) ref::store(a.dbias, d, db[d]);
}

}  // namespace

void register_causal_conv1d_ref(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64},
                   kPriorityRef};
  r.add<CausalConv1dFwdArgs>("causal_conv1d", Direction::kForward, spec, nullptr, fwd);
  r.add<CausalConv1dBwdArgs>("causal_conv1d", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
