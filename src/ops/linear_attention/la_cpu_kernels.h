// CPU building blocks of the gated delta rule backend: a register-blocked fp32 GEMM for the small
// chunk products (64 x 128 x 128 and the like, single-threaded, called from inside the per-task
// threads), a vectorised exp, and row loads/stores of token-major tensors.
//
// The GEMM is written with GCC/Clang vector extensions: 16-float (zmm) accumulators where the
// build targets AVX-512, 8-float ones (AVX/FMA with -march=native, SSE or scalar code elsewhere)
// otherwise. Each element of C is one dot product over k in order either way, so the results are
// the same bits on every path and do not depend on threads. On the 2-core Xeon (AVX-512, two
// 512-bit FMA ports) the zmm kernels take about 60% of the time of the ymm ones over six
// typical GDN products (bench/gemm/la_gemm_study.sh; the run:
// bench/results/cpu/studies/la_gemm-2026-12-05.txt).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "src/cpu/parallel.h"
#include "src/cpu/scratch.h"
#include "src/cpu/simd.h"
#include "src/ops/linear_attention/la_common.h"

namespace fusedops::la::cpu {

using fusedops::cpu::load8;
using fusedops::cpu::splat;
using fusedops::cpu::store8;
using fusedops::cpu::v8f;
using fusedops::cpu::v8i;
using fusedops::cpu::v16f;

// Which part of A may be non-zero: the GEMM skips the zero part (it must hold zeros: the skipped
// ranges are decided per block of rows, so a block may still read some zeros).
enum class Tri { kNone, kLower, kUpper };  // kLower: A(i,k) = 0 for k > i; kUpper: for k < i

constexpr int kNR = 16;  // columns per panel (one AVX-512 vector, two AVX ones)
#ifdef __AVX512F__
// Eight rows: eight zmm accumulators, one per row, cover the FMA latency of two 512-bit FMA
// ports (4 cycles x 2); the A block is then one 8x8 transpose wide.
constexpr int kMR = 8;
#else
constexpr int kMR = 6;  // twelve ymm accumulators (two per row) of the sixteen AVX registers
#endif

#ifdef __AVX512F__
// P (1 or 2) adjacent 16-column panels, panel p at B + p * pstride ([kn][ldb] each), for MR rows:
// one zmm accumulator per row and panel; with two panels each broadcast of A feeds two FMAs.
// Every element of C is the same dot product over k in order whatever P is.
template <int MR, int P>
inline void micro_zmm(int64_t kn, const float* __restrict Ap, int64_t ak, const float* __restrict B,
                      int64_t pstride, int64_t ldb, float alpha, const float* Cb, int64_t ldcb,
                      float* C, int64_t ldc) {
  v16f c[P][MR];
#pragma GCC unroll 2
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) c[p][r] = v16f{};
  const float* __restrict Bp[P];
#pragma GCC unroll 2
  for (int p = 0; p < P; ++p) Bp[p] = B + p * pstride;
  for (int64_t k = 0; k < kn; ++k) {
    v16f b[P];
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) std::memcpy(&b[p], Bp[p] + k * ldb, sizeof(v16f));
    const float* a = Ap + k * ak;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int p = 0; p < P; ++p) c[p][r] += a[r] * b[p];
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      v16f out = alpha * c[p][r];
      if (Cb) {
        v16f cb;
        std::memcpy(&cb, Cb + r * ldcb + 16 * p, sizeof(cb));
        out = cb + out;
      }
      std::memcpy(C + r * ldc + 16 * p, &out, sizeof(out));
    }
}
#endif

