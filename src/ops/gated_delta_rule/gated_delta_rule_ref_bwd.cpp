// Gated delta rule, float64 reference: the backward-direction operators (section 1.5 blocks
// B2-B5, section 11, and the per-token recurrence's backward).
#include <cmath>
#include <vector>

#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/linear_attention/la_common.h"
#include "src/ops/gated_delta_rule/gdn_ref.h"

namespace fusedops::gdn::ref {
namespace {

std::vector<double> exp_gate(const std::vector<double>& g) {
  std::vector<double> e(g.size());
  for (size_t i = 0; i < g.size(); ++i) e[i] = std::exp(g[i]);
  return e;
}

void add_block(const Tok& t, const Chunk& c, int64_t h, std::vector<double> v, bool accumulate) {
  if (accumulate) {
    const auto old = load_block(t, c, h);
    for (size_t i = 0; i < v.size(); ++i) v[i] += old[i];
  }
  store_block(t, c, h, v);
}

// B5: prepare_wy_repr_bwd.
void wy_bwd(const Context&, const PrepareWyReprBwdArgs& a) {
  const Tok k(a.k), v(a.v), beta(a.beta), A(a.A), g(a.g), dw(a.dw), du(a.du);
  const Tok dk(a.dk), dv(a.dv), dbeta(a.dbeta), dg(a.dg);
  const int64_t H = k.H, HV = v.H, G = HV / H, K = k.D, V = v.D, BT = A.D;
  const auto chunks = make_chunks(make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, BT), BT);
  for (const Chunk& c : chunks)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t n = c.len;
      const auto kc = load_block(k, c, h);
      std::vector<double> dK(n * K, 0.0);
      for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
        const auto vc = load_block(v, c, hv), b = load_block(beta, c, hv);
        const auto gm = load_gate(g, c, hv), eg = exp_gate(gm);
        const auto Am = load_tril(A, c, hv, false);
        const auto dW = load_block(dw, c, hv), dU = load_block(du, c, hv);
        std::vector<double> dV(n * V, 0.0), dB(n, 0.0), dG(n, 0.0), dA(n * n, 0.0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < i; ++j)
            dA[i * n + j] = b[j] * eg[j] * dot(&dW[i * K], &kc[j * K], K) +
                            b[j] * dot(&dU[i * V], &vc[j * V], V);
        // R = A^T dW, P = A^T dU.
        for (int64_t j = 0; j < n; ++j) {
          std::vector<double> R(K, 0.0), P(V, 0.0);
          for (int64_t i = j; i < n; ++i) {
            for (int64_t x = 0; x < K; ++x) R[x] += Am[i * n + j] * dW[i * K + x];
            for (int64_t x = 0; x < V; ++x) P[x] += Am[i * n + j] * dU[i * V + x];
          }
          for (int64_t x = 0; x < K; ++x) dK[j * K + x] += b[j] * eg[j] * R[x];
          dB[j] += eg[j] * dot(R.data(), &kc[j * K], K) + dot(P.data(), &vc[j * V], V);
          dG[j] += b[j] * eg[j] * dot(R.data(), &kc[j * K], K);
          for (int64_t x = 0; x < V; ++x) dV[j * V + x] = b[j] * P[x];
        }
        // dL = -M> . (A^T (M> . dA) A^T).
        std::vector<double> T1(n * n, 0.0), dL(n * n, 0.0);  // T1 = A^T (M>.dA)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t m = 0; m < n; ++m) s += Am[m * n + i] * dA[m * n + j];
            T1[i * n + j] = s;
          }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < i; ++j) {
            double s = 0;
            for (int64_t m = 0; m < n; ++m) s += T1[i * n + m] * Am[j * n + m];
            dL[i * n + j] = -s;
          }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < i; ++j) {
            const double kk = dot(&kc[i * K], &kc[j * K], K);
            const double gam = gamma_factor(gm, i, j);
            const double dm = dL[i * n + j] * gam;
            for (int64_t x = 0; x < K; ++x) {
              dK[i * K + x] += b[i] * dm * kc[j * K + x];
              dK[j * K + x] += dm * b[i] * kc[i * K + x];
            }
            dB[i] += dm * kk;
            const double dll = dL[i * n + j] * b[i] * kk * gam;  // dL . L
            dG[i] += dll;
            dG[j] -= dll;
          }
        store_block(dv, c, hv, dV);
        store_block(dbeta, c, hv, dB);
        if (dg.defined()) add_block(dg, c, hv, dG, a.accumulate_dk_dg);
      }
      add_block(dk, c, h, dK, a.accumulate_dk_dg);
    }
}

