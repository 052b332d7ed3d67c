// KDA chunk kernels written once over the compute type T: T = double is the reference backend
// (float64 math, any storage dtype), T = float the CPU backend (fp32 math, the register-blocked
// GEMM and vectorised exp of la_cpu_kernels.h). Each kernel handles one (chunk, head) task at a
// time on blocks converted from the storage dtype; the shared task loop
// (la::cpu::for_each_chunk_task) hands the tasks to the OpenMP threads, and each task writes only
// its own outputs, so results do not depend on the schedule or the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fusedops/ops/kda.h"
#include "src/cpu/parallel.h"
#include "src/cpu/scratch.h"
#include "src/ops/linear_attention/la_common.h"
#include "src/ops/linear_attention/la_cpu.h"

namespace fusedops::kda {

using la::Chunk;
using la::Mat;
using la::Seq;
using la::Tok;
using la::cpu::Tri;

constexpr int64_t kBC = 16;  // sub-block rows of the intra-chunk factorisation

// ---------------------------------------------------------------------------------------------
// Scalar-type dispatch of the building blocks.

template <class T>
inline void load(const void* p, DType dt, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) la::load_floats(p, dt, out, n);
  else la::load_doubles(p, dt, out, n);
}
template <class T>
inline void store(const T* in, void* p, DType dt, int64_t n) {
  if constexpr (std::is_same_v<T, float>) la::store_floats(in, p, dt, n);
  else la::store_doubles(in, p, dt, n);
}
template <class T>
inline void vexp(T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float>) fusedops::cpu::exp_inplace(x, n);  // src/cpu/simd.h
  else
    for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
}

// C[M,N] (=|+=) alpha * A[M,K] B[K,N]; A(i,k) = A[i*ars + k*acs]; B, C row-major. tri says
// which part of A is zero (it must hold zeros there).
template <class T>
inline void mm(int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t ars, int64_t acs,
               const T* B, int64_t ldb, bool accumulate, T* C, int64_t ldc, Tri tri = Tri::kNone) {
  if constexpr (std::is_same_v<T, float>) {
    la::cpu::gemm(M, N, K, alpha, A, ars, acs, B, ldb, accumulate, C, ldc, tri);
  } else {
    std::vector<T> row(N);
    for (int64_t i = 0; i < M; ++i) {
      std::fill(row.begin(), row.end(), T(0));
      for (int64_t k = 0; k < K; ++k) {
        const T a = A[i * ars + k * acs];
        if (a == T(0)) continue;
        const T* b = B + k * ldb;
        for (int64_t j = 0; j < N; ++j) row[j] += a * b[j];
      }
      T* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) c[j] = accumulate ? c[j] + alpha * row[j] : alpha * row[j];
    }
  }
}

template <class T>
inline void transpose(const T* src, int64_t lds, int64_t rows, int64_t cols, T* dst, int64_t ldd) {
  if constexpr (std::is_same_v<T, float>) {
    la::cpu::transpose(src, lds, rows, cols, dst, ldd);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
  }
}

template <class T>
using Scratch = fusedops::cpu::Scratch<T>;
struct KdaScratch {};  // the kernels' own thread arenas (one per T)
// The chunk kernels' task loop (la::cpu::for_each_chunk_task) over (chunk, head) pairs, `heads`
// per chunk, with the calling thread's KDA arena: body(s, c, h).
template <class T, class Body>
void for_each_task(const std::vector<Chunk>& chunks, int64_t heads, Body&& body) {
  la::cpu::for_each_chunk_task<T, KdaScratch>(chunks, heads, la::cpu::no_prefetch, body);
}

using la::cpu::gate_buffer;  // a chunk's gate cumsum in double, whatever T

// ---------------------------------------------------------------------------------------------
// Chunk-level loads and stores.

using la::cpu::chunks_of;

template <class T>
inline void load_rows(const Tok& t, const Chunk& c, int64_t h, T* buf) {
  for (int64_t i = 0; i < c.len; ++i) load<T>(t.ptr(c.b, c.t0 + i, h), t.dtype, buf + i * t.D, t.D);
}
template <class T>
inline void store_rows(const T* src, const Tok& t, const Chunk& c, int64_t h) {
  for (int64_t i = 0; i < c.len; ++i) store<T>(src + i * t.D, t.ptr(c.b, c.t0 + i, h), t.dtype, t.D);
}
template <class T>
inline void load_scalars(const Tok& t, const Chunk& c, int64_t h, T* out, T dflt = T(0)) {
  if (!t.defined()) {
    std::fill(out, out + c.len, dflt);
    return;
  }
  for (int64_t i = 0; i < c.len; ++i) load<T>(t.ptr(c.b, c.t0 + i, h), t.dtype, out + i, 1);
}
template <class T>
inline void store_scalars(const T* in, const Tok& t, const Chunk& c, int64_t h) {
  for (int64_t i = 0; i < c.len; ++i) store<T>(in + i, t.ptr(c.b, c.t0 + i, h), t.dtype, 1);
}
// The [n,n] lower block (diagonal included unless strict) of a [B,T,H,BT] tensor, ld n.
template <class T>
inline void load_lower(const Tok& A, const Chunk& c, int64_t h, bool strict, T* out) {
  const int64_t n = c.len;
  std::vector<T> row(A.D);
  for (int64_t i = 0; i < n; ++i) {
    load<T>(A.ptr(c.b, c.t0 + i, h), A.dtype, row.data(), A.D);
    const int64_t m = strict ? i : i + 1;
    for (int64_t j = 0; j < n; ++j) out[i * n + j] = j < m ? row[j] : T(0);
  }
}
// Writes an [n,n] block (ld n) as BT-wide rows, zeros in columns >= n.
template <class T>
inline void store_square(const T* in, const Tok& A, const Chunk& c, int64_t h) {
  const int64_t n = c.len;
  std::vector<T> row(A.D, T(0));
  for (int64_t i = 0; i < n; ++i) {
    std::copy(in + i * n, in + i * n + n, row.begin());
    store<T>(row.data(), A.ptr(c.b, c.t0 + i, h), A.dtype, A.D);
  }
}
template <class T>
inline void load_mat(const Mat& m, int64_t index, T* out) {
  load<T>(m.ptr(index), m.dtype, out, m.rows * m.cols);
}