// C[r, 0:16] (=|+=) alpha * sum_k Ap[k*ak + r] B[k, 0:16] for MR rows: A's rows are consecutive
// floats (a packed [kn][MR] block, or a transposed operand read in place), so one pointer walks
// A and the row offsets stay out of the register file.
template <int MR>
inline void micro_16(int64_t kn, const float* __restrict Ap, int64_t ak, const float* __restrict B,
                     int64_t ldb, float alpha, const float* Cb, int64_t ldcb, float* C, int64_t ldc) {
  // The row loops are unrolled whatever the optimisation level (at -O2 GCC leaves them rolled
  // and keeps the accumulators in memory, ~2.5x slower).
#ifdef __AVX512F__
  micro_zmm<MR, 1>(kn, Ap, ak, B, 0, ldb, alpha, Cb, ldcb, C, ldc);
#else
  v8f c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = splat(0.0f);
  for (int64_t k = 0; k < kn; ++k) {
    const v8f b0 = load8(B + k * ldb), b1 = load8(B + k * ldb + 8);
    const float* a = Ap + k * ak;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const v8f av = splat(a[r]);
      c0[r] += av * b0;
      c1[r] += av * b1;
    }
  }
  const v8f al = splat(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* c = C + r * ldc;
    if (Cb) {
      const float* cb = Cb + r * ldcb;
      store8(c, load8(cb) + al * c0[r]);
      store8(c + 8, load8(cb + 8) + al * c1[r]);
    } else {
      store8(c, al * c0[r]);
      store8(c + 8, al * c1[r]);
    }
  }
#endif
}

