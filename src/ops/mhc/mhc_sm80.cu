// mhc_pre_bmm and mhc_post, generic CUDA backend (sm_80 and later). Memory-bound stream mixing:
// a group of `tpr` threads (a power of two <= 32) owns one token and walks its C channels in
// units of one 16-byte vector of x (8 channels for 16-bit x, 4 for fp32), so every stream of the
// token is read once and every output written once. Reductions over C (the per-token weight
// gradients) are per-thread partial sums in a fixed order, then a shuffle butterfly within the
// group: bitwise reproducible, no atomics, no cross-token reduction.
//
// n = 4 (DeepSeek-V4, MindSpeed) is a compile-time fast path with everything unrolled and all
// coefficients of the token in registers; other n run the same kernels with a runtime n, handling
// streams in chunks of 4 (the post backward in several passes whose repeated reads hit L2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "fusedops/core/registry.h"
#include "fusedops/ops/mhc.h"
#include "src/cuda/check.cuh"
#include "src/cuda/reduce.cuh"
#include "src/cuda/vec.cuh"

namespace fusedops {
namespace {

using cuda::from_f;
using cuda::to_f;

constexpr int kThreads = 256;
constexpr int kChunkN = 4;  // streams handled together in the runtime-n paths

struct MhcParams {
  const void* x;
  int64_t x_rs;  // elements between consecutive streams of x (token stride = n * x_rs)
  const void* h_out;
  int64_t ho_rs;
  const void* dy;
  int64_t dy_rs;  // mhc_post: between streams of dy; mhc_pre_bmm: between tokens of dy
  const float* h_pre;
  const float* h_res;
  const float* h_post;
  void* y;       // mhc_pre_bmm y / mhc_post out (contiguous)
  void* dx;      // contiguous like x
  void* dh_out;  // contiguous [tokens, C]
  float* dh_pre;
  float* dh_res;
  float* dh_post;
  int64_t tokens;
  int64_t C;
  int n;
  int tpr;
};

// V consecutive elements at p as floats; p must be aligned to min(16, V * sizeof(T)) bytes.
// 16-byte units move as one LDG/STG.128 (a Pack<T, N> or uint4 store was split into 32-bit and
// 16-bit stores for all but the first stream, costing mhc_post a large part of its bandwidth).
template <int V, class T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[V]) {
  constexpr int M = (V * static_cast<int>(sizeof(T)) > 16) ? 16 / static_cast<int>(sizeof(T)) : V;
#pragma unroll
  for (int k = 0; k < V / M; ++k) {
    float t[M];
    if constexpr (M * sizeof(T) == 16) {
      cuda::raw_to_floats<T>(cuda::load_raw16(p + k * M), t);
    } else {
      cuda::load_floats<M>(p + k * M, t);
    }
#pragma unroll
    for (int e = 0; e < M; ++e) out[k * M + e] = t[e];
  }
}

template <int V, class T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[V]) {
  constexpr int M = (V * static_cast<int>(sizeof(T)) > 16) ? 16 / static_cast<int>(sizeof(T)) : V;
#pragma unroll
  for (int k = 0; k < V / M; ++k) {
    float t[M];
#pragma unroll
    for (int e = 0; e < M; ++e) t[e] = in[k * M + e];
    if constexpr (M * sizeof(T) == 16) {
      cuda::store_global<T, M>(p + k * M, t);
    } else {
      cuda::store_floats<M>(p + k * M, t);
    }
  }
}

// V elements of T as loaded: raw 16 bytes for a 16-byte unit (converted at use, so that two
// units in flight cost 4 registers per 16 bytes), else floats.
template <class T, int V, bool kRaw = V * sizeof(T) == 16>
struct Unit {
  float v[V];
  __device__ __forceinline__ void load(const T* p) { load_vec<V>(p, v); }
  __device__ __forceinline__ void get(float (&out)[V]) const {
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = v[e];
  }
};
template <class T, int V>
struct Unit<T, V, true> {
  uint4 raw;
  __device__ __forceinline__ void load(const T* p) { raw = cuda::load_raw16(p); }
  __device__ __forceinline__ void get(float (&out)[V]) const { cuda::raw_to_floats<T>(raw, out); }
};

template <int V>
__device__ __forceinline__ float dot_vec(const float (&a)[V], const float (&b)[V]) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < V; ++e) s += a[e] * b[e];
  return s;
}

