// fused_cross_entropy_loss, generic CUDA backend (sm_80 and later), and the CUDA engine of
// ce_cuda.h that chunk_loss shares.
//
// The row pass. A group of `tpr` threads (a power of two) owns one row of V logits and reads it in
// 16-byte units. Unit k of a lane (unit index k*tpr + lane) is kept on chip when it can be: the
// first kIters in registers, the next smem_iters in dynamic shared memory (filled with cp.async, so
// the whole row is in flight at once), the rest are "streamed" (read in the first pass and read
// again in the second, which mostly hits L2). Pass 1 keeps an online softmax per thread (running
// max m and sum d of exp(z - m), plus sum z and the target logit), the group merges them in a fixed
// order, and pass 2 writes the gradient from the on-chip copy. At the plan's sizes a [*, 128256]
// bf16 row (250 KB) fits on chip on an H100/H200 (4 register + 12 shared-memory units per thread,
// 1024 threads per row: one read and one write of the logits); fp32 rows of that size stream about
// 45% of the row through L2. Loss-only calls keep nothing for a second pass and stream with 256
// threads per row. Without softcapping or label smoothing (the common call) both passes run in base
// 2 (the plain pass, see merge): per logit and pass one conversion, one FMA and one ex2 plus a max
// and an add (pass 1) or a multiply (pass 2). At [8192, 128256] bf16 on an H200 that took
// forward+backward from 1.6 to 1.21 ms: the general pass was bound by issuing instructions, not by
// memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/cuda/check.cuh"
#include "src/cuda/device_errors.cuh"
#include "src/cuda/pdl.cuh"
#include "src/cuda/vec.cuh"
#include "src/ops/cross_entropy/ce_common.h"
#include "src/ops/cross_entropy/ce_cuda.h"

namespace fusedops::cuda::ce {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxThreads = 1024;

// 2^x on the special-function unit (about 2 ulp; results below 2^-126 flush to 0).
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ int64_t label_at(const void* labels, int int64, int64_t i) {
  return int64 ? static_cast<const int64_t*>(labels)[i]
               : static_cast<int64_t>(static_cast<const int32_t*>(labels)[i]);
}

__device__ __forceinline__ float load_value(const void* p, int type, int64_t i) {
  switch (type) {
    case kF32: return static_cast<const float*>(p)[i];
    case kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return 1.0f;
  }
}

__device__ __forceinline__ void store_value(void* p, int type, int64_t i, float v) {
  switch (type) {
    case kF32: static_cast<float*>(p)[i] = v; break;
    case kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    default: break;
  }
}

// ---------------------------------------------------------------------------------------------
// Per-row scales (one block).

// The one-block kernels (per-row scales, final reductions) take their rows kBatch per thread at a
// time, every load of a batch issued before any is used: one memory latency per batch instead of
// one per row (at 8192 rows and 1024 threads: 2 instead of 8 dependent round trips).
constexpr int kBatch = 4;

__global__ void __launch_bounds__(kMaxThreads) row_scales_kernel(ScaleParams p) {
  // A row grid launched after this one with programmatic dependent launch (RowParams::pdl) may
  // start its first pass now; it waits for this grid before it reads row_scale.
  allow_dependent_grid();
  __shared__ unsigned long long counts[kMaxThreads / 32];
  unsigned long long valid = 0;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kBatch;
  for (int64_t i0 = threadIdx.x; i0 < p.rows; i0 += step) {
    int64_t lab[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      lab[j] = i < p.rows ? label_at(p.labels, p.labels_int64, i) : p.ignore_index;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) valid += lab[j] != p.ignore_index;
  }
  for (int off = 16; off > 0; off >>= 1) valid += __shfl_xor_sync(0xffffffffu, valid, off);
  if ((threadIdx.x & 31) == 0) counts[threadIdx.x >> 5] = valid;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) total += counts[w];
  const double mean_div = p.mean ? static_cast<double>(total > 0 ? total : 1ull) : 1.0;
  for (int64_t i0 = threadIdx.x; i0 < p.rows; i0 += step) {
    int64_t lab[kBatch];
    double alpha[kBatch], w[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      const bool in = i < p.rows;
      lab[j] = in ? label_at(p.labels, p.labels_int64, i) : p.ignore_index;
      alpha[j] = in && p.alpha_per_sample ? static_cast<double>(p.alpha_per_sample[i / p.rows_per_sample]) : p.alpha;
      w[j] = in && p.loss_weight_type != kNoValue ? load_value(p.loss_weight, p.loss_weight_type, i) : 1.0;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      if (i >= p.rows) continue;
      if (lab[j] == p.ignore_index) {
        p.row_scale[i] = 0.0f;
        p.row_norm[i] = 0.0f;
        continue;
      }
      if (lab[j] < 0 || lab[j] >= p.vocab) report_bad_input(p.record, p.bad_label_code, i, lab[j]);
      const double inv = 1.0 / (mean_div * alpha[j]);
      p.row_norm[i] = static_cast<float>(inv);
      p.row_scale[i] = static_cast<float>(w[j] * inv);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The row pass.

// Online-softmax state of one thread (and, after the merge, of the row).
struct Stats {
  float m;   // running max of z
  float d;   // sum of exp(z - m)
  float sz;  // sum of z
  float zy;  // z at the label (0 on every thread but its owner)
};

// The plain pass (kPlain: no softcapping, no label smoothing, logit_scale > 0) works in base 2:
// with c = logit_scale * log2(e), m is the running max of x c, d the sum of 2^(x c - m) (one FMA
// and one ex2 per logit), sz the running max of the raw x (so that the loss subtracts
// logit_scale * max x - logit_scale * x[y] exactly as the general pass does) and zy the raw x[y].
//
// Merge without FMA contraction, so that merge(a, b) and merge(b, a) are bitwise equal: every
// lane of a butterfly then ends with the same state.
template <bool kPlain>
__device__ __forceinline__ Stats merge(const Stats& a, const Stats& b) {
  Stats r;
  r.m = fmaxf(a.m, b.m);
  if constexpr (kPlain) {
    r.d = __fadd_rn(__fmul_rn(a.d, ex2(a.m - r.m)), __fmul_rn(b.d, ex2(b.m - r.m)));
    r.sz = fmaxf(a.sz, b.sz);
  } else {
    r.d = __fadd_rn(__fmul_rn(a.d, ex2(__fmul_rn(a.m - r.m, kLog2e))),
                    __fmul_rn(b.d, ex2(__fmul_rn(b.m - r.m, kLog2e))));
    r.sz = a.sz + b.sz;
  }
  r.zy = a.zy + b.zy;
  return r;
}

__device__ __forceinline__ Stats shfl_xor(const Stats& s, int off) {
  Stats o;
  o.m = __shfl_xor_sync(0xffffffffu, s.m, off);
  o.d = __shfl_xor_sync(0xffffffffu, s.d, off);
  o.sz = __shfl_xor_sync(0xffffffffu, s.sz, off);
  o.zy = __shfl_xor_sync(0xffffffffu, s.zy, off);
  return o;
}

// Merges the states of each group of `tpr` consecutive threads; every thread of a group gets
// the same result. Every thread of the block must call it (it synchronizes when tpr > 32).
template <bool kPlain>
__device__ __forceinline__ Stats group_merge(Stats s, int tpr, float4* scratch) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width / 2; off > 0; off >>= 1) s = merge<kPlain>(s, shfl_xor(s, off));
  if (tpr <= 32) return s;
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) scratch[warp] = make_float4(s.m, s.d, s.sz, s.zy);
  __syncthreads();
  const int warps = tpr >> 5;
  const int first = (warp / warps) * warps;
  float4 v = scratch[first];
  Stats r{v.x, v.y, v.z, v.w};
  for (int w = 1; w < warps; ++w) {
    v = scratch[first + w];
    r = merge<kPlain>(r, Stats{v.x, v.y, v.z, v.w});
  }
  return r;
}

