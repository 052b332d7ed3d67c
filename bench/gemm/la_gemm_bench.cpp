// Times the linear-attention CPU GEMM (la::cpu::gemm in the header LA_HEADER, default this tree's
// src/ops/linear_attention/la_cpu_kernels.h) single-threaded at the chunk products the GDN / KDA
// backends make (chunk 64, K = V = 128; A and B with a leading dimension of 256 as in a token-major
// [T, H * D] tensor), median of 2000 calls each. bench/gemm/la_gemm_study.sh builds it for this
// tree and for an older header and writes both tables.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#ifndef LA_HEADER
#define LA_HEADER "src/ops/linear_attention/la_cpu_kernels.h"
#endif
#include LA_HEADER

using namespace fusedops::la::cpu;

namespace {
double median_us(const std::function<void()>& f, int reps = 2000) {
  for (int i = 0; i < 50; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

#ifdef __AVX512F__
// The core's fp32 FMA peak: twelve independent chains of 512-bit (or 256-bit) FMAs, GFLOP/s.
template <class V, V (*Fma)(V, V, V), V (*Set)(float)>
double fma_peak(int lanes) {
  constexpr long kIters = 20000000;
  V acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = Set(0.001f * j);
  const V x = Set(0.9999f), y = Set(1e-5f);
  const auto a = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i)
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = Fma(acc[j], x, y);
  const auto b = std::chrono::steady_clock::now();
  float sink[16];
  for (int j = 1; j < 12; ++j) acc[0] = Fma(acc[0], x, acc[j]);
  std::memcpy(sink, &acc[0], sizeof(float) * lanes);
  std::printf("%s", sink[0] == 12345.0f ? " " : "");
  return 12.0 * kIters * 2 * lanes / std::chrono::duration<double>(b - a).count() / 1e9;
}
__m512 fma512(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
__m512 set512(float x) { return _mm512_set1_ps(x); }
__m256 fma256(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
__m256 set256(float x) { return _mm256_set1_ps(x); }
#endif

struct Shape {
  int M, N, K;
  bool a_trans, b_trans;
  Tri tri;
  bool c_lower;
  const char* use;
};
}  // namespace

int main() {
  std::mt19937 g(1);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> A(256 * 256), Al(256 * 256), B(256 * 256), C(256 * 256);
  for (auto& x : A) x = d(g);
  for (auto& x : B) x = d(g);
  // A lower-triangular operand holds its zeros (the GEMM skips them per block of rows).
  for (int i = 0; i < 256; ++i)
    for (int k = 0; k < 256; ++k) Al[i * 256 + k] = k <= i ? A[i * 256 + k] : 0.0f;
  const Shape shapes[] = {
      {64, 128, 128, false, false, Tri::kNone, false, "q S (output, state part)"},
      {64, 128, 64, false, false, Tri::kLower, false, "A v (w/u, lower-triangular A)"},
      {64, 64, 128, false, true, Tri::kNone, true, "k k^T (lower blocks only)"},
      {128, 128, 64, true, false, Tri::kNone, false, "k^T u (state update)"},
      {64, 128, 128, true, false, Tri::kNone, false, "transposed A"},
      {64, 64, 128, false, true, Tri::kNone, false, "q k^T (full)"},
  };
  std::printf("| product | M x N x K | use | median | GFLOP/s |\n|---|---|---|---|---|\n");
  double total = 0, checksum = 0;
  for (const Shape& s : shapes) {
    const double t = median_us([&] {
      gemm(s.M, s.N, s.K, 1.0f, s.tri == Tri::kLower ? Al.data() : A.data(), s.a_trans ? 1 : 256, s.a_trans ? 256 : 1, B.data(), 256,
           false, C.data(), 256, s.tri, s.c_lower, nullptr, 0, s.b_trans);
    });
    for (int i = 0; i < s.M; ++i)
      for (int j = 0; j < (s.c_lower ? std::min(s.N, i + 1) : s.N); ++j) checksum += C[i * 256 + j];
    total += t;
    std::printf("| %s%s%s | %d x %d x %d | %s | %.2f us | %.1f |\n", s.a_trans ? "A^T " : "A ",
                s.b_trans ? "B^T" : "B", s.tri == Tri::kLower ? " (A lower)" : "", s.M, s.N, s.K,
                s.use, t, 2.0 * s.M * s.N * s.K / 1e3 / t);
  }
#ifdef __AVX512F__
  std::printf("\nfp32 FMA peak of one core: %.1f GFLOP/s with zmm, %.1f with ymm\n",
              fma_peak<__m512, fma512, set512>(16), fma_peak<__m256, fma256, set256>(8));
#endif
  std::printf("\ntotal %.2f us; checksum of the products %.9g (equal checksums: the same bits)\n", total,
              checksum);
}