// B3: reverse state-gradient recurrence.
// B2: dv_local.
void dv_local(const Context&, const ChunkBwdDvLocalArgs& a) {
  const Tok q(a.q), k(a.k), dO(a.dout), g(a.g), dv(a.dv);
  const int64_t HV = dO.H, G = HV / q.H, K = q.D, V = dO.D, BT = a.chunk_size;
  const auto chunks = make_chunks(make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, BT), BT);
  for (const Chunk& c : chunks)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const auto qc = load_block(q, c, hv / G), kc = load_block(k, c, hv / G);
      const auto doc = load_block(dO, c, hv), gm = load_gate(g, c, hv);
      std::vector<double> D(c.len * V, 0.0);
      for (int64_t j = 0; j < c.len; ++j)
        for (int64_t i = j; i < c.len; ++i) {
          const double p = a.scale * dot(&qc[i * K], &kc[j * K], K) * gamma_factor(gm, i, j);
          for (int64_t x = 0; x < V; ++x) D[j * V + x] += p * doc[i * V + x];
        }
      store_block(dv, c, hv, D);
    }
}

// B4: dq, dk, dw and the partial dg.
void dqkwg(const Context&, const ChunkBwdDqkwgArgs& a) {
  const Tok q(a.q), k(a.k), vn(a.v), dO(a.dout), dv2(a.dv), g(a.g);
  const Tok dq(a.dq), dk(a.dk), dw(a.dw), dg(a.dg);
  const Mat h(a.h), dh(a.dh);
  const int64_t H = q.H, HV = vn.H, G = HV / H, K = q.D, V = vn.D, BT = a.chunk_size;
  const auto chunks = make_chunks(make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, BT), BT);
  for (const Chunk& c : chunks)
    for (int64_t hh = 0; hh < H; ++hh) {
      const int64_t n = c.len, last = n - 1;
      const auto qc = load_block(q, c, hh), kc = load_block(k, c, hh);
      std::vector<double> dQs(n * K, 0.0), dKs(n * K, 0.0);
      for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
        const auto S = load_mat(h, c.index * HV + hv), dH = load_mat(dh, c.index * HV + hv);
        const auto vc = load_block(vn, c, hv), doc = load_block(dO, c, hv), d2 = load_block(dv2, c, hv);
        const auto gm = load_gate(g, c, hv), eg = exp_gate(gm);
        std::vector<double> Ds(n * n, 0.0), dQ(n * K, 0.0), dK(n * K, 0.0), dKi(n * K, 0.0);
        std::vector<double> dW(n * K, 0.0), dG(n, 0.0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j <= i; ++j)
            Ds[i * n + j] = a.scale * gamma_factor(gm, i, j) * dot(&doc[i * V], &vc[j * V], V);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t y = 0; y < K; ++y) {
            const double* srow = &S[y * V];
            const double* hrow = &dH[y * V];
            dQ[i * K + y] = a.scale * eg[i] * dot(&doc[i * V], srow, V);
            dKi[i * K + y] = std::exp(gm[last] - gm[i]) * dot(&vc[i * V], hrow, V);
            dW[i * K + y] = -dot(&d2[i * V], srow, V);
          }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t y = 0; y < K; ++y) {
              dQ[i * K + y] += Ds[i * n + j] * kc[j * K + y];
              dK[j * K + y] += Ds[i * n + j] * qc[i * K + y];
            }
        double sdh = 0, dkik = 0;
        for (int64_t e = 0; e < K * V; ++e) sdh += S[e] * dH[e];
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t y = 0; y < K; ++y) dK[i * K + y] += dKi[i * K + y];
          dG[i] = dot(&dQ[i * K], &qc[i * K], K) - dot(&dK[i * K], &kc[i * K], K);
          dkik += dot(&dKi[i * K], &kc[i * K], K);
        }
        dG[last] += eg[last] * sdh + dkik;
        for (int64_t e = 0; e < n * K; ++e) {
          dQs[e] += dQ[e];
          dKs[e] += dK[e];
        }
        if (dw.defined()) store_block(dw, c, hv, dW);
        if (dg.defined()) store_block(dg, c, hv, dG);
      }
      store_block(dq, c, hh, dQs);
      store_block(dk, c, hh, dKs);
    }
}

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

