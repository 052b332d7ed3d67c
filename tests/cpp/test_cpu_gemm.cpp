// The CPU GEMMs (src/cpu/gemm.h, oneDNN) against double loops: every transpose, odd shapes, leading
// dimensions past the widths, overwrite (C holds NaNs that must not survive) and accumulate, K = 0;
// bitwise repeatability, several threads calling at once. CMake runs this suite a second time with
// ONEDNN_MAX_CPU_ISA=AVX2, where oneDNN has no bf16 kernel and bgemm widens to fp32.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "src/cpu/gemm.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

const std::tuple<int64_t, int64_t, int64_t> kShapes[] = {
    {1, 1, 1},     {7, 5, 3},    {33, 65, 300}, {64, 17, 513}, {300, 40, 300},
    {9, 2100, 20}, {257, 70, 9}, {600, 40, 70}, {3, 4, 0}};

// Operands of one product with padded leading dimensions; A and B rounded to bf16 when `bf16`, so
// the double reference sees the values the bf16 GEMM sees.
struct Problem {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  std::vector<float> A, B;
  std::vector<bf16_t> Ab, Bb;

  Problem(bool ta_, bool tb_, int64_t M_, int64_t N_, int64_t K_, bool bf16, std::mt19937& gen)
      : ta(ta_), tb(tb_), M(M_), N(N_), K(K_) {
    std::normal_distribution<float> dist;
    lda = (ta ? M : K) + 3;
    ldb = (tb ? K : N) + 2;
    ldc = N + 1;
    A.resize((ta ? K : M) * lda + 1);
    B.resize((tb ? N : K) * ldb + 1);
    for (auto& v : A) v = bf16 ? to_float(float_to_bf16(dist(gen))) : dist(gen);
    for (auto& v : B) v = bf16 ? to_float(float_to_bf16(dist(gen))) : dist(gen);
    if (bf16) {
      for (float v : A) Ab.push_back(float_to_bf16(v));
      for (float v : B) Bb.push_back(float_to_bf16(v));
    }
  }

  void run(bool accumulate, float* C) const {
    if (Ab.empty())
      cpu::sgemm(ta, tb, M, N, K, A.data(), lda, B.data(), ldb, accumulate, C, ldc);
    else
      cpu::bgemm(ta, tb, M, N, K, Ab.data(), lda, Bb.data(), ldb, accumulate, C, ldc);
  }

  double expect(int64_t i, int64_t j) const {
    double acc = 0;
    for (int64_t k = 0; k < K; ++k)
      acc += double(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
    return acc;
  }
};

void check_all(bool bf16) {
  std::mt19937 gen(bf16 ? 11 : 7);
  std::normal_distribution<float> dist;
  for (auto [M, N, K] : kShapes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) +
                       " K=" + std::to_string(K) + " ta=" + std::to_string(ta) +
                       " tb=" + std::to_string(tb) + " accumulate=" + std::to_string(accumulate));
          const Problem p(ta, tb, M, N, K, bf16, gen);
          std::vector<float> C(M * p.ldc);
          for (auto& v : C) v = accumulate ? dist(gen) : std::nanf("");
          const std::vector<float> C0 = C;
          p.run(accumulate, C.data());
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              const double expect = p.expect(i, j) + (accumulate ? double(C0[i * p.ldc + j]) : 0.0);
              ASSERT_NEAR(C[i * p.ldc + j], expect, 1e-4 * (1 + std::sqrt(double(K))))
                  << i << "," << j;
            }
            // The padding between rows of C is not touched.
            for (int64_t j = N; j < p.ldc && i + 1 < M; ++j)
              ASSERT_TRUE(std::memcmp(&C[i * p.ldc + j], &C0[i * p.ldc + j], sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST(CpuGemm, SgemmMatchesDoubleLoops) { check_all(false); }
TEST(CpuGemm, BgemmMatchesDoubleLoops) { check_all(true); }

// bgemm_to_bf16: the fp32 sums plus an fp32 addend (or none), rounded once to bf16.
TEST(CpuGemm, BgemmToBf16MatchesDoubleLoops) {
  std::mt19937 gen(5);
  std::normal_distribution<float> dist;
  for (auto [M, N, K] : kShapes) {
    for (bool ta : {false, true}) {
      for (bool with_addend : {false, true}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) +
                     " K=" + std::to_string(K) + " ta=" + std::to_string(ta) +
                     " addend=" + std::to_string(with_addend));
        const Problem p(ta, false, M, N, K, true, gen);
        const int64_t ld_add = N + 5;
        std::vector<float> add(M * ld_add);
        for (auto& v : add) v = dist(gen);
        std::vector<bf16_t> C(M * p.ldc, float_to_bf16(-7.0f));
        cpu::bgemm_to_bf16(ta, false, M, N, K, p.Ab.data(), p.lda, p.Bb.data(), p.ldb,
                           with_addend ? add.data() : nullptr, ld_add, C.data(), p.ldc);
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            const double expect =
                p.expect(i, j) + (with_addend ? double(add[i * ld_add + j]) : 0.0);
            // One bf16 rounding (half an ulp: 2^-9 relative) after fp32 sums.
            ASSERT_NEAR(to_float(C[i * p.ldc + j]), expect,
                        std::abs(expect) * 0x1p-8 + 1e-4 * (1 + std::sqrt(double(K))))
                << i << "," << j;
          }
          for (int64_t j = N; j < p.ldc; ++j)
            ASSERT_EQ(C[i * p.ldc + j].bits, float_to_bf16(-7.0f).bits);
        }
      }
    }
  }
}

// Where oneDNN has a bf16 kernel bgemm uses it; with ONEDNN_MAX_CPU_ISA=AVX2 (the second CMake
// run of this suite) it has none and bgemm must widen (oneDNN cannot even make the primitive).
TEST(CpuGemm, BgemmKernelOrWidening) {
  const std::string impl = cpu::gemm_impl(true, false, true, 64, 64, 64, 64, 64, false, 64);
  const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (isa && std::string(isa) == "AVX2") {
    EXPECT_EQ(impl, "none");
  } else {
    EXPECT_NE(impl, "none");
    EXPECT_NE(impl.rfind("ref", 0), 0u) << impl;
  }
  std::printf("bf16 GEMM implementation: %s; fp32: %s\n", impl.c_str(),
              cpu::gemm_impl(false, false, true, 64, 64, 64, 64, 64, false, 64).c_str());
}

// Repeated calls give the same bits (a cached primitive, fixed thread count), and threads calling
// at once (sharing the primitive cache, each with its own scratchpad) get those bits too.
TEST(CpuGemm, RepeatableAndThreadSafe) {
  std::mt19937 gen(3);
  for (bool bf16 : {false, true}) {
    const Problem p(true, false, 96, 130, 257, bf16, gen);
    std::vector<float> first(p.M * p.ldc, 0.0f);
    p.run(false, first.data());
    std::vector<std::vector<float>> outs(4, std::vector<float>(p.M * p.ldc, 0.0f));
    std::vector<std::thread> threads;
    for (auto& out : outs)
      threads.emplace_back([&p, &out] {
        for (int rep = 0; rep < 3; ++rep) p.run(false, out.data());
      });
    for (auto& t : threads) t.join();
    for (const auto& out : outs)
      EXPECT_EQ(std::memcmp(out.data(), first.data(), first.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace fusedops::testing
