#include "src/cpu/gemm.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define FUSEDOPS_F32_GEMM 1
#if defined(__AVX512BF16__)
#define FUSEDOPS_BF16_GEMM 1
#endif
#endif

#include "src/cpu/parallel.h"
#include "src/cpu/scratch.h"

#ifdef FUSEDOPS_WITH_BLAS
#include <cblas.h>
#endif

namespace fusedops::cpu {
namespace {

// Scales C by beta (beta == 0 writes zeros: NaNs in C are not propagated).
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  if (beta == 1.0f) return;
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(c, c + N, 0.0f);
    } else {
      for (int64_t j = 0; j < N; ++j) c[j] *= beta;
    }
  }
}

// Threads split C's columns (NR panels: every thread packs all of A) or its rows (MC blocks: every
// thread packs all of B), preferring the split that packs the smaller operand again when both
// give every thread work. The split changes no result: each element's K order is fixed.
[[maybe_unused]] bool split_by_cols(int64_t M, int64_t N, int64_t nr, int64_t mc) {
  const int64_t t = max_threads();
  const int64_t col_units = (N + nr - 1) / nr, row_units = (M + mc - 1) / mc;
  if (t <= 1) return true;
  if (M > N && row_units >= t) return false;
  if (col_units >= t) return true;
  return col_units >= row_units;
}

}  // namespace

