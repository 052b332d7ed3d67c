// Gated delta rule sub-operators: every runnable backend against float64 oracles written here
// (plain loops over the chunks of each sequence, following docs/specs/linear_attention.md sections 2-8 and
// 11), with the base of the precision policy = the same loops rounding every intermediate to the
// input dtype. Fixed length and varlen (with an empty sequence), partial chunks, grouped value
// heads, K/V that are not multiples of the vector width, NaN-poisoned outputs, errors.
#include <cmath>
#include <functional>
#include <random>
#include <tuple>

#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/linear_attention/la_cpu_kernels.h"
#include "tests/cpp/ops/linear_attention_harness.h"

namespace fusedops::testing {
namespace {

using namespace linear_attention;

// ---------------------------------------------------------------------------------------------
// Oracles (each rounds every intermediate with rd).

Vec o_cumsum(const Vec& g, const Layout& L, int64_t H, int64_t D, bool reverse, double scale, Rd rd) {
  Vec out(g.size(), 0.0);
  const At at{L.T, H, D};
  for (const TChunk& c : all_chunks(L))
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t s = 0; s < c.len; ++s) {
          const int64_t i = reverse ? c.len - 1 - s : s;
          acc = rd(acc + g[at(c.b, c.t0 + i, h, d)]);
          out[at(c.b, c.t0 + i, h, d)] = rd(acc * scale);
        }
      }
  return out;
}

double gam(const Vec& g, const At& at, const TChunk& c, int64_t hv, int64_t i, int64_t j, Rd rd) {
  if (g.empty()) return 1.0;
  return rd(std::exp(rd(g[at(c.b, c.t0 + i, hv)] - g[at(c.b, c.t0 + j, hv)])));
}

double dotr(const Vec& a, int64_t ia, const Vec& b, int64_t ib, int64_t n, Rd rd) {
  double s = 0;
  for (int64_t x = 0; x < n; ++x) s = rd(s + rd(a[ia + x] * b[ib + x]));
  return s;
}

Vec o_kkt(const Vec& k, const Vec& beta, const Vec& g, const Layout& L, Rd rd) {
  Vec A(L.B * L.T * L.HV * L.BT, 0.0);
  const At ak{L.T, L.H, L.K}, as{L.T, L.HV, 1}, aA{L.T, L.HV, L.BT};
  const int64_t G = L.HV / L.H;
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv)
      for (int64_t i = 0; i < c.len; ++i)
        for (int64_t j = 0; j < i; ++j) {
          const double kk = dotr(k, ak(c.b, c.t0 + i, hv / G), k, ak(c.b, c.t0 + j, hv / G), L.K, rd);
          A[aA(c.b, c.t0 + i, hv, j)] =
              rd(rd(beta[as(c.b, c.t0 + i, hv)] * kk) * gam(g, as, c, hv, i, j, rd));
        }
  return A;
}

Vec o_solve(const Vec& A, const Layout& L, int64_t H, Rd rd) {
  Vec X(A.size(), 0.0);
  const At aA{L.T, H, L.BT};
  for (const TChunk& c : all_chunks(L))
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < c.len; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          double s = i == j ? 1.0 : 0.0;
          for (int64_t m = j; m < i; ++m)
            s = rd(s - rd(A[aA(c.b, c.t0 + i, h, m)] * X[aA(c.b, c.t0 + m, h, j)]));
          X[aA(c.b, c.t0 + i, h, j)] = s;
        }
  return X;
}

void o_wu(const Vec& k, const Vec& v, const Vec& beta, const Vec& A, const Vec& g, const Layout& L,
          Rd rd, Vec& w, Vec& u) {
  w.assign(L.B * L.T * L.HV * L.K, 0.0);
  u.assign(L.B * L.T * L.HV * L.V, 0.0);
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, aw{L.T, L.HV, L.K}, as{L.T, L.HV, 1},
      aA{L.T, L.HV, L.BT};
  const int64_t G = L.HV / L.H;
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv)
      for (int64_t i = 0; i < c.len; ++i) {
        for (int64_t x = 0; x < L.K; ++x) {
          double s = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const double eg = g.empty() ? 1.0 : rd(std::exp(g[as(c.b, c.t0 + j, hv)]));
            const double kb = rd(rd(beta[as(c.b, c.t0 + j, hv)] * eg) * k[ak(c.b, c.t0 + j, hv / G, x)]);
            s = rd(s + rd(A[aA(c.b, c.t0 + i, hv, j)] * kb));
          }
          w[aw(c.b, c.t0 + i, hv, x)] = s;
        }
        for (int64_t x = 0; x < L.V; ++x) {
          double s = 0;
          for (int64_t j = 0; j <= i; ++j)
            s = rd(s + rd(A[aA(c.b, c.t0 + i, hv, j)] *
                          rd(beta[as(c.b, c.t0 + j, hv)] * v[av(c.b, c.t0 + j, hv, x)])));
          u[av(c.b, c.t0 + i, hv, x)] = s;
        }
      }
}

// fwd_h: h [.., NT, HV, K, V] snapshots, v_new, ht.
void o_fwd_h(const Vec& k, const Vec& w, const Vec& u, const Vec& g, const Vec& h0, const Layout& L,
             Rd rd, Vec& h, Vec& vn, Vec& ht) {
  const int64_t KV = L.K * L.V, NT = snapshots(L), Bh = L.cu.empty() ? L.B : 1;
  h.assign(Bh * NT * L.HV * KV, 0.0);
  vn.assign(L.B * L.T * L.HV * L.V, 0.0);
  ht.assign(L.N() * L.HV * KV, 0.0);
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, aw{L.T, L.HV, L.K}, as{L.T, L.HV, 1};
  const int64_t G = L.HV / L.H;
  const auto seqs = seq_chunks(L);
  for (int64_t n = 0; n < L.N(); ++n)
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      Vec X(KV, 0.0);
      if (!h0.empty()) std::copy(h0.begin() + (n * L.HV + hv) * KV, h0.begin() + (n * L.HV + hv + 1) * KV, X.begin());
      for (const TChunk& c : seqs[n]) {
        std::copy(X.begin(), X.end(), h.begin() + (c.idx * L.HV + hv) * KV);
        Vec Vn(c.len * L.V);
        for (int64_t i = 0; i < c.len; ++i)
          for (int64_t x = 0; x < L.V; ++x) {
            double s = 0;
            for (int64_t y = 0; y < L.K; ++y) s = rd(s + rd(w[aw(c.b, c.t0 + i, hv, y)] * X[y * L.V + x]));
            Vn[i * L.V + x] = rd(u[av(c.b, c.t0 + i, hv, x)] - s);
            vn[av(c.b, c.t0 + i, hv, x)] = Vn[i * L.V + x];
          }
        const int64_t last = c.len - 1;
        const double gl = g.empty() ? 0.0 : g[as(c.b, c.t0 + last, hv)];
        for (int64_t i = 0; i < c.len; ++i) {
          const double f = g.empty() ? 1.0 : rd(std::exp(rd(gl - g[as(c.b, c.t0 + i, hv)])));
          for (int64_t x = 0; x < L.V; ++x) Vn[i * L.V + x] = rd(Vn[i * L.V + x] * f);
        }
        const double d = rd(std::exp(gl));
        for (int64_t y = 0; y < L.K; ++y)
          for (int64_t x = 0; x < L.V; ++x) {
            double s = rd(X[y * L.V + x] * d);
            for (int64_t i = 0; i < c.len; ++i)
              s = rd(s + rd(k[ak(c.b, c.t0 + i, hv / G, y)] * Vn[i * L.V + x]));
            X[y * L.V + x] = s;
          }
      }
      std::copy(X.begin(), X.end(), ht.begin() + (n * L.HV + hv) * KV);
    }
}

// chunk_fwd_o.
Vec o_fwd_o(const Vec& q, const Vec& k, const Vec& vn, const Vec& h, const Vec& g, double scale,
            const Layout& L, Rd rd) {
  Vec o(L.B * L.T * L.HV * L.V, 0.0);
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, as{L.T, L.HV, 1};
  const int64_t G = L.HV / L.H, KV = L.K * L.V;
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const double* S = &h[(c.idx * L.HV + hv) * KV];
      for (int64_t i = 0; i < c.len; ++i) {
        const double eg = g.empty() ? 1.0 : rd(std::exp(g[as(c.b, c.t0 + i, hv)]));
        Vec p(i + 1);  // the (i, j) factors, the same for every x
        for (int64_t j = 0; j <= i; ++j)
          p[j] = rd(dotr(q, ak(c.b, c.t0 + i, hv / G), k, ak(c.b, c.t0 + j, hv / G), L.K, rd) *
                    gam(g, as, c, hv, i, j, rd));
        for (int64_t x = 0; x < L.V; ++x) {
          double s = 0;
          for (int64_t y = 0; y < L.K; ++y) s = rd(s + rd(q[ak(c.b, c.t0 + i, hv / G, y)] * S[y * L.V + x]));
          double t = rd(eg * s);
          for (int64_t j = 0; j <= i; ++j) t = rd(t + rd(p[j] * vn[av(c.b, c.t0 + j, hv, x)]));
          o[av(c.b, c.t0 + i, hv, x)] = rd(scale * t);
        }
      }
    }
  return o;
}

// chunk_bwd_dv_local.
Vec o_dv_local(const Vec& q, const Vec& k, const Vec& dO, const Vec& g, double scale, const Layout& L,
               Rd rd) {
  Vec dv(L.B * L.T * L.HV * L.V, 0.0);
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, as{L.T, L.HV, 1};
  const int64_t G = L.HV / L.H;
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv)
      for (int64_t j = 0; j < c.len; ++j) {
        Vec p(c.len, 0.0);  // the (i, j) factors, the same for every x
        for (int64_t i = j; i < c.len; ++i)
          p[i] = rd(rd(scale * dotr(q, ak(c.b, c.t0 + i, hv / G), k, ak(c.b, c.t0 + j, hv / G), L.K, rd)) *
                    gam(g, as, c, hv, i, j, rd));
        for (int64_t x = 0; x < L.V; ++x) {
          double s = 0;
          for (int64_t i = j; i < c.len; ++i) s = rd(s + rd(p[i] * dO[av(c.b, c.t0 + i, hv, x)]));
          dv[av(c.b, c.t0 + j, hv, x)] = s;
        }
      }
  return dv;
}

// chunk_gated_delta_rule_bwd_dhu: dh, dh0, dv2.
void o_bwd_dhu(const Vec& q, const Vec& k, const Vec& w, const Vec& dO, const Vec& dvl, const Vec& g,
               const Vec& dht, double scale, const Layout& L, Rd rd, Vec& dh, Vec& dh0, Vec& dv2) {
  const int64_t KV = L.K * L.V, NT = snapshots(L), Bh = L.cu.empty() ? L.B : 1;
  dh.assign(Bh * NT * L.HV * KV, 0.0);
  dh0.assign(L.N() * L.HV * KV, 0.0);
  dv2.assign(L.B * L.T * L.HV * L.V, 0.0);
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, aw{L.T, L.HV, L.K}, as{L.T, L.HV, 1};
  const int64_t G = L.HV / L.H;
  const auto seqs = seq_chunks(L);
  for (int64_t n = 0; n < L.N(); ++n)
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      Vec X(KV, 0.0);
      if (!dht.empty()) std::copy(dht.begin() + (n * L.HV + hv) * KV, dht.begin() + (n * L.HV + hv + 1) * KV, X.begin());
      for (auto it = seqs[n].rbegin(); it != seqs[n].rend(); ++it) {
        const TChunk& c = *it;
        std::copy(X.begin(), X.end(), dh.begin() + (c.idx * L.HV + hv) * KV);
        const int64_t last = c.len - 1;
        const double gl = g.empty() ? 0.0 : g[as(c.b, c.t0 + last, hv)];
        for (int64_t i = 0; i < c.len; ++i) {
          const double f = g.empty() ? 1.0 : rd(std::exp(rd(gl - g[as(c.b, c.t0 + i, hv)])));
          for (int64_t x = 0; x < L.V; ++x) {
            double s = 0;
            for (int64_t y = 0; y < L.K; ++y) s = rd(s + rd(k[ak(c.b, c.t0 + i, hv / G, y)] * X[y * L.V + x]));
            dv2[av(c.b, c.t0 + i, hv, x)] = rd(dvl[av(c.b, c.t0 + i, hv, x)] + rd(f * s));
          }
        }
        const double d = rd(std::exp(gl));
        Vec Xn(KV);
        for (int64_t y = 0; y < L.K; ++y)
          for (int64_t x = 0; x < L.V; ++x) {
            double s = rd(d * X[y * L.V + x]);
            for (int64_t i = 0; i < c.len; ++i) {
              const double eg = g.empty() ? 1.0 : rd(std::exp(g[as(c.b, c.t0 + i, hv)]));
              const double qg = rd(rd(scale * eg) * q[ak(c.b, c.t0 + i, hv / G, y)]);
              s = rd(s + rd(qg * dO[av(c.b, c.t0 + i, hv, x)]));
              s = rd(s - rd(w[aw(c.b, c.t0 + i, hv, y)] * dv2[av(c.b, c.t0 + i, hv, x)]));
            }
            Xn[y * L.V + x] = s;
          }
        X = Xn;
      }
      std::copy(X.begin(), X.end(), dh0.begin() + (n * L.HV + hv) * KV);
    }
}

