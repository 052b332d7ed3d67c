// causal_conv1d, generic CUDA backend (sm_80 and later).
//
// Both directions stream: a block owns (a time tile, 32 channel vectors); each of its 8 rows of
// threads (threadIdx.y) takes a long run of consecutive time steps (p.rows, picked on the host
// from the SM count and the kernel's occupancy so that the grid is about a whole number of
// waves; 16..4096 rows, >= 32 in the backward), each thread a vector of channels (16 bytes in the
// plain forward: 8 bf16 / fp16 or 4 fp32; 4 channels when a second tensor is streamed -- the
// residual, or dy in the backward; 1 element on the scalar fallback). A thread keeps the loads
// of its next P rows in flight at all times (the registers of row r are refilled with row r+P
// before row r is used; ~128 bytes per thread, ~64 KB per SM), reads each row once, reads the
// W-1 rows before its run once (the halo), and keeps the last W input rows as floats in a ring
// that shifts by register renaming.
//
// Backward: the same walk recomputes a = conv(x) + bias, forms g = dy * act'(a), keeps the last
// W values of g in a second ring and emits dx[t-W+1] = sum_j w[W-1-j] g[t-W+1+j] (+ the
// final-state gradient on the last W tokens of a sequence); it reads W-1 rows of x and dy past
// its run (g there feeds dx of its own rows). dweight and dbias are per-thread fp32 sums over
// the run, reduced over the block's 8 runs in shared memory in a fixed order and written as one
// partial row per block; a second kernel sums the partial rows over blocks in block order. No
// atomics: bitwise reproducible (the run length depends only on the problem and the device).
// d_initial_state (first W-1 tokens of each sequence) and the forward's final_state are small
// per-(sequence, channel) kernels.
//
// Varlen: blocks tile the packed time axis; a thread finds the sequence of its first row by
// binary search in cu_seqlens and restarts its rings at every sequence start inside its run
// (rows before a sequence start come from initial_state or are 0; the backward first finishes
// the ended sequence's last dx rows with g = 0 past its end). Nothing is read from the host:
// the call is CUDA-graph capturable.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "fusedops/core/registry.h"
#include "fusedops/ops/causal_conv1d.h"
#include "src/cuda/check.cuh"
#include "src/cuda/device_errors.cuh"
#include "src/cuda/fastmath.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/causal_conv1d/causal_conv1d_common.h"