bool have_blas() {
#if defined(FUSEDOPS_WITH_BLAS) && !defined(FUSEDOPS_F32_GEMM)
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

// ---------------------------------------------------------------------------------------------
// fp32 GEMM on AVX-512, through blocked_gemm (below) as the bf16 kernel: B panels [k][NR] (a KC x NC
// block 2 MiB, L3), A strips [k][MR] (an MC x KC block 128 KiB, L2); an 8 x 32 micro-kernel of 16
// zmm accumulators, per k 2 loads of B, 8 broadcasts of A and 16 FMAs.
bool have_avx512_sgemm() {
#ifdef FUSEDOPS_F32_GEMM
  return true;
#else
  return false;
#endif
}

#ifdef FUSEDOPS_F32_GEMM
namespace {

constexpr int64_t kFMR = 8, kFNR = 32, kFKC = 256, kFMC = 128, kFNC = 2048;

// r[t][u] -> r[u][t] for an 8 x 8 block of floats.
inline void transpose8x8(__m256 (&r)[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// The lane masks of a 32-column tile's two 16-float halves when only nj columns exist.
inline void tile_masks(int64_t nj, __mmask16& m0, __mmask16& m1) {
  m0 = nj >= 16 ? __mmask16(0xffff) : __mmask16((1u << nj) - 1u);
  m1 = nj >= 32 ? __mmask16(0xffff) : nj <= 16 ? __mmask16(0) : __mmask16((1u << (nj - 16)) - 1u);
}

// C[8 x 32] (rows mr, columns nj) = alpha * acc (overwrite) or += alpha * acc: the micro-kernels'
// epilogue.
inline void store_tile(const __m512 (&acc)[8][2], float alpha, float* C, int64_t ldc, int64_t mr, int64_t nj,
                       bool overwrite) {
  const __m512 al = _mm512_set1_ps(alpha);
  __mmask16 m0, m1;
  tile_masks(nj, m0, m1);
  for (int ii = 0; ii < mr; ++ii) {
    float* c = C + ii * ldc;
    if (overwrite) {
      _mm512_mask_storeu_ps(c, m0, _mm512_mul_ps(al, acc[ii][0]));
      if (m1) _mm512_mask_storeu_ps(c + 16, m1, _mm512_mul_ps(al, acc[ii][1]));
    } else {
      _mm512_mask_storeu_ps(c, m0, _mm512_fmadd_ps(al, acc[ii][0], _mm512_maskz_loadu_ps(m0, c)));
      if (m1) _mm512_mask_storeu_ps(c + 16, m1, _mm512_fmadd_ps(al, acc[ii][1], _mm512_maskz_loadu_ps(m1, c + 16)));
    }
  }
}

// The blocking both AVX-512 GEMMs share (GotoBLAS order): C's columns in nc blocks, the depth in kc
// slices, C's rows in mc blocks; B's kc x nc block packed as panels of nr columns, A's mc x kc
// block as strips of mr rows, and each B panel meets every A strip of the block in turn. A slice
// of kc elements of depth packs into depth(kc) = ceil(kc / k_per_depth) steps (bf16: pairs), a
// B panel into depth * nr * b_per_depth elements, an A strip into depth * mr. Each element of C
// sums its K products in one fixed order (slices in turn, each in registers and then added to C),
// whatever the thread split. beta == 0: the first slice stores its products (C is not read, NaNs
// in it do not survive). The packing buffers are each thread's, sized to the call and kept between
// calls (cpu::thread_scratch): a std::vector of 2 MiB per call and thread was zero-filled and
// page-faulted again every time (stop 25, ~18% of chunk_loss's bf16 CPU time at [128, 128] x
// 8000, whose GEMMs need a few KiB of it).
struct Blocking {
  int64_t mr, nr, kc, mc, nc, k_per_depth, b_per_depth;
};

// pack_b(k0, kc, j0, c1, BElem* dst), pack_a(k0, kc, i0, r1, AElem* dst),
// micro(const AElem* ap, const BElem* bp, depth, float* C, mr, nj, overwrite).
template <class Tag, class AElem, class BElem, class PackB, class PackA, class Micro>
void blocked_gemm(const Blocking& bk, int64_t M, int64_t N, int64_t K, float beta, float* C, int64_t ldc,
                  PackB&& pack_b, PackA&& pack_a, Micro&& micro) {
  if (beta != 0.0f || K <= 0) scale_c(M, N, beta, C, ldc);
  if (K <= 0) return;
  const bool overwrite_first = beta == 0.0f;
  auto depth_of = [&](int64_t kc) { return (kc + bk.k_per_depth - 1) / bk.k_per_depth; };
  const bool by_cols = split_by_cols(M, N, bk.nr, bk.mc);
  // Threads split C's columns (nr panels) or its rows (mc blocks), see split_by_cols; small
  // products (under ~2 MFLOP per unit) stay together.
  const int64_t units = by_cols ? (N + bk.nr - 1) / bk.nr : (M + bk.mc - 1) / bk.mc;
  const int64_t flops_per_unit = 2 * K * (by_cols ? M * bk.nr : bk.mc * N);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 21) / std::max<int64_t>(1, flops_per_unit));
  parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    const int64_t c0 = by_cols ? u0 * bk.nr : 0, c1 = by_cols ? std::min(N, u1 * bk.nr) : N;
    const int64_t r0 = by_cols ? 0 : u0 * bk.mc, r1 = by_cols ? M : std::min(M, u1 * bk.mc);
    const int64_t depth_max = depth_of(std::min(bk.kc, K));
    const int64_t np_max = (std::min(bk.nc, c1 - c0) + bk.nr - 1) / bk.nr;
    const int64_t ns_max = (std::min(bk.mc, r1 - r0) + bk.mr - 1) / bk.mr;
    BElem* const bp = thread_scratch<Tag, BElem>().get(0, np_max * depth_max * bk.nr * bk.b_per_depth);
    AElem* const ap = thread_scratch<Tag, AElem>().get(1, ns_max * depth_max * bk.mr);
    for (int64_t jc = c0; jc < c1; jc += bk.nc) {
      const int64_t np = (std::min(bk.nc, c1 - jc) + bk.nr - 1) / bk.nr;
      for (int64_t k0 = 0; k0 < K; k0 += bk.kc) {
        const int64_t kc = std::min(bk.kc, K - k0), depth = depth_of(kc);
        const int64_t b_panel = depth * bk.nr * bk.b_per_depth, a_strip = depth * bk.mr;
        for (int64_t p = 0; p < np; ++p) pack_b(k0, kc, jc + p * bk.nr, c1, bp + p * b_panel);
        for (int64_t ic = r0; ic < r1; ic += bk.mc) {
          const int64_t ns = (std::min(bk.mc, r1 - ic) + bk.mr - 1) / bk.mr;
          for (int64_t st = 0; st < ns; ++st) pack_a(k0, kc, ic + st * bk.mr, r1, ap + st * a_strip);
          for (int64_t p = 0; p < np; ++p) {
            const int64_t j0 = jc + p * bk.nr, nj = std::min<int64_t>(bk.nr, c1 - j0);
            for (int64_t st = 0; st < ns; ++st) {
              const int64_t i0 = ic + st * bk.mr;
              micro(ap + st * a_strip, bp + p * b_panel, depth, C + i0 * ldc + j0, std::min<int64_t>(bk.mr, r1 - i0),
                    nj, overwrite_first && k0 == 0);
            }
          }
        }
      }
    }
  });
}

