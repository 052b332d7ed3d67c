// clipped_swiglu, generic CUDA backend (sm_80 and later): one streaming pass, 16-byte accesses.
//
// x is [M, K] (rows of K inputs giving K/2 outputs). A thread handles one "unit" of N = 16 bytes
// of outputs at a time (8 bf16/fp16 or 4 fp32 values): it reads the matching 2N inputs (two
// 16-byte loads, interleaved or one from each half), writes one 16-byte store; the backward reads
// dy's unit and x's 2N inputs and writes dx's 2N values. Blocks stride over the units (a grid of
// about one wave), each thread stepping its row/column position without divisions. With a
// group_index every block first sums it (G <= 8192 int64, an integer reduction, so exact) to get
// M_eff; rows >= M_eff are written as zeros without reading x. Rows whose layout forbids 16-byte
// accesses (K/2 not a multiple of N, or unaligned pointers) take the same loop one element at a
// time.
#include <algorithm>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/clipped_swiglu.h"
#include "src/cuda/check.cuh"
#include "src/cuda/device_errors.cuh"
#include "src/cuda/fastmath.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/clipped_swiglu/clipped_swiglu_common.h"

namespace fusedops {
namespace {

using clipped_swiglu::kOp;
using clipped_swiglu::Rows2d;
using cuda::kVec16;
using cuda::raw_to_floats;
using cuda::load_raw16;
using cuda::store_floats;
using cuda::to_f;
using cuda::from_f;

constexpr int kThreads = 256;

struct SwigluParams {
  const void* x;
  const void* dy;  // backward only
  void* out;       // y (forward) or dx (backward)
  const int64_t* group_index;  // nullptr: every row
  int64_t groups, group_stride;
  DeviceErrorRecord* record;   // where block 0 reports negative group_index entries
  uint32_t negative_group_code;
  int64_t M, K, half;
  int64_t units_per_row;  // outputs per row / N
  int64_t total_units;    // M * units_per_row
  int64_t step_rows, step_cols;  // the grid stride in (rows, units) form
  float alpha, limit, bias;
  int mode;
};

// `fast` (16-bit storage, cuda::kFastSigmoid): cuda::sigmoid_exp's approximate form, a few ulp,
// far below the output's rounding, instead of expf and a correctly rounded reciprocal (about a
// dozen instructions and a fallback branch per element).
using cuda::kFastSigmoid;
__device__ __forceinline__ float sigmoid_f(float v, bool fast) {
  float e, s;
  cuda::sigmoid_exp(v, e, s, fast);
  return s;
}
// s = sigmoid(v) and 1 - s: exp(-v) * s for v >= 0 (no cancellation where s is close to 1),
// 1 - s below (where exp(-v) may overflow and s is at most 1/2).
__device__ __forceinline__ void sigmoid_pair(float v, float& s, float& one_minus_s, bool fast) {
  float e;
  cuda::sigmoid_exp(v, e, s, fast);
  one_minus_s = v >= 0.0f ? e * s : 1.0f - s;
}
// torch.clamp's semantics (NaN propagates).
__device__ __forceinline__ float clamp_max(float v, float hi) { return v > hi ? hi : v; }
__device__ __forceinline__ float clamp_both(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

__device__ __forceinline__ float forward_value(float A, float B, const SwigluParams& p, bool fast) {
  const float b = clamp_both(B, -p.limit, p.limit);
  if (p.mode == 0) {
    const float a = clamp_max(A, p.limit);
    return a * sigmoid_f(p.alpha * a, fast) * (b + p.bias);
  }
  return clamp_max(A * sigmoid_f(A, fast), p.limit) * b;
}

__device__ __forceinline__ void backward_value(float A, float B, float dy, const SwigluParams& p,
                                               float& dA, float& dB, bool fast) {
  const float b = clamp_both(B, -p.limit, p.limit);
  const bool b_pass = B >= -p.limit && B <= p.limit;
  if (p.mode == 0) {
    const float a = clamp_max(A, p.limit);
    float s, s1;
    sigmoid_pair(p.alpha * a, s, s1, fast);
    dA = A <= p.limit ? dy * (b + p.bias) * (s + p.alpha * a * s * s1) : 0.0f;
    dB = b_pass ? dy * a * s : 0.0f;
  } else {
    float s, s1;
    sigmoid_pair(A, s, s1, fast);
    const float silu = A * s;
    dA = silu <= p.limit ? dy * b * s * (1.0f + A * s1) : 0.0f;
    dB = b_pass ? dy * clamp_max(silu, p.limit) : 0.0f;
  }
}

// clamp(sum(group_index), 0, M), computed by the whole block (every thread must call it). Each
// entry is clamped to [0, M] first (so that no sum overflows); block 0 reports negative ones.
__device__ int64_t effective_rows(const SwigluParams& p) {
  if (p.group_index == nullptr) return p.M;
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  long long v = 0;
  for (int64_t i = threadIdx.x; i < p.groups; i += blockDim.x) {
    const int64_t g = p.group_index[i * p.group_stride];
    if (g < 0 && blockIdx.x == 0) cuda::report_bad_input(p.record, p.negative_group_code, i, g);
    v += g < 0 ? 0 : (g > p.M ? p.M : g);
  }
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  // Integer addition: the order does not change the result.
  if ((threadIdx.x & 31) == 0) atomicAdd(&total, static_cast<unsigned long long>(v));
  __syncthreads();
  const long long s = static_cast<long long>(total);
  return s < 0 ? 0 : (s > p.M ? p.M : s);
}

// Walks this thread's units: (row, col) of unit u, then of u + stride, ... without divisions.
struct UnitWalker {
  int64_t row, col;
  __device__ UnitWalker(int64_t u, int64_t per_row) : row(u / per_row), col(u - (u / per_row) * per_row) {}
  __device__ void advance(const SwigluParams& p) {
    row += p.step_rows;
    col += p.step_cols;
    if (col >= p.units_per_row) {
      col -= p.units_per_row;
      ++row;
    }
  }
};

template <class T, bool kInterleaved, bool kVec>
__global__ void __launch_bounds__(kThreads) swiglu_fwd_kernel(SwigluParams p) {
  constexpr int N = kVec ? kVec16<T> : 1;
  const int64_t m_eff = effective_rows(p);
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.out);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= p.total_units) return;
  UnitWalker w(u, p.units_per_row);
  for (; u < p.total_units; u += stride, w.advance(p)) {
    T* yr = y + w.row * p.half + w.col * N;
    float out[N];
    if (w.row >= m_eff) {
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = 0.0f;
    } else {
      const T* xr = x + w.row * p.K;
      float A[N], B[N];
      if constexpr (kVec && kInterleaved) {
        float lo[N], hi[N];
        const T* src = xr + w.col * 2 * N;
        raw_to_floats<T>(load_raw16(src), lo);
        raw_to_floats<T>(load_raw16(src + N), hi);
#pragma unroll
        for (int e = 0; e < N / 2; ++e) {
          A[e] = lo[2 * e];
          B[e] = lo[2 * e + 1];
          A[N / 2 + e] = hi[2 * e];
          B[N / 2 + e] = hi[2 * e + 1];
        }
      } else if constexpr (kVec) {
        raw_to_floats<T>(load_raw16(xr + w.col * N), A);
        raw_to_floats<T>(load_raw16(xr + p.half + w.col * N), B);
      } else if constexpr (kInterleaved) {
        A[0] = to_f(xr[2 * w.col]);
        B[0] = to_f(xr[2 * w.col + 1]);
      } else {
        A[0] = to_f(xr[w.col]);
        B[0] = to_f(xr[p.half + w.col]);
      }
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = forward_value(A[e], B[e], p, kFastSigmoid<T>);
    }
    if constexpr (kVec) {
      store_floats<N>(yr, out);
    } else {
      *yr = from_f<T>(out[0]);
    }
  }
}

template <class T, bool kInterleaved, bool kVec>
__global__ void __launch_bounds__(kThreads) swiglu_bwd_kernel(SwigluParams p) {
  constexpr int N = kVec ? kVec16<T> : 1;
  const int64_t m_eff = effective_rows(p);
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.out);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= p.total_units) return;
  UnitWalker w(u, p.units_per_row);
  for (; u < p.total_units; u += stride, w.advance(p)) {
    const int64_t row_off = w.row * p.K;
    float dA[N], dB[N];
    if (w.row >= m_eff) {
#pragma unroll
      for (int e = 0; e < N; ++e) dA[e] = dB[e] = 0.0f;
    } else {
      const T* xr = x + row_off;
      float A[N], B[N], g[N];
      if constexpr (kVec) {
        raw_to_floats<T>(load_raw16(dy + w.row * p.half + w.col * N), g);
      } else {
        g[0] = to_f(dy[w.row * p.half + w.col]);
      }
      if constexpr (kVec && kInterleaved) {
        float lo[N], hi[N];
        const T* src = xr + w.col * 2 * N;
        raw_to_floats<T>(load_raw16(src), lo);
        raw_to_floats<T>(load_raw16(src + N), hi);
#pragma unroll
        for (int e = 0; e < N / 2; ++e) {
          A[e] = lo[2 * e];
          B[e] = lo[2 * e + 1];
          A[N / 2 + e] = hi[2 * e];
          B[N / 2 + e] = hi[2 * e + 1];
        }
      } else if constexpr (kVec) {
        raw_to_floats<T>(load_raw16(xr + w.col * N), A);
        raw_to_floats<T>(load_raw16(xr + p.half + w.col * N), B);
      } else if constexpr (kInterleaved) {
        A[0] = to_f(xr[2 * w.col]);
        B[0] = to_f(xr[2 * w.col + 1]);
      } else {
        A[0] = to_f(xr[w.col]);
        B[0] = to_f(xr[p.half + w.col]);
      }
#pragma unroll
      for (int e = 0; e < N; ++e) backward_value(A[e], B[e], g[e], p, dA[e], dB[e], kFastSigmoid<T>);
    }
    T* dxr = dx + row_off;
    if constexpr (kVec && kInterleaved) {
      float lo[N], hi[N];
#pragma unroll
      for (int e = 0; e < N / 2; ++e) {
        lo[2 * e] = dA[e];
        lo[2 * e + 1] = dB[e];
        hi[2 * e] = dA[N / 2 + e];
        hi[2 * e + 1] = dB[N / 2 + e];
      }
      store_floats<N>(dxr + w.col * 2 * N, lo);
      store_floats<N>(dxr + w.col * 2 * N + N, hi);
    } else if constexpr (kVec) {
      store_floats<N>(dxr + w.col * N, dA);
      store_floats<N>(dxr + p.half + w.col * N, dB);
    } else if constexpr (kInterleaved) {
      dxr[2 * w.col] = from_f<T>(dA[0]);
      dxr[2 * w.col + 1] = from_f<T>(dB[0]);
    } else {
      dxr[w.col] = from_f<T>(dA[0]);
      dxr[p.half + w.col] = from_f<T>(dB[0]);
    }
  }
}

