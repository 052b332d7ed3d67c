// Gated delta rule, CPU backend: backward-direction operators (section 1.5 blocks B2, B4, B5, the
// gate's backward and the per-token recurrence's; the state-gradient recurrence B3 and the beta
// sigmoid's backward are in src/ops/linear_attention/linear_attention_cpu.cpp). Same task layout
// as the forward file: chunk-parallel work per (chunk, q/k head) with the value heads of the group
// inside (so dq and dk are summed over the group in a fixed order).
#include <cmath>

#include "src/cpu/parallel.h"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/linear_attention/la_check.h"
#include "src/ops/gated_delta_rule/gdn_cpu.h"
#include "src/ops/linear_attention/la_cpu_kernels.h"

namespace fusedops::gdn::cpu {
namespace {

float dotf(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The gate-gradient terms are differences of large, nearly equal sums: accumulate them in double
// (eight independent lanes, so the loop vectorises without reassociation).
double dotd(const float* a, const float* b, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(a[i + l]) * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += static_cast<double>(a[i + l]) * b[i + l];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// Stores rows, adding the tensor's current values first when accumulating.
void store_rows_acc(float* src, int64_t lds, const Tok& t, const Chunk& c, int64_t h, bool acc,
                    float* tmp) {
  if (acc)
    for (int64_t i = 0; i < c.len; ++i) {
      load_floats(t.ptr(c.b, c.t0 + i, h), t.dtype, tmp, t.D);
      for (int64_t x = 0; x < t.D; ++x) src[i * lds + x] += tmp[x];
    }
  store_rows(src, lds, t, c, h);
}

// B5: prepare_wy_repr_bwd. The beta / exp(g) factors of Kbg and Vb are applied to the [C,C]
// blocks (columns of dA, rows of dMm), so K and V are read in place.
void wy_bwd(const Context&, const PrepareWyReprBwdArgs& a) {
  const Tok k(a.k), v(a.v), beta(a.beta), A(a.A), g(a.g), dw(a.dw), du(a.du);
  const Tok dk(a.dk), dv(a.dv), dbeta(a.dbeta), dg(a.dg);
  const int64_t H = k.H, HV = v.H, G = HV / H, K = k.D, V = v.D, BT = A.D;
  const auto chunks = chunks_of(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for_each_chunk_head(
      chunks, H, G, [&](const Chunk& nx, int64_t nh) { prefetch_rows(k, nx, nh); },
      [&](const Chunk& nx, int64_t hv) {
        prefetch_rows(v, nx, hv);
        prefetch_rows(A, nx, hv);
        prefetch_rows(dw, nx, hv);
        prefetch_rows(du, nx, hv);
      },
      [&](Scratch& s, const Chunk& c, int64_t h) {
        const int64_t n = c.len;
        double* gd = gate_buffer(n, 0);
        double* dGd = gate_buffer(n, 1);  // per value head: set, then accumulated
        double* dBd = gate_buffer(n, 2);
        const Rows kr = view_rows(k, c, h, s.get(0, n * K));
        float* Dm = s.get(2, n * n);
        float* dKs = s.get(3, n * K);
        std::fill(dKs, dKs + n * K, 0.0f);
        float* Am = s.get(4, n * n);
        float* bt = s.get(6, n);
        float* eg = s.get(8, n);
        float* dA = s.get(10, n * n);
        float* tmp = s.get(11, n * n);
        float* R = s.get(12, n * K);
        float* P = s.get(13, n * V);
        float* T1 = s.get(14, n * n);
        float* dL = s.get(15, n * n);
        float* gam = s.get(16, n * n);
        float* dB = s.get(17, n);
        float* dG = s.get(18, n);
        float* rowbuf = s.get(19, std::max(K, V));
        for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
          load_tril_block(A, c, hv, false, Am, n);
          load_scalars(beta, c, hv, bt);
          load_gates(g, c, hv, gd);
          exp_from(gd, n, 0.0, eg);
          if (g.defined()) decay_matrix(gd, n, true, gam, n);
          const Rows vr = view_rows(v, c, hv, s.get(20, n * V));
          const Rows dwr = view_rows(dw, c, hv, s.get(21, n * K));
          const Rows dur = view_rows(du, c, hv, s.get(22, n * V));
          // dA = dW Kbg^T + dU Vb^T = (dW K^T) diag(beta e^g) + (dU V^T) diag(beta), strictly
          // lower.
          gemm(n, n, K, 1.0f, dwr.p, dwr.ld, 1, kr.p, kr.ld, false, dA, n, Tri::kNone, true,
               nullptr, 0, true);
          gemm(n, n, V, 1.0f, dur.p, dur.ld, 1, vr.p, vr.ld, false, tmp, n, Tri::kNone, true,
               nullptr, 0, true);
          for (int64_t i = 0; i < n; ++i) {
            float* d = dA + i * n;
            const float* t = tmp + i * n;
            for (int64_t j = 0; j < i; ++j) d[j] = bt[j] * (eg[j] * d[j] + t[j]);
            std::fill(d + i, d + n, 0.0f);
          }
          // R = A^T dW, P = A^T dU.
          gemm(n, K, n, 1.0f, Am, 1, n, dwr.p, dwr.ld, false, R, K, Tri::kUpper);
          const OutRows Po = out_rows(dv, c, hv, P);
          gemm(n, V, n, 1.0f, Am, 1, n, dur.p, dur.ld, false, Po.p, Po.ld, Tri::kUpper);
          for (int64_t j = 0; j < n; ++j) {
            const double rk = dotd(R + j * K, kr.p + j * kr.ld, K);
            for (int64_t x = 0; x < K; ++x) dKs[j * K + x] += bt[j] * eg[j] * R[j * K + x];
            float* pj = Po.p + j * Po.ld;
            dBd[j] = eg[j] * rk + dotd(pj, vr.p + j * vr.ld, V);
            dGd[j] = static_cast<double>(bt[j]) * eg[j] * rk;
            for (int64_t x = 0; x < V; ++x) pj[x] *= bt[j];  // dV
          }
          commit_rows(Po, dv, c, hv);
          // dL = -M> . (A^T (M>.dA) A^T).
          gemm(n, n, n, 1.0f, Am, 1, n, dA, n, false, T1, n, Tri::kUpper);
          gemm(n, n, n, -1.0f, T1, n, 1, Am, n, false, dL, n, Tri::kNone, true, nullptr, 0, true);
          for (int64_t i = 0; i < n; ++i) {
            float* d = dL + i * n;
            float* m = Dm + i * n;
            for (int64_t j = 0; j < i; ++j) {
              const float gij = g.defined() ? gam[i * n + j] : 1.0f;
              const float dm = d[j] * gij;
              m[j] = dm;          // dMm
              d[j] = bt[i] * dm;  // diag(beta) dMm
            }
            std::fill(d + i, d + n, 0.0f);
            std::fill(m + i, m + n, 0.0f);
          }
          // dK += diag(beta) (dMm K) + (diag(beta) dMm)^T K. The beta and gate terms need the row
          // and column sums of dMm . (K K^T): row i of dMm K dotted with k_i, row j of
          // (diag(beta) dMm)^T K dotted with k_j (no K K^T product).
          gemm(n, K, n, 1.0f, Dm, n, 1, kr.p, kr.ld, false, R, K, Tri::kLower);
          for (int64_t i = 0; i < n; ++i) {
            const float* r = R + i * K;
            const double rk = dotd(r, kr.p + i * kr.ld, K);
            dBd[i] += rk;
            dGd[i] += static_cast<double>(bt[i]) * rk;
            float* __restrict dki = dKs + i * K;
            for (int64_t x = 0; x < K; ++x) dki[x] += bt[i] * r[x];
          }
          gemm(n, K, n, 1.0f, dL, 1, n, kr.p, kr.ld, false, R, K, Tri::kUpper);
          for (int64_t j = 0; j < n; ++j) {
            const float* r = R + j * K;
            dGd[j] -= dotd(r, kr.p + j * kr.ld, K);
            float* __restrict dkj = dKs + j * K;
            for (int64_t x = 0; x < K; ++x) dkj[x] += r[x];
          }
          for (int64_t i = 0; i < n; ++i) {
            dB[i] = static_cast<float>(dBd[i]);
            dG[i] = static_cast<float>(dGd[i]);
          }
          store_scalars(dB, dbeta, c, hv);
          if (dg.defined()) {
            if (a.accumulate_dk_dg) {
              for (int64_t i = 0; i < n; ++i) {
                float old;
                load_floats(dg.ptr(c.b, c.t0 + i, hv), dg.dtype, &old, 1);
                dG[i] = static_cast<float>(dGd[i] + old);
              }
            }
            store_scalars(dG, dg, c, hv);
          }
        }
        store_rows_acc(dKs, K, dk, c, h, a.accumulate_dk_dg, rowbuf);
      });
}

// B2: dv_local = scale (M>= . Gamma . Q K^T)^T dO.
void dv_local(const Context&, const ChunkBwdDvLocalArgs& a) {
  const Tok q(a.q), k(a.k), dO(a.dout), g(a.g), dv(a.dv);
  const int64_t H = q.H, HV = dO.H, G = HV / H, V = dO.D;
  const float scale = static_cast<float>(a.scale);
  const auto chunks = chunks_of(a.q.size(0), a.q.size(1), a.cu_seqlens, a.chunk_size);
  for_each_chunk_head(
      chunks, H, G, prefetch_qk(q, k),
      [&](const Chunk& nx, int64_t hv) {
        prefetch_rows(dO, nx, hv);
        prefetch_rows(dv, nx, hv, true);
      },
      [&](Scratch& s, const Chunk& c, int64_t hh) {
        const int64_t n = c.len;
        double* gd = gate_buffer(n);
        const QkBlock b = qk_block(s, q, k, c, hh);
        const float* qk = b.qk;
        float* P = s.get(4, n * n);
        float* D = s.get(6, n * V);
        for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
          gated_scores(g, c, hv, qk, scale, gd, P);
          const Rows dor = view_rows(dO, c, hv, s.get(7, n * V));
          const OutRows Do = out_rows(dv, c, hv, D);
          gemm(n, V, n, 1.0f, P, 1, n, dor.p, dor.ld, false, Do.p, Do.ld, Tri::kUpper);
          commit_rows(Do, dv, c, hv);
        }
      });
}

// B4: dq, dk (group-summed), dw and the partial dg.
void dqkwg(const Context&, const ChunkBwdDqkwgArgs& a) {
  const Tok q(a.q), k(a.k), vn(a.v), dO(a.dout), d2(a.dv), g(a.g);
  const Tok dq(a.dq), dk(a.dk), dw(a.dw), dg(a.dg);
  const Mat h(a.h), dh(a.dh);
  const int64_t H = q.H, HV = vn.H, G = HV / H, K = q.D, V = vn.D;
  const float scale = static_cast<float>(a.scale);
  const auto chunks = chunks_of(a.q.size(0), a.q.size(1), a.cu_seqlens, a.chunk_size);
  for_each_chunk_head(
      chunks, H, G, prefetch_qk(q, k),
      [&](const Chunk& nx, int64_t hv) {
        prefetch_state(h, nx.index * HV + hv);
        prefetch_state(dh, nx.index * HV + hv);
        prefetch_rows(vn, nx, hv);
        prefetch_rows(dO, nx, hv);
        prefetch_rows(d2, nx, hv);
      },
      [&](Scratch& s, const Chunk& c, int64_t hh) {
        const int64_t n = c.len, last = n - 1;
        const Rows qr = view_rows(q, c, hh, s.get(0, n * K));
        const Rows kr = view_rows(k, c, hh, s.get(1, n * K));
        // One value head per group with fp32 dq / dk: the products write dq and dk in place (no
        // group sums to accumulate); else per-head blocks summed over the group in order.
        const bool direct = G == 1 && dq.dtype == DType::kFloat32 && dk.dtype == DType::kFloat32;
        float* dQs = nullptr;
        float* dKs = nullptr;
        if (!direct) {
          dQs = s.get(2, n * K);
          dKs = s.get(3, n * K);
          std::fill(dQs, dQs + n * K, 0.0f);
          std::fill(dKs, dKs + n * K, 0.0f);
        }
        const OutRows dQo =
            direct ? out_rows(dq, c, hh, nullptr) : OutRows{s.get(8, n * K), K, false};
        const OutRows dKo =
            direct ? out_rows(dk, c, hh, nullptr) : OutRows{s.get(9, n * K), K, false};
        float* const dQ = dQo.p;
        float* const dK = dKo.p;
        const int64_t lq = dQo.ld, lk = dKo.ld;
        float* Ds = s.get(7, n * n);
        float* dKi = s.get(10, n * K);
        float* dW = s.get(11, n * K);
        float* Tm = s.get(21, n * K);
        double* gd = gate_buffer(n, 0);
        float* eg = s.get(13, n);
        float* dG = s.get(14, n);
        // The gate gradient is assembled from its separate terms (each summed in double) rather
        // than from dQ.Q - dK.K, whose two large parts cancel: the intra-chunk part is
        // rowsum(M) - colsum(M) with M = Ds . (Q K^T), taken as q_i . (Ds K)_i - k_i . (Ds^T Q)_i
        // from the two products dQ and dK need anyway (no Q K^T product).
        // Their per-token terms (set for every token before use) in the thread's gate arena.
        double* const t1 = gate_buffer(n, 1);
        double* const rs = gate_buffer(n, 2);
        double* const rq = gate_buffer(n, 3);
        double* const ck = gate_buffer(n, 4);
        float* const dsd = s.get(12, n);
        // Tm_i += dsd_i y_i (the diagonal term, y = K for dQ, Q for dK) after dots[i] = Tm_i . x_i
        // (without it); then dst += Tm.
        auto add_diagonal_then_rows = [&](float* dst, int64_t ld, const Rows& x, const Rows& y,
                                          double* dots) {
          for (int64_t i = 0; i < n; ++i) {
            float* __restrict t = Tm + i * K;
            dots[i] = dotd(t, x.p + i * x.ld, K);
            const float* __restrict yi = y.p + i * y.ld;
            float* __restrict d = dst + i * ld;
            for (int64_t c2 = 0; c2 < K; ++c2) d[c2] += t[c2] + dsd[i] * yi[c2];
          }
        };
        for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
          const float* S = view_state(h, c.index * HV + hv, s.get(15, K * V));
          const float* dH = view_state(dh, c.index * HV + hv, s.get(16, K * V));
          // S^T, dH^T and Vnew^T are packed by the products straight from S, dH and Vnew.
          const Rows vr = view_rows(vn, c, hv, s.get(17, n * V));
          const Rows dor = view_rows(dO, c, hv, s.get(18, n * V));
          load_gates(g, c, hv, gd);
          exp_from(gd, n, 0.0, eg);
          // Ds = scale M>= . Gamma . (dO Vnew^T).
          decay_matrix(gd, n, false, Ds, n);
          float* dov = s.get(20, n * n);
          gemm(n, n, V, 1.0f, dor.p, dor.ld, 1, vr.p, vr.ld, false, dov, n, Tri::kNone, true,
               nullptr, 0, true);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j <= i; ++j) Ds[i * n + j] *= scale * dov[i * n + j];
          // dQ = scale diag(e^g) dO S^T + Ds K.
          gemm(n, K, V, 1.0f, dor.p, dor.ld, 1, S, V, false, dQ, lq, Tri::kNone, false, nullptr, 0,
               true);
          if (dg.defined())
            for (int64_t i = 0; i < n; ++i)
              t1[i] = static_cast<double>(scale) * eg[i] * dotd(dQ + i * lq, qr.p + i * qr.ld, K);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t y = 0; y < K; ++y) dQ[i * lq + y] *= scale * eg[i];
          if (dg.defined()) {
            // The diagonal of M = Ds . (Q K^T) adds to row i's sum and to column i's alike, so it
            // is left out of both: were it inside the two products, their different fp32 rounding
            // would leave ~1e-7 |M_ii| in each token's dg, the same sign along the chunk, and the
            // gate parameters' gradients (sums of g_cum-weighted dg) would lose those digits.
            // Ds K with a zero diagonal: row i dotted with q_i is row i's off-diagonal sum of M;
            // then dQ_i gets its diagonal term Ds_ii k_i.
            for (int64_t i = 0; i < n; ++i) {
              dsd[i] = Ds[i * n + i];
              Ds[i * n + i] = 0.0f;
            }
            gemm(n, K, n, 1.0f, Ds, n, 1, kr.p, kr.ld, false, Tm, K, Tri::kLower);
            add_diagonal_then_rows(dQ, lq, qr, kr, rq);
          } else {
            gemm(n, K, n, 1.0f, Ds, n, 1, kr.p, kr.ld, true, dQ, lq, Tri::kLower);
          }
          // dKi = diag(e^(g_last - g)) Vnew dH^T; dK = dKi + Ds^T Q.
          gemm(n, K, V, 1.0f, vr.p, vr.ld, 1, dH, V, false, dKi, K, Tri::kNone, false, nullptr, 0,
               true);
          for (int64_t i = 0; i < n; ++i) {
            const float f = std::exp(static_cast<float>(gd[last] - gd[i]));
            for (int64_t y = 0; y < K; ++y) dK[i * lk + y] = dKi[i * K + y] *= f;
          }
          if (dg.defined()) {
            // Ds^T Q with the zero diagonal: row j dotted with k_j is column j's off-diagonal sum
            // of M; then dK_j gets Ds_jj q_j.
            gemm(n, K, n, 1.0f, Ds, 1, n, qr.p, qr.ld, false, Tm, K, Tri::kUpper);
            add_diagonal_then_rows(dK, lk, kr, qr, ck);
          } else {
            gemm(n, K, n, 1.0f, Ds, 1, n, qr.p, qr.ld, true, dK, lk, Tri::kUpper);
          }
          if (dw.defined()) {
            const Rows d2r = view_rows(d2, c, hv, s.get(19, n * V));
            const OutRows Wo = out_rows(dw, c, hv, dW);
            gemm(n, K, V, -1.0f, d2r.p, d2r.ld, 1, S, V, false, Wo.p, Wo.ld, Tri::kNone, false,
                 nullptr, 0, true);
            commit_rows(Wo, dw, c, hv);
          }
          if (dg.defined()) {
            const double sdh = dotd(S, dH, K * V);
            double dkik = 0.0;
            for (int64_t i = 0; i < n; ++i) rs[i] = rq[i] - ck[i];
            for (int64_t i = 0; i < n; ++i) {
              const double kik = dotd(dKi + i * K, kr.p + i * kr.ld, K);
              dkik += kik;
              rs[i] += t1[i] - kik;
            }
            rs[last] += eg[last] * sdh + dkik;
            for (int64_t i = 0; i < n; ++i) dG[i] = static_cast<float>(rs[i]);
            store_scalars(dG, dg, c, hv);
          }
          if (!direct)
            for (int64_t e2 = 0; e2 < n * K; ++e2) {
              dQs[e2] += dQ[e2];
              dKs[e2] += dK[e2];
            }
        }
        if (!direct) {
          store_rows(dQs, K, dq, c, hh);
          store_rows(dKs, K, dk, c, hh);
        }
      });
}