// Columns j0 .. j0 + 32 of B's rows k0 .. k0 + kc into dst[k][32] (columns past N are zeros).
void pack_b_panel_f32(bool tb, const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t N,
                      float* dst) {
  const int64_t nj = std::min<int64_t>(kFNR, N - j0);
  if (tb) {  // B^T stored [N][K]: 8 x 8 blocks transposed in registers, then the rest
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8)
      for (int64_t jj = 0; jj < kFNR; jj += 8) {
        __m256 r[8];
        for (int t = 0; t < 8; ++t)
          r[t] = jj + t < nj ? _mm256_loadu_ps(B + (j0 + jj + t) * ldb + k0 + k) : _mm256_setzero_ps();
        transpose8x8(r);
        for (int t = 0; t < 8; ++t) _mm256_storeu_ps(dst + (k + t) * kFNR + jj, r[t]);
      }
    for (int64_t jj = 0; jj < kFNR; ++jj)
      for (int64_t kk = k; kk < kc; ++kk) dst[kk * kFNR + jj] = jj < nj ? B[(j0 + jj) * ldb + k0 + kk] : 0.0f;
    return;
  }
  __mmask16 m0, m1;
  tile_masks(nj, m0, m1);
  for (int64_t k = 0; k < kc; ++k) {
    const float* row = B + (k0 + k) * ldb + j0;
    _mm512_storeu_ps(dst + k * kFNR, _mm512_maskz_loadu_ps(m0, row));
    _mm512_storeu_ps(dst + k * kFNR + 16, _mm512_maskz_loadu_ps(m1, row + 16));
  }
}

// A's rows i0 .. i0 + 8 (past M: zeros), depth k0 .. k0 + kc, into dst[k][8].
void pack_a_strip_f32(bool ta, const float* A, int64_t lda, int64_t k0, int64_t kc, int64_t i0, int64_t M,
                      float* dst) {
  const int64_t mi = std::min<int64_t>(kFMR, M - i0);
  if (ta) {  // A^T stored [K][M]: a strip's k is 8 consecutive floats
    const __mmask8 m = mi >= 8 ? __mmask8(0xff) : __mmask8((1u << mi) - 1u);
    for (int64_t k = 0; k < kc; ++k)
      _mm256_storeu_ps(dst + k * kFMR, _mm256_maskz_loadu_ps(m, A + (k0 + k) * lda + i0));
    return;
  }
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {  // 8 x 8 blocks transposed in registers
    __m256 r[8];
    for (int t = 0; t < 8; ++t) r[t] = t < mi ? _mm256_loadu_ps(A + (i0 + t) * lda + k0 + k) : _mm256_setzero_ps();
    transpose8x8(r);
    for (int t = 0; t < 8; ++t) _mm256_storeu_ps(dst + (k + t) * kFMR, r[t]);
  }
  for (int64_t ii = 0; ii < kFMR; ++ii) {
    if (ii < mi) {
      const float* row = A + (i0 + ii) * lda + k0;
      for (int64_t kk = k; kk < kc; ++kk) dst[kk * kFMR + ii] = row[kk];
    } else {
      for (int64_t kk = k; kk < kc; ++kk) dst[kk * kFMR + ii] = 0.0f;
    }
  }
}

