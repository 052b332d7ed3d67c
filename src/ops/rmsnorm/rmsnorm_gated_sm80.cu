// rmsnorm_gated, generic CUDA backend (sm_80 and later).
//
// Forward: the row-norm scheme of src/cuda/rownorm.cuh applied to each (row, group) segment: a
// group of `tpr` threads owns one segment of g columns, keeps it in registers (16-byte accesses),
// reduces the sum of squares in a fixed order (group_sum), and writes y (and residual_out) in the
// same pass. One read of x, z (and residual), one write of y (and residual_out) and rstd.
//
// Backward: block (chunk, group) handles the rows of one chunk for the columns of one group, so
// each thread's columns stay fixed and it accumulates its dweight / dbias contributions in
// registers; the block then sums its row slots in a fixed order into one fp32 partial row of the
// workspace, and a second small kernel sums the partial rows in order (no float atomics:
// bitwise reproducible). One read of dy, x, z, rstd, one write of dx, dz.
//
// Segments too long for registers, or whose layout forbids 16-byte accesses, take loop paths
// that read the segment twice (the second read mostly hits L1/L2); the loop backward gives the
// whole block to one row and accumulates the parameter gradients directly in its own partial row.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/cuda/rownorm.cuh"
#include "src/cuda/fastmath.cuh"
#include "src/ops/rmsnorm/rmsnorm_gated_common.h"

namespace fusedops {
namespace {

using cuda::from_f;
using cuda::group_sum;
using cuda::kRowThreads;
using cuda::kVec16;
using cuda::load_raw16;
using cuda::Raw16;
using cuda::raw_to_floats;
using cuda::to_f;
using rmsnorm_gated::kOp;

enum GateCode : int { kNoGate = 0, kGateSilu = 1, kGateSigmoid = 2 };

struct GatedFwdParams {
  const void* x;
  const void* z;         // nullptr: no gate
  const void* residual;  // nullptr: none
  const void* weight;    // nullptr: ones
  const void* bias;      // nullptr: zeros
  void* y;
  void* residual_out;
  float* rstd;
  int64_t segments;  // rows * G
  int64_t G, g, D;
  int64_t x_stride, z_stride, res_stride;
  float eps, inv_g;
  int tpr;
  int gate;  // GateCode; applied after the norm when nbg, before it (silu) otherwise
  bool nbg;
  bool w_f32, b_f32, res_f32, rout_f32;  // float32 storage (else the dtype of x)
};

struct GatedBwdParams {
  const void* dy;
  const void* x;  // the saved normalised input (x or residual_out)
  const void* z;
  const void* weight;
  const void* bias;
  const float* rstd;
  const void* dres;  // gradient of residual_out, dtype of x; nullptr: none
  void* dx;
  void* dz;
  void* dres_in;  // copy of dx in x's dtype; nullptr: none
  float* part_w;  // [chunks, D] partial sums; nullptr: no dweight
  float* part_b;
  int64_t rows, D, g, G, rows_per_chunk;
  int64_t dy_stride, x_stride, z_stride, dres_stride;
  float inv_g;
  int tpr;
  int gate;
  bool nbg;
  bool x_f32, w_f32, b_f32;
};

// N consecutive values at element offset `off` of a tensor stored as T, or as float when `f32`
// (N elements of T form one aligned access of 16 bytes or less; the float copy is read in
// 16-byte pieces, so N is 1 or a multiple of 4 there).
template <class T, int N>
__device__ __forceinline__ void load_any(const void* base, bool f32, int64_t off, float (&out)[N]) {
  if constexpr (N == 1) {
    out[0] = f32 ? static_cast<const float*>(base)[off] : to_f(static_cast<const T*>(base)[off]);
  } else if constexpr (std::is_same_v<T, float>) {
    cuda::load_floats<N>(static_cast<const float*>(base) + off, out);
  } else {
    if (f32) {
      static_assert(N % 4 == 0, "float copies are read 16 bytes at a time");
      const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(base) + off);
#pragma unroll
      for (int k = 0; k < N / 4; ++k) {
        const float4 v = q[k];
        out[4 * k] = v.x;
        out[4 * k + 1] = v.y;
        out[4 * k + 2] = v.z;
        out[4 * k + 3] = v.w;
      }
    } else if constexpr (N == kVec16<T>) {
      raw_to_floats<T>(load_raw16(static_cast<const T*>(base) + off), out);
    } else {
      cuda::load_floats<N>(static_cast<const T*>(base) + off, out);
    }
  }
}

template <class T, int N>
__device__ __forceinline__ void store_any(void* base, bool f32, int64_t off, const float (&in)[N]) {
  if constexpr (N == 1) {
    if (f32) static_cast<float*>(base)[off] = in[0];
    else static_cast<T*>(base)[off] = from_f<T>(in[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    cuda::store_floats<N>(static_cast<float*>(base) + off, in);
  } else {
    if (f32) {
      static_assert(N % 4 == 0, "float copies are written 16 bytes at a time");
      float4* q = reinterpret_cast<float4*>(static_cast<float*>(base) + off);
#pragma unroll
      for (int k = 0; k < N / 4; ++k) q[k] = make_float4(in[4 * k], in[4 * k + 1], in[4 * k + 2], in[4 * k + 3]);
    } else {
      cuda::store_floats<N>(static_cast<T*>(base) + off, in);
    }
  }
}

// Element e of 16 bytes of T held raw (converted at use, so a unit of dy or z costs four
// registers instead of one per element).
template <class T>
__device__ __forceinline__ float raw_elem(const Raw16& r, int e) {
  const uint32_t w = e < (sizeof(T) == 4 ? 1 : 2) ? r.x
                   : e < (sizeof(T) == 4 ? 2 : 4) ? r.y
                   : e < (sizeof(T) == 4 ? 3 : 6) ? r.z : r.w;
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w);
  } else {
    const float2 f = cuda::unpack_word<T>(w);
    return (e & 1) ? f.y : f.x;
  }
}

// Elements of one unit of dy or z: raw 16 bytes (register path) or a float array (loop paths).
template <class T>
struct Elems {
  Raw16 raw;
  const float* arr;  // non-null: read this instead of raw
  __device__ __forceinline__ float operator()(int e) const { return arr ? arr[e] : raw_elem<T>(raw, e); }
};

// a = act(z) and da = act'(z). 1 - sigmoid(z) is exp(-z)*sigmoid(z) for z >= 0 (no cancellation
// where sigmoid is close to 1) and 1 - sigmoid(z) below (no overflow of exp(-z)).
// From z, e = e^-z and s = sigmoid(z) = 1 / (1 + e).
__device__ __forceinline__ float gate_from_sigmoid(int code, float z, float s) {
  return code == kGateSilu ? z * s : s;
}
__device__ __forceinline__ void gate_fn_from_sigmoid(int code, float z, float e, float s, float& a, float& da) {
  const float one_minus = z >= 0.0f ? e * s : 1.0f - s;
  if (code == kGateSilu) {
    a = z * s;
    da = s * (1.0f + z * one_minus);
  } else {
    a = s;
    da = s * one_minus;
  }
}
// `fast`: cuda::sigmoid_exp's approximate form, taken for 16-bit x and z (kFastGate): its
// few-ulp error is far below the output's rounding, and the exact form (expf's eight instructions
// and a reciprocal with a fallback branch per element) made the forward and backward issue-bound.
__device__ __forceinline__ void gate_fn(int code, float z, float& a, float& da, bool fast) {
  float e, s;
  cuda::sigmoid_exp(z, e, s, fast);
  gate_fn_from_sigmoid(code, z, e, s, a, da);
}
__device__ __forceinline__ float gate_value(int code, float z, bool fast) {
  float e, s;
  cuda::sigmoid_exp(z, e, s, fast);
  return gate_from_sigmoid(code, z, s);
}
template <class T>
constexpr bool kFastGate = cuda::kFastSigmoid<T>;

// gate_value / gate_fn of N elements at once, bitwise the same: the reciprocals 1/(1 + e^-z) go
// through cuda::rcp_rn in batches of kGateBatch (one rare-case branch per batch instead of one
// branch and reconvergence point per element). Used where the kernel's register budget has room
// for the batch (ptxas -v shows no new spills): the short-segment kernels with two rows per step.
constexpr int kGateBatch = 4;
template <int N>
constexpr int gate_batch() { return N % kGateBatch == 0 ? kGateBatch : (N % 2 == 0 ? 2 : 1); }

template <int M>
__device__ __forceinline__ void sigmoid_m(const float* z, float (&e)[M], float (&s)[M], bool fast) {
  if (fast) {
#pragma unroll
    for (int i = 0; i < M; ++i) cuda::sigmoid_approx(z[i], e[i], s[i]);
    return;
  }
  float d[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    e[i] = expf(-z[i]);
    d[i] = 1.0f + e[i];
  }
  cuda::rcp_rn<M>(d, s);
}
// act(z) (and act'(z) when kDeriv) of N elements, in batches of gate_batch<N>().
template <int N, bool kDeriv>
__device__ __forceinline__ void gate_n(int code, const float (&z)[N], float (&a)[N], float (&da)[N], bool fast) {
  constexpr int M = gate_batch<N>();
#pragma unroll
  for (int i0 = 0; i0 < N; i0 += M) {
    float e[M], s[M];
    sigmoid_m<M>(z + i0, e, s, fast);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if constexpr (kDeriv) gate_fn_from_sigmoid(code, z[i0 + i], e[i], s[i], a[i0 + i], da[i0 + i]);
      else a[i0 + i] = gate_from_sigmoid(code, z[i0 + i], s[i]);
    }
  }
}
template <int N>
__device__ __forceinline__ void gate_value_n(int code, const float (&z)[N], float (&a)[N], bool fast) {
  gate_n<N, false>(code, z, a, a, fast);  // no derivative: the last argument is not written
}
template <int N>
__device__ __forceinline__ void gate_fn_n(int code, const float (&z)[N], float (&a)[N], float (&da)[N], bool fast) {
  gate_n<N, true>(code, z, a, da, fast);
}