// chunk_bwd_dqkwg: dq, dk (group sums), dw, dg.
void o_dqkwg(const Vec& q, const Vec& k, const Vec& vn, const Vec& dO, const Vec& h, const Vec& dh,
             const Vec& dv2, const Vec& g, double scale, const Layout& L, Rd rd, Vec& dq, Vec& dk,
             Vec& dw, Vec& dg) {
  dq.assign(L.B * L.T * L.H * L.K, 0.0);
  dk = dq;
  dw.assign(L.B * L.T * L.HV * L.K, 0.0);
  dg.assign(L.B * L.T * L.HV, 0.0);
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, aw{L.T, L.HV, L.K}, as{L.T, L.HV, 1};
  const int64_t G = L.HV / L.H, KV = L.K * L.V;
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t hh = hv / G, n = c.len, last = n - 1;
      const double* S = &h[(c.idx * L.HV + hv) * KV];
      const double* dH = &dh[(c.idx * L.HV + hv) * KV];
      auto gv = [&](int64_t i) { return g.empty() ? 0.0 : g[as(c.b, c.t0 + i, hv)]; };
      Vec Ds(n * n, 0.0), dQ(n * L.K), dK(n * L.K), dKi(n * L.K);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= i; ++j)
          Ds[i * n + j] = rd(rd(scale * gam(g, as, c, hv, i, j, rd)) *
                             dotr(dO, av(c.b, c.t0 + i, hv), vn, av(c.b, c.t0 + j, hv), L.V, rd));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t y = 0; y < L.K; ++y) {
          double sdo = 0, vdh = 0, dws = 0;
          for (int64_t x = 0; x < L.V; ++x) {
            sdo = rd(sdo + rd(dO[av(c.b, c.t0 + i, hv, x)] * S[y * L.V + x]));
            vdh = rd(vdh + rd(vn[av(c.b, c.t0 + i, hv, x)] * dH[y * L.V + x]));
            dws = rd(dws + rd(dv2[av(c.b, c.t0 + i, hv, x)] * S[y * L.V + x]));
          }
          double dqv = rd(rd(scale * rd(std::exp(gv(i)))) * sdo);
          for (int64_t j = 0; j <= i; ++j) dqv = rd(dqv + rd(Ds[i * n + j] * k[ak(c.b, c.t0 + j, hh, y)]));
          dQ[i * L.K + y] = dqv;
          dKi[i * L.K + y] = rd(rd(std::exp(rd(gv(last) - gv(i)))) * vdh);
          double dkv = dKi[i * L.K + y];
          for (int64_t j = i; j < n; ++j) dkv = rd(dkv + rd(Ds[j * n + i] * q[ak(c.b, c.t0 + j, hh, y)]));
          dK[i * L.K + y] = dkv;
          dw[aw(c.b, c.t0 + i, hv, y)] = -dws;
        }
      double sdh = 0, dkik = 0;
      for (int64_t e = 0; e < KV; ++e) sdh = rd(sdh + rd(S[e] * dH[e]));
      for (int64_t i = 0; i < n; ++i) {
        double dgi = 0;
        for (int64_t y = 0; y < L.K; ++y) {
          dgi = rd(dgi + rd(dQ[i * L.K + y] * q[ak(c.b, c.t0 + i, hh, y)]) -
                   rd(dK[i * L.K + y] * k[ak(c.b, c.t0 + i, hh, y)]));
          dkik = rd(dkik + rd(dKi[i * L.K + y] * k[ak(c.b, c.t0 + i, hh, y)]));
          dq[ak(c.b, c.t0 + i, hh, y)] = rd(dq[ak(c.b, c.t0 + i, hh, y)] + dQ[i * L.K + y]);
          dk[ak(c.b, c.t0 + i, hh, y)] = rd(dk[ak(c.b, c.t0 + i, hh, y)] + dK[i * L.K + y]);
        }
        dg[as(c.b, c.t0 + i, hv)] = dgi;
      }
      dg[as(c.b, c.t0 + last, hv)] =
          rd(dg[as(c.b, c.t0 + last, hv)] + rd(rd(std::exp(gv(last))) * sdh) + dkik);
    }
}

// prepare_wy_repr_bwd: dk (group sums), dv, dbeta, dg.
void o_wy_bwd(const Vec& k, const Vec& v, const Vec& beta, const Vec& A, const Vec& g, const Vec& dW,
              const Vec& dU, const Layout& L, Rd rd, Vec& dk, Vec& dv, Vec& db, Vec& dg) {
  dk.assign(L.B * L.T * L.H * L.K, 0.0);
  dv.assign(L.B * L.T * L.HV * L.V, 0.0);
  db.assign(L.B * L.T * L.HV, 0.0);
  dg = db;
  const At ak{L.T, L.H, L.K}, av{L.T, L.HV, L.V}, aw{L.T, L.HV, L.K}, as{L.T, L.HV, 1},
      aA{L.T, L.HV, L.BT};
  const int64_t G = L.HV / L.H;
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t hh = hv / G, n = c.len;
      auto Am = [&](int64_t i, int64_t j) { return j <= i ? A[aA(c.b, c.t0 + i, hv, j)] : 0.0; };
      auto b = [&](int64_t i) { return beta[as(c.b, c.t0 + i, hv)]; };
      auto eg = [&](int64_t i) { return g.empty() ? 1.0 : rd(std::exp(g[as(c.b, c.t0 + i, hv)])); };
      auto kx = [&](int64_t i, int64_t x) { return k[ak(c.b, c.t0 + i, hh, x)]; };
      Vec dA(n * n, 0.0), dK(n * L.K, 0.0), dB(n, 0.0), dG(n, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) {
          double s = 0;
          for (int64_t x = 0; x < L.K; ++x)
            s = rd(s + rd(dW[aw(c.b, c.t0 + i, hv, x)] * rd(rd(b(j) * eg(j)) * kx(j, x))));
          for (int64_t x = 0; x < L.V; ++x)
            s = rd(s + rd(dU[av(c.b, c.t0 + i, hv, x)] * rd(b(j) * v[av(c.b, c.t0 + j, hv, x)])));
          dA[i * n + j] = s;
        }
      for (int64_t j = 0; j < n; ++j) {
        double rk = 0, rkb = 0, pv = 0;
        for (int64_t x = 0; x < L.K; ++x) {
          double r = 0;
          for (int64_t i = j; i < n; ++i) r = rd(r + rd(Am(i, j) * dW[aw(c.b, c.t0 + i, hv, x)]));
          dK[j * L.K + x] = rd(rd(b(j) * eg(j)) * r);
          rk = rd(rk + rd(r * kx(j, x)));
          rkb = rd(rkb + rd(r * rd(rd(b(j) * eg(j)) * kx(j, x))));
        }
        for (int64_t x = 0; x < L.V; ++x) {
          double p = 0;
          for (int64_t i = j; i < n; ++i) p = rd(p + rd(Am(i, j) * dU[av(c.b, c.t0 + i, hv, x)]));
          dv[av(c.b, c.t0 + j, hv, x)] = rd(b(j) * p);
          pv = rd(pv + rd(p * v[av(c.b, c.t0 + j, hv, x)]));
        }
        dB[j] = rd(rd(rk * eg(j)) + pv);
        dG[j] = rkb;
      }
      // dL = -M> . (A^T (M>.dA) A^T)
      Vec T1(n * n, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t m = 0; m < n; ++m) s = rd(s + rd(Am(m, i) * dA[m * n + j]));
          T1[i * n + j] = s;
        }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) {
          double s = 0;
          for (int64_t m = 0; m < n; ++m) s = rd(s + rd(T1[i * n + m] * Am(j, m)));
          const double dl = -s;
          double kk = 0;
          for (int64_t x = 0; x < L.K; ++x) kk = rd(kk + rd(kx(i, x) * kx(j, x)));
          const double gij = gam(g, as, c, hv, i, j, rd);
          const double dm = rd(dl * gij);
          for (int64_t x = 0; x < L.K; ++x) {
            dK[i * L.K + x] = rd(dK[i * L.K + x] + rd(rd(b(i) * dm) * kx(j, x)));
            dK[j * L.K + x] = rd(dK[j * L.K + x] + rd(rd(dm * b(i)) * kx(i, x)));
          }
          dB[i] = rd(dB[i] + rd(dm * kk));
          const double dll = rd(dl * rd(rd(rd(b(i) * kk)) * gij));
          dG[i] = rd(dG[i] + dll);
          dG[j] = rd(dG[j] - dll);
        }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t x = 0; x < L.K; ++x) dk[ak(c.b, c.t0 + i, hh, x)] = rd(dk[ak(c.b, c.t0 + i, hh, x)] + dK[i * L.K + x]);
        db[as(c.b, c.t0 + i, hv)] = dB[i];
        dg[as(c.b, c.t0 + i, hv)] = dG[i];
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Inputs

struct Inputs {
  Vec q, k, v, beta, graw, g, h0, dO, dht, A;  // g = chunk-local cumsum of graw
};

Inputs make_inputs(const Layout& L, uint64_t seed, DType dt) {
  std::mt19937_64 gen(seed);
  Inputs in;
  const int64_t BTn = L.B * L.T;
  in.q = normal(BTn * L.H * L.K, gen, 0.1);
  in.k = normal(BTn * L.H * L.K, gen, 0.1);
  normalize_rows(in.q, L.K);
  normalize_rows(in.k, L.K);
  in.q = stored(in.q, dt);
  in.k = stored(in.k, dt);
  in.v = stored(normal(BTn * L.HV * L.V, gen, 0.2), dt);
  Vec b = normal(BTn * L.HV, gen);
  for (double& e : b) e = 1.0 / (1.0 + std::exp(-e));
  in.beta = stored(b, dt);
  Vec g = normal(BTn * L.HV, gen, 0.0, 1.0);
  for (double& e : g) e = -0.05 - 0.1 * std::log1p(std::exp(e));  // log decays in (-inf, -0.05)
  in.graw = stored(g, dt);
  in.g = o_cumsum(in.graw, L, L.HV, 1, false, 1.0, Rd{DType::kFloat32});
  in.h0 = stored(normal(L.N() * L.HV * L.K * L.V, gen, 0.0, 0.5), f32or(dt));
  in.dO = stored(normal(BTn * L.HV * L.V, gen), dt);
  in.dht = stored(normal(L.N() * L.HV * L.K * L.V, gen), f32or(dt));
  // A = (I + kkt)^{-1} in float64 from the stored inputs, stored in dt.
  in.A = stored(o_solve(o_kkt(in.k, in.beta, in.g, L, Rd{DType::kFloat64}), L, L.HV, Rd{DType::kFloat64}), dt);
  return in;
}

std::vector<Case> cases() {
  return {
      {{2, 41, 2, 4, 24, 20, 32, {}}, "B2 T41 GVA2 K24 V20 BT32"},
      {{1, 60, 2, 2, 20, 36, 16, {0, 15, 15, 37, 60}}, "varlen [0,15,15,37,60] BT16"},
      {{1, 80, 1, 1, 32, 48, 64, {}}, "B1 T80 K32 V48 BT64"},
      {{1, 1, 1, 3, 8, 8, 64, {}}, "single token GVA3"},
      // K and V above one 64-wide slice and not multiples of it (the device kernels' tile loops).
      {{1, 70, 1, 2, 100, 130, 64, {0, 3, 70}}, "varlen [0,3,70] GVA2 K100 V130 BT64"},
      // K = V = 128 at chunk 64: the shape of the CUDA backend's 16-bit tensor-core kernels. The
      // other backends and dtypes run the same code as for the cases above.
      {{2, 100, 2, 2, 128, 128, 64, {}}, "B2 T100 K128 V128 BT64", true},
      // Its second sequence has 6 chunks: the state kernels' steady state with 3 or 4 stages.
      {{1, 400, 1, 2, 128, 128, 64, {0, 70, 400}}, "varlen [0,70,400] GVA2 K128 V128 BT64", true},
  };
}

template <class Fn>
void for_each_case(const std::string& op, Direction dir, Fn&& fn) {
  linear_attention::for_each_case(cases(), op, dir, fn);
}

void expect_close(const char* what, const TestTensor& ours, const Vec& base, const Vec& ref, DType dt) {
  linear_attention::expect_close(what, ours, base, ref, dt, 1e-12);
}

// ---------------------------------------------------------------------------------------------

TEST(GatedDeltaRuleSubops, ChunkLocalCumsumScalarVectorReverse) {
  for_each_case("chunk_local_cumsum", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device, DType::kInt64);
    std::mt19937_64 gen(7);
    // S = 67: more channels (HV * 67) than one CUDA block's 128, not a multiple of 32.
    for (int64_t S : {int64_t{1}, int64_t{5}, int64_t{67}})
      for (bool reverse : {false, true}) {
        std::vector<int64_t> shape = {L.B, L.T, L.HV};
        if (S > 1) shape.push_back(S);
        const Vec g = stored(normal(L.B * L.T * L.HV * S, gen, -0.3), dt);
        TestTensor gt = tensor(dt, shape, g, b.device);
        TestTensor out = poisoned(DType::kFloat32, shape, b.device);
        const double scale = reverse ? 1.0 : 1.4426950216;
        chunk_local_cumsum(b.ctx(), {gt.view(), out.view(), ix.cuv(), ix.ci.numel() ? ix.ci.view() : TensorView(),
                                     L.BT, reverse, scale});
        expect_close(reverse ? "reverse" : "forward", out,
                     o_cumsum(g, L, L.HV, S, reverse, scale, Rd{dt == DType::kFloat64 ? dt : DType::kFloat32}),
                     o_cumsum(g, L, L.HV, S, reverse, scale, Rd{DType::kFloat64}), DType::kFloat32);
      }
  });
}

TEST(GatedDeltaRuleSubops, ReverseCumsumIsATrueSuffixSum) {
  for (const auto& b : runnable_backends("chunk_local_cumsum", Direction::kForward)) {
    SCOPED_TRACE(b.id);
    const int64_t T = 64;
    Vec g(T, 1.0);
    for (int64_t t = 0; t < 32; ++t) g[t] = 1e8;
    TestTensor gt = tensor(DType::kFloat32, {1, T, 1}, g, b.device);
    TestTensor out = poisoned(DType::kFloat32, {1, T, 1}, b.device);
    chunk_local_cumsum(b.ctx(), {gt.view(), out.view(), {}, {}, 64, true, 1.0});
    const Vec o = out.to_double();
    for (int64_t t = 32; t < T; ++t) EXPECT_EQ(o[t], static_cast<double>(T - t)) << "t=" << t;
  }
}

