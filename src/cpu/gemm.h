// fp32 GEMM on the CPU: our AVX-512 kernel where the build targets AVX-512, else a BLAS (OpenBLAS)
// when the build found one, else a blocked, OpenMP-parallel fallback. Row-major operands with leading dimensions (elements).
//
//   C[M,N] = alpha * op(A) @ op(B) + beta * C,   op(A) = A or A^T ([M,K]), op(B) = B or B^T ([K,N])
//
// beta == 0 overwrites C (NaNs in C are not propagated). Results are reproducible run to run for
// a fixed thread count.
#pragma once

#include <cstdint>

#include "src/core/half.h"

namespace fusedops::cpu {

using fusedops::bf16_t;

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The built-in blocked implementation that sgemm uses when there is no BLAS (always compiled,
// so it is tested everywhere).
void sgemm_builtin(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                   int64_t ldc);

// Whether sgemm goes through a BLAS library.
bool have_blas();

// The AVX-512 kernel (packed panels, 8 x 32 micro-kernel) that sgemm uses where the build targets
// AVX-512 (have_avx512_sgemm()); elsewhere sgemm_avx512 calls sgemm_builtin. Reproducible for a
// fixed thread count.
bool have_avx512_sgemm();
void sgemm_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C[M,N] = alpha * op(A) @ op(B) + beta * C for bf16 A and B, fp32 C, the products summed in fp32:
// the bf16 dot-product instruction of AVX-512 BF16 (`vdpbf16ps`) when the build targets a CPU
// that has it (have_bf16_gemm()), else the operands widened to fp32 and sgemm. Reproducible for a
// fixed thread count.
bool have_bf16_gemm();
void bgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
           int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace fusedops::cpu
