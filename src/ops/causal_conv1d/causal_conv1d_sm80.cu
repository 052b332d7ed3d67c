// causal_conv1d, generic CUDA backend (sm_80 and later).
//
// Forward: one pass over x. A block owns (a time tile, 32 channel vectors); each of its 8 rows of
// threads (threadIdx.y) takes a run of 16 consecutive time steps, each thread 16 bytes of
// channels (8 bf16 / fp16 or 4 fp32; 4 channels when a residual is streamed too; 1 element on
// the scalar fallback). A thread slides over its run keeping the last W input rows in registers
// (a ring whose slots are compile-time within an unrolled chunk of rows, so no register moves),
// reads the W-1 rows before its run once (the halo), issues the loads of a chunk of rows before
// using them and prefetches the next chunk into L2.
//
// Backward (2 channels per thread, 32 steps per run, 93 registers: two blocks per SM without
// spills): the same walk recomputes a = conv(x) + bias, forms g = dy * act'(a), keeps the last
// W values of g in a second ring and emits dx[t-W+1] = sum_j w[W-1-j] g[t-W+1+j] (+ the
// final-state gradient on the last W tokens of a sequence); it reads W-1 rows of x and dy past
// its run (g there feeds dx of its own rows). dweight and dbias are per-thread fp32 sums over
// the run, reduced over the block's 8 runs in shared memory in a fixed order and written as one
// partial row per block; a second kernel sums the partial rows over blocks in block order. No
// atomics: bitwise reproducible. d_initial_state (first W-1 tokens of each sequence) and the
// forward's final_state are small per-(sequence, channel) kernels.
//
// Varlen: blocks tile the packed time axis; a thread finds the sequence of its first row by
// binary search in cu_seqlens and restarts its rings at every sequence start inside its run
// (rows before a sequence start come from initial_state or are 0). Nothing is read from the
// host: the call is CUDA-graph capturable.
#include <algorithm>
#include <type_traits>

#include "fusedops/core/registry.h"
#include "fusedops/ops/causal_conv1d.h"
#include "src/cuda/check.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/causal_conv1d/causal_conv1d_common.h"

