// CPU SIMD helpers written for the compiler's auto-vectoriser: fixed-width lane accumulators
// (kLanes independent partial sums, then a fixed tree), so results are identical whatever the
// alignment of the data or the thread that runs them, conversions between storage types and
// float over whole spans, and the one fp32 exp / sigmoid / silu of the CPU kernels.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "src/core/half.h"

namespace fusedops::cpu {

inline constexpr int kLanes = 16;

// Eight floats (int32s) in one register: GCC/Clang vector extensions, AVX with -march=native and
// plain SSE or scalar code elsewhere.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
inline v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// Sixteen floats (int32s): one AVX-512 register with -march=native on such a CPU, two AVX2 halves
// (or SSE / scalar pieces) elsewhere; the same values either way. __m512 is this type too.
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

// ---- exp, sigmoid, silu in fp32 -------------------------------------------------------------
// One implementation for a float and for GCC vectors of floats (v8f, v16f, __m512): the element
// form is branch-free, so that loops calling it vectorise (the build's -fno-trapping-math lets GCC
// if-convert its float selects), and the vector forms are the same code on whole registers.
//
// exp(x): x = n ln2 + r, |r| <= ln2/2 (Cody-Waite, ln2 in two parts: n * 0.693359375 is exact),
// Cephes' degree-6 minimax polynomial for e^r, and 2^n applied as two exact powers 2^(n/2) (so
// that results up to FLT_MAX come out right, n = 128 included). Within 2 ulp (0.99 measured) of
// the correctly rounded value; exp(x) = 0 below -87.3365 (where e^x leaves the normal floats: no
// denormal ever comes out, whose arithmetic downstream takes microcode assists on Intel CPUs:
// stop 36, see causal_conv1d_cpu.cpp) and for -inf, +inf above 88.7228 and for +inf,
// NaN for NaN (tests/cpp/test_simd.cpp checks this over the float range). The integer of n comes
// from the bits of round(x / ln2) + 1.5 * 2^23, never a float-to-int conversion (undefined for
// NaN).
namespace simd_detail {
template <class V>
struct IntOf {
  using type = decltype(V{} < V{});  // a GCC float vector's comparison gives its int32 vector
};
template <>
struct IntOf<float> {
  using type = int32_t;
};

template <bool kOverflow, class V>
inline V exp_impl(V x) {
  using I = typename IntOf<V>::type;
  // Clamped so that n stays in [-127, 128]; NaN passes through both selects.
  V xc = x < -88.0f ? V{} - 88.0f : x;
  if constexpr (kOverflow) xc = xc > 89.0f ? V{} + 89.0f : xc;
  const V k = xc * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23 + round(x / ln2)
  const V n = k - 12582912.0f;
  V r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  V y;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    // One vscalefps (p 2^n, rounded once; n = 128 included) instead of the exponent arithmetic:
    // the same values wherever they are not flushed below (cross_entropy's former AVX-512 exp).
    // (The all-lanes masked form: GCC 12's unmasked one trips -Wmaybe-uninitialized.)
    const __m512 pm = std::bit_cast<__m512>(p);
    y = std::bit_cast<V>(_mm512_mask_scalef_ps(pm, 0xFFFF, pm, std::bit_cast<__m512>(n)));
    return x < -87.33654475f ? V{} : y;
  }
#endif
  const I ni = std::bit_cast<I>(k) - 0x4B400000;  // n as an int32 (k's low mantissa bits)
  if constexpr (kOverflow) {
    const I n1 = ni >> 1;  // 2^n as two factors: n = 128 included
    y = p * std::bit_cast<V>((n1 + 127) << 23) * std::bit_cast<V>((ni - n1 + 127) << 23);
  } else {
    y = p * std::bit_cast<V>((ni + 127) << 23);  // n <= 0 (n = -127 gives 0, flushed below)
  }
  return x < -87.33654475f ? V{} : y;
}
}  // namespace simd_detail

