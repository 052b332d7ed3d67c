// Private pieces of the gated delta rule CUDA backend (cuda_sm80, runs on sm_80 and later):
// runtime-dtype element access, chunk / sequence positions read on the device from cu_seqlens,
// chunk_indices and chunk_offsets, fp32 shared-memory tile loads and stores, and the one CTA-wide
// product every chunk kernel uses (tf32 tensor cores for 16-bit inputs, FFMA for fp32 inputs).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "fusedops/core/context.h"
#include "fusedops/core/registry.h"
#include "fusedops/core/tensor.h"
#include "src/cuda/check.cuh"

namespace fusedops::la::sm80 {

// Every chunk kernel runs 256 threads (the product below maps them as a 16x16 grid).
constexpr int kThreads = 256;
constexpr int kMaxBT = 64;
// Leading dimension of an fp32 shared-memory tile of w columns: w + 5 (5 mod 32 for w = 32 and 64).
// An odd stride keeps the FFMA product's strided reads conflict-free, and 5 mod 32 keeps the
// tensor-core fragment reads (8 rows x 4 columns per warp, either orientation) at most 2-way.
constexpr int pad_ld(int w) { return w + 5; }
constexpr int kLd = pad_ld(kMaxBT);  // [64][69]

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

// The 16 bytes at element i of a tensor of dtype `code` (16-byte aligned there) as floats into
// dst: four (float32) or eight (16-bit) values, each through e^x when ex. The load is one 16-byte
// load whatever the dtype (the dtype is looked at only to unpack it).
__device__ __forceinline__ void ld16_to(const void* p, int code, int64_t i, float* dst, bool ex) {
  const int64_t bytes = i * (code == kF32 ? 4 : 2);
  const uint4 r = *reinterpret_cast<const uint4*>(static_cast<const char*>(p) + bytes);
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  if (code == kF32) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float f = __uint_as_float(w[j]);
      dst[j] = ex ? expf(f) : f;
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = code == kBF16 ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]))
                                   : __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
    dst[2 * j] = ex ? expf(f.x) : f.x;
    dst[2 * j + 1] = ex ? expf(f.y) : f.y;
  }
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
  int tc = 0;                   // chunk products on tf32 tensor cores (16-bit inputs)
  int64_t N = 0;                // sequences (cu_seqlens.size(0) - 1)
  int64_t nsnap = 0;            // varlen state kernels: snapshots h / dh hold (0: none written)
};

// Tensor-core products for 16-bit inputs (their tf32 rounding, 2^-11 relative, stays far below
// the inputs' own 2^-8 / 2^-11); fp32 inputs keep exact-fp32 FFMA products.
inline int tc_for(DType in) { return in == DType::kBFloat16 || in == DType::kFloat16 ? 1 : 0; }

inline Layout layout_of(int64_t B, int64_t T, int64_t BT, const TensorView& cu, const TensorView& ci,
                        const TensorView& co, DType in) {
  Layout L;
  L.tc = tc_for(in);
  L.B = B;
  L.T = T;
  L.BT = static_cast<int>(BT);
  L.nt = (T + BT - 1) / BT;
  if (cu.defined()) {
    L.cu = cu.data();
    L.ci = ci.defined() && ci.numel() ? ci.data() : nullptr;
    L.co = co.defined() && co.numel() ? co.data() : nullptr;
    L.i64 = cu.dtype() == DType::kInt64;
    L.N = cu.size(0) - 1;
  }
  return L;
}

// L for a state kernel that writes the snapshots `snap` ([B,NT,...] h or dh; may be undefined):
// with cu_seqlens, seq_pos keeps every sequence's snapshots inside its NT rows.
inline Layout with_snapshots(Layout L, const TensorView& snap) {
  L.nsnap = snap.defined() && snap.ndim() >= 2 ? snap.size(1) : 0;
  return L;
}