void gate_bwd(const Context&, const GdnGateBwdArgs& a) {
  const int64_t HV = a.g.size(-1), rows = a.g.numel() / std::max<int64_t>(HV, 1);
  const int64_t rs = rows ? a.g.row_stride() : 0, drs = rows ? a.dy.row_stride() : 0;
  std::vector<double> A(HV), bias(HV, 0.0), dA(HV, 0.0), db(HV, 0.0);
  load_doubles(a.A_log.data(), a.A_log.dtype(), A.data(), HV);
  if (a.dt_bias.defined()) load_doubles(a.dt_bias.data(), a.dt_bias.dtype(), bias.data(), HV);
  const size_t gs = dtype_size(a.g.dtype()), ys = dtype_size(a.dy.dtype()), os = dtype_size(a.dg.dtype());
  std::vector<double> x(HV), dy(HV), dx(HV);
  for (int64_t r = 0; r < rows; ++r) {
    load_doubles(static_cast<const char*>(a.g.data()) + gs * r * rs, a.g.dtype(), x.data(), HV);
    load_doubles(static_cast<const char*>(a.dy.data()) + ys * r * drs, a.dy.dtype(), dy.data(), HV);
    for (int64_t h = 0; h < HV; ++h) {
      const double z = x[h] + bias[h], ea = std::exp(A[h]);
      const double y = -ea * softplus(z);
      dx[h] = -ea / (1.0 + std::exp(-z)) * dy[h];
      dA[h] += dy[h] * y;
      db[h] += dx[h];
    }
    store_doubles(dx.data(), static_cast<char*>(a.dg.data()) + os * r * HV, a.dg.dtype(), HV);
  }
  store_doubles(dA.data(), a.dA_log.data(), a.dA_log.dtype(), HV);
  if (a.ddt_bias.defined()) store_doubles(db.data(), a.ddt_bias.data(), a.ddt_bias.dtype(), HV);
}

