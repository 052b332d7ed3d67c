// The cuBLASLt wrapper (src/cuda/gemm.h) against double loops, on the GPU.
#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

#ifdef FUSEDOPS_WITH_CUDA
#include "src/cuda/gemm.h"
#endif

namespace fusedops::testing {
namespace {

TEST(CudaGemm, MatchesDoubleLoopsForEveryLayoutAndType) {
#ifndef FUSEDOPS_WITH_CUDA
  GTEST_SKIP() << "built without CUDA (FUSEDOPS_CUDA=OFF or no nvcc)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible in this process";
  const Device dev = Device::cuda(0);
  TestTensor ws(DType::kUInt8, {static_cast<int64_t>(cuda::gemm_workspace_bytes())}, dev);
  int checked = 0;
  for (DType ab : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType c : {DType::kFloat32, ab}) {
      for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {37, 65, 129}, {256, 128, 64}}) {
        for (bool ta : {false, true}) {
          for (bool tb : {false, true}) {
            for (float beta : {0.0f, 1.0f}) {
              SCOPED_TRACE(std::string(dtype_name(ab)) + "->" + dtype_name(c) + " " + std::to_string(M) + "x" +
                           std::to_string(N) + "x" + std::to_string(K) + " ta" + std::to_string(ta) +
                           " tb" + std::to_string(tb) + " beta" + std::to_string(beta));
              TestTensor A(ab, {ta ? K : M, ta ? M : K}, dev), B(ab, {tb ? N : K, tb ? K : N}, dev);
              TestTensor C(c, {M, N}, dev);
              const auto av = A.fill_normal(1 + checked), bv = B.fill_normal(2 + checked);
              const auto c0 = C.fill_normal(3 + checked);
              cuda::GemmArgs g;
              g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.ab_type = ab, g.c_type = c;
              g.alpha = 0.75f, g.beta = beta, g.A = A.data(), g.lda = ta ? M : K, g.B = B.data();
              g.ldb = tb ? K : N, g.C = C.data(), g.ldc = N;
              cuda::gemm("test", g, ws.data(), cuda::gemm_workspace_bytes(), nullptr, 0);
              const auto out = C.to_double();
              std::vector<double> ref(M * N);
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                  double acc = 0;
                  for (int64_t k = 0; k < K; ++k)
                    acc += (ta ? av[k * M + i] : av[i * K + k]) * (tb ? bv[j * K + k] : bv[k * N + j]);
                  ref[i * N + j] = 0.75 * acc + beta * c0[i * N + j];
                }
              // Operands are exact in their type; fp32 accumulation (or tf32-free fp32 math) and
              // one output rounding: allow the output type's rounding plus fp32 accumulation error.
              const double tol_scale = floor_for(c) + 1e-5 * std::sqrt(double(K));
              double ref_max = 1;
              for (double r : ref) ref_max = std::max(ref_max, std::abs(r));
              EXPECT_LE(max_abs_error(out, ref), tol_scale * ref_max * 4) << "rms-rel " << rms_relative_error(out, ref);
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
#endif
}

}  // namespace
}  // namespace fusedops::testing