// A [K,V] snapshot as T: the tensor itself when its dtype is T's, else converted into buf.
template <class T>
inline const T* view_mat(const Mat& m, int64_t index, T* buf) {
  if ((std::is_same_v<T, float> && m.dtype == DType::kFloat32) ||
      (std::is_same_v<T, double> && m.dtype == DType::kFloat64))
    return reinterpret_cast<const T*>(m.ptr(index));
  load_mat(m, index, buf);
  return buf;
}

// sum_x a_x b_x (eight partial sums per lane for float).
template <class T>
inline T dot(const T* a, const T* b, int64_t n) {
  int64_t x = 0;
  T s = 0;
  if constexpr (std::is_same_v<T, float>) {
    using la::cpu::load8;
    la::cpu::v8f v = la::cpu::splat(0.0f);
    for (; x + 8 <= n; x += 8) v += load8(a + x) * load8(b + x);
    for (int l = 0; l < 8; ++l) s += v[l];
  }
  for (; x < n; ++x) s += a[x] * b[x];
  return s;
}

// X = (I + L)^{-1} for a strictly lower [n,n] L (ld n), by forward substitution; X ld n.
template <class T>
inline void unit_lower_inverse(const T* L, int64_t n, T* X) {
  for (int64_t i = 0; i < n; ++i) {
    T* xi = X + i * n;
    std::fill(xi, xi + n, T(0));
    xi[i] = T(1);
    for (int64_t m = 0; m < i; ++m) {
      const T l = L[i * n + m];
      if (l == T(0)) continue;
      const T* xm = X + m * n;
      for (int64_t j = 0; j <= m; ++j) xi[j] -= l * xm[j];
    }
  }
}

// The sub-block factors of rows [i0, i1) against reference row r = i0:
//   Ef[i - i0, c] = exp(G_ic - G_rc) (i >= r),   Eb[j, c] = exp(G_rc - G_jc) (j < r).
// G is the chunk's gate cumsum in double (load_gates): the differences are rounded, not G.
template <class T>
inline void block_factors(const double* G, int64_t K, int64_t i0, int64_t i1, T* Ef, T* Eb) {
  const double* gr = G + i0 * K;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t c = 0; c < K; ++c) Ef[(i - i0) * K + c] = static_cast<T>(G[i * K + c] - gr[c]);
  vexp(Ef, (i1 - i0) * K);
  for (int64_t j = 0; j < i0; ++j)
    for (int64_t c = 0; c < K; ++c) Eb[j * K + c] = static_cast<T>(gr[c] - G[j * K + c]);
  vexp(Eb, i0 * K);
}

// a1 = sum_c x1_c y_c e_c and a2 = sum_c x2_c y_c e_c (eight partial sums per lane for float).
template <class T>
inline void dot2(const T* x1, const T* x2, const T* y, const T* e, int64_t K, T& a1, T& a2) {
  int64_t c = 0;
  T s1 = 0, s2 = 0;
  if constexpr (std::is_same_v<T, float>) {
    using la::cpu::load8;
    la::cpu::v8f v1 = la::cpu::splat(0.0f), v2 = v1;
    for (; c + 8 <= K; c += 8) {
      const la::cpu::v8f w = load8(y + c) * load8(e + c);
      v1 += load8(x1 + c) * w;
      v2 += load8(x2 + c) * w;
    }
    for (int l = 0; l < 8; ++l) {
      s1 += v1[l];
      s2 += v2[l];
    }
  }
  for (; c < K; ++c) {
    const T w = y[c] * e[c];
    s1 += x1[c] * w;
    s2 += x2[c] * w;
  }
  a1 = s1;
  a2 = s2;
}

// One strictly lower pair (i, j) of a diagonal sub-block in the backward: with w = k_j . e,
//   dqi += dq_ij w;   rr += dl_ij w;   cc += (dq_ij q_i + bl k_i) . e.
template <class T>
inline void diag_update(int64_t K, T dqij, T dlij, T bl, const T* __restrict kj, const T* __restrict qi,
                        const T* __restrict ki, const T* __restrict e, T* __restrict dqi, T* __restrict rr,
                        T* __restrict cc) {
  int64_t x = 0;
  if constexpr (std::is_same_v<T, float>) {
    using la::cpu::load8;
    using la::cpu::splat;
    using la::cpu::store8;
    const la::cpu::v8f a = splat(dqij), l = splat(dlij), bb = splat(bl);
    for (; x + 8 <= K; x += 8) {
      const la::cpu::v8f ev = load8(e + x), w = load8(kj + x) * ev;
      store8(dqi + x, load8(dqi + x) + a * w);
      store8(rr + x, load8(rr + x) + l * w);
      store8(cc + x, load8(cc + x) + (a * load8(qi + x) + bb * load8(ki + x)) * ev);
    }
  }
  for (; x < K; ++x) {
    const T w = kj[x] * e[x];
    dqi[x] += dqij * w;
    rr[x] += dlij * w;
    cc[x] += (dqij * qi[x] + bl * ki[x]) * e[x];
  }
}