__device__ __forceinline__ float transform(const RowParams& p, float x, float& t) {
  float z = x * p.scale;
  if (p.cap > 0.0f) {
    t = tanhf(z * p.inv_cap);
    z = p.cap * t;
  }
  return z;
}

// The label-smoothing term of a row's loss, eps (m - mean z); 0 without smoothing, so that logits
// of -inf (a masked vocabulary: the sum of z is -inf) do not turn 0 * inf into NaN. For finite
// logits the loss is unchanged.
__device__ __forceinline__ float smoothing_term(const RowParams& p, const Stats& s) {
  return p.eps != 0.0f ? p.eps * (s.m - s.sz * p.inv_vocab) : 0.0f;
}

// Pass 1 over N logits. The label's logit is not looked for here: the thread that owns it reads it
// once (label_share), so that no unit pays for a comparison with the label.
template <int N>
__device__ __forceinline__ void accumulate(const RowParams& p, const float (&x)[N], Stats& s) {
  float z[N];
  float mu = -FLT_MAX;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    float t;
    z[e] = transform(p, x[e], t);
    mu = fmaxf(mu, z[e]);
    s.sz += z[e];
  }
  const float m = fmaxf(s.m, mu);
  float d = s.d * ex2((s.m - m) * kLog2e);
#pragma unroll
  for (int e = 0; e < N; ++e) d += ex2((z[e] - m) * kLog2e);
  s.m = m;
  s.d = d;
}

// dl/dx = a' exp(z - m) - b - c [v == y], times logit_scale (folded into a', b, c) and
// (1 - t^2) with softcapping; a' = c_i (1 + 2 lambda lse) / d. The plain pass of 16-bit gradients
// folds |a'| into the exponent (m2 = k.m - log2 |a'|: one FMA and one ex2 per logit, no multiply)
// and applies a' < 0 as a sign flip of the packed result (sign).
struct Coef {
  float a, b, c, m;
  float m2 = 0.0f;      // kFold only
  uint32_t sign = 0u;   // kFold only
};

// The gradient of N logits none of which is the label (see label_gradient).
template <int N>
__device__ __forceinline__ void gradient(const RowParams& p, const Coef& k, const float (&x)[N], float (&o)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    float t = 0.0f;
    const float z = transform(p, x[e], t);
    float g = k.a * ex2((z - k.m) * kLog2e) - k.b;
    if (p.cap > 0.0f) g *= 1.0f - t * t;
    o[e] = g;
  }
}

// The plain pass over N logits (c = logit_scale * log2(e)); N may span two 16-byte units, which
// halves the rescaling of the running sum.
template <int N>
__device__ __forceinline__ void accumulate_plain(float c, const float (&x)[N], Stats& s) {
  float mu = x[0];
#pragma unroll
  for (int e = 1; e < N; ++e) mu = fmaxf(mu, x[e]);
  const float m = fmaxf(s.m, mu * c);
  float d = s.d * ex2(s.m - m);
#pragma unroll
  for (int e = 0; e < N; ++e) d += ex2(fmaf(x[e], c, -m));
  s.m = m;
  s.d = d;
  s.sz = fmaxf(s.sz, mu);
}

// The plain gradient a 2^(x c - m) of N logits none of which is the label (k.b is 0 without label
// smoothing); kFold: 2^(x c - m2), the sign applied at the store.
template <bool kFold, int N>
__device__ __forceinline__ void gradient_plain(const Coef& k, float c, const float (&x)[N], float (&o)[N]) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    if constexpr (kFold) {
      o[e] = ex2(fmaf(x[e], c, -k.m2));
    } else {
      o[e] = k.a * ex2(fmaf(x[e], c, -k.m));
    }
  }
}

template <bool kPlain, int N>
__device__ __forceinline__ void accumulate_any(const RowParams& p, float c, const float (&x)[N], Stats& s) {
  if constexpr (kPlain) {
    accumulate_plain<N>(c, x, s);
  } else {
    accumulate<N>(p, x, s);
  }
}

template <bool kPlain, bool kFold, int N>
__device__ __forceinline__ void gradient_any(const RowParams& p, const Coef& k, float c, const float (&x)[N],
                                             float (&o)[N]) {
  if constexpr (kPlain) {
    gradient_plain<kFold, N>(k, c, x, o);
  } else {
    gradient<N>(p, k, x, o);
  }
}

