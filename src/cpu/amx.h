// A bf16 GEMM on Intel AMX tiles for products of bf16 rows of the same length, written
// transposed: Ct = B A^T (B [N, K] and A [M, K] bf16 rows; Ct [N, M] fp32), i.e. chunk_loss's
// logits of a block of vocabulary rows W_b against the chunk's hidden rows H, vocabulary-major:
// Ct = W_b H^T. B (the weight) is read as it is stored; only A (a chunk's few hundred rows) is
// repacked, once, into the tile unit's pair layout. The other orientation (C = A B^T) needs the
// weight repacked, a 16 x 16 transpose per 1 KiB of it, and measured no faster than oneDNN.
// Against oneDNN's one-thread product: bench/gemm/amx_gemm_bench.cpp, its runs in
// bench/results/cpu/studies/amx_gemm-2026-12-05.txt (faster up to K = 2048, slower at 4096, where
// the packed rows no longer stay in L2).
//
// Where the CPU or the kernel has no AMX (AMD, older Xeons; Linux must grant the tile state, see
// available()), callers keep the oneDNN product (src/cpu/gemm.h). The products are fp32 sums of
// exact bf16 x bf16 products, 32 at a time in the tile unit's order: not the bits of oneDNN's.
#pragma once

#include <cstdint>

#include "src/core/half.h"

namespace fusedops::cpu::amx {

using fusedops::bf16_t;

// True where this CPU has AMX-TILE and AMX-BF16, the OS enables their state and the process was
// granted it (arch_prctl ARCH_REQ_XCOMP_PERM, asked once). Tests can turn the kernel off
// (set_enabled) to run the callers' oneDNN path on an AMX machine.
bool available();
void set_enabled(bool on);

// K rounded up to the tile depth (32 bf16) and M to two tile widths (32 rows).
inline int64_t padded_k(int64_t K) { return (K + 31) / 32 * 32; }
inline int64_t padded_rows(int64_t M) { return (M + 31) / 32 * 32; }

// A [M, K] (row stride lda) -> Ap (padded_rows(M) * padded_k(K) elements), the pair layout:
// 16-row groups of A, then 32-deep steps of K, 1 KiB each; rows past M and K's tail are zeros.
// The rows from a multiple of 32, r0, start at Ap + r0 * padded_k(K). Ap may be shared by threads
// that read it.
void pack_pairs(const bf16_t* A, int64_t lda, int64_t M, int64_t K, bf16_t* Ap);

// Ct[N, M] (row stride ldc) = B A^T over K: Ct[n][m] = sum_k B[n][k] A[m][k], fp32, overwritten
// (nothing outside the N x M block is written). B [N, K] bf16 rows with stride ldb; Ap from
// pack_pairs (M of its rows from its start). Single-threaded (callers split N or M over threads).
// available() must hold.
void gemm_bat(const bf16_t* B, int64_t ldb, int64_t N, const bf16_t* Ap, int64_t M, int64_t K,
              float* Ct, int64_t ldc);

}  // namespace fusedops::cpu::amx