// P[i,j] = sum_c Q_ic K_jc E_ijc (j <= i) and M[i,j] = sum_c K_ic K_jc E_ijc (j < i), zeros
// elsewhere; [n,n] with ld n. Q, Kc, G: [n,K].
template <class T>
void intra_scores(int64_t n, int64_t K, const T* Q, const T* Kc, const double* G, T* P, T* M,
                  Scratch<T>& s, size_t sb) {
  std::fill(P, P + n * n, T(0));
  std::fill(M, M + n * n, T(0));
  T* Ef = s.get(sb, kBC * K);
  T* Eb = s.get(sb + 1, n * K);
  T* qf = s.get(sb + 2, kBC * K);
  T* kf = s.get(sb + 3, kBC * K);
  T* kbT = s.get(sb + 4, K * n);
  T* e = s.get(sb + 5, K);
  for (int64_t i0 = 0; i0 < n; i0 += kBC) {
    const int64_t i1 = std::min(n, i0 + kBC), mr = i1 - i0;
    if (i0 > 0) {
      block_factors(G, K, i0, i1, Ef, Eb);
      for (int64_t x = 0; x < mr * K; ++x) {
        qf[x] = Q[i0 * K + x] * Ef[x];
        kf[x] = Kc[i0 * K + x] * Ef[x];
      }
      for (int64_t x = 0; x < i0 * K; ++x) Eb[x] *= Kc[x];  // kb = K . Eb
      transpose(Eb, K, i0, K, kbT, i0);
      mm<T>(mr, i0, K, T(1), qf, K, 1, kbT, i0, false, P + i0 * n, n);
      mm<T>(mr, i0, K, T(1), kf, K, 1, kbT, i0, false, M + i0 * n, n);
    }
    // Diagonal sub-block: element-wise exponentials of the differences (i >= j).
    for (int64_t i = i0; i < i1; ++i) {
      const double* gi = G + i * K;
      for (int64_t j = i0; j <= i; ++j) {
        const double* gj = G + j * K;
        const T* kj = Kc + j * K;
        if (j == i) {
          T acc = 0;
          for (int64_t c = 0; c < K; ++c) acc += Q[i * K + c] * kj[c];
          P[i * n + j] = acc;
          continue;
        }
        for (int64_t c = 0; c < K; ++c) e[c] = static_cast<T>(gi[c] - gj[c]);
        vexp(e, K);
        dot2(Q + i * K, Kc + i * K, kj, e, K, P[i * n + j], M[i * n + j]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

template <class T>
void fwd_intra(const ChunkKdaFwdIntraArgs& a) {
  const Tok q(a.q), k(a.k), gk(a.gk), beta(a.beta), Aqk(a.Aqk), Akk(a.Akk);
  const int64_t H = q.H, HV = gk.H, G = HV / H, K = q.D;
  const T scale = static_cast<T>(a.scale);
  const auto chunks = chunks_of(a.q.size(0), a.q.size(1), a.cu_seqlens, a.chunk_size);
  for_each_task<T>(chunks, H, [&](Scratch<T>& s, const Chunk& c, int64_t h) {
    const int64_t n = c.len;
    T* Q = s.get(0, n * K);
    T* Kc = s.get(1, n * K);
    load_rows(q, c, h, Q);
    load_rows(k, c, h, Kc);
    double* Gm = gate_buffer(n * K);
    T* bt = s.get(3, n);
    T* P = s.get(4, n * n);
    T* M = s.get(5, n * n);
    T* X = s.get(6, n * n);
    for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
      load_rows(gk, c, hv, Gm);
      load_scalars(beta, c, hv, bt);
      intra_scores(n, K, Q, Kc, Gm, P, M, s, 10);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          P[i * n + j] *= scale;
          M[i * n + j] *= bt[i];
        }
      unit_lower_inverse(M, n, X);
      store_square(P, Aqk, c, hv);
      store_square(X, Akk, c, hv);
    }
  });
}

template <class T>
void recompute_wu(const KdaRecomputeWUFwdArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), beta(a.beta), Akk(a.Akk), gk(a.gk), w(a.w), u(a.u), kg(a.kg),
      qg(a.qg);
  const int64_t H = k.H, HV = v.H, G = HV / H, K = k.D, V = v.D, BT = Akk.D;
  const auto chunks = chunks_of(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for_each_task<T>(chunks, H, [&](Scratch<T>& s, const Chunk& c, int64_t h) {
    const int64_t n = c.len, last = n - 1;
    T* Kc = s.get(0, n * K);
    load_rows(k, c, h, Kc);
    T* Q = s.get(1, n * K);
    if (q.defined()) load_rows(q, c, h, Q);
    double* Gm = gate_buffer(n * K);
    T* eg = s.get(3, n * K);
    T* X = s.get(4, n * K);
    T* O = s.get(5, n * K);
    T* Am = s.get(6, n * n);
    T* bt = s.get(7, n);
    T* Vc = s.get(8, n * V);
    T* U = s.get(9, n * V);
    for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
      load_rows(gk, c, hv, Gm);
      load_scalars(beta, c, hv, bt);
      load_lower(Akk, c, hv, false, Am);
      for (int64_t x = 0; x < n * K; ++x) eg[x] = static_cast<T>(Gm[x]);
      vexp(eg, n * K);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) X[i * K + x] = Kc[i * K + x] * eg[i * K + x] * bt[i];
      mm<T>(n, K, n, T(1), Am, n, 1, X, K, false, O, K, Tri::kLower);
      store_rows(O, w, c, hv);
      load_rows(v, c, hv, Vc);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < V; ++x) Vc[i * V + x] *= bt[i];
      mm<T>(n, V, n, T(1), Am, n, 1, Vc, V, false, U, V, Tri::kLower);
      store_rows(U, u, c, hv);
      // kg = K exp(G_last - G); qg = Q exp(G).
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) X[i * K + x] = static_cast<T>(Gm[last * K + x] - Gm[i * K + x]);
      vexp(X, n * K);
      for (int64_t x = 0; x < n * K; ++x) X[x] *= Kc[x];
      store_rows(X, kg, c, hv);
      if (qg.defined()) {
        for (int64_t x = 0; x < n * K; ++x) X[x] = Q[x] * eg[x];
        store_rows(X, qg, c, hv);
      }
    }
  });
}