// Pass 1 over one 16-byte unit a, or over a and b folded in together (two).
template <class TIn, bool kPlain>
__device__ __forceinline__ void fold_units(const RowParams& p, float c, const Raw16& a, const Raw16& b, bool two,
                                           Stats& s) {
  constexpr int N = kVec16<TIn>;
  if (two) {
    float f[2 * N];
    raw_to_floats<TIn>(a, *reinterpret_cast<float(*)[N]>(f));
    raw_to_floats<TIn>(b, *reinterpret_cast<float(*)[N]>(f + N));
    accumulate_any<kPlain, 2 * N>(p, c, f, s);
  } else {
    float f[N];
    raw_to_floats<TIn>(a, f);
    accumulate_any<kPlain, N>(p, c, f, s);
  }
}

// The label's share of pass 1, taken by the thread that owns the label's unit (the others keep
// zy = 0, and the merge adds zy): the raw x[y] for the plain pass, z[y] otherwise.
template <bool kPlain>
__device__ __forceinline__ float label_share(const RowParams& p, float x) {
  float t;
  return kPlain ? x : transform(p, x, t);
}

// The gradient at the label, a' exp(z_y - m) - b - c (times 1 - t^2 with softcapping, t = z / cap),
// of its x (plain pass) or z (general pass), as merged into zy.
template <bool kPlain>
__device__ __forceinline__ float label_gradient(const RowParams& p, const Coef& k, float c2, float v) {
  if constexpr (kPlain) {
    return k.a * ex2(fmaf(v, c2, -k.m)) - k.b - k.c;
  } else {
    float g = k.a * ex2((v - k.m) * kLog2e) - k.b - k.c;
    if (p.cap > 0.0f) {
      const float t = v * p.inv_cap;
      g *= 1.0f - t * t;
    }
    return g;
  }
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Stores N gradient values (N * sizeof(TOut) bytes, aligned to that) with the streaming hint;
// 16-bit values are XORed with sign (0 or both halves' sign bits).
template <class TOut, int N>
__device__ __forceinline__ void store_unit(TOut* dst, const float (&o)[N], uint32_t sign) {
  if constexpr (sizeof(TOut) == 4) {
    static_assert(N == 4, "fp32 gradients come from fp32 logits");
    __stcs(reinterpret_cast<float4*>(dst), make_float4(o[0], o[1], o[2], o[3]));
  } else if constexpr (N == 8) {
    __stcs(reinterpret_cast<uint4*>(dst),
           make_uint4(pack2<TOut>(o[0], o[1]) ^ sign, pack2<TOut>(o[2], o[3]) ^ sign,
                      pack2<TOut>(o[4], o[5]) ^ sign, pack2<TOut>(o[6], o[7]) ^ sign));
  } else {
    static_assert(N == 4, "16-bit gradients of fp32 logits come in units of 4");
    __stcs(reinterpret_cast<uint2*>(dst),
           make_uint2(pack2<TOut>(o[0], o[1]) ^ sign, pack2<TOut>(o[2], o[3]) ^ sign));
  }
}

// Waits for the first `done` of the row's `groups` cp.async groups (up to 4 groups).
__device__ __forceinline__ void cp_async_wait_first(int groups, int done) {
  switch (groups - done) {
    case 0: cp_async_wait_group<0>(); break;
    case 1: cp_async_wait_group<1>(); break;
    case 2: cp_async_wait_group<2>(); break;
    default: cp_async_wait_group<3>(); break;
  }
}

// Shared-memory units are copied in cp.async groups of kGroupUnits (at most 4 groups at the plan's
// sizes), so that pass 1 waits once per group and folds units in as their group lands.
constexpr int kGroupUnits = 4;

// The vectorised row pass (see the file comment). Rows start 16-byte aligned; V % N trailing
// elements are read one at a time. Thread `lane` of the row's group of tpr threads owns units
// lane, lane + tpr, ...
// Unit indices are 32-bit (the launcher sends rows of 2^31 or more elements to the scalar kernel).
//
// kLossOnly: the instance for calls without a gradient (blocks of at most 256 threads), without
// pass 2, streaming kStream units per loop trip (all loads issued before any is used).
template <class TIn, class TOut, int kIters, bool kPlain, bool kLossOnly>
__global__ void __launch_bounds__(kLossOnly ? 256 : kMaxThreads, kLossOnly ? 4 : 1) rows_vec_kernel(RowParams p) {
  constexpr int N = kVec16<TIn>;
  constexpr int kStream = kLossOnly ? 8 : 4;
  constexpr bool kFold = kPlain && sizeof(TOut) == 2;
  extern __shared__ uint4 cached[];  // [smem_iters][blockDim.x]
  __shared__ float4 scratch[kMaxThreads / 32];
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool active = row < p.rows;
  const int64_t y = active ? label_at(p.labels, p.labels_int64, row) : p.ignore_index;
  const bool work = active && y != p.ignore_index;
  const TIn* xr = static_cast<const TIn*>(p.x) + (active ? row * p.x_stride : 0);
  const int U = static_cast<int>(p.vocab / N);
  const int tail = static_cast<int>(p.vocab - static_cast<int64_t>(U) * N);
  const int S = p.smem_iters;
  const int groups = (S + kGroupUnits - 1) / kGroupUnits;
  const int first_streamed = (kIters + S) * tpr;
  const int bdim = static_cast<int>(blockDim.x);
  uint4* my_cached = cached + threadIdx.x;  // unit j of this thread: my_cached[j * bdim]

  const float c2 = p.scale * kLog2e;
  Stats s{-FLT_MAX, 0.0f, kPlain ? -FLT_MAX : 0.0f, 0.0f};
  // The label's logit is read once, first (its latency hidden behind the row's), by the thread
  // that owns its unit (or tail element), straight into its share of the statistics (zy; no pass
  // uses it, and the merge adds the threads' zy, so that afterwards every thread holds x[y], or
  // z[y] for the general pass). Pass 2 rewrites the label's gradient from it: the logit is read
  // before any store, as it must be when the gradient overwrites the logits in place. A label
  // outside [0, V) (only without validation) has no owner; the loss is then NaN.
  const int64_t body = static_cast<int64_t>(U) * N;
  const bool owns_label = work && y >= 0 && y < p.vocab &&
                          lane == (y < body ? static_cast<int>((y / N) % tpr) : static_cast<int>((y - body) % tpr));
  if (owns_label) s.zy = label_share<kPlain>(p, to_f(xr[y]));
  Raw16 reg[kIters];
  if (work) {
    // Register units first (they are used first), then the shared-memory units in cp.async groups
    // of kGroupUnits, so that pass 1 folds each group in as soon as it has arrived.
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int u = j * tpr + lane;
      reg[j] = u < U ? load_raw16(xr + u * N) : make_uint4(0, 0, 0, 0);
    }
    for (int j = 0; j < S; ++j) {
      const int u = (kIters + j) * tpr + lane;
      if (u < U) cp_async16(&my_cached[j * bdim], xr + u * N);
      if (j % kGroupUnits == kGroupUnits - 1 || j == S - 1) cp_async_commit();
    }
#pragma unroll
    for (int j = 0; j < kIters; j += 2) {
      const int u = j * tpr + lane;
      if (u < U) fold_units<TIn, kPlain>(p, c2, reg[j], reg[j + 1 < kIters ? j + 1 : j], j + 1 < kIters && u + tpr < U, s);
    }
    for (int gi = 0; gi < groups; ++gi) {
      cp_async_wait_first(groups, gi + 1);
      const int j1 = min(S, (gi + 1) * kGroupUnits);
      for (int j = gi * kGroupUnits; j < j1; j += 2) {
        const int u = (kIters + j) * tpr + lane;
        if (u >= U) break;
        const Raw16 a = my_cached[j * bdim];
        if (j + 1 < j1 && u + tpr < U) {
          fold_units<TIn, kPlain>(p, c2, a, my_cached[(j + 1) * bdim], true, s);
        } else {
          fold_units<TIn, kPlain>(p, c2, a, a, false, s);
        }
      }
    }
    int u = first_streamed + lane;
    for (; u + (kStream - 1) * tpr < U; u += kStream * tpr) {
      Raw16 r[kStream];
#pragma unroll
      for (int q = 0; q < kStream; ++q) r[q] = load_raw16(xr + (u + q * tpr) * N);
      // One unit at a time here: folded in pairs, the 64 registers allowed only 2 of 4 such
      // loads in flight (the loss-only pass, which streams nearly all of a row, took 546 -> 576
      // us at [8192, 128256] bf16 on the H200).
#pragma unroll
      for (int q = 0; q < kStream; ++q) fold_units<TIn, kPlain>(p, c2, r[q], r[q], false, s);
    }
    for (; u < U; u += tpr) {
      const Raw16 a = load_raw16(xr + u * N);
      fold_units<TIn, kPlain>(p, c2, a, a, false, s);
    }
    for (int e = lane; e < tail; e += tpr) {
      const float f[1] = {to_f(xr[U * N + e])};
      accumulate_any<kPlain, 1>(p, c2, f, s);
    }
  }
  s = group_merge<kPlain>(s, tpr, scratch);
  // Launched with p.pdl, pass 1 (which reads only the logits and labels) overlapped the grid before
  // this one (the per-row scales); from here on its results (p.row_scale) are read. Every thread
  // waits, so that this grid never completes before that one.
  wait_prior_grid();
  if (!active) return;

  TOut* gr = p.g ? static_cast<TOut*>(p.g) + row * p.g_stride : nullptr;
  if (!work) {
    if (lane == 0) {
      p.row_loss[row] = 0.0f;
      if (p.row_z) p.row_z[row] = 0.0f;
    }
    if (gr) {
      const float zero[N] = {};
      for (int u = lane; u < U; u += tpr) store_unit<TOut, N>(gr + u * N, zero, 0u);
      for (int e = lane; e < tail; e += tpr) gr[U * N + e] = from_f<TOut>(0.0f);
    }
    return;
  }
  // Natural-unit max and label logit (the plain pass keeps raw x's max and x[y]).
  const float m_nat = kPlain ? s.sz * p.scale : s.m;
  const float zy_nat = kPlain ? s.zy * p.scale : s.zy;
  const float log_d = logf(s.d);
  const float lse = m_nat + log_d;
  if (lane == 0) {
    const float zy = (y >= 0 && y < p.vocab) ? zy_nat : __int_as_float(0x7fffffff);
    const float row_z = p.lambda * lse * lse;
    if constexpr (kPlain) {
      p.row_loss[row] = (m_nat - zy) + log_d + row_z;
    } else {
      p.row_loss[row] = (1.0f - p.eps) * (s.m - zy) + smoothing_term(p, s) + log_d + row_z;
    }
    if (p.row_z) p.row_z[row] = row_z;
  }
  if (kLossOnly || !gr) {
    return;
  }
  const float c = p.row_scale[row];
  Coef k;
  k.a = c * (1.0f + 2.0f * p.lambda * lse) * p.scale / s.d;
  k.b = c * p.eps * p.inv_vocab * p.scale;
  k.c = c * (1.0f - p.eps) * p.scale;
  k.m = s.m;
  if constexpr (kFold) {
    k.m2 = k.m - log2f(fabsf(k.a));
    k.sign = k.a < 0.0f ? 0x80008000u : 0u;
  }
#pragma unroll
  for (int j = 0; j < kIters; ++j) {
    const int u = j * tpr + lane;
    if (u < U) {
      float f[N], o[N];
      raw_to_floats<TIn>(reg[j], f);
      gradient_any<kPlain, kFold, N>(p, k, c2, f, o);
      store_unit<TOut, N>(gr + u * N, o, k.sign);
    }
  }
  for (int j = 0; j < S; ++j) {
    const int u = (kIters + j) * tpr + lane;
    if (u >= U) break;
    float f[N], o[N];
    raw_to_floats<TIn>(my_cached[j * bdim], f);
    gradient_any<kPlain, kFold, N>(p, k, c2, f, o);
    store_unit<TOut, N>(gr + u * N, o, k.sign);
  }
  int u = first_streamed + lane;
  for (; u + 3 * tpr < U; u += 4 * tpr) {
    Raw16 r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) r[q] = __ldcs(reinterpret_cast<const uint4*>(xr + (u + q * tpr) * N));
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float f[N], o[N];
      raw_to_floats<TIn>(r[q], f);
      gradient_any<kPlain, kFold, N>(p, k, c2, f, o);
      store_unit<TOut, N>(gr + (u + q * tpr) * N, o, k.sign);
    }
  }
  for (; u < U; u += tpr) {
    float f[N], o[N];
    raw_to_floats<TIn>(__ldcs(reinterpret_cast<const uint4*>(xr + u * N)), f);
    gradient_any<kPlain, kFold, N>(p, k, c2, f, o);
    store_unit<TOut, N>(gr + u * N, o, k.sign);
  }
  for (int e = lane; e < tail; e += tpr) {
    const float f[1] = {to_f(xr[U * N + e])};
    float o[1];
    gradient_any<kPlain, false, 1>(p, k, c2, f, o);
    gr[U * N + e] = from_f<TOut>(o[0]);
  }
  if (owns_label) gr[y] = from_f<TOut>(label_gradient<kPlain>(p, k, c2, s.zy));
}