namespace fusedops {
namespace {

constexpr const char* kOp = "causal_conv1d";
constexpr int kThreadsX = 32;  // channel vectors per block
constexpr int kThreadsY = 4;   // time runs per block
constexpr int kThreads = kThreadsX * kThreadsY;
constexpr int kMinBlocks = 3;  // blocks per SM: a cap of 168 registers per thread
constexpr int kMaxWidth = 8;

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
  int rows;                 // rows per thread run; a block's tile is kThreadsY runs
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

__device__ __forceinline__ float sigmoid(float a) { return __frcp_rn(1.0f + __expf(-a)); }

// sigmoid of kN values. fp32: bitwise as sigmoid() (cuda::rcp_rn: no branch per value); 16-bit
// storage: the approximate reciprocal (rcp.approx, within 1 ulp; one instruction instead of
// rcp_rn's five, far below the 16-bit output's rounding).
template <class T, int kN>
__device__ __forceinline__ void sigmoid_n(const float (&a)[kN], float (&out)[kN]) {
  if constexpr (cuda::kFastSigmoid<T>) {
    // ex2.approx.ftz: __expf's ex2.approx without ftz adds three instructions per value to
    // rescale results under 2^-126, which 1 + e^-a rounds away anyway.
    float e;
#pragma unroll
    for (int i = 0; i < kN; ++i) cuda::sigmoid_approx(a[i], e, out[i]);
  } else {
    float d[kN];
#pragma unroll
    for (int e = 0; e < kN; ++e) d[e] = 1.0f + __expf(-a[e]);
    cuda::rcp_rn<kN>(d, out);
  }
}

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
// Offsets are clamped to [0, T] and bos to <= t so that malformed cu_seqlens (reported by
// check_cu_seqlens) never cause an out-of-bounds access.
__device__ __forceinline__ bool seek(const Params& p, Sequence& s, int t) {
  if (p.cu == nullptr) return true;
  const int T = static_cast<int>(p.T), N = static_cast<int>(p.N);
  while (s.n < N && clamp_time(offset_at(p.cu, p.cu64, s.n + 1), T) <= t) ++s.n;
  if (s.n >= N) return false;
  s.bos = min(clamp_time(offset_at(p.cu, p.cu64, s.n), T), t);
  s.eos = clamp_time(offset_at(p.cu, p.cu64, s.n + 1), T);
  return true;
}

// Element i of a small tensor of storage type S, as float.
template <class S>
__device__ __forceinline__ float elem_as(const void* p, int64_t i) {
  return cuda::to_f(static_cast<const S*>(p)[i]);
}

// Runs fn(S{}) with S the storage type of dtype code `code` (uniform over the block): the
// loads inside fn are then straight-line code and all go out before any is used.
template <class Fn>
__device__ __forceinline__ void visit_code(int code, Fn&& fn) {
  if (code == kF32) {
    fn(float{});
  } else if (code == kF16) {
    fn(__half{});
  } else {
    fn(__nv_bfloat16{});
  }
}

// The block's weights (as a width-kW filter: the real W taps right-aligned, zeros before them)
// and bias as fp32 in shared memory, filled by the whole block from any dtype and weight strides;
// each thread then copies its own channels' weights to registers. Called by every thread of the
// block before any leaves.
template <int kW, int kN>
struct Coeffs {
  float w[kW][kThreadsX * kN];
  float bias[kThreadsX * kN];
};

template <int kW, int kN>
__device__ __forceinline__ void fill_coeffs(const Params& p, Coeffs<kW, kN>& c) {
  constexpr int kCols = kThreadsX * kN;
  constexpr int kPerW = (kW * kCols + kThreads - 1) / kThreads;
  constexpr int kPerB = (kCols + kThreads - 1) / kThreads;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const int tid = threadIdx.y * kThreadsX + threadIdx.x;
  visit_code(p.w_code, [&](auto tag) {
    using S = decltype(tag);
    float v[kPerW];
#pragma unroll
    for (int q = 0; q < kPerW; ++q) {
      const int i = tid + q * kThreads;
      const int k = i / kCols;
      const int64_t d = col0 + (i - k * kCols);
      const int kr = k - (kW - p.W);
      v[q] = (i < kW * kCols && d < p.D && kr >= 0) ? elem_as<S>(p.weight, kr * p.w_sk + d * p.w_sd)
                                                     : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kPerW; ++q) {
      const int i = tid + q * kThreads;
      if (i < kW * kCols) c.w[i / kCols][i % kCols] = v[q];
    }
  });
  visit_code(p.b_code, [&](auto tag) {
    using S = decltype(tag);
#pragma unroll
    for (int q = 0; q < kPerB; ++q) {
      const int i = tid + q * kThreads;
      if (i < kCols)
        c.bias[i] = (p.bias != nullptr && col0 + i < p.D) ? elem_as<S>(p.bias, col0 + i) : 0.0f;
    }
  });
  __syncthreads();
}

template <int kW, int kN>
__device__ __forceinline__ void thread_weights(const Coeffs<kW, kN>& c, float (&w)[kW][kN]) {
#pragma unroll
  for (int k = 0; k < kW; ++k)
#pragma unroll
    for (int e = 0; e < kN; ++e) w[k][e] = c.w[k][threadIdx.x * kN + e];
}

// Rows in flight per thread: about kPipeBytes of loads (over all streamed tensors), 2 to 8
// rows. With three 128-thread blocks per SM that is ~36 KB of loads outstanding per SM, about
// twice what the read part of the traffic needs at full HBM bandwidth (Little's law: ~2-3 TB/s
// of reads x ~1 us / 132 SMs). 128 bytes would spill the width-4 kernels under the
// 168-register cap.
constexpr int kPipeBytes = 96;
template <class T, int kN, int kStreams>
inline constexpr int kPipeRows = kPipeBytes / (kN * static_cast<int>(sizeof(T)) * kStreams);
template <class T, int kN, int kStreams>
inline constexpr int kPipe = kPipeRows<T, kN, kStreams> > 8   ? 8
                             : kPipeRows<T, kN, kStreams> < 2 ? 2
                                                              : kPipeRows<T, kN, kStreams>;

// This thread's rows [t_begin, t_end) and batch, from the block's tile of kThreadsY runs of
// p.rows rows.
struct Run {
  int64_t batch;
  int t_begin, t_end;
};
__device__ __forceinline__ Run thread_run(const Params& p) {
  const int64_t rows_per_block = static_cast<int64_t>(p.rows) * kThreadsY;
  Run r;
  int64_t tile = blockIdx.x;
  r.batch = 0;
  if (p.cu == nullptr) {
    r.batch = tile / p.tiles_per_batch;
    tile -= r.batch * p.tiles_per_batch;
  }
  const int64_t begin = tile * rows_per_block + static_cast<int64_t>(threadIdx.y) * p.rows;
  r.t_begin = static_cast<int>(min(begin, p.T));
  r.t_end = static_cast<int>(min(begin + p.rows, p.T));
  return r;
}

// Loads row r of a tensor (row pointer base already offset to the thread's channels).
template <class T, int kN>
__device__ __forceinline__ RawT<T, kN> load_row(const T* base, int r, int64_t stride) {
  return load_raw<T, kN>(base + static_cast<int64_t>(r) * stride);
}

// Shifts a ring of the last kW rows by one (slot kW-1 is then free for the next row). Inside
// the unrolled pipeline these moves are register renames.
template <int kW, int kN>
__device__ __forceinline__ void shift_ring(float (&ring)[kW][kN]) {
#pragma unroll
  for (int j = 0; j + 1 < kW; ++j)
#pragma unroll
    for (int e = 0; e < kN; ++e) ring[j][e] = ring[j + 1][e];
}

// The kW-1 rows before r (r a sequence start or the start of the thread's run) of the
// extended input x~ into slots 0..kW-2 of the input ring: rows >= bos from x, rows before it
// from initial_state (local time tau = row - bos in [-W, 0)) or 0. All loads go out before any
// is used: one memory round trip.
template <class T, int kW, int kN>
__device__ __forceinline__ void load_halo(const Params& p, const T* xb, const Sequence& s, int r,
                                          int64_t d0, float (&xr)[kW][kN]) {
  if constexpr (kW > 1) {
    using Raw = RawT<T, kN>;
    Raw raw[kW - 1];
#pragma unroll
    for (int j = 0; j < kW - 1; ++j) {
      const int rj = r - (kW - 1) + j;
      raw[j] = rj >= s.bos ? load_row<T, kN>(xb, rj, p.x_st) : Raw{};
    }
    float hv[kW - 1][kN];
#pragma unroll
    for (int j = 0; j < kW - 1; ++j)
#pragma unroll
      for (int e = 0; e < kN; ++e) hv[j][e] = 0.0f;
    if (p.h0 != nullptr && r - (kW - 1) < s.bos) {
      visit_code(p.h0_code, [&](auto tag) {
        using S = decltype(tag);
        const int64_t base = (s.n * p.D + d0) * p.W + p.W - s.bos;  // + row + e * W
#pragma unroll
        for (int j = 0; j < kW - 1; ++j) {
          const int rj = r - (kW - 1) + j;
          const bool in = rj < s.bos && rj - s.bos >= -p.W;
#pragma unroll
          for (int e = 0; e < kN; ++e)
            hv[j][e] = in ? elem_as<S>(p.h0, base + rj + static_cast<int64_t>(e) * p.W) : 0.0f;
        }
      });
    }
#pragma unroll
    for (int j = 0; j < kW - 1; ++j) {
      if (r - (kW - 1) + j >= s.bos) {
        raw_floats<T, kN>(raw[j], xr[j]);
      } else {
#pragma unroll
        for (int e = 0; e < kN; ++e) xr[j][e] = hv[j][e];
      }
    }
  }
}

// Forward. A thread streams each sequence segment of its run with the loads of the next P rows
// always in flight (row r's registers are refilled with row r+P before row r is used), keeping
// the last kW input rows as floats in a shifting ring. A segment (the whole run unless varlen
// puts a sequence start inside it) starts from its halo; the hot loop has no sequence logic.
template <class T, int kW, int kN, bool kResidual>
__global__ void __launch_bounds__(kThreads, kMinBlocks) causal_conv1d_fwd_kernel(Params p) {
  constexpr int P = kPipe<T, kN, kResidual ? 2 : 1>;
  using Raw = RawT<T, kN>;
  __shared__ __align__(16) Coeffs<kW, kN> coeffs;
  fill_coeffs<kW, kN>(p, coeffs);
  const int64_t d0 = (static_cast<int64_t>(blockIdx.y) * kThreadsX + threadIdx.x) * kN;
  if (d0 >= p.D) return;
  const Run run = thread_run(p);
  if (run.t_begin >= run.t_end) return;
  const T* xb = static_cast<const T*>(p.x) + run.batch * p.x_sb + d0;
  const T* rb = kResidual ? static_cast<const T*>(p.residual) + run.batch * p.r_sb + d0 : nullptr;
  T* yb = static_cast<T*>(p.out) + run.batch * p.T * p.D + d0;
  float bv[kN], w[kW][kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) bv[e] = coeffs.bias[threadIdx.x * kN + e];
  thread_weights<kW, kN>(coeffs, w);

  Sequence s{static_cast<int>(run.batch), 0, static_cast<int>(p.T)};
  if (p.cu) s.n = find_sequence(p, run.t_begin);
  for (int t = run.t_begin; t < run.t_end;) {
    if (!seek(p, s, t)) return;
    const int seg_end = min(s.eos, run.t_end);
    // The halo first (its per-element initial-state loads and addresses would otherwise add
    // to the registers of the rows in flight), then the segment's first P rows.
    float xr[kW][kN];  // slot j: row r-(kW-1)+j, slot kW-1 the current row r
    load_halo<T, kW, kN>(p, xb, s, t, d0, xr);
    Raw xs[P] = {}, rs[kResidual ? P : 1] = {};
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (t + i < seg_end) {
        xs[i] = load_row<T, kN>(xb, t + i, p.x_st);
        if constexpr (kResidual) rs[i] = load_row<T, kN>(rb, t + i, p.r_st);
      }
    }
    // Row r (pipeline slot i = r - c); checked near the segment's end (reloads past it), as in
    // the backward: the groups before it run P rows straight, the rings staying in registers.
    auto step = [&](int i, int r, auto checked, auto silu) {
      const Raw cx = xs[i];
      [[maybe_unused]] const Raw cr = rs[kResidual ? i : 0];
      if (!decltype(checked)::value || r + P < seg_end) {
        xs[i] = load_row<T, kN>(xb, r + P, p.x_st);
        if constexpr (kResidual) rs[i] = load_row<T, kN>(rb, r + P, p.r_st);
      }
      raw_floats<T, kN>(cx, xr[kW - 1]);
      float a[kN];
#pragma unroll
      for (int e = 0; e < kN; ++e) a[e] = bv[e];
#pragma unroll
      for (int k = 0; k < kW; ++k)
#pragma unroll
        for (int e = 0; e < kN; ++e) a[e] = fmaf(w[k][e], xr[k][e], a[e]);
      if constexpr (decltype(silu)::value) {
        float sg[kN];
        sigmoid_n<T, kN>(a, sg);
#pragma unroll
        for (int e = 0; e < kN; ++e) a[e] *= sg[e];
      }
      if constexpr (kResidual) {
        float rv[kN];
        raw_floats<T, kN>(cr, rv);
#pragma unroll
        for (int e = 0; e < kN; ++e) a[e] += rv[e];
      }
      cuda::store_global<T, kN>(yb + static_cast<int64_t>(r) * p.D, a);
      shift_ring<kW, kN>(xr);
    };
    auto stream_rows = [&](auto silu) {
      int c = t;
      for (; c + 2 * P <= seg_end; c += P) {
#pragma unroll
        for (int i = 0; i < P; ++i) step(i, c + i, std::false_type{}, silu);
      }
      for (; c < seg_end; c += P) {
#pragma unroll
        for (int i = 0; i < P; ++i) {
          if (c + i >= seg_end) break;
          step(i, c + i, std::true_type{}, silu);
        }
      }
    };
    if (p.silu) stream_rows(std::true_type{});
    else stream_rows(std::false_type{});
    t = seg_end;
  }
}

// Backward. For each sequence segment [t, seg_end) of its run, a thread streams rows
// [t, look_end) of x and dy (look_end = seg_end + kW - 1 clipped to the sequence) through the
// same pipeline: it recomputes a, forms g = dy * act'(a) into a second ring and, once g of rows
// tau..tau+kW-1 is known, writes dx[tau]. After the last row it feeds kW-1 zero rows of g (past
// the sequence end tokens contribute nothing) to finish the segment's last dx rows.
// dweight/dbias sums run over the segment rows only.
template <class T, int kW, int kN>
__global__ void __launch_bounds__(kThreads, kMinBlocks) causal_conv1d_bwd_kernel(Params p) {
  constexpr int P = kPipe<T, kN, 2>;
  constexpr int kCols = kThreadsX * kN;
  static_assert(kCols <= kThreads, "one thread per column in the block reduction");
  using Raw = RawT<T, kN>;
  __shared__ float red[kThreadsY][kCols];
  __shared__ __align__(16) Coeffs<kW, kN> coeffs;
  fill_coeffs<kW, kN>(p, coeffs);
  const int64_t d0 = (static_cast<int64_t>(blockIdx.y) * kThreadsX + threadIdx.x) * kN;
  const Run run = thread_run(p);
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
    float bv[kN], w[kW][kN];
#pragma unroll
    for (int e = 0; e < kN; ++e) bv[e] = coeffs.bias[threadIdx.x * kN + e];
    thread_weights<kW, kN>(coeffs, w);
    Sequence s{static_cast<int>(run.batch), 0, static_cast<int>(p.T)};
    if (p.cu) s.n = find_sequence(p, run.t_begin);
    float gr[kW][kN];  // g of rows r-(kW-1)..r
#pragma unroll
    for (int j = 0; j < kW; ++j)
#pragma unroll
      for (int e = 0; e < kN; ++e) gr[j][e] = 0.0f;
    for (int t = run.t_begin; t < run.t_end;) {
      if (!seek(p, s, t)) break;
      const int seg_end = min(s.eos, run.t_end);           // rows owned: dx, dweight
      const int look_end = min(s.eos, run.t_end + kW - 1);  // rows whose g is needed
      float xr[kW][kN];  // x~ of rows r-(kW-1)..r; the halo first, as in the forward
      load_halo<T, kW, kN>(p, xb, s, t, d0, xr);
      Raw xs[P] = {}, gs[P] = {};
#pragma unroll
      for (int i = 0; i < P; ++i) {
        if (t + i < look_end) {
          xs[i] = load_row<T, kN>(xb, t + i, p.x_st);
          gs[i] = load_row<T, kN>(dyb, t + i, p.dy_st);
        }
      }
      // dx rows at local time >= L - W also get the final-state gradient.
      const int dht_from = p.dht != nullptr ? s.eos - p.W : INT_MAX;

      // dx[tau] = sum_j w[kW-1-j] g[tau+j]; g[tau+j] is in slot j once row tau+kW-1 is in.
      // Only the last kW rows before look_end (written after the loop) can be among the last W
      // tokens of a sequence, which add the final-state gradient.
      auto emit = [&](int tau, auto with_dht) {
        float o[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e) o[e] = 0.0f;
#pragma unroll
        for (int j = 0; j < kW; ++j)
#pragma unroll
          for (int e = 0; e < kN; ++e) o[e] = fmaf(w[kW - 1 - j][e], gr[j][e], o[e]);
        if constexpr (decltype(with_dht)::value) {
          if (tau >= dht_from) {
            const int j = tau - dht_from;  // slot of token tau in the final state
#pragma unroll
            for (int e = 0; e < kN; ++e)
              o[e] += load_elem(p.dht, (s.n * p.D + d0 + e) * p.W + j, p.dht_code);
          }
        }
        cuda::store_global<T, kN>(dxb + static_cast<int64_t>(tau) * p.D, o);
      };

      // Row r of the stream (pipeline slot i = r - c). Checked: the rows near the segment's ends
      // (reloads past look_end, rows past seg_end, dx rows before t). The groups in between take
      // the unchecked form, a straight run of P rows without branches, so that the rings stay in
      // registers across the unrolled rows (with the checks, every row is a branch region and
      // the compiler moves the rings between registers at each one).
      auto step = [&](int i, int r, auto checked, auto silu) {
        constexpr bool kChecked = decltype(checked)::value;
        const Raw cx = xs[i], cg = gs[i];
        if (!kChecked || r + P < look_end) {
          xs[i] = load_row<T, kN>(xb, r + P, p.x_st);
          gs[i] = load_row<T, kN>(dyb, r + P, p.dy_st);
        }
        raw_floats<T, kN>(cx, xr[kW - 1]);
        float a[kN], g[kN];
#pragma unroll
        for (int e = 0; e < kN; ++e) a[e] = bv[e];
#pragma unroll
        for (int k = 0; k < kW; ++k)
#pragma unroll
          for (int e = 0; e < kN; ++e) a[e] = fmaf(w[k][e], xr[k][e], a[e]);
        raw_floats<T, kN>(cg, g);  // dy, then dy * act'(a) in place
        if constexpr (decltype(silu)::value) {
          float sg[kN];
          sigmoid_n<T, kN>(a, sg);
#pragma unroll
          for (int e = 0; e < kN; ++e) g[e] *= sg[e] * fmaf(a[e], 1.0f - sg[e], 1.0f);
        }
        if (!kChecked || r < seg_end) {
#pragma unroll
          for (int e = 0; e < kN; ++e) db[e] += g[e];
#pragma unroll
          for (int k = 0; k < kW; ++k)
#pragma unroll
            for (int e = 0; e < kN; ++e) dw[k][e] = fmaf(g[e], xr[k][e], dw[k][e]);
        }
        shift_ring<kW, kN>(xr);
        shift_ring<kW, kN>(gr);
#pragma unroll
        for (int e = 0; e < kN; ++e) gr[kW - 1][e] = g[e];
        const int tau = r - (kW - 1);
        if (!kChecked || (tau >= t && r + 1 < look_end)) emit(tau, std::false_type{});
      };
      auto checked_group = [&](int c, auto silu) {
#pragma unroll
        for (int i = 0; i < P; ++i) {
          if (c + i >= look_end) break;
          step(i, c + i, std::true_type{}, silu);
        }
      };
      // Unchecked when every row of the group and its reload lie before look_end, every row is
      // owned (before seg_end) and its dx row tau = r - (kW - 1) is at or after t.
      auto unchecked_ok = [&](int c) { return c >= t + kW - 1 && c + 2 * P <= look_end && c + P <= seg_end; };
      auto stream_rows = [&](auto silu) {  // the activation as a constant: no branch per row
        int c = t;
        for (; c < look_end && !unchecked_ok(c); c += P) checked_group(c, silu);
        for (; unchecked_ok(c); c += P) {
#pragma unroll
          for (int i = 0; i < P; ++i) step(i, c + i, std::false_type{}, silu);
        }
        for (; c < look_end; c += P) checked_group(c, silu);
      };
      if (p.silu) stream_rows(std::true_type{});
      else stream_rows(std::false_type{});
      // dx of rows look_end-kW..look_end-1 (those of this segment): rows from look_end on
      // contribute g = 0 (past the sequence end, or past the rows whose dx this thread writes).
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        if (k > 0) {
          shift_ring<kW, kN>(gr);
#pragma unroll
          for (int e = 0; e < kN; ++e) gr[kW - 1][e] = 0.0f;
        }
        const int tau = look_end - kW + k;
        if (tau >= t && tau < seg_end) emit(tau, std::true_type{});
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows per thread run (a multiple of 8, at least min_rows), minimizing a model of the time:
// waves of `capacity` resident blocks; a wave of n blocks takes (rows + 8) * max(n, 3/4 of
// capacity) (bandwidth-bound, shared by the resident blocks, until fewer than ~3/4 of them are
// left: then the loads in flight no longer cover HBM latency x bandwidth); 8 rows stand for a thread's start-up (weights,
// halo, filling the pipeline). Long runs amortize the start-up and the halo; short runs fill
// the machine when the problem is small. `columns` counts the blocks side by side along the
// channels and batches.
int pick_rows(int64_t T, int64_t columns, int64_t capacity, int min_rows) {
  const int64_t r_max =
      std::min<int64_t>(4096, std::max<int64_t>(min_rows, ceil_div(ceil_div(T, kThreadsY), 8) * 8));
  const int64_t floor_blocks = std::max<int64_t>(1, capacity * 3 / 4);
  int64_t best = min_rows;
  double best_cost = 0.0;
  for (int64_t r = min_rows; r <= r_max; r += 8) {
    const int64_t blocks = columns * ceil_div(T, r * kThreadsY);
    const int64_t full = blocks / capacity, rest = blocks % capacity;
    const double cost = static_cast<double>(r + 8) *
                        (static_cast<double>(full * capacity) +
                         static_cast<double>(rest > 0 ? std::max(rest, floor_blocks) : 0));
    if (r == min_rows || cost < best_cost) {
      best_cost = cost;
      best = r;
    }
  }
  return static_cast<int>(best);
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
// of fp32, 8 of 16-bit types) with a second streamed tensor (residual, or dy in the backward):
// its buffers, and the backward's second ring and weight-gradient sums, would not fit 8
// channels under the 168-register cap.
template <class T, int kMode>
constexpr int kVecChannels = kMode == kForward ? cuda::kVec16<T> : 4;

// Minimum rows per thread run. The backward's tiles (kThreadsY runs) must span at least
// kCudaBwdRows rows: the partial-sum workspace is sized for that many tiles.
constexpr int kFwdMinRows = 16;
constexpr int kBwdMinRows = static_cast<int>(conv1d::kCudaBwdRows) / kThreadsY;
static_assert(kBwdMinRows * kThreadsY == conv1d::kCudaBwdRows && kBwdMinRows % 8 == 0,
              "tile mismatch");

// Picks the run length for this kernel's occupancy and launches it; returns the time tiles
// (blocks along x).
template <class T, int kW, int kN, int kMode>
int64_t launch_kernel(Params p, int device, cudaStream_t stream) {
  void (*kernel)(Params) = nullptr;
  if constexpr (kMode == kBackward) {
    kernel = causal_conv1d_bwd_kernel<T, kW, kN>;
  } else {
    kernel = causal_conv1d_fwd_kernel<T, kW, kN, kMode == kForwardResidual>;
  }
  static const int per_sm = [&] {
    int n = 0;
    FUSEDOPS_CUDA_CHECK(kOp, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
    return std::max(n, 1);
  }();
  const unsigned cblocks = channel_blocks(p.D, kN);
  const int64_t batches = p.cu ? 1 : p.B;
  const int64_t capacity = static_cast<int64_t>(cuda::sm_count(kOp, device)) * per_sm;
  p.rows = pick_rows(p.T, batches * cblocks, capacity,
                     kMode == kBackward ? kBwdMinRows : kFwdMinRows);
  p.tiles_per_batch = ceil_div(p.T, static_cast<int64_t>(p.rows) * kThreadsY);
  const int64_t tiles = batches * p.tiles_per_batch;
  FUSEDOPS_REQUIRE(tiles <= INT32_MAX, kRuntime, kOp, "cuda_sm80: too many time tiles (", tiles,
                   ")");
  const dim3 grid(static_cast<unsigned>(tiles), cblocks);
  const dim3 block(kThreadsX, kThreadsY);
  kernel<<<grid, block, 0, stream>>>(p);
  FUSEDOPS_CUDA_LAUNCH_CHECK(kOp);
  return tiles;
}

// The vector path takes W = 1..4 with its exact width; the scalar path (rows not aligned to the
// vector, or W = 5..8) runs width 8 with zero taps in front of the real ones.
template <class T, int kMode>
int64_t launch_main(const Params& p, bool vec, int device, cudaStream_t stream) {
  if (!vec || p.W > 4) return launch_kernel<T, kMaxWidth, 1, kMode>(p, device, stream);
  constexpr int kV = kVecChannels<T, kMode>;
  switch (p.W) {
    case 1: return launch_kernel<T, 1, kV, kMode>(p, device, stream);
    case 2: return launch_kernel<T, 2, kV, kMode>(p, device, stream);
    case 3: return launch_kernel<T, 3, kV, kMode>(p, device, stream);
    default: return launch_kernel<T, 4, kV, kMode>(p, device, stream);
  }
}

template <class T, int kMode>
int64_t launch_main_if_aligned(const Params& p, int device, cudaStream_t stream) {
  constexpr int kV = kVecChannels<T, kMode>;
  bool vec = rows_vectorizable<T>(p.x, p.x_sb, p.x_st, p.D, kV) &&
             rows_vectorizable<T>(p.out, p.T * p.D, p.D, p.D, kV);
  if (kMode == kForwardResidual) vec = vec && rows_vectorizable<T>(p.residual, p.r_sb, p.r_st, p.D, kV);
  if (kMode == kBackward) vec = vec && rows_vectorizable<T>(p.dy, p.dy_sb, p.dy_st, p.D, kV);
  return launch_main<T, kMode>(p, vec, device, stream);
}

// cu_seqlens [N+1] must start at 0, be non-decreasing and end at T: checked on the device (the
// kernels clamp every offset, so a bad one only gives meaningless sequences) and reported.
void check_cu_seqlens(const TensorView& cu, int64_t T, cudaStream_t stream) {
  if (!cu.defined()) return;
  static const uint32_t code = device_error_code(
      kOp, "cu_seqlens must start at 0, be non-decreasing and end at T; cu_seqlens[{index}] = "
           "{value} is not (the offsets are clamped to [0, T])");
  cuda::check_offsets(kOp, code, cu.data(), cu.dtype() == DType::kInt64, cu.size(0), T, stream);
}

void fwd(const Context& ctx, const CausalConv1dFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  check_cu_seqlens(a.cu_seqlens, a.x.size(1), stream);
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
    const bool rows = p.T > 0 && p.B > 0 && p.D > 0;
    if (rows) {
      if (p.residual) {
        launch_main_if_aligned<T, kForwardResidual>(p, ctx.device.index, stream);
      } else {
        launch_main_if_aligned<T, kForward>(p, ctx.device.index, stream);
      }
    }
    if (p.state_out) launch_small(p.N * p.D, stream, causal_conv1d_final_state_kernel<T>, p);
  });
}

void bwd(const Context& ctx, const CausalConv1dBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  check_cu_seqlens(a.cu_seqlens, a.x.size(1), stream);
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
    const bool rows = p.T > 0 && p.B > 0 && p.D > 0;
    // Partial rows written (blocks along time); 0 leaves dweight / dbias = 0 below.
    const int64_t tiles = rows ? launch_main_if_aligned<T, kBackward>(p, ctx.device.index, stream) : 0;
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