template <class T>
void fwd_o(const ChunkKdaFwdOArgs& a) {
  const Tok qg(a.qg), Aqk(a.Aqk), v(a.v), o(a.o);
  const Mat h(a.h);
  const int64_t HV = v.H, K = qg.D, V = v.D, BT = Aqk.D;
  const T scale = static_cast<T>(a.scale);
  const auto chunks = chunks_of(a.v.size(0), a.v.size(1), a.cu_seqlens, BT);
  for_each_task<T>(chunks, HV, [&](Scratch<T>& s, const Chunk& c, int64_t hv) {
    const int64_t n = c.len;
    T* Qg = s.get(0, n * K);
    T* S = s.get(1, K * V);
    T* P = s.get(2, n * n);
    T* Vn = s.get(3, n * V);
    T* O = s.get(4, n * V);
    load_rows(qg, c, hv, Qg);
    load_mat(h, c.index * HV + hv, S);
    load_lower(Aqk, c, hv, false, P);
    load_rows(v, c, hv, Vn);
    mm<T>(n, V, K, scale, Qg, K, 1, S, V, false, O, V);
    mm<T>(n, V, n, T(1), P, n, 1, Vn, V, true, O, V, Tri::kLower);
    store_rows(O, o, c, hv);
  });
}

template <class T>
void bwd_dAv(const ChunkKdaBwdDAvArgs& a) {
  const Tok Aqk(a.Aqk), v(a.v), dout(a.dout), dA(a.dAqk), dv(a.dv);
  const int64_t HV = v.H, V = v.D, BT = Aqk.D;
  const T scale = static_cast<T>(a.scale);
  const auto chunks = chunks_of(a.v.size(0), a.v.size(1), a.cu_seqlens, BT);
  for_each_task<T>(chunks, HV, [&](Scratch<T>& s, const Chunk& c, int64_t hv) {
    const int64_t n = c.len;
    T* P = s.get(0, n * n);
    T* Vn = s.get(1, n * V);
    T* dO = s.get(2, n * V);
    T* VT = s.get(3, V * n);
    T* D = s.get(4, n * n);
    T* dV = s.get(5, n * V);
    load_lower(Aqk, c, hv, false, P);
    load_rows(v, c, hv, Vn);
    load_rows(dout, c, hv, dO);
    transpose(Vn, V, n, V, VT, n);
    mm<T>(n, n, V, scale, dO, V, 1, VT, n, false, D, n);
    for (int64_t i = 0; i < n; ++i) std::fill(D + i * n + i + 1, D + (i + 1) * n, T(0));
    store_square(D, dA, c, hv);
    mm<T>(n, V, n, T(1), P, 1, n, dO, V, false, dV, V, Tri::kUpper);
    store_rows(dV, dv, c, hv);
  });
}

template <class T>
void bwd_wy_dqkg(const ChunkKdaBwdWyDqkgArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), vn(a.v_new), gk(a.gk), beta(a.beta), Akk(a.Akk), dout(a.dout),
      dvn(a.dvn), dq(a.dq), dk(a.dk), dv(a.dv), dbeta(a.dbeta), dg(a.dg), dAkk(a.dAkk);
  const Mat h(a.h), dh(a.dh);
  const int64_t H = q.H, HV = v.H, G = HV / H, K = q.D, V = v.D;
  const T scale = static_cast<T>(a.scale);
  const auto chunks = chunks_of(a.q.size(0), a.q.size(1), a.cu_seqlens, a.chunk_size);
  for_each_task<T>(chunks, H, [&](Scratch<T>& s, const Chunk& c, int64_t hh) {
    const int64_t n = c.len, last = n - 1;
    T* Q = s.get(0, n * K);
    T* Kc = s.get(1, n * K);
    T* dQs = s.get(2, n * K);
    T* dKs = s.get(3, n * K);
    load_rows(q, c, hh, Q);
    load_rows(k, c, hh, Kc);
    std::fill(dQs, dQs + n * K, T(0));
    std::fill(dKs, dKs + n * K, T(0));
    double* Gm = gate_buffer(n * K);
    T* eg = s.get(5, n * K);
    T* egl = s.get(6, n * K);
    T* Sbuf = s.get(7, K * V);
    T* dHbuf = s.get(8, K * V);
    T* ST = s.get(9, V * K);
    T* dHT = s.get(10, V * K);
    T* Vc = s.get(11, n * V);
    T* Vn = s.get(12, n * V);
    T* dO = s.get(13, n * V);
    T* dVn = s.get(14, n * V);
    T* Am = s.get(15, n * n);
    T* AT = s.get(16, n * n);
    T* dQh = s.get(17, n * K);
    T* dKi = s.get(18, n * K);
    T* dW = s.get(19, n * K);
    T* Ke = s.get(20, n * K);
    T* VT = s.get(21, V * n);
    T* KeT = s.get(22, K * n);
    T* dA = s.get(23, n * n);
    T* R = s.get(24, n * K);
    T* P = s.get(25, n * V);
    T* bt = s.get(26, n);
    T* db = s.get(27, n);
    T* dG = s.get(28, n * K);
    T* X = s.get(29, n * n);
    for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
      load_rows(gk, c, hv, Gm);
      load_scalars(beta, c, hv, bt);
      load_lower(Akk, c, hv, false, Am);
      const T* S = view_mat(h, c.index * HV + hv, Sbuf);
      const T* dH = view_mat(dh, c.index * HV + hv, dHbuf);
      load_rows(v, c, hv, Vc);
      load_rows(vn, c, hv, Vn);
      load_rows(dout, c, hv, dO);
      load_rows(dvn, c, hv, dVn);
      for (int64_t x = 0; x < n * K; ++x) eg[x] = static_cast<T>(Gm[x]);
      vexp(eg, n * K);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) egl[i * K + x] = static_cast<T>(Gm[last * K + x] - Gm[i * K + x]);
      vexp(egl, n * K);
      transpose(S, V, K, V, ST, K);
      transpose(dH, V, K, V, dHT, K);
      // dQ = scale eg . (dO S^T); dKi = egl . (Vn dH^T); dW = -dVn S^T.
      mm<T>(n, K, V, scale, dO, V, 1, ST, K, false, dQh, K);
      mm<T>(n, K, V, T(1), Vn, V, 1, dHT, K, false, dKi, K);
      mm<T>(n, K, V, T(-1), dVn, V, 1, ST, K, false, dW, K);
      for (int64_t x = 0; x < n * K; ++x) {
        dQh[x] *= eg[x];
        dKi[x] *= egl[x];
        Ke[x] = Kc[x] * eg[x];
      }
      // dA = (dVn V^T + dW Ke^T) diag(beta), strictly lower.
      transpose(Vc, V, n, V, VT, n);
      transpose(Ke, K, n, K, KeT, n);
      mm<T>(n, n, V, T(1), dVn, V, 1, VT, n, false, dA, n);
      mm<T>(n, n, K, T(1), dW, K, 1, KeT, n, true, dA, n);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) dA[i * n + j] = j < i ? dA[i * n + j] * bt[j] : T(0);
      // R = Akk^T dW, P = Akk^T dVn.
      mm<T>(n, K, n, T(1), Am, 1, n, dW, K, false, R, K, Tri::kUpper);
      mm<T>(n, V, n, T(1), Am, 1, n, dVn, V, false, P, V, Tri::kUpper);
      for (int64_t i = 0; i < n; ++i) {
        db[i] = dot(P + i * V, Vc + i * V, V) + dot(R + i * K, Ke + i * K, K);
        for (int64_t x = 0; x < V; ++x) P[i * V + x] *= bt[i];
      }
      store_rows(P, dv, c, hv);
      store_scalars(db, dbeta, c, hv);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) {
          const int64_t y = i * K + x;
          dG[y] = Q[y] * dQh[y] - Kc[y] * dKi[y] + bt[i] * Ke[y] * R[y];
          dQs[y] += dQh[y];
          dKs[y] += dKi[y] + bt[i] * eg[y] * R[y];
        }
      T* kd = s.get(30, K);
      std::fill(kd, kd + K, T(0));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) kd[x] += Kc[i * K + x] * dKi[i * K + x];
      for (int64_t x = 0; x < K; ++x)
        dG[last * K + x] += eg[last * K + x] * dot(S + x * V, dH + x * V, V) + kd[x];
      store_rows(dG, dg, c, hv);
      // dL = -M> . (Akk^T dA Akk^T).
      transpose(Am, n, n, n, AT, n);
      mm<T>(n, n, n, T(1), dA, n, 1, AT, n, false, X, n, Tri::kLower);
      mm<T>(n, n, n, T(-1), Am, 1, n, X, n, false, dA, n, Tri::kUpper);
      for (int64_t i = 0; i < n; ++i) std::fill(dA + i * n + i, dA + (i + 1) * n, T(0));
      store_square(dA, dAkk, c, hv);
    }
    store_rows(dQs, dq, c, hh);
    store_rows(dKs, dk, c, hh);
  });
}