template <class T, int kIters, bool kVec>
__global__ void __launch_bounds__(kRowThreads, kIters >= 4 ? 2 : kIters == 2 ? 3 : 4) gated_fwd_kernel(GatedFwdParams p) {
  constexpr int N = kVec ? kVec16<T> : 1;
  __shared__ float scratch[32];
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t seg = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool active = seg < p.segments;
  const int64_t row = active ? seg / p.G : 0;
  const int64_t col0 = (active ? seg - row * p.G : 0) * p.g;
  const int64_t x_off = row * p.x_stride + col0, z_off = row * p.z_stride + col0;
  const int64_t res_off = row * p.res_stride + col0, out_off = row * p.D + col0;
  const int64_t units = p.g / N;
  const bool gate_first = p.z != nullptr && !p.nbg;
  const bool gate_after = p.z != nullptr && p.nbg;

  // The value that is normalised at unit i: x (+ residual, stored to residual_out), times
  // silu(z) when the gate comes first.
  auto load_value = [&](int64_t i, float (&v)[N]) {
    load_any<T, N>(p.x, false, x_off + i * N, v);
    if (p.residual) {
      float r[N];
      load_any<T, N>(p.residual, p.res_f32, res_off + i * N, r);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        v[e] += r[e];
        // The sum as residual_out stores it is what is normalised (and what the backward reads).
        if (!p.rout_f32) v[e] = to_f(from_f<T>(v[e]));
      }
    }
    if (gate_first) {
      float z[N];
      load_any<T, N>(p.z, false, z_off + i * N, z);
#pragma unroll
      for (int e = 0; e < N; ++e) v[e] *= gate_value(kGateSilu, z[e], kFastGate<T>);
    }
  };
  // y at unit i from the normalised value v (z already loaded when the gate comes after).
  auto write_output = [&](int64_t i, const float (&v)[N], const float (&z)[N], float r) {
    float w[N], b[N], o[N];
    if (p.weight) load_any<T, N>(p.weight, p.w_f32, col0 + i * N, w);
    if (p.bias) load_any<T, N>(p.bias, p.b_f32, col0 + i * N, b);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float h = v[e] * r;
      if (p.weight) h *= w[e];
      if (p.bias) h += b[e];
      if (gate_after) h *= gate_value(p.gate, z[e], kFastGate<T>);
      o[e] = h;
    }
    store_any<T, N>(p.y, false, out_off + i * N, o);
  };

  if constexpr (kIters > 0) {
    float v[kIters][N];
    Raw16 zr[kIters];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int64_t i = static_cast<int64_t>(j) * tpr + lane;
      zr[j] = make_uint4(0, 0, 0, 0);
      if (active && i < units) {
        load_value(i, v[j]);
        if (p.residual) store_any<T, N>(p.residual_out, p.rout_f32, out_off + i * N, v[j]);
        if (gate_after) zr[j] = load_raw16(static_cast<const T*>(p.z) + z_off + i * N);
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) v[j][e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < N; ++e) ss += v[j][e] * v[j][e];
    }
    ss = group_sum(ss, tpr, scratch);
    const float r = rsqrtf(ss * p.inv_g + p.eps);
    if (!active) return;
    if (lane == 0) p.rstd[seg] = r;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int64_t i = static_cast<int64_t>(j) * tpr + lane;
      if (i < units) {
        float z[N];
        raw_to_floats<T>(zr[j], z);
        write_output(i, v[j], z, r);
      }
    }
  } else {
    float ss = 0.0f;
    if (active) {
      for (int64_t i = lane; i < units; i += tpr) {
        float v[N];
        load_value(i, v);
        if (p.residual) store_any<T, N>(p.residual_out, p.rout_f32, out_off + i * N, v);
#pragma unroll
        for (int e = 0; e < N; ++e) ss += v[e] * v[e];
      }
    }
    ss = group_sum(ss, tpr, scratch);
    const float r = rsqrtf(ss * p.inv_g + p.eps);
    if (!active) return;
    if (lane == 0) p.rstd[seg] = r;
    for (int64_t i = lane; i < units; i += tpr) {
      float v[N], z[N];
      load_value(i, v);
      if (gate_after) load_any<T, N>(p.z, false, z_off + i * N, z);
      write_output(i, v, z, r);
    }
  }
}

