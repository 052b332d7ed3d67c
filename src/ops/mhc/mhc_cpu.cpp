// mhc_pre_bmm and mhc_post, CPU backend: threads over tokens; per token one pass over C in
// chunks that stay in L1 (each stream's chunk converted to fp32 once), fp32 math, reductions over
// C in 16 fixed lanes (reproducible for any thread count).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"

namespace fusedops {
namespace {

using cpu::kLanes;
constexpr int64_t kChunk = 512;  // channels per chunk

struct Dims {
  int64_t tokens, n, C;
};
Dims dims_of(const TensorView& x) {
  Dims d{1, x.size(-2), x.size(-1)};
  for (int i = 0; i + 2 < x.ndim(); ++i) d.tokens *= x.size(i);
  return d;
}

int64_t token_grain(const Dims& d) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, d.n * d.C));
}

// acc[l] += a[c] * b[c] over c in [0, len), lane l = c % kLanes (chunks start at multiples of
// kLanes, so the lane of a channel does not depend on the chunking).
inline void lane_dot(float* __restrict acc, const float* __restrict a, const float* __restrict b,
                     int64_t len) {
  int64_t c = 0;
  for (; c + kLanes <= len; c += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[c + l] * b[c + l];
  for (int l = 0; c + l < len; ++l) acc[l] += a[c + l] * b[c + l];
}

inline float lane_total(const float* acc) {
  float a[kLanes];
  std::copy(acc, acc + kLanes, a);
  return cpu::reduce_lanes(a);
}

using cpu::load8;
using cpu::splat;
using cpu::store8;
using cpu::v8f;

bool float_coeffs(DType d) { return d == DType::kFloat32; }
bool not_double(DType d) { return d != DType::kFloat64; }

// ---- mhc_pre_bmm -----------------------------------------------------------------------------

template <class TX, class TY>
void pre_fwd_typed(const MhcPreBmmFwdArgs& a) {
  const Dims d = dims_of(a.x);
  const int64_t rs = a.x.row_stride();
  const TX* x = a.x.data_as<const TX>();
  const float* h = a.h_pre.data_as<const float>();
  TY* y = a.y.data_as<TY>();
  cpu::parallel_for(0, d.tokens, token_grain(d), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      // 16 channels at a time, summed over the streams in two 8-float registers (in stream
      // order: y[c] = fma(h_{n-1}, x_{n-1}[c], ... fma(h0, x0[c], 0))), then stored.
      const TX* xt = x + t * d.n * rs;
      const float* ht = h + t * d.n;
      TY* yt = y + t * d.C;
      int64_t c0 = 0;
      for (; c0 + 16 <= d.C; c0 += 16) {
        v8f a0 = {}, a1 = {};
        for (int64_t i = 0; i < d.n; ++i) {
          float xb[16];
          const TX* xi = xt + i * rs + c0;
          for (int l = 0; l < 16; ++l) xb[l] = to_float(xi[l]);
          const v8f hv = splat(ht[i]);
          a0 += hv * load8(xb);
          a1 += hv * load8(xb + 8);
        }
        if constexpr (std::is_same_v<TY, float>) {
          store8(yt + c0, a0);
          store8(yt + c0 + 8, a1);
        } else {
          float ob[16];
          store8(ob, a0);
          store8(ob + 8, a1);
          cpu::store_float(ob, yt + c0, 16);
        }
      }
      for (; c0 < d.C; ++c0) {
        float acc = 0.0f;
        for (int64_t i = 0; i < d.n; ++i) acc += ht[i] * to_float(xt[i * rs + c0]);
        cpu::store_float(&acc, yt + c0, 1);
      }
    }
  });
}