// Index contents are not checked on the host on a GPU (see la_check.h): the position helpers
// below clamp what they read so that a malformed cu_seqlens, chunk_indices or chunk_offsets never
// addresses memory outside the call's tensors (the result is then meaningless; the device check
// of cu_seqlens reports it).
__device__ __forceinline__ int64_t clamp_index(int64_t v, int64_t lo, int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
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
    // Sequence s in [0, N), its bounds in [0, T], the chunk's start at most T.
    const int64_t s = clamp_index(rd_index(L.ci, L.i64, 2 * i), 0, L.N - 1);
    const int64_t n = clamp_index(rd_index(L.ci, L.i64, 2 * i + 1), 0, L.T);
    c.b = 0;
    const int64_t bos = L.N > 0 ? clamp_index(rd_index(L.cu, L.i64, s), 0, L.T) : 0;
    end = L.N > 0 ? clamp_index(rd_index(L.cu, L.i64, s + 1), bos, L.T) : 0;
    c.t0 = clamp_index(bos + n * L.BT, 0, L.T);
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
    s.t0 = clamp_index(rd_index(L.cu, L.i64, n), 0, L.T);
    s.len = clamp_index(rd_index(L.cu, L.i64, n + 1), s.t0, L.T) - s.t0;
    s.coff = L.co ? rd_index(L.co, L.i64, n) : 0;
    if (L.nsnap > 0) {  // the sequence's snapshots coff .. coff + ceil(len / BT) - 1 inside [0, nsnap)
      s.coff = clamp_index(s.coff, 0, L.nsnap);
      s.len = clamp_index(s.len, 0, (L.nsnap - s.coff) * L.BT);
    }
  }
  return s;
}

// Four consecutive elements i..i+3 (i a multiple of 4, p aligned to 4 elements) as float, in one
// 8-byte (16-bit types) or 16-byte (fp32) load; and the store.
__device__ __forceinline__ void ld4(const void* p, int code, int64_t i, float (&v)[4]) {
  if (code == kF32) {
    const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    return;
  }
  const uint2 x = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
  const uint32_t w[2] = {x.x, x.y};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (code == kBF16) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      v[2 * j] = f.x, v[2 * j + 1] = f.y;
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
      v[2 * j] = f.x, v[2 * j + 1] = f.y;
    }
  }
}

