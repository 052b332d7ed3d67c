// CPU SIMD helpers written for the compiler's auto-vectoriser: fixed-width lane accumulators
// (kLanes independent partial sums, then a fixed tree), so results are identical whatever the
// alignment of the data or the thread that runs them, and conversions between storage types
// and float over whole spans.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

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