template <class TX, class TD>
void pre_bwd_typed(const MhcPreBmmBwdArgs& a) {
  const Dims d = dims_of(a.x);
  const int64_t rs = d.C > 0 ? a.x.row_stride() : 0, drs = d.C > 0 ? a.dy.row_stride() : 0;
  const TX* x = a.x.data_as<const TX>();
  const TD* dy = a.dy.data_as<const TD>();
  const float* h = a.h_pre.data_as<const float>();
  float* dh = a.dh_pre.data_as<float>();
  TX* dx = a.dx.data_as<TX>();
  cpu::parallel_for(0, d.tokens, token_grain(d), [&](int64_t t0, int64_t t1) {
    std::vector<float> xf(kChunk), dyf(kChunk), out(kChunk), acc(d.n * kLanes);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t c0 = 0; c0 < d.C; c0 += kChunk) {
        const int64_t len = std::min(kChunk, d.C - c0);
        const float* g = cpu::as_float(dy + t * drs + c0, dyf.data(), len);
        for (int64_t i = 0; i < d.n; ++i) {
          const float hi = h[t * d.n + i];
          const float* xi = cpu::as_float(x + (t * d.n + i) * rs + c0, xf.data(), len);
          lane_dot(&acc[i * kLanes], xi, g, len);
          for (int64_t c = 0; c < len; ++c) out[c] = hi * g[c];
          cpu::store_float(out.data(), dx + (t * d.n + i) * d.C + c0, len);
        }
      }
      for (int64_t i = 0; i < d.n; ++i) dh[t * d.n + i] = lane_total(&acc[i * kLanes]);
    }
  });
}

bool pre_supports_fwd(const MhcPreBmmFwdArgs& a) {
  return float_coeffs(a.h_pre.dtype()) && not_double(a.y.dtype());
}
bool pre_supports_bwd(const MhcPreBmmBwdArgs& a) {
  return float_coeffs(a.h_pre.dtype()) && not_double(a.dy.dtype());
}

void pre_fwd(const Context&, const MhcPreBmmFwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto tx) {
    visit_float(a.y.dtype(), [&](auto ty) { pre_fwd_typed<decltype(tx), decltype(ty)>(a); });
  });
}

void pre_bwd(const Context&, const MhcPreBmmBwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto tx) {
    visit_float(a.dy.dtype(), [&](auto td) { pre_bwd_typed<decltype(tx), decltype(td)>(a); });
  });
}

// ---- mhc_post --------------------------------------------------------------------------------

template <class T>
void post_fwd_typed(const MhcPostFwdArgs& a) {
  const Dims d = dims_of(a.x);
  const int64_t n = d.n, rs = a.x.row_stride(), ors = a.h_out.row_stride();
  const T* x = a.x.data_as<const T>();
  const T* ho = a.h_out.data_as<const T>();
  const float* hres = a.h_res.data_as<const float>();
  const float* hpost = a.h_post.data_as<const float>();
  T* out = a.out.data_as<T>();
  cpu::parallel_for(0, d.tokens, token_grain(d), [&](int64_t t0, int64_t t1) {
    std::vector<float> xf(n * kChunk), hf(kChunk), acc(kChunk);
    for (int64_t t = t0; t < t1; ++t) {
      const float* hr = hres + t * n * n;
      for (int64_t c0 = 0; c0 < d.C; c0 += kChunk) {
        const int64_t len = std::min(kChunk, d.C - c0);
        for (int64_t j = 0; j < n; ++j)
          cpu::load_float(x + (t * n + j) * rs + c0, &xf[j * kChunk], len);
        cpu::load_float(ho + t * ors + c0, hf.data(), len);
        for (int64_t k = 0; k < n; ++k) {
          const float p = hpost[t * n + k];
          for (int64_t c = 0; c < len; ++c) acc[c] = p * hf[c];
          for (int64_t j = 0; j < n; ++j) {
            const float w = hr[j * n + k];
            const float* xj = &xf[j * kChunk];
            for (int64_t c = 0; c < len; ++c) acc[c] += w * xj[c];
          }
          cpu::store_float(acc.data(), out + (t * n + k) * d.C + c0, len);
        }
      }
    }
  });
}