struct Lane {
  int64_t token;
  int lane;
  bool active;
};

__device__ __forceinline__ Lane lane_of(const MhcParams& p) {
  Lane l;
  l.lane = threadIdx.x & (p.tpr - 1);
  l.token = static_cast<int64_t>(blockIdx.x) * (blockDim.x / p.tpr) + threadIdx.x / p.tpr;
  l.active = l.token < p.tokens;
  return l;
}

// ---- mhc_pre_bmm -----------------------------------------------------------------------------

// y[t, c] = sum_i h[t, i] x[t, i, c]. With kN > 0, kU units per lane per step (all kU * kN
// loads issued before the first store).
template <class TX, class TY, int kN, int V, int kU = 1>
__global__ void __launch_bounds__(kThreads) pre_fwd_kernel(MhcParams p) {
  const Lane l = lane_of(p);
  if (!l.active) return;  // no collective operations below
  const int n = kN > 0 ? kN : p.n;
  const TX* x = static_cast<const TX*>(p.x) + l.token * n * p.x_rs;
  const float* h = p.h_pre + l.token * n;
  TY* y = static_cast<TY*>(p.y) + l.token * p.C;
  const int64_t units = p.C / V;
  float hv[kN > 0 ? kN : 1];
  if constexpr (kN > 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) hv[i] = h[i];
  }
  if constexpr (kN > 0 && kU > 1) {
    for (int64_t u0 = l.lane; u0 < units; u0 += kU * p.tpr) {
      float xv[kU][kN][V];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const int64_t u = u0 + j * p.tpr;
        if (u < units) {
#pragma unroll
          for (int i = 0; i < kN; ++i) load_vec<V>(x + i * p.x_rs + u * V, xv[j][i]);
        }
      }
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const int64_t u = u0 + j * p.tpr;
        if (u < units) {
          float acc[V];
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] = 0.0f;
#pragma unroll
          for (int i = 0; i < kN; ++i)
#pragma unroll
            for (int e = 0; e < V; ++e) acc[e] += hv[i] * xv[j][i][e];
          store_vec<V>(y + u * V, acc);
        }
      }
    }
  } else {
    for (int64_t u = l.lane; u < units; u += p.tpr) {
      float acc[V];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] = 0.0f;
      if constexpr (kN > 0) {
        float xv[kN][V];
#pragma unroll
        for (int i = 0; i < kN; ++i) load_vec<V>(x + i * p.x_rs + u * V, xv[i]);
#pragma unroll
        for (int i = 0; i < kN; ++i)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] += hv[i] * xv[i][e];
      } else {
#pragma unroll 4
        for (int i = 0; i < n; ++i) {
          float xv[V];
          load_vec<V>(x + i * p.x_rs + u * V, xv);
          const float hi = h[i];
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] += hi * xv[e];
        }
      }
      store_vec<V>(y + u * V, acc);
    }
  }
}

