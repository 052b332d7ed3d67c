// GEMMs on the CPU through oneDNN's matmul primitive (AVX-512, AVX512-BF16 and AMX kernels chosen
// at run time for the CPU it runs on; the decision and its measurements are in
// src/ops/matmul_add/README.md). Row-major operands with leading dimensions (elements):
//
//   C[M,N] = op(A) @ op(B)      or, with `accumulate`,  C[M,N] += op(A) @ op(B)
//   op(A) = A or A^T ([M,K]), op(B) = B or B^T ([K,N])
//
// The products are summed in fp32 (fp32 operands: IEEE fp32 FMAs, no reduced-precision mode).
// Without `accumulate` C is only written (NaNs in it do not survive). One primitive per shape,
// layout and thread count is created on first use (the JIT, ~0.5 ms) and cached for the process;
// calls from several threads at once are safe. Results are bitwise reproducible run to run for a
// fixed thread count (OpenMP's, read at the call; 1 for a call made inside a parallel region,
// which runs on the calling thread).
#pragma once

#include <cstdint>
#include <string>

#include "src/core/half.h"

namespace fusedops::cpu {

using fusedops::bf16_t;

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
           const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc);

// bf16 A and B, fp32 C. On a CPU where oneDNN has no bf16 kernel (no AVX-512) the operands are
// widened to fp32 and go through sgemm: the same values, summed in fp32.
void bgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t* A,
           int64_t lda, const bf16_t* B, int64_t ldb, bool accumulate, float* C, int64_t ldc);

// bf16 A and B, C written in bf16: the fp32 sums (plus `addend[M,N]`, fp32 with leading dimension
// ld_addend, when not null) rounded once to bf16 (round to nearest even). For a last product whose
// fp32 result would only be converted, e.g. a weight gradient accumulated over chunks in fp32.
// Where oneDNN has no bf16 kernel: bgemm into fp32, then the same rounding.
void bgemm_to_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16_t* A,
                   int64_t lda, const bf16_t* B, int64_t ldb, const float* addend,
                   int64_t ld_addend, bf16_t* C, int64_t ldc);

// The oneDNN implementation serving a product (e.g. "brg:avx512_core_amx"), for tests and the
// benchmark; creates the primitive if needed.
std::string gemm_impl(bool bf16, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                      int64_t lda, int64_t ldb, bool accumulate, int64_t ldc);

}  // namespace fusedops::cpu