template <class T>
void bwd_intra(const ChunkKdaBwdIntraArgs& a) {
  const Tok q(a.q), k(a.k), gk(a.gk), beta(a.beta), dAqk(a.dAqk), dAkk(a.dAkk), dq(a.dq), dk(a.dk),
      dbeta(a.dbeta), dg(a.dg), dqo(a.dq_out), dko(a.dk_out), dbo(a.dbeta_out), dgo(a.dg_out);
  const int64_t H = q.H, HV = gk.H, G = HV / H, K = q.D;
  const auto chunks = chunks_of(a.q.size(0), a.q.size(1), a.cu_seqlens, a.chunk_size);
  for_each_task<T>(chunks, H, [&](Scratch<T>& s, const Chunk& c, int64_t hh) {
    const int64_t n = c.len;
    T* Q = s.get(0, n * K);
    T* Kc = s.get(1, n * K);
    T* dQs = s.get(2, n * K);
    T* dKs = s.get(3, n * K);
    load_rows(q, c, hh, Q);
    load_rows(k, c, hh, Kc);
    load_rows(dq, c, hh, dQs);
    load_rows(dk, c, hh, dKs);
    double* Gm = gate_buffer(n * K);
    T* bt = s.get(5, n);
    T* db = s.get(6, n);
    T* dG = s.get(7, n * K);
    T* Dq = s.get(8, n * n);
    T* Dl = s.get(9, n * n);
    T* dqi = s.get(10, n * K);
    T* rr = s.get(11, n * K);
    T* cc = s.get(12, n * K);
    T* Ef = s.get(13, kBC * K);
    T* Eb = s.get(14, n * K);
    T* qf = s.get(15, kBC * K);
    T* bkf = s.get(16, kBC * K);
    T* tmp = s.get(17, n * K);
    T* e = s.get(18, K);
    for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
      load_rows(gk, c, hv, Gm);
      load_scalars(beta, c, hv, bt);
      load_scalars(dbeta, c, hv, db);
      load_rows(dg, c, hv, dG);
      load_lower(dAqk, c, hv, false, Dq);
      load_lower(dAkk, c, hv, true, Dl);
      std::fill(dqi, dqi + n * K, T(0));
      std::fill(rr, rr + n * K, T(0));
      std::fill(cc, cc + n * K, T(0));
      for (int64_t i0 = 0; i0 < n; i0 += kBC) {
        const int64_t i1 = std::min(n, i0 + kBC), mr = i1 - i0;
        if (i0 > 0) {
          block_factors(Gm, K, i0, i1, Ef, Eb);
          for (int64_t x = 0; x < i0 * K; ++x) tmp[x] = Kc[x] * Eb[x];  // kb
          // dq_I += Ef . (Dq[I,0:r] kb);  r_I += Ef . (Dl[I,0:r] kb)
          mm<T>(mr, K, i0, T(1), Dq + i0 * n, n, 1, tmp, K, false, qf, K);
          mm<T>(mr, K, i0, T(1), Dl + i0 * n, n, 1, tmp, K, false, bkf, K);
          for (int64_t x = 0; x < mr * K; ++x) {
            dqi[i0 * K + x] += Ef[x] * qf[x];
            rr[i0 * K + x] += Ef[x] * bkf[x];
          }
          // c_{0:r} += Eb . (Dq[I,0:r]^T (Q_I . Ef) + Dl[I,0:r]^T (beta K_I . Ef))
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t x = 0; x < K; ++x) {
              const T f = Ef[(i - i0) * K + x];
              qf[(i - i0) * K + x] = Q[i * K + x] * f;
              bkf[(i - i0) * K + x] = bt[i] * Kc[i * K + x] * f;
            }
          mm<T>(i0, K, mr, T(1), Dq + i0 * n, 1, n, qf, K, false, tmp, K);
          mm<T>(i0, K, mr, T(1), Dl + i0 * n, 1, n, bkf, K, true, tmp, K);
          for (int64_t x = 0; x < i0 * K; ++x) cc[x] += Eb[x] * tmp[x];
        }
        // Diagonal sub-block, strictly lower pairs, element-wise.
        for (int64_t i = i0 + 1; i < i1; ++i) {
          const double* gi = Gm + i * K;
          for (int64_t j = i0; j < i; ++j) {
            const T dqij = Dq[i * n + j], dlij = Dl[i * n + j];
            if (dqij == T(0) && dlij == T(0)) continue;
            const double* gj = Gm + j * K;
            for (int64_t x = 0; x < K; ++x) e[x] = static_cast<T>(gi[x] - gj[x]);
            vexp(e, K);
            diag_update(K, dqij, dlij, dlij * bt[i], Kc + j * K, Q + i * K, Kc + i * K, e, dqi + i * K,
                        rr + i * K, cc + j * K);
          }
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        T acc = 0;
        for (int64_t x = 0; x < K; ++x) acc += rr[i * K + x] * Kc[i * K + x];
        db[i] += acc;
        const T dqd = Dq[i * n + i];
        for (int64_t x = 0; x < K; ++x) {
          const int64_t y = i * K + x;
          rr[y] *= bt[i];
          dG[y] += Q[y] * dqi[y] + (rr[y] - cc[y]) * Kc[y];
          dQs[y] += dqi[y] + dqd * Kc[y];
          dKs[y] += rr[y] + cc[y] + dqd * Q[y];
        }
      }
      store_scalars(db, dbo, c, hv);
      store_rows(dG, dgo, c, hv);
    }
    store_rows(dQs, dqo, c, hh);
    store_rows(dKs, dko, c, hh);
  });
}