TEST(GatedDeltaRuleSubops, ScaledDotKktAndSolveTril) {
  for_each_case("chunk_scaled_dot_kkt", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device, DType::kInt32);
    const TensorView ci = ix.ci.numel() ? ix.ci.view() : TensorView();
    const Inputs in = make_inputs(L, 11, dt);
    const Rd r64{DType::kFloat64}, rdt{dt};
    TestTensor k = tensor(dt, {L.B, L.T, L.H, L.K}, in.k, b.device);
    TestTensor beta = tensor(dt, {L.B, L.T, L.HV}, in.beta, b.device);
    TestTensor g = tensor(DType::kFloat32, {L.B, L.T, L.HV}, in.g, b.device);
    for (bool with_g : {true, false}) {
      TestTensor A = poisoned(DType::kFloat32, {L.B, L.T, L.HV, L.BT}, b.device);
      chunk_scaled_dot_kkt_fwd(b.ctx(), {k.view(), beta.view(), with_g ? g.view() : TensorView(), A.view(),
                                         ix.cuv(), ci, L.BT});
      const Vec gg = with_g ? in.g : Vec();
      expect_close("kkt A", A, o_kkt(in.k, in.beta, gg, L, rdt), o_kkt(in.k, in.beta, gg, L, r64), dt);
    }
    // solve_tril of the float64 kkt (stored in dt), output in dt.
    if (!backend_takes("solve_tril", Direction::kForward, b.id, dt)) return;
    const Vec Lm = stored(o_kkt(in.k, in.beta, in.g, L, r64), dt);
    TestTensor At = tensor(dt, {L.B, L.T, L.HV, L.BT}, Lm, b.device);
    TestTensor Ai = poisoned(dt, {L.B, L.T, L.HV, L.BT}, b.device);
    solve_tril(b.ctx(), {At.view(), Ai.view(), ix.cuv(), ci});
    expect_close("solve_tril", Ai, stored(o_solve(Lm, L, L.HV, rdt), dt), o_solve(Lm, L, L.HV, r64), dt);
  });
}

TEST(GatedDeltaRuleSubops, RecomputeWUForwardAndBackward) {
  for_each_case("recompute_w_u", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device, DType::kInt64);
    const TensorView ci = ix.ci.numel() ? ix.ci.view() : TensorView();
    const Inputs in = make_inputs(L, 21, dt);
    const Rd r64{DType::kFloat64}, rdt{dt};
    TestTensor k = tensor(dt, {L.B, L.T, L.H, L.K}, in.k, b.device);
    TestTensor v = tensor(dt, {L.B, L.T, L.HV, L.V}, in.v, b.device);
    TestTensor beta = tensor(dt, {L.B, L.T, L.HV}, in.beta, b.device);
    TestTensor g = tensor(DType::kFloat32, {L.B, L.T, L.HV}, in.g, b.device);
    TestTensor A = tensor(dt, {L.B, L.T, L.HV, L.BT}, in.A, b.device);
    std::mt19937_64 gen(5);
    const Vec dW = stored(normal(L.B * L.T * L.HV * L.K, gen), dt), dU = stored(normal(L.B * L.T * L.HV * L.V, gen), dt);
    TestTensor dw = tensor(dt, {L.B, L.T, L.HV, L.K}, dW, b.device), du = tensor(dt, {L.B, L.T, L.HV, L.V}, dU, b.device);
    for (bool with_g : {true, false}) {
      const Vec gg = with_g ? in.g : Vec();
      const TensorView gv = with_g ? g.view() : TensorView();
      TestTensor w = poisoned(dt, {L.B, L.T, L.HV, L.K}, b.device), u = poisoned(dt, {L.B, L.T, L.HV, L.V}, b.device);
      recompute_w_u_fwd(b.ctx(), {k.view(), v.view(), beta.view(), A.view(), gv, w.view(), u.view(), ix.cuv(), ci});
      Vec w64, u64, wb, ub;
      o_wu(in.k, in.v, in.beta, in.A, gg, L, r64, w64, u64);
      o_wu(in.k, in.v, in.beta, in.A, gg, L, rdt, wb, ub);
      expect_close("w", w, wb, w64, dt);
      expect_close("u", u, ub, u64, dt);
      if (!backend_takes("recompute_w_u", Direction::kBackward, b.id, dt)) continue;
      for (bool acc : {false, true}) {
        TestTensor dk = poisoned(dt, {L.B, L.T, L.H, L.K}, b.device), dv = poisoned(dt, {L.B, L.T, L.HV, L.V}, b.device);
        TestTensor db = poisoned(DType::kFloat32, {L.B, L.T, L.HV}, b.device), dg = poisoned(DType::kFloat32, {L.B, L.T, L.HV}, b.device);
        Vec dk0, dg0;
        if (acc) {
          dk0 = stored(normal(L.B * L.T * L.H * L.K, gen), dt);
          dg0 = stored(normal(L.B * L.T * L.HV, gen), DType::kFloat32);
          dk.set(dk0);
          dg.set(dg0);
          dk = dk.to(b.device);
          dg = dg.to(b.device);
        }
        prepare_wy_repr_bwd(b.ctx(), {k.view(), v.view(), beta.view(), A.view(), gv, dw.view(), du.view(), dk.view(),
                                      dv.view(), db.view(), with_g ? dg.view() : TensorView(), ix.cuv(), ci, acc});
        Vec k64, v64, b64, g64, kb, vb, bb, gb;
        o_wy_bwd(in.k, in.v, in.beta, in.A, gg, dW, dU, L, r64, k64, v64, b64, g64);
        o_wy_bwd(in.k, in.v, in.beta, in.A, gg, dW, dU, L, rdt, kb, vb, bb, gb);
        if (acc) {
          for (size_t i = 0; i < k64.size(); ++i) {
            k64[i] += dk0[i];
            kb[i] = rdt(kb[i] + dk0[i]);
          }
          for (size_t i = 0; i < g64.size(); ++i) {
            g64[i] += dg0[i];
            gb[i] = rdt(gb[i] + dg0[i]);
          }
        }
        expect_close("wy dk", dk, kb, k64, dt);
        expect_close("wy dv", dv, vb, v64, dt);
        expect_close("wy dbeta", db, bb, b64, dt);
        if (with_g) expect_close("wy dg", dg, gb, g64, dt);
      }
    }
  });
}

TEST(GatedDeltaRuleSubops, FwdHFwdOAndTheirBackwardPieces) {
  for_each_case("chunk_gated_delta_rule_fwd_h", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device, DType::kInt64);
    const TensorView ci = ix.ci.numel() ? ix.ci.view() : TensorView();
    const TensorView co = ix.co.numel() ? ix.co.view() : TensorView();
    const Inputs in = make_inputs(L, 31, dt);
    const Rd r64{DType::kFloat64}, rdt{dt};
    const double scale = 1.0 / std::sqrt(static_cast<double>(L.K));
    const int64_t NT = snapshots(L), Bh = L.cu.empty() ? L.B : 1;
    Vec w64, u64;
    o_wu(in.k, in.v, in.beta, in.A, in.g, L, r64, w64, u64);
    const Vec w = stored(w64, dt), u = stored(u64, dt);
    TestTensor q = tensor(dt, {L.B, L.T, L.H, L.K}, in.q, b.device), k = tensor(dt, {L.B, L.T, L.H, L.K}, in.k, b.device);
    TestTensor wt = tensor(dt, {L.B, L.T, L.HV, L.K}, w, b.device), ut = tensor(dt, {L.B, L.T, L.HV, L.V}, u, b.device);
    TestTensor g = tensor(DType::kFloat32, {L.B, L.T, L.HV}, in.g, b.device);
    TestTensor h0 = tensor(f32or(dt), {L.N(), L.HV, L.K, L.V}, in.h0, b.device);
    for (bool with_g : {true, false}) {
      SCOPED_TRACE(with_g ? "g" : "no g");
      const Vec gg = with_g ? in.g : Vec();
      const TensorView gv = with_g ? g.view() : TensorView();
      // fwd_h
      TestTensor h = poisoned(dt, {Bh, NT, L.HV, L.K, L.V}, b.device), vn = poisoned(dt, {L.B, L.T, L.HV, L.V}, b.device);
      TestTensor ht = poisoned(DType::kFloat32, {L.N(), L.HV, L.K, L.V}, b.device);
      chunk_gated_delta_rule_fwd_h(b.ctx(), {k.view(), wt.view(), ut.view(), gv, {}, h0.view(), h.view(), vn.view(),
                                             ht.view(), ix.cuv(), co, L.BT});
      Vec h64, vn64, ht64, hb, vnb, htb;
      o_fwd_h(in.k, w, u, gg, in.h0, L, r64, h64, vn64, ht64);
      o_fwd_h(in.k, w, u, gg, in.h0, L, rdt, hb, vnb, htb);
      expect_close("h", h, hb, h64, dt);
      expect_close("v_new", vn, vnb, vn64, dt);
      expect_close("ht", ht, htb, ht64, dt);
      // fwd_o on the float64 h / v_new (stored in dt)
      const Vec hs = stored(h64, dt), vns = stored(vn64, dt);
      TestTensor ht_in = tensor(dt, {Bh, NT, L.HV, L.K, L.V}, hs, b.device), vn_in = tensor(dt, {L.B, L.T, L.HV, L.V}, vns, b.device);
      TestTensor o = poisoned(dt, {L.B, L.T, L.HV, L.V}, b.device);
      chunk_fwd_o(b.ctx(), {q.view(), k.view(), vn_in.view(), ht_in.view(), gv, o.view(), ix.cuv(), ci, scale, L.BT});
      expect_close("o", o, o_fwd_o(in.q, in.k, vns, hs, gg, scale, L, rdt), o_fwd_o(in.q, in.k, vns, hs, gg, scale, L, r64), dt);
      // dv_local
      TestTensor dO = tensor(dt, {L.B, L.T, L.HV, L.V}, in.dO, b.device);
      TestTensor dvl = poisoned(dt, {L.B, L.T, L.HV, L.V}, b.device);
      chunk_bwd_dv_local(b.ctx(), {q.view(), k.view(), dO.view(), gv, dvl.view(), ix.cuv(), ci, scale, L.BT});
      const Vec dvl64 = o_dv_local(in.q, in.k, in.dO, gg, scale, L, r64);
      expect_close("dv_local", dvl, o_dv_local(in.q, in.k, in.dO, gg, scale, L, rdt), dvl64, dt);
      // bwd_dhu on the float64 dv_local (stored)
      const Vec dvls = stored(dvl64, dt);
      TestTensor dvl_in = tensor(dt, {L.B, L.T, L.HV, L.V}, dvls, b.device);
      TestTensor dht = tensor(f32or(dt), {L.N(), L.HV, L.K, L.V}, in.dht, b.device);
      TestTensor dh = poisoned(dt, {Bh, NT, L.HV, L.K, L.V}, b.device), dv2 = poisoned(dt, {L.B, L.T, L.HV, L.V}, b.device);
      TestTensor dh0 = poisoned(DType::kFloat32, {L.N(), L.HV, L.K, L.V}, b.device);
      chunk_gated_delta_rule_bwd_dhu(b.ctx(), {q.view(), k.view(), wt.view(), dO.view(), dvl_in.view(), gv, {}, dht.view(),
                                               dh.view(), dh0.view(), dv2.view(), ix.cuv(), co, scale, L.BT});
      Vec dh64, dh064, dv264, dhb, dh0b, dv2b;
      o_bwd_dhu(in.q, in.k, w, in.dO, dvls, gg, in.dht, scale, L, r64, dh64, dh064, dv264);
      o_bwd_dhu(in.q, in.k, w, in.dO, dvls, gg, in.dht, scale, L, rdt, dhb, dh0b, dv2b);
      expect_close("dh", dh, dhb, dh64, dt);
      expect_close("dh0", dh0, dh0b, dh064, dt);
      expect_close("dv2", dv2, dv2b, dv264, dt);
      // dqkwg on the float64 snapshots (stored)
      const Vec dhs = stored(dh64, dt), dv2s = stored(dv264, dt);
      TestTensor dh_in = tensor(dt, {Bh, NT, L.HV, L.K, L.V}, dhs, b.device), dv2_in = tensor(dt, {L.B, L.T, L.HV, L.V}, dv2s, b.device);
      TestTensor dq = poisoned(dt, {L.B, L.T, L.H, L.K}, b.device), dk = poisoned(dt, {L.B, L.T, L.H, L.K}, b.device);
      TestTensor dw = poisoned(dt, {L.B, L.T, L.HV, L.K}, b.device), dg = poisoned(DType::kFloat32, {L.B, L.T, L.HV}, b.device);
      chunk_bwd_dqkwg(b.ctx(), {q.view(), k.view(), vn_in.view(), dO.view(), ht_in.view(), dh_in.view(), wt.view(),
                                dv2_in.view(), gv, dq.view(), dk.view(), dw.view(), with_g ? dg.view() : TensorView(),
                                ix.cuv(), ci, scale, L.BT});
      Vec dq64, dk64, dw64, dg64, dqb, dkb, dwb, dgb;
      o_dqkwg(in.q, in.k, vns, in.dO, hs, dhs, dv2s, gg, scale, L, r64, dq64, dk64, dw64, dg64);
      o_dqkwg(in.q, in.k, vns, in.dO, hs, dhs, dv2s, gg, scale, L, rdt, dqb, dkb, dwb, dgb);
      expect_close("dqkwg dq", dq, dqb, dq64, dt);
      expect_close("dqkwg dk", dk, dkb, dk64, dt);
      expect_close("dqkwg dw", dw, dwb, dw64, dt);
      if (with_g) expect_close("dqkwg dg", dg, dgb, dg64, dt);
    }
  });
}

