// Device-side storage types, conversions and vectorized (16-byte) loads and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fusedops/core/dtype.h"
#include "fusedops/core/error.h"

namespace fusedops::cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Elements of T per 16-byte access.
template <class T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// N elements of T moved as one aligned unit (16 bytes for N = 16 / sizeof(T)).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// 16 bytes of any element type held as four 32-bit registers (a struct of 16-bit elements can
// cost one register per element), converted to floats at use.
using Raw16 = uint4;

template <class T>
__device__ __forceinline__ Raw16 load_raw16(const T* p) {
  return *reinterpret_cast<const Raw16*>(p);
}

__device__ __forceinline__ void unpack(const Raw16& r, float (&out)[4]) {
  out[0] = __uint_as_float(r.x);
  out[1] = __uint_as_float(r.y);
  out[2] = __uint_as_float(r.z);
  out[3] = __uint_as_float(r.w);
}

// Two 16-bit values of T in one 32-bit word -> two floats.
template <class T>
__device__ __forceinline__ float2 unpack_word(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack_word<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack_word<__half>(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, 4);
  return __half22float2(h);
}

template <class T>
__device__ __forceinline__ void unpack(const Raw16& r, float (&out)[8]) {
  const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = unpack_word<T>(words[k]);
    out[2 * k] = f.x;
    out[2 * k + 1] = f.y;
  }
}

// 16 bytes of T as floats (4 for fp32, 8 for 16-bit types).
template <class T>
__device__ __forceinline__ void raw_to_floats(const Raw16& r, float (&out)[kVec16<T>]) {
  if constexpr (sizeof(T) == 4) {
    unpack(r, out);
  } else {
    unpack<T>(r, out);
  }
}

// Loads N consecutive elements at p (aligned to N*sizeof(T)) as floats.
template <int N, class T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int e = 0; e < N; ++e) out[e] = to_f(pack.v[e]);
}

template <int N, class T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int e = 0; e < N; ++e) pack.v[e] = from_f<T>(in[e]);
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

// Two floats rounded to T (T 16-bit) in one 32-bit word, the first in the low half (the lower
// address), rounded like from_f.
template <class T>
__device__ __forceinline__ uint32_t pack_word(float a, float b) {
  uint32_t w;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&w, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&w, &h, 4);
  }
  return w;
}

// kN floats rounded to T (as from_f rounds) and written to global memory as one access of
// kN * sizeof(T) bytes (4, 8 or 16; p aligned to it). Spelled in PTX because cicc splits some
// Pack<T, N> and uint4 stores of 16-bit data (at p + k * C for a run-time C) into 2- and 4-byte
// stores, which costs bandwidth (seen in mhc_post, causal_conv1d and rmsnorm_gated's backward).
template <class T, int kN>
__device__ __forceinline__ void store_global(T* p, const float (&v)[kN]) {
  if constexpr (kN == 1) {
    *p = from_f<T>(v[0]);
  } else if constexpr (sizeof(T) == 4 && kN == 4) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(v[0])),
                 "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])), "r"(__float_as_uint(v[3]))
                 : "memory");
  } else if constexpr (sizeof(T) == 4) {
    static_assert(kN == 2, "8 bytes of fp32");
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1]))
                 : "memory");
  } else if constexpr (kN == 8) {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(pack_word<T>(v[0], v[1])),
                 "r"(pack_word<T>(v[2], v[3])), "r"(pack_word<T>(v[4], v[5])), "r"(pack_word<T>(v[6], v[7]))
                 : "memory");
  } else if constexpr (kN == 4) {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(pack_word<T>(v[0], v[1])),
                 "r"(pack_word<T>(v[2], v[3]))
                 : "memory");
  } else {
    static_assert(kN == 2, "4 bytes of 16-bit values");
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(pack_word<T>(v[0], v[1])) : "memory");
  }
}

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Runtime DType -> device storage type: visit_dtype(d, [&](auto tag) { using T = decltype(tag); });
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kBFloat16: return fn(__nv_bfloat16{});
    case DType::kFloat16: return fn(__half{});
    default: break;
  }
  FUSEDOPS_FAIL(kType, "", "CUDA kernels take float32, bfloat16 or float16, got ",
                dtype_name(dtype));
}

}  // namespace fusedops::cuda