__device__ __forceinline__ void st4(void* p, int code, int64_t i, const float (&v)[4]) {
  if (code == kF32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
  uint32_t w[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (code == kBF16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
      w[j] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
      w[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
  }
  *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) = make_uint2(w[0], w[1]);
}

// e = r * q + cq split into (r, 4 cq), with shifts when q is a power of two.
struct QuadIdx {
  int q, shift;  // shift < 0: q is not a power of two
  __device__ __forceinline__ explicit QuadIdx(int q_) : q(q_), shift(-1) {
    if ((q_ & (q_ - 1)) == 0) {
      shift = 0;
      while ((1 << shift) < q_) ++shift;
    }
  }
  __device__ __forceinline__ void split(int e, int& r, int& c) const {
    if (shift >= 0) {
      r = e >> shift;
      c = (e & (q - 1)) << 2;
    } else {
      r = e / q;
      c = (e - r * q) << 2;
    }
  }
};

// True when element offset `base` plus any multiple of 4 and of the strides is 4-element aligned.
__device__ __forceinline__ bool quad_ok(const void* p, int code, int64_t base, int64_t s1, int64_t s2 = 0) {
  const uintptr_t bytes = code == kF32 ? 16 : 8;
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0 && ((base | s1 | s2) & 3) == 0;
}

// The R x C tile (C a multiple of 4) in quads, four quads per thread per round so that all four
// loads issue before the first shared store: get(r, c, v) fills v (zero-initialised) with
// elements c..c+3 of row r, put(r, c, v) writes them.
template <class Get, class Put>
__device__ __forceinline__ void quad_rounds(int R, int C, Get&& get, Put&& put) {
  const int q = C >> 2, n = R * q;
  const QuadIdx qi(q);
  for (int e0 = threadIdx.x; e0 < n; e0 += 4 * blockDim.x) {
    float v[4][4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int e = e0 + u * blockDim.x;
      int r, c;
      qi.split(e, r, c);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[u][j] = 0.0f;
      if (e < n) get(r, c, v[u]);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int e = e0 + u * blockDim.x;
      int r, c;
      qi.split(e, r, c);
      if (e >= n) break;
      put(r, c, v[u]);
    }
  }
}

// dst[r*ld + c] (r < R, c < C) = rowscale[r] * t(b, t0 + r, h, c0 + c) for r < rows and
// c0 + c < cols (and, when tri >= 0, c0 + c + tri <= r: the lower triangle, strict for tri = 1),
// 0 elsewhere. All threads of the block take part; no barrier inside. Reads four elements at a
// time where the tensor's alignment allows.
__device__ __forceinline__ void load_tile(float* dst, int ld, int R, int C, const Tok& t, int64_t b,
                                          int64_t t0, int64_t h, int rows, int64_t c0, int64_t cols,
                                          const float* rowscale = nullptr, int tri = -1) {
  const int64_t base = t.off(b, t0, h) + c0;
  if ((C & 3) == 0 && t.p != nullptr && quad_ok(t.p, t.code, base, t.st)) {
    quad_rounds(
        R, C,
        [&](int r, int c, float (&v)[4]) {
          if (r >= rows) return;
          if (c0 + c + 3 < cols) {
            ld4(t.p, t.code, base + r * t.st + c, v);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (c0 + c + j < cols) v[j] = ldf(t.p, t.code, base + r * t.st + c + j);
          }
        },
        [&](int r, int c, const float (&v)[4]) {
          const float sc = (rowscale != nullptr && r < rows) ? rowscale[r] : 1.0f;
#pragma unroll
          for (int j = 0; j < 4; ++j)
            dst[r * ld + c + j] = (tri < 0 || c0 + c + j + tri <= r) ? v[j] * sc : 0.0f;
        });
    return;
  }
  for (int e = threadIdx.x; e < R * C; e += blockDim.x) {
    const int r = e / C, c = e - r * C;
    float v = 0.0f;
    if (r < rows && c0 + c < cols && (tri < 0 || c0 + c + tri <= r)) {
      v = t.ld(b, t0 + r, h, c0 + c);
      if (rowscale) v *= rowscale[r];
    }
    dst[r * ld + c] = v;
  }
}

// A 64-row tile of a 16-bit token-major tensor staged in registers: quad e = threadIdx.x + 256 j
// (j < NQ) is row e / qpr, columns c0 + 4 (e % qpr) .. + 3, qpr quads per row. fetch() issues
// the 8-byte loads (rows >= rows_valid and columns >= cols read as zero) and returns at once;
// put() converts to fp32 (times rowscale[r] when given) and writes dst[r*ld + c] (one use of the loaded registers, so that the
// loads of the next chunk overlap this chunk's products). Needs 8-byte aligned quads (quad_ok).
template <int NQ>
struct RegTile {
  uint2 q[NQ];
  __device__ __forceinline__ void fetch(const Tok& t, int64_t b, int64_t t0, int64_t h, int rows_valid,
                                        int64_t c0, int qpr, int64_t cols) {
    const int64_t base = t.off(b, t0, h) + c0;
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
      const int e = threadIdx.x + j * kThreads, r = e / qpr, c = (e - r * qpr) * 4;
      q[j] = make_uint2(0u, 0u);
      if (r < rows_valid && r < kMaxBT && c0 + c + 3 < cols)
        q[j] = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(t.p) + base + r * t.st + c);
    }
  }
  __device__ __forceinline__ void put(float* dst, int ld, int code, int qpr,
                                      const float* rowscale = nullptr) const {
#pragma unroll
    for (int j = 0; j < NQ; ++j) {
      const int e = threadIdx.x + j * kThreads, r = e / qpr, c = (e - r * qpr) * 4;
      if (r >= kMaxBT) break;
      const float sc = rowscale ? rowscale[r] : 1.0f;
      const uint32_t wd[2] = {q[j].x, q[j].y};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2 f;
        if (code == kBF16) f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wd[h]));
        else f = __half22float2(*reinterpret_cast<const __half2*>(&wd[h]));
        dst[r * ld + c + 2 * h] = rowscale ? f.x * sc : f.x;
        dst[r * ld + c + 2 * h + 1] = rowscale ? f.y * sc : f.y;
      }
    }
  }
};