// Short segments (one 16-byte unit per thread, a group of at most 32 threads per segment, no
// residual): each group handles kRows segments of the block at once, their loads all issued before
// the first reduction, so that a thread keeps kRows * 32 bytes of loads in flight (the one-segment
// kernel above keeps 32 and, at 4 resident blocks, could not cover the memory latency). x and z
// stay in registers in their storage type. Same arithmetic, in the same order, as gated_fwd_kernel.
// kPlain: the common rms_norm_gated call, fixed at compile time: one group per row (G == 1), a
// weight, no bias, and the silu gate after the norm. The kernel then has no index division and no
// per-element choices: in the general form the row index costs a 64-bit division and the compiler
// evaluates the other gate order's sigmoids speculatively and selects between the options on
// every element; at [1M, 128] bf16 the general kernel was bound by instruction issue (73% of
// issue slots, ~45 instructions per element; ncu at e9431ad).
template <class T, int kRows, bool kPlain>
__global__ void __launch_bounds__(kRowThreads, 4) gated_fwd_rows_kernel(GatedFwdParams p) {
  static_assert(kRows == 2, "two rows per step (kRowsPerStep)");
  constexpr int N = kVec16<T>;
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int groups = blockDim.x / tpr;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups * kRows + threadIdx.x / tpr;
  const bool unit_ok = lane < p.g / N;
  const bool gate_first = !kPlain && p.z != nullptr && !p.nbg;
  const bool gate_after = kPlain || (p.z != nullptr && p.nbg);
  const bool has_z = kPlain || p.z != nullptr, has_w = kPlain || p.weight != nullptr;
  const bool has_b = !kPlain && p.bias != nullptr;
  const int gate = kPlain ? static_cast<int>(kGateSilu) : p.gate;
  // Row and first column of segment `seg` for this thread.
  auto locate = [&](int64_t seg, int64_t& row, int64_t& col0) {
    if constexpr (kPlain) {
      row = seg;
      col0 = 0;
    } else {
      row = seg / p.G;
      col0 = (seg - row * p.G) * p.g;
    }
  };
  Raw16 xr[kRows], zr[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t seg = first + static_cast<int64_t>(r) * groups;
    xr[r] = zr[r] = make_uint4(0, 0, 0, 0);
    if (seg < p.segments && unit_ok) {
      int64_t row, col;
      locate(seg, row, col);
      col += lane * N;
      xr[r] = load_raw16(static_cast<const T*>(p.x) + row * p.x_stride + col);
      if (has_z) zr[r] = load_raw16(static_cast<const T*>(p.z) + row * p.z_stride + col);
    }
  }
  // The value that is normalised: x, times silu(z) when the gate comes first.
  auto value = [&](int r, float (&v)[N]) {
    raw_to_floats<T>(xr[r], v);
    if (gate_first) {
      float z[N];
      raw_to_floats<T>(zr[r], z);
      float a[N];
      gate_value_n<N>(kGateSilu, z, a, kFastGate<T>);
#pragma unroll
      for (int e = 0; e < N; ++e) v[e] *= a[e];
    }
  };
  float ss[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v[N];
    value(r, v);
    ss[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < N; ++e) ss[r] += v[e] * v[e];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) ss[r] = cuda::warp_sum(ss[r], tpr);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t seg = first + static_cast<int64_t>(r) * groups;
    if (seg >= p.segments) break;
    const float rs = rsqrtf(ss[r] * p.inv_g + p.eps);
    if (lane == 0) p.rstd[seg] = rs;
    if (!unit_ok) continue;
    int64_t row, col0;
    locate(seg, row, col0);
    float v[N], w[N], b[N], z[N], o[N];
    value(r, v);
    if (has_w) load_any<T, N>(p.weight, p.w_f32, col0 + lane * N, w);
    if (has_b) load_any<T, N>(p.bias, p.b_f32, col0 + lane * N, b);
    if (gate_after) raw_to_floats<T>(zr[r], z);
    if (gate_after) gate_value_n<N>(gate, z, z, kFastGate<T>);  // z becomes act(z)
#pragma unroll
    for (int e = 0; e < N; ++e) {
      float h = v[e] * rs;
      if (has_w) h *= w[e];
      if (has_b) h += b[e];
      if (gate_after) h *= z[e];
      o[e] = h;
    }
    store_any<T, N>(p.y, false, row * p.D + col0 + lane * N, o);
  }
}