TEST(GatedDeltaRuleSubops, GateAndBetaSigmoid) {
  for_each_case("gdn_gate", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    std::mt19937_64 gen(3);
    const int64_t HV = L.HV, n = L.B * L.T * HV;
    const Vec x = stored(normal(n, gen, 0.0, 8.0), dt);  // crosses the softplus threshold of 20
    const Vec A = stored(normal(HV, gen, 0.0, 0.5), DType::kFloat32), bias = stored(normal(HV, gen), DType::kFloat32);
    const Vec dy = stored(normal(n, gen), dt);
    TestTensor xt = tensor(dt, {L.B, L.T, HV}, x, b.device), At = tensor(DType::kFloat32, {HV}, A, b.device);
    TestTensor bt = tensor(DType::kFloat32, {HV}, bias, b.device), dyt = tensor(dt, {L.B, L.T, HV}, dy, b.device);
    TestTensor y = poisoned(DType::kFloat32, {L.B, L.T, HV}, b.device);
    gdn_gate_fwd(b.ctx(), {xt.view(), At.view(), bt.view(), y.view()});
    auto gate = [&](Rd rd, Vec& yv, Vec& dx, Vec& dA, Vec& db) {
      yv.assign(n, 0);
      dx.assign(n, 0);
      dA.assign(HV, 0);
      db.assign(HV, 0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t h = i % HV;
        const double z = rd(x[i] + bias[h]), ea = rd(std::exp(A[h]));
        const double sp = z > 20 ? z : rd(std::log1p(rd(std::exp(z))));
        yv[i] = rd(-ea * sp);
        dx[i] = rd(rd(-ea * rd(1.0 / (1.0 + std::exp(-z)))) * dy[i]);
        dA[h] = rd(dA[h] + rd(dy[i] * yv[i]));
        db[h] = rd(db[h] + dx[i]);
      }
    };
    Vec y64, dx64, dA64, db64, yb, dxb, dAb, dbb;
    gate(Rd{DType::kFloat64}, y64, dx64, dA64, db64);
    gate(Rd{dt == DType::kFloat64 ? dt : DType::kFloat32}, yb, dxb, dAb, dbb);
    expect_close("gate y", y, yb, y64, DType::kFloat32);
    TestTensor dx = poisoned(dt, {L.B, L.T, HV}, b.device), dAt = poisoned(DType::kFloat32, {HV}, b.device);
    TestTensor dbt = poisoned(DType::kFloat32, {HV}, b.device);
    gdn_gate_bwd(b.ctx(), {xt.view(), At.view(), bt.view(), dyt.view(), dx.view(), dAt.view(), dbt.view()});
    expect_close("gate dx", dx, stored(dxb, dt), dx64, dt);
    expect_close("gate dA_log", dAt, dAb, dA64, DType::kFloat32);
    expect_close("gate ddt_bias", dbt, dbb, db64, DType::kFloat32);
    // beta sigmoid, both eigenvalue ranges
    for (bool neg : {false, true}) {
      const double cm = neg ? 2.0 : 1.0;
      TestTensor s = poisoned(DType::kFloat32, {L.B, L.T, HV}, b.device), ds = poisoned(dt, {L.B, L.T, HV}, b.device);
      beta_sigmoid_fwd(b.ctx(), {xt.view(), s.view(), neg});
      beta_sigmoid_bwd(b.ctx(), {xt.view(), dyt.view(), ds.view(), neg});
      Vec s64(n), ds64(n), sb(n), dsb(n);
      for (int64_t i = 0; i < n; ++i) {
        const double sg = 1.0 / (1.0 + std::exp(-x[i]));
        s64[i] = cm * sg;
        ds64[i] = dy[i] * cm * sg * (1 - sg);
        const float sf = 1.0f / (1.0f + std::exp(-static_cast<float>(x[i])));
        sb[i] = static_cast<float>(cm * sf);
        dsb[i] = round_to(dt, static_cast<float>(static_cast<float>(dy[i]) * cm * sf * (1.0f - sf)));
      }
      expect_close("beta_sigmoid", s, sb, s64, DType::kFloat32);
      expect_close("beta_sigmoid dx", ds, dsb, ds64, dt);
    }
  });
}

TEST(GatedDeltaRuleSubops, RepeatedBackwardPiecesAreBitwiseEqual) {
  const Layout L{2, 96, 2, 4, 64, 64, 64, {}};
  for (const auto& b : runnable_backends("chunk_bwd_dqkwg", Direction::kBackward)) {
    SCOPED_TRACE(b.id);
    const DType dt = DType::kBFloat16;
    const Inputs in = make_inputs(L, 41, dt);
    const int64_t NT = snapshots(L);
    std::mt19937_64 gen(9);
    TestTensor q = tensor(dt, {L.B, L.T, L.H, L.K}, in.q, b.device), k = tensor(dt, {L.B, L.T, L.H, L.K}, in.k, b.device);
    TestTensor vn = tensor(dt, {L.B, L.T, L.HV, L.V}, in.v, b.device), dO = tensor(dt, {L.B, L.T, L.HV, L.V}, in.dO, b.device);
    TestTensor h = tensor(dt, {L.B, NT, L.HV, L.K, L.V}, normal(L.B * NT * L.HV * L.K * L.V, gen), b.device);
    TestTensor dh = tensor(dt, {L.B, NT, L.HV, L.K, L.V}, normal(L.B * NT * L.HV * L.K * L.V, gen), b.device);
    TestTensor g = tensor(DType::kFloat32, {L.B, L.T, L.HV}, in.g, b.device);
    std::vector<std::vector<uint8_t>> runs;
    for (int r = 0; r < 2; ++r) {
      TestTensor dq(dt, {L.B, L.T, L.H, L.K}, b.device), dk(dt, {L.B, L.T, L.H, L.K}, b.device);
      TestTensor dw(dt, {L.B, L.T, L.HV, L.K}, b.device), dg(DType::kFloat32, {L.B, L.T, L.HV}, b.device);
      chunk_bwd_dqkwg(b.ctx(), {q.view(), k.view(), vn.view(), dO.view(), h.view(), dh.view(), vn.view(), vn.view(), g.view(),
                                dq.view(), dk.view(), dw.view(), dg.view(), {}, {}, 0.125, 64});
      auto all = dq.bytes();
      for (const auto* t : {&dk, &dw, &dg}) {
        auto x = t->bytes();
        all.insert(all.end(), x.begin(), x.end());
      }
      runs.push_back(all);
    }
    EXPECT_EQ(runs[0], runs[1]);
  }
}

TEST(GatedDeltaRuleSubops, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  const int64_t B = 2, T = 8, H = 2, K = 4;
  TestTensor g3(DType::kFloat32, {B, T, H}), out3(DType::kFloat32, {B, T, H}), g2(DType::kFloat32, {B, T});
  expect_error([&] { chunk_local_cumsum(ctx, {g2.view(), g2.view(), {}, {}, 64, false, 1.0}); }, ErrorKind::kValue,
               "chunk_local_cumsum: g must have rank 3 ([B,T,H], scalar gate) or 4");
  expect_error([&] { chunk_local_cumsum(ctx, {g3.view(), out3.view(), {}, {}, 48, false, 1.0}); }, ErrorKind::kValue,
               "chunk_size must be a power of 2, got 48");
  TestTensor cu(DType::kInt64, {2}), ci(DType::kInt64, {1, 2});
  static_cast<int64_t*>(cu.data())[0] = 0;
  static_cast<int64_t*>(cu.data())[1] = T;
  expect_error([&] { chunk_local_cumsum(ctx, {g3.view(), out3.view(), cu.view(), ci.view(), 64, false, 1.0}); },
               ErrorKind::kValue, "with cu_seqlens the batch size must be 1");
  TestTensor g1(DType::kFloat32, {1, T, H}), o1(DType::kFloat32, {1, T, H});
  expect_error([&] { chunk_local_cumsum(ctx, {g1.view(), o1.view(), cu.view(), {}, 64, false, 1.0}); },
               ErrorKind::kValue, "chunk_indices is required with cu_seqlens");
  TestTensor cub(DType::kInt64, {3});
  static_cast<int64_t*>(cub.data())[0] = 0;
  static_cast<int64_t*>(cub.data())[1] = 6;
  static_cast<int64_t*>(cub.data())[2] = 3;
  expect_error([&] { chunk_local_cumsum(ctx, {g1.view(), o1.view(), cub.view(), ci.view(), 64, false, 1.0}); },
               ErrorKind::kValue, "cu_seqlens must be non-decreasing, got cu_seqlens[1]=6 > cu_seqlens[2]=3");
  static_cast<int64_t*>(cub.data())[2] = 9;
  expect_error([&] { chunk_local_cumsum(ctx, {g1.view(), o1.view(), cub.view(), ci.view(), 64, false, 1.0}); },
               ErrorKind::kValue, "cu_seqlens must end at T=8");
  TestTensor ci32(DType::kInt32, {1, 2});
  expect_error([&] { chunk_local_cumsum(ctx, {g1.view(), o1.view(), cu.view(), ci32.view(), 64, false, 1.0}); },
               ErrorKind::kType, "chunk_indices must have the dtype of cu_seqlens (int64), got int32");
  TestTensor A(DType::kFloat32, {B, T, H, 48}), k(DType::kFloat32, {B, T, H, K}), beta(DType::kFloat32, {B, T, 3});
  expect_error([&] { solve_tril(ctx, {A.view(), A.view(), {}, {}}); }, ErrorKind::kValue,
               "A's last dimension (the chunk size BT) must be 16, 32 or 64, got 48");
  TestTensor A64(DType::kFloat32, {B, T, 3, 64});
  expect_error([&] { chunk_scaled_dot_kkt_fwd(ctx, {k.view(), beta.view(), {}, A64.view(), {}, {}, 64}); },
               ErrorKind::kValue, "beta has HV=3 heads, which is not a multiple of the 2 heads of k");
  TestTensor kbig(DType::kFloat32, {B, T, H, 300}), w(DType::kFloat32, {B, T, H, 300}), u(DType::kFloat32, {B, T, H, 4});
  TestTensor h(DType::kFloat32, {B, 1, H, 300, 4});
  expect_error([&] { chunk_gated_delta_rule_fwd_h(ctx, {kbig.view(), w.view(), u.view(), {}, {}, {}, h.view(), {}, {}, {}, {}, 64}); },
               ErrorKind::kValue, "K must be <= 256");
  TestTensor ki(DType::kInt32, {B, T, H, K});
  expect_error([&] { chunk_scaled_dot_kkt_fwd(ctx, {ki.view(), beta.view(), {}, A64.view(), {}, {}, 64}); },
               ErrorKind::kType, "k must have dtype in {float32, bfloat16, float16, float64}, got int32");
  TestTensor q3(DType::kFloat32, {B, T, 3, K}), vv(DType::kFloat32, {B, T, H, K}), o(DType::kFloat32, {B, T, H, K});
  TestTensor hh(DType::kFloat32, {B, 1, H, K, K});
  expect_error([&] { chunk_fwd_o(ctx, {q3.view(), k.view(), vv.view(), hh.view(), {}, o.view(), {}, {}, 1.0, 64}); },
               ErrorKind::kValue, "q and k must have the same number of heads, got 3 and 2");
  TestTensor hbad(DType::kFloat32, {B, 2, H, K, K});
  expect_error([&] { chunk_fwd_o(ctx, {k.view(), k.view(), vv.view(), hbad.view(), {}, o.view(), {}, {}, 1.0, 64}); },
               ErrorKind::kValue, "h must have shape [2,1,2,4,4]");
  TestTensor dk(DType::kFloat32, {B, T, H, K}), db(DType::kFloat32, {B, T, H});
  TestTensor gg(DType::kFloat32, {B, T, H}), Aw(DType::kFloat32, {B, T, H, 64});
  expect_error([&] {
    prepare_wy_repr_bwd(ctx, {k.view(), vv.view(), gg.view(), Aw.view(), gg.view(), vv.view(), vv.view(), dk.view(),
                              vv.view(), db.view(), {}, {}, {}, false});
  }, ErrorKind::kValue, "dg is required when g is given");
}


// =============================================================================================
// The top levels: chunk_gated_delta_rule and fused_recurrent_gated_delta_rule, every gradient,
// against a float64 per-token recurrence written here (section 1.1) with its reverse-mode
// derivative worked out by hand. Base of the precision policy: the chunked algorithm above in the
// input dtype for the chunk form, the recurrence in the input dtype for the recurrent form.
// Options (l2norm, gate, beta sigmoid), varlen with an empty sequence, grouped value heads,
// extreme gates, empty inputs, determinism, errors.


struct Shape {
  int64_t B, T, H, HV, K, V;
  std::vector<int64_t> cu;  // empty: fixed length
  int64_t N() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
};

struct Opts {
  bool l2 = false, gate = false, sig = false, neg = false, h0 = true, dht = true;
  bool beta16 = false;  // beta (and dbeta) in the 16-bit input type instead of fp32 (run_chunk)
  int64_t BT = 64;
  double gate_scale = 1.0;  // multiplies the per-step log decays
};

struct Data {
  Vec q, k, v, g, beta, h0, A_log, dt_bias, dO, dht;
};

struct Grads {
  Vec o, ht, dq, dk, dv, dg, dbeta, dh0, dA, dbias;
};

