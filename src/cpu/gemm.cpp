#include "src/cpu/gemm.h"

#include <algorithm>
#include <vector>

#include "src/cpu/parallel.h"

#ifdef FUSEDOPS_WITH_BLAS
#include <cblas.h>
#endif

namespace fusedops::cpu {

bool have_blas() {
#ifdef FUSEDOPS_WITH_BLAS
  return true;
#else
  return false;
#endif
}

// The fallback: C rows in parallel; for each block of C rows, B is packed as a contiguous
// [kc, N] panel (transposing when needed) so the inner loop streams both C and B rows.
void sgemm_builtin(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  constexpr int64_t kRows = 16, kDepth = 256;
  auto a_at = [&](int64_t i, int64_t k) { return ta ? A[k * lda + i] : A[i * lda + k]; };
  parallel_for(0, (M + kRows - 1) / kRows, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> panel(kDepth * N);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t i0 = blk * kRows, i1 = std::min(M, i0 + kRows);
      for (int64_t i = i0; i < i1; ++i) {
        float* c = C + i * ldc;
        if (beta == 0.0f) {
          std::fill(c, c + N, 0.0f);
        } else if (beta != 1.0f) {
          for (int64_t j = 0; j < N; ++j) c[j] *= beta;
        }
      }
      for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
        const int64_t kc = std::min(kDepth, K - k0);
        for (int64_t k = 0; k < kc; ++k) {
          float* p = panel.data() + k * N;
          if (tb) {
            for (int64_t j = 0; j < N; ++j) p[j] = B[j * ldb + k0 + k];
          } else {
            std::copy(B + (k0 + k) * ldb, B + (k0 + k) * ldb + N, p);
          }
        }
        for (int64_t i = i0; i < i1; ++i) {
          float* c = C + i * ldc;
          for (int64_t k = 0; k < kc; ++k) {
            const float a = alpha * a_at(i, k0 + k);
            const float* p = panel.data() + k * N;
            for (int64_t j = 0; j < N; ++j) c[j] += a * p[j];
          }
        }
      }
    }
  });
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
#ifdef FUSEDOPS_WITH_BLAS
  // OpenBLAS runs single-threaded and the product is split over our OpenMP threads, each calling
  // it on a block of C's rows or columns (the longer side). With OpenBLAS's own thread pool, its
  // threads and our OpenMP workers (still spinning after the previous parallel region) competed
  // for the cores: on a 2-core VM a bf16 chunk_loss spent 13% of its time in sgemm and ~40% in
  // libgomp's spin and sched_yield (perf, stop 24). Each block's sums over K run in the same
  // order as the whole product's, so the split changes no result.
  static const bool single = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  if (beta == 0.0f) {
    // BLAS scales C by beta even when it is 0, so NaNs already in C would survive as NaN*0.
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
  }
  auto call = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const float* a = trans_a ? A + i0 : A + i0 * lda;
    const float* b = trans_b ? B + j0 * ldb : B + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(i1 - i0), static_cast<int>(j1 - j0), static_cast<int>(K), alpha, a,
                static_cast<int>(lda), b, static_cast<int>(ldb), beta, C + i0 * ldc + j0, static_cast<int>(ldc));
  };
  // Blocks of at least 32 rows or columns and ~2 MFLOP, so small products stay on one thread.
  constexpr int64_t kMinSide = 32, kMinFlops = int64_t{1} << 21;
  const bool by_rows = M >= N;
  const int64_t side = by_rows ? M : N;
  const int64_t grain = std::max(kMinSide, kMinFlops / std::max<int64_t>(1, 2 * (by_rows ? N : M) * K));
  parallel_for(0, side, grain, [&](int64_t b0, int64_t b1) {
    if (by_rows) {
      call(b0, b1, 0, N);
    } else {
      call(0, M, b0, b1);
    }
  });
#else
  sgemm_builtin(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

}  // namespace fusedops::cpu