// The same pass one element at a time, for layouts that forbid 16-byte accesses. Both passes
// read the row from memory.
template <class TIn, class TOut>
__global__ void __launch_bounds__(256) rows_scalar_kernel(RowParams p) {
  __shared__ float4 scratch[256 / 32];
  const int tpr = p.tpr;
  const int lane = threadIdx.x & (tpr - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / tpr) + threadIdx.x / tpr;
  const bool active = row < p.rows;
  const int64_t y = active ? label_at(p.labels, p.labels_int64, row) : p.ignore_index;
  const bool work = active && y != p.ignore_index;
  const TIn* xr = static_cast<const TIn*>(p.x) + (active ? row * p.x_stride : 0);
  Stats s{-FLT_MAX, 0.0f, 0.0f, 0.0f};
  // The label's z, read first by the lane that owns it (see rows_vec_kernel).
  const bool owns_label = work && y >= 0 && y < p.vocab && lane == static_cast<int>(y % tpr);
  if (owns_label) s.zy = label_share<false>(p, to_f(xr[y]));
  if (work) {
    for (int64_t v = lane; v < p.vocab; v += tpr) {
      const float f[1] = {to_f(xr[v])};
      accumulate<1>(p, f, s);
    }
  }
  s = group_merge<false>(s, tpr, scratch);
  if (!active) return;
  TOut* gr = p.g ? static_cast<TOut*>(p.g) + row * p.g_stride : nullptr;
  if (!work) {
    if (lane == 0) {
      p.row_loss[row] = 0.0f;
      if (p.row_z) p.row_z[row] = 0.0f;
    }
    if (gr)
      for (int64_t v = lane; v < p.vocab; v += tpr) gr[v] = from_f<TOut>(0.0f);
    return;
  }
  const float log_d = logf(s.d);
  const float lse = s.m + log_d;
  if (lane == 0) {
    const float zy = (y >= 0 && y < p.vocab) ? s.zy : __int_as_float(0x7fffffff);
    const float row_z = p.lambda * lse * lse;
    p.row_loss[row] = (1.0f - p.eps) * (s.m - zy) + smoothing_term(p, s) + log_d + row_z;
    if (p.row_z) p.row_z[row] = row_z;
  }
  if (!gr) return;
  const float c = p.row_scale[row];
  Coef k;
  k.a = c * (1.0f + 2.0f * p.lambda * lse) * p.scale / s.d;
  k.b = c * p.eps * p.inv_vocab * p.scale;
  k.c = c * (1.0f - p.eps) * p.scale;
  k.m = s.m;
  for (int64_t v = lane; v < p.vocab; v += tpr) {
    const float f[1] = {to_f(xr[v])};
    float o[1];
    gradient<1>(p, k, f, o);
    gr[v] = from_f<TOut>(o[0]);
  }
  if (owns_label) gr[y] = from_f<TOut>(label_gradient<false>(p, k, 0.0f, s.zy));
}