Data make_data(const Shape& s, const Opts& o, uint64_t seed, DType dt) {
  std::mt19937_64 gen(seed);
  Data d;
  const int64_t n = s.B * s.T;
  d.q = normal(n * s.H * s.K, gen, 0.1);
  d.k = normal(n * s.H * s.K, gen, 0.1);
  if (!o.l2) {  // the caller's job without the in-kernel l2norm
    for (Vec* x : {&d.q, &d.k})
      for (int64_t r = 0; r < n * s.H; ++r) {
        double ss = 0;
        for (int64_t c = 0; c < s.K; ++c) ss += (*x)[r * s.K + c] * (*x)[r * s.K + c];
        for (int64_t c = 0; c < s.K; ++c) (*x)[r * s.K + c] /= std::sqrt(ss);
      }
  }
  d.q = stored(d.q, dt);
  d.k = stored(d.k, dt);
  d.v = stored(normal(n * s.HV * s.V, gen, 0.1), dt);
  Vec g = normal(n * s.HV, gen);
  if (o.gate) {
    for (double& e : g) e = 2.0 * e;  // raw gate input
  } else {
    for (double& e : g) e = -o.gate_scale * (0.02 + 0.3 * std::log1p(std::exp(e)));
  }
  d.g = stored(g, f32or(dt));
  Vec b = normal(n * s.HV, gen);
  if (!o.sig)
    for (double& e : b) e = 1.0 / (1.0 + std::exp(-e));
  d.beta = stored(b, f32or(dt));
  d.h0 = o.h0 ? stored(normal(s.N() * s.HV * s.K * s.V, gen, 0.0, 0.5), f32or(dt)) : Vec();
  d.A_log = stored(normal(s.HV, gen, -1.0, 0.3), f32or(dt));
  d.dt_bias = stored(normal(s.HV, gen, 0.0, 0.5), f32or(dt));
  d.dO = stored(normal(n * s.HV * s.V, gen), dt);
  d.dht = o.dht ? stored(normal(s.N() * s.HV * s.K * s.V, gen), f32or(dt)) : Vec();
  return d;
}

// ---------------------------------------------------------------------------------------------
// The oracle: l2norm / gate / sigmoid, then the per-token recurrence per (sequence, value head),
// then the reverse sweep; every intermediate rounded with rd.

struct Seq {
  int64_t b, t0, len;
};

std::vector<Seq> seqs_of(const Shape& s) {
  std::vector<Seq> out;
  for (int64_t n = 0; n < s.N(); ++n)
    out.push_back(s.cu.empty() ? Seq{n, 0, s.T} : Seq{0, s.cu[n], s.cu[n + 1] - s.cu[n]});
  return out;
}

// The inputs after the optional l2norm / beta sigmoid / gate (rounded with rd).
struct Pre {
  Vec qn, kn, rq, rk, beta, g;
};

Pre preprocess(const Shape& s, const Opts& o, const Data& d, Rd rd) {
  const int64_t n = s.B * s.T, K = s.K;
  Vec qn = d.q, kn = d.k, rq(n * s.H, 1.0), rk(n * s.H, 1.0);
  if (o.l2)
    for (int64_t r = 0; r < n * s.H; ++r)
      for (auto [x, y, rs] : {std::tuple{&d.q, &qn, &rq}, std::tuple{&d.k, &kn, &rk}}) {
        double ss = 0;
        for (int64_t c = 0; c < K; ++c) ss = rd(ss + rd((*x)[r * K + c] * (*x)[r * K + c]));
        (*rs)[r] = rd(1.0 / std::sqrt(rd(ss + 1e-6)));
        for (int64_t c = 0; c < K; ++c) (*y)[r * K + c] = rd((*x)[r * K + c] * (*rs)[r]);
      }
  const double cm = o.neg ? 2.0 : 1.0;
  Vec beta = d.beta, g = d.g;
  if (o.sig)
    for (double& e : beta) e = rd(cm * rd(1.0 / (1.0 + std::exp(-e))));
  if (o.gate)
    for (int64_t i = 0; i < n * s.HV; ++i) {
      const int64_t h = i % s.HV;
      const double z = rd(d.g[i] + d.dt_bias[h]);
      g[i] = rd(-rd(std::exp(d.A_log[h])) * (z > 20 ? z : rd(std::log1p(rd(std::exp(z))))));
    }
  return {qn, kn, rq, rk, beta, g};
}

// The per-token recurrence and its reverse sweep on the pre-processed inputs: o, ht, dv, dh0 and
// the gradients w.r.t. the pre-processed q, k (dq, dk), beta (dbeta) and gate (dg).
Grads recurrence_core(const Shape& s, const Pre& pre, const Data& d, double scale, Rd rd) {
  const int64_t n = s.B * s.T, G = s.HV / s.H, K = s.K, V = s.V, KV = K * V;
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.T + t) * s.H + h) * K; };
  auto vi = [&](int64_t b, int64_t t, int64_t hv) { return ((b * s.T + t) * s.HV + hv) * V; };
  auto si = [&](int64_t b, int64_t t, int64_t hv) { return (b * s.T + t) * s.HV + hv; };
  const Vec &qn = pre.qn, &kn = pre.kn, &beta = pre.beta, &g = pre.g;
  Grads r;
  r.o.assign(n * s.HV * V, 0.0);
  r.ht.assign(s.N() * s.HV * KV, 0.0);
  r.dh0 = r.ht;
  Vec dqn(n * s.H * K, 0.0), dkn(n * s.H * K, 0.0);
  r.dv.assign(n * s.HV * V, 0.0);
  Vec dga(n * s.HV, 0.0), dba(n * s.HV, 0.0);
  const auto seqs = seqs_of(s);
  for (size_t sn = 0; sn < seqs.size(); ++sn)
    for (int64_t hv = 0; hv < s.HV; ++hv) {
      const Seq& sq = seqs[sn];
      const int64_t h = hv / G;
      std::vector<Vec> S(sq.len + 1, Vec(KV, 0.0));
      if (!d.h0.empty()) std::copy(d.h0.begin() + (sn * s.HV + hv) * KV, d.h0.begin() + (sn * s.HV + hv + 1) * KV, S[0].begin());
      std::vector<Vec> P(sq.len), D(sq.len);
      for (int64_t i = 0; i < sq.len; ++i) {
        const int64_t t = sq.t0 + i;
        const double a = rd(std::exp(g[si(sq.b, t, hv)])), bt = beta[si(sq.b, t, hv)];
        Vec St(KV);
        for (int64_t e = 0; e < KV; ++e) St[e] = rd(a * S[i][e]);
        Vec p(V, 0.0), dl(V);
        for (int64_t x = 0; x < V; ++x) {
          for (int64_t y = 0; y < K; ++y) p[x] = rd(p[x] + rd(St[y * V + x] * kn[qi(sq.b, t, h) + y]));
          dl[x] = rd(bt * rd(d.v[vi(sq.b, t, hv) + x] - p[x]));
        }
        for (int64_t y = 0; y < K; ++y)
          for (int64_t x = 0; x < V; ++x) S[i + 1][y * V + x] = rd(St[y * V + x] + rd(kn[qi(sq.b, t, h) + y] * dl[x]));
        for (int64_t x = 0; x < V; ++x) {
          double acc = 0;
          for (int64_t y = 0; y < K; ++y) acc = rd(acc + rd(S[i + 1][y * V + x] * qn[qi(sq.b, t, h) + y]));
          r.o[vi(sq.b, t, hv) + x] = rd(scale * acc);
        }
        P[i] = p;
        D[i] = dl;
      }
      std::copy(S[sq.len].begin(), S[sq.len].end(), r.ht.begin() + (sn * s.HV + hv) * KV);
      // Reverse sweep.
      Vec dS(KV, 0.0);
      if (!d.dht.empty()) std::copy(d.dht.begin() + (sn * s.HV + hv) * KV, d.dht.begin() + (sn * s.HV + hv + 1) * KV, dS.begin());
      for (int64_t i = sq.len - 1; i >= 0; --i) {
        const int64_t t = sq.t0 + i;
        const double a = rd(std::exp(g[si(sq.b, t, hv)])), bt = beta[si(sq.b, t, hv)];
        const double* qv = &qn[qi(sq.b, t, h)];
        const double* kv = &kn[qi(sq.b, t, h)];
        const double* dov = &d.dO[vi(sq.b, t, hv)];
        for (int64_t y = 0; y < K; ++y) {
          double acc = 0;
          for (int64_t x = 0; x < V; ++x) {
            dS[y * V + x] = rd(dS[y * V + x] + rd(rd(scale * qv[y]) * dov[x]));
            acc = rd(acc + rd(S[i + 1][y * V + x] * dov[x]));
          }
          dqn[qi(sq.b, t, h) + y] = rd(dqn[qi(sq.b, t, h) + y] + rd(scale * acc));
        }
        Vec dd(V, 0.0);
        for (int64_t y = 0; y < K; ++y) {
          double acc = 0;
          for (int64_t x = 0; x < V; ++x) {
            dd[x] = rd(dd[x] + rd(dS[y * V + x] * kv[y]));
            acc = rd(acc + rd(dS[y * V + x] * D[i][x]));
          }
          dkn[qi(sq.b, t, h) + y] = rd(dkn[qi(sq.b, t, h) + y] + acc);
        }
        double db = 0;
        for (int64_t x = 0; x < V; ++x) {
          db = rd(db + rd(dd[x] * rd(d.v[vi(sq.b, t, hv) + x] - P[i][x])));
          r.dv[vi(sq.b, t, hv) + x] = rd(bt * dd[x]);
        }
        dba[si(sq.b, t, hv)] = db;
        double dgv = 0;
        for (int64_t y = 0; y < K; ++y) {
          double acc = 0;
          for (int64_t x = 0; x < V; ++x) {
            const double dp = rd(-bt * dd[x]);
            const double st = rd(a * S[i][y * V + x]);
            acc = rd(acc + rd(st * dp));
            dS[y * V + x] = rd(dS[y * V + x] + rd(kv[y] * dp));
            dgv = rd(dgv + rd(st * dS[y * V + x]));
            dS[y * V + x] = rd(a * dS[y * V + x]);
          }
          dkn[qi(sq.b, t, h) + y] = rd(dkn[qi(sq.b, t, h) + y] + acc);
        }
        dga[si(sq.b, t, hv)] = dgv;
      }
      std::copy(dS.begin(), dS.end(), r.dh0.begin() + (sn * s.HV + hv) * KV);
    }
  r.dq = dqn;
  r.dk = dkn;
  r.dg = dga;
  r.dbeta = dba;
  return r;
}

// Chain rules of the pre-processing, applied to a core's gradients.
Grads postprocess(const Shape& s, const Opts& o, const Data& d, const Pre& pre, Grads r, Rd rd) {
  const int64_t n = s.B * s.T, K = s.K;
  const double cm = o.neg ? 2.0 : 1.0;
  const Vec dqn = r.dq, dkn = r.dk, dga = r.dg, dba = r.dbeta;
  const Vec &qn = pre.qn, &kn = pre.kn, &rq = pre.rq, &rk = pre.rk, &g = pre.g;
  if (o.l2)
    for (int64_t row = 0; row < n * s.H; ++row)
      for (auto [dy, y, rs, dx] : {std::tuple{&dqn, &qn, &rq, &r.dq}, std::tuple{&dkn, &kn, &rk, &r.dk}}) {
        double dot = 0;
        for (int64_t c = 0; c < K; ++c) dot = rd(dot + rd((*dy)[row * K + c] * (*y)[row * K + c]));
        for (int64_t c = 0; c < K; ++c)
          (*dx)[row * K + c] = rd((*rs)[row] * rd((*dy)[row * K + c] - rd(dot * (*y)[row * K + c])));
      }
  if (o.sig)
    for (int64_t i = 0; i < n * s.HV; ++i) {
      const double sg = rd(1.0 / (1.0 + std::exp(-d.beta[i])));
      r.dbeta[i] = rd(rd(dba[i] * cm) * rd(sg * rd(1.0 - sg)));
    }
  if (o.gate) {
    r.dA.assign(s.HV, 0.0);
    r.dbias.assign(s.HV, 0.0);
    for (int64_t i = 0; i < n * s.HV; ++i) {
      const int64_t h = i % s.HV;
      const double z = rd(d.g[i] + d.dt_bias[h]);
      r.dg[i] = rd(rd(-rd(std::exp(d.A_log[h])) * rd(1.0 / (1.0 + std::exp(-z)))) * dga[i]);
      r.dA[h] = rd(r.dA[h] + rd(dga[i] * g[i]));
      r.dbias[h] = rd(r.dbias[h] + r.dg[i]);
    }
  }
  return r;
}

// The chunked algorithm (the test's own chunk oracles, rounding with rd): the base of the
// precision policy for chunk_gated_delta_rule, the same algorithm in the input dtype.
Grads chunk_core(const Shape& s, int64_t BT, const Pre& pre, const Data& d, double scale, Rd rd) {
  const Layout L{s.B, s.T, s.H, s.HV, s.K, s.V, BT, s.cu};
  Grads r;
  const Vec gc = o_cumsum(pre.g, L, s.HV, 1, false, 1.0, rd);
  const Vec A = o_solve(o_kkt(pre.kn, pre.beta, gc, L, rd), L, s.HV, rd);
  Vec w, u, h, vn, dvl, dh, dv2, dk2, dg1, dg2, dw;
  o_wu(pre.kn, d.v, pre.beta, A, gc, L, rd, w, u);
  o_fwd_h(pre.kn, w, u, gc, d.h0, L, rd, h, vn, r.ht);
  r.o = o_fwd_o(pre.qn, pre.kn, vn, h, gc, scale, L, rd);
  dvl = o_dv_local(pre.qn, pre.kn, d.dO, gc, scale, L, rd);
  o_bwd_dhu(pre.qn, pre.kn, w, d.dO, dvl, gc, d.dht, scale, L, rd, dh, r.dh0, dv2);
  o_dqkwg(pre.qn, pre.kn, vn, d.dO, h, dh, dv2, gc, scale, L, rd, r.dq, r.dk, dw, dg1);
  o_wy_bwd(pre.kn, d.v, pre.beta, A, gc, dw, dv2, L, rd, dk2, r.dv, r.dbeta, dg2);
  for (size_t i = 0; i < r.dk.size(); ++i) r.dk[i] = rd(r.dk[i] + dk2[i]);
  for (size_t i = 0; i < dg1.size(); ++i) dg1[i] = rd(dg1[i] + dg2[i]);
  r.dg = o_cumsum(dg1, L, s.HV, 1, true, 1.0, rd);
  return r;
}

Grads oracle(const Shape& s, const Opts& o, const Data& d, double scale, Rd rd) {
  const Pre pre = preprocess(s, o, d, rd);
  return postprocess(s, o, d, pre, recurrence_core(s, pre, d, scale, rd), rd);
}