// C[8 x 32] (rows mr, columns nj) += alpha * strip . panel over kc, or = with `overwrite`.
inline void micro_kernel_f32(const float* ap, const float* bp, int64_t kc, float alpha, float* C, int64_t ldc,
                             int64_t mr, int64_t nj, bool overwrite) {
  __m512 acc[kFMR][2];
#pragma GCC unroll 8
  for (int ii = 0; ii < kFMR; ++ii) acc[ii][0] = acc[ii][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_loadu_ps(bp + k * kFNR);
    const __m512 b1 = _mm512_loadu_ps(bp + k * kFNR + 16);
#pragma GCC unroll 8
    for (int ii = 0; ii < kFMR; ++ii) {
      const __m512 a = _mm512_set1_ps(ap[k * kFMR + ii]);
      acc[ii][0] = _mm512_fmadd_ps(a, b0, acc[ii][0]);
      acc[ii][1] = _mm512_fmadd_ps(a, b1, acc[ii][1]);
    }
  }
  store_tile(acc, alpha, C, ldc, mr, nj, overwrite);
}

struct SgemmPacks {};

}  // namespace
#endif

void sgemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef FUSEDOPS_F32_GEMM
  const Blocking bk{kFMR, kFNR, kFKC, kFMC, kFNC, 1, 1};
  blocked_gemm<SgemmPacks, float, float>(
      bk, M, N, K, beta, C, ldc,
      [&](int64_t k0, int64_t kc, int64_t j0, int64_t c1, float* dst) {
        pack_b_panel_f32(tb, B, ldb, k0, kc, j0, c1, dst);
      },
      [&](int64_t k0, int64_t kc, int64_t i0, int64_t r1, float* dst) {
        pack_a_strip_f32(ta, A, lda, k0, kc, i0, r1, dst);
      },
      [&](const float* ap, const float* bp, int64_t depth, float* c, int64_t mr, int64_t nj, bool overwrite) {
        micro_kernel_f32(ap, bp, depth, alpha, c, ldc, mr, nj, overwrite);
      });
#else
  sgemm_builtin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    scale_c(M, N, beta, C, ldc);
    return;
  }