// ---------------------------------------------------------------------------------------------
// Final reductions (one block, fixed order in double).

__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += scratch[w];
  return s;
}

__global__ void __launch_bounds__(kMaxThreads) finalize_kernel(FinalizeParams p) {
  __shared__ double scratch[kMaxThreads / 32];
  double loss = 0.0, z = 0.0;
  const int64_t step = static_cast<int64_t>(blockDim.x) * kBatch;
  for (int64_t i0 = threadIdx.x; i0 < p.rows; i0 += step) {
    float sc[kBatch], nm[kBatch], ls[kBatch], zz[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      const bool in = i < p.rows;
      sc[j] = in ? p.row_scale[i] : 0.0f;
      nm[j] = in ? p.row_norm[i] : 0.0f;
      ls[j] = in ? p.row_loss[i] : 0.0f;
      zz[j] = in && p.row_z ? p.row_z[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = i0 + j * static_cast<int64_t>(blockDim.x);
      if (i >= p.rows) continue;
      const double li = static_cast<double>(sc[j]) * ls[j];
      const double zi = p.row_z ? static_cast<double>(nm[j]) * zz[j] : 0.0;
      if (p.per_row) {
        p.loss[i] = static_cast<float>(li);
        if (p.z_loss) p.z_loss[i] = static_cast<float>(zi);
      } else {
        loss += li;
        z += zi;
      }
      if (p.grad_loss_weight) p.grad_loss_weight[i] = nm[j] * ls[j];
    }
  }
  if (p.per_row) return;
  loss = block_sum_double(loss, scratch);
  z = block_sum_double(z, scratch);
  if (threadIdx.x == 0) {
    p.loss[0] = static_cast<float>(loss);
    if (p.z_loss) p.z_loss[0] = static_cast<float>(z);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward rescaling and conversions.

// kScaleRows rows per block, their factors read together first: when every factor is 1 and the
// scaling is in place (the eager backward of a mean or sum) the kernel is one wave of blocks that
// read a few floats each, not one block per row.
constexpr int kScaleRows = 8;

template <class T, bool kVec>
__global__ void __launch_bounds__(256) scale_rows_kernel(ScaleRowsParams p) {
  constexpr int N = kVec ? kVec16<T> : 1;
  // One factor for all rows (a mean or sum) that is 1, in place: nothing to do (every thread reads
  // the same word and the whole grid exits at once).
  if (!p.per_row && p.in == p.out && *p.g == 1.0f) return;
  __shared__ float fs[kScaleRows];
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * kScaleRows; r0 < p.rows;
       r0 += static_cast<int64_t>(gridDim.x) * kScaleRows) {
    if (threadIdx.x < kScaleRows) {
      const int64_t r = r0 + threadIdx.x;
      fs[threadIdx.x] = r < p.rows ? p.g[p.per_row ? r : 0] : 1.0f;
    }
    __syncthreads();
    for (int j = 0; j < kScaleRows; ++j) {
      const int64_t r = r0 + j;
      const float f = fs[j];
      if (r >= p.rows || (p.in == p.out && f == 1.0f)) continue;
      const T* in = static_cast<const T*>(p.in) + r * p.cols;
      T* out = static_cast<T*>(p.out) + r * p.cols;
      for (int64_t u = threadIdx.x; u < p.cols / N; u += blockDim.x) {
        float v[N];
        load_floats<N>(in + u * N, v);
#pragma unroll
        for (int e = 0; e < N; ++e) v[e] *= f;
        store_floats<N>(out + u * N, v);
      }
    }
    __syncthreads();
  }
}

__global__ void scale_values_kernel(const float* in, void* out, int out_type, int64_t n,
                                    const float* g, int per_row) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_value(out, out_type, i, g[per_row ? i : 0] * in[i]);
}

template <class T>
__global__ void convert_kernel(const float* in, T* out, int64_t n, int vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t n4 = n / 4;
    for (int64_t i = t; i < n4; i += stride) {
      float v[4];
      load_floats<4>(in + i * 4, v);
      store_floats<4>(out + i * 4, v);
    }
    done = n4 * 4;
  }
  for (int64_t i = done + t; i < n; i += stride) out[i] = from_f<T>(in[i]);
}