// Per-element backward of elements [kOff, kOff + H) of one unit. Inputs: dy, x (the saved
// value), z (when gated), w, b, the group's rstd and mean = mean_G(v^ * w * t) where t is the
// gradient reaching the normalised value v (dy*act(z) with the gate after, dy otherwise).
// Writes dx and dz of those elements and adds their dweight (t * v^) and dbias (t)
// contributions to the accumulators. Units are processed in halves so that only half a unit of
// outputs is live at a time (register pressure).
struct UnitGrads {
  int gate;
  bool nbg, has_w, has_b;
  bool fast;  // kFastGate of the storage type (a constant once the kernel is inlined)
};

// dy and z are given by accessors (element e -> float) so that they can stay raw.
template <int N, int H, int kOff, bool kBatch, class DY, class Z>
__device__ __forceinline__ void half_backward(const UnitGrads& u, DY dy_at, const float (&x)[N], Z z_at,
                                              const float (&w)[N], const float (&b)[N],
                                              float r, float mean, float (&dx)[H], float (&dz)[H],
                                              float* acc_w, float* acc_b) {
  float ga[H], gd[H];  // act(z), act'(z) when batched
  if constexpr (kBatch) {
    if (u.gate != kNoGate) {
      float zs[H];
#pragma unroll
      for (int k = 0; k < H; ++k) zs[k] = z_at(kOff + k);
      gate_fn_n<H>(u.nbg ? u.gate : static_cast<int>(kGateSilu), zs, ga, gd, u.fast);
    }
  }
#pragma unroll
  for (int k = 0; k < H; ++k) {
    const int e = kOff + k;
    const float dye = dy_at(e), ze = z_at(e);
    const float we = u.has_w ? w[e] : 1.0f;
    float t, vh;
    if (u.gate == kNoGate || u.nbg) {
      float a = 1.0f, da = 0.0f;
      if (u.gate != kNoGate) {
        if constexpr (kBatch) a = ga[k], da = gd[k];
        else gate_fn(u.gate, ze, a, da, u.fast);
      }
      t = dye * a;
      vh = x[e] * r;
      dx[k] = r * (t * we - vh * mean);
      dz[k] = dye * (vh * we + (u.has_b ? b[e] : 0.0f)) * da;
    } else {
      float sz, dsz;
      if constexpr (kBatch) sz = ga[k], dsz = gd[k];
      else gate_fn(kGateSilu, ze, sz, dsz, u.fast);
      t = dye;
      vh = x[e] * sz * r;
      const float du = r * (t * we - vh * mean);
      dz[k] = du * x[e] * dsz;
      dx[k] = du * sz;
    }
    acc_w[e] += t * vh;
    acc_b[e] += t;
  }
}

