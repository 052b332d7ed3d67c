// fp32 GEMM on the CPU: a BLAS (OpenBLAS) when the build found one, else a blocked,
// OpenMP-parallel fallback. Row-major operands with leading dimensions (elements).
//
//   C[M,N] = alpha * op(A) @ op(B) + beta * C,   op(A) = A or A^T ([M,K]), op(B) = B or B^T ([K,N])
//
// beta == 0 overwrites C (NaNs in C are not propagated). Results are reproducible run to run for
// a fixed thread count.
#pragma once

#include <cstdint>

namespace fusedops::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The built-in blocked implementation that sgemm uses when there is no BLAS (always compiled,
// so it is tested everywhere).
void sgemm_builtin(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                   int64_t ldc);

// Whether sgemm goes through a BLAS library.
bool have_blas();

}  // namespace fusedops::cpu
