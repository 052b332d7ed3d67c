// The CPU GEMM wrapper (BLAS or built-in) and the built-in fallback against double loops.
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "src/cpu/gemm.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

using GemmFn = void (*)(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                        const float*, int64_t, float, float*, int64_t);

void check_gemm(GemmFn fn, const char* name) {
  std::mt19937 gen(7);
  std::normal_distribution<float> dist;
  // Besides small and odd shapes, ones that cross the AVX-512 kernel's blocks: depth past one
  // 256-deep slice, rows past two 128-row blocks (split by rows), columns past one 2048-wide
  // block, partial 8 x 32 tiles and 8 x 8 transposes.
  for (auto [M, N, K] : {std::tuple{1, 1, 1}, {7, 5, 3}, {33, 65, 300}, {64, 17, 513}, {300, 40, 300}, {9, 2100, 20},
                         {257, 70, 9}, {3, 4, 0}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          SCOPED_TRACE(std::string(name) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                       " K=" + std::to_string(K) + " ta=" + std::to_string(ta) + " tb=" +
                       std::to_string(tb) + " beta=" + std::to_string(beta));
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
          std::vector<float> A((ta ? K : M) * lda + 1), B((tb ? N : K) * ldb + 1), C(M * ldc);
          for (auto& v : A) v = dist(gen);
          for (auto& v : B) v = dist(gen);
          for (auto& v : C) v = beta == 0.0f ? std::nanf("") : dist(gen);
          std::vector<float> C0 = C;
          fn(ta, tb, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k)
                acc += double(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
              const double expect = 1.5 * acc + (beta == 0.0f ? 0.0 : beta * double(C0[i * ldc + j]));
              ASSERT_NEAR(C[i * ldc + j], expect, 1e-4 * (1 + std::sqrt(double(K)))) << i << "," << j;
            }
          }
        }
      }
    }
  }
}

// bgemm: bf16 operands, fp32 sums, against double loops over the same bf16 values (every
// transpose, odd depths, partial micro-tiles, beta 0 / 1 / 0.5, K = 0).
TEST(CpuGemm, BgemmMatchesDoubleLoops) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist;
  // {600, 40, 70}: taller than wide, so the threads split C's rows (each packs all of B).
  for (auto [M, N, K] : {std::tuple{1, 1, 1}, {7, 5, 3}, {33, 65, 300}, {9, 40, 1030}, {300, 700, 1100},
                         {257, 2100, 64}, {600, 40, 70}, {3, 4, 0}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                       " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
          std::vector<bf16_t> A((ta ? K : M) * lda + 1), B((tb ? N : K) * ldb + 1);
          std::vector<float> C(M * ldc);
          for (auto& v : A) v = float_to_bf16(dist(gen));
          for (auto& v : B) v = float_to_bf16(dist(gen));
          for (auto& v : C) v = beta == 0.0f ? std::nanf("") : dist(gen);
          std::vector<float> C0 = C;
          cpu::bgemm(ta, tb, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k)
                acc += double(to_float(ta ? A[k * lda + i] : A[i * lda + k])) *
                       to_float(tb ? B[j * ldb + k] : B[k * ldb + j]);
              const double expect = 1.5 * acc + (beta == 0.0f ? 0.0 : beta * double(C0[i * ldc + j]));
              ASSERT_NEAR(C[i * ldc + j], expect, 1e-4 * (1 + std::sqrt(double(K)))) << i << "," << j;
            }
          }
        }
      }
    }
  }
}

TEST(CpuGemm, SgemmMatchesDoubleLoops) {
  check_gemm(&cpu::sgemm, cpu::have_avx512_sgemm() ? "avx512" : cpu::have_blas() ? "blas" : "builtin");
}
// Where the build has no AVX-512 this checks the builtin again (sgemm_avx512 falls back to it).
TEST(CpuGemm, Avx512MatchesDoubleLoops) { check_gemm(&cpu::sgemm_avx512, "avx512"); }
TEST(CpuGemm, BuiltinMatchesDoubleLoops) { check_gemm(&cpu::sgemm_builtin, "builtin"); }

}  // namespace
}  // namespace fusedops::testing
