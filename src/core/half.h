// Host-side 16-bit float storage types and their conversions (round to nearest even).
// CUDA code uses __half / __nv_bfloat16 instead; these are for CPU backends and tests.
#pragma once

#include <cstdint>
#include <cstring>

namespace fusedops {

struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float to_float(float v) { return v; }
inline float to_float(double v) { return static_cast<float>(v); }
inline float to_float(bf16_t v) { return bits_to_float(static_cast<uint32_t>(v.bits) << 16); }

inline bf16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

#if defined(__FLT16_MAX__) && defined(__F16C__)
// The compiler has a native _Float16 with hardware conversions (F16C): they vectorize.
inline float to_float(fp16_t v) {
  _Float16 h;
  std::memcpy(&h, &v.bits, 2);
  return static_cast<float>(h);
}
inline fp16_t float_to_fp16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  fp16_t out;
  std::memcpy(&out.bits, &h, 2);
  return out;
}
#else
inline float to_float(fp16_t v) {
  uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t man = v.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    // Subnormal (or zero): value = man * 2^-24.
    float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}
inline fp16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7e00u)};
  if (a >= 0x477ff000u) return fp16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {
    // Result is subnormal in fp16: scale to units of 2^-24 and round to nearest even.
    float v = bits_to_float(a) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(v);
    float rem = v - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return fp16_t{static_cast<uint16_t>(sign | m)};
  }
  uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return fp16_t{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}
#endif

template <class T>
inline T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline double from_float<double>(float f) { return f; }
template <>
inline bf16_t from_float<bf16_t>(float f) { return float_to_bf16(f); }
template <>
inline fp16_t from_float<fp16_t>(float f) { return float_to_fp16(f); }

}  // namespace fusedops
