// The CUDA engine behind the row normalisations (rmsnorm_without_weight, l2norm).
//
// A group of `tpr` threads (a power of two, 1..256) owns one row of D elements. When the row
// fits, each thread keeps kIters 16-byte vectors of it in registers, so the row is read from
// memory exactly once; the group reduces its sum with shuffles (and shared memory past a warp)
// in a fixed order, so results are bitwise reproducible. Rows too long for registers, or whose
// layout forbids 16-byte accesses, take the kIters == 0 path: the same group loops over the row
// twice (the second read mostly hits L1/L2).
#pragma once

#include <algorithm>
#include <cstdint>

#include "src/cuda/check.cuh"
#include "src/cuda/reduce.cuh"
#include "src/cuda/vec.cuh"

namespace fusedops::cuda {

struct RowNormFwdParams {
  const void* x;
  void* y;  // nullptr: only rstd
  float* rstd;
  int64_t rows, D, x_row_stride;  // y rows are contiguous (stride D)
  float scale;  // 1/D (RMS) or 1 (L2)
  float eps;
  int tpr;
};

enum RowNormBwdMode : int { kRmsFromX = 0, kL2FromY = 1 };

// dx = rstd*dy - coef*u;  kRmsFromX: coef = rstd^3 (sum(dy*u) + drstd) / D;
//                         kL2FromY:  coef = rstd * sum(dy*u).
struct RowNormBwdParams {
  const void* u;
  const void* dy;  // dtype of u; nullptr: no dy
  const float* rstd;
  const float* drstd;  // nullptr: no drstd
  void* dx;
  int64_t rows, D, u_row_stride, dy_row_stride;  // dx rows contiguous
  float inv_d;
  int mode;
  int tpr;
};

struct RowPlan {
  int iters;  // 0: two-pass loop over the row
  bool vec;
  int tpr;
  int threads;
  int64_t blocks;
};

// Threads per block of every row-norm kernel; a row group never exceeds it.
inline constexpr int kRowThreads = 256;

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v && p < kRowThreads) p <<= 1;
  return p;
}

// Chooses the group size and register-cache depth for rows of D elements accessed n at a time
// (n = 1 when 16-byte accesses are impossible: then the loop path), aiming at `per_thread`
// 16-byte units per thread. The backward caches two tensors, so it aims at 2 (at 4 its 16-bit
// variants spill under the 64-register cap of 4 blocks per SM).
inline RowPlan plan_rows(int64_t rows, int64_t D, int n, bool vec, int per_thread) {
  RowPlan plan{};
  plan.vec = vec;
  const int64_t units = vec ? D / n : D;
  plan.tpr = next_pow2((units + per_thread - 1) / per_thread);
  const int64_t iters = (units + plan.tpr - 1) / plan.tpr;
  plan.iters = iters <= 1 ? 1 : iters <= 2 ? 2 : iters <= 4 ? 4 : iters <= 8 ? 8 : 0;
  if (!vec) plan.iters = 0;
  plan.threads = kRowThreads;
  const int rows_per_block = kRowThreads / plan.tpr;
  plan.blocks = (rows + rows_per_block - 1) / rows_per_block;
  return plan;
}