// ---------------------------------------------------------------------------------------------
// Host side.

// What the plans need to know of a device (queried once per device).
struct SmInfo {
  int optin = 48 * 1024;   // shared memory one block may opt in to
  int per_sm = 48 * 1024;  // shared memory of one SM
  int major = 8;           // compute capability
};

SmInfo sm_info(int device) {
  static std::mutex mu;
  static std::map<int, SmInfo> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  SmInfo info;
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess) info.optin = v;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) == cudaSuccess) info.per_sm = v;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess) info.major = v;
  cudaGetLastError();
  cache[device] = info;
  return info;
}

int smem_optin(int device) { return sm_info(device).optin; }

int pow2_at_least(int64_t v, int cap) {
  int p = 1;
  while (p < v && p < cap) p <<= 1;
  return p;
}

struct Plan {
  bool vec;
  int tpr, threads, iters, smem_iters;
  int64_t blocks;
  size_t smem_bytes;
};

// Rows of U 16-byte units: up to 4 units per thread in registers with groups of up to 256
// threads. Longer rows:
// - without a gradient (nothing to keep for a second pass): groups of 256 threads with 4 register
//   units that stream the rest, so that several rows per SM are in flight;
// - with a gradient: groups of 256..1024 threads (one row per block) with 4 register units and up
// to
//   `cap` shared-memory units per thread (cap: what fits when 1024 threads share an SM).
Plan plan_rows(int64_t rows, int64_t V, int N, bool vec, bool keep, const SmInfo& dev) {
  const int optin = dev.optin;
  Plan pl{};
  pl.vec = vec;
  if (!vec) {
    pl.tpr = pow2_at_least((V + 3) / 4, 256);
    pl.threads = 256;
  } else {
    const int64_t U = V / N;
    const int reg_tpr = pow2_at_least((U + 3) / 4, kMaxThreads);
    if (reg_tpr <= 256) {
      pl.tpr = reg_tpr;
      const int64_t need = (U + reg_tpr - 1) / reg_tpr;
      pl.iters = need <= 1 ? 1 : need <= 2 ? 2 : 4;
      pl.threads = 256;
    } else if (!keep) {
      pl.tpr = 256;
      pl.iters = 4;
      pl.smem_iters = 0;
      pl.threads = 256;
    } else {
      const int cap = std::max(0, (optin - 2048) / (kMaxThreads * 16));
      pl.tpr = std::max(256, pow2_at_least((U + 3 + cap) / (4 + cap), kMaxThreads));
      const int64_t need = (U + pl.tpr - 1) / pl.tpr;
      pl.iters = 4;
      pl.smem_iters = static_cast<int>(std::min<int64_t>(std::max<int64_t>(need - 4, 0), cap));
      pl.threads = pl.tpr;
    }
  }
  const int rows_per_block = pl.threads / pl.tpr;
  pl.blocks = (rows + rows_per_block - 1) / rows_per_block;
  pl.smem_bytes = static_cast<size_t>(pl.smem_iters) * pl.threads * 16;
  return pl;
}

// Raises the kernel's dynamic shared-memory limit once per (kernel, device), so that calls
// after the first (e.g. inside CUDA-graph capture) make no such API call. Any non-zero request
// goes through here: the default limit is 48 KiB minus the kernel's static shared memory, so a
// request of exactly 48 KiB already needs the attribute.
void allow_smem(const char* op, const void* kernel, int device, size_t bytes) {
  if (bytes == 0) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = allowed[{kernel, device}];
  if (have >= bytes) return;
  FUSEDOPS_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes)));
  have = bytes;
}