// True when a 16-bit token-major tensor can be staged by RegTile (8-byte aligned quads).
inline bool quad_tok(const TensorView& v) {
  if (!v.defined() || (v.dtype() != DType::kBFloat16 && v.dtype() != DType::kFloat16)) return false;
  if (reinterpret_cast<uintptr_t>(v.data()) % 8 != 0) return false;
  for (int d = 0; d + 1 < v.ndim(); ++d)
    if (v.stride(d) % 4 != 0) return false;
  return true;
}

// The [64][64] chunk matrix of A [B,T,H,BT] at chunk rows t0.. (len valid): its lower triangle
// (strictly lower when strict), 0 elsewhere.
__device__ __forceinline__ void load_tri(float* dst, const Tok& A, int64_t b, int64_t t0, int64_t h, int len,
                                         int BT, bool strict) {
  load_tile(dst, kLd, kMaxBT, kMaxBT, A, b, t0, h, len, 0, BT, nullptr, strict ? 1 : 0);
}

// dst[r*ld + c] = m[index][y0 + r][x0 + c] of a [K,V] state, 0 outside.
__device__ __forceinline__ void load_state(float* dst, int ld, int R, int C, const Mat& m,
                                           int64_t index, int K, int V, int y0, int x0) {
  const int64_t base = index * static_cast<int64_t>(K) * V;
  const int64_t o = base + static_cast<int64_t>(y0) * V + x0;
  if ((C & 3) == 0 && quad_ok(m.p, m.code, o, V)) {
    quad_rounds(
        R, C,
        [&](int r, int c, float (&v)[4]) {
          if (y0 + r >= K) return;
          if (x0 + c + 3 < V) {
            ld4(m.p, m.code, o + static_cast<int64_t>(r) * V + c, v);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (x0 + c + j < V) v[j] = ldf(m.p, m.code, o + static_cast<int64_t>(r) * V + c + j);
          }
        },
        [&](int r, int c, const float (&v)[4]) {
#pragma unroll
          for (int j = 0; j < 4; ++j) dst[r * ld + c + j] = v[j];
        });
    return;
  }
  for (int e = threadIdx.x; e < R * C; e += blockDim.x) {
    const int r = e / C, c = e - r * C;
    float v = 0.0f;
    if (y0 + r < K && x0 + c < V) v = ldf(m.p, m.code, base + static_cast<int64_t>(y0 + r) * V + x0 + c);
    dst[r * ld + c] = v;
  }
}

// m[index][r][x0 + c] = src[r*ld + c] for r < K, c < vt.
__device__ __forceinline__ void store_state(const float* src, int ld, const Mat& m, int64_t index,
                                            int K, int V, int x0, int vt) {
  const int64_t base = index * static_cast<int64_t>(K) * V;
  if ((vt & 3) == 0 && quad_ok(m.p, m.code, base + x0, V)) {
    const int q = vt >> 2;
    const QuadIdx qi(q);
    for (int e = threadIdx.x; e < K * q; e += blockDim.x) {
      int r, c;
      qi.split(e, r, c);
      const float v[4] = {src[r * ld + c], src[r * ld + c + 1], src[r * ld + c + 2], src[r * ld + c + 3]};
      st4(m.p, m.code, base + static_cast<int64_t>(r) * V + x0 + c, v);
    }
    return;
  }
  for (int e = threadIdx.x; e < K * vt; e += blockDim.x) {
    const int r = e / vt, c = e - r * vt;
    stf(m.p, m.code, base + static_cast<int64_t>(r) * V + x0 + c, src[r * ld + c]);
  }
}