// The same for a panel narrower than 16 columns (nw < 16), scalar over the columns.
inline void micro_tail(int mr, int nw, int64_t kn, const float* Ap, int64_t pstride, const float* B,
                       int64_t ldb, float alpha, const float* Cb, int64_t ldcb, float* C,
                       int64_t ldc) {
  float acc[kMR][kNR] = {};
  for (int64_t k = 0; k < kn; ++k) {
    const float* b = B + k * ldb;
    for (int r = 0; r < mr; ++r) {
      const float a = Ap[k * pstride + r];
      for (int j = 0; j < nw; ++j) acc[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < mr; ++r)
    for (int j = 0; j < nw; ++j)
      C[r * ldc + j] = Cb ? Cb[r * ldcb + j] + alpha * acc[r][j] : alpha * acc[r][j];
}

#ifdef __AVX__
// out[j][r] = row r's element j (r, j < 8): the 8x8 block of eight rows, transposed with AVX
// shuffles.
inline void transpose8_regs(const float* const* row, __m256 out[8]) {
  const __m256 r0 = _mm256_loadu_ps(row[0]), r1 = _mm256_loadu_ps(row[1]);
  const __m256 r2 = _mm256_loadu_ps(row[2]), r3 = _mm256_loadu_ps(row[3]);
  const __m256 r4 = _mm256_loadu_ps(row[4]), r5 = _mm256_loadu_ps(row[5]);
  const __m256 r6 = _mm256_loadu_ps(row[6]), r7 = _mm256_loadu_ps(row[7]);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  out[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  out[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  out[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  out[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// dst[0..7][0..7] = src[0..7][0..7]^T.
inline void transpose8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  const float* row[8];
  for (int r = 0; r < 8; ++r) row[r] = src + r * lds;
  __m256 t[8];
  transpose8_regs(row, t);
  for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + j * ldd, t[j]);
}
#endif

// The calling thread's buffer for the packed B operand, kept across calls: no allocation per call.
struct GemmPackScratch {};
inline float* gemm_pack_buf(int64_t n) {
  return fusedops::cpu::thread_scratch<GemmPackScratch, float>().get(0, n);
}

// C[M,N] (=|+=) alpha * A[M,K] B[K,N]. A(i,k) = A[i*ars + k*acs] (any strides: pass ars=1,
// acs=lda for a transposed operand); B row-major with leading dimension ldb; C row-major (ldc).
// With accumulate=false C is overwritten (its old contents, NaN included, are never read).
// tri skips the zero part of A; c_lower computes only the blocks of C that touch the lower
// triangle (j <= i), leaving the rest of C unspecified. With cin, C = Cin + alpha * A B (Cin
// [M,N] with leading dimension ldcin; it may be C itself).
// B's full 16-column panels are packed once as [panel][K][16] (contiguous: rows of B at
// power-of-two strides would share a few L1 sets and evict each other between the row blocks).
// With b_trans, B is given transposed: B(k, j) = B[j*ldb + k] (packed straight from it, no
// separate transpose). Every element of C is one micro-kernel dot product over k in order, so
// the result does not depend on the blocking.
inline void gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t ars,
                 int64_t acs, const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc,
                 Tri tri = Tri::kNone, bool c_lower = false, const float* cin = nullptr,
                 int64_t ldcin = 0, bool b_trans = false) {
  if (M <= 0 || N <= 0) return;
  alignas(32) float pack[kMR * 256 + 8];
  std::vector<float> big;
  const int64_t npan = (N + kNR - 1) / kNR, nfull = N / kNR;
  // Panel stride: one spare row, so that the panels do not all start in the same cache set.
  const int64_t ps = (K + 1) * kNR;
  float* bpack = gemm_pack_buf(ps * npan);
  if (!b_trans) {
    for (int64_t k = 0; k < K; ++k) {
      const float* row = B + k * ldb;
      for (int64_t p = 0; p < nfull; ++p) {
        store8(bpack + p * ps + k * kNR, load8(row + p * kNR));
        store8(bpack + p * ps + k * kNR + 8, load8(row + p * kNR + 8));
      }
      for (int64_t j = nfull * kNR; j < N; ++j)
        bpack[nfull * ps + k * kNR + (j - nfull * kNR)] = row[j];
    }
  } else {
    // Panel p holds rows p*16 .. p*16+15 of the given B^T, transposed to [K][16].
    for (int64_t p = 0; p < npan; ++p) {
      const int64_t j0 = p * kNR, nw = std::min<int64_t>(kNR, N - j0);
      float* dst = bpack + p * ps;
      int64_t k8 = 0, j8 = 0;
#ifdef __AVX__
      k8 = K / 8 * 8;
      j8 = nw / 8 * 8;
      for (int64_t jj = 0; jj < j8; jj += 8)
        for (int64_t k = 0; k < k8; k += 8)
          transpose8x8(B + (j0 + jj) * ldb + k, ldb, dst + k * kNR + jj, kNR);
#endif
      for (int64_t jj = 0; jj < nw; ++jj)
        for (int64_t k = jj < j8 ? k8 : 0; k < K; ++k) dst[k * kNR + jj] = B[(j0 + jj) * ldb + k];
    }
  }
  for (int64_t i0 = 0; i0 < M; i0 += kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMR, M - i0));
    int64_t k0 = 0, k1 = K;
    if (tri == Tri::kLower) k1 = std::min<int64_t>(K, i0 + mr);
    if (tri == Tri::kUpper) k0 = std::min<int64_t>(K, i0);
    const int64_t kn = std::max<int64_t>(0, k1 - k0);
    // A[i0:i0+mr, k0:k1] packed as [kn][mr], one contiguous stream for the broadcasts (a
    // transposed operand too: read in place, its rows would collide in L1 like B's).
    float* ap = pack;
    if (kn > 256) {
      big.resize(kMR * kn + 8);
      ap = big.data();
    }
    const int64_t ak = mr;
    const float* a = A + i0 * ars + k0 * acs;
    if (ars == 1 && mr == kMR) {
      for (int64_t k = 0; k < kn; ++k)
        for (int r = 0; r < kMR; ++r) ap[k * kMR + r] = a[r + k * acs];
#ifdef __AVX__
    } else if (acs == 1 && mr == kMR) {
      // Row-major A: 8x8 transposes of its six rows (the last one repeated to fill eight). Each
      // column's 8-float store spills two floats into the next column, which overwrites them
      // (the buffer has two floats of slack after the last).
      const float* row[8];
      for (int r = 0; r < 8; ++r) row[r] = a + std::min(r, kMR - 1) * ars;
      int64_t k = 0;
      for (; k + 8 <= kn; k += 8) {
        __m256 t[8];
        transpose8_regs(row, t);
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(ap + (k + j) * kMR, t[j]);
        for (int r = 0; r < 8; ++r) row[r] += 8;
      }
      for (; k < kn; ++k)
        for (int r = 0; r < kMR; ++r) ap[k * kMR + r] = a[r * ars + k];
#endif
    } else {
      for (int64_t k = 0; k < kn; ++k)
        for (int r = 0; r < mr; ++r) ap[k * mr + r] = a[r * ars + k * acs];
    }
    const int64_t jend = c_lower ? std::min<int64_t>(N, i0 + mr) : N;
    for (int64_t j0 = 0; j0 < jend; j0 += kNR) {
      const int nw = static_cast<int>(std::min<int64_t>(kNR, N - j0));
#ifdef __AVX512F__
      if (mr == kMR && j0 + 2 * kNR <= N && j0 + kNR < jend) {
        const float* b = bpack + (j0 / kNR) * ps + k0 * kNR;
        float* c = C + i0 * ldc + j0;
        const float* cb = cin ? cin + i0 * ldcin + j0 : (accumulate ? c : nullptr);
        micro_zmm<kMR, 2>(kn, ap, ak, b, ps, kNR, alpha, cb, cin ? ldcin : ldc, c, ldc);
        j0 += kNR;
        continue;
      }
#endif
      float* c = C + i0 * ldc + j0;
      const float* cb = cin ? cin + i0 * ldcin + j0 : (accumulate ? c : nullptr);
      const int64_t ldcb = cin ? ldcin : ldc;
      if (nw == kNR) {
        const float* b = bpack + (j0 / kNR) * ps + k0 * kNR;
        switch (mr) {
#ifdef __AVX512F__
          case 8: micro_16<8>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
          case 7: micro_16<7>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
#endif
          case 6: micro_16<6>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
          case 5: micro_16<5>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
          case 4: micro_16<4>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
          case 3: micro_16<3>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
          case 2: micro_16<2>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
          default: micro_16<1>(kn, ap, ak, b, kNR, alpha, cb, ldcb, c, ldc); break;
        }
      } else {
        micro_tail(mr, nw, kn, ap, ak, bpack + (j0 / kNR) * ps + k0 * kNR, kNR, alpha, cb, ldcb,
                   c, ldc);
      }
    }
  }
}

// dst[c, r] = src[r, c] for an [rows, cols] block (ld = leading dimensions).
inline void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                      int64_t ldd) {
  int64_t r8 = 0, c8 = 0;
#ifdef __AVX__
  r8 = rows / 8 * 8;
  c8 = cols / 8 * 8;
  for (int64_t r = 0; r < r8; r += 8)
    for (int64_t c = 0; c < c8; c += 8) transpose8x8(src + r * lds + c, lds, dst + c * ldd + r, ldd);
#endif
  // The edges (everything without AVX).
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// y[i] = exp(x[i]) in fp32: the CPU kernels' one exp (src/cpu/simd.h).
using fusedops::cpu::exp_inplace;

// Address of element `col` of row (b, t, h).
inline char* col_ptr(const Tok& t, int64_t b, int64_t tok, int64_t h, int64_t col) {
  return t.ptr(b, tok, h) + static_cast<int64_t>(t.esize) * col;
}

// Rows [c.t0, c.t0 + c.len) of head h of a token-major tensor as fp32 rows: the tensor itself
// when it is fp32 (ld = its T stride), else converted into buf (ld = D).
struct Rows {
  const float* p;
  int64_t ld;
};
inline Rows view_rows(const Tok& t, const Chunk& c, int64_t h, float* buf) {
  if (t.dtype == DType::kFloat32)
    return {reinterpret_cast<const float*>(t.ptr(c.b, c.t0, h)), t.st};
  for (int64_t i = 0; i < c.len; ++i) load_floats(t.ptr(c.b, c.t0 + i, h), t.dtype, buf + i * t.D, t.D);
  return {buf, t.D};
}
// Copies rows into buf (ld = ldb) as fp32.
inline void load_rows(const Tok& t, const Chunk& c, int64_t h, float* buf, int64_t ldb) {
  for (int64_t i = 0; i < c.len; ++i) load_floats(t.ptr(c.b, c.t0 + i, h), t.dtype, buf + i * ldb, t.D);
}
inline void store_rows(const float* src, int64_t lds, const Tok& t, const Chunk& c, int64_t h) {
  for (int64_t i = 0; i < c.len; ++i) store_floats(src + i * lds, t.ptr(c.b, c.t0 + i, h), t.dtype, t.D);
}
// Output rows of a chunk: the tensor itself when it is fp32 (ld = its T stride), else buf (ld =
// D), written back by commit_rows.
struct OutRows {
  float* p;
  int64_t ld;
  bool direct;
};
inline OutRows out_rows(const Tok& t, const Chunk& c, int64_t h, float* buf) {
  if (t.dtype == DType::kFloat32) return {reinterpret_cast<float*>(t.ptr(c.b, c.t0, h)), t.st, true};
  return {buf, t.D, false};
}
inline void commit_rows(const OutRows& o, const Tok& t, const Chunk& c, int64_t h) {
  if (!o.direct) store_rows(o.p, o.ld, t, c, h);
}

// One value per token of a [B,T,H] tensor (gates, beta) into out[0..len).
inline void load_scalars(const Tok& t, const Chunk& c, int64_t h, float* out) {
  if (!t.defined()) {
    std::fill(out, out + c.len, 0.0f);
    return;
  }
  for (int64_t i = 0; i < c.len; ++i) load_floats(t.ptr(c.b, c.t0 + i, h), t.dtype, out + i, 1);
}
inline void store_scalars(const float* in, const Tok& t, const Chunk& c, int64_t h) {
  for (int64_t i = 0; i < c.len; ++i) store_floats(in + i, t.ptr(c.b, c.t0 + i, h), t.dtype, 1);
}

// A chunk's cumulative gates g_cumsum [B,T,H] (0 without a gate) in double. The kernels take
// their in-chunk differences g_i - g_j in double and round only those: with an fp32 g_cumsum
// each value carries an error of half an ulp of its magnitude (5e-4 at -1e4), which the
// differences between two late tokens of a chunk keep however small they are; a float64
// g_cumsum (the torch layer's on the CPU) keeps them exact for any gate (docs/precision.md).
inline void load_gates(const Tok& t, const Chunk& c, int64_t h, double* out) {
  if (!t.defined()) {
    std::fill(out, out + c.len, 0.0);
    return;
  }
  for (int64_t i = 0; i < c.len; ++i) load_doubles(t.ptr(c.b, c.t0 + i, h), t.dtype, out + i, 1);
}

// out[i] = exp(g_i - ref) in fp32 (ref = 0: the decay from the chunk's start).
inline void exp_from(const double* g, int64_t n, double ref, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(g[i] - ref);
  exp_inplace(out, n);
}

// gam[i,j] = exp(g_i - g_j) for j <= i (j < i when strict), 0 elsewhere; [n, n] with ld.
inline void decay_matrix(const double* g, int64_t n, bool strict, float* gam, int64_t ld) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = gam + i * ld;
    const int64_t m = strict ? i : i + 1;
    for (int64_t j = 0; j < m; ++j) row[j] = static_cast<float>(g[i] - g[j]);
    exp_inplace(row, m);
    std::fill(row + m, row + n, 0.0f);
  }
}

