// The CPU kernels' one fp32 exp / sigmoid / silu (src/cpu/simd.h): error bounds against double
// over the float range (a stride through every bit pattern, and dense walks where the result
// leaves the normal floats and where it overflows), the special values, and the vector forms
// equal to the element form.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "src/cpu/simd.h"

namespace fusedops {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// |got - want| in units of the float spacing at want (for want in the denormals: 2^-149); inf
// when got is not finite where want is, or the reverse.
double ulps(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0.0 : kInf;
  if (std::isinf(want) || std::isinf(got)) {
    // Overflow: the float result is inf exactly when want rounds past FLT_MAX.
    const float wf = static_cast<float>(want);
    return got == wf ? 0.0 : kInf;
  }
  const double a = std::fabs(want);
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const double spacing = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

// Floats of [lo, hi] in bit-pattern order, every `step`-th.
template <class F>
void for_floats(float lo, float hi, uint32_t step, F&& f) {
  // Walk the signed magnitude order: negative floats descend in bits, positive ascend.
  auto key = [](float x) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };
  auto from_key = [](uint32_t k) {
    return std::bit_cast<float>((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
  };
  const uint64_t a = key(lo), b = key(hi);
  for (uint64_t k = a; k <= b; k += step) f(from_key(static_cast<uint32_t>(k)));
}

TEST(Simd, ExpIsWithinTwoUlpOverTheFloatRange) {
  double worst_normal = 0, worst_denormal = 0;
  float at_normal = 0, at_denormal = 0;
  auto check = [&](float x) {
    const float y = cpu::exp(x);
    const double want = std::exp(static_cast<double>(x));
    const double u = ulps(y, want);
    if (want < 1.1754943508222875e-38) {  // below the normals: flushed to 0
      if (y != 0.0f) worst_denormal = kInf, at_denormal = x;
    } else if (u > worst_normal) {
      worst_normal = u, at_normal = x;
    }
  };
  for_floats(-kInf, kInf, 1021, check);   // the whole range, a stride through it
  for_floats(-106.0f, -86.0f, 3, check);  // where results leave the normals (flushed to 0)
  for_floats(88.0f, 89.5f, 1, check);     // every float where they overflow
  for_floats(-2.0f, -0.25f, 5, check);    // the first few n, densely
  for_floats(0.25f, 2.0f, 5, check);
  EXPECT_LE(worst_normal, 2.0) << "at x = " << at_normal;
  RecordProperty("worst_ulp_normal", std::to_string(worst_normal));
  std::printf("exp: worst %.3f ulp\n", worst_normal);
  EXPECT_EQ(worst_denormal, 0.0) << "not 0 at x = " << at_denormal;
}

TEST(Simd, ExpNonpositiveEqualsExpBelowZero) {
  int checked = 0;
  for_floats(-kInf, 0.0f, 1021, [&](float x) {
    EXPECT_TRUE(std::bit_cast<uint32_t>(cpu::exp_nonpositive(x)) ==
                std::bit_cast<uint32_t>(cpu::exp(x)))
        << "x = " << x;
    ++checked;
  });
  for_floats(-88.0f, -87.0f, 1, [&](float x) {
    EXPECT_TRUE(std::bit_cast<uint32_t>(cpu::exp_nonpositive(x)) ==
                std::bit_cast<uint32_t>(cpu::exp(x)))
        << "x = " << x;
  });
  EXPECT_GT(checked, 1000000);
  EXPECT_TRUE(std::isnan(cpu::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::exp_nonpositive(-kInf), 0.0f);
}

TEST(Simd, ExpSpecialValues) {
  EXPECT_EQ(cpu::exp(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp(-0.0f), 1.0f);
  EXPECT_EQ(cpu::exp(-kInf), 0.0f);
  EXPECT_EQ(cpu::exp(kInf), kInf);
  EXPECT_TRUE(std::isnan(cpu::exp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(cpu::exp(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::exp(88.8f), kInf);  // above ln(FLT_MAX) = 88.7228
  EXPECT_EQ(cpu::exp(1e30f), kInf);
  EXPECT_LT(cpu::exp(88.72f), kInf);
  EXPECT_EQ(cpu::exp(-87.34f), 0.0f);  // below ln(FLT_MIN) = -87.3365: flushed, no denormal
  EXPECT_EQ(cpu::exp(-103.0f), 0.0f);
  EXPECT_EQ(cpu::exp(-1e30f), 0.0f);
  EXPECT_GE(cpu::exp(-87.336f), 1.1754943508222875e-38f);  // the smallest normal results stay
}

// Bitwise equal, or both NaN (a NaN's sign and payload may differ between forms).
bool same(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) ||
         std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(Simd, VectorFormsEqualTheElementForm) {
  std::vector<float> xs;
  for_floats(-kInf, kInf, 1000003, [&](float x) { xs.push_back(x); });
  for (float x :
       {0.0f, -0.0f, kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), -103.5f, 88.7f})
    xs.push_back(x);
  while (xs.size() % 16 != 5)
    xs.push_back(static_cast<float>(xs.size()) * 0.37f - 40.0f);  // a tail
  std::vector<float> span = xs;
  cpu::exp_inplace(span.data(), static_cast<int64_t>(span.size()));
  for (size_t i = 0; i + 16 <= xs.size(); i += 16) {
    cpu::v16f v, s16, silu16;
    std::memcpy(&v, &xs[i], sizeof(v));
    const cpu::v16f e16 = cpu::exp(v);
    s16 = cpu::sigmoid(v);
    silu16 = cpu::silu(v);
    cpu::v8f h;
    std::memcpy(&h, &xs[i], sizeof(h));
    const cpu::v8f e8 = cpu::exp(h);
    for (int l = 0; l < 16; ++l) {
      const float x = xs[i + l];
      const float want = cpu::exp(x);
      EXPECT_TRUE(same(e16[l], want)) << "x = " << x;
      EXPECT_TRUE(same(span[i + l], want)) << "x = " << x;
      if (l < 8) {
        EXPECT_TRUE(same(e8[l], want)) << "x = " << x;
      }
      EXPECT_TRUE(same(s16[l], cpu::sigmoid(x))) << "x = " << x;
      EXPECT_TRUE(same(silu16[l], cpu::silu(x))) << "x = " << x;
    }
  }
  for (size_t i = xs.size() / 16 * 16; i < xs.size(); ++i)
    EXPECT_TRUE(same(span[i], cpu::exp(xs[i])));
}

TEST(Simd, SigmoidAndSiluAreWithinFourUlpOverTheFloatRange) {
  double worst_s = 0, worst_c = 0, worst_silu = 0;
  float at_s = 0, at_c = 0, at_silu = 0;
  auto check = [&](float x) {
    float s, c;
    cpu::sigmoid_pair(x, s, c);
    const double xd = x;
    // The double sigmoid and its complement, each without cancellation.
    const double e = std::exp(-std::fabs(xd));
    const double sd = xd >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    const double cd = xd >= 0 ? e / (1.0 + e) : 1.0 / (1.0 + e);
    // Within a few ulp; where the value is near or below FLT_MIN, within FLT_MIN (e^x flushed).
    constexpr double kMin = 1.1754943508222875e-38;
    const double us = sd < 2 * kMin ? (std::fabs(s - sd) <= kMin ? 0.0 : kInf) : ulps(s, sd);
    const double uc = cd < 2 * kMin ? (std::fabs(c - cd) <= kMin ? 0.0 : kInf) : ulps(c, cd);
    if (us > worst_s) worst_s = us, at_s = x;
    if (uc > worst_c) worst_c = uc, at_c = x;
    const float y = cpu::silu(x);
    if (sd >= 2 * kMin) {
      const double ul = ulps(y, xd * sd);
      if (ul > worst_silu) worst_silu = ul, at_silu = x;
    } else {
      // sigmoid(x) below the normals (x < -87.3): e^x is flushed to 0, so silu is within
      // |x| FLT_MIN of its value.
      EXPECT_LE(std::fabs(y - xd * sd), 2 * std::fabs(xd) * kMin) << "silu at x = " << x;
    }
    const double us1 = sd < 2 * kMin ? (std::fabs(cpu::sigmoid(x) - sd) <= kMin ? 0.0 : kInf)
                                     : ulps(cpu::sigmoid(x), sd);
    if (us1 > worst_s) worst_s = us1, at_s = x;
  };
  for_floats(-std::numeric_limits<float>::max(), std::numeric_limits<float>::max(), 4093, check);
  for_floats(-110.0f, -80.0f, 29, check);
  for_floats(-20.0f, 20.0f, 389, check);
  std::printf("sigmoid %.3f, 1 - sigmoid %.3f, silu %.3f ulp at worst\n", worst_s, worst_c,
              worst_silu);
  EXPECT_LE(worst_s, 4.0) << "sigmoid at x = " << at_s;
  EXPECT_LE(worst_c, 4.0) << "1 - sigmoid at x = " << at_c;
  EXPECT_LE(worst_silu, 4.0) << "silu at x = " << at_silu;
}

TEST(Simd, SigmoidAndSiluSpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(cpu::sigmoid(kInf), 1.0f);
  EXPECT_EQ(cpu::sigmoid(-kInf), 0.0f);
  EXPECT_EQ(cpu::sigmoid(0.0f), 0.5f);
  EXPECT_TRUE(std::isnan(cpu::sigmoid(nan)));
  float s, c;
  cpu::sigmoid_pair(nan, s, c);
  EXPECT_TRUE(std::isnan(s) && std::isnan(c));
  cpu::sigmoid_pair(-kInf, s, c);
  EXPECT_EQ(s, 0.0f);
  EXPECT_EQ(c, 1.0f);
  EXPECT_EQ(cpu::silu(kInf), kInf);
  EXPECT_TRUE(std::isnan(cpu::silu(-kInf)));  // -inf * 0, as torch
  EXPECT_TRUE(std::isnan(cpu::silu(nan)));
  EXPECT_EQ(cpu::silu(0.0f), 0.0f);
  EXPECT_EQ(cpu::sigmoid(-100.0f), 0.0f);  // e^-100 flushed with exp
}

}  // namespace
}  // namespace fusedops