Grads chunk_base(const Shape& s, const Opts& o, const Data& d, double scale, Rd rd) {
  const Pre pre = preprocess(s, o, d, rd);
  return postprocess(s, o, d, pre, chunk_core(s, o.BT, pre, d, scale, rd), rd);
}

// ---------------------------------------------------------------------------------------------
// Running the library.

struct Result {
  TestTensor o, ht, dq, dk, dv, dg, dbeta, dh0, dA, dbias;
};

Result run_chunk(const BackendCase& b, DType dt, const Shape& s, const Opts& o, const Data& d, double scale) {
  const Device dev = b.device;
  const DType f32 = f32or(dt);
  const Index ix = make_index(s.cu, o.BT, dev, DType::kInt32);
  const int64_t n = s.B * s.T;
  TestTensor q = tensor(dt, {s.B, s.T, s.H, s.K}, d.q, dev), k = tensor(dt, {s.B, s.T, s.H, s.K}, d.k, dev);
  TestTensor v = tensor(dt, {s.B, s.T, s.HV, s.V}, d.v, dev);
  const DType bdt = o.beta16 ? dt : f32;
  TestTensor g = tensor(f32, {s.B, s.T, s.HV}, d.g, dev), beta = tensor(bdt, {s.B, s.T, s.HV}, d.beta, dev);
  TestTensor h0 = o.h0 ? tensor(f32, {s.N(), s.HV, s.K, s.V}, d.h0, dev) : TestTensor();
  TestTensor Alog = tensor(f32, {s.HV}, d.A_log, dev), bias = tensor(f32, {s.HV}, d.dt_bias, dev);
  Result r;
  r.o = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
  r.ht = poisoned(f32, {s.N(), s.HV, s.K, s.V}, dev);
  TestTensor qn, kn, rq, rk, bs;
  if (o.l2) {
    qn = poisoned(dt, {s.B, s.T, s.H, s.K}, dev);
    kn = poisoned(dt, {s.B, s.T, s.H, s.K}, dev);
    rq = poisoned(f32, {s.B, s.T, s.H}, dev);
    rk = poisoned(f32, {s.B, s.T, s.H}, dev);
  }
  if (o.sig) bs = poisoned(f32, {s.B, s.T, s.HV}, dev);
  const DType gcdt = gate_cumsum_dtype(b, f32);
  TestTensor gc = poisoned(gcdt, {s.B, s.T, s.HV}, dev), A = poisoned(dt, {s.B, s.T, s.HV, o.BT}, dev);
  ChunkGatedDeltaRuleFwdArgs fa;
  fa.q = q.view(); fa.k = k.view(); fa.v = v.view(); fa.g = g.view(); fa.beta = beta.view();
  fa.initial_state = o.h0 ? h0.view() : TensorView();
  if (o.gate) {
    fa.A_log = Alog.view();
    fa.dt_bias = bias.view();
  }
  if (!s.cu.empty()) {
    fa.cu_seqlens = ix.cu.view(); fa.chunk_indices = ix.ci.view(); fa.chunk_offsets = ix.co.view();
  }
  fa.scale = scale; fa.chunk_size = o.BT;
  fa.use_qk_l2norm_in_kernel = o.l2; fa.use_gate_in_kernel = o.gate;
  fa.use_beta_sigmoid_in_kernel = o.sig; fa.allow_neg_eigval = o.neg;
  fa.o = r.o.view(); fa.final_state = r.ht.view();
  if (o.l2) { fa.q_normed = qn.view(); fa.k_normed = kn.view(); fa.q_rstd = rq.view(); fa.k_rstd = rk.view(); }
  fa.g_cumsum = gc.view(); fa.A = A.view();
  if (o.sig) fa.beta_sigmoid = bs.view();
  TestTensor wsf(DType::kUInt8, {chunk_gated_delta_rule_fwd_workspace_size(fa)}, dev);
  fa.workspace = wsf.view();
  chunk_gated_delta_rule_fwd(b.ctx(), fa);

  ChunkGatedDeltaRuleBwdArgs ba;
  ba.q = fa.q; ba.k = fa.k; ba.v = fa.v; ba.g = fa.g; ba.beta = fa.beta; ba.initial_state = fa.initial_state;
  ba.A_log = fa.A_log; ba.dt_bias = fa.dt_bias;
  ba.q_normed = fa.q_normed; ba.k_normed = fa.k_normed; ba.q_rstd = fa.q_rstd; ba.k_rstd = fa.k_rstd;
  ba.g_cumsum = fa.g_cumsum; ba.A = fa.A; ba.beta_sigmoid = fa.beta_sigmoid;
  ba.cu_seqlens = fa.cu_seqlens; ba.chunk_indices = fa.chunk_indices; ba.chunk_offsets = fa.chunk_offsets;
  ba.scale = scale; ba.chunk_size = o.BT; ba.use_qk_l2norm_in_kernel = o.l2; ba.use_gate_in_kernel = o.gate;
  ba.use_beta_sigmoid_in_kernel = o.sig; ba.allow_neg_eigval = o.neg;
  TestTensor dO = tensor(dt, {s.B, s.T, s.HV, s.V}, d.dO, dev);
  TestTensor dht = o.dht ? tensor(f32, {s.N(), s.HV, s.K, s.V}, d.dht, dev) : TestTensor();
  ba.dout = dO.view();
  ba.dht = o.dht ? dht.view() : TensorView();
  r.dq = poisoned(dt, {s.B, s.T, s.H, s.K}, dev);
  r.dk = poisoned(dt, {s.B, s.T, s.H, s.K}, dev);
  r.dv = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
  r.dg = poisoned(f32, {s.B, s.T, s.HV}, dev);
  r.dbeta = poisoned(bdt, {s.B, s.T, s.HV}, dev);
  r.dh0 = poisoned(f32, {s.N(), s.HV, s.K, s.V}, dev);
  ba.dq = r.dq.view(); ba.dk = r.dk.view(); ba.dv = r.dv.view(); ba.dg = r.dg.view(); ba.dbeta = r.dbeta.view();
  ba.dh0 = o.h0 ? r.dh0.view() : TensorView();
  if (o.gate) {
    r.dA = poisoned(f32, {s.HV}, dev);
    r.dbias = poisoned(f32, {s.HV}, dev);
    ba.dA_log = r.dA.view();
    ba.ddt_bias = r.dbias.view();
  }
  TestTensor wsb(DType::kUInt8, {chunk_gated_delta_rule_bwd_workspace_size(ba)}, dev);
  ba.workspace = wsb.view();
  (void)n;
  chunk_gated_delta_rule_bwd(b.ctx(), ba);
  return r;
}

Result run_recurrent(const BackendCase& b, DType dt, const Shape& s, const Opts& o, const Data& d, double scale) {
  const Device dev = b.device;
  const DType f32 = f32or(dt);
  const Index ix = make_index(s.cu, 64, dev, DType::kInt32);
  TestTensor q = tensor(dt, {s.B, s.T, s.H, s.K}, d.q, dev), k = tensor(dt, {s.B, s.T, s.H, s.K}, d.k, dev);
  TestTensor v = tensor(dt, {s.B, s.T, s.HV, s.V}, d.v, dev);
  TestTensor g = tensor(f32, {s.B, s.T, s.HV}, d.g, dev), beta = tensor(f32, {s.B, s.T, s.HV}, d.beta, dev);
  TestTensor h0 = o.h0 ? tensor(f32, {s.N(), s.HV, s.K, s.V}, d.h0, dev) : TestTensor();
  Result r;
  r.o = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
  r.ht = poisoned(f32, {s.N(), s.HV, s.K, s.V}, dev);
  const TensorView cu = s.cu.empty() ? TensorView() : ix.cu.view();
  const TensorView h0v = o.h0 ? h0.view() : TensorView();
  fused_recurrent_gated_delta_rule_fwd(b.ctx(), {q.view(), k.view(), v.view(), g.view(), beta.view(), h0v, cu, scale,
                                                 r.o.view(), r.ht.view()});
  TestTensor dO = tensor(dt, {s.B, s.T, s.HV, s.V}, d.dO, dev);
  TestTensor dht = o.dht ? tensor(f32, {s.N(), s.HV, s.K, s.V}, d.dht, dev) : TestTensor();
  r.dq = poisoned(dt, {s.B, s.T, s.H, s.K}, dev);
  r.dk = poisoned(dt, {s.B, s.T, s.H, s.K}, dev);
  r.dv = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
  r.dg = poisoned(f32, {s.B, s.T, s.HV}, dev);
  r.dbeta = poisoned(f32, {s.B, s.T, s.HV}, dev);
  r.dh0 = poisoned(f32, {s.N(), s.HV, s.K, s.V}, dev);
  FusedRecurrentGatedDeltaRuleBwdArgs ba{{q.view(), k.view(), v.view(), g.view(), beta.view(), h0v, cu, scale,
                                          dO.view(), o.dht ? dht.view() : TensorView(), r.dq.view(), r.dk.view(),
                                          r.dv.view(), r.dg.view(), r.dbeta.view(),
                                          o.h0 ? r.dh0.view() : TensorView(), TensorView()}};
  // The checkpoint workspace (sm_90 past 16 tokens), NaN-filled: every state read from it was written.
  const int64_t ws_bytes = fused_recurrent_gated_delta_rule_bwd_workspace_size(ba);
  TestTensor ws = ws_bytes ? poisoned(DType::kFloat32, {ws_bytes / 4}, dev) : TestTensor();
  if (ws_bytes) ba.workspace = ws.view();
  fused_recurrent_gated_delta_rule_bwd(b.ctx(), ba);
  return r;
}

void expect_top_close(const char* what, const TestTensor& ours, Vec base, const Vec& ref, DType dt) {
  const Vec got = ours.to_double();
  if (dt == DType::kFloat64) {
    double m = 1;
    for (double r : ref) m = std::max(m, std::abs(r));
    const double e = max_abs_error(got, ref);
    EXPECT_LE(e, 1e-10 * m) << what << ": float64 max-abs err " << e;
    return;
  }
  const DType tol_dt = floor_for(ours.dtype()) > floor_for(dt) ? ours.dtype() : dt;
  for (double& x : base) x = round_to(tol_dt, x);
  Verdict v = check_close(got, base, ref, tol_dt);
  EXPECT_TRUE(v.pass) << what << ": " << v.describe();
  if (getenv("GDN_VERBOSE")) printf("%-12s %s\n", what, v.describe().c_str());
  // The spec's metric (section 13): RMS(ref - ours) / RMS(ref).
  ::testing::Test::RecordProperty(std::string(what) + "_rms_ratio", std::to_string(v.rms_rel));
}

void compare(const Result& r, const Grads& base, const Grads& ref, DType dt, const Opts& o, bool chunk) {
  expect_top_close("o", r.o, base.o, ref.o, dt);
  expect_top_close("final_state", r.ht, base.ht, ref.ht, dt);
  expect_top_close("dq", r.dq, base.dq, ref.dq, dt);
  expect_top_close("dk", r.dk, base.dk, ref.dk, dt);
  expect_top_close("dv", r.dv, base.dv, ref.dv, dt);
  expect_top_close("dg", r.dg, base.dg, ref.dg, dt);
  expect_top_close("dbeta", r.dbeta, base.dbeta, ref.dbeta, dt);
  if (o.h0) expect_close("dh0", r.dh0, base.dh0, ref.dh0, dt);
  if (chunk && o.gate) {
    expect_top_close("dA_log", r.dA, base.dA, ref.dA, dt);
    expect_top_close("ddt_bias", r.dbias, base.dbias, ref.dbias, dt);
  }
}

struct TopCase {
  Shape s;
  Opts o;
  std::string name;
  bool cuda_16bit = false;  // run only by the CUDA backends in 16-bit (their tensor-core and fused kernels)
};

std::vector<TopCase> top_cases() {
  Opts plain;
  Opts bt16 = plain;
  bt16.BT = 16;
  Opts all;
  all.l2 = all.gate = all.sig = all.neg = true;
  all.BT = 32;
  Opts bare;
  bare.h0 = bare.dht = false;
  Opts all64 = all;
  all64.BT = 64;
  all64.neg = false;
  return {
      {{2, 70, 1, 2, 32, 24, {}}, plain, "B2 T70 GVA2 K32 V24 BT64"},
      {{1, 75, 2, 2, 20, 36, {0, 20, 20, 75}}, bt16, "varlen [0,20,20,75] BT16"},
      {{1, 45, 2, 4, 16, 16, {}}, all, "l2norm+gate+sigmoid(neg) GVA2 BT32"},
      {{1, 33, 1, 1, 16, 16, {}}, bare, "no h0, no dht"},
      {{1, 90, 1, 1, 100, 130, {}}, plain, "K100 V130 BT64"},
      // K = V = 128 at chunk 64: the CUDA backend's 16-bit kernels, with steps F2-F4 fused.
      {{2, 100, 1, 1, 128, 128, {}}, plain, "B2 T100 K128 V128 BT64", true},
      {{1, 150, 1, 2, 128, 128, {0, 70, 150}}, all64, "varlen [0,70,150] GVA2 K128 l2norm+gate+sigmoid BT64", true},
  };
}

TEST(ChunkGatedDeltaRule, MatchesTheFloat64RecurrenceOnEveryBackend) {
  // ref: the float64 per-token recurrence; base: the chunked algorithm in the input dtype.
  int checked = 0;
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kForward))
    for (DType dt : kDtypes) {
      if (!backend_takes("chunk_gated_delta_rule", Direction::kForward, b.id, dt)) continue;
      const auto cases = top_cases();
      const bool half = dt == DType::kBFloat16 || dt == DType::kFloat16, cuda = b.id.rfind("cuda", 0) == 0;
      for (size_t i = 0; i < cases.size(); ++i) {
        const TopCase& c = cases[i];
        // 16-bit storage runs the first two cases (and, on CUDA, the cuda_16bit ones); fp32 and
        // float64 all but the cuda_16bit ones.
        if (c.cuda_16bit ? !(cuda && half) : (half && i >= 2)) continue;
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/" + c.name);
        const Data d = make_data(c.s, c.o, 100 + i, dt);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.s.K));
        const Result r = run_chunk(b, dt, c.s, c.o, d, scale);
        compare(r, chunk_base(c.s, c.o, d, scale, Rd{dt}), oracle(c.s, c.o, d, scale, Rd{DType::kFloat64}), dt,
                c.o, true);
        ++checked;
      }
    }
  EXPECT_GT(checked, 0);
}