template <class T>
void post_bwd_typed(const MhcPostBwdArgs& a) {
  const Dims d = dims_of(a.x);
  const bool any = d.C > 0;
  const int64_t n = d.n;
  const int64_t rs = any ? a.x.row_stride() : 0, ors = any ? a.h_out.row_stride() : 0;
  const int64_t drs = any ? a.dy.row_stride() : 0;
  const T* x = a.x.data_as<const T>();
  const T* ho = a.h_out.data_as<const T>();
  const T* dy = a.dy.data_as<const T>();
  const float* hres = a.h_res.data_as<const float>();
  const float* hpost = a.h_post.data_as<const float>();
  T* dx = a.dx.data_as<T>();
  T* dho = a.dh_out.data_as<T>();
  float* dhres = a.dh_res.data_as<float>();
  float* dhpost = a.dh_post.data_as<float>();
  cpu::parallel_for(0, d.tokens, token_grain(d), [&](int64_t t0, int64_t t1) {
    std::vector<float> xf(n * kChunk), gf(n * kChunk), hf(kChunk), acc(kChunk);
    std::vector<float> lres(n * n * kLanes), lpost(n * kLanes);
    for (int64_t t = t0; t < t1; ++t) {
      const float* hr = hres + t * n * n;
      std::fill(lres.begin(), lres.end(), 0.0f);
      std::fill(lpost.begin(), lpost.end(), 0.0f);
      for (int64_t c0 = 0; c0 < d.C; c0 += kChunk) {
        const int64_t len = std::min(kChunk, d.C - c0);
        for (int64_t j = 0; j < n; ++j) {
          cpu::load_float(x + (t * n + j) * rs + c0, &xf[j * kChunk], len);
          cpu::load_float(dy + (t * n + j) * drs + c0, &gf[j * kChunk], len);
        }
        cpu::load_float(ho + t * ors + c0, hf.data(), len);
        // dh_out = sum_k h_post[k] dy_k
        std::fill(acc.begin(), acc.begin() + len, 0.0f);
        for (int64_t k = 0; k < n; ++k) {
          const float p = hpost[t * n + k];
          const float* g = &gf[k * kChunk];
          for (int64_t c = 0; c < len; ++c) acc[c] += p * g[c];
          lane_dot(&lpost[k * kLanes], hf.data(), g, len);
        }
        cpu::store_float(acc.data(), dho + t * d.C + c0, len);
        // dx_j = sum_k h_res[j, k] dy_k;  dh_res[j, k] += <x_j, dy_k>
        for (int64_t j = 0; j < n; ++j) {
          std::fill(acc.begin(), acc.begin() + len, 0.0f);
          for (int64_t k = 0; k < n; ++k) {
            const float w = hr[j * n + k];
            const float* g = &gf[k * kChunk];
            for (int64_t c = 0; c < len; ++c) acc[c] += w * g[c];
            lane_dot(&lres[(j * n + k) * kLanes], &xf[j * kChunk], g, len);
          }
          cpu::store_float(acc.data(), dx + (t * n + j) * d.C + c0, len);
        }
      }
      for (int64_t k = 0; k < n; ++k) dhpost[t * n + k] = lane_total(&lpost[k * kLanes]);
      for (int64_t e = 0; e < n * n; ++e) dhres[t * n * n + e] = lane_total(&lres[e * kLanes]);
    }
  });
}

bool post_supports_fwd(const MhcPostFwdArgs& a) { return float_coeffs(a.h_res.dtype()); }
bool post_supports_bwd(const MhcPostBwdArgs& a) { return float_coeffs(a.h_res.dtype()); }

void post_fwd(const Context&, const MhcPostFwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto t) { post_fwd_typed<decltype(t)>(a); });
}

void post_bwd(const Context&, const MhcPostBwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto t) { post_bwd_typed<decltype(t)>(a); });
}

}  // namespace

void register_mhc_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<MhcPreBmmFwdArgs>("mhc_pre_bmm", Direction::kForward, spec, pre_supports_fwd, pre_fwd);
  r.add<MhcPreBmmBwdArgs>("mhc_pre_bmm", Direction::kBackward, spec, pre_supports_bwd, pre_bwd);
  r.add<MhcPostFwdArgs>("mhc_post", Direction::kForward, spec, post_supports_fwd, post_fwd);
  r.add<MhcPostBwdArgs>("mhc_post", Direction::kBackward, spec, post_supports_bwd, post_bwd);
}

}  // namespace fusedops
