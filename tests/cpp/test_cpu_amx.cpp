// The AMX bf16 GEMM (src/cpu/amx.h, Ct = B A^T) against double loops: tails of M, N and K (the
// zero padding of the packed rows, the padded copies of B's), row strides past the widths, the padding of C untouched, bitwise repeatable,
// several threads at once (each configures its own tiles). Where the CPU has no AMX the kernel
// cannot run and the suite says so; its callers' oneDNN path is what runs there.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "src/cpu/amx.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

struct AmxProblem {
  int64_t M, N, K, lda, ldb, ldc;
  std::vector<bf16_t> A, B, Ap;

  AmxProblem(int64_t M_, int64_t N_, int64_t K_, std::mt19937& gen) : M(M_), N(N_), K(K_) {
    std::normal_distribution<float> dist;
    lda = K + 5;
    ldb = K + 3;
    ldc = M + 7;
    A.resize(M * lda);
    B.resize(N * ldb);
    for (auto& v : A) v = float_to_bf16(dist(gen));
    for (auto& v : B) v = float_to_bf16(dist(gen));
    Ap.resize(cpu::amx::padded_rows(M) * cpu::amx::padded_k(K));
    cpu::amx::pack_pairs(A.data(), lda, M, K, Ap.data());
  }

  // Ct [N, M], row stride ldc.
  std::vector<float> run() const {
    std::vector<float> C(N * ldc, std::nanf(""));
    cpu::amx::gemm_bat(B.data(), ldb, N, Ap.data(), M, K, C.data(), ldc);
    return C;
  }

  double expect(int64_t i, int64_t j) const {
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) acc += double(to_float(A[i * lda + k])) * to_float(B[j * ldb + k]);
    return acc;
  }
};

const std::tuple<int64_t, int64_t, int64_t> kAmxShapes[] = {
    {1, 1, 1},      {16, 16, 32},  {31, 33, 31},  {32, 32, 32},   {33, 65, 33},  {128, 1000, 128},
    {257, 40, 300}, {5, 2049, 64}, {64, 17, 513}, {70, 96, 0},    {3, 31, 96}};

TEST(CpuAmx, GemmMatchesDoubleLoops) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU (or OS) has no AMX: the kernel cannot run";
  std::mt19937 gen(23);
  for (auto [M, N, K] : kAmxShapes) {
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
    const AmxProblem p(M, N, K, gen);
    const std::vector<float> C = p.run();
    for (int64_t j = 0; j < N; ++j) {
      for (int64_t i = 0; i < M; ++i)
        ASSERT_NEAR(C[j * p.ldc + i], p.expect(i, j), 1e-5 * (1 + std::sqrt(double(K)))) << j << "," << i;
      for (int64_t i = M; i < p.ldc; ++i) ASSERT_TRUE(std::isnan(C[j * p.ldc + i])) << "padding " << j << "," << i;
    }
  }
}

// The products of bf16 values are exact in fp32, so a sum of few of them is exact: a sharp check of
// the pair layout (a wrong pairing or transpose gives a different exact value).
TEST(CpuAmx, ShortSumsAreExact) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU (or OS) has no AMX: the kernel cannot run";
  const int64_t M = 40, N = 50, K = 40;
  std::vector<bf16_t> A(M * K), B(N * K), Ap(cpu::amx::padded_rows(M) * cpu::amx::padded_k(K));
  for (int64_t i = 0; i < M * K; ++i) A[i] = float_to_bf16(float(i % 7) - 3.0f);
  for (int64_t i = 0; i < N * K; ++i) B[i] = float_to_bf16(float(i % 5) * 0.5f - 1.0f);
  cpu::amx::pack_pairs(A.data(), K, M, K, Ap.data());
  std::vector<float> C(N * M);
  cpu::amx::gemm_bat(B.data(), K, N, Ap.data(), M, K, C.data(), M);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double e = 0;
      for (int64_t k = 0; k < K; ++k) e += double(to_float(A[i * K + k])) * to_float(B[j * K + k]);
      ASSERT_EQ(C[j * M + i], float(e)) << j << "," << i;
    }
}

TEST(CpuAmx, RepeatableAndThreadSafe) {
  if (!cpu::amx::available()) GTEST_SKIP() << "this CPU (or OS) has no AMX: the kernel cannot run";
  std::mt19937 gen(3);
  const AmxProblem p(96, 700, 160, gen);
  const std::vector<float> first = p.run();
  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) got[t] = p.run();
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) ASSERT_EQ(std::memcmp(g.data(), first.data(), first.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace fusedops::testing