// Rows [0, rows) and columns [c0, c0 + C) of a token-major output from src (scaled).
__device__ __forceinline__ void store_tile(const float* src, int ld, int rows, int C, const Tok& t,
                                           int64_t b, int64_t t0, int64_t h, int64_t c0,
                                           float scale = 1.0f) {
  const int64_t base = t.off(b, t0, h) + c0;
  if ((C & 3) == 0 && quad_ok(t.p, t.code, base, t.st)) {
    const int q = C >> 2;
    const QuadIdx qi(q);
    for (int e = threadIdx.x; e < rows * q; e += blockDim.x) {
      int r, c;
      qi.split(e, r, c);
      const float v[4] = {scale * src[r * ld + c], scale * src[r * ld + c + 1], scale * src[r * ld + c + 2],
                          scale * src[r * ld + c + 3]};
      st4(t.p, t.code, base + r * t.st + c, v);
    }
    return;
  }
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
// shared memory from f). Needs blockDim.x == 256; no barrier inside (callers separate products
// that read what another writes with __syncthreads). Each output sums its k terms in one fixed
// order, so results are deterministic.

// FFMA form: threads form a 16x16 grid, each owning the strided 4x4 outputs
// (m0 + tm + 16i, n0 + tn + 16j) of every 64x64 block.
template <class F>
__device__ __forceinline__ void mm_ffma(int M, int N, int Kd, const float* A, int as0, int as1,
                                        const float* B, int bs0, int bs1, F& f) {
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

// fp32 -> tf32, rounded to nearest (ties away), as a 32-bit mma operand.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// c += a b for one m16n8k8 tf32 tile (fp32 accumulate).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Tensor-core form: the 8 warps take 16 x (8*NJ) output tiles in turn; per 8-wide k step a lane
// loads its A fragment once (rows g, g+8; columns t, t+4 with g = lane/4, t = lane%4) and one B
// fragment per 8-column group. Rows past M and columns past N read row M-1 / column N-1 instead
// (an mma output depends only on its own row of A and column of B, and those outputs are
// dropped), so the k loop carries no predicates; only a last partial k step (Kd % 8) reads zeros
// past Kd. Operand addresses advance by pointer increments.
template <int NJ, class F>
__device__ __forceinline__ void mm_tc(int M, int N, int Kd, const float* A, int as0, int as1, const float* B,
                                      int bs0, int bs1, F& f) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  const int tn = (N + 8 * NJ - 1) / (8 * NJ), tiles = ((M + 15) >> 4) * tn;
  const int kfull = Kd & ~7, a4 = 4 * as1, a8 = 8 * as1, b4 = 4 * bs0, b8 = 8 * bs0;
  for (int wt = warp; wt < tiles; wt += kThreads / 32) {
    const int m0 = (wt / tn) * 16, n0 = (wt % tn) * (8 * NJ);
    const int r0 = m0 + gq, r1 = r0 + 8;
    const float* pa0 = A + min(r0, M - 1) * as0 + tq * as1;
    const float* pa1 = A + min(r1, M - 1) * as0 + tq * as1;
    const float* pb[NJ];
    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      pb[j] = B + min(n0 + 8 * j + gq, N - 1) * bs1 + tq * bs0;
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    }
    int k0 = 0;
#pragma unroll 2
    for (; k0 < kfull; k0 += 8) {
      const uint32_t a[4] = {to_tf32(pa0[0]), to_tf32(pa1[0]), to_tf32(pa0[a4]), to_tf32(pa1[a4])};
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        mma_tf32(acc[j], a, to_tf32(pb[j][0]), to_tf32(pb[j][b4]));
        pb[j] += b8;
      }
      pa0 += a8;
      pa1 += a8;
    }
    if (k0 < Kd) {
      const bool ok_a = k0 + tq < Kd, ok_b = k0 + tq + 4 < Kd;
      const uint32_t a[4] = {to_tf32(ok_a ? pa0[0] : 0.0f), to_tf32(ok_a ? pa1[0] : 0.0f),
                             to_tf32(ok_b ? pa0[a4] : 0.0f), to_tf32(ok_b ? pa1[a4] : 0.0f)};
#pragma unroll
      for (int j = 0; j < NJ; ++j)
        mma_tf32(acc[j], a, to_tf32(ok_a ? pb[j][0] : 0.0f), to_tf32(ok_b ? pb[j][b4] : 0.0f));
    }
    const bool v0 = r0 < M, v1 = r1 < M;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int c = n0 + 8 * j + 2 * tq;
      if (v0 && c < N) f(r0, c, acc[j][0]);
      if (v0 && c + 1 < N) f(r0, c + 1, acc[j][1]);
      if (v1 && c < N) f(r1, c, acc[j][2]);
      if (v1 && c + 1 < N) f(r1, c + 1, acc[j][3]);
    }
  }
}