// This unit's share of sum_G(v * w * t) (times rstd later): v = x or u = x*silu(z).
template <int N, bool kBatch, class DY, class Z>
__device__ __forceinline__ float unit_dot(const UnitGrads& u, DY dy_at, const float (&x)[N], Z z_at,
                                          const float (&w)[N]) {
  float dot = 0.0f, ga[N];
  if constexpr (kBatch) {
    if (u.gate != kNoGate) {
      float zs[N];
#pragma unroll
      for (int e = 0; e < N; ++e) zs[e] = z_at(e);
      gate_value_n<N>(u.nbg ? u.gate : static_cast<int>(kGateSilu), zs, ga, u.fast);
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) {
    float v = x[e], t = dy_at(e);
    if (u.gate != kNoGate) {
      float a;
      if constexpr (kBatch) a = ga[e];
      else a = gate_value(u.nbg ? u.gate : static_cast<int>(kGateSilu), z_at(e), u.fast);
      if (u.nbg) t *= a;
      else v *= a;
    }
    dot += v * (u.has_w ? w[e] : 1.0f) * t;
  }
  return dot;
}

// kRows > 1 (one 16-byte unit per thread, groups of at most 32 threads, x in the storage type of
// dy): each row slot takes kRows rows per step, all their loads issued before the first
// reduction, so that more bytes are in flight per thread (the one-row step leaves the SM idle
// between its load and its stores). kPlain: the common call fixed at compile time, as in
// gated_fwd_rows_kernel (a weight, no bias, the silu gate after the norm): no per-element choices.
template <class T, int kIters, bool kVec, int kRows = 1, bool kPlain = false>
__global__ void __launch_bounds__(kRowThreads, 2) gated_bwd_kernel(GatedBwdParams p) {
  constexpr int N = kVec ? kVec16<T> : 1;
  constexpr int H = N > 1 ? N / 2 : 1;  // half a unit
  constexpr bool kBatch = kRows == 2;        // batched gates (see gate_batch)
  constexpr int kAcc = kIters > 0 ? kIters : 1;
  __shared__ float scratch[32];
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int slot = threadIdx.x / tpr;
  const int slots = blockDim.x / tpr;
  const int64_t chunk = blockIdx.x / p.G;
  const int64_t col0 = (blockIdx.x - chunk * p.G) * p.g;
  const int64_t grp = col0 / p.g;
  const int64_t r_begin = chunk * p.rows_per_chunk;
  const int64_t r_end = min(p.rows, r_begin + p.rows_per_chunk);
  const int64_t iters = r_end > r_begin ? (r_end - r_begin + slots - 1) / slots : 0;
  const int64_t units = p.g / N;
  const UnitGrads ug{kPlain ? static_cast<int>(kGateSilu) : p.z ? p.gate : static_cast<int>(kNoGate),
                     kPlain || p.nbg, kPlain || p.weight != nullptr, !kPlain && p.bias != nullptr, kFastGate<T>};
  float* part_w = p.part_w ? p.part_w + chunk * p.D + col0 : nullptr;
  float* part_b = p.part_b ? p.part_b + chunk * p.D + col0 : nullptr;

  auto load_unit = [&](int64_t row, int64_t i, float (&dy)[N], float (&x)[N], float (&z)[N], float (&w)[N],
                       float (&b)[N]) {
    load_any<T, N>(p.dy, false, row * p.dy_stride + col0 + i * N, dy);
    load_any<T, N>(p.x, p.x_f32, row * p.x_stride + col0 + i * N, x);
    if (p.z) load_any<T, N>(p.z, false, row * p.z_stride + col0 + i * N, z);
    if (p.weight) load_any<T, N>(p.weight, p.w_f32, col0 + i * N, w);
    if (p.bias) load_any<T, N>(p.bias, p.b_f32, col0 + i * N, b);
  };
  // Stores elements [off, off + H) of unit i of a row: dx (+ dresidual), its copy, dz.
  auto store_half = [&](int64_t row, int64_t i, int off, float (&dx)[H], const float (&dz)[H]) {
    const int64_t at = col0 + i * N + off;
    if (p.dres) {
      float d[H];
      load_any<T, H>(p.dres, p.x_f32, row * p.dres_stride + at, d);
#pragma unroll
      for (int e = 0; e < H; ++e) dx[e] += d[e];
    }
    store_any<T, H>(p.dx, false, row * p.D + at, dx);
    if (p.dres_in) store_any<T, H>(p.dres_in, p.x_f32, row * p.D + at, dx);
    if (p.z) store_any<T, H>(p.dz, false, row * p.D + at, dz);
  };
  // Backward of one unit whose inputs are loaded: both halves, stored as they are done.
  auto unit_out = [&](int64_t row, int64_t i, const Elems<T>& dy_at, const float (&x)[N], const Elems<T>& z_at,
                      const float (&w)[N], const float (&b)[N], float r, float mean, float* acc_w, float* acc_b) {
    float dx[H], dz[H];
    half_backward<N, H, 0, kBatch>(ug, dy_at, x, z_at, w, b, r, mean, dx, dz, acc_w, acc_b);
    store_half(row, i, 0, dx, dz);
    if constexpr (N > H) {
      half_backward<N, H, H, kBatch>(ug, dy_at, x, z_at, w, b, r, mean, dx, dz, acc_w, acc_b);
      store_half(row, i, H, dx, dz);
    }
  };

  if constexpr (kIters > 0) {
    float acc_w[kAcc][N], acc_b[kAcc][N];
#pragma unroll
    for (int j = 0; j < kAcc; ++j)
#pragma unroll
      for (int e = 0; e < N; ++e) acc_w[j][e] = acc_b[j][e] = 0.0f;
    if constexpr (kRows > 1) {
      static_assert(kIters == 1, "the batched-row step holds one unit per thread");
      const bool unit_ok = lane < units;
      float w[N], b[N];  // this thread's columns: the same every step
      if (unit_ok && ug.has_w) load_any<T, N>(p.weight, p.w_f32, col0 + lane * N, w);
      if (unit_ok && ug.has_b) load_any<T, N>(p.bias, p.b_f32, col0 + lane * N, b);
      for (int64_t it = 0; it < iters; it += kRows) {
        // dy, x and z of kRows rows stay in registers in their storage type.
        Raw16 dyr[kRows], xr[kRows], zr[kRows];
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          const int64_t row = r_begin + (it + q) * slots + slot;
          dyr[q] = xr[q] = zr[q] = make_uint4(0, 0, 0, 0);
          if (row < r_end && unit_ok) {
            const int64_t c = col0 + lane * N;
            dyr[q] = load_raw16(static_cast<const T*>(p.dy) + row * p.dy_stride + c);
            xr[q] = load_raw16(static_cast<const T*>(p.x) + row * p.x_stride + c);
            if (ug.gate != kNoGate) zr[q] = load_raw16(static_cast<const T*>(p.z) + row * p.z_stride + c);
          }
        }
        float dot[kRows];
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          float xs[N];
          raw_to_floats<T>(xr[q], xs);
          dot[q] = unit_ok ? unit_dot<N, kBatch>(ug, Elems<T>{dyr[q], nullptr}, xs, Elems<T>{zr[q], nullptr}, w) : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < kRows; ++q) dot[q] = cuda::warp_sum(dot[q], tpr);
#pragma unroll
        for (int q = 0; q < kRows; ++q) {
          const int64_t row = r_begin + (it + q) * slots + slot;
          if (row >= r_end || !unit_ok) continue;
          const float r = p.rstd[row * p.G + grp];
          const float mean = r * dot[q] * p.inv_g;
          float xs[N], dx[N], dz[N];
          raw_to_floats<T>(xr[q], xs);
          half_backward<N, N, 0, kBatch>(ug, Elems<T>{dyr[q], nullptr}, xs, Elems<T>{zr[q], nullptr}, w, b, r, mean, dx, dz,
                                 acc_w[0], acc_b[0]);
          // Whole 16-byte units, each one store instruction (see cuda::store_global).
          const int64_t at = col0 + lane * N;
          if (p.dres) {
            float d[N];
            load_any<T, N>(p.dres, false, row * p.dres_stride + at, d);
#pragma unroll
            for (int e = 0; e < N; ++e) dx[e] += d[e];
          }
          cuda::store_global<T, N>(static_cast<T*>(p.dx) + row * p.D + at, dx);
          if (p.dres_in) cuda::store_global<T, N>(static_cast<T*>(p.dres_in) + row * p.D + at, dx);
          if (ug.gate != kNoGate) cuda::store_global<T, N>(static_cast<T*>(p.dz) + row * p.D + at, dz);
        }
      }
    } else {
      for (int64_t it = 0; it < iters; ++it) {
        const int64_t row = r_begin + it * slots + slot;
        const bool active = row < r_end;
        // dy and z stay in registers in their storage type, x as floats (it may be fp32).
        Raw16 dyr[kIters], zr[kIters];
        float xs[kIters][N];
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kIters; ++j) {
          const int64_t i = static_cast<int64_t>(j) * tpr + lane;
          dyr[j] = zr[j] = make_uint4(0, 0, 0, 0);
          if (active && i < units) {
            dyr[j] = load_raw16(static_cast<const T*>(p.dy) + row * p.dy_stride + col0 + i * N);
            if (p.z) zr[j] = load_raw16(static_cast<const T*>(p.z) + row * p.z_stride + col0 + i * N);
            load_any<T, N>(p.x, p.x_f32, row * p.x_stride + col0 + i * N, xs[j]);
            float w[N];
            if (p.weight) load_any<T, N>(p.weight, p.w_f32, col0 + i * N, w);
            dot += unit_dot<N, kBatch>(ug, Elems<T>{dyr[j], nullptr}, xs[j], Elems<T>{zr[j], nullptr}, w);
          }
        }
        dot = group_sum(dot, tpr, scratch);
        if (!active) continue;
        const float r = p.rstd[row * p.G + grp];
        const float mean = r * dot * p.inv_g;
#pragma unroll
        for (int j = 0; j < kIters; ++j) {
          const int64_t i = static_cast<int64_t>(j) * tpr + lane;
          if (i >= units) continue;
          float w[N], b[N];
          if (p.weight) load_any<T, N>(p.weight, p.w_f32, col0 + i * N, w);
          if (p.bias) load_any<T, N>(p.bias, p.b_f32, col0 + i * N, b);
          unit_out(row, i, Elems<T>{dyr[j], nullptr}, xs[j], Elems<T>{zr[j], nullptr}, w, b, r, mean, acc_w[j],
                   acc_b[j]);
        }
      }
    }
    // Sum the row slots of the block in a fixed order: one partial row per (chunk, group).
    __shared__ float red[kRowThreads * kAcc * N];
    for (int which = 0; which < 2; ++which) {
      float* part = which == 0 ? part_w : part_b;
      if (part == nullptr) continue;  // uniform across the block
#pragma unroll
      for (int j = 0; j < kAcc; ++j) {
        const int64_t i = static_cast<int64_t>(j) * tpr + lane;
        if (i < units)
#pragma unroll
          for (int e = 0; e < N; ++e) red[slot * p.g + i * N + e] = which == 0 ? acc_w[j][e] : acc_b[j][e];
      }
      __syncthreads();
      for (int64_t c = threadIdx.x; c < p.g; c += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < slots; ++k) s += red[k * p.g + c];
        part[c] = s;
      }
      __syncthreads();
    }
  } else {
    // One row at a time for the whole block (tpr == blockDim): every column has one owner, which
    // accumulates straight into this block's partial rows.
    for (int64_t i = lane; i < units; i += tpr)
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (part_w) part_w[i * N + e] = 0.0f;
        if (part_b) part_b[i * N + e] = 0.0f;
      }
    for (int64_t it = 0; it < iters; ++it) {
      const int64_t row = r_begin + it;
      float dot = 0.0f;
      for (int64_t i = lane; i < units; i += tpr) {
        float dy[N], x[N], z[N], w[N], b[N];
        load_unit(row, i, dy, x, z, w, b);
        const Raw16 none = make_uint4(0, 0, 0, 0);
        dot += unit_dot<N, kBatch>(ug, Elems<T>{none, dy}, x, Elems<T>{none, z}, w);
      }
      dot = group_sum(dot, tpr, scratch);
      const float r = p.rstd[row * p.G + grp];
      const float mean = r * dot * p.inv_g;
      for (int64_t i = lane; i < units; i += tpr) {
        float dy[N], x[N], z[N], w[N], b[N], gw[N], gb[N];
        load_unit(row, i, dy, x, z, w, b);
#pragma unroll
        for (int e = 0; e < N; ++e) gw[e] = gb[e] = 0.0f;
        const Raw16 none = make_uint4(0, 0, 0, 0);
        unit_out(row, i, Elems<T>{none, dy}, x, Elems<T>{none, z}, w, b, r, mean, gw, gb);
#pragma unroll
        for (int e = 0; e < N; ++e) {
          if (part_w) part_w[i * N + e] += gw[e];
          if (part_b) part_b[i * N + e] += gb[e];
        }
      }
    }
  }
}