#if defined(FUSEDOPS_F32_GEMM)
  // Our AVX-512 kernel: 1.3-1.9x Debian's OpenBLAS 0.3.21 (whose kernels for this CPU stop at
  // AVX2) at the chunk_loss and matmul_add shapes on the 2-core Zen 5 VM (stop 34).
  sgemm_avx512(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#elif defined(FUSEDOPS_WITH_BLAS)
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
  // BLAS scales C by beta even when it is 0, so NaNs already in C would survive as NaN*0.
  if (beta == 0.0f) scale_c(M, N, 0.0f, C, ldc);
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

// ---------------------------------------------------------------------------------------------
// bf16 GEMM (blocking and micro-kernel below, at bgemm_avx512).

bool have_bf16_gemm() {
#ifdef FUSEDOPS_BF16_GEMM
  return true;
#else
  return false;
#endif
}

namespace {

#ifdef FUSEDOPS_BF16_GEMM
// blocked_gemm's sizes and layouts for bf16: B panels [k pair][NR][2] (a KC x NC block is 2 MiB at
// most, L3; a panel 32 KiB, L1), A strips [k pair][MR] 32-bit pairs (an MC x KC block 128 KiB, L2).
constexpr int64_t kMR = 8, kNR = 32, kKC = 512, kMC = 128, kNC = 2048;

// B's k pairs (k0 + 2q, k0 + 2q + 1), q < kp, of columns j0 .. j0 + 32 into dst[q][32][2]
// (columns past N and a missing odd row are zeros).
void pack_b_panel(bool tb, const uint16_t* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0, int64_t N,
                  uint16_t* dst) {
  const int64_t kp = (kc + 1) / 2, nj = std::min<int64_t>(kNR, N - j0);
  if (tb) {  // B^T stored [N][K]: a pair is one 32-bit word of a row of B
    uint32_t* d = reinterpret_cast<uint32_t*>(dst);
    int64_t q0 = 0;
    for (; 2 * (q0 + 8) <= kc; q0 += 8)  // 8 rows x 8 whole pairs at a time: 32-bit 8 x 8 transposes
      for (int64_t jj = 0; jj < kNR; jj += 8) {
        __m256 r[8];
        for (int t = 0; t < 8; ++t)
          r[t] = jj + t < nj ? _mm256_castsi256_ps(_mm256_loadu_si256(
                                   reinterpret_cast<const __m256i*>(B + (j0 + jj + t) * ldb + k0 + 2 * q0)))
                             : _mm256_setzero_ps();
        transpose8x8(r);
        for (int t = 0; t < 8; ++t) _mm256_storeu_ps(reinterpret_cast<float*>(d + (q0 + t) * kNR + jj), r[t]);
      }
    for (int64_t jj = 0; jj < kNR; ++jj) {
      const uint16_t* row = jj < nj ? B + (j0 + jj) * ldb + k0 : B;
      for (int64_t q = q0; q < kp; ++q) {
        uint32_t w = 0;
        if (jj < nj) {
          if (2 * q + 1 < kc) {
            std::memcpy(&w, row + 2 * q, 4);
          } else {
            w = row[2 * q];
          }
        }
        d[q * kNR + jj] = w;
      }
    }
    return;
  }
  // B stored [K][N]: rows k and k+1 interleaved 16 bits at a time.
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi_idx = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23,
                                          54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
  const __mmask32 m = nj >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << nj) - 1u);
  for (int64_t q = 0; q < kp; ++q) {
    const int64_t k = k0 + 2 * q;
    const __m512i r0 = _mm512_maskz_loadu_epi16(m, B + k * ldb + j0);
    const __m512i r1 = 2 * q + 1 < kc ? _mm512_maskz_loadu_epi16(m, B + (k + 1) * ldb + j0) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + q * kNR * 2, _mm512_permutex2var_epi16(r0, lo_idx, r1));
    _mm512_storeu_si512(dst + q * kNR * 2 + 32, _mm512_permutex2var_epi16(r0, hi_idx, r1));
  }
}

// A's rows i0 .. i0 + 8 (past M: zeros), k pairs q < kp, into dst[q][8] as 32-bit pairs.
void pack_a_strip(bool ta, const uint16_t* A, int64_t lda, int64_t k0, int64_t kc, int64_t i0, int64_t M,
                  uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2, mi = std::min<int64_t>(kMR, M - i0);
  int64_t q0 = 0;
  if (ta && mi == kMR) {  // A^T stored [K][M]: rows k and k+1 interleaved 16 bits at a time
    for (; 2 * q0 + 1 < kc; ++q0) {
      const int64_t k = k0 + 2 * q0;
      const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(A + k * lda + i0));
      const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(A + (k + 1) * lda + i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + q0 * kMR), _mm_unpacklo_epi16(r0, r1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + q0 * kMR + 4), _mm_unpackhi_epi16(r0, r1));
    }
  } else if (!ta && mi == kMR) {  // A stored [M][K]: 8 rows x 8 whole pairs, a 32-bit 8 x 8 transpose
    for (; 2 * (q0 + 8) <= kc; q0 += 8) {
      __m256 r[8];
      for (int t = 0; t < 8; ++t)
        r[t] = _mm256_castsi256_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(A + (i0 + t) * lda + k0 + 2 * q0)));
      transpose8x8(r);
      for (int t = 0; t < 8; ++t) _mm256_storeu_ps(reinterpret_cast<float*>(dst + (q0 + t) * kMR), r[t]);
    }
  }
  for (int64_t q = q0; q < kp; ++q) {
    const int64_t k = k0 + 2 * q;
    const bool pair = 2 * q + 1 < kc;
    for (int64_t ii = 0; ii < kMR; ++ii) {
      uint32_t w = 0;
      if (ii < mi) {
        if (!ta) {
          const uint16_t* p = A + (i0 + ii) * lda + k;
          if (pair) {
            std::memcpy(&w, p, 4);
          } else {
            w = p[0];
          }
        } else {
          w = A[k * lda + i0 + ii] | (pair ? static_cast<uint32_t>(A[(k + 1) * lda + i0 + ii]) << 16 : 0u);
        }
      }
      dst[q * kMR + ii] = w;
    }
  }
}