SwigluParams make_params(const TensorView& x, int dim, const TensorView& gi, double alpha,
                         double limit, double bias, int mode) {
  const Rows2d s = clipped_swiglu::rows_2d(x, dim);
  SwigluParams p{};
  p.x = x.data();
  p.group_index = gi.defined() ? gi.data_as<const int64_t>() : nullptr;
  p.groups = gi.defined() ? gi.size(0) : 0;
  p.group_stride = gi.defined() ? gi.stride(0) : 0;
  if (gi.defined()) {
    int device = 0;
    FUSEDOPS_CUDA_CHECK(kOp, cudaGetDevice(&device));
    p.record = cuda::device_error_record(kOp, device);
    static const uint32_t code = device_error_code(
        kOp, "group_index[{index}] = {value} is negative (counted as 0)");
    p.negative_group_code = code;
  }
  p.M = s.M;
  p.K = s.K;
  p.half = s.half;
  p.alpha = static_cast<float>(alpha);
  p.limit = static_cast<float>(limit);
  p.bias = static_cast<float>(bias);
  p.mode = mode;
  return p;
}

template <class T, bool I, bool V>
struct LaunchFwd {
  static auto kernel() { return swiglu_fwd_kernel<T, I, V>; }
  static void go(dim3 g, dim3 b, cudaStream_t s, const SwigluParams& p) {
    swiglu_fwd_kernel<T, I, V><<<g, b, 0, s>>>(p);
  }
};
template <class T, bool I, bool V>
struct LaunchBwd {
  static auto kernel() { return swiglu_bwd_kernel<T, I, V>; }
  static void go(dim3 g, dim3 b, cudaStream_t s, const SwigluParams& p) {
    swiglu_bwd_kernel<T, I, V><<<g, b, 0, s>>>(p);
  }
};