// out[c] = sum_{k < chunks} part[k*D + c] in order (blockIdx.y: 0 weight, 1 bias).
struct FinalizeParams {
  const float* part[2];
  void* out[2];
  bool f32[2];
  int64_t chunks, D;
};

template <class T>
__global__ void __launch_bounds__(256) gated_param_grad_kernel(FinalizeParams p) {
  const int which = blockIdx.y;
  if (p.out[which] == nullptr) return;  // uniform across the block
  // Summed in double (a few hundred partial rows): the fixed order then costs no accuracy.
  __shared__ double sm[8][33];
  const int col_in = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + col_in;
  double s = 0.0;
  if (col < p.D)
    for (int64_t k = slice; k < p.chunks; k += 8) s += p.part[which][k * p.D + col];
  sm[slice][col_in] = s;
  __syncthreads();
  if (slice == 0 && col < p.D) {
    double t = 0.0;
#pragma unroll
    for (int k = 0; k < 8; ++k) t += sm[k][col_in];
    if (p.f32[which]) static_cast<float*>(p.out[which])[col] = static_cast<float>(t);
    else static_cast<T*>(p.out[which])[col] = from_f<T>(static_cast<float>(t));
  }
}

int gate_code(const TensorView& z, GateActivation act) {
  if (!z.defined()) return kNoGate;
  return act == GateActivation::kSigmoid ? kGateSigmoid : kGateSilu;
}