// dx[t, i, c] = h[t, i] dy[t, c];  dh[t, i] = sum_c x[t, i, c] dy[t, c]. Streams in chunks of 4
// (one chunk for n <= 4): dy is read once per chunk.
template <class TX, class TD, int kN, int V>
__global__ void __launch_bounds__(kThreads) pre_bwd_kernel(MhcParams p) {
  const Lane l = lane_of(p);
  const int n = kN > 0 ? kN : p.n;
  const int64_t t = l.active ? l.token : 0;
  const TX* x = static_cast<const TX*>(p.x) + t * n * p.x_rs;
  const TD* dy = static_cast<const TD*>(p.dy) + t * p.dy_rs;
  TX* dx = static_cast<TX*>(p.dx) + t * n * p.C;
  const float* h = p.h_pre + t * n;
  const int64_t units = p.C / V;
  for (int i0 = 0; i0 < n; i0 += kChunkN) {
    float hv[kChunkN], dh[kChunkN];
#pragma unroll
    for (int q = 0; q < kChunkN; ++q) {
      hv[q] = (l.active && i0 + q < n) ? h[i0 + q] : 0.0f;
      dh[q] = 0.0f;
    }
    if (l.active) {
      for (int64_t u = l.lane; u < units; u += p.tpr) {
        float g[V];
        load_vec<V>(dy + u * V, g);
#pragma unroll
        for (int q = 0; q < kChunkN; ++q) {
          if (i0 + q < n) {
            float xv[V], o[V];
            load_vec<V>(x + (i0 + q) * p.x_rs + u * V, xv);
            dh[q] += dot_vec<V>(xv, g);
#pragma unroll
            for (int e = 0; e < V; ++e) o[e] = hv[q] * g[e];
            store_vec<V>(dx + (i0 + q) * p.C + u * V, o);
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kChunkN; ++q) dh[q] = cuda::warp_sum(dh[q], p.tpr);
    if (l.active && l.lane == 0) {
#pragma unroll
      for (int q = 0; q < kChunkN; ++q)
        if (i0 + q < n) p.dh_pre[t * n + i0 + q] = dh[q];
    }
  }
}

// ---- mhc_post --------------------------------------------------------------------------------

// out[t, k, c] = h_post[t, k] h_out[t, c] + sum_j h_res[t, j, k] x[t, j, c]; outputs in chunks
// of 4 streams (x is read once per chunk; once for n <= 4).
template <class T, int kN, int V>
__global__ void __launch_bounds__(kThreads, 3) post_fwd_kernel(MhcParams p) {
  const Lane l = lane_of(p);
  if (!l.active) return;
  const int n = kN > 0 ? kN : p.n;
  const T* x = static_cast<const T*>(p.x) + l.token * n * p.x_rs;
  const T* ho = static_cast<const T*>(p.h_out) + l.token * p.ho_rs;
  const float* hr = p.h_res + l.token * n * n;
  const float* hp = p.h_post + l.token * n;
  T* out = static_cast<T*>(p.y) + l.token * n * p.C;
  const int64_t units = p.C / V;
  if constexpr (kN > 0) {
    float w[kN][kN], hpv[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      hpv[j] = hp[j];
#pragma unroll
      for (int k = 0; k < kN; ++k) w[j][k] = hr[j * kN + k];
    }
    // Two units per pass, both loaded before either is stored (the compiler may not move loads
    // above stores that could alias), held raw (4 registers per 16 bytes) until used: up to
    // 2 x 80 bytes in flight per thread for 16-bit x. __launch_bounds__(, 3) keeps it at 80
    // registers (3 blocks, 768 threads per SM; ~20 bytes of loop-invariant spill, L1-resident).
    auto mix = [&](int64_t u, const Unit<T, V>& fu, const Unit<T, V> (&xu)[kN]) {
      float fv[V], xv[kN][V];
      fu.get(fv);
#pragma unroll
      for (int j = 0; j < kN; ++j) xu[j].get(xv[j]);
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        float acc[V];
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] = hpv[k] * fv[e];
#pragma unroll
        for (int j = 0; j < kN; ++j)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[e] += w[j][k] * xv[j][e];
        store_vec<V>(out + k * p.C + u * V, acc);
      }
    };
    int64_t u = l.lane;
    for (; u + p.tpr < units; u += 2 * p.tpr) {
      Unit<T, V> fa, fb, xa[kN], xb[kN];
      fa.load(ho + u * V);
      fb.load(ho + (u + p.tpr) * V);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        xa[j].load(x + j * p.x_rs + u * V);
        xb[j].load(x + j * p.x_rs + (u + p.tpr) * V);
      }
      mix(u, fa, xa);
      mix(u + p.tpr, fb, xb);
    }
    if (u < units) {
      Unit<T, V> fa, xa[kN];
      fa.load(ho + u * V);
#pragma unroll
      for (int j = 0; j < kN; ++j) xa[j].load(x + j * p.x_rs + u * V);
      mix(u, fa, xa);
    }
  } else {
    for (int k0 = 0; k0 < n; k0 += kChunkN) {
      for (int64_t u = l.lane; u < units; u += p.tpr) {
        float f[V], acc[kChunkN][V];
        load_vec<V>(ho + u * V, f);
#pragma unroll
        for (int q = 0; q < kChunkN; ++q) {
          const float a = k0 + q < n ? hp[k0 + q] : 0.0f;
#pragma unroll
          for (int e = 0; e < V; ++e) acc[q][e] = a * f[e];
        }
        for (int j = 0; j < n; ++j) {
          float xv[V];
          load_vec<V>(x + j * p.x_rs + u * V, xv);
#pragma unroll
          for (int q = 0; q < kChunkN; ++q) {
            const float w = k0 + q < n ? hr[j * n + k0 + q] : 0.0f;
#pragma unroll
            for (int e = 0; e < V; ++e) acc[q][e] += w * xv[e];
          }
        }
#pragma unroll
        for (int q = 0; q < kChunkN; ++q)
          if (k0 + q < n) store_vec<V>(out + (k0 + q) * p.C + u * V, acc[q]);
      }
    }
  }
}