template <class TIn, class TOut, int kIters, bool kPlain, bool kLossOnly>
void launch_vec(const char* op, const RowParams& p, const Plan& pl, int device, cudaStream_t stream) {
  auto kernel = rows_vec_kernel<TIn, TOut, kIters, kPlain, kLossOnly>;
  allow_smem(op, reinterpret_cast<const void*>(kernel), device, pl.smem_bytes);
  cudaError_t err = cudaSuccess;
  const bool pdl = p.pdl && sm_info(device).major >= 9;
  if (pdl) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(pl.blocks));
    cfg.blockDim = dim3(static_cast<unsigned>(pl.threads));
    cfg.dynamicSmemBytes = pl.smem_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, kernel, p);
    if (err == cudaSuccess) err = cudaPeekAtLastError();
  } else {
    kernel<<<static_cast<unsigned>(pl.blocks), pl.threads, pl.smem_bytes, stream>>>(p);
    err = cudaPeekAtLastError();
  }
  if (err != cudaSuccess) {
    // Say which launch configuration the device refused, next to what the kernel allows.
    cudaGetLastError();
    cudaFuncAttributes at{};
    cudaFuncGetAttributes(&at, kernel);
    FUSEDOPS_FAIL(kRuntime, op, "CUDA error ", cudaGetErrorName(err), " launching the row kernel (",
                  kIters, " register units) with ", pl.blocks, " blocks of ", pl.threads,
                  " threads and ", pl.smem_bytes, " B of dynamic shared memory (rows ", p.rows,
                  ", vocab ", p.vocab, "); the kernel allows ", at.maxThreadsPerBlock,
                  " threads, uses ", at.numRegs, " registers and ", at.sharedSizeBytes,
                  " B of static shared memory, dynamic limit ", at.maxDynamicSharedSizeBytes,
                  " B, device opt-in ", smem_optin(device), " B");
  }
}

template <class TIn, class TOut>
void launch_rows(const char* op, RowParams p, int device, cudaStream_t stream) {
  constexpr int N = kVec16<TIn>;
  // The vectorised kernel indexes 16-byte units of a row with 32-bit integers.
  const bool vec = p.vocab < (int64_t{1} << 30) && aligned_to(p.x, 16) && p.x_stride % N == 0 &&
                   (!p.g || (aligned_to(p.g, sizeof(TOut) * N) && p.g_stride % N == 0));
  const Plan pl = plan_rows(p.rows, p.vocab, N, vec, p.g != nullptr, sm_info(device));
  p.tpr = pl.tpr;
  p.smem_iters = pl.smem_iters;
  if (pl.blocks == 0) return;
  if (!vec) {
    rows_scalar_kernel<TIn, TOut><<<static_cast<unsigned>(pl.blocks), pl.threads, 0, stream>>>(p);
  } else {
    // The plain pass (see merge) when no option needs the general one.
    const bool plain = p.cap <= 0.0f && p.eps == 0.0f && p.scale > 0.0f && p.scale <= FLT_MAX;
    const bool loss_only = !p.g && pl.threads <= 256;
    auto launch = [&](auto plain_tag, auto loss_only_tag) {
      constexpr bool kPlain = decltype(plain_tag)::value;
      constexpr bool kLossOnly = decltype(loss_only_tag)::value;
      switch (pl.iters) {
        case 1: launch_vec<TIn, TOut, 1, kPlain, kLossOnly>(op, p, pl, device, stream); break;
        case 2: launch_vec<TIn, TOut, 2, kPlain, kLossOnly>(op, p, pl, device, stream); break;
        default: launch_vec<TIn, TOut, 4, kPlain, kLossOnly>(op, p, pl, device, stream); break;
      }
    };
    if (plain) {
      if (loss_only) launch(std::true_type{}, std::true_type{});
      else launch(std::true_type{}, std::false_type{});
    } else {
      if (loss_only) launch(std::false_type{}, std::true_type{});
      else launch(std::false_type{}, std::false_type{});
    }
  }
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

unsigned grid_for(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 1 << 20)));
}

}  // namespace

ValueType value_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return kF32;
    case DType::kBFloat16: return kBF16;
    case DType::kFloat16: return kF16;
    default: FUSEDOPS_FAIL(kType, "", "CUDA kernels take float32, bfloat16 or float16, got ", dtype_name(dtype));
  }
}

void row_scales(const char* op, const ScaleParams& p, void* stream) {
  row_scales_kernel<<<1, kMaxThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void rows(const char* op, RowParams p, DType x_dtype, DType g_dtype, int device, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (p.rows <= 0) return;
  if (!p.g) g_dtype = x_dtype;
  if (x_dtype == g_dtype) {
    visit_dtype(x_dtype, [&](auto tag) {
      using T = decltype(tag);
      launch_rows<T, T>(op, p, device, s);
    });
  } else if (x_dtype == DType::kFloat32 && g_dtype == DType::kBFloat16) {
    launch_rows<float, __nv_bfloat16>(op, p, device, s);
  } else if (x_dtype == DType::kFloat32 && g_dtype == DType::kFloat16) {
    launch_rows<float, __half>(op, p, device, s);
  } else {
    FUSEDOPS_FAIL(kType, op, "unsupported logits / gradient dtypes ", dtype_name(x_dtype), " / ",
                  dtype_name(g_dtype));
  }
}

void finalize(const char* op, const FinalizeParams& p, void* stream) {
  finalize_kernel<<<1, kMaxThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void scale_rows(const char* op, const ScaleRowsParams& p, DType dtype, void* stream) {
  if (p.rows <= 0 || p.cols <= 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = kVec16<T>;
    const bool vec = p.cols % N == 0 && aligned_to(p.in, 16) && aligned_to(p.out, 16);
    const unsigned grid = grid_for(p.rows, kScaleRows);
    if (vec)
      scale_rows_kernel<T, true><<<grid, 256, 0, s>>>(p);
    else
      scale_rows_kernel<T, false><<<grid, 256, 0, s>>>(p);
  });
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void scale_values(const char* op, const float* in, void* out, int out_type, int64_t n,
                  const float* g, int per_row, void* stream) {
  if (n <= 0) return;
  scale_values_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, out_type, n, g, per_row);
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void convert(const char* op, const float* in, void* out, DType dtype, int64_t n, void* stream) {
  if (n <= 0) return;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const int vec = aligned_to(in, 16) && aligned_to(out, 4 * sizeof(T));
    convert_kernel<T><<<grid_for(n, 1024), 256, 0, s>>>(in, static_cast<T*>(out), n, vec);
  });
  FUSEDOPS_CUDA_LAUNCH_CHECK(op);
}