template <class TX, class TY, int kIters, bool kVec>
__global__ void __launch_bounds__(kRowThreads, kIters >= 8 ? 2 : 4) rownorm_fwd_kernel(RowNormFwdParams p) {
  constexpr int N = kVec ? kVec16<TX> : 1;
  __shared__ float scratch[32];
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool active = row < p.rows;
  const TX* xr = static_cast<const TX*>(p.x) + (active ? row * p.x_row_stride : 0);
  TY* yr = p.y ? static_cast<TY*>(p.y) + (active ? row * p.D : 0) : nullptr;
  const int64_t units = p.D / N;

  if constexpr (kIters > 0) {
    // The row stays in registers in its storage type (half the registers of floats for 16-bit
    // types), so it is read from memory exactly once.
    Raw16 v[kIters];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int64_t i = static_cast<int64_t>(j) * tpr + lane;
      v[j] = (active && i < units) ? load_raw16(xr + i * N) : make_uint4(0, 0, 0, 0);
      float f[N];
      raw_to_floats<TX>(v[j], f);
#pragma unroll
      for (int e = 0; e < N; ++e) ss += f[e] * f[e];
    }
    ss = group_sum(ss, tpr, scratch);
    const float r = rsqrtf(ss * p.scale + p.eps);
    if (!active) return;
    if (lane == 0) p.rstd[row] = r;
    if (!yr) return;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int64_t i = static_cast<int64_t>(j) * tpr + lane;
      if (i < units) {
        float o[N];
        raw_to_floats<TX>(v[j], o);
#pragma unroll
        for (int e = 0; e < N; ++e) o[e] *= r;
        store_floats<N>(yr + i * N, o);
      }
    }
  } else {
    float ss = 0.0f;
    if (active) {
      for (int64_t i = lane; i < units; i += tpr) {
        float v[N];
        load_floats<N>(xr + i * N, v);
#pragma unroll
        for (int e = 0; e < N; ++e) ss += v[e] * v[e];
      }
    }
    ss = group_sum(ss, tpr, scratch);
    const float r = rsqrtf(ss * p.scale + p.eps);
    if (!active) return;
    if (lane == 0) p.rstd[row] = r;
    if (!yr) return;
    for (int64_t i = lane; i < units; i += tpr) {
      float v[N];
      load_floats<N>(xr + i * N, v);
#pragma unroll
      for (int e = 0; e < N; ++e) v[e] *= r;
      store_floats<N>(yr + i * N, v);
    }
  }
}

template <class TU, class TX, int kIters, bool kVec>
__global__ void __launch_bounds__(kRowThreads, kIters >= 8 ? 1 : kIters >= 4 ? 2 : 4) rownorm_bwd_kernel(RowNormBwdParams p) {
  constexpr int N = kVec ? kVec16<TU> : 1;
  __shared__ float scratch[32];
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool active = row < p.rows;
  const TU* ur = static_cast<const TU*>(p.u) + (active ? row * p.u_row_stride : 0);
  const TU* dyr = p.dy ? static_cast<const TU*>(p.dy) + (active ? row * p.dy_row_stride : 0) : nullptr;
  TX* dxr = static_cast<TX*>(p.dx) + (active ? row * p.D : 0);
  const int64_t units = p.D / N;
  const float r = active ? p.rstd[row] : 0.0f;
  const float g = (active && p.drstd) ? p.drstd[row] : 0.0f;

  auto coefficient = [&](float dot) {
    return p.mode == kRmsFromX ? r * r * r * (dot + g) * p.inv_d : r * dot;
  };

  if constexpr (kIters > 0) {
    Raw16 u[kIters], dy[kIters];
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int64_t i = static_cast<int64_t>(j) * tpr + lane;
      const bool in = active && i < units;
      u[j] = in ? load_raw16(ur + i * N) : make_uint4(0, 0, 0, 0);
      dy[j] = (in && dyr) ? load_raw16(dyr + i * N) : make_uint4(0, 0, 0, 0);
      float fu[N], fdy[N];
      raw_to_floats<TU>(u[j], fu);
      raw_to_floats<TU>(dy[j], fdy);
#pragma unroll
      for (int e = 0; e < N; ++e) dot += fdy[e] * fu[e];
    }
    dot = group_sum(dot, tpr, scratch);
    if (!active) return;
    const float coef = coefficient(dot);
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int64_t i = static_cast<int64_t>(j) * tpr + lane;
      if (i < units) {
        float fu[N], o[N];
        raw_to_floats<TU>(u[j], fu);
        raw_to_floats<TU>(dy[j], o);
#pragma unroll
        for (int e = 0; e < N; ++e) o[e] = r * o[e] - coef * fu[e];
        store_floats<N>(dxr + i * N, o);
      }
    }
  } else {
    float dot = 0.0f;
    if (active && dyr) {
      for (int64_t i = lane; i < units; i += tpr) {
        float u[N], dy[N];
        load_floats<N>(ur + i * N, u);
        load_floats<N>(dyr + i * N, dy);
#pragma unroll
        for (int e = 0; e < N; ++e) dot += dy[e] * u[e];
      }
    }
    dot = group_sum(dot, tpr, scratch);
    if (!active) return;
    const float coef = coefficient(dot);
    for (int64_t i = lane; i < units; i += tpr) {
      float u[N], dy[N] = {};
      load_floats<N>(ur + i * N, u);
      if (dyr) load_floats<N>(dyr + i * N, dy);
#pragma unroll
      for (int e = 0; e < N; ++e) u[e] = r * dy[e] - coef * u[e];
      store_floats<N>(dxr + i * N, u);
    }
  }
}