// Backward of the per-token recurrence: states are recomputed from checkpoints every kSeg tokens.
void recurrent_bwd(const Context&, const FusedRecurrentGatedDeltaRuleBwdArgs& a) {
  constexpr int64_t kSeg = 64;
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), beta(a.beta), dO(a.dout);
  const Tok dq(a.dq), dk(a.dk), dv(a.dv), dg(a.dg), dbeta(a.dbeta);
  const Mat h0(a.initial_state), dht(a.dht), dh0(a.dh0);
  const int64_t H = q.H, HV = v.H, G = HV / H, K = q.D, V = v.D;
  const auto seqs = make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, 1);
  for (size_t n = 0; n < seqs.size(); ++n) {
    const Seq& s = seqs[n];
    const int64_t b = s.b, L = s.len;
    for (int64_t hh = 0; hh < H; ++hh) {
      std::vector<double> dQ(L * K, 0.0), dK(L * K, 0.0);
      for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
        auto tok = [&](int64_t i, std::vector<double>& qt, std::vector<double>& kt,
                       std::vector<double>& vt, double& gt, double& bt) {
          const int64_t t = s.t0 + i;
          load_doubles(q.ptr(b, t, hh), q.dtype, qt.data(), K);
          load_doubles(k.ptr(b, t, hh), k.dtype, kt.data(), K);
          load_doubles(v.ptr(b, t, hv), v.dtype, vt.data(), V);
          gt = 0;
          bt = 1;
          if (g.defined()) load_doubles(g.ptr(b, t, hv), g.dtype, &gt, 1);
          if (beta.defined()) load_doubles(beta.ptr(b, t, hv), beta.dtype, &bt, 1);
        };
        std::vector<double> qt(K), kt(K), vt(V), dot_(V), delta(V);
        double gt, bt;
        const int64_t nseg = ceil_div(L, kSeg);
        std::vector<std::vector<double>> ckpt(nseg);
        std::vector<double> S(K * V, 0.0);
        if (h0.defined()) S = load_mat(h0, n * HV + hv);
        for (int64_t i = 0; i < L; ++i) {
          if (i % kSeg == 0) ckpt[i / kSeg] = S;
          tok(i, qt, kt, vt, gt, bt);
          recurrent_step(S, qt.data(), kt.data(), vt.data(), gt, bt, a.scale, K, V, nullptr, nullptr);
        }
        std::vector<double> dS(K * V, 0.0);
        if (dht.defined()) dS = load_mat(dht, n * HV + hv);
        std::vector<double> dV(L * V), dB(L), dG(L);
        for (int64_t sg = nseg - 1; sg >= 0; --sg) {
          const int64_t i0 = sg * kSeg, i1 = std::min(L, i0 + kSeg);
          std::vector<std::vector<double>> prev(i1 - i0);
          std::vector<double> St = ckpt[sg];
          for (int64_t i = i0; i < i1; ++i) {
            prev[i - i0] = St;
            tok(i, qt, kt, vt, gt, bt);
            recurrent_step(St, qt.data(), kt.data(), vt.data(), gt, bt, a.scale, K, V, nullptr, nullptr);
          }
          for (int64_t i = i1 - 1; i >= i0; --i) {
            tok(i, qt, kt, vt, gt, bt);
            load_doubles(dO.ptr(b, s.t0 + i, hv), dO.dtype, dot_.data(), V);
            const double decay = std::exp(gt);
            std::vector<double> Sd = prev[i - i0];  // S~ = decay * S_{t-1}
            for (double& e : Sd) e *= decay;
            std::vector<double> p(V, 0.0);
            for (int64_t y = 0; y < K; ++y)
              for (int64_t x = 0; x < V; ++x) p[x] += Sd[y * V + x] * kt[y];
            for (int64_t x = 0; x < V; ++x) delta[x] = bt * (vt[x] - p[x]);
            // The sums over x are explicit std::fma, so that their rounding does not depend on
            // which version of a vectorised loop runs (see kda_kernels.h's token_bwd).
            // dS += scale q dO^T; dq = scale S_t dO.
            for (int64_t y = 0; y < K; ++y) {
              double acc = 0;
              for (int64_t x = 0; x < V; ++x) {
                dS[y * V + x] += a.scale * qt[y] * dot_[x];
                acc = std::fma(Sd[y * V + x] + kt[y] * delta[x], dot_[x], acc);
              }
              dQ[i * K + y] += a.scale * acc;
            }
            std::vector<double> dd(V, 0.0);
            for (int64_t y = 0; y < K; ++y)
              for (int64_t x = 0; x < V; ++x) {
                dd[x] += dS[y * V + x] * kt[y];
                dK[i * K + y] = std::fma(dS[y * V + x], delta[x], dK[i * K + y]);
              }
            double db_ = 0;
            for (int64_t x = 0; x < V; ++x) {
              db_ = std::fma(dd[x], vt[x] - p[x], db_);
              dV[i * V + x] = bt * dd[x];
            }
            dB[i] = db_;
            // dp = -beta dd: dS~ = dS + k dp^T, dk += S~ dp.
            for (int64_t y = 0; y < K; ++y)
              for (int64_t x = 0; x < V; ++x) {
                const double dp = -bt * dd[x];
                dK[i * K + y] = std::fma(Sd[y * V + x], dp, dK[i * K + y]);
                dS[y * V + x] += kt[y] * dp;
              }
            double dg_ = 0;
            for (int64_t e = 0; e < K * V; ++e) {
              dg_ = std::fma(Sd[e], dS[e], dg_);
              dS[e] *= decay;
            }
            dG[i] = dg_;
          }
        }
        for (int64_t i = 0; i < L; ++i) {
          store_doubles(&dV[i * V], dv.ptr(b, s.t0 + i, hv), dv.dtype, V);
          if (dbeta.defined()) store_doubles(&dB[i], dbeta.ptr(b, s.t0 + i, hv), dbeta.dtype, 1);
          if (dg.defined()) store_doubles(&dG[i], dg.ptr(b, s.t0 + i, hv), dg.dtype, 1);
        }
        if (dh0.defined()) store_mat(dh0, n * HV + hv, dS);
      }
      for (int64_t i = 0; i < L; ++i) {
        store_doubles(&dQ[i * K], dq.ptr(b, s.t0 + i, hh), dq.dtype, K);
        store_doubles(&dK[i * K], dk.ptr(b, s.t0 + i, hh), dk.dtype, K);
      }
    }
  }
}

void top_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a) {
  compose_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace

void register_ref_bwd(Registry& r) {
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64},
                   kPriorityRef};
  r.add<PrepareWyReprBwdArgs>("recompute_w_u", Direction::kBackward, spec, nullptr, wy_bwd);
  r.add<ChunkBwdDvLocalArgs>("chunk_bwd_dv_local", Direction::kBackward, spec, nullptr, dv_local);
  r.add<ChunkBwdDqkwgArgs>("chunk_bwd_dqkwg", Direction::kBackward, spec, nullptr, dqkwg);
  r.add<GdnGateBwdArgs>("gdn_gate", Direction::kBackward, spec, nullptr, gate_bwd);
  r.add<FusedRecurrentGatedDeltaRuleBwdArgs>("fused_recurrent_gated_delta_rule",
                                             Direction::kBackward, spec, nullptr, recurrent_bwd);
  r.add<ChunkGatedDeltaRuleBwdArgs>("chunk_gated_delta_rule", Direction::kBackward, spec, nullptr,
                                    top_bwd);
}

}  // namespace fusedops::gdn::ref

namespace fusedops::gdn {
void register_ref_bwd(Registry& r) { ref::register_ref_bwd(r); }
}  // namespace fusedops::gdn