// Rows per group and step of the short-segment kernels: 2. On the H200 at [1048576, 128] bf16
// (16bf7f2): 1 (the general kernels) -> fwd 353 us, fwd+bwd 1.28 ms; 2 -> 323 us, 1.11 ms;
// 4 -> 360 us, 1.21 ms (the 4-row forward spills). The 4-row forms and the knob
// FUSEDOPS_RMSNORM_GATED_ROWS went.
constexpr int kRowsPerStep = 2;

bool is_f32(const TensorView& t) { return t.defined() && t.dtype() == DType::kFloat32; }
bool aligned16(const TensorView& t) { return !t.defined() || cuda::aligned_to(t.data(), 16); }
bool stride_ok(const TensorView& t, int n) { return !t.defined() || t.row_stride() % n == 0; }

template <class T>
void launch_fwd(const Context& ctx, const RmsNormGatedFwdArgs& a) {
  constexpr int NV = kVec16<T>;
  GatedFwdParams p{};
  const int64_t D = a.x.size(-1);
  p.g = rmsnorm_gated::group_cols(D, a.group_size);
  p.G = D / p.g;
  p.D = D;
  p.segments = a.x.rows() * p.G;
  p.x = a.x.data();
  p.z = a.z.defined() ? a.z.data() : nullptr;
  p.residual = a.residual.defined() ? a.residual.data() : nullptr;
  p.weight = a.weight.defined() ? a.weight.data() : nullptr;
  p.bias = a.bias.defined() ? a.bias.data() : nullptr;
  p.y = a.y.data();
  p.residual_out = a.residual_out.defined() ? a.residual_out.data() : nullptr;
  p.rstd = a.rstd.data_as<float>();
  p.x_stride = a.x.row_stride();
  p.z_stride = a.z.defined() ? a.z.row_stride() : 0;
  p.res_stride = a.residual.defined() ? a.residual.row_stride() : 0;
  p.eps = static_cast<float>(a.eps);
  p.inv_g = 1.0f / static_cast<float>(p.g);
  p.gate = gate_code(a.z, a.activation);
  p.nbg = a.norm_before_gate;
  p.w_f32 = is_f32(a.weight);
  p.b_f32 = is_f32(a.bias);
  p.res_f32 = is_f32(a.residual);
  p.rout_f32 = is_f32(a.residual_out);
  const bool vec = p.g % NV == 0 && stride_ok(a.x, NV) && stride_ok(a.z, NV) && stride_ok(a.residual, NV) &&
                   aligned16(a.x) && aligned16(a.z) && aligned16(a.residual) && aligned16(a.weight) &&
                   aligned16(a.bias) && aligned16(a.y) && aligned16(a.residual_out);
  // The segment stays in registers as floats (and z in its storage): aim at one 16-byte unit per
  // thread, so that short rows (128 wide) get 16 threads and a group per 16 rows per block.
  const cuda::RowPlan plan = cuda::plan_rows(p.segments, p.g, NV, vec, 1);
  p.tpr = plan.tpr;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const dim3 grid(static_cast<unsigned>(plan.blocks)), block(plan.threads);
  FUSEDOPS_REQUIRE(plan.blocks <= 0x7fffffff, kValue, kOp, "too many rows for one launch: ", p.segments);
  if (vec && plan.iters == 1 && plan.tpr <= 32 && p.residual == nullptr) {
    const int64_t per_block = (kRowThreads / plan.tpr) * kRowsPerStep;
    const int64_t blocks = (p.segments + per_block - 1) / per_block;
    FUSEDOPS_REQUIRE(blocks <= 0x7fffffff, kValue, kOp, "too many rows for one launch: ", p.segments);
    const dim3 g2(static_cast<unsigned>(blocks));
    const bool plain = p.G == 1 && p.z != nullptr && p.nbg && p.gate == kGateSilu && p.weight != nullptr &&
                       p.bias == nullptr;
    auto kernel = plain ? gated_fwd_rows_kernel<T, kRowsPerStep, true> : gated_fwd_rows_kernel<T, kRowsPerStep, false>;
    kernel<<<g2, block, 0, stream>>>(p);
  } else if (!vec) {
    gated_fwd_kernel<T, 0, false><<<grid, block, 0, stream>>>(p);
  } else {
    switch (plan.iters) {
      case 1: gated_fwd_kernel<T, 1, true><<<grid, block, 0, stream>>>(p); break;
      case 2: gated_fwd_kernel<T, 2, true><<<grid, block, 0, stream>>>(p); break;
      case 4: gated_fwd_kernel<T, 4, true><<<grid, block, 0, stream>>>(p); break;
      case 8: gated_fwd_kernel<T, 8, true><<<grid, block, 0, stream>>>(p); break;
      default: gated_fwd_kernel<T, 0, true><<<grid, block, 0, stream>>>(p); break;
    }
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
}

template <class T>
void launch_bwd(const Context& ctx, const RmsNormGatedBwdArgs& a) {
  constexpr int NV = kVec16<T>;
  GatedBwdParams p{};
  const int64_t D = a.x.size(-1), rows = a.x.rows();
  p.g = rmsnorm_gated::group_cols(D, a.group_size);
  p.G = D / p.g;
  p.D = D;
  p.rows = rows;
  p.dy = a.dy.data();
  p.x = a.x.data();
  p.z = a.z.defined() ? a.z.data() : nullptr;
  p.weight = a.weight.defined() ? a.weight.data() : nullptr;
  p.bias = a.bias.defined() ? a.bias.data() : nullptr;
  p.rstd = a.rstd.data_as<const float>();
  p.dres = a.dresidual.defined() ? a.dresidual.data() : nullptr;
  p.dx = a.dx.data();
  p.dz = a.dz.defined() ? a.dz.data() : nullptr;
  p.dres_in = a.dresidual_in.defined() ? a.dresidual_in.data() : nullptr;
  float* ws = a.workspace.defined() ? static_cast<float*>(a.workspace.data()) : nullptr;
  const int64_t max_chunks = rmsnorm_gated::max_partials(rows);
  p.part_w = a.dweight.defined() ? ws : nullptr;
  p.part_b = a.dbias.defined() ? ws + (a.dweight.defined() ? max_chunks * D : 0) : nullptr;
  p.dy_stride = a.dy.row_stride();
  p.x_stride = a.x.row_stride();
  p.z_stride = a.z.defined() ? a.z.row_stride() : 0;
  p.dres_stride = a.dresidual.defined() ? a.dresidual.row_stride() : 0;
  p.inv_g = 1.0f / static_cast<float>(p.g);
  p.gate = gate_code(a.z, a.activation);
  p.nbg = a.norm_before_gate;
  p.x_f32 = is_f32(a.x);
  p.w_f32 = is_f32(a.weight);
  p.b_f32 = is_f32(a.bias);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);

  int64_t chunks = 0;
  if (rows > 0) {
    const bool vec = p.g % NV == 0 && stride_ok(a.dy, NV) && stride_ok(a.x, NV) && stride_ok(a.z, NV) &&
                     stride_ok(a.dresidual, NV) && aligned16(a.dy) && aligned16(a.x) && aligned16(a.z) &&
                     aligned16(a.weight) && aligned16(a.bias) && aligned16(a.dresidual) &&
                     aligned16(a.dx) && aligned16(a.dz) && aligned16(a.dresidual_in);
    // Register path up to two 16-byte units per thread (the backward holds dy, x and z of each
    // plus the parameter-gradient accumulators); longer or unaligned segments loop.
    cuda::RowPlan plan = cuda::plan_rows(rows, p.g, NV, vec, 1);
    int iters = plan.iters;
    if (iters > 2) iters = 0;
    if (iters == 0) plan.tpr = kRowThreads;  // the loop path gives the block to one row
    p.tpr = plan.tpr;
    auto kernel = gated_bwd_kernel<T, 0, false>;
    if (vec) {
      // Short segments of 16-bit or fp32 x take kRows rows per step (see gated_bwd_kernel).
      const bool batched =
          iters == 1 && plan.tpr <= 32 && (!p.x_f32 || std::is_same_v<T, float>);
      const bool plain = p.z != nullptr && p.nbg && p.gate == kGateSilu && p.weight != nullptr && p.bias == nullptr;
      kernel = batched     ? (plain ? gated_bwd_kernel<T, 1, true, kRowsPerStep, true>
                                    : gated_bwd_kernel<T, 1, true, kRowsPerStep>)
               : iters == 1 ? gated_bwd_kernel<T, 1, true>
               : iters == 2 ? gated_bwd_kernel<T, 2, true>
                            : gated_bwd_kernel<T, 0, true>;
    }
    // One wave of (chunk, group) blocks: each SM's resident blocks times the SM count, at most
    // kMaxPartials chunks, each chunk a contiguous run of rows.
    int per_sm = 1;
    FUSEDOPS_CUDA_CHECK(kOp, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRowThreads, 0));
    const int64_t wave = static_cast<int64_t>(std::max(per_sm, 1)) * cuda::sm_count(kOp, ctx.device.index);
    chunks = std::clamp<int64_t>((wave + p.G - 1) / p.G, 1, max_chunks);
    p.rows_per_chunk = (rows + chunks - 1) / chunks;
    chunks = (rows + p.rows_per_chunk - 1) / p.rows_per_chunk;
    const int64_t blocks = chunks * p.G;
    FUSEDOPS_REQUIRE(blocks <= 0x7fffffff, kValue, kOp, "too many groups for one launch: ", blocks);
    kernel<<<dim3(static_cast<unsigned>(blocks)), dim3(kRowThreads), 0, stream>>>(p);
    FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
  }
  if (a.dweight.defined() || a.dbias.defined()) {
    FinalizeParams f{};
    f.part[0] = p.part_w;
    f.part[1] = p.part_b;
    f.out[0] = a.dweight.defined() ? a.dweight.data() : nullptr;
    f.out[1] = a.dbias.defined() ? a.dbias.data() : nullptr;
    f.f32[0] = is_f32(a.dweight);
    f.f32[1] = is_f32(a.dbias);
    f.chunks = chunks;
    f.D = D;
    const dim3 grid(static_cast<unsigned>((D + 31) / 32), 2);
    gated_param_grad_kernel<T><<<grid, dim3(256), 0, stream>>>(f);
    FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
  }
}

bool supports_fwd(const RmsNormGatedFwdArgs& a) { return a.rstd.dtype() == DType::kFloat32; }
bool supports_bwd(const RmsNormGatedBwdArgs& a) { return a.rstd.dtype() == DType::kFloat32; }

void fwd(const Context& ctx, const RmsNormGatedFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::visit_dtype(a.x.dtype(), [&](auto t) { launch_fwd<decltype(t)>(ctx, a); });
}

void bwd(const Context& ctx, const RmsNormGatedBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  cuda::visit_dtype(a.dy.dtype(), [&](auto t) { launch_bwd<decltype(t)>(ctx, a); });
}

}  // namespace

void register_rmsnorm_gated_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<RmsNormGatedFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<RmsNormGatedBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