// Host launchers: pick the plan and the instantiation. `op` names the caller in errors.
template <class TX, class TY>
void launch_rownorm_fwd(const char* op, RowNormFwdParams p, cudaStream_t stream) {
  constexpr int N = kVec16<TX>;
  const bool vec = p.D % N == 0 && p.x_row_stride % N == 0 && aligned_to(p.x, 16) &&
                   (!p.y || aligned_to(p.y, sizeof(TY) * N));
  // Units per thread, measured on the H200 (bench/notes/ARCHIVE.md): 4 for long rows ([32768,4096] bf16:
  // 133 us at 4, 143 at 2), 2 for short ones ([524288,128] bf16: 69.9 us at 2, 71.3 at 4, 93 at 1).
  const int per_thread = p.D / N <= 32 ? 2 : 4;
  const RowPlan plan = plan_rows(p.rows, p.D, N, vec, per_thread);
  p.tpr = plan.tpr;
  const dim3 grid(static_cast<unsigned>(plan.blocks)), block(plan.threads);
  if (!vec) {
    rownorm_fwd_kernel<TX, TY, 0, false><<<grid, block, 0, stream>>>(p);
  } else {
    switch (plan.iters) {
      case 1: rownorm_fwd_kernel<TX, TY, 1, true><<<grid, block, 0, stream>>>(p); break;
      case 2: rownorm_fwd_kernel<TX, TY, 2, true><<<grid, block, 0, stream>>>(p); break;
      case 4: rownorm_fwd_kernel<TX, TY, 4, true><<<grid, block, 0, stream>>>(p); break;
      case 8: rownorm_fwd_kernel<TX, TY, 8, true><<<grid, block, 0, stream>>>(p); break;
      default: rownorm_fwd_kernel<TX, TY, 0, true><<<grid, block, 0, stream>>>(p); break;
    }
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

template <class TU, class TX>
void launch_rownorm_bwd(const char* op, RowNormBwdParams p, cudaStream_t stream) {
  constexpr int N = kVec16<TU>;
  const bool vec = p.D % N == 0 && p.u_row_stride % N == 0 && aligned_to(p.u, 16) &&
                   (!p.dy || (p.dy_row_stride % N == 0 && aligned_to(p.dy, 16))) &&
                   aligned_to(p.dx, sizeof(TX) * N);
  const RowPlan plan = plan_rows(p.rows, p.D, N, vec, 2);
  p.tpr = plan.tpr;
  const dim3 grid(static_cast<unsigned>(plan.blocks)), block(plan.threads);
  if (!vec) {
    rownorm_bwd_kernel<TU, TX, 0, false><<<grid, block, 0, stream>>>(p);
  } else {
    switch (plan.iters) {
      case 1: rownorm_bwd_kernel<TU, TX, 1, true><<<grid, block, 0, stream>>>(p); break;
      case 2: rownorm_bwd_kernel<TU, TX, 2, true><<<grid, block, 0, stream>>>(p); break;
      case 4: rownorm_bwd_kernel<TU, TX, 4, true><<<grid, block, 0, stream>>>(p); break;
      case 8: rownorm_bwd_kernel<TU, TX, 8, true><<<grid, block, 0, stream>>>(p); break;
      default: rownorm_bwd_kernel<TU, TX, 0, true><<<grid, block, 0, stream>>>(p); break;
    }
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

}  // namespace fusedops::cuda