// Gate backward: fixed blocks of rows, partial sums per block, then the blocks in order, so the
// parameter gradients do not depend on the thread count.
void gate_bwd(const Context&, const GdnGateBwdArgs& a) {
  constexpr int64_t kBlock = 256;
  const int64_t HV = a.g.size(-1), rows = HV ? a.g.numel() / HV : 0;
  const int64_t rs = rows ? a.g.row_stride() : 0, drs = rows ? a.dy.row_stride() : 0;
  std::vector<float> A(HV), bias(HV, 0.0f);
  load_floats(a.A_log.data(), a.A_log.dtype(), A.data(), HV);
  for (float& x : A) x = std::exp(x);
  if (a.dt_bias.defined()) load_floats(a.dt_bias.data(), a.dt_bias.dtype(), bias.data(), HV);
  const int64_t nblocks = ceil_div(rows, kBlock);
  std::vector<double> partA(nblocks * HV, 0.0), partB(nblocks * HV, 0.0);
  const size_t gs = dtype_size(a.g.dtype()), ys = dtype_size(a.dy.dtype()), os = dtype_size(a.dg.dtype());
  fusedops::cpu::parallel_for(0, nblocks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> x(HV), dy(HV);
    for (int64_t blk = b; blk < e; ++blk)
      for (int64_t r = blk * kBlock; r < std::min(rows, (blk + 1) * kBlock); ++r) {
        load_floats(static_cast<const char*>(a.g.data()) + gs * r * rs, a.g.dtype(), x.data(), HV);
        load_floats(static_cast<const char*>(a.dy.data()) + ys * r * drs, a.dy.dtype(), dy.data(), HV);
        for (int64_t hv = 0; hv < HV; ++hv) {
          const float z = x[hv] + bias[hv];
          const float y = -A[hv] * (z > 20.0f ? z : std::log1p(std::exp(z)));
          const float dx = -A[hv] / (1.0f + std::exp(-z)) * dy[hv];
          partA[blk * HV + hv] += static_cast<double>(dy[hv]) * y;
          partB[blk * HV + hv] += dx;
          x[hv] = dx;
        }
        store_floats(x.data(), static_cast<char*>(a.dg.data()) + os * r * HV, a.dg.dtype(), HV);
      }
  });
  std::vector<float> dA(HV, 0.0f), db(HV, 0.0f);
  for (int64_t hv = 0; hv < HV; ++hv) {
    double sa = 0, sb = 0;
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      sa += partA[blk * HV + hv];
      sb += partB[blk * HV + hv];
    }
    dA[hv] = static_cast<float>(sa);
    db[hv] = static_cast<float>(sb);
  }
  store_floats(dA.data(), a.dA_log.data(), a.dA_log.dtype(), HV);
  if (a.ddt_bias.defined()) store_floats(db.data(), a.ddt_bias.data(), a.ddt_bias.dtype(), HV);
}