// C[8 x 32] (rows mr, columns nj) += alpha * strip . panel over kp pairs, or = with `overwrite`.
inline void micro_kernel(const uint32_t* ap, const uint16_t* bp, int64_t kp, float alpha, float* C, int64_t ldc,
                         int64_t mr, int64_t nj, bool overwrite) {
  __m512 acc[kMR][2];
#pragma GCC unroll 8
  for (int ii = 0; ii < kMR; ++ii) acc[ii][0] = acc[ii][1] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kp; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * kNR * 2);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + q * kNR * 2 + 32);
#pragma GCC unroll 8
    for (int ii = 0; ii < kMR; ++ii) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[q * kMR + ii]));
      acc[ii][0] = _mm512_dpbf16_ps(acc[ii][0], a, b0);
      acc[ii][1] = _mm512_dpbf16_ps(acc[ii][1], a, b1);
    }
  }
  store_tile(acc, alpha, C, ldc, mr, nj, overwrite);
}

struct BgemmPacks {};

void bgemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
                  const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  // Depth in k pairs; a B panel holds 2 bf16 per pair and column, an A strip one 32-bit pair.
  const Blocking bk{kMR, kNR, kKC, kMC, kNC, 2, 2};
  blocked_gemm<BgemmPacks, uint32_t, uint16_t>(
      bk, M, N, K, beta, C, ldc,
      [&](int64_t k0, int64_t kc, int64_t j0, int64_t c1, uint16_t* dst) {
        pack_b_panel(tb, B, ldb, k0, kc, j0, c1, dst);
      },
      [&](int64_t k0, int64_t kc, int64_t i0, int64_t r1, uint32_t* dst) {
        pack_a_strip(ta, A, lda, k0, kc, i0, r1, dst);
      },
      [&](const uint32_t* ap, const uint16_t* bp, int64_t kp, float* c, int64_t mr, int64_t nj, bool overwrite) {
        micro_kernel(ap, bp, kp, alpha, c, ldc, mr, nj, overwrite);
      });
}
#endif

// Without the instructions: the operands rounded to bf16 and widened to fp32, then sgemm.
[[maybe_unused]] void bgemm_via_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                      const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta,
                                      float* C, int64_t ldc) {
  auto widen = [](bf16_t v) { return to_float(v); };
  const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  std::unique_ptr<float[]> a(new float[static_cast<size_t>(std::max<int64_t>(1, ar * ac))]);
  std::unique_ptr<float[]> b(new float[static_cast<size_t>(std::max<int64_t>(1, br * bc))]);
  for (int64_t r = 0; r < ar; ++r)
    for (int64_t c = 0; c < ac; ++c) a[r * ac + c] = widen(A[r * lda + c]);
  for (int64_t r = 0; r < br; ++r)
    for (int64_t c = 0; c < bc; ++c) b[r * bc + c] = widen(B[r * ldb + c]);
  sgemm(ta, tb, M, N, K, alpha, a.get(), ac, b.get(), bc, beta, C, ldc);
}

}  // namespace

void bgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
           int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
#ifdef FUSEDOPS_BF16_GEMM
  bgemm_avx512(trans_a, trans_b, M, N, K, alpha, reinterpret_cast<const uint16_t*>(A), lda,
               reinterpret_cast<const uint16_t*>(B), ldb, beta, C, ldc);
#else
  bgemm_via_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

}  // namespace fusedops::cpu