template <class V>
inline V exp(V x) {
  return simd_detail::exp_impl<true>(x);
}
// exp for x <= 0 (logits minus their max, -|x|, differences of cumulative log gates): exp's
// values, bit for bit, without its overflow handling (valid up to x = 88.3).
template <class V>
inline V exp_nonpositive(V x) {
  return simd_detail::exp_impl<false>(x);
}

// e^-|x| (with its sign bit, so no compare), the common factor of sigmoid and silu.
template <class V>
inline V exp_minus_abs(V x) {
  using I = typename simd_detail::IntOf<V>::type;
  return exp_nonpositive(std::bit_cast<V>(std::bit_cast<I>(x) | static_cast<int32_t>(0x80000000u)));
}

// sigmoid(x) = 1 / (1 + e^-x) from e = e^-|x| <= 1 (no overflow, no division of or into a
// denormal): 1 / (1 + e) for x >= 0, e / (1 + e) below (0 below x = -87.34, as exp).
// sigmoid_pair also gives 1 - sigmoid(x) without the cancellation of 1 - s where s is close to 1.
template <class V>
inline void sigmoid_pair(V x, V& s, V& one_minus_s) {
  const V e = exp_minus_abs(x);
  const V q = 1.0f / (1.0f + e);
  const V eq = e * q;
  s = x >= 0.0f ? q : eq;
  one_minus_s = x >= 0.0f ? eq : q;  // NaN gives NaN in both (e is NaN)
}
template <class V>
inline V sigmoid(V x) {
  const V e = exp_minus_abs(x);
  return (x >= 0.0f ? V{} + 1.0f : e) / (1.0f + e);
}
// silu(x) = x sigmoid(x), as (x >= 0 ? x : x e) / (1 + e) (silu(-inf) = -inf * 0 = NaN, as in
// torch).
template <class V>
inline V silu(V x) {
  const V e = exp_minus_abs(x);
  return (x >= 0.0f ? x : x * e) / (1.0f + e);
}

// x[i] = exp(x[i]) over a span, a register at a time (GCC leaves some scalar loops around exp
// unvectorised): sixteen lanes with AVX-512, eight otherwise (a v16f on AVX2 compiles to about 15
// instructions per element instead of 4: callgrind, GCC 12); the tail in one zero-padded vector
// (the same values as the element form).
inline void exp_inplace(float* x, int64_t n) {
#if defined(__AVX512F__)
  using V = v16f;
#else
  using V = v8f;
#endif
  constexpr int64_t kW = sizeof(V) / sizeof(float);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    V v;
    std::memcpy(&v, x + i, sizeof(v));
    v = exp(v);
    std::memcpy(x + i, &v, sizeof(v));
  }
  if (i < n) {
    V v{};
    std::memcpy(&v, x + i, static_cast<size_t>(n - i) * sizeof(float));
    v = exp(v);
    std::memcpy(x + i, &v, static_cast<size_t>(n - i) * sizeof(float));
  }
}

inline float reduce_lanes(const float (&acc)[kLanes]) {
  float a[kLanes];
  for (int i = 0; i < kLanes; ++i) a[i] = acc[i];
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}

// sum_i a[i] * b[i] in float, lane-blocked.
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  return reduce_lanes(acc);
}

inline float sum_squares(const float* __restrict a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * a[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * a[i + l];
  return reduce_lanes(acc);
}

// out[i] = float(in[i]).
template <class T>
inline void load_float(const T* __restrict in, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = to_float(in[i]);
}

// out[i] = T(in[i]) (round to nearest even).
template <class T>
inline void store_float(const float* __restrict in, T* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(in[i]);
}

// Gives a float pointer to n values of `in`: the data itself for float, else a conversion into
// `buffer` (which must hold n floats).
template <class T>
inline const float* as_float(const T* in, float* buffer, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buffer;
    (void)n;
    return reinterpret_cast<const float*>(in);
  } else {
    load_float(in, buffer, n);
    return buffer;
  }
}

}  // namespace fusedops::cpu