// Backward of the per-token recurrence; states recomputed from checkpoints every kSeg tokens.
void recurrent_bwd(const Context&, const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  constexpr int64_t kSeg = 64;
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), beta(a.beta), dO(a.dout);
  const Tok dq(a.dq), dk(a.dk), dv(a.dv), dg(a.dg), dbeta(a.dbeta);
  const Mat h0(a.initial_state), dht(a.dht), dh0(a.dh0);
  const int64_t H = q.H, HV = v.H, G = HV / H, K = q.D, V = v.D;
  const float scale = static_cast<float>(a.scale);
  const auto seqs = make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, 1);
  const int64_t N = static_cast<int64_t>(seqs.size());
  fusedops::cpu::parallel_for(0, N * H, 1, [&](int64_t b, int64_t e) {
    Scratch s;
    for (int64_t task = b; task < e; ++task) {
      const Seq& sq = seqs[task / H];
      const int64_t n = task / H, hh = task % H, bb = sq.b, L = sq.len;
      const int64_t nseg = ceil_div(L, kSeg);
      float* dQ = s.get(0, L * K);
      float* dK = s.get(1, L * K);
      std::fill(dQ, dQ + L * K, 0.0f);
      std::fill(dK, dK + L * K, 0.0f);
      float* ckpt = s.get(2, std::max<int64_t>(1, nseg) * K * V);
      float* prev = s.get(3, kSeg * K * V);
      float* S = s.get(4, K * V);
      float* dS = s.get(5, K * V);
      float* qt = s.get(6, K);
      float* kt = s.get(7, K);
      float* vt = s.get(8, V);
      float* dot_ = s.get(9, V);
      float* delta = s.get(10, V);
      float* p = s.get(11, V);
      float* dd = s.get(12, V);
      float* sdo = s.get(13, K);
      float* dV = s.get(14, L * V);
      float* dB = s.get(15, L);
      float* dG = s.get(16, L);
      for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
        auto tok = [&](int64_t i, float& gt, float& bt) {
          const int64_t t = sq.t0 + i;
          load_floats(q.ptr(bb, t, hh), q.dtype, qt, K);
          load_floats(k.ptr(bb, t, hh), k.dtype, kt, K);
          load_floats(v.ptr(bb, t, hv), v.dtype, vt, V);
          gt = 0.0f;
          bt = 1.0f;
          if (g.defined()) load_floats(g.ptr(bb, t, hv), g.dtype, &gt, 1);
          if (beta.defined()) load_floats(beta.ptr(bb, t, hv), beta.dtype, &bt, 1);
        };
        float gt, bt;
        if (h0.defined()) load_state_tile(h0, n * HV + hv, 0, V, S);
        else std::fill(S, S + K * V, 0.0f);
        for (int64_t i = 0; i < L; ++i) {
          if (i % kSeg == 0) std::copy(S, S + K * V, ckpt + (i / kSeg) * K * V);
          tok(i, gt, bt);
          recurrent_step(S, nullptr, kt, vt, std::exp(gt), bt, scale, K, V, nullptr, delta, p);
        }
        if (dht.defined()) load_state_tile(dht, n * HV + hv, 0, V, dS);
        else std::fill(dS, dS + K * V, 0.0f);
        for (int64_t sg = nseg - 1; sg >= 0; --sg) {
          const int64_t i0 = sg * kSeg, i1 = std::min(L, i0 + kSeg);
          std::copy(ckpt + sg * K * V, ckpt + (sg + 1) * K * V, S);
          for (int64_t i = i0; i < i1; ++i) {
            std::copy(S, S + K * V, prev + (i - i0) * K * V);
            tok(i, gt, bt);
            recurrent_step(S, nullptr, kt, vt, std::exp(gt), bt, scale, K, V, nullptr, delta, p);
          }
          for (int64_t i = i1 - 1; i >= i0; --i) {
            tok(i, gt, bt);
            load_floats(dO.ptr(bb, sq.t0 + i, hv), dO.dtype, dot_, V);
            const float decay = std::exp(gt);
            const float* Sp = prev + (i - i0) * K * V;  // S_{t-1}
            // p = decay Sp^T k, sdo = Sp dO.
            std::fill(p, p + V, 0.0f);
            for (int64_t y = 0; y < K; ++y) {
              const float* srow = Sp + y * V;
              for (int64_t x = 0; x < V; ++x) p[x] += kt[y] * srow[x];
              sdo[y] = dotf(srow, dot_, V);
            }
            for (int64_t x = 0; x < V; ++x) {
              p[x] *= decay;
              delta[x] = bt * (vt[x] - p[x]);
            }
            const float ddo = dotf(delta, dot_, V);
            // dS += scale q dO^T; dq = scale S_t dO; dd = dS^T k; dk = dS delta.
            std::fill(dd, dd + V, 0.0f);
            float* dq_i = dQ + i * K;
            float* dk_i = dK + i * K;
            for (int64_t y = 0; y < K; ++y) {
              float* drow = dS + y * V;
              const float sq_ = scale * qt[y];
              for (int64_t x = 0; x < V; ++x) drow[x] += sq_ * dot_[x];
              for (int64_t x = 0; x < V; ++x) dd[x] += kt[y] * drow[x];
              dk_i[y] += dotf(drow, delta, V);
              dq_i[y] += scale * (decay * sdo[y] + kt[y] * ddo);
            }
            float dbt = 0.0f;
            for (int64_t x = 0; x < V; ++x) {
              // fma: one rounding in every loop version GCC makes (kda_kernels.h, token_bwd)
              dbt = std::fma(dd[x], vt[x] - p[x], dbt);
              dV[i * V + x] = bt * dd[x];
              dd[x] *= -bt;  // dp
            }
            dB[i] = dbt;
            // dk += decay Sp dp; dS~ = dS + k dp^T; dg = decay <Sp, dS~>; dS = decay dS~.
            float dgt = 0.0f;
            for (int64_t y = 0; y < K; ++y) {
              const float* srow = Sp + y * V;
              float* drow = dS + y * V;
              dk_i[y] += decay * dotf(srow, dd, V);
              for (int64_t x = 0; x < V; ++x) drow[x] += kt[y] * dd[x];
              dgt += dotf(srow, drow, V);
              for (int64_t x = 0; x < V; ++x) drow[x] *= decay;
            }
            dG[i] = decay * dgt;
          }
        }
        for (int64_t i = 0; i < L; ++i) {
          store_floats(dV + i * V, dv.ptr(bb, sq.t0 + i, hv), dv.dtype, V);
          if (dbeta.defined()) store_floats(dB + i, dbeta.ptr(bb, sq.t0 + i, hv), dbeta.dtype, 1);
          if (dg.defined()) store_floats(dG + i, dg.ptr(bb, sq.t0 + i, hv), dg.dtype, 1);
        }
        if (dh0.defined()) store_state_tile(dS, dh0, n * HV + hv, 0, V);
      }
      for (int64_t i = 0; i < L; ++i) {
        store_floats(dQ + i * K, dq.ptr(bb, sq.t0 + i, hh), dq.dtype, K);
        store_floats(dK + i * K, dk.ptr(bb, sq.t0 + i, hh), dk.dtype, K);
      }
    }
  });
}