// The product on tensor cores when tc (block-uniform) is set, else in FFMA. Wide outputs use
// 16x32 warp tiles (one A fragment feeds four mma); narrow ones 16x16 so that all warps work.
template <class F>
__device__ __forceinline__ void mm(int tc, int M, int N, int Kd, const float* A, int as0, int as1,
                                   const float* B, int bs0, int bs1, F&& f) {
  if (!tc) {
    mm_ffma(M, N, Kd, A, as0, as1, B, bs0, bs1, f);
  } else if (((M + 15) >> 4) * ((N + 31) >> 5) >= kThreads / 32) {
    mm_tc<4>(M, N, Kd, A, as0, as1, B, bs0, bs1, f);
  } else {
    mm_tc<2>(M, N, Kd, A, as0, as1, B, bs0, bs1, f);
  }
}

// A device attribute, queried once per (attribute, device).
inline int device_attr(const char* op, int device, cudaDeviceAttr attr) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({static_cast<int>(attr), device});
  if (it != cache.end()) return it->second;
  int v = 0;
  FUSEDOPS_CUDA_CHECK(op, cudaDeviceGetAttribute(&v, attr, device));
  return cache[{static_cast<int>(attr), device}] = v;
}

// The device's opt-in shared memory per block and its multiprocessor count.
inline size_t smem_optin(const char* op, int device) {
  return static_cast<size_t>(device_attr(op, device, cudaDevAttrMaxSharedMemoryPerBlockOptin));
}
inline int64_t sm_count(const char* op, int device) {
  return device_attr(op, device, cudaDevAttrMultiProcessorCount);
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
  const size_t optin = smem_optin(op, device);
  FUSEDOPS_REQUIRE(optin >= bytes, kValue, op, "needs ", bytes,
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

// Blocks of kThreads for an elementwise grid-stride kernel over n elements (at most 65536).
inline unsigned elem_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? b : 65536);
}

// The blocked triangular solve shared by solve_tril, the fused GDN prepare step and KDA's
// chunk_kda_fwd_intra.
constexpr int kLdT16 = 17;  // row stride of the [64][16] block stage of solve_blocked