// Fills the unit geometry and grid, then launches kernel<T, interleaved, vec>.
template <class T, template <class, bool, bool> class Launch>
void run(const Context& ctx, SwigluParams p, bool interleaved, bool vec) {
  constexpr int NV = kVec16<T>;
  const int n = vec ? NV : 1;
  p.units_per_row = p.half / n;
  p.total_units = p.M * p.units_per_row;
  const int64_t blocks_needed = (p.total_units + kThreads - 1) / kThreads;
  // Exactly one wave of resident blocks, striding over the rest: every block then does the same
  // work and none waits for a second wave.
  const auto launcher = [&](auto l) {
    using L = decltype(l);
    int per_sm = 0;
    FUSEDOPS_CUDA_CHECK(kOp, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, L::kernel(), kThreads, 0));
    return std::max(per_sm, 1);
  };
  int per_sm = 1;
  if (interleaved) per_sm = vec ? launcher(Launch<T, true, true>{}) : launcher(Launch<T, true, false>{});
  else per_sm = vec ? launcher(Launch<T, false, true>{}) : launcher(Launch<T, false, false>{});
  const int64_t wave = static_cast<int64_t>(cuda::sm_count(kOp, ctx.device.index)) * per_sm;
  const int64_t blocks = std::max<int64_t>(1, std::min(blocks_needed, wave));
  const int64_t stride = blocks * kThreads;
  p.step_rows = stride / p.units_per_row;
  p.step_cols = stride % p.units_per_row;
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kThreads);
  if (interleaved) {
    if (vec) Launch<T, true, true>::go(grid, block, stream, p);
    else Launch<T, true, false>::go(grid, block, stream, p);
  } else {
    if (vec) Launch<T, false, true>::go(grid, block, stream, p);
    else Launch<T, false, false>::go(grid, block, stream, p);
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
}