TEST(FusedRecurrentGatedDeltaRule, MatchesTheFloat64RecurrenceOnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends("fused_recurrent_gated_delta_rule", Direction::kForward))
    for (DType dt : kDtypes) {
      if (!backend_takes("fused_recurrent_gated_delta_rule", Direction::kForward, b.id, dt)) continue;
      const auto all = top_cases();
      // Three of the chunk cases, K = 160 (the CUDA forward's eight-warp form; K <= 128 takes four
      // warps), V = 18 (V % 4 != 0: the state element by element instead of by float4) and V = 130
      // (cuda_sm90's backward: a cluster of five 32-column tiles, the last one partial).
      const std::vector<TopCase> cases{all[0], all[1], all[3], {{1, 20, 1, 2, 160, 40, {}}, all[0].o, "K160 V40 GVA2"},
                                       {{2, 9, 1, 1, 24, 18, {}}, all[0].o, "K24 V18"},
                                       {{1, 70, 1, 1, 100, 130, {}}, all[0].o, "K100 V130 T70"}};
      for (size_t i = 0; i < cases.size(); ++i) {
        const TopCase& c = cases[i];
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/" + c.name);
        const Data d = make_data(c.s, c.o, 200 + (i == 2 ? 3 : i), dt);
        const double scale = 0.7;
        const Result r = run_recurrent(b, dt, c.s, c.o, d, scale);
        compare(r, oracle(c.s, c.o, d, scale, Rd{dt}), oracle(c.s, c.o, d, scale, Rd{DType::kFloat64}), dt, c.o, false);
        ++checked;
      }
    }
  EXPECT_GT(checked, 0);
}

bool all_finite(const TestTensor& t) {
  for (double x : t.to_double())
    if (!std::isfinite(x)) return false;
  return true;
}

TEST(ChunkGatedDeltaRule, ExtremeGatesAndBetasStayFinite) {
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kForward)) {
    SCOPED_TRACE(b.id);
    const Shape s{1, 100, 1, 1, 16, 16, {}};
    Opts o;
    o.BT = 64;
    Data d = make_data(s, o, 7, DType::kFloat32);
    for (int64_t t = 0; t < s.T; ++t) {
      if (t % 7 == 3) d.g[t] = -1000.0;
      d.beta[t] = t % 2 ? 1e-7 : 1.0 - 1e-7;
    }
    const Result r = run_chunk(b, DType::kFloat32, s, o, d, 0.25);
    for (const TestTensor* t : {&r.o, &r.ht, &r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.dh0})
      EXPECT_TRUE(all_finite(*t));
    // Still close to the truth by the spec's RMS-ratio metric (section 13: o 0.005, grads 0.008,
    // dg/dbeta 0.02): the bound CUDA's fp32 chunk-local cumsum can meet (after a -1000 step its
    // ulp is 6e-5, carried into exp(g_i - g_j), as in flash-linear-attention). The CPU backends'
    // float64 cumsum is held to the ordinary-gate error class by the next test.
    const Grads ref = oracle(s, o, d, 0.25, Rd{DType::kFloat64});
    const std::pair<const TestTensor*, const Vec*> outs[] = {
        {&r.o, &ref.o}, {&r.ht, &ref.ht}, {&r.dq, &ref.dq}, {&r.dk, &ref.dk}, {&r.dv, &ref.dv},
        {&r.dg, &ref.dg}, {&r.dbeta, &ref.dbeta}, {&r.dh0, &ref.dh0}};
    for (const auto& [t, want] : outs) EXPECT_LT(rms_relative_error(t->to_double(), *want), 5e-3);
  }
}

// Every output's max-abs error against the float64 recurrence over max(1, max|ref|).
std::vector<double> errors_of(const Result& r, const Grads& ref) {
  return relative_errors({{&r.o, &ref.o}, {&r.ht, &ref.ht}, {&r.dq, &ref.dq}, {&r.dk, &ref.dk}, {&r.dv, &ref.dv},
                          {&r.dg, &ref.dg}, {&r.dbeta, &ref.dbeta}, {&r.dh0, &ref.dh0}});
}

TEST(ChunkGatedDeltaRule, ExtremeGatesStayInTheOrdinaryErrorClass) {
  // Log-gates of -1e4, -88 and -104 (exp underflows to 0 in fp32) on every seventh step or on
  // all, and all-zero gates: o, final state and every gradient within 10x of the backend's
  // error at ordinary gates (an fp32 gate cumsum was 1e-3 off at -1e4, 1e-5 at -88); the CUDA
  // backends, whose cumsum is still fp32, within the ulp bound of extreme_gate_bound.
  const char* names[] = {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
  const Shape s{1, 100, 1, 2, 16, 16, {}};
  Opts o;
  o.BT = 32;
  int checked = 0;
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kForward))
    for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
      if (!backend_takes("chunk_gated_delta_rule", Direction::kForward, b.id, dt)) continue;
      const bool cuda = b.id.rfind("cuda", 0) == 0;  // fp32 gate cumsum (extreme_gate_bound)
      const Data d = make_data(s, o, 9, dt);
      const std::vector<double> base =
          errors_of(run_chunk(b, dt, s, o, d, 0.25), oracle(s, o, d, 0.25, Rd{DType::kFloat64}));
      for (double value : {-1e4, -88.0, -104.0, 0.0})
        for (bool all : {false, true}) {
          if (value == 0.0 && !all) continue;
          SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/g=" + std::to_string(value) + (all ? " all" : " some"));
          Data x = d;
          for (size_t t = 0; t < x.g.size(); ++t)
            if (all || t % 7 == 3) x.g[t] = value;
          const std::vector<double> e =
              errors_of(run_chunk(b, dt, s, o, x, 0.25), oracle(s, o, x, 0.25, Rd{DType::kFloat64}));
          std::vector<int64_t> starts;  // one sequence per batch row
          for (int64_t i = 0; i <= s.B; ++i) starts.push_back(i * s.T);
          const double M = max_chunk_cumsum(x.g, s.HV, o.BT, starts);
          for (size_t i = 0; i < e.size(); ++i)
            EXPECT_LE(e[i], extreme_gate_bound(base[i], floor_for(dt), cuda, M))
                << names[i] << ": ordinary gates " << base[i] << ", largest chunk cumsum " << M;
          ++checked;
        }
    }
  EXPECT_GT(checked, 0);
}

TEST(ChunkGatedDeltaRule, EmptySequencesPassTheStateThrough) {
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kForward)) {
    SCOPED_TRACE(b.id);
    for (const Shape& s : {Shape{2, 0, 1, 1, 8, 8, {}}, Shape{1, 0, 1, 2, 8, 8, {0, 0, 0}}}) {
      Opts o;
      const Data d = make_data(s, o, 3, DType::kFloat32);
      const Result r = run_chunk(b, DType::kFloat32, s, o, d, 0.5);
      EXPECT_EQ(r.ht.to_double(), d.h0);
      EXPECT_EQ(r.dh0.to_double(), d.dht);
    }
  }
}

TEST(ChunkGatedDeltaRule, RepeatedBackwardIsBitwiseEqual) {
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kBackward)) {
    SCOPED_TRACE(b.id);
    const Shape s = b.id == "ref" ? Shape{1, 40, 1, 2, 16, 16, {}} : Shape{2, 130, 2, 4, 64, 64, {}};
    Opts o;
    o.l2 = o.gate = true;
    const DType dt = b.id == "ref" ? DType::kFloat32 : DType::kBFloat16;
    const Data d = make_data(s, o, 5, dt);
    const Result r1 = run_chunk(b, dt, s, o, d, 0.125), r2 = run_chunk(b, dt, s, o, d, 0.125);
    for (auto [x, y] : {std::pair{&r1.dq, &r2.dq}, std::pair{&r1.dk, &r2.dk}, std::pair{&r1.dv, &r2.dv},
                        std::pair{&r1.dg, &r2.dg}, std::pair{&r1.dbeta, &r2.dbeta}, std::pair{&r1.dh0, &r2.dh0},
                        std::pair{&r1.dA, &r2.dA}, std::pair{&r1.dbias, &r2.dbias}})
      EXPECT_EQ(x->bytes(), y->bytes());
  }
}

// With W, U, h and Vnew kept, the top-level forward's o, final state, h and Vnew are bitwise those
// of chunk_gated_delta_rule_fwd_h and chunk_fwd_o called on its W, U and A-derived inputs: a
// backend's fused state-and-output kernel (CUDA's, at K = V = 128 in 16 bits) must round and
// accumulate as the sub-operators do. cuda_sm90's kernel (wgmma) rounds at the same points but its
// tensor cores may sum inside a product in another order, so it is held to the sub-operators
// (cuda_sm80's) within rounding instead: RMS-relative difference under 2^-8 (bf16) / 2^-11 (fp16),
// where any misplaced tile or missed term gives O(1). The third shape has 128 (sequence, value
// head) pairs, enough for CUDA's default choice to take the fused kernel on a GPU of up to 146 SMs
// (the other two take it only when FUSEDOPS_GDN_FUSED_HO=1 forces it).
TEST(ChunkGatedDeltaRule, ForwardEqualsItsStateAndOutputSubOperators) {
  int checked = 0;
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kForward))
    for (DType dt : {DType::kBFloat16, DType::kFloat16})
      for (const Shape& s : {Shape{2, 200, 1, 2, 128, 128, {}}, Shape{1, 300, 1, 1, 128, 128, {0, 130, 300}},
                             Shape{64, 70, 1, 2, 128, 128, {}}}) {
        if (b.id == "ref" || !backend_takes("chunk_gated_delta_rule", Direction::kForward, b.id, dt)) continue;
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + (s.cu.empty() ? " fixed B=" + std::to_string(s.B) : " varlen"));
        const Device dev = b.device;
        Opts o;
        const Data d = make_data(s, o, 21, dt);
        const Index ix = make_index(s.cu, 64, dev, DType::kInt32);
        int64_t NT = s.B * ((s.T + 63) / 64);  // chunks in all
        if (!s.cu.empty()) {
          NT = 0;
          for (size_t i = 0; i + 1 < s.cu.size(); ++i) NT += (s.cu[i + 1] - s.cu[i] + 63) / 64;
        }
        TestTensor q = tensor(dt, {s.B, s.T, s.H, s.K}, d.q, dev), k = tensor(dt, {s.B, s.T, s.H, s.K}, d.k, dev);
        TestTensor v = tensor(dt, {s.B, s.T, s.HV, s.V}, d.v, dev);
        TestTensor g = tensor(DType::kFloat32, {s.B, s.T, s.HV}, d.g, dev);
        TestTensor beta = tensor(DType::kFloat32, {s.B, s.T, s.HV}, d.beta, dev);
        TestTensor h0 = tensor(DType::kFloat32, {s.N(), s.HV, s.K, s.V}, d.h0, dev);
        TestTensor out = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev), ht = poisoned(DType::kFloat32, {s.N(), s.HV, s.K, s.V}, dev);
        TestTensor gc = poisoned(DType::kFloat32, {s.B, s.T, s.HV}, dev), A = poisoned(dt, {s.B, s.T, s.HV, 64}, dev);
        TestTensor w = poisoned(dt, {s.B, s.T, s.HV, s.K}, dev), u = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
        TestTensor h = poisoned(dt, {s.cu.empty() ? s.B : 1, NT / (s.cu.empty() ? s.B : 1), s.HV, s.K, s.V}, dev);
        TestTensor vn = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
        ChunkGatedDeltaRuleFwdArgs fa;
        fa.q = q.view(); fa.k = k.view(); fa.v = v.view(); fa.g = g.view(); fa.beta = beta.view();
        fa.initial_state = h0.view();
        if (!s.cu.empty()) {
          fa.cu_seqlens = ix.cu.view(); fa.chunk_indices = ix.ci.view(); fa.chunk_offsets = ix.co.view();
        }
        fa.scale = 0.2; fa.chunk_size = 64;
        fa.o = out.view(); fa.final_state = ht.view(); fa.g_cumsum = gc.view(); fa.A = A.view();
        fa.w = w.view(); fa.u = u.view(); fa.h = h.view(); fa.v_new = vn.view();
        TestTensor wsf(DType::kUInt8, {chunk_gated_delta_rule_fwd_workspace_size(fa)}, dev);
        fa.workspace = wsf.view();
        chunk_gated_delta_rule_fwd(b.ctx(), fa);
        TestTensor o2 = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev), ht2 = poisoned(DType::kFloat32, {s.N(), s.HV, s.K, s.V}, dev);
        TestTensor h2 = poisoned(dt, {s.cu.empty() ? s.B : 1, NT / (s.cu.empty() ? s.B : 1), s.HV, s.K, s.V}, dev);
        TestTensor vn2 = poisoned(dt, {s.B, s.T, s.HV, s.V}, dev);
        const bool sm90 = b.id == "cuda_sm90";  // whose sub-operators are cuda_sm80's
        Context sub = b.ctx();
        if (sm90) sub.backend = "cuda_sm80";
        chunk_gated_delta_rule_fwd_h(sub, {fa.k, fa.w, fa.u, fa.g_cumsum, TensorView(), fa.initial_state, h2.view(),
                                           vn2.view(), ht2.view(), fa.cu_seqlens, fa.chunk_offsets, 64});
        chunk_fwd_o(sub, {fa.q, fa.k, vn2.view(), h2.view(), fa.g_cumsum, o2.view(), fa.cu_seqlens, fa.chunk_indices,
                          fa.scale, 64});
        if (sm90) {
          const double bound = dt == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
          for (auto [x, y] : {std::pair{&out, &o2}, std::pair{&ht, &ht2}, std::pair{&h, &h2}, std::pair{&vn, &vn2}})
            EXPECT_LT(rms_relative_error(x->to_double(), y->to_double()), bound);
        } else {
          EXPECT_EQ(out.bytes(), o2.bytes());
          EXPECT_EQ(ht.bytes(), ht2.bytes());
          EXPECT_EQ(h.bytes(), h2.bytes());
          EXPECT_EQ(vn.bytes(), vn2.bytes());
        }
        ++checked;
      }
  EXPECT_GT(checked, 0);
}