// One warp: c = A[0..16)[0..kd) . B[0..kd)[0..8) (fp32 operands in shared memory, row strides
// lda, ldb; kd a multiple of 8) in about fp32 precision by three tf32 products of the operands'
// high and low tf32 parts (hi hi, lo hi, hi lo; lo lo is below fp32's rounding), each into its own
// m16n8k8 accumulator (three dependency chains of kd / 8 mma, not one of 3 kd / 8), added at the
// end as hi hi + (lo hi + hi lo).
__device__ __forceinline__ void warp_mm8(float (&c)[4], const float* A, int lda, const float* B, int ldb, int kd,
                                         int lane) {
  const int g = lane >> 2, t = lane & 3;
  float hh[4] = {0.0f, 0.0f, 0.0f, 0.0f}, lh[4] = {0.0f, 0.0f, 0.0f, 0.0f}, hl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < kd; k0 += 8) {
    const float a[4] = {A[g * lda + k0 + t], A[(g + 8) * lda + k0 + t], A[g * lda + k0 + t + 4],
                        A[(g + 8) * lda + k0 + t + 4]};
    const float b0 = B[(k0 + t) * ldb + g], b1 = B[(k0 + t + 4) * ldb + g];
    uint32_t ah[4], al[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      ah[e] = to_tf32(a[e]);
      al[e] = to_tf32(a[e] - __uint_as_float(ah[e]));
    }
    const uint32_t bh0 = to_tf32(b0), bh1 = to_tf32(b1);
    const uint32_t bl0 = to_tf32(b0 - __uint_as_float(bh0)), bl1 = to_tf32(b1 - __uint_as_float(bh1));
    mma_tf32(lh, al, bh0, bh1);
    mma_tf32(hl, ah, bl0, bl1);
    mma_tf32(hh, ah, bh0, bh1);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] = hh[e] + (lh[e] + hl[e]);
}

// X = (I + L)^{-1} for the strictly lower triangular L (fp32 [64][ld] in shared memory, zero
// outside j < i < 16 nb), into X (same stride): X's nb diagonal 16x16 blocks by forward
// substitution in fp32 (warp b, lane c < 16 holding column c of block b in registers), then the
// blocks below the diagonal by their distance s = 1 .. nb-1 from it, two warps per block (one per
// 8-column half: neither half of T or X_ij needs the other's):
//   T_ij = sum_{m=j}^{i-1} L_im X_mj (staged in Tb, [64][kLdT16]),  X_ij = -X_ii T_ij,
// both products on tensor cores in about fp32 precision (warp_mm8). Blocks above the diagonal
// are not written. Needs 256 threads (2 (nb - 1) <= 8 warps); ends with a barrier.
__device__ __forceinline__ void solve_blocked(const float* Ls, int ld, float* X, float* Tb, int nb) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < nb && lane < 16) {
    const float* l = Ls + 16 * warp * (ld + 1);
    float* x = X + 16 * warp * (ld + 1) + lane;
    float col[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float s = i == lane ? 1.0f : 0.0f;
#pragma unroll
      for (int m = 0; m < i; ++m) s -= l[i * ld + m] * col[m];
      col[i] = s;
      x[i * ld] = s;
    }
  }
  __syncthreads();
  const int g = lane >> 2, t = lane & 3, blk = warp >> 1, nc = 8 * (warp & 1);
  for (int s = 1; s < nb; ++s) {
    if (blk < nb - s) {
      const int i = s + blk, j = blk;
      float c[4];
      warp_mm8(c, Ls + 16 * i * ld + 16 * j, ld, X + 16 * j * ld + 16 * j + nc, ld, 16 * s, lane);
      float* tb = Tb + 16 * i * kLdT16 + nc;  // this warp's 8 columns of T_ij
#pragma unroll
      for (int e = 0; e < 4; ++e) tb[(g + 8 * (e >> 1)) * kLdT16 + 2 * t + (e & 1)] = c[e];
      __syncwarp();
      warp_mm8(c, X + 16 * i * ld + 16 * i, ld, tb, kLdT16, 16, lane);
      float* xo = X + 16 * i * ld + 16 * j + nc;
#pragma unroll
      for (int e = 0; e < 4; ++e) xo[(g + 8 * (e >> 1)) * ld + 2 * t + (e & 1)] = -c[e];
    }
    __syncthreads();
  }
}

}  // namespace fusedops::la::sm80
