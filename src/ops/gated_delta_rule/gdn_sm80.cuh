// Private pieces of the gated delta rule CUDA backend (cuda_sm80, runs on sm_80 and later):
// runtime-dtype element access, chunk / sequence positions read on the device from cu_seqlens,
// chunk_indices and chunk_offsets, fp32 shared-memory tile loads and stores, and the one CTA-wide
// product every chunk kernel uses (FFMA, 256 threads, 4x4 outputs per thread).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "fusedops/core/context.h"
#include "fusedops/core/registry.h"
#include "fusedops/core/tensor.h"
#include "src/cuda/check.cuh"

namespace fusedops::gdn::sm80 {

// Every chunk kernel runs 256 threads (the product below maps them as a 16x16 grid).
constexpr int kThreads = 256;
constexpr int kMaxBT = 64;
constexpr int kLd = kMaxBT + 1;  // leading dimension of a [64][64] fp32 tile (odd: no conflicts)

enum : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline int code_of(DType d) {
  switch (d) {
    case DType::kFloat32: return kF32;
    case DType::kBFloat16: return kBF16;
    case DType::kFloat16: return kF16;
    default: break;
  }
  FUSEDOPS_FAIL(kType, "gated_delta_rule", "the CUDA backend takes float32, bfloat16 or float16, got ",
                dtype_name(d));
}

// Element i (in elements from p) of a tensor of dtype `code`, as float; and the store.
__device__ __forceinline__ float ldf(const void* p, int code, int64_t i) {
  if (code == kF32) return static_cast<const float*>(p)[i];
  if (code == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ __forceinline__ void stf(void* p, int code, int64_t i, float v) {
  if (code == kF32) static_cast<float*>(p)[i] = v;
  else if (code == kBF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}

// A token-major tensor [B,T,H,D] (or [B,T,H], D = 1) with element strides for B, T, H and a unit
// stride last dimension. p == nullptr when the tensor is absent.
struct Tok {
  void* p = nullptr;
  int code = kF32;
  int64_t sb = 0, st = 0, sh = 0;
  __device__ __forceinline__ int64_t off(int64_t b, int64_t t, int64_t h) const {
    return b * sb + t * st + h * sh;
  }
  __device__ __forceinline__ float ld(int64_t b, int64_t t, int64_t h, int64_t d) const {
    return ldf(p, code, off(b, t, h) + d);
  }
  __device__ __forceinline__ void st_(int64_t b, int64_t t, int64_t h, int64_t d, float v) const {
    stf(p, code, off(b, t, h) + d, v);
  }
};

inline Tok tok_of(const TensorView& v) {
  Tok t;
  if (!v.defined() || v.numel() == 0) return t;
  t.p = v.data();
  t.code = code_of(v.dtype());
  t.sb = v.stride(0);
  t.st = v.stride(1);
  t.sh = v.ndim() > 2 ? v.stride(2) : 0;
  return t;
}

// A contiguous state tensor [..., K, V] (h0, ht, dh0, dht, or the snapshots h / dh).
struct Mat {
  void* p = nullptr;
  int code = kF32;
};

inline Mat mat_of(const TensorView& v) {
  Mat m;
  if (!v.defined() || v.numel() == 0) return m;
  m.p = v.data();
  m.code = code_of(v.dtype());
  return m;
}

// Sequence / chunk layout: B rows of T tokens, or the cu_seqlens segments of row 0.
struct Layout {
  int64_t B = 0, T = 0;
  int BT = 64;
  int64_t nt = 0;               // chunks per batch row (fixed length)
  const void* cu = nullptr;     // cu_seqlens [N+1]
  const void* ci = nullptr;     // chunk_indices [NT,2]
  const void* co = nullptr;     // chunk_offsets [N+1]
  int i64 = 0;                  // index dtype is int64
};

inline Layout layout_of(int64_t B, int64_t T, int64_t BT, const TensorView& cu, const TensorView& ci,
                        const TensorView& co) {
  Layout L;
  L.B = B;
  L.T = T;
  L.BT = static_cast<int>(BT);
  L.nt = (T + BT - 1) / BT;
  if (cu.defined()) {
    L.cu = cu.data();
    L.ci = ci.defined() && ci.numel() ? ci.data() : nullptr;
    L.co = co.defined() && co.numel() ? co.data() : nullptr;
    L.i64 = cu.dtype() == DType::kInt64;
  }
  return L;
}

__device__ __forceinline__ int64_t rd_index(const void* p, int i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

struct ChunkPos {
  int64_t b, t0;
  int len;  // valid rows, in [0, BT]; 0 for a malformed index row (the CTA then does nothing)
};

// Chunk i of the chunk-parallel grid (its snapshot index is i).
__device__ __forceinline__ ChunkPos chunk_pos(const Layout& L, int64_t i) {
  ChunkPos c;
  int64_t end;
  if (L.cu == nullptr) {
    c.b = i / L.nt;
    c.t0 = (i % L.nt) * L.BT;
    end = L.T;
  } else {
    const int64_t s = rd_index(L.ci, L.i64, 2 * i), n = rd_index(L.ci, L.i64, 2 * i + 1);
    c.b = 0;
    c.t0 = rd_index(L.cu, L.i64, s) + n * L.BT;
    end = rd_index(L.cu, L.i64, s + 1);
  }
  const int64_t len = end - c.t0;
  c.len = len <= 0 ? 0 : (len > L.BT ? L.BT : static_cast<int>(len));
  return c;
}

struct SeqPos {
  int64_t b, t0, len, coff;  // batch row, first token, tokens, index of the first chunk snapshot
};

__device__ __forceinline__ SeqPos seq_pos(const Layout& L, int64_t n) {
  SeqPos s;
  if (L.cu == nullptr) {
    s.b = n;
    s.t0 = 0;
    s.len = L.T;
    s.coff = n * L.nt;
  } else {
    s.b = 0;
    s.t0 = rd_index(L.cu, L.i64, n);
    const int64_t e = rd_index(L.cu, L.i64, n + 1);
    s.len = e > s.t0 ? e - s.t0 : 0;
    s.coff = L.co ? rd_index(L.co, L.i64, n) : 0;
  }
  return s;
}

// dst[r*ld + c] (r < R, c < C) = rowscale[r] * t(b, t0 + r, h, c0 + c) for r < rows and
// c0 + c < cols, 0 elsewhere. All threads of the block take part; no barrier inside.
__device__ __forceinline__ void load_tile(float* dst, int ld, int R, int C, const Tok& t, int64_t b,
                                          int64_t t0, int64_t h, int rows, int64_t c0, int64_t cols,
                                          const float* rowscale = nullptr) {
  for (int e = threadIdx.x; e < R * C; e += blockDim.x) {
    const int r = e / C, c = e - r * C;
    float v = 0.0f;
    if (r < rows && c0 + c < cols) {
      v = t.ld(b, t0 + r, h, c0 + c);
      if (rowscale) v *= rowscale[r];
    }
    dst[r * ld + c] = v;
  }
}

// dst[r*ld + c] = m[index][y0 + r][x0 + c] of a [K,V] state, 0 outside.
__device__ __forceinline__ void load_state(float* dst, int ld, int R, int C, const Mat& m,
                                           int64_t index, int K, int V, int y0, int x0) {
  const int64_t base = index * static_cast<int64_t>(K) * V;
  for (int e = threadIdx.x; e < R * C; e += blockDim.x) {
    const int r = e / C, c = e - r * C;
    float v = 0.0f;
    if (y0 + r < K && x0 + c < V) v = ldf(m.p, m.code, base + static_cast<int64_t>(y0 + r) * V + x0 + c);
    dst[r * ld + c] = v;
  }
}

__device__ __forceinline__ void store_state(const float* src, int ld, const Mat& m, int64_t index,
                                            int K, int V, int x0, int vt) {
  const int64_t base = index * static_cast<int64_t>(K) * V;
  for (int e = threadIdx.x; e < K * vt; e += blockDim.x) {
    const int r = e / vt, c = e - r * vt;
    stf(m.p, m.code, base + static_cast<int64_t>(r) * V + x0 + c, src[r * ld + c]);
  }
}

// Rows [0, rows) and columns [c0, c0 + C) of a token-major output from src (scaled).
__device__ __forceinline__ void store_tile(const float* src, int ld, int rows, int C, const Tok& t,
                                           int64_t b, int64_t t0, int64_t h, int64_t c0,
                                           float scale = 1.0f) {
  for (int e = threadIdx.x; e < rows * C; e += blockDim.x) {
    const int r = e / C, c = e - r * C;
    t.st_(b, t0 + r, h, c0 + c, scale * src[r * ld + c]);
  }
}

__device__ __forceinline__ void fill(float* dst, int n, float v) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) dst[e] = v;
}

// The CTA-wide product C(m,n) = sum_{k<Kd} A(m,k) B(k,n) for m < M, n < N with
// A(m,k) = A[m*as0 + k*as1], B(k,n) = B[k*bs0 + n*bs1] in shared memory; f(m, n, value) is called
// once per output by the thread that owns it (a fixed owner: callers may accumulate into
// shared memory from f). Threads form a 16x16 grid, each owning the strided 4x4 outputs
// (m0 + tm + 16i, n0 + tn + 16j) of every 64x64 block. Needs blockDim.x == 256; no barrier inside
// (callers separate products that read what another writes with __syncthreads).
template <class F>
__device__ __forceinline__ void mm(int M, int N, int Kd, const float* A, int as0, int as1,
                                   const float* B, int bs0, int bs1, F&& f) {
  const int tm = threadIdx.x >> 4, tn = threadIdx.x & 15;
  for (int m0 = 0; m0 < M; m0 += 64)
    for (int n0 = 0; n0 < N; n0 += 64) {
      float acc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
      int mi[4], nj[4];
      bool mv[4], nv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        mi[i] = m0 + tm + 16 * i;
        mv[i] = mi[i] < M;
        nj[i] = n0 + tn + 16 * i;
        nv[i] = nj[i] < N;
      }
      for (int k = 0; k < Kd; ++k) {
        float a[4], bb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          a[i] = mv[i] ? A[mi[i] * as0 + k * as1] : 0.0f;
          bb[i] = nv[i] ? B[k * bs0 + nj[i] * bs1] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], bb[j], acc[i][j]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (mv[i] && nv[j]) f(mi[i], nj[j], acc[i][j]);
    }
}

// Raises a kernel's dynamic shared-memory limit once per (kernel, device), after checking the
// device's opt-in maximum. Every non-zero request goes through here: the default limit is
// 48 KiB minus the kernel's static shared memory.
inline void allow_smem(const char* op, const void* kernel, int device, size_t bytes) {
  if (bytes == 0) return;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = allowed[{kernel, device}];
  if (have >= bytes) return;
  int optin = 0;
  FUSEDOPS_CUDA_CHECK(op, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FUSEDOPS_REQUIRE(static_cast<size_t>(optin) >= bytes, kValue, op, "needs ", bytes,
                   " bytes of shared memory per block for these head sizes; the device allows ",
                   optin);
  FUSEDOPS_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes)));
  have = bytes;
}

inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

inline BackendSpec spec() {
  return BackendSpec{"cuda_sm80", DeviceKind::kCUDA, 80, INT_MAX,
                     {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm80};
}

// True when no defined tensor is float64 (the CUDA kernels take fp32/bf16/fp16 storage).
inline bool no_f64(std::initializer_list<const TensorView*> ts) {
  for (const TensorView* t : ts)
    if (t->defined() && t->dtype() == DType::kFloat64) return false;
  return true;
}

}  // namespace fusedops::gdn::sm80

namespace fusedops::gdn {
// The backward half of the CUDA backend (gated_delta_rule_bwd_sm80.cu).
void register_cuda_sm80_bwd(Registry& r);
}  // namespace fusedops::gdn