namespace fusedops {
namespace conv1d {

void cuda_copy_to_host(const Context& ctx, const void* src, void* dst, size_t bytes) {
  cuda::DeviceGuard guard("causal_conv1d", ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  FUSEDOPS_CUDA_CHECK("causal_conv1d",
                      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  FUSEDOPS_CUDA_CHECK("causal_conv1d", cudaStreamSynchronize(stream));
}

}  // namespace conv1d

namespace {

constexpr const char* kOp = "causal_conv1d";
constexpr int kThreadsX = 32;  // channel vectors per block
constexpr int kThreadsY = 8;   // time runs per block
constexpr int kThreads = kThreadsX * kThreadsY;
constexpr int kFwdRowsPerThread = 16;
constexpr int kBwdRowsPerThread = static_cast<int>(conv1d::kCudaBwdRows) / kThreadsY;
constexpr int kMaxWidth = 8;
static_assert(kBwdRowsPerThread * kThreadsY == conv1d::kCudaBwdRows, "tile mismatch");

// DType codes of the small tensors read or written element by element.
enum : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
int code_of(DType d) {
  return d == DType::kFloat32 ? kF32 : d == DType::kFloat16 ? kF16 : kBF16;
}

__device__ __forceinline__ float load_elem(const void* p, int64_t i, int code) {
  if (code == kF32) return static_cast<const float*>(p)[i];
  if (code == kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store_elem(void* p, int64_t i, int code, float v) {
  if (code == kF32) {
    static_cast<float*>(p)[i] = v;
  } else if (code == kF16) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

struct Params {
  const void* x;
  const void* residual;  // forward, or nullptr
  const void* dy;        // backward
  int64_t x_sb, x_st, r_sb, r_st, dy_sb, dy_st;  // element strides (batch, time)
  void* out;                                     // y (forward) or dx (backward): [B,T,D] dense
  const void* weight;
  int64_t w_sk, w_sd;
  const void* bias;     // or nullptr
  const void* h0;       // [N,D,W] or nullptr
  const void* dht;      // [N,D,W] or nullptr
  const void* cu;       // [N+1] or nullptr
  void* state_out;      // final_state (forward) / d_initial_state (backward), or nullptr
  float* partial;       // [tiles][prows][D] fp32, or nullptr
  void* dweight;        // or nullptr
  void* dbias;          // or nullptr
  int64_t B, T, D, N;
  int64_t tiles_per_batch;  // time tiles per batch (non-varlen)
  int W;
  int w_code, b_code, h0_code, dht_code, state_code, dw_code, db_code;
  int cu64;
  int silu;
  int want_dw, want_db;
};

// Raw storage of kN elements of T (16, 8 or 4 bytes) in 32-bit registers, or one element.
template <class T, int kN>
using RawT = std::conditional_t<
    kN == 1, T,
    std::conditional_t<kN * sizeof(T) == 16, uint4,
                       std::conditional_t<kN * sizeof(T) == 8, uint2, uint32_t>>>;

template <class T, int kN>
__device__ __forceinline__ RawT<T, kN> load_raw(const T* p) {
  return *reinterpret_cast<const RawT<T, kN>*>(p);
}

template <class T, int kN>
__device__ __forceinline__ void raw_floats(const RawT<T, kN>& r, float (&out)[kN]) {
  if constexpr (kN == 1) {
    out[0] = cuda::to_f(r);
  } else if constexpr (kN * sizeof(T) == 16) {
    cuda::raw_to_floats<T>(r, out);
  } else if constexpr (sizeof(T) == 4) {
    static_assert(kN == 2, "8 bytes of fp32");
    out[0] = __uint_as_float(r.x);
    out[1] = __uint_as_float(r.y);
  } else if constexpr (kN == 4) {
    const float2 lo = cuda::unpack_word<T>(r.x), hi = cuda::unpack_word<T>(r.y);
    out[0] = lo.x;
    out[1] = lo.y;
    out[2] = hi.x;
    out[3] = hi.y;
  } else {
    static_assert(kN == 2, "4 bytes of 16-bit values");
    const float2 v = cuda::unpack_word<T>(r);
    out[0] = v.x;
    out[1] = v.y;
  }
}

template <class T, int kN>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[kN]) {
  if constexpr (kN == 1) {
    *p = cuda::from_f<T>(v[0]);
  } else {
    cuda::store_floats<kN>(p, v);
  }
}

// Starts bringing the line holding p into L2 (no register is tied up waiting for it): the
// rows of the next chunk are in flight while this chunk's loads are used.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ float sigmoid(float a) { return __frcp_rn(1.0f + __expf(-a)); }

__device__ __forceinline__ int64_t offset_at(const void* cu, int cu64, int64_t i) {
  return cu64 ? static_cast<const int64_t*>(cu)[i]
              : static_cast<int64_t>(static_cast<const int32_t*>(cu)[i]);
}

// The sequence a thread's rows belong to, tracked as the thread moves forward in time. Time
// indices are 32-bit (the host checks T < 2^31); memory offsets are 64-bit.
struct Sequence {
  int n, bos, eos;
};

__device__ __forceinline__ int clamp_time(int64_t v, int T) {
  return v < 0 ? 0 : (v > T ? T : static_cast<int>(v));
}

// Smallest n with cu[n+1] > t (N when none): the sequence that holds time t.
__device__ int find_sequence(const Params& p, int t) {
  int lo = 0, hi = static_cast<int>(p.N);
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (offset_at(p.cu, p.cu64, mid + 1) > t) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Moves s to the sequence holding time t (skipping empty ones); false past the last sequence.
// Offsets are clamped to [0, T] and bos to <= t so that malformed cu_seqlens (only rejected in
// validate mode) never cause an out-of-bounds access.
__device__ __forceinline__ bool seek(const Params& p, Sequence& s, int t) {
  if (p.cu == nullptr) return true;
  const int T = static_cast<int>(p.T), N = static_cast<int>(p.N);
  while (s.n < N && clamp_time(offset_at(p.cu, p.cu64, s.n + 1), T) <= t) ++s.n;
  if (s.n >= N) return false;
  s.bos = min(clamp_time(offset_at(p.cu, p.cu64, s.n), T), t);
  s.eos = clamp_time(offset_at(p.cu, p.cu64, s.n + 1), T);
  return true;
}

// The extended input x~ at absolute time r of sequence s (r < bos: the initial state or 0).
template <class T, int kN>
__device__ __forceinline__ void load_extended(const Params& p, const T* xb, const Sequence& s,
                                              int r, int64_t d0, float (&out)[kN]) {
  if (r >= s.bos) {
    raw_floats<T, kN>(load_raw<T, kN>(xb + r * p.x_st + d0), out);
    return;
  }
  const int tau = r - s.bos;  // < 0
#pragma unroll
  for (int e = 0; e < kN; ++e)
    out[e] = (p.h0 != nullptr && tau >= -p.W)
                 ? load_elem(p.h0, (s.n * p.D + d0 + e) * p.W + tau + p.W, p.h0_code)
                 : 0.0f;
}

// Weights as a width-kW filter: the real W taps right-aligned, zeros before them.
template <int kW, int kN>
__device__ __forceinline__ void load_weights(const Params& p, int64_t d0, float (&w)[kW][kN]) {
#pragma unroll
  for (int k = 0; k < kW; ++k) {
    const int kr = k - (kW - p.W);
#pragma unroll
    for (int e = 0; e < kN; ++e)
      w[k][e] = kr >= 0 ? load_elem(p.weight, kr * p.w_sk + (d0 + e) * p.w_sd, p.w_code) : 0.0f;
  }
}

template <int kN>
__device__ __forceinline__ void load_bias(const Params& p, int64_t d0, float (&b)[kN]) {
#pragma unroll
  for (int e = 0; e < kN; ++e) b[e] = p.bias != nullptr ? load_elem(p.bias, d0 + e, p.b_code) : 0.0f;
}

// Rows per unrolled chunk: a multiple of the ring size, at least 4 (loads in flight).
template <int kW>
inline constexpr int kChunk = kW * ((4 + kW - 1) / kW);

// This thread's rows [t_begin, t_end) and batch, from the block's tile.
struct Run {
  int64_t batch;
  int t_begin, t_end;
};
__device__ __forceinline__ Run thread_run(const Params& p, int rows_per_thread) {
  const int64_t rows_per_block = static_cast<int64_t>(rows_per_thread) * kThreadsY;
  Run r;
  int64_t tile = blockIdx.x;
  r.batch = 0;
  if (p.cu == nullptr) {
    r.batch = tile / p.tiles_per_batch;
    tile -= r.batch * p.tiles_per_batch;
  }
  const int64_t begin = tile * rows_per_block + static_cast<int64_t>(threadIdx.y) * rows_per_thread;
  r.t_begin = static_cast<int>(min(begin, p.T));
  r.t_end = static_cast<int>(min(begin + rows_per_thread, p.T));
  return r;
}

template <class T, int kW, int kN, bool kResidual>
__global__ void __launch_bounds__(kThreads, 2) causal_conv1d_fwd_kernel(Params p) {
  constexpr int U = kChunk<kW>;
  const int64_t d0 = (static_cast<int64_t>(blockIdx.y) * kThreadsX + threadIdx.x) * kN;
  if (d0 >= p.D) return;
  const Run run = thread_run(p, kFwdRowsPerThread);
  if (run.t_begin >= run.t_end) return;
  const T* xb = static_cast<const T*>(p.x) + run.batch * p.x_sb + d0;
  const T* rb = kResidual ? static_cast<const T*>(p.residual) + run.batch * p.r_sb + d0 : nullptr;
  T* yb = static_cast<T*>(p.out) + run.batch * p.T * p.D + d0;

  float w[kW][kN], bias[kN];
  load_weights<kW, kN>(p, d0, w);
  load_bias<kN>(p, d0, bias);

  Sequence s{static_cast<int>(run.batch), 0, static_cast<int>(p.T)};
  if (p.cu) s.n = find_sequence(p, run.t_begin);
  for (int t = run.t_begin; t < run.t_end;) {
    if (!seek(p, s, t)) break;
    const int seg_end = min(s.eos, run.t_end);
    float xr[kW][kN];  // row t-(kW-1)+j of the segment in slot j
#pragma unroll
    for (int j = 0; j < kW - 1; ++j) load_extended<T, kN>(p, xb - d0, s, t - (kW - 1) + j, d0, xr[j]);
    for (int c0 = t; c0 < seg_end; c0 += U) {
      RawT<T, kN> xs[U], rs[kResidual ? U : 1];
#pragma unroll
      for (int i = U; i < 2 * U; ++i) {
        if (c0 + i < seg_end) {
          prefetch_l2(xb + (c0 + i) * p.x_st);
          if constexpr (kResidual) prefetch_l2(rb + (c0 + i) * p.r_st);
        }
      }
#pragma unroll
      for (int i = 0; i < U; ++i) {
        if (c0 + i < seg_end) {
          xs[i] = load_raw<T, kN>(xb + (c0 + i) * p.x_st);
          if constexpr (kResidual) rs[i] = load_raw<T, kN>(rb + (c0 + i) * p.r_st);
        }
      }
#pragma unroll
      for (int i = 0; i < U; ++i) {
        if (c0 + i >= seg_end) break;
        raw_floats<T, kN>(xs[i], xr[(i + kW - 1) % kW]);
        float a[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e) a[e] = bias[e];
#pragma unroll
        for (int k = 0; k < kW; ++k)
#pragma unroll
          for (int e = 0; e < kN; ++e) a[e] = fmaf(w[k][e], xr[(i + k) % kW][e], a[e]);
        if (p.silu) {
#pragma unroll
          for (int e = 0; e < kN; ++e) a[e] *= sigmoid(a[e]);
        }
        if constexpr (kResidual) {
          float r[kN];
          raw_floats<T, kN>(rs[i], r);
#pragma unroll
          for (int e = 0; e < kN; ++e) a[e] += r[e];
        }
        store_vec<T, kN>(yb + static_cast<int64_t>(c0 + i) * p.D, a);
      }
    }
    t = seg_end;
  }
}

template <class T, int kW, int kN>
__global__ void __launch_bounds__(kThreads, 2) causal_conv1d_bwd_kernel(Params p) {
  constexpr int U = kChunk<kW>;
  constexpr int kCols = kThreadsX * kN;
  __shared__ float red[kThreadsY][kCols];
  // The bias of the block's channels, read each row from shared memory (registers are short).
  __shared__ __align__(16) float sbias[kCols];
  const int64_t d0 = (static_cast<int64_t>(blockIdx.y) * kThreadsX + threadIdx.x) * kN;
  if (threadIdx.y == 0) {
#pragma unroll
    for (int e = 0; e < kN; ++e)
      sbias[threadIdx.x * kN + e] =
          (p.bias != nullptr && d0 + e < p.D) ? load_elem(p.bias, d0 + e, p.b_code) : 0.0f;
  }
  __syncthreads();
  const Run run = thread_run(p, kBwdRowsPerThread);
  float dw[kW][kN], db[kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    db[e] = 0.0f;
#pragma unroll
    for (int k = 0; k < kW; ++k) dw[k][e] = 0.0f;
  }

  if (d0 < p.D && run.t_begin < run.t_end) {
    const T* xb = static_cast<const T*>(p.x) + run.batch * p.x_sb + d0;
    const T* dyb = static_cast<const T*>(p.dy) + run.batch * p.dy_sb + d0;
    T* dxb = static_cast<T*>(p.out) + run.batch * p.T * p.D + d0;
    float w[kW][kN];
    load_weights<kW, kN>(p, d0, w);
    const float* bias = sbias + threadIdx.x * kN;

    Sequence s{static_cast<int>(run.batch), 0, static_cast<int>(p.T)};
    if (p.cu) s.n = find_sequence(p, run.t_begin);
    for (int t = run.t_begin; t < run.t_end;) {
      if (!seek(p, s, t)) break;
      const int seg_end = min(s.eos, run.t_end);           // rows owned: dx, dweight
      const int look_end = min(s.eos, run.t_end + kW - 1);  // rows whose g is needed
      const int loop_end = seg_end + kW - 1;                // rows past look_end: g = 0
      // dx rows at local time >= L - W also get the final-state gradient.
      const int dht_from = p.dht != nullptr ? s.eos - p.W : INT_MAX;
      // gr needs no initial value: dx of row tau >= t reads g of rows tau..tau+kW-1, each
      // written (possibly as 0 past the sequence end) before that read.
      float xr[kW][kN], gr[kW][kN];
#pragma unroll
      for (int j = 0; j < kW - 1; ++j)
        load_extended<T, kN>(p, xb - d0, s, t - (kW - 1) + j, d0, xr[j]);
      for (int c0 = t; c0 < loop_end; c0 += U) {
        RawT<T, kN> xs[U], gs[U];
#pragma unroll
        for (int i = U; i < 2 * U; ++i) {
          if (c0 + i < look_end) {
            prefetch_l2(xb + (c0 + i) * p.x_st);
            prefetch_l2(dyb + (c0 + i) * p.dy_st);
          }
        }
#pragma unroll
        for (int i = 0; i < U; ++i) {
          if (c0 + i < look_end) {
            xs[i] = load_raw<T, kN>(xb + (c0 + i) * p.x_st);
            gs[i] = load_raw<T, kN>(dyb + (c0 + i) * p.dy_st);
          }
        }
#pragma unroll
        for (int i = 0; i < U; ++i) {
          const int u = c0 + i;
          if (u >= loop_end) break;
          float(&g)[kN] = gr[(i + kW - 1) % kW];
          if (u < look_end) {
            raw_floats<T, kN>(xs[i], xr[(i + kW - 1) % kW]);
            float a[kN];
#pragma unroll
            for (int e = 0; e < kN; ++e) a[e] = bias[e];
#pragma unroll
            for (int k = 0; k < kW; ++k)
#pragma unroll
              for (int e = 0; e < kN; ++e) a[e] = fmaf(w[k][e], xr[(i + k) % kW][e], a[e]);
            raw_floats<T, kN>(gs[i], g);  // dy, then dy * act'(a) in place
            if (p.silu) {
#pragma unroll
              for (int e = 0; e < kN; ++e) {
                const float sg = sigmoid(a[e]);
                g[e] *= sg * fmaf(a[e], 1.0f - sg, 1.0f);
              }
            }
            if (u < seg_end) {
#pragma unroll
              for (int e = 0; e < kN; ++e) db[e] += g[e];
#pragma unroll
              for (int k = 0; k < kW; ++k)
#pragma unroll
                for (int e = 0; e < kN; ++e) dw[k][e] = fmaf(g[e], xr[(i + k) % kW][e], dw[k][e]);
            }
          } else {
#pragma unroll
            for (int e = 0; e < kN; ++e) g[e] = 0.0f;
          }
          const int tau = u - (kW - 1);
          if (tau >= t) {
            float o[kN];
#pragma unroll
            for (int e = 0; e < kN; ++e) o[e] = 0.0f;
#pragma unroll
            for (int j = 0; j < kW; ++j)
#pragma unroll
              for (int e = 0; e < kN; ++e) o[e] = fmaf(w[kW - 1 - j][e], gr[(i + j) % kW][e], o[e]);
            if (tau >= dht_from) {
              const int j = tau - dht_from;  // slot of token tau in the final state
#pragma unroll
              for (int e = 0; e < kN; ++e)
                o[e] += load_elem(p.dht, (s.n * p.D + d0 + e) * p.W + j, p.dht_code);
            }
            store_vec<T, kN>(dxb + static_cast<int64_t>(tau) * p.D, o);
          }
        }
      }
      t = seg_end;
    }
  }

  if (!p.want_dw && !p.want_db) return;  // uniform over the block
  // Fixed-order reduction over the block's time runs, one partial row per quantity.
  const int tid = threadIdx.y * kThreadsX + threadIdx.x;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const int prows = (p.want_dw ? p.W : 0) + (p.want_db ? 1 : 0);
  float* part = p.partial + static_cast<int64_t>(blockIdx.x) * prows * p.D;
#pragma unroll
  for (int q = 0; q <= kW; ++q) {
    const bool is_bias = q == kW;
    const int kr = q - (kW - p.W);  // real tap of row q
    if (is_bias ? !p.want_db : (!p.want_dw || kr < 0)) continue;  // uniform
    __syncthreads();  // the previous quantity has been read
#pragma unroll
    for (int e = 0; e < kN; ++e)
      red[threadIdx.y][threadIdx.x * kN + e] = is_bias ? db[e] : dw[q < kW ? q : 0][e];
    __syncthreads();
    if (tid < kCols && col0 + tid < p.D) {
      float sum = 0.0f;
#pragma unroll
      for (int y = 0; y < kThreadsY; ++y) sum += red[y][tid];
      const int row = is_bias ? (p.want_dw ? p.W : 0) : kr;
      part[row * p.D + col0 + tid] = sum;
    }
  }
}

// dweight[k,d] / dbias[d] = sum over tiles (in tile order) of the partial rows.
__global__ void causal_conv1d_reduce_kernel(Params p, int64_t tiles) {
  const int prows = (p.want_dw ? p.W : 0) + (p.want_db ? 1 : 0);
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= prows * p.D) return;
  const int q = static_cast<int>(idx / p.D);
  const int64_t d = idx - q * p.D;
  const float* src = p.partial + q * p.D + d;
  const int64_t step = static_cast<int64_t>(prows) * p.D;
  float sum = 0.0f;
#pragma unroll 8
  for (int64_t tile = 0; tile < tiles; ++tile) sum += src[tile * step];
  if (p.want_dw && q < p.W) {
    store_elem(p.dweight, q * p.D + d, p.dw_code, sum);
  } else {
    store_elem(p.dbias, d, p.db_code, sum);
  }
}

// final_state[n,d,j] = x~[L-W+j] (forward, one thread per (sequence, channel)).
template <class T>
__global__ void causal_conv1d_final_state_kernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.N * p.D) return;
  const int64_t n = idx / p.D, d = idx - n * p.D;
  int64_t batch = n, bos = 0, eos = p.T;
  if (p.cu) {
    batch = 0;
    eos = clamp_time(offset_at(p.cu, p.cu64, n + 1), static_cast<int>(p.T));
    bos = min(static_cast<int64_t>(clamp_time(offset_at(p.cu, p.cu64, n), static_cast<int>(p.T))), eos);
  }
  const T* xb = static_cast<const T*>(p.x) + batch * p.x_sb;
  const int64_t L = eos - bos;
  for (int j = 0; j < p.W; ++j) {
    const int64_t tau = L - p.W + j;
    float v = 0.0f;
    if (tau >= 0) {
      v = cuda::to_f(xb[(bos + tau) * p.x_st + d]);
    } else if (p.h0 != nullptr) {
      v = load_elem(p.h0, (n * p.D + d) * p.W + tau + p.W, p.h0_code);
    }
    store_elem(p.state_out, (n * p.D + d) * p.W + j, p.state_code, v);
  }
}

// dh0[n,d,s] = sum_{t < min(s,L)} w[s-1-t] g[t] + dht[n,d,s-L] (s >= L), g recomputed for the
// first W-1 tokens (backward, one thread per (sequence, channel)).
template <class T>
__global__ void causal_conv1d_initial_state_grad_kernel(Params p) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.N * p.D) return;
  const int64_t n = idx / p.D, d = idx - n * p.D;
  int64_t batch = n, bos = 0, eos = p.T;
  if (p.cu) {
    batch = 0;
    eos = clamp_time(offset_at(p.cu, p.cu64, n + 1), static_cast<int>(p.T));
    bos = min(static_cast<int64_t>(clamp_time(offset_at(p.cu, p.cu64, n), static_cast<int>(p.T))), eos);
  }
  const T* xb = static_cast<const T*>(p.x) + batch * p.x_sb;
  const T* dyb = static_cast<const T*>(p.dy) + batch * p.dy_sb;
  const int64_t L = eos - bos;
  const int W = p.W;
  auto xt = [&](int64_t tau) -> float {
    if (tau >= 0) return cuda::to_f(xb[(bos + tau) * p.x_st + d]);
    return load_elem(p.h0, (n * p.D + d) * W + tau + W, p.h0_code);
  };
  auto wt = [&](int k) { return load_elem(p.weight, k * p.w_sk + d * p.w_sd, p.w_code); };
  float g[kMaxWidth - 1];
  const int head = static_cast<int>(L < W - 1 ? L : W - 1);
  const float b = p.bias != nullptr ? load_elem(p.bias, d, p.b_code) : 0.0f;
#pragma unroll
  for (int t = 0; t < kMaxWidth - 1; ++t) {
    g[t] = 0.0f;
    if (t < head) {
      float a = b;
      for (int k = 0; k < W; ++k) a = fmaf(wt(k), xt(t - (W - 1) + k), a);
      const float dyv = cuda::to_f(dyb[(bos + t) * p.dy_st + d]);
      if (p.silu) {
        const float sg = sigmoid(a);
        g[t] = dyv * sg * fmaf(a, 1.0f - sg, 1.0f);
      } else {
        g[t] = dyv;
      }
    }
  }
  for (int sl = 0; sl < W; ++sl) {
    float v = 0.0f;
#pragma unroll
    for (int t = 0; t < kMaxWidth - 1; ++t)
      if (t < sl && t < L) v = fmaf(wt(sl - 1 - t), g[t], v);
    if (sl >= L && p.dht != nullptr) v += load_elem(p.dht, (n * p.D + d) * W + sl - L, p.dht_code);
    store_elem(p.state_out, (n * p.D + d) * W + sl, p.state_code, v);
  }
}

bool f32_or_16(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}
bool opt_ok(const TensorView& t) { return !t.defined() || f32_or_16(t.dtype()); }

bool supports_fwd(const CausalConv1dFwdArgs& a) {
  return f32_or_16(a.x.dtype()) && a.weight.size(0) <= kMaxWidth && opt_ok(a.weight) &&
         opt_ok(a.bias) && opt_ok(a.initial_state) && opt_ok(a.final_state);
}
bool supports_bwd(const CausalConv1dBwdArgs& a) {
  return f32_or_16(a.x.dtype()) && a.weight.size(0) <= kMaxWidth && opt_ok(a.weight) &&
         opt_ok(a.bias) && opt_ok(a.initial_state) && opt_ok(a.d_final_state) &&
         opt_ok(a.dweight) && opt_ok(a.dbias) && opt_ok(a.d_initial_state);
}

Params common_params(const TensorView& x, const TensorView& weight, const TensorView& bias,
                     const TensorView& h0, const TensorView& cu) {
  const conv1d::Geometry g = conv1d::geometry(x, weight, cu);
  FUSEDOPS_REQUIRE(g.T < INT32_MAX - 2 * kMaxWidth && g.N < INT32_MAX, kValue, kOp,
                   "cuda_sm80: x must have fewer than 2^31 - 16 time steps and sequences, got T = ",
                   g.T, ", N = ", g.N);
  Params p{};
  p.x = x.data();
  p.x_sb = conv1d::batch_stride(x);
  p.x_st = conv1d::time_stride(x);
  p.weight = weight.data();
  p.w_sk = weight.stride(0);
  p.w_sd = weight.stride(1);
  p.w_code = code_of(weight.dtype());
  if (bias.defined()) {
    p.bias = bias.data();
    p.b_code = code_of(bias.dtype());
  }
  if (h0.defined()) {
    p.h0 = h0.data();
    p.h0_code = code_of(h0.dtype());
  }
  if (cu.defined()) {
    p.cu = cu.data();
    p.cu64 = cu.dtype() == DType::kInt64;
  }
  p.B = g.B;
  p.T = g.T;
  p.D = g.D;
  p.N = g.N;
  p.W = static_cast<int>(g.W);
  return p;
}

// kN-element accesses need every row start aligned to kN elements.
template <class T>
bool rows_vectorizable(const void* base, int64_t sb, int64_t st, int64_t D, int kN) {
  return base != nullptr && cuda::aligned_to(base, kN * sizeof(T)) && D % kN == 0 &&
         sb % kN == 0 && st % kN == 0;
}

unsigned channel_blocks(int64_t D, int kN) {
  const int64_t vecs = (D + kN - 1) / kN;
  const int64_t blocks = (vecs + kThreadsX - 1) / kThreadsX;
  FUSEDOPS_REQUIRE(blocks <= 65535, kRuntime, kOp, "cuda_sm80: D = ", D,
                   " channels exceed the grid limit (", 65535LL * kThreadsX * kN, ")");
  return static_cast<unsigned>(blocks);
}

int64_t tiles_for(const Params& p, int rows_per_thread, int64_t* per_batch) {
  const int64_t rows = static_cast<int64_t>(rows_per_thread) * kThreadsY;
  *per_batch = (p.T + rows - 1) / rows;
  return p.cu ? *per_batch : p.B * *per_batch;
}

void launch_small(int64_t count, cudaStream_t stream, void (*kernel)(Params), const Params& p) {
  if (count == 0) return;
  const int threads = 128;
  kernel<<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, stream>>>(p);
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
}

// What a main-kernel launch runs.
enum Mode : int { kForward = 0, kForwardResidual = 1, kBackward = 2 };

// Channels per thread on the vector path: 16 bytes in the plain forward; 4 channels (16 bytes
// of fp32, 8 of 16-bit types) in the forward with a residual (one more stream in flight); 2 in
// the backward, whose rings of x and g, weights and weight-gradient sums spill at 4 under the
// 128-register cap of two blocks per SM.
template <class T, int kMode>
constexpr int kVecChannels = kMode == kForward ? cuda::kVec16<T> : kMode == kForwardResidual ? 4 : 2;

template <class T, int kW, int kN, int kMode>
void launch_kernel(const Params& p, dim3 grid, cudaStream_t stream) {
  const dim3 block(kThreadsX, kThreadsY);
  if constexpr (kMode == kBackward) {
    causal_conv1d_bwd_kernel<T, kW, kN><<<grid, block, 0, stream>>>(p);
  } else {
    causal_conv1d_fwd_kernel<T, kW, kN, kMode == kForwardResidual><<<grid, block, 0, stream>>>(p);
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
}

// The vector path takes W = 1..4 with its exact width; the scalar path (rows not aligned to the
// vector, or W = 5..8) runs width 8 with zero taps in front of the real ones.
template <class T, int kMode>
void launch_main(const Params& p, int64_t tiles, bool vec, cudaStream_t stream) {
  FUSEDOPS_REQUIRE(tiles <= INT32_MAX, kRuntime, kOp, "cuda_sm80: too many time tiles (", tiles,
                   ")");
  if (!vec || p.W > 4) {
    const dim3 grid(static_cast<unsigned>(tiles), channel_blocks(p.D, 1));
    launch_kernel<T, kMaxWidth, 1, kMode>(p, grid, stream);
    return;
  }
  constexpr int kV = kVecChannels<T, kMode>;
  const dim3 grid(static_cast<unsigned>(tiles), channel_blocks(p.D, kV));
  switch (p.W) {
    case 1: launch_kernel<T, 1, kV, kMode>(p, grid, stream); break;
    case 2: launch_kernel<T, 2, kV, kMode>(p, grid, stream); break;
    case 3: launch_kernel<T, 3, kV, kMode>(p, grid, stream); break;
    default: launch_kernel<T, 4, kV, kMode>(p, grid, stream); break;
  }
}

template <class T, int kMode>
void launch_main_if_aligned(const Params& p, int64_t tiles, cudaStream_t stream) {
  constexpr int kV = kVecChannels<T, kMode>;
  bool vec = rows_vectorizable<T>(p.x, p.x_sb, p.x_st, p.D, kV) &&
             rows_vectorizable<T>(p.out, p.T * p.D, p.D, p.D, kV);
  if (kMode == kForwardResidual) vec = vec && rows_vectorizable<T>(p.residual, p.r_sb, p.r_st, p.D, kV);
  if (kMode == kBackward) vec = vec && rows_vectorizable<T>(p.dy, p.dy_sb, p.dy_st, p.D, kV);
  launch_main<T, kMode>(p, tiles, vec, stream);
}

void fwd(const Context& ctx, const CausalConv1dFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  Params p = common_params(a.x, a.weight, a.bias, a.initial_state, a.cu_seqlens);
  p.out = a.y.data();
  p.silu = a.activation == CausalConv1dActivation::kSilu;
  if (a.residual.defined()) {
    p.residual = a.residual.data();
    p.r_sb = conv1d::batch_stride(a.residual);
    p.r_st = conv1d::time_stride(a.residual);
  }
  if (a.final_state.defined()) {
    p.state_out = a.final_state.data();
    p.state_code = code_of(a.final_state.dtype());
  }
  cuda::visit_dtype(a.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    int64_t per_batch = 0;
    const int64_t tiles = tiles_for(p, kFwdRowsPerThread, &per_batch);
    p.tiles_per_batch = per_batch;
    if (tiles > 0) {
      if (p.residual) {
        launch_main_if_aligned<T, kForwardResidual>(p, tiles, stream);
      } else {
        launch_main_if_aligned<T, kForward>(p, tiles, stream);
      }
    }
    if (p.state_out) launch_small(p.N * p.D, stream, causal_conv1d_final_state_kernel<T>, p);
  });
}

void bwd(const Context& ctx, const CausalConv1dBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  Params p = common_params(a.x, a.weight, a.bias, a.initial_state, a.cu_seqlens);
  p.out = a.dx.data();
  p.dy = a.dy.data();
  p.dy_sb = conv1d::batch_stride(a.dy);
  p.dy_st = conv1d::time_stride(a.dy);
  p.silu = a.activation == CausalConv1dActivation::kSilu;
  if (a.d_final_state.defined()) {
    p.dht = a.d_final_state.data();
    p.dht_code = code_of(a.d_final_state.dtype());
  }
  p.want_dw = a.dweight.defined();
  p.want_db = a.dbias.defined();
  if (p.want_dw) {
    p.dweight = a.dweight.data();
    p.dw_code = code_of(a.dweight.dtype());
  }
  if (p.want_db) {
    p.dbias = a.dbias.data();
    p.db_code = code_of(a.dbias.dtype());
  }
  if (p.want_dw || p.want_db) p.partial = static_cast<float*>(a.workspace.data());
  if (a.d_initial_state.defined()) {
    p.state_out = a.d_initial_state.data();
    p.state_code = code_of(a.d_initial_state.dtype());
  }
  cuda::visit_dtype(a.x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    int64_t per_batch = 0;
    const int64_t tiles = tiles_for(p, kBwdRowsPerThread, &per_batch);
    p.tiles_per_batch = per_batch;
    if (tiles > 0) launch_main_if_aligned<T, kBackward>(p, tiles, stream);
    const int prows = (p.want_dw ? p.W : 0) + (p.want_db ? 1 : 0);
    if (prows > 0) {
      const int64_t count = prows * p.D;
      const int threads = 256;
      causal_conv1d_reduce_kernel<<<static_cast<unsigned>((count + threads - 1) / threads), threads,
                                    0, stream>>>(p, tiles);
      FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
    }
    if (p.state_out)
      launch_small(p.N * p.D, stream, causal_conv1d_initial_state_grad_kernel<T>, p);
  });
}

}  // namespace

void register_causal_conv1d_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<CausalConv1dFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<CausalConv1dBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