// cuda_sm90's backward runs its two state recurrences (B1's fwd_h, B3's dhu) and, with one value
// head per q/k head, chunk_bwd_dqkwg on wgmma, the rest on cuda_sm80's kernels, so its gradients
// agree with cuda_sm80's within rounding: RMS-relative difference under 2^-7 (bf16) / 2^-10
// (fp16), where a misplaced tile or a missed term gives O(1). Shapes: two value heads per q/k head
// (dqkwg stays cuda_sm80's), one (dqkwg on wgmma), varlen, and 128 (sequence, value head) pairs
// (the state kernels' default choice on a GPU of up to 146 SMs; the others take them when
// FUSEDOPS_GDN_WG_STATE=1 forces it). The float64-oracle tests hold both to the truth.
TEST(ChunkGatedDeltaRule, Sm90BackwardEqualsSm80sWithinRounding) {
  const BackendCase* sm80 = nullptr;
  const BackendCase* sm90 = nullptr;
  const auto backends = runnable_backends("chunk_gated_delta_rule", Direction::kBackward);
  for (const auto& b : backends) {
    if (b.id == "cuda_sm80") sm80 = &b;
    if (b.id == "cuda_sm90") sm90 = &b;
  }
  if (!sm80 || !sm90) GTEST_SKIP() << "needs the cuda_sm80 and cuda_sm90 backends (an sm_90 GPU)";
  // beta in fp32 and in the input type (the w/u-in-B1 kernel loads either).
  for (DType dt : {DType::kBFloat16, DType::kFloat16})
    for (const Shape& s : {Shape{2, 200, 1, 2, 128, 128, {}}, Shape{2, 200, 1, 1, 128, 128, {}},
                           Shape{1, 300, 1, 1, 128, 128, {0, 130, 300}}, Shape{64, 70, 1, 2, 128, 128, {}}})
      for (bool beta16 : {false, true}) {
        SCOPED_TRACE(dtype_name(dt) + (s.cu.empty() ? " fixed B=" + std::to_string(s.B) : " varlen") +
                     (beta16 ? ", 16-bit beta" : ", fp32 beta"));
        Opts o;
        o.l2 = o.gate = true;
        o.beta16 = beta16;
        const Data d = make_data(s, o, 23, dt);
        const Result a = run_chunk(*sm90, dt, s, o, d, 0.2), b = run_chunk(*sm80, dt, s, o, d, 0.2);
        const double bound = dt == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024;
        for (auto [x, y] : {std::pair{&a.dq, &b.dq}, std::pair{&a.dk, &b.dk}, std::pair{&a.dv, &b.dv},
                            std::pair{&a.dg, &b.dg}, std::pair{&a.dbeta, &b.dbeta}, std::pair{&a.dh0, &b.dh0},
                            std::pair{&a.dA, &b.dA}, std::pair{&a.dbias, &b.dbias}})
          EXPECT_LT(rms_relative_error(x->to_double(), y->to_double()), bound);
      }
}

TEST(ChunkGatedDeltaRule, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  const Shape s{2, 8, 2, 4, 8, 8, {}};
  const Opts o;
  const Data d = make_data(s, o, 1, DType::kFloat32);
  const BackendCase cpu{"cpu", Device::cpu()};
  auto args = [&](Shape sh) {
    struct Holder {
      TestTensor q, k, v, g, beta, h0, o, ht, gc, A, ws;
      ChunkGatedDeltaRuleFwdArgs a;
    };
    auto h = std::make_shared<Holder>();
    const int64_t N = sh.cu.empty() ? sh.B : static_cast<int64_t>(sh.cu.size()) - 1;
    h->q = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.H, sh.K});
    h->k = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.H, sh.K});
    h->v = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.HV, sh.V});
    h->g = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.HV});
    h->beta = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.HV});
    h->h0 = TestTensor(DType::kFloat32, {N, sh.HV, sh.K, sh.V});
    h->o = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.HV, sh.V});
    h->gc = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.HV});
    h->A = TestTensor(DType::kFloat32, {sh.B, sh.T, sh.HV, 64});
    auto& a = h->a;
    a.q = h->q.view(); a.k = h->k.view(); a.v = h->v.view(); a.g = h->g.view(); a.beta = h->beta.view();
    a.initial_state = h->h0.view(); a.o = h->o.view(); a.g_cumsum = h->gc.view(); a.A = h->A.view();
    h->ws = TestTensor(DType::kUInt8, {1 << 20});
    a.workspace = h->ws.view();
    return h;
  };
  {
    auto h = args(s);
    TestTensor k3(DType::kFloat32, {2, 8, 3, 8});
    h->a.k = k3.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue,
                 "chunk_gated_delta_rule: q and k must have the same number of heads (q.shape[2] == k.shape[2]), got 2 and 3");
  }
  {
    auto h = args({2, 8, 2, 3, 8, 8, {}});
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue,
                 "v has HV=3 heads, which is not a multiple of the 2 heads of q and k");
  }
  {
    auto h = args(s);
    h->a.chunk_size = 48;
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue, "chunk_size must be 16, 32 or 64, got 48");
  }
  {  // the kept intermediates: all four or none, each of its exact shape
    auto h = args(s);
    TestTensor w(DType::kFloat32, {2, 8, 4, 8}), u(DType::kFloat32, {2, 8, 4, 8});
    TestTensor hs(DType::kFloat32, {2, 1, 4, 8, 8}), vn(DType::kFloat32, {2, 8, 4, 8}), hbad(DType::kFloat32, {2, 2, 4, 8, 8});
    h->a.w = w.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue,
                 "w, u, h and v_new are given together or not at all");
    h->a.u = u.view();
    h->a.v_new = vn.view();
    h->a.h = hbad.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue, "h must have shape [2,1,4,8,8], got [2,2,4,8,8]");
    h->a.h = hs.view();
    chunk_gated_delta_rule_fwd(ctx, h->a);  // the right shapes run
  }
  {
    auto h = args(s);
    TestTensor h0(DType::kFloat32, {3, 4, 8, 8});
    h->a.initial_state = h0.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue,
                 "initial_state must have shape [2,4,8,8], got [3,4,8,8]");
  }
  {
    auto h = args(s);
    TestTensor cu(DType::kInt64, {2}), ci(DType::kInt64, {1, 2}), co(DType::kInt64, {2});
    h->a.cu_seqlens = cu.view(); h->a.chunk_indices = ci.view(); h->a.chunk_offsets = co.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue,
                 "with cu_seqlens the batch size must be 1 (sequences are packed along T), got B=2");
  }
  {
    auto h = args({1, 8, 2, 4, 8, 8, {0, 8}});
    TestTensor cu(DType::kInt64, {3}), ci(DType::kInt64, {2, 2}), co(DType::kInt64, {3});
    int64_t* c = static_cast<int64_t*>(cu.data());
    c[0] = 0; c[1] = 5; c[2] = 3;
    h->a.cu_seqlens = cu.view(); h->a.chunk_indices = ci.view(); h->a.chunk_offsets = co.view();
    TestTensor h0(DType::kFloat32, {2, 4, 8, 8});
    h->a.initial_state = h0.view();
    Context v = ctx;
    v.validate = true;
    expect_error([&] { chunk_gated_delta_rule_fwd(v, h->a); }, ErrorKind::kValue,
                 "cu_seqlens must be non-decreasing, got cu_seqlens[1]=5 > cu_seqlens[2]=3");
    c[2] = 12;
    expect_error([&] { chunk_gated_delta_rule_fwd(v, h->a); }, ErrorKind::kValue,
                 "cu_seqlens must end at T=8 (the packed length), got cu_seqlens[2]=12");
  }
  {
    auto h = args(s);
    h->a.allow_neg_eigval = true;
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue,
                 "allow_neg_eigval requires use_beta_sigmoid_in_kernel");
    h->a.allow_neg_eigval = false;
    h->a.use_gate_in_kernel = true;
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue, "use_gate_in_kernel requires A_log");
  }
  {
    auto h = args({1, 4, 1, 1, 300, 8, {}});
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue, "K must be <= 256");
  }
  {
    auto h = args(s);
    TestTensor v16(DType::kBFloat16, {2, 8, 4, 8});
    h->a.v = v16.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kType,
                 "v must have the dtype of q (float32), got bfloat16");
  }
  {
    auto h = args(s);
    TestTensor ws(DType::kUInt8, {16});
    h->a.workspace = ws.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue, "workspace must hold at least");
  }
  {
    auto h = args(s);
    TestTensor gbad(DType::kFloat32, {2, 8, 2});
    h->a.g = gbad.view();
    expect_error([&] { chunk_gated_delta_rule_fwd(ctx, h->a); }, ErrorKind::kValue, "g must have shape [2,8,4], got [2,8,2]");
  }
  (void)d;
  (void)cpu;
}

// The CPU backend's chunk GEMM (gdn_cpu_kernels.h) against a double loop: both layouts of A
// (row-major, packed by AVX transposes in six-row panels, and transposed), B plain and transposed,
// the triangular skips, accumulation, a separate C input, c_lower, K across the AVX block of 8 and
// past the 256-deep pack buffer, and C's old contents (NaN) never read when overwriting.
TEST(GatedDeltaRuleCpuGemm, MatchesADoubleLoop) {
  using la::cpu::Tri;
  std::mt19937 gen(11);
  std::normal_distribution<float> dist;
  int checked = 0;
  for (const auto [M, N, K] : {std::tuple{1, 1, 1}, {6, 16, 8}, {7, 17, 9}, {13, 33, 30}, {64, 128, 128},
                               {64, 64, 64}, {12, 40, 300}, {5, 3, 0}}) {
    for (const bool a_trans : {false, true})
      for (const bool b_trans : {false, true})
        for (const Tri tri : {Tri::kNone, Tri::kLower, Tri::kUpper})
          for (const int mode : {0, 1, 2}) {  // 0: overwrite, 1: accumulate, 2: C = Cin + A B
            if (tri != Tri::kNone && M != K) continue;
            SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) +
                         (a_trans ? " A^T" : "") + (b_trans ? " B^T" : "") + " tri " +
                         std::to_string(static_cast<int>(tri)) + " mode " + std::to_string(mode));
            const int64_t lda = (a_trans ? M : K) + 3, ldb = (b_trans ? K : N) + 5, ldc = N + 2;
            std::vector<float> A((a_trans ? K : M) * lda + 8), B((b_trans ? N : K) * ldb + 8), C(M * ldc);
            std::vector<float> Cin(M * ldc);
            auto a_at = [&](int64_t i, int64_t k) -> float& { return a_trans ? A[k * lda + i] : A[i * lda + k]; };
            auto b_at = [&](int64_t k, int64_t j) -> float& { return b_trans ? B[j * ldb + k] : B[k * ldb + j]; };
            for (int64_t i = 0; i < M; ++i)
              for (int64_t k = 0; k < K; ++k)
                a_at(i, k) = (tri == Tri::kLower && k > i) || (tri == Tri::kUpper && k < i) ? 0.0f : dist(gen);
            for (int64_t k = 0; k < K; ++k)
              for (int64_t j = 0; j < N; ++j) b_at(k, j) = dist(gen);
            for (auto& x : Cin) x = dist(gen);
            for (auto& x : C) x = mode == 1 ? 0.5f : std::nanf("");
            if (mode == 1)
              for (size_t e = 0; e < C.size(); ++e) C[e] = Cin[e];
            const float alpha = -0.75f;
            la::cpu::gemm(M, N, K, alpha, A.data(), a_trans ? 1 : lda, a_trans ? lda : 1, B.data(), ldb, mode == 1,
                           C.data(), ldc, tri, false, mode == 2 ? Cin.data() : nullptr, mode == 2 ? ldc : 0, b_trans);
            double worst = 0.0;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                double r = mode == 0 ? 0.0 : Cin[i * ldc + j], mag = std::abs(r);
                for (int64_t k = 0; k < K; ++k) {
                  r += static_cast<double>(alpha) * a_at(i, k) * b_at(k, j);
                  mag += std::abs(static_cast<double>(alpha) * a_at(i, k) * b_at(k, j));
                }
                const double got = C[i * ldc + j];
                ASSERT_TRUE(std::isfinite(got)) << "C(" << i << "," << j << ")";
                worst = std::max(worst, std::abs(got - r) / (1.0 + mag));
              }
            EXPECT_LE(worst, 4e-7 * (1 + K));
            ++checked;
          }
  }
  // c_lower: only the blocks touching j <= i are computed; those entries must be right.
  {
    const int64_t M = 64, N = 64, K = 40;
    std::vector<float> A(M * K), B(K * N), C(M * N, std::nanf(""));
    for (auto& x : A) x = dist(gen);
    for (auto& x : B) x = dist(gen);
    la::cpu::gemm(M, N, K, 1.0f, A.data(), K, 1, B.data(), N, false, C.data(), N, Tri::kNone, true);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        double r = 0.0;
        for (int64_t k = 0; k < K; ++k) r += static_cast<double>(A[i * K + k]) * B[k * N + j];
        EXPECT_NEAR(C[i * N + j], r, 1e-4) << i << "," << j;
      }
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace fusedops::testing