// Software prefetch (into L2) of a byte range, of the rows of a chunk and of a state matrix: the
// loops issue them for the next task's operands while computing the current one (token-major rows
// are kilobytes apart, so the hardware prefetchers, which stop at page boundaries, would leave
// most of their lines as demand misses).
inline void prefetch_bytes(const void* p, int64_t bytes, bool write = false) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) {
    if (write) __builtin_prefetch(c + off, 1, 2);
    else __builtin_prefetch(c + off, 0, 2);
  }
}
inline void prefetch_rows(const Tok& t, const Chunk& c, int64_t h, bool write = false) {
  if (!t.defined()) return;
  const int64_t bytes = static_cast<int64_t>(t.esize) * t.D;
  for (int64_t i = 0; i < c.len; ++i) prefetch_bytes(t.ptr(c.b, c.t0 + i, h), bytes, write);
}
inline void prefetch_state(const Mat& m, int64_t index, bool write = false) {
  if (m.defined())
    prefetch_bytes(m.ptr(index), static_cast<int64_t>(m.esize) * m.rows * m.cols, write);
}

// A scratch arena of fp32 buffers (buffer i keeps its largest size).
using Scratch = fusedops::cpu::Scratch<float>;

// The calling thread's arena for the chunk kernels (a few MiB at most: blocks of one chunk), kept
// across calls so that the buffers are not allocated, zeroed and faulted in again every call.
struct ChunkScratch {};
inline Scratch& thread_scratch() { return fusedops::cpu::thread_scratch<ChunkScratch, float>(); }

