// clipped_swiglu, CPU backend: threads over rows, per row the halves are gathered into fp32
// buffers and the activation runs as branch-free loops the compiler vectorizes (a polynomial
// exp instead of the libm call, which would keep the loops scalar). fp32/bf16/fp16 in, fp32 math.
#include <cmath>
#include <cstring>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/clipped_swiglu.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"
#include "src/ops/clipped_swiglu/clipped_swiglu_common.h"

namespace fusedops {
namespace {

using clipped_swiglu::Rows2d;

// sigmoid and sigmoid_pair (s and 1 - s without cancellation): src/cpu/simd.h's, the CPU kernels'
// one exp underneath (sigmoid(-inf) = 0, so a * sigmoid(a) at a = -inf is NaN, as in the reference
// and torch; NaN stays NaN).
using cpu::sigmoid;
using cpu::sigmoid_pair;
inline float clamp_max(float v, float hi) { return v > hi ? hi : v; }
inline float clamp_both(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

struct Act {
  float alpha, limit, bias;
  int mode;
};

// Rows per task: about 32K outputs each.
int64_t grain(int64_t half) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(half, 1)); }

// Gathers row r's halves as floats.
template <class T>
void load_halves(const T* xr, const Rows2d& s, bool interleaved, float* A, float* B) {
  if (interleaved) {
    for (int64_t c = 0; c < s.half; ++c) {
      A[c] = to_float(xr[2 * c]);
      B[c] = to_float(xr[2 * c + 1]);
    }
  } else {
    cpu::load_float(xr, A, s.half);
    cpu::load_float(xr + s.half, B, s.half);
  }
}

void forward_row(const float* __restrict A, const float* __restrict B, float* __restrict y,
                 int64_t n, const Act& act) {
  const float lim = act.limit;
  if (act.mode == 0) {
    for (int64_t c = 0; c < n; ++c) {
      const float a = clamp_max(A[c], lim);
      const float b = clamp_both(B[c], -lim, lim);
      y[c] = a * sigmoid(act.alpha * a) * (b + act.bias);
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      const float q = clamp_max(A[c] * sigmoid(A[c]), lim);
      y[c] = q * clamp_both(B[c], -lim, lim);
    }
  }
}

// Overwrites A and B with dA and dB.
void backward_row(float* __restrict A, float* __restrict B, const float* __restrict dy, int64_t n,
                  const Act& act) {
  const float lim = act.limit;
  if (act.mode == 0) {
    for (int64_t c = 0; c < n; ++c) {
      const float av = A[c], bv = B[c];
      const float a = clamp_max(av, lim);
      const float b = clamp_both(bv, -lim, lim);
      float s, s1;
      sigmoid_pair(act.alpha * a, s, s1);
      const float ga = dy[c] * (b + act.bias) * (s + act.alpha * a * s * s1);
      const float gb = dy[c] * a * s;
      A[c] = av <= lim ? ga : 0.0f;
      B[c] = (bv >= -lim && bv <= lim) ? gb : 0.0f;
    }
  } else {
    for (int64_t c = 0; c < n; ++c) {
      const float av = A[c], bv = B[c];
      float sa, sa1;
      sigmoid_pair(av, sa, sa1);
      const float silu = av * sa;
      const float q = clamp_max(silu, lim);
      const float b = clamp_both(bv, -lim, lim);
      const float ga = dy[c] * b * sa * (1.0f + av * sa1);
      const float gb = dy[c] * q;
      A[c] = silu <= lim ? ga : 0.0f;
      B[c] = (bv >= -lim && bv <= lim) ? gb : 0.0f;
    }
  }
}

template <class T>
void fwd_typed(const ClippedSwigluFwdArgs& p, const Rows2d& s, int64_t m_eff, const Act& act) {
  const T* x = p.x.data_as<const T>();
  T* y = p.y.data_as<T>();
  cpu::parallel_for(0, s.M, grain(s.half), [&](int64_t r0, int64_t r1) {
    std::vector<float> A(s.half), B(s.half), out(s.half);
    for (int64_t r = r0; r < r1; ++r) {
      T* yr = y + r * s.half;
      if (r >= m_eff) {
        std::fill(out.begin(), out.end(), 0.0f);
      } else {
        load_halves(x + r * s.K, s, p.interleaved, A.data(), B.data());
        forward_row(A.data(), B.data(), out.data(), s.half, act);
      }
      cpu::store_float(out.data(), yr, s.half);
    }
  });
}

template <class T>
void bwd_typed(const ClippedSwigluBwdArgs& p, const Rows2d& s, int64_t m_eff, const Act& act) {
  const T* x = p.x.data_as<const T>();
  const T* dy = p.dy.data_as<const T>();
  T* dx = p.dx.data_as<T>();
  cpu::parallel_for(0, s.M, grain(s.half), [&](int64_t r0, int64_t r1) {
    std::vector<float> A(s.half), B(s.half), g(s.half);
    for (int64_t r = r0; r < r1; ++r) {
      T* dxr = dx + r * s.K;
      if (r >= m_eff) {
        std::fill(A.begin(), A.end(), 0.0f);
        std::fill(B.begin(), B.end(), 0.0f);
      } else {
        load_halves(x + r * s.K, s, p.interleaved, A.data(), B.data());
        cpu::load_float(dy + r * s.half, g.data(), s.half);
        backward_row(A.data(), B.data(), g.data(), s.half, act);
      }
      if (p.interleaved) {
        for (int64_t c = 0; c < s.half; ++c) {
          dxr[2 * c] = from_float<T>(A[c]);
          dxr[2 * c + 1] = from_float<T>(B[c]);
        }
      } else {
        cpu::store_float(A.data(), dxr, s.half);
        cpu::store_float(B.data(), dxr + s.half, s.half);
      }
    }
  });
}

void fwd(const Context& ctx, const ClippedSwigluFwdArgs& p) {
  const Rows2d s = clipped_swiglu::rows_2d(p.x, p.dim);
  const int64_t m_eff = clipped_swiglu::effective_rows_host(p.group_index, s.M);
  const Act act{static_cast<float>(p.alpha), static_cast<float>(p.limit),
                static_cast<float>(p.bias), p.clamp_mode};
  visit_float(p.x.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, double>) fwd_typed<T>(p, s, m_eff, act);
  });
}

void bwd(const Context& ctx, const ClippedSwigluBwdArgs& p) {
  const Rows2d s = clipped_swiglu::rows_2d(p.x, p.dim);
  const int64_t m_eff = clipped_swiglu::effective_rows_host(p.group_index, s.M);
  const Act act{static_cast<float>(p.alpha), static_cast<float>(p.limit),
                static_cast<float>(p.bias), p.clamp_mode};
  visit_float(p.x.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, double>) bwd_typed<T>(p, s, m_eff, act);
  });
}

}  // namespace

void register_clipped_swiglu_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<ClippedSwigluFwdArgs>("clipped_swiglu", Direction::kForward, spec, nullptr, fwd);
  r.add<ClippedSwigluBwdArgs>("clipped_swiglu", Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