void top_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  compose_bwd(with_backend(ctx, "cpu"), a);
}

bool sup_wy(const PrepareWyReprBwdArgs& a) {
  return no_float64({&a.k, &a.v, &a.beta, &a.A, &a.dw, &a.du, &a.dk, &a.dv, &a.dbeta, &a.dg});
}
bool sup_dvl(const ChunkBwdDvLocalArgs& a) { return no_float64({&a.q, &a.k, &a.dout, &a.dv}); }
bool sup_dqkwg(const ChunkBwdDqkwgArgs& a) {
  return no_float64({&a.q, &a.k, &a.v, &a.dout, &a.h, &a.dh, &a.w, &a.dv, &a.dq, &a.dk,
                     &a.dw, &a.dg});
}
bool sup_gate(const GdnGateBwdArgs& a) {
  return no_float64({&a.g, &a.A_log, &a.dt_bias, &a.dy, &a.dg, &a.dA_log, &a.ddt_bias});
}
bool sup_recurrent(const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  return la::no_float64(a);
}
bool sup_top(const ChunkGatedDeltaRuleBwdArgs& a) {
  return la::no_float64_but_gate_cumsum(a, {&a.A});
}

}  // namespace

}  // namespace fusedops::gdn::cpu

namespace fusedops::gdn {

void register_cpu_bwd(Registry& r) {
  using namespace cpu;
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<PrepareWyReprBwdArgs>("recompute_w_u", Direction::kBackward, spec, sup_wy, wy_bwd);
  r.add<ChunkBwdDvLocalArgs>("chunk_bwd_dv_local", Direction::kBackward, spec, sup_dvl, dv_local);
  r.add<ChunkBwdDqkwgArgs>("chunk_bwd_dqkwg", Direction::kBackward, spec, sup_dqkwg, dqkwg);
  r.add<GdnGateBwdArgs>("gdn_gate", Direction::kBackward, spec, sup_gate, gate_bwd);
  r.add<FusedRecurrentGatedDeltaRuleBwdArgs>("fused_recurrent_gated_delta_rule",
                                             Direction::kBackward, spec, sup_recurrent, recurrent_bwd);
  r.add<ChunkGatedDeltaRuleBwdArgs>("chunk_gated_delta_rule", Direction::kBackward, spec, sup_top,
                                    top_bwd);
}

}  // namespace fusedops::gdn