// Backward for n = 4 in one pass: every dy, x and h_out vector is read once; the 20 per-token
// sums (dh_post[4], dh_res[4][4]) are reduced at the end.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) post_bwd4_kernel(MhcParams p) {
  constexpr int N = 4;
  const Lane l = lane_of(p);
  const int64_t t = l.active ? l.token : 0;
  const T* x = static_cast<const T*>(p.x) + t * N * p.x_rs;
  const T* ho = static_cast<const T*>(p.h_out) + t * p.ho_rs;
  const T* dy = static_cast<const T*>(p.dy) + t * N * p.dy_rs;
  T* dx = static_cast<T*>(p.dx) + t * N * p.C;
  T* dho = static_cast<T*>(p.dh_out) + t * p.C;
  float w[N][N], hpv[N], sp[N], sr[N][N];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    hpv[j] = l.active ? p.h_post[t * N + j] : 0.0f;
    sp[j] = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      w[j][k] = l.active ? p.h_res[t * N * N + j * N + k] : 0.0f;
      sr[j][k] = 0.0f;
    }
  }
  if (l.active) {
    const int64_t units = p.C / V;
    for (int64_t u = l.lane; u < units; u += p.tpr) {
      float g[N][V], f[V], o[V];
#pragma unroll
      for (int k = 0; k < N; ++k) load_vec<V>(dy + k * p.dy_rs + u * V, g[k]);
      load_vec<V>(ho + u * V, f);
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = 0.0f;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        sp[k] += dot_vec<V>(f, g[k]);
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] += hpv[k] * g[k][e];
      }
      store_vec<V>(dho + u * V, o);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        float xv[V];
        load_vec<V>(x + j * p.x_rs + u * V, xv);
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = 0.0f;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          sr[j][k] += dot_vec<V>(xv, g[k]);
#pragma unroll
          for (int e = 0; e < V; ++e) o[e] += w[j][k] * g[k][e];
        }
        store_vec<V>(dx + j * p.C + u * V, o);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    sp[k] = cuda::warp_sum(sp[k], p.tpr);
#pragma unroll
    for (int j = 0; j < N; ++j) sr[j][k] = cuda::warp_sum(sr[j][k], p.tpr);
  }
  if (l.active && l.lane == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      p.dh_post[t * N + k] = sp[k];
#pragma unroll
      for (int j = 0; j < N; ++j) p.dh_res[t * N * N + j * N + k] = sr[j][k];
    }
  }
}