// ---------------------------------------------------------------------------------------------
// Gate (section 11).

template <class T>
inline T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}
template <class T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
void gate_fwd(const KdaGateFwdArgs& a) {
  const Tok g(a.g), y(a.y);
  const int64_t B = a.g.size(0), TT = a.g.size(1), HV = g.H, K = g.D;
  std::vector<T> A(HV, T(0)), bias(HV * K, T(0));
  if (a.A_log.defined()) load<T>(a.A_log.data(), a.A_log.dtype(), A.data(), HV);
  for (T& x : A) x = std::exp(x);
  if (a.dt_bias.defined()) load<T>(a.dt_bias.data(), a.dt_bias.dtype(), bias.data(), HV * K);
  const T lb = static_cast<T>(a.lower_bound);
  fusedops::cpu::parallel_for(0, B * TT, 64, [&](int64_t b0, int64_t e0) {
    std::vector<T> x(K);
    for (int64_t r = b0; r < e0; ++r) {
      const int64_t bb = r / TT, t = r % TT;
      for (int64_t hv = 0; hv < HV; ++hv) {
        load<T>(g.ptr(bb, t, hv), g.dtype, x.data(), K);
        for (int64_t c = 0; c < K; ++c) {
          const T z = x[c] + bias[hv * K + c];
          x[c] = a.has_lower_bound ? lb * sigmoid(A[hv] * z) : -A[hv] * softplus(z);
        }
        store<T>(x.data(), y.ptr(bb, t, hv), y.dtype, K);
      }
    }
  });
}