// The calling thread's float64 buffers for a chunk's gates (slot i holds n values and keeps its
// largest size), whatever the kernel's compute type: both families read the gate cumsum in double
// and round only its in-chunk differences, exact for any gate given a float64 g_cumsum (an fp32
// one carries half an ulp of |G|, 5e-4 at -1e4, into every difference). An arena of its own, so
// float64 kernels (KDA's reference) keep their own arena's indices.
struct GateScratch {};
inline double* gate_buffer(int64_t n, size_t slot = 0) {
  return fusedops::cpu::thread_scratch<GateScratch, double>().get(slot, n);
}

// The task loop of the chunk-parallel operators: one task per (chunk, head) pair, `heads` per
// chunk, handed to the OpenMP threads a few at a time (each task writes only its own outputs, so
// the results do not depend on the schedule). body(s, c, h) runs each task with the calling
// thread's arena s (thread_scratch<Tag, T>: a family's kernels keep their own). prefetch(c, h)
// runs for the thread's next task before the current one computes.
template <class T, class Tag, class Prefetch, class Body>
void for_each_chunk_task(const std::vector<Chunk>& chunks, int64_t heads, Prefetch&& prefetch,
                         Body&& body) {
  const int64_t tasks = static_cast<int64_t>(chunks.size()) * heads;
  fusedops::cpu::parallel_for_dynamic(0, tasks, 8, [&](int64_t b, int64_t e) {
    auto& s = fusedops::cpu::thread_scratch<Tag, T>();
    for (int64_t task = b; task < e; ++task) {
      if (task + 1 < e) prefetch(chunks[(task + 1) / heads], (task + 1) % heads);
      body(s, chunks[task / heads], task % heads);
    }
  });
}

// No prefetch (for_each_chunk_task's prefetch argument).
inline void no_prefetch(const Chunk&, int64_t) {}

// The GDN kernels' task loop: one task per (chunk, q/k head), with this header's arena; the next
// task's operands are prefetched by head(chunk, q/k head), then value_head(chunk, hv) for each of
// that head's G value heads.
template <class HeadFn, class ValueHeadFn, class Body>
void for_each_chunk_head(const std::vector<Chunk>& chunks, int64_t H, int64_t G, HeadFn&& head,
                         ValueHeadFn&& value_head, Body&& body) {
  for_each_chunk_task<float, ChunkScratch>(
      chunks, H,
      [&](const Chunk& c, int64_t h) {
        head(c, h);
        for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) value_head(c, hv);
      },
      body);
}

}  // namespace fusedops::la::cpu