// Backward for any n in four passes over the token (the repeated reads of dy and x hit L2):
// dh_out; dx in chunks of 4 streams; dh_post in chunks of 4; dh_res in 4 x 4 tiles.
template <class T, int V>
__global__ void __launch_bounds__(kThreads) post_bwd_any_kernel(MhcParams p) {
  const Lane l = lane_of(p);
  const int n = p.n;
  const int64_t t = l.active ? l.token : 0;
  const T* x = static_cast<const T*>(p.x) + t * n * p.x_rs;
  const T* ho = static_cast<const T*>(p.h_out) + t * p.ho_rs;
  const T* dy = static_cast<const T*>(p.dy) + t * n * p.dy_rs;
  T* dx = static_cast<T*>(p.dx) + t * n * p.C;
  T* dho = static_cast<T*>(p.dh_out) + t * p.C;
  const float* hr = p.h_res + t * n * n;
  const float* hp = p.h_post + t * n;
  const int64_t units = l.active ? p.C / V : 0;

  // dh_out = sum_k h_post[k] dy_k
  for (int64_t u = l.lane; u < units; u += p.tpr) {
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = 0.0f;
    for (int k = 0; k < n; ++k) {
      float g[V];
      load_vec<V>(dy + k * p.dy_rs + u * V, g);
      const float a = hp[k];
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] += a * g[e];
    }
    store_vec<V>(dho + u * V, o);
  }
  // dx_j = sum_k h_res[j, k] dy_k
  for (int j0 = 0; j0 < n; j0 += kChunkN) {
    for (int64_t u = l.lane; u < units; u += p.tpr) {
      float o[kChunkN][V];
#pragma unroll
      for (int q = 0; q < kChunkN; ++q)
#pragma unroll
        for (int e = 0; e < V; ++e) o[q][e] = 0.0f;
      for (int k = 0; k < n; ++k) {
        float g[V];
        load_vec<V>(dy + k * p.dy_rs + u * V, g);
#pragma unroll
        for (int q = 0; q < kChunkN; ++q) {
          const float w = j0 + q < n ? hr[(j0 + q) * n + k] : 0.0f;
#pragma unroll
          for (int e = 0; e < V; ++e) o[q][e] += w * g[e];
        }
      }
#pragma unroll
      for (int q = 0; q < kChunkN; ++q)
        if (j0 + q < n) store_vec<V>(dx + (j0 + q) * p.C + u * V, o[q]);
    }
  }
  // dh_post[k] = <h_out, dy_k>
  for (int k0 = 0; k0 < n; k0 += kChunkN) {
    float s[kChunkN] = {};
    for (int64_t u = l.lane; u < units; u += p.tpr) {
      float f[V];
      load_vec<V>(ho + u * V, f);
#pragma unroll
      for (int q = 0; q < kChunkN; ++q) {
        if (k0 + q < n) {
          float g[V];
          load_vec<V>(dy + (k0 + q) * p.dy_rs + u * V, g);
          s[q] += dot_vec<V>(f, g);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kChunkN; ++q) s[q] = cuda::warp_sum(s[q], p.tpr);
    if (l.active && l.lane == 0) {
#pragma unroll
      for (int q = 0; q < kChunkN; ++q)
        if (k0 + q < n) p.dh_post[t * n + k0 + q] = s[q];
    }
  }
  // dh_res[j, k] = <x_j, dy_k>
  for (int j0 = 0; j0 < n; j0 += kChunkN) {
    for (int k0 = 0; k0 < n; k0 += kChunkN) {
      float s[kChunkN][kChunkN] = {};
      for (int64_t u = l.lane; u < units; u += p.tpr) {
        float g[kChunkN][V];
#pragma unroll
        for (int q = 0; q < kChunkN; ++q) {
          if (k0 + q < n) {
            load_vec<V>(dy + (k0 + q) * p.dy_rs + u * V, g[q]);
          } else {
#pragma unroll
            for (int e = 0; e < V; ++e) g[q][e] = 0.0f;
          }
        }
#pragma unroll
        for (int r = 0; r < kChunkN; ++r) {
          if (j0 + r < n) {
            float xv[V];
            load_vec<V>(x + (j0 + r) * p.x_rs + u * V, xv);
#pragma unroll
            for (int q = 0; q < kChunkN; ++q) s[r][q] += dot_vec<V>(xv, g[q]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kChunkN; ++r)
#pragma unroll
        for (int q = 0; q < kChunkN; ++q) s[r][q] = cuda::warp_sum(s[r][q], p.tpr);
      if (l.active && l.lane == 0) {
#pragma unroll
        for (int r = 0; r < kChunkN; ++r)
#pragma unroll
          for (int q = 0; q < kChunkN; ++q)
            if (j0 + r < n && k0 + q < n) p.dh_res[t * n * n + (j0 + r) * n + k0 + q] = s[r][q];
      }
    }
  }
}

// ---- host side -------------------------------------------------------------------------------

struct Dims {
  int64_t tokens, n, C;
};
Dims dims_of(const TensorView& x) {
  Dims d{1, x.size(-2), x.size(-1)};
  for (int i = 0; i + 2 < x.ndim(); ++i) d.tokens *= x.size(i);
  return d;
}

// A tensor can be accessed in units of V elements of T: base aligned to the unit (at most 16
// bytes) and every row starting on a unit.
bool unit_ok(const void* ptr, int64_t row_stride, int V, size_t elem) {
  const size_t bytes = std::min<size_t>(16, V * elem);
  return cuda::aligned_to(ptr, bytes) && row_stride % V == 0;
}

int group_size(int64_t units) {
  int g = 1;
  while (g < units && g < 32) g <<= 1;
  return g;
}

dim3 grid_for(const MhcParams& p) {
  const int64_t per_block = kThreads / p.tpr;
  return dim3(static_cast<unsigned>((p.tokens + per_block - 1) / per_block));
}

// Runs launch(integral_constant<V>) with V = W (16-byte units of x) when `vec`, else V = 1.
template <int W, class Launch>
void with_unit(bool vec, Launch&& launch) {
  if (vec) {
    launch(std::integral_constant<int, W>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

constexpr const char* kPre = "mhc_pre_bmm";
constexpr const char* kPost = "mhc_post";

bool f32(DType d) { return d == DType::kFloat32; }
bool not_f64(DType d) { return d != DType::kFloat64; }

bool pre_supports_fwd(const MhcPreBmmFwdArgs& a) { return f32(a.h_pre.dtype()) && not_f64(a.y.dtype()); }
bool pre_supports_bwd(const MhcPreBmmBwdArgs& a) { return f32(a.h_pre.dtype()) && not_f64(a.dy.dtype()); }
bool post_supports_fwd(const MhcPostFwdArgs& a) { return f32(a.h_res.dtype()); }
bool post_supports_bwd(const MhcPostBwdArgs& a) { return f32(a.h_res.dtype()); }


void pre_fwd(const Context& ctx, const MhcPreBmmFwdArgs& a) {
  cuda::DeviceGuard guard(kPre, ctx.device.index);
  const Dims d = dims_of(a.x);
  MhcParams p{};
  p.x = a.x.data();
  p.x_rs = a.x.row_stride();
  p.h_pre = a.h_pre.data_as<const float>();
  p.y = a.y.data();
  p.tokens = d.tokens;
  p.C = d.C;
  p.n = static_cast<int>(d.n);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cuda::visit_dtype(a.x.dtype(), [&](auto tx) {
    using TX = decltype(tx);
    cuda::visit_dtype(a.y.dtype(), [&](auto ty) {
      using TY = decltype(ty);
      constexpr int W = cuda::kVec16<TX>;
      const bool vec = d.C % W == 0 && unit_ok(p.x, p.x_rs, W, sizeof(TX)) &&
                       unit_ok(p.y, d.C, W, sizeof(TY));
      with_unit<W>(vec, [&](auto vt) {
        constexpr int V = decltype(vt)::value;
        p.tpr = group_size(d.C / V);
        // n = 4: 2 units per lane per step (8 loads of 16 bytes in flight per lane before the first
        // store; stop 25, T=32768 C=4096 bf16: 417 -> 398 us busy against 1 unit, report 421 -> 403
        // us; the 1-unit form and its knob FUSEDOPS_MHC_PRE_UNROLL went).
        if (p.n == 4) {
          pre_fwd_kernel<TX, TY, 4, V, 2><<<grid_for(p), kThreads, 0, stream>>>(p);
        } else {
          pre_fwd_kernel<TX, TY, 0, V><<<grid_for(p), kThreads, 0, stream>>>(p);
        }
        FUSEDOPS_CUDA_LAUNCH_CHECK(kPre);
      });
    });
  });
}

void pre_bwd(const Context& ctx, const MhcPreBmmBwdArgs& a) {
  cuda::DeviceGuard guard(kPre, ctx.device.index);
  const Dims d = dims_of(a.x);
  const bool any = d.C > 0;
  MhcParams p{};
  p.x = a.x.data();
  p.x_rs = any ? a.x.row_stride() : 0;
  p.dy = a.dy.data();
  p.dy_rs = any ? a.dy.row_stride() : 0;
  p.h_pre = a.h_pre.data_as<const float>();
  p.dh_pre = a.dh_pre.data_as<float>();
  p.dx = a.dx.data();
  p.tokens = d.tokens;
  p.C = d.C;
  p.n = static_cast<int>(d.n);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cuda::visit_dtype(a.x.dtype(), [&](auto tx) {
    using TX = decltype(tx);
    cuda::visit_dtype(a.dy.dtype(), [&](auto td) {
      using TD = decltype(td);
      constexpr int W = cuda::kVec16<TX>;
      const bool vec = any && d.C % W == 0 && unit_ok(p.x, p.x_rs, W, sizeof(TX)) &&
                       unit_ok(p.dy, p.dy_rs, W, sizeof(TD)) && unit_ok(p.dx, d.C, W, sizeof(TX));
      with_unit<W>(vec, [&](auto vt) {
        constexpr int V = decltype(vt)::value;
        p.tpr = group_size(d.C / V);
        if (p.n == 4) {
          pre_bwd_kernel<TX, TD, 4, V><<<grid_for(p), kThreads, 0, stream>>>(p);
        } else {
          pre_bwd_kernel<TX, TD, 0, V><<<grid_for(p), kThreads, 0, stream>>>(p);
        }
        FUSEDOPS_CUDA_LAUNCH_CHECK(kPre);
      });
    });
  });
}

void post_fwd(const Context& ctx, const MhcPostFwdArgs& a) {
  cuda::DeviceGuard guard(kPost, ctx.device.index);
  const Dims d = dims_of(a.x);
  MhcParams p{};
  p.x = a.x.data();
  p.x_rs = a.x.row_stride();
  p.h_out = a.h_out.data();
  p.ho_rs = a.h_out.row_stride();
  p.h_res = a.h_res.data_as<const float>();
  p.h_post = a.h_post.data_as<const float>();
  p.y = a.out.data();
  p.tokens = d.tokens;
  p.C = d.C;
  p.n = static_cast<int>(d.n);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cuda::visit_dtype(a.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = cuda::kVec16<T>;
    const bool vec = d.C % W == 0 && unit_ok(p.x, p.x_rs, W, sizeof(T)) &&
                     unit_ok(p.h_out, p.ho_rs, W, sizeof(T)) && unit_ok(p.y, d.C, W, sizeof(T));
    with_unit<W>(vec, [&](auto vt) {
      constexpr int V = decltype(vt)::value;
      p.tpr = group_size(d.C / V);
      if (p.n == 4) {
        post_fwd_kernel<T, 4, V><<<grid_for(p), kThreads, 0, stream>>>(p);
      } else {
        post_fwd_kernel<T, 0, V><<<grid_for(p), kThreads, 0, stream>>>(p);
      }
      FUSEDOPS_CUDA_LAUNCH_CHECK(kPost);
    });
  });
}

void post_bwd(const Context& ctx, const MhcPostBwdArgs& a) {
  cuda::DeviceGuard guard(kPost, ctx.device.index);
  const Dims d = dims_of(a.x);
  const bool any = d.C > 0;
  MhcParams p{};
  p.x = a.x.data();
  p.x_rs = any ? a.x.row_stride() : 0;
  p.h_out = a.h_out.data();
  p.ho_rs = any ? a.h_out.row_stride() : 0;
  p.dy = a.dy.data();
  p.dy_rs = any ? a.dy.row_stride() : 0;
  p.h_res = a.h_res.data_as<const float>();
  p.h_post = a.h_post.data_as<const float>();
  p.dx = a.dx.data();
  p.dh_out = a.dh_out.data();
  p.dh_res = a.dh_res.data_as<float>();
  p.dh_post = a.dh_post.data_as<float>();
  p.tokens = d.tokens;
  p.C = d.C;
  p.n = static_cast<int>(d.n);
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  cuda::visit_dtype(a.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int W = cuda::kVec16<T>;
    const bool vec = any && d.C % W == 0 && unit_ok(p.x, p.x_rs, W, sizeof(T)) &&
                     unit_ok(p.h_out, p.ho_rs, W, sizeof(T)) &&
                     unit_ok(p.dy, p.dy_rs, W, sizeof(T)) && unit_ok(p.dx, d.C, W, sizeof(T)) &&
                     unit_ok(p.dh_out, d.C, W, sizeof(T));
    with_unit<W>(vec, [&](auto vt) {
      constexpr int V = decltype(vt)::value;
      p.tpr = group_size(d.C / V);
      if (p.n == 4) {
        post_bwd4_kernel<T, V><<<grid_for(p), kThreads, 0, stream>>>(p);
      } else {
        post_bwd_any_kernel<T, V><<<grid_for(p), kThreads, 0, stream>>>(p);
      }
      FUSEDOPS_CUDA_LAUNCH_CHECK(kPost);
    });
  });
}

}  // namespace

void register_mhc_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<MhcPreBmmFwdArgs>(kPre, Direction::kForward, spec, pre_supports_fwd, pre_fwd);
  r.add<MhcPreBmmBwdArgs>(kPre, Direction::kBackward, spec, pre_supports_bwd, pre_bwd);
  r.add<MhcPostFwdArgs>(kPost, Direction::kForward, spec, post_supports_fwd, post_fwd);
  r.add<MhcPostBwdArgs>(kPost, Direction::kBackward, spec, post_supports_bwd, post_bwd);
}

}  // namespace fusedops