template <class T>
void gate_bwd(const KdaGateBwdArgs& a) {
  const Tok g(a.g), dy(a.dy), dg(a.dg);
  const int64_t B = a.g.size(0), TT = a.g.size(1), HV = g.H, K = g.D;
  std::vector<T> A(HV, T(0)), bias(HV * K, T(0));
  if (a.A_log.defined()) load<T>(a.A_log.data(), a.A_log.dtype(), A.data(), HV);
  for (T& x : A) x = std::exp(x);
  if (a.dt_bias.defined()) load<T>(a.dt_bias.data(), a.dt_bias.dtype(), bias.data(), HV * K);
  const T lb = static_cast<T>(a.lower_bound);
  // One task per value head: the parameter gradients are summed in token order (in double).
  fusedops::cpu::parallel_for(0, HV, 1, [&](int64_t b0, int64_t e0) {
    std::vector<T> x(K), d(K);
    std::vector<double> dbias(K);
    for (int64_t hv = b0; hv < e0; ++hv) {
      double dA = 0;
      std::fill(dbias.begin(), dbias.end(), 0.0);
      for (int64_t r = 0; r < B * TT; ++r) {
        const int64_t bb = r / TT, t = r % TT;
        load<T>(g.ptr(bb, t, hv), g.dtype, x.data(), K);
        load<T>(dy.ptr(bb, t, hv), dy.dtype, d.data(), K);
        for (int64_t c = 0; c < K; ++c) {
          const T z = x[c] + bias[hv * K + c];
          T dx;
          if (a.has_lower_bound) {
            const T sg = sigmoid(A[hv] * z);
            dx = d[c] * lb * sg * (T(1) - sg) * A[hv];
            dA += static_cast<double>(dx) * z;
          } else {
            dx = -A[hv] * sigmoid(z) * d[c];
            dA += static_cast<double>(d[c]) * (-A[hv] * softplus(z));
          }
          dbias[c] += dx;
          x[c] = dx;
        }
        store<T>(x.data(), dg.ptr(bb, t, hv), dg.dtype, K);
      }
      if (a.dA_log.defined()) {
        const T v = static_cast<T>(dA);
        store<T>(&v, static_cast<char*>(a.dA_log.data()) + dtype_size(a.dA_log.dtype()) * hv,
                 a.dA_log.dtype(), 1);
      }
      if (a.ddt_bias.defined()) {
        std::vector<T> v(dbias.begin(), dbias.end());
        store<T>(v.data(), static_cast<char*>(a.ddt_bias.data()) + dtype_size(a.ddt_bias.dtype()) * hv * K,
                 a.ddt_bias.dtype(), K);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// fused_recurrent_kda (section 9.1).

// One token forward on S [K,V]: S = diag(a) S; p = S^T k; delta = beta (v - p); S += k delta^T;
// o = scale S^T q (when o).
template <class T>
inline void rec_step(T* S, const T* a, const T* q, const T* k, const T* v, T beta, T scale,
                     int64_t K, int64_t V, T* o, T* p, T* delta) {
  std::fill(p, p + V, T(0));
  for (int64_t y = 0; y < K; ++y) {
    T* sr = S + y * V;
    const T ay = a[y], ky = k[y];
    for (int64_t x = 0; x < V; ++x) {
      sr[x] *= ay;
      p[x] += ky * sr[x];
    }
  }
  for (int64_t x = 0; x < V; ++x) delta[x] = beta * (v[x] - p[x]);
  if (o) std::fill(o, o + V, T(0));
  for (int64_t y = 0; y < K; ++y) {
    T* sr = S + y * V;
    const T ky = k[y];
    for (int64_t x = 0; x < V; ++x) sr[x] += ky * delta[x];
    if (o) {
      const T qy = q[y];
      for (int64_t x = 0; x < V; ++x) o[x] += qy * sr[x];
    }
  }
  if (o)
    for (int64_t x = 0; x < V; ++x) o[x] *= scale;
}

template <class T>
inline void load_token(const Tok& q, const Tok& k, const Tok& v, const Tok& g, const Tok& beta,
                       int64_t b, int64_t t, int64_t h, int64_t hv, T* qt, T* kt, T* vt, T* at,
                       T* bt, int64_t K) {
  load<T>(q.ptr(b, t, h), q.dtype, qt, K);
  load<T>(k.ptr(b, t, h), k.dtype, kt, K);
  load<T>(v.ptr(b, t, hv), v.dtype, vt, v.D);
  if (g.defined()) {
    load<T>(g.ptr(b, t, hv), g.dtype, at, K);
    vexp(at, K);
  } else {
    std::fill(at, at + K, T(1));
  }
  *bt = T(1);
  if (beta.defined()) load<T>(beta.ptr(b, t, hv), beta.dtype, bt, 1);
}

template <class T>
void recurrent_fwd(const FusedRecurrentKdaFwdArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), beta(a.beta), o(a.o);
  const Mat h0(a.initial_state), ht(a.final_state);
  const int64_t HV = v.H, G = HV / q.H, K = q.D, V = v.D;
  const T scale = static_cast<T>(a.scale);
  const auto seqs = la::make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, 1);
  const int64_t N = static_cast<int64_t>(seqs.size());
  fusedops::cpu::parallel_for(0, N * HV, 1, [&](int64_t b0, int64_t e0) {
    std::vector<T> S(K * V), qt(K), kt(K), at(K), vt(V), ot(V), p(V), dl(V);
    for (int64_t task = b0; task < e0; ++task) {
      const int64_t n = task / HV, hv = task % HV;
      const Seq& sq = seqs[n];
      if (h0.defined()) load_mat(h0, n * HV + hv, S.data());
      else std::fill(S.begin(), S.end(), T(0));
      for (int64_t t = sq.t0; t < sq.t0 + sq.len; ++t) {
        T bt;
        load_token(q, k, v, g, beta, sq.b, t, hv / G, hv, qt.data(), kt.data(), vt.data(), at.data(),
                   &bt, K);
        rec_step(S.data(), at.data(), qt.data(), kt.data(), vt.data(), bt, scale, K, V, ot.data(),
                 p.data(), dl.data());
        store<T>(ot.data(), o.ptr(sq.b, t, hv), o.dtype, V);
      }
      if (ht.defined()) store<T>(S.data(), ht.ptr(n * HV + hv), ht.dtype, K * V);
    }
  });
}

// One token of recurrent_bwd: from the state before it (Sp), the token's inputs and the state
// gradient dS after it, the token's gradients (dq, dk, dg, dv; dbeta returned) and dS before it.
// Every pointer is restrict: the buffers never overlap, and GCC then makes one vectorised version of
// each loop. Without that it also kept a scalar version behind a run-time aliasing check, whose sums
// fused the multiply-adds that the vectorised version rounds in two steps; which one ran followed
// where a thread's buffers were allocated, and dk moved by an ulp from call to call on two threads
// (stop 64).
template <class T>
inline T token_bwd(const T* __restrict Sp, const T* __restrict at, const T* __restrict kt,
                   const T* __restrict qt, const T* __restrict vt, const T* __restrict dot, T bt, T scale,
                   int64_t K, int64_t V, T* __restrict dS, T* __restrict St, T* __restrict p,
                   T* __restrict dl, T* __restrict dd, T* __restrict dp, T* __restrict dvt,
                   T* __restrict dqt, T* __restrict dkt, T* __restrict dgt) {
  // St = diag(a) Sp (S~); p = St^T k; delta = beta (v - p); S_t = St + k delta^T.
  std::fill(p, p + V, T(0));
  for (int64_t y = 0; y < K; ++y)
    for (int64_t x = 0; x < V; ++x) {
      St[y * V + x] = at[y] * Sp[y * V + x];
      p[x] += kt[y] * St[y * V + x];
    }
  for (int64_t x = 0; x < V; ++x) dl[x] = bt * (vt[x] - p[x]);
  // dq = scale S_t do; dS += scale q do^T.
  for (int64_t y = 0; y < K; ++y) {
    T acc = 0;
    for (int64_t x = 0; x < V; ++x) {
      acc += (St[y * V + x] + kt[y] * dl[x]) * dot[x];
      dS[y * V + x] += scale * qt[y] * dot[x];
    }
    dqt[y] = scale * acc;
  }
  // dk = dS delta; ddelta = dS^T k.
  std::fill(dd, dd + V, T(0));
  for (int64_t y = 0; y < K; ++y) {
    T acc = 0;
    for (int64_t x = 0; x < V; ++x) {
      acc += dS[y * V + x] * dl[x];
      dd[x] += dS[y * V + x] * kt[y];
    }
    dkt[y] = acc;
  }
  T dbt = 0;
  for (int64_t x = 0; x < V; ++x) {
    dvt[x] = bt * dd[x];
    dbt += dd[x] * (vt[x] - p[x]);
    dp[x] = -bt * dd[x];
  }
  // dS~ = dS + k dp^T; dk += St dp; dg = rowsum(St . dS~); dS_prev = diag(a) dS~.
  for (int64_t y = 0; y < K; ++y) {
    T acc = 0, accg = 0;
    for (int64_t x = 0; x < V; ++x) {
      const T d = dS[y * V + x] + kt[y] * dp[x];
      acc += St[y * V + x] * dp[x];
      accg += St[y * V + x] * d;
      dS[y * V + x] = at[y] * d;
    }
    dkt[y] += acc;
    dgt[y] = accg;
  }
  return dbt;
}

template <class T>
void recurrent_bwd(const FusedRecurrentKdaBwdArgs& a) {
  constexpr int64_t kSeg = 64;
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), beta(a.beta), dout(a.dout), dq(a.dq), dk(a.dk), dv(a.dv),
      dg(a.dg), dbeta(a.dbeta);
  const Mat h0(a.initial_state), dht(a.dht), dh0(a.dh0);
  const int64_t H = q.H, HV = v.H, G = HV / H, K = q.D, V = v.D;
  const T scale = static_cast<T>(a.scale);
  const auto seqs = la::make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, 1);
  const int64_t N = static_cast<int64_t>(seqs.size());
  fusedops::cpu::parallel_for(0, N * H, 1, [&](int64_t b0, int64_t e0) {
    std::vector<T> qt(K), kt(K), at(K), vt(V), p(V), dl(V), dot(V), dS(K * V), St(K * V), dd(V),
        dp(V), dgt(K), dkt(K), dqt(K), dvt(V);
    for (int64_t task = b0; task < e0; ++task) {
      const int64_t n = task / H, hh = task % H;
      const Seq& sq = seqs[n];
      const int64_t len = sq.len, nseg = la::ceil_div(len, kSeg);
      std::vector<T> dQ(len * K, T(0)), dK(len * K, T(0));
      std::vector<T> ckpt(std::max<int64_t>(nseg, 1) * K * V), states((kSeg + 1) * K * V);
      for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
        // Forward: checkpoints of the state at every segment start.
        std::vector<T> S(K * V, T(0));
        if (h0.defined()) load_mat(h0, n * HV + hv, S.data());
        for (int64_t t = 0; t < len; ++t) {
          if (t % kSeg == 0) std::copy(S.begin(), S.end(), ckpt.begin() + (t / kSeg) * K * V);
          T bt;
          load_token(q, k, v, g, beta, sq.b, sq.t0 + t, hh, hv, qt.data(), kt.data(), vt.data(),
                     at.data(), &bt, K);
          rec_step<T>(S.data(), at.data(), qt.data(), kt.data(), vt.data(), bt, scale, K, V, nullptr,
                      p.data(), dl.data());
        }
        if (dht.defined()) load_mat(dht, n * HV + hv, dS.data());
        else std::fill(dS.begin(), dS.end(), T(0));
        for (int64_t sgi = nseg - 1; sgi >= 0; --sgi) {
          const int64_t t0 = sgi * kSeg, t1 = std::min(len, t0 + kSeg);
          // States before each token of the segment.
          std::copy(ckpt.begin() + sgi * K * V, ckpt.begin() + (sgi + 1) * K * V, states.begin());
          for (int64_t t = t0; t < t1 - 1; ++t) {
            T* Sn = states.data() + (t - t0 + 1) * K * V;
            std::copy(states.data() + (t - t0) * K * V, states.data() + (t - t0 + 1) * K * V, Sn);
            T bt;
            load_token(q, k, v, g, beta, sq.b, sq.t0 + t, hh, hv, qt.data(), kt.data(), vt.data(),
                       at.data(), &bt, K);
            rec_step<T>(Sn, at.data(), qt.data(), kt.data(), vt.data(), bt, scale, K, V, nullptr,
                        p.data(), dl.data());
          }
          for (int64_t t = t1 - 1; t >= t0; --t) {
            const T* Sp = states.data() + (t - t0) * K * V;
            T bt;
            load_token(q, k, v, g, beta, sq.b, sq.t0 + t, hh, hv, qt.data(), kt.data(), vt.data(),
                       at.data(), &bt, K);
            load<T>(dout.ptr(sq.b, sq.t0 + t, hv), dout.dtype, dot.data(), V);
            const T dbt = token_bwd<T>(Sp, at.data(), kt.data(), qt.data(), vt.data(), dot.data(), bt, scale, K,
                                       V, dS.data(), St.data(), p.data(), dl.data(), dd.data(), dp.data(),
                                       dvt.data(), dqt.data(), dkt.data(), dgt.data());
            for (int64_t y = 0; y < K; ++y) {
              dQ[t * K + y] += dqt[y];
              dK[t * K + y] += dkt[y];
            }
            store<T>(dvt.data(), dv.ptr(sq.b, sq.t0 + t, hv), dv.dtype, V);
            if (dg.defined()) store<T>(dgt.data(), dg.ptr(sq.b, sq.t0 + t, hv), dg.dtype, K);
            if (dbeta.defined()) store<T>(&dbt, dbeta.ptr(sq.b, sq.t0 + t, hv), dbeta.dtype, 1);
          }
        }
        if (dh0.defined()) store<T>(dS.data(), dh0.ptr(n * HV + hv), dh0.dtype, K * V);
      }
      for (int64_t t = 0; t < len; ++t) {
        store<T>(dQ.data() + t * K, dq.ptr(sq.b, sq.t0 + t, hh), dq.dtype, K);
        store<T>(dK.data() + t * K, dk.ptr(sq.b, sq.t0 + t, hh), dk.dtype, K);
      }
    }
  });
}

}  // namespace fusedops::kda