void set_label_report(const char* op, ScaleParams& p) {
  int device = 0;
  FUSEDOPS_CUDA_CHECK(op, cudaGetDevice(&device));
  p.record = device_error_record(op, device);
  p.bad_label_code = device_error_code(
      op, "labels[{index}] = {value} is outside [0, V) and is not ignore_index (its row's loss is "
          "NaN)");
}

}  // namespace fusedops::cuda::ce

// ---------------------------------------------------------------------------------------------
// The fused_cross_entropy_loss backend.

namespace fusedops {
namespace {

constexpr const char* kOp = "fused_cross_entropy_loss";

bool supports_fwd(const CrossEntropyFwdArgs& a) {
  return a.loss.dtype() == DType::kFloat32 &&
         (!a.grad_loss_weight.defined() || a.grad_loss_weight.dtype() == DType::kFloat32) &&
         (!a.loss_weight.defined() || a.loss_weight.dtype() != DType::kFloat64);
}

bool supports_bwd(const CrossEntropyBwdArgs& a) {
  return a.grad_loss.dtype() == DType::kFloat32 &&
         (!a.saved_grad_loss_weight.defined() ||
          (a.saved_grad_loss_weight.dtype() == DType::kFloat32 &&
           a.grad_loss_weight.dtype() != DType::kFloat64));
}

void fwd(const Context& ctx, const CrossEntropyFwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  void* stream = ctx.stream;
  const CrossEntropyOptions& o = a.options;
  const int64_t N = a.logits.rows(), V = a.logits.size(-1);
  const int int64 = a.labels.dtype() == DType::kInt64;
  const ce::RowsLayout l = ce::rows_layout(N);
  uint8_t* ws = a.workspace.data_as<uint8_t>();
  float* row_scale = reinterpret_cast<float*>(ws + l.row_scale);
  float* row_norm = reinterpret_cast<float*>(ws + l.row_norm);
  float* row_loss = reinterpret_cast<float*>(ws + l.row_loss);
  float* row_z = reinterpret_cast<float*>(ws + l.row_z);

  cuda::ce::ScaleParams sp{};
  sp.labels = a.labels.data();
  sp.labels_int64 = int64;
  sp.loss_weight = a.loss_weight.defined() ? a.loss_weight.data() : nullptr;
  sp.loss_weight_type = a.loss_weight.defined() ? cuda::ce::value_type(a.loss_weight.dtype()) : cuda::ce::kNoValue;
  sp.alpha_per_sample = nullptr;
  sp.rows_per_sample = 1;
  sp.alpha = 1.0;
  sp.rows = N;
  sp.ignore_index = o.ignore_index;
  sp.vocab = V;
  cuda::ce::set_label_report(kOp, sp);
  sp.mean = o.reduction == LossReduction::kMean;
  sp.row_scale = row_scale;
  sp.row_norm = row_norm;
  cuda::ce::row_scales(kOp, sp, stream);

  cuda::ce::RowParams rp{};
  rp.x = a.logits.data();
  rp.x_stride = a.logits.row_stride();
  rp.g = a.grad_logits.defined() ? a.grad_logits.data() : nullptr;
  rp.g_stride = V;
  rp.labels = a.labels.data();
  rp.labels_int64 = int64;
  rp.row_scale = row_scale;
  rp.row_loss = row_loss;
  rp.row_z = a.z_loss.defined() ? row_z : nullptr;
  rp.rows = N;
  rp.vocab = V;
  rp.ignore_index = o.ignore_index;
  rp.scale = static_cast<float>(o.logit_scale);
  rp.cap = o.logit_softcapping ? static_cast<float>(*o.logit_softcapping) : 0.0f;
  rp.inv_cap = o.logit_softcapping ? 1.0f / rp.cap : 0.0f;
  rp.eps = static_cast<float>(o.label_smoothing);
  rp.inv_vocab = 1.0f / static_cast<float>(V);
  rp.lambda = static_cast<float>(o.lse_square_scale);
  rp.pdl = 1;  // the grid just before is row_scales (see rows_vec_kernel)
  cuda::ce::rows(kOp, rp, a.logits.dtype(), a.logits.dtype(), ctx.device.index, stream);

  cuda::ce::FinalizeParams fp{};
  fp.row_scale = row_scale;
  fp.row_norm = row_norm;
  fp.row_loss = row_loss;
  fp.row_z = a.z_loss.defined() ? row_z : nullptr;
  fp.rows = N;
  fp.per_row = o.reduction == LossReduction::kNone;
  fp.loss = a.loss.data_as<float>();
  fp.z_loss = a.z_loss.defined() ? a.z_loss.data_as<float>() : nullptr;
  fp.grad_loss_weight = a.grad_loss_weight.defined() ? a.grad_loss_weight.data_as<float>() : nullptr;
  cuda::ce::finalize(kOp, fp, stream);
}

void bwd(const Context& ctx, const CrossEntropyBwdArgs& a) {
  cuda::DeviceGuard guard(kOp, ctx.device.index);
  const int per_row = a.reduction == LossReduction::kNone;
  const float* g = a.grad_loss.data_as<const float>();
  if (a.saved_grad_logits.defined() && a.saved_grad_logits.numel() > 0) {
    cuda::ce::ScaleRowsParams p{};
    p.in = a.saved_grad_logits.data();
    p.out = a.grad_logits.data();
    p.rows = a.saved_grad_logits.rows();
    p.cols = a.saved_grad_logits.size(-1);
    p.g = g;
    p.per_row = per_row;
    cuda::ce::scale_rows(kOp, p, a.saved_grad_logits.dtype(), ctx.stream);
  }
  if (a.saved_grad_loss_weight.defined())
    cuda::ce::scale_values(kOp, a.saved_grad_loss_weight.data_as<const float>(), a.grad_loss_weight.data(),
                           cuda::ce::value_type(a.grad_loss_weight.dtype()),
                           a.saved_grad_loss_weight.numel(), g, per_row, ctx.stream);
}

}  // namespace

void register_fused_cross_entropy_loss_cuda_sm80(Registry& r) {
  BackendSpec spec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
  r.add<CrossEntropyFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<CrossEntropyBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