void fwd(const Context& ctx, const ClippedSwigluFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  SwigluParams p = make_params(a.x, a.dim, a.group_index, a.alpha, a.limit, a.bias, a.clamp_mode);
  p.out = a.y.data();
  cuda::visit_dtype(a.x.dtype(), [&](auto t) {
    using T = decltype(t);
    constexpr int N = kVec16<T>;
    const bool vec = p.half % N == 0 && cuda::aligned_to(p.x, 16) && cuda::aligned_to(p.out, 16);
    run<T, LaunchFwd>(ctx, p, a.interleaved, vec);
  });
}

void bwd(const Context& ctx, const ClippedSwigluBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  SwigluParams p = make_params(a.x, a.dim, a.group_index, a.alpha, a.limit, a.bias, a.clamp_mode);
  p.dy = a.dy.data();
  p.out = a.dx.data();
  cuda::visit_dtype(a.x.dtype(), [&](auto t) {
    using T = decltype(t);
    constexpr int N = kVec16<T>;
    const bool vec = p.half % N == 0 && cuda::aligned_to(p.x, 16) && cuda::aligned_to(p.dy, 16) &&
                     cuda::aligned_to(p.out, 16);
    run<T, LaunchBwd>(ctx, p, a.interleaved, vec);
  });
}

}  // namespace

void register_clipped_swiglu_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<ClippedSwigluFwdArgs>(kOp, Direction::kForward, spec, nullptr, fwd);
  r.add<ClippedSwigluBwdArgs>(kOp, Direction::kBackward, spec, nullptr, bwd);
}

}  // namespace fusedops
