// KDA sub-operators, the per-channel gate, fused_recurrent_kda and chunk_kda: every runnable
// backend against float64 oracles written here (plain loops over the chunks of each sequence,
// following docs/specs/linear_attention.md section 9), with the base of the precision policy = the same
// loops rounding every intermediate to the input dtype. Fixed length and varlen (with an empty
// sequence), partial chunks and sub-blocks, grouped value heads, K/V that are not multiples of
// the vector width, NaN-poisoned outputs, bitwise-repeatable backward, errors.
#include <cmath>
#include <random>
#include <tuple>

#include "fusedops/ops/gated_delta_rule.h"
#include "fusedops/ops/kda.h"
#include "src/ops/kda/kda_top.h"
#include "tests/cpp/ops/linear_attention_harness.h"

namespace fusedops::testing {
namespace {

using namespace linear_attention;

// ---------------------------------------------------------------------------------------------
// Inputs (already rounded to their storage dtypes).

struct Inputs {
  Vec q, k, v, beta, graw, gk, h0, dO, dht;
};

Vec o_cumsum(const Vec& g, const Layout& L) {
  Vec out(g.size(), 0.0);
  const At at{L.T, L.HV, L.K};
  for (const TChunk& c : all_chunks(L))
    for (int64_t h = 0; h < L.HV; ++h)
      for (int64_t d = 0; d < L.K; ++d) {
        double acc = 0;
        for (int64_t i = 0; i < c.len; ++i) {
          acc += g[at(c.b, c.t0 + i, h, d)];
          out[at(c.b, c.t0 + i, h, d)] = acc;
        }
      }
  return out;
}

Inputs make_inputs(const Layout& L, uint64_t seed, DType dt, double gate_scale = 1.0) {
  std::mt19937_64 gen(seed);
  Inputs in;
  const int64_t BTn = L.B * L.T;
  in.q = normal(BTn * L.H * L.K, gen, 0.1);
  in.k = normal(BTn * L.H * L.K, gen, 0.1);
  normalize_rows(in.q, L.K, 1e-6);
  normalize_rows(in.k, L.K, 1e-6);
  in.q = stored(in.q, dt);
  in.k = stored(in.k, dt);
  in.v = stored(normal(BTn * L.HV * L.V, gen, 0.2), dt);
  Vec b = normal(BTn * L.HV, gen);
  for (double& e : b) e = 1.0 / (1.0 + std::exp(-e));
  in.beta = stored(b, f32or(dt));
  Vec g = normal(BTn * L.HV * L.K, gen);
  for (double& e : g) e = -gate_scale * (0.02 + 0.2 * std::log1p(std::exp(e)));
  in.graw = stored(g, f32or(dt));
  in.gk = stored(o_cumsum(in.graw, L), f32or(dt));
  in.h0 = stored(normal(L.N() * L.HV * L.K * L.V, gen, 0.0, 0.5), f32or(dt));
  in.dO = stored(normal(BTn * L.HV * L.V, gen), dt);
  in.dht = stored(normal(L.N() * L.HV * L.K * L.V, gen), f32or(dt));
  return in;
}

// ---------------------------------------------------------------------------------------------
// Oracles: plain loops per chunk and value head; rd rounds every intermediate.

double dotr(const double* a, const double* b, int64_t n, Rd rd) {
  double s = 0;
  for (int64_t x = 0; x < n; ++x) s = rd(s + rd(a[x] * b[x]));
  return s;
}

// sum_c x_c y_c exp(g1_c - g2_c), rounded per step.
double edot(const double* x, const double* y, const double* g1, const double* g2, int64_t K, Rd rd) {
  double s = 0;
  for (int64_t c = 0; c < K; ++c) s = rd(s + rd(rd(x[c] * y[c]) * rd(std::exp(rd(g1[c] - g2[c])))));
  return s;
}

// Aqk (scaled, j <= i) and Akk = (I + L)^{-1}, [B,T,HV,BT].
std::pair<Vec, Vec> o_intra(const Inputs& in, const Layout& L, double scale, Rd rd) {
  Vec Aqk(L.B * L.T * L.HV * L.BT, 0.0), Akk(Aqk.size(), 0.0);
  const At aq{L.T, L.H, L.K}, ag{L.T, L.HV, L.K}, ab{L.T, L.HV, 1}, aA{L.T, L.HV, L.BT};
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t h = hv / L.G(), n = c.len;
      Vec Lm(n * n, 0.0), X(n * n, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const double* gi = &in.gk[ag(c.b, c.t0 + i, hv)];
          const double* gj = &in.gk[ag(c.b, c.t0 + j, hv)];
          const double* kj = &in.k[aq(c.b, c.t0 + j, h)];
          Aqk[aA(c.b, c.t0 + i, hv, j)] = rd(scale * edot(&in.q[aq(c.b, c.t0 + i, h)], kj, gi, gj, L.K, rd));
          if (j < i)
            Lm[i * n + j] = rd(in.beta[ab(c.b, c.t0 + i, hv)] * edot(&in.k[aq(c.b, c.t0 + i, h)], kj, gi, gj, L.K, rd));
        }
      for (int64_t i = 0; i < n; ++i) {
        X[i * n + i] = 1;
        for (int64_t m = 0; m < i; ++m)
          for (int64_t j = 0; j <= m; ++j) X[i * n + j] = rd(X[i * n + j] - rd(Lm[i * n + m] * X[m * n + j]));
      }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j <= i; ++j) Akk[aA(c.b, c.t0 + i, hv, j)] = X[i * n + j];
    }
  return {Aqk, Akk};
}

struct WU {
  Vec w, u, kg, qg;
};
WU o_wu(const Inputs& in, const Vec& Akk, const Layout& L, Rd rd) {
  WU r;
  const int64_t nK = L.B * L.T * L.HV * L.K;
  r.w.assign(nK, 0.0);
  r.kg.assign(nK, 0.0);
  r.qg.assign(nK, 0.0);
  r.u.assign(L.B * L.T * L.HV * L.V, 0.0);
  const At aq{L.T, L.H, L.K}, ag{L.T, L.HV, L.K}, ab{L.T, L.HV, 1}, aA{L.T, L.HV, L.BT}, av{L.T, L.HV, L.V};
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t h = hv / L.G(), last = c.len - 1;
      for (int64_t i = 0; i < c.len; ++i) {
        const int64_t ti = c.t0 + i;
        for (int64_t x = 0; x < L.K; ++x) {
          double s = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t tj = c.t0 + j;
            const double kb = rd(rd(in.k[aq(c.b, tj, h, x)] * rd(std::exp(in.gk[ag(c.b, tj, hv, x)]))) *
                                 in.beta[ab(c.b, tj, hv)]);
            s = rd(s + rd(Akk[aA(c.b, ti, hv, j)] * kb));
          }
          r.w[ag(c.b, ti, hv, x)] = s;
          r.kg[ag(c.b, ti, hv, x)] =
              rd(in.k[aq(c.b, ti, h, x)] * rd(std::exp(rd(in.gk[ag(c.b, c.t0 + last, hv, x)] - in.gk[ag(c.b, ti, hv, x)]))));
          r.qg[ag(c.b, ti, hv, x)] = rd(in.q[aq(c.b, ti, h, x)] * rd(std::exp(in.gk[ag(c.b, ti, hv, x)])));
        }
        for (int64_t y = 0; y < L.V; ++y) {
          double s = 0;
          for (int64_t j = 0; j <= i; ++j)
            s = rd(s + rd(Akk[aA(c.b, ti, hv, j)] * rd(in.v[av(c.b, c.t0 + j, hv, y)] * in.beta[ab(c.b, c.t0 + j, hv)])));
          r.u[av(c.b, ti, hv, y)] = s;
        }
      }
    }
  return r;
}

// O = scale qg S + tril(Aqk) Vn.
Vec o_fwd_o(const Vec& qg, const Vec& Aqk, const Vec& vn, const Vec& h, const Layout& L, double scale, Rd rd) {
  Vec o(L.B * L.T * L.HV * L.V, 0.0);
  const At ag{L.T, L.HV, L.K}, aA{L.T, L.HV, L.BT}, av{L.T, L.HV, L.V};
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const double* S = &h[(c.idx * L.HV + hv) * L.K * L.V];
      for (int64_t i = 0; i < c.len; ++i)
        for (int64_t y = 0; y < L.V; ++y) {
          double s = 0, t = 0;
          for (int64_t x = 0; x < L.K; ++x) s = rd(s + rd(qg[ag(c.b, c.t0 + i, hv, x)] * S[x * L.V + y]));
          for (int64_t j = 0; j <= i; ++j) t = rd(t + rd(Aqk[aA(c.b, c.t0 + i, hv, j)] * vn[av(c.b, c.t0 + j, hv, y)]));
          o[av(c.b, c.t0 + i, hv, y)] = rd(rd(scale * s) + t);
        }
    }
  return o;
}

// dAqk = scale tril(dO Vn^T), dv = tril(Aqk)^T dO.
std::pair<Vec, Vec> o_dAv(const Vec& Aqk, const Vec& vn, const Vec& dO, const Layout& L, double scale, Rd rd) {
  Vec dA(L.B * L.T * L.HV * L.BT, 0.0), dv(L.B * L.T * L.HV * L.V, 0.0);
  const At aA{L.T, L.HV, L.BT}, av{L.T, L.HV, L.V};
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv)
      for (int64_t i = 0; i < c.len; ++i) {
        for (int64_t j = 0; j <= i; ++j)
          dA[aA(c.b, c.t0 + i, hv, j)] = rd(scale * dotr(&dO[av(c.b, c.t0 + i, hv)], &vn[av(c.b, c.t0 + j, hv)], L.V, rd));
        for (int64_t y = 0; y < L.V; ++y) {
          double s = 0;
          for (int64_t j = i; j < c.len; ++j) s = rd(s + rd(Aqk[aA(c.b, c.t0 + j, hv, i)] * dO[av(c.b, c.t0 + j, hv, y)]));
          dv[av(c.b, c.t0 + i, hv, y)] = s;
        }
      }
  return {dA, dv};
}

double dO_at(const Inputs& in, const At& av, const TChunk& c, int64_t hv, int64_t i, int64_t y) {
  return in.dO[av(c.b, c.t0 + i, hv, y)];
}

struct WyOut {
  Vec dq, dk, dv, dbeta, dg, dAkk;
};

// Block K3 of section 9.5, element by element.
WyOut o_wy(const Inputs& in, const Vec& vn, const Vec& Akk, const Vec& h, const Vec& dh, const Vec& dvn,
           const Layout& L, double scale, Rd rd) {
  WyOut r;
  const int64_t K = L.K, V = L.V;
  r.dq.assign(L.B * L.T * L.H * K, 0.0);
  r.dk.assign(r.dq.size(), 0.0);
  r.dv.assign(L.B * L.T * L.HV * V, 0.0);
  r.dbeta.assign(L.B * L.T * L.HV, 0.0);
  r.dg.assign(L.B * L.T * L.HV * K, 0.0);
  r.dAkk.assign(L.B * L.T * L.HV * L.BT, 0.0);
  const At aq{L.T, L.H, K}, ag{L.T, L.HV, K}, ab{L.T, L.HV, 1}, aA{L.T, L.HV, L.BT}, av{L.T, L.HV, V};
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t hh = hv / L.G(), n = c.len, last = n - 1;
      const double* S = &h[(c.idx * L.HV + hv) * K * V];
      const double* dH = &dh[(c.idx * L.HV + hv) * K * V];
      auto Q = [&](int64_t i, int64_t x) { return in.q[aq(c.b, c.t0 + i, hh, x)]; };
      auto Kc = [&](int64_t i, int64_t x) { return in.k[aq(c.b, c.t0 + i, hh, x)]; };
      auto Gm = [&](int64_t i, int64_t x) { return in.gk[ag(c.b, c.t0 + i, hv, x)]; };
      auto bt = [&](int64_t i) { return in.beta[ab(c.b, c.t0 + i, hv)]; };
      auto A = [&](int64_t i, int64_t j) { return j <= i ? Akk[aA(c.b, c.t0 + i, hv, j)] : 0.0; };
      auto dVn = [&](int64_t i, int64_t y) { return dvn[av(c.b, c.t0 + i, hv, y)]; };
      Vec dQ(n * K), dKi(n * K), dW(n * K), Ke(n * K), R(n * K, 0.0), P(n * V, 0.0), dA(n * n, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) {
          double s1 = 0, s2 = 0, s3 = 0;
          for (int64_t y = 0; y < V; ++y) {
            s1 = rd(s1 + rd(dO_at(in, av, c, hv, i, y) * S[x * V + y]));
            s2 = rd(s2 + rd(vn[av(c.b, c.t0 + i, hv, y)] * dH[x * V + y]));
            s3 = rd(s3 + rd(dVn(i, y) * S[x * V + y]));
          }
          const double eg = rd(std::exp(Gm(i, x)));
          dQ[i * K + x] = rd(rd(scale * eg) * s1);
          dKi[i * K + x] = rd(rd(std::exp(rd(Gm(last, x) - Gm(i, x)))) * s2);
          dW[i * K + x] = -s3;
          Ke[i * K + x] = rd(Kc(i, x) * eg);
        }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) {
          double s = 0;
          for (int64_t y = 0; y < V; ++y) s = rd(s + rd(dVn(i, y) * in.v[av(c.b, c.t0 + j, hv, y)]));
          for (int64_t x = 0; x < K; ++x) s = rd(s + rd(dW[i * K + x] * Ke[j * K + x]));
          dA[i * n + j] = rd(s * bt(j));
        }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t x = 0; x < K; ++x) {
          double s = 0;
          for (int64_t m = i; m < n; ++m) s = rd(s + rd(A(m, i) * dW[m * K + x]));
          R[i * K + x] = s;
        }
        for (int64_t y = 0; y < V; ++y) {
          double s = 0;
          for (int64_t m = i; m < n; ++m) s = rd(s + rd(A(m, i) * dVn(m, y)));
          P[i * V + y] = s;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        double db = 0;
        for (int64_t y = 0; y < V; ++y) {
          db = rd(db + rd(P[i * V + y] * in.v[av(c.b, c.t0 + i, hv, y)]));
          r.dv[av(c.b, c.t0 + i, hv, y)] = rd(bt(i) * P[i * V + y]);
        }
        for (int64_t x = 0; x < K; ++x) db = rd(db + rd(R[i * K + x] * Ke[i * K + x]));
        r.dbeta[ab(c.b, c.t0 + i, hv)] = db;
        for (int64_t x = 0; x < K; ++x) {
          const int64_t y = i * K + x;
          double dgv = rd(rd(rd(Q(i, x) * dQ[y]) - rd(Kc(i, x) * dKi[y])) + rd(rd(bt(i) * Ke[y]) * R[y]));
          if (i == last) {
            double sh = 0, kd = 0;
            for (int64_t v2 = 0; v2 < V; ++v2) sh = rd(sh + rd(S[x * V + v2] * dH[x * V + v2]));
            for (int64_t m = 0; m < n; ++m) kd = rd(kd + rd(Kc(m, x) * dKi[m * K + x]));
            dgv = rd(dgv + rd(rd(rd(std::exp(Gm(last, x))) * sh) + kd));
          }
          r.dg[ag(c.b, c.t0 + i, hv, x)] = dgv;
          r.dq[aq(c.b, c.t0 + i, hh, x)] = rd(r.dq[aq(c.b, c.t0 + i, hh, x)] + dQ[y]);
          r.dk[aq(c.b, c.t0 + i, hh, x)] =
              rd(r.dk[aq(c.b, c.t0 + i, hh, x)] + rd(dKi[y] + rd(rd(bt(i) * rd(std::exp(Gm(i, x)))) * R[y])));
        }
      }
      // dL = -M> . (A^T dA A^T)
      Vec X(n * n, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t m = 0; m < n; ++m) s = rd(s + rd(dA[i * n + m] * A(j, m)));
          X[i * n + j] = s;
        }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < i; ++j) {
          double s = 0;
          for (int64_t m = 0; m < n; ++m) s = rd(s + rd(A(m, i) * X[m * n + j]));
          r.dAkk[aA(c.b, c.t0 + i, hv, j)] = -s;
        }
    }
  return r;
}

struct IntraOut {
  Vec dq, dk, dbeta, dg;
};

// Block K4 with element-wise exponentials (the factorisation is the library's business).
IntraOut o_bintra(const Inputs& in, const Vec& dAqk, const Vec& dAkk, const IntraOut& part, const Layout& L, Rd rd) {
  IntraOut r = part;
  const int64_t K = L.K;
  const At aq{L.T, L.H, K}, ag{L.T, L.HV, K}, ab{L.T, L.HV, 1}, aA{L.T, L.HV, L.BT};
  for (const TChunk& c : all_chunks(L))
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t hh = hv / L.G(), n = c.len;
      auto Q = [&](int64_t i) { return &in.q[aq(c.b, c.t0 + i, hh)]; };
      auto Kc = [&](int64_t i) { return &in.k[aq(c.b, c.t0 + i, hh)]; };
      auto Gm = [&](int64_t i) { return &in.gk[ag(c.b, c.t0 + i, hv)]; };
      auto bt = [&](int64_t i) { return in.beta[ab(c.b, c.t0 + i, hv)]; };
      auto Dq = [&](int64_t i, int64_t j) { return dAqk[aA(c.b, c.t0 + i, hv, j)]; };
      auto Dl = [&](int64_t i, int64_t j) { return dAkk[aA(c.b, c.t0 + i, hv, j)]; };
      for (int64_t i = 0; i < n; ++i)
        for (int64_t x = 0; x < K; ++x) {
          // row terms (j <= i) and column terms (i' >= i)
          double dqi = 0, rr = 0, cc = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const double e = rd(std::exp(rd(Gm(i)[x] - Gm(j)[x])));
            dqi = rd(dqi + rd(rd(Dq(i, j) * Kc(j)[x]) * e));
            if (j < i) rr = rd(rr + rd(rd(Dl(i, j) * Kc(j)[x]) * e));
          }
          for (int64_t m = i; m < n; ++m) {
            const double e = rd(std::exp(rd(Gm(m)[x] - Gm(i)[x])));
            cc = rd(cc + rd(rd(Dq(m, i) * Q(m)[x]) * e));
            if (m > i) cc = rd(cc + rd(rd(rd(Dl(m, i) * bt(m)) * Kc(m)[x]) * e));
          }
          r.dbeta[ab(c.b, c.t0 + i, hv)] = rd(r.dbeta[ab(c.b, c.t0 + i, hv)] + rd(rr * Kc(i)[x]));
          rr = rd(rr * bt(i));
          const double dd = rd(Dq(i, i) * rd(Q(i)[x] * Kc(i)[x]));  // the diagonal terms cancel in dg
          double& dg = r.dg[ag(c.b, c.t0 + i, hv, x)];
          dg = rd(dg + rd(rd(rd(Q(i)[x] * dqi) - dd) + rd(rd(rr - cc) * Kc(i)[x]) + dd));
          r.dq[aq(c.b, c.t0 + i, hh, x)] = rd(r.dq[aq(c.b, c.t0 + i, hh, x)] + dqi);
          r.dk[aq(c.b, c.t0 + i, hh, x)] = rd(r.dk[aq(c.b, c.t0 + i, hh, x)] + rd(rr + cc));
        }
    }
  return r;
}

// The gk variants of GDN's state recurrences as KDA calls them (k := kg, q := qg, per value head).
struct StateOut {
  Vec h, vn, ht, dh, dv2, dh0;
};
StateOut o_state(const Vec& kg, const Vec& w, const Vec& u, const Vec& gk, const Vec& h0, const Vec& qg,
                 const Vec& dO, const Vec& dvl, const Vec& dht, const Layout& L, double scale, Rd rd) {
  const int64_t K = L.K, V = L.V, KV = K * V;
  const int64_t nsnap = (L.cu.empty() ? L.B : 1) * snapshots(L) * L.HV * KV;
  StateOut r;
  r.h.assign(nsnap, 0.0);
  r.dh.assign(nsnap, 0.0);
  r.vn.assign(L.B * L.T * L.HV * V, 0.0);
  r.dv2.assign(r.vn.size(), 0.0);
  r.ht.assign(L.N() * L.HV * KV, 0.0);
  r.dh0.assign(r.ht.size(), 0.0);
  const At ag{L.T, L.HV, K}, av{L.T, L.HV, V};
  const auto sc = seq_chunks(L);
  for (int64_t n = 0; n < L.N(); ++n)
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      Vec X(h0.begin() + (n * L.HV + hv) * KV, h0.begin() + (n * L.HV + hv + 1) * KV);
      for (const TChunk& c : sc[n]) {
        std::copy(X.begin(), X.end(), r.h.begin() + (c.idx * L.HV + hv) * KV);
        const int64_t last = c.len - 1;
        for (int64_t i = 0; i < c.len; ++i)
          for (int64_t y = 0; y < V; ++y) {
            double s = 0;
            for (int64_t x = 0; x < K; ++x) s = rd(s + rd(w[ag(c.b, c.t0 + i, hv, x)] * X[x * V + y]));
            r.vn[av(c.b, c.t0 + i, hv, y)] = rd(u[av(c.b, c.t0 + i, hv, y)] - s);
          }
        for (int64_t x = 0; x < K; ++x)
          for (int64_t y = 0; y < V; ++y) {
            double s = rd(rd(std::exp(gk[ag(c.b, c.t0 + last, hv, x)])) * X[x * V + y]);
            for (int64_t i = 0; i < c.len; ++i)
              s = rd(s + rd(kg[ag(c.b, c.t0 + i, hv, x)] * r.vn[av(c.b, c.t0 + i, hv, y)]));
            X[x * V + y] = s;
          }
      }
      std::copy(X.begin(), X.end(), r.ht.begin() + (n * L.HV + hv) * KV);
      Vec D(dht.begin() + (n * L.HV + hv) * KV, dht.begin() + (n * L.HV + hv + 1) * KV);
      for (auto it = sc[n].rbegin(); it != sc[n].rend(); ++it) {
        const TChunk& c = *it;
        std::copy(D.begin(), D.end(), r.dh.begin() + (c.idx * L.HV + hv) * KV);
        const int64_t last = c.len - 1;
        for (int64_t i = 0; i < c.len; ++i)
          for (int64_t y = 0; y < V; ++y) {
            double s = dvl[av(c.b, c.t0 + i, hv, y)];
            for (int64_t x = 0; x < K; ++x) s = rd(s + rd(kg[ag(c.b, c.t0 + i, hv, x)] * D[x * V + y]));
            r.dv2[av(c.b, c.t0 + i, hv, y)] = s;
          }
        for (int64_t x = 0; x < K; ++x)
          for (int64_t y = 0; y < V; ++y) {
            double s = rd(rd(std::exp(gk[ag(c.b, c.t0 + last, hv, x)])) * D[x * V + y]);
            for (int64_t i = 0; i < c.len; ++i) {
              s = rd(s + rd(rd(scale * qg[ag(c.b, c.t0 + i, hv, x)]) * dO[av(c.b, c.t0 + i, hv, y)]));
              s = rd(s - rd(w[ag(c.b, c.t0 + i, hv, x)] * r.dv2[av(c.b, c.t0 + i, hv, y)]));
            }
            D[x * V + y] = s;
          }
      }
      std::copy(D.begin(), D.end(), r.dh0.begin() + (n * L.HV + hv) * KV);
    }
  return r;
}

// The per-token recurrence (section 9.1) and its backward, per sequence and value head.
struct RecOut {
  Vec o, ht, dq, dk, dv, dg, dbeta, dh0;
};

RecOut o_recurrent(const Inputs& in, const Layout& L, double scale, bool with_g, bool with_beta, Rd rd) {
  const int64_t K = L.K, V = L.V, KV = K * V;
  RecOut r;
  r.o.assign(L.B * L.T * L.HV * V, 0.0);
  r.ht.assign(L.N() * L.HV * KV, 0.0);
  r.dq.assign(L.B * L.T * L.H * K, 0.0);
  r.dk.assign(r.dq.size(), 0.0);
  r.dv.assign(r.o.size(), 0.0);
  r.dg.assign(L.B * L.T * L.HV * K, 0.0);
  r.dbeta.assign(L.B * L.T * L.HV, 0.0);
  r.dh0.assign(r.ht.size(), 0.0);
  const At aq{L.T, L.H, K}, ag{L.T, L.HV, K}, ab{L.T, L.HV, 1}, av{L.T, L.HV, V};
  for (int64_t n = 0; n < L.N(); ++n) {
    const int64_t b = L.cu.empty() ? n : 0, t0 = L.cu.empty() ? 0 : L.cu[n];
    const int64_t len = L.cu.empty() ? L.T : L.cu[n + 1] - L.cu[n];
    for (int64_t hv = 0; hv < L.HV; ++hv) {
      const int64_t hh = hv / L.G();
      std::vector<Vec> St(len);  // decayed state before each token's update
      Vec S(in.h0.begin() + (n * L.HV + hv) * KV, in.h0.begin() + (n * L.HV + hv + 1) * KV);
      auto a = [&](int64_t t, int64_t x) { return with_g ? rd(std::exp(in.graw[ag(b, t, hv, x)])) : 1.0; };
      auto be = [&](int64_t t) { return with_beta ? in.beta[ab(b, t, hv)] : 1.0; };
      std::vector<Vec> deltas(len, Vec(V)), ps(len, Vec(V));
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = t0 + s;
        for (int64_t x = 0; x < K; ++x)
          for (int64_t y = 0; y < V; ++y) S[x * V + y] = rd(a(t, x) * S[x * V + y]);
        St[s] = S;
        for (int64_t y = 0; y < V; ++y) {
          double p = 0;
          for (int64_t x = 0; x < K; ++x) p = rd(p + rd(in.k[aq(b, t, hh, x)] * S[x * V + y]));
          ps[s][y] = p;
          deltas[s][y] = rd(be(t) * rd(in.v[av(b, t, hv, y)] - p));
        }
        for (int64_t x = 0; x < K; ++x)
          for (int64_t y = 0; y < V; ++y) S[x * V + y] = rd(S[x * V + y] + rd(in.k[aq(b, t, hh, x)] * deltas[s][y]));
        for (int64_t y = 0; y < V; ++y) {
          double o = 0;
          for (int64_t x = 0; x < K; ++x) o = rd(o + rd(in.q[aq(b, t, hh, x)] * S[x * V + y]));
          r.o[av(b, t, hv, y)] = rd(scale * o);
        }
      }
      std::copy(S.begin(), S.end(), r.ht.begin() + (n * L.HV + hv) * KV);
      Vec dS(in.dht.begin() + (n * L.HV + hv) * KV, in.dht.begin() + (n * L.HV + hv + 1) * KV);
      for (int64_t s = len - 1; s >= 0; --s) {
        const int64_t t = t0 + s;
        const Vec& Sd = St[s];
        const double* qt = &in.q[aq(b, t, hh)];
        const double* kt = &in.k[aq(b, t, hh)];
        const double* dot = &in.dO[av(b, t, hv)];
        for (int64_t x = 0; x < K; ++x) {
          double acc = 0;
          for (int64_t y = 0; y < V; ++y) {
            acc = rd(acc + rd(rd(Sd[x * V + y] + rd(kt[x] * deltas[s][y])) * dot[y]));
            dS[x * V + y] = rd(dS[x * V + y] + rd(rd(scale * qt[x]) * dot[y]));
          }
          r.dq[aq(b, t, hh, x)] = rd(r.dq[aq(b, t, hh, x)] + rd(scale * acc));
        }
        Vec dd(V, 0.0), dp(V);
        Vec dkt(K, 0.0);
        for (int64_t x = 0; x < K; ++x)
          for (int64_t y = 0; y < V; ++y) {
            dkt[x] = rd(dkt[x] + rd(dS[x * V + y] * deltas[s][y]));
            dd[y] = rd(dd[y] + rd(dS[x * V + y] * kt[x]));
          }
        double db = 0;
        for (int64_t y = 0; y < V; ++y) {
          r.dv[av(b, t, hv, y)] = rd(be(t) * dd[y]);
          db = rd(db + rd(dd[y] * rd(in.v[av(b, t, hv, y)] - ps[s][y])));
          dp[y] = rd(-be(t) * dd[y]);
        }
        r.dbeta[ab(b, t, hv)] = db;
        for (int64_t x = 0; x < K; ++x) {
          double acc = 0, accg = 0;
          for (int64_t y = 0; y < V; ++y) {
            const double d = rd(dS[x * V + y] + rd(kt[x] * dp[y]));
            acc = rd(acc + rd(Sd[x * V + y] * dp[y]));
            accg = rd(accg + rd(Sd[x * V + y] * d));
            dS[x * V + y] = rd(a(t, x) * d);
          }
          r.dk[aq(b, t, hh, x)] = rd(r.dk[aq(b, t, hh, x)] + rd(dkt[x] + acc));
          r.dg[ag(b, t, hv, x)] = accg;
        }
      }
      std::copy(dS.begin(), dS.end(), r.dh0.begin() + (n * L.HV + hv) * KV);
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------

std::vector<Case> cases() {
  return {
      {{2, 41, 1, 2, 24, 20, 32, {}}, "B2 T41 GVA2 K24 V20 BT32"},
      {{1, 75, 2, 2, 20, 36, 64, {0, 15, 15, 37, 75}}, "varlen [0,15,15,37,75] BT64"},
      {{1, 70, 1, 1, 33, 9, 64, {}}, "B1 T70 K33 V9 BT64"},
      {{1, 1, 1, 3, 8, 8, 32, {}}, "single token GVA3"},
      // K = V = 128 at chunk 64: the shape of the GDN state recurrences' 16-bit mma kernels, which
      // KDA's pipeline calls in their per-channel-gate form.
      {{2, 100, 1, 1, 128, 128, 64, {}}, "B2 T100 K128 V128 BT64", true},
      {{1, 150, 1, 2, 128, 128, 64, {0, 70, 150}}, "varlen [0,70,150] GVA2 K128 V128 BT64", true},
  };
}

template <class Fn>
void for_each_case(const std::string& op, Direction dir, Fn&& fn) {
  linear_attention::for_each_case(cases(), op, dir, fn);
}

void expect_close(const char* what, const TestTensor& ours, const Vec& base, const Vec& ref, DType dt) {
  linear_attention::expect_close(what, ours, base, ref, dt, 1e-11);
}

// ---------------------------------------------------------------------------------------------

TEST(KdaSubops, FwdIntraAndRecomputeWU) {
  for_each_case("chunk_kda_fwd_intra", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 11, dt, 2.0);
    const Rd rb{dt}, acc{f32or(dt)};
    TestTensor q = tensor(dt, tok(L, L.H, L.K), in.q, b.device), k = tensor(dt, tok(L, L.H, L.K), in.k, b.device);
    TestTensor gk = tensor(f32or(dt), tok(L, L.HV, L.K), in.gk, b.device);
    TestTensor beta = tensor(f32or(dt), {L.B, L.T, L.HV}, in.beta, b.device);
    TestTensor Aqk = poisoned(dt, tok(L, L.HV, L.BT), b.device), Akk = poisoned(dt, tok(L, L.HV, L.BT), b.device);
    const double scale = 0.7;
    chunk_kda_fwd_intra(b.ctx(), {q.view(), k.view(), gk.view(), beta.view(), Aqk.view(), Akk.view(), ix.cuv(),
                                  ix.civ(), scale, L.BT});
    const auto r64 = o_intra(in, L, scale, kExact), rb_ = o_intra(in, L, scale, acc);
    expect_close("Aqk", Aqk, stored(rb_.first, dt), r64.first, dt);
    expect_close("Akk", Akk, stored(rb_.second, dt), r64.second, dt);
    // W, U, kg, qg from the oracle's Akk stored in dt.
    const Vec Akks = stored(r64.second, dt);
    TestTensor Ak = tensor(dt, tok(L, L.HV, L.BT), Akks, b.device);
    TestTensor v = tensor(dt, tok(L, L.HV, L.V), in.v, b.device);
    TestTensor w = poisoned(dt, tok(L, L.HV, L.K), b.device), u = poisoned(dt, tok(L, L.HV, L.V), b.device);
    TestTensor kg = poisoned(dt, tok(L, L.HV, L.K), b.device), qg = poisoned(dt, tok(L, L.HV, L.K), b.device);
    kda_recompute_w_u_fwd(b.ctx(), {q.view(), k.view(), v.view(), beta.view(), Ak.view(), gk.view(), w.view(),
                                    u.view(), kg.view(), qg.view(), ix.cuv(), ix.civ()});
    const WU w64 = o_wu(in, Akks, L, kExact), wb = o_wu(in, Akks, L, acc);
    expect_close("w", w, stored(wb.w, dt), w64.w, dt);
    expect_close("u", u, stored(wb.u, dt), w64.u, dt);
    expect_close("kg", kg, stored(wb.kg, dt), w64.kg, dt);
    expect_close("qg", qg, stored(wb.qg, dt), w64.qg, dt);
    (void)rb;
  });
}

// Gates that decay fast inside a 16-row block: channels below K / 2 lose ~2.5 nats a step (a
// block spans ~54 log2 units, the bf16 CUDA kernel's diagonal blocks stay on mma with factors up
// to 2^54), and in the second 16-row block of every chunk one upper channel loses 6 nats a step (a
// span past 64: that half of that chunk goes element-wise). Aqk and Akk against the oracle, every
// backend and dtype, varlen with partial chunks.
TEST(KdaSubops, FwdIntraWithFastDecayingGates) {
  int checked = 0;
  for (const auto& b : runnable_backends("chunk_kda_fwd_intra", Direction::kForward))
    for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
      if (!backend_takes("chunk_kda_fwd_intra", Direction::kForward, b.id, dt)) continue;
      SCOPED_TRACE(b.id + "/" + dtype_name(dt));
      const Layout L{1, 230, 1, 2, 128, 128, 64, {0, 71, 230}};
      Inputs in = make_inputs(L, 23, dt);
      for (int64_t t = 0; t < L.T; ++t)
        for (int64_t h = 0; h < L.HV; ++h)
          for (int64_t c = 0; c < L.K; ++c) {
            double& g = in.graw[(t * L.HV + h) * L.K + c];
            const int64_t row = (t < 71 ? t : t - 71) % 64;
            if (c < L.K / 2) g = -2.5 + 0.1 * std::sin(0.37 * static_cast<double>(t + c));
            if (c == L.K - 3 && row >= 16 && row < 32) g = -6.0;
          }
      in.graw = stored(in.graw, f32or(dt));
      in.gk = stored(o_cumsum(in.graw, L), f32or(dt));
      const Index ix = make_index(L, b.device);
      TestTensor q = tensor(dt, tok(L, L.H, L.K), in.q, b.device), k = tensor(dt, tok(L, L.H, L.K), in.k, b.device);
      TestTensor gk = tensor(f32or(dt), tok(L, L.HV, L.K), in.gk, b.device);
      TestTensor beta = tensor(f32or(dt), {L.B, L.T, L.HV}, in.beta, b.device);
      TestTensor Aqk = poisoned(dt, tok(L, L.HV, L.BT), b.device), Akk = poisoned(dt, tok(L, L.HV, L.BT), b.device);
      chunk_kda_fwd_intra(b.ctx(), {q.view(), k.view(), gk.view(), beta.view(), Aqk.view(), Akk.view(), ix.cuv(),
                                    ix.civ(), 0.6, L.BT});
      const auto r64 = o_intra(in, L, 0.6, kExact), rb = o_intra(in, L, 0.6, Rd{f32or(dt)});
      expect_close("Aqk", Aqk, stored(rb.first, dt), r64.first, dt);
      expect_close("Akk", Akk, stored(rb.second, dt), r64.second, dt);
      // And in the RMS: within twice the error of the fp32-accumulated oracle stored in dt (the
      // max-abs tolerance above is loose against these small entries).
      const double eq = rms_relative_error(stored(rb.first, dt), r64.first);
      const double ek = rms_relative_error(stored(rb.second, dt), r64.second);
      EXPECT_LE(rms_relative_error(Aqk.to_double(), r64.first), 2 * eq + 1e-9) << "Aqk base rms-rel " << eq;
      EXPECT_LE(rms_relative_error(Akk.to_double(), r64.second), 2 * ek + 1e-9) << "Akk base rms-rel " << ek;
      ++checked;
    }
  EXPECT_GT(checked, 0);
}

TEST(KdaSubops, FwdOAndBwdDAv) {
  for_each_case("chunk_kda_fwd_o", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 12, dt);
    const Rd acc{f32or(dt)};
    std::mt19937_64 gen(3);
    const int64_t nsnap = (L.cu.empty() ? L.B : 1) * snapshots(L) * L.HV * L.K * L.V;
    const Vec qg = stored(normal(L.B * L.T * L.HV * L.K, gen), dt);
    const Vec h = stored(normal(nsnap, gen, 0, 0.5), dt);
    const Vec vn = stored(normal(L.B * L.T * L.HV * L.V, gen), dt);
    const Vec Aqk = stored(o_intra(in, L, 0.3, kExact).first, dt);
    TestTensor tqg = tensor(dt, tok(L, L.HV, L.K), qg, b.device), th = tensor(dt, snap(L), h, b.device);
    TestTensor tvn = tensor(dt, tok(L, L.HV, L.V), vn, b.device), tA = tensor(dt, tok(L, L.HV, L.BT), Aqk, b.device);
    TestTensor o = poisoned(dt, tok(L, L.HV, L.V), b.device);
    chunk_kda_fwd_o(b.ctx(), {tqg.view(), tA.view(), tvn.view(), th.view(), o.view(), ix.cuv(), ix.civ(), 0.6});
    expect_close("o", o, stored(o_fwd_o(qg, Aqk, vn, h, L, 0.6, acc), dt), o_fwd_o(qg, Aqk, vn, h, L, 0.6, kExact), dt);
    TestTensor dO = tensor(dt, tok(L, L.HV, L.V), in.dO, b.device);
    TestTensor dA = poisoned(f32or(dt), tok(L, L.HV, L.BT), b.device), dv = poisoned(dt, tok(L, L.HV, L.V), b.device);
    chunk_kda_bwd_dAv(b.ctx(), {tA.view(), tvn.view(), dO.view(), dA.view(), dv.view(), ix.cuv(), ix.civ(), 0.6});
    const auto r64 = o_dAv(Aqk, vn, in.dO, L, 0.6, kExact), rb = o_dAv(Aqk, vn, in.dO, L, 0.6, acc);
    expect_close("dAqk", dA, rb.first, r64.first, f32or(dt));
    expect_close("dAv dv", dv, stored(rb.second, dt), r64.second, dt);
  });
}

TEST(KdaSubops, BwdWyDqkgFusedAndBwdIntra) {
  for_each_case("chunk_kda_bwd_wy_dqkg_fused", Direction::kBackward,
                [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 13, dt, 2.0);
    const Rd acc{f32or(dt)};
    const DType adt = f32or(dt);
    std::mt19937_64 gen(4);
    const int64_t nsnap = (L.cu.empty() ? L.B : 1) * snapshots(L) * L.HV * L.K * L.V, nv = L.B * L.T * L.HV * L.V;
    const Vec h = stored(normal(nsnap, gen, 0, 0.5), dt), dh = stored(normal(nsnap, gen, 0, 0.5), dt);
    const Vec vn = stored(normal(nv, gen), dt), dvn = stored(normal(nv, gen), dt);
    const Vec Akk = stored(o_intra(in, L, 0.3, kExact).second, dt);
    auto T_ = [&](DType d, std::vector<int64_t> s, const Vec& x) { return tensor(d, s, x, b.device); };
    TestTensor q = T_(dt, tok(L, L.H, L.K), in.q), k = T_(dt, tok(L, L.H, L.K), in.k), v = T_(dt, tok(L, L.HV, L.V), in.v);
    TestTensor tvn = T_(dt, tok(L, L.HV, L.V), vn), gk = T_(adt, tok(L, L.HV, L.K), in.gk);
    TestTensor beta = T_(adt, {L.B, L.T, L.HV}, in.beta), tA = T_(dt, tok(L, L.HV, L.BT), Akk);
    TestTensor th = T_(dt, snap(L), h), tdh = T_(dt, snap(L), dh), dO = T_(dt, tok(L, L.HV, L.V), in.dO);
    TestTensor tdvn = T_(dt, tok(L, L.HV, L.V), dvn);
    TestTensor dq = poisoned(adt, tok(L, L.H, L.K), b.device), dk = poisoned(adt, tok(L, L.H, L.K), b.device);
    TestTensor dv = poisoned(dt, tok(L, L.HV, L.V), b.device), db = poisoned(adt, {L.B, L.T, L.HV}, b.device);
    TestTensor dg = poisoned(adt, tok(L, L.HV, L.K), b.device), dAkk = poisoned(adt, tok(L, L.HV, L.BT), b.device);
    const double scale = 0.45;
    chunk_kda_bwd_wy_dqkg_fused(b.ctx(), {q.view(), k.view(), v.view(), tvn.view(), gk.view(), beta.view(), tA.view(),
                                          th.view(), tdh.view(), dO.view(), tdvn.view(), dq.view(), dk.view(), dv.view(),
                                          db.view(), dg.view(), dAkk.view(), ix.cuv(), ix.civ(), scale, L.BT});
    const WyOut r64 = o_wy(in, vn, Akk, h, dh, dvn, L, scale, kExact), rb = o_wy(in, vn, Akk, h, dh, dvn, L, scale, acc);
    // fp32 partial sums of 16-bit inputs: held to the inputs' precision (the precision policy's
    // coarser of the input and output dtypes; the CUDA kernel's products are tf32 for 16-bit inputs).
    expect_close("wy dq", dq, rb.dq, r64.dq, dt);
    expect_close("wy dk", dk, rb.dk, r64.dk, dt);
    expect_close("wy dv", dv, stored(rb.dv, dt), r64.dv, dt);
    expect_close("wy dbeta", db, rb.dbeta, r64.dbeta, dt);
    expect_close("wy dg", dg, rb.dg, r64.dg, dt);
    expect_close("wy dAkk", dAkk, rb.dAkk, r64.dAkk, dt);
    // bwd_intra on the oracle's partials, with dAqk from random dO / v_new.
    const Vec dAqk = stored(o_dAv(Akk, vn, in.dO, L, 0.5, kExact).first, adt);
    const Vec dAk = stored(r64.dAkk, adt);
    const IntraOut part{stored(r64.dq, adt), stored(r64.dk, adt), stored(r64.dbeta, adt), stored(r64.dg, adt)};
    TestTensor tdAq = T_(adt, tok(L, L.HV, L.BT), dAqk), tdAk = T_(adt, tok(L, L.HV, L.BT), dAk);
    TestTensor pq = T_(adt, tok(L, L.H, L.K), part.dq), pk = T_(adt, tok(L, L.H, L.K), part.dk);
    TestTensor pb = T_(adt, {L.B, L.T, L.HV}, part.dbeta), pg = T_(adt, tok(L, L.HV, L.K), part.dg);
    TestTensor oq = poisoned(dt, tok(L, L.H, L.K), b.device), ok = poisoned(dt, tok(L, L.H, L.K), b.device);
    TestTensor ob = poisoned(adt, {L.B, L.T, L.HV}, b.device);
    chunk_kda_bwd_intra(b.ctx(), {q.view(), k.view(), gk.view(), beta.view(), tdAq.view(), tdAk.view(), pq.view(),
                                  pk.view(), pb.view(), pg.view(), oq.view(), ok.view(), ob.view(), pg.view(), ix.cuv(),
                                  ix.civ(), L.BT});
    const IntraOut i64 = o_bintra(in, dAqk, dAk, part, L, kExact), ib = o_bintra(in, dAqk, dAk, part, L, acc);
    expect_close("intra dq", oq, stored(ib.dq, dt), i64.dq, dt);
    expect_close("intra dk", ok, stored(ib.dk, dt), i64.dk, dt);
    // dbeta and dg are fp32, held to the inputs' precision like every output here: the CUDA
    // kernel's off-diagonal products round dA and the gate-scaled q, k to the 16-bit input type.
    expect_close("intra dbeta", ob, ib.dbeta, i64.dbeta, dt);
    expect_close("intra dg (in place)", pg, ib.dg, i64.dg, dt);
  });
}

TEST(KdaSubops, GateBothForms) {
  for (const auto& b : runnable_backends("kda_gate", Direction::kBackward))
    for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
      if (!backend_takes("kda_gate", Direction::kBackward, b.id, dt)) continue;
      for (bool lb : {false, true}) {
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + (lb ? "/lower_bound" : "/softplus"));
        const int64_t B = 2, T = 9, HV = 3, K = 5, n = B * T * HV * K;
        std::mt19937_64 gen(5);
        Vec g = stored(normal(n, gen, 0, 3), dt);
        g[0] = round_to(dt, 30.0);  // softplus's linear branch
        const Vec A = stored(normal(HV, gen), dt), bias = stored(normal(HV * K, gen), dt), dy = stored(normal(n, gen), dt);
        const double lbv = -4.0;
        auto oracle = [&](Rd rd, Vec& y, Vec& dg, Vec& dA, Vec& db) {
          y.assign(n, 0);
          dg.assign(n, 0);
          dA.assign(HV, 0);
          db.assign(HV * K, 0);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t hv = (i / K) % HV, c = i % K;
            const double a = rd(std::exp(A[hv])), z = rd(g[i] + bias[hv * K + c]);
            if (lb) {
              const double s = rd(1 / (1 + std::exp(-rd(a * z))));
              y[i] = rd(lbv * s);
              dg[i] = rd(rd(rd(dy[i] * lbv) * rd(s * rd(1 - s))) * a);
              dA[hv] = rd(dA[hv] + rd(dg[i] * z));
            } else {
              const double sp = z > 20 ? z : rd(std::log1p(std::exp(z)));
              y[i] = rd(-a * sp);
              dg[i] = rd(rd(-a * rd(1 / (1 + std::exp(-z)))) * dy[i]);
              dA[hv] = rd(dA[hv] + rd(dy[i] * y[i]));
            }
            db[hv * K + c] = rd(db[hv * K + c] + dg[i]);
          }
        };
        Vec y64, dg64, dA64, db64, yb, dgb, dAb, dbb;
        oracle(kExact, y64, dg64, dA64, db64);
        oracle(Rd{f32or(dt)}, yb, dgb, dAb, dbb);
        TestTensor tg = tensor(dt, {B, T, HV, K}, g, b.device), tA = tensor(dt, {HV}, A, b.device);
        TestTensor tb = tensor(dt, {HV * K}, bias, b.device), tdy = tensor(dt, {B, T, HV, K}, dy, b.device);
        TestTensor y = poisoned(f32or(dt), {B, T, HV, K}, b.device), dg = poisoned(dt, {B, T, HV, K}, b.device);
        TestTensor dA = poisoned(f32or(dt), {HV}, b.device), db = poisoned(f32or(dt), {HV * K}, b.device);
        Context ctx = b.ctx();
        kda_gate_fwd(ctx, {tg.view(), tA.view(), tb.view(), y.view(), lb, lbv});
        kda_gate_bwd(ctx, {tg.view(), tA.view(), tb.view(), tdy.view(), dg.view(), dA.view(), db.view(), lb, lbv});
        expect_close("gate y", y, yb, y64, f32or(dt));
        expect_close("gate dg", dg, stored(dgb, dt), dg64, dt);
        expect_close("gate dA_log", dA, dAb, dA64, f32or(dt));
        expect_close("gate ddt_bias", db, dbb, db64, f32or(dt));
      }
    }
}

TEST(KdaSubops, GdnStateRecurrencesInTheirGkForm) {
  for_each_case("chunk_gated_delta_rule_fwd_h", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 17, dt);
    const DType adt = f32or(dt);
    const Vec Akk = stored(o_intra(in, L, 0.3, kExact).second, dt);
    const WU wu = o_wu(in, Akk, L, kExact);
    const Vec kg = stored(wu.kg, dt), w = stored(wu.w, dt), u = stored(wu.u, dt), qg = stored(wu.qg, dt);
    std::mt19937_64 gen(6);
    const Vec dvl = stored(normal(L.B * L.T * L.HV * L.V, gen), dt);
    auto T_ = [&](DType d, std::vector<int64_t> s, const Vec& v) { return tensor(d, s, v, b.device); };
    TestTensor tkg = T_(dt, tok(L, L.HV, L.K), kg), tw = T_(dt, tok(L, L.HV, L.K), w), tu = T_(dt, tok(L, L.HV, L.V), u);
    TestTensor tqg = T_(dt, tok(L, L.HV, L.K), qg), gk = T_(adt, tok(L, L.HV, L.K), in.gk);
    TestTensor h0 = T_(adt, {L.N(), L.HV, L.K, L.V}, in.h0), dht = T_(adt, {L.N(), L.HV, L.K, L.V}, in.dht);
    TestTensor dO = T_(dt, tok(L, L.HV, L.V), in.dO), tdvl = T_(dt, tok(L, L.HV, L.V), dvl);
    TestTensor h = poisoned(dt, snap(L), b.device), vn = poisoned(dt, tok(L, L.HV, L.V), b.device);
    TestTensor ht = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
    chunk_gated_delta_rule_fwd_h(b.ctx(), {tkg.view(), tw.view(), tu.view(), {}, gk.view(), h0.view(), h.view(), vn.view(),
                                           ht.view(), ix.cuv(), ix.cov(), L.BT});
    TestTensor dh = poisoned(dt, snap(L), b.device), dv2 = poisoned(dt, tok(L, L.HV, L.V), b.device);
    TestTensor dh0 = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
    chunk_gated_delta_rule_bwd_dhu(b.ctx(), {tqg.view(), tkg.view(), tw.view(), dO.view(), tdvl.view(), {}, gk.view(),
                                             dht.view(), dh.view(), dh0.view(), dv2.view(), ix.cuv(), ix.cov(), 0.4, L.BT});
    const StateOut r64 = o_state(kg, w, u, in.gk, in.h0, qg, in.dO, dvl, in.dht, L, 0.4, kExact);
    const StateOut rb = o_state(kg, w, u, in.gk, in.h0, qg, in.dO, dvl, in.dht, L, 0.4, Rd{dt});
    expect_close("fwd_h h", h, rb.h, r64.h, dt);
    expect_close("fwd_h v_new", vn, rb.vn, r64.vn, dt);
    expect_close("fwd_h ht", ht, rb.ht, r64.ht, adt);
    expect_close("bwd_dhu dh", dh, rb.dh, r64.dh, dt);
    expect_close("bwd_dhu dv2", dv2, rb.dv2, r64.dv2, dt);
    expect_close("bwd_dhu dh0", dh0, rb.dh0, r64.dh0, adt);
  });
}

TEST(KdaRecurrent, ForwardAndBackwardMatchTheOracle) {
  for_each_case("fused_recurrent_kda", Direction::kBackward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 14, dt);
    const DType adt = f32or(dt);
    for (bool full : {true, false}) {  // with g, beta, h0, dht; and without any of them
      SCOPED_TRACE(full ? "g, beta, h0, dht" : "no g, beta, h0, dht");
      Inputs x = in;
      if (!full) {
        std::fill(x.h0.begin(), x.h0.end(), 0.0);
        std::fill(x.dht.begin(), x.dht.end(), 0.0);
      }
      auto T_ = [&](DType d, std::vector<int64_t> s, const Vec& v) { return tensor(d, s, v, b.device); };
      TestTensor q = T_(dt, tok(L, L.H, L.K), x.q), k = T_(dt, tok(L, L.H, L.K), x.k), v = T_(dt, tok(L, L.HV, L.V), x.v);
      TestTensor g = T_(adt, tok(L, L.HV, L.K), x.graw), beta = T_(adt, {L.B, L.T, L.HV}, x.beta);
      TestTensor h0 = T_(adt, {L.N(), L.HV, L.K, L.V}, x.h0), dht = T_(adt, {L.N(), L.HV, L.K, L.V}, x.dht);
      TestTensor dO = T_(dt, tok(L, L.HV, L.V), x.dO);
      TestTensor o = poisoned(dt, tok(L, L.HV, L.V), b.device), ht = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
      const double scale = 0.55;
      const TensorView gv = full ? g.view() : TensorView(), bv = full ? beta.view() : TensorView();
      const TensorView h0v = full ? h0.view() : TensorView(), dhtv = full ? dht.view() : TensorView();
      fused_recurrent_kda_fwd(b.ctx(), {q.view(), k.view(), v.view(), gv, bv, h0v, ix.cuv(), scale, o.view(), ht.view()});
      TestTensor dq = poisoned(dt, tok(L, L.H, L.K), b.device), dk = poisoned(dt, tok(L, L.H, L.K), b.device);
      TestTensor dv = poisoned(dt, tok(L, L.HV, L.V), b.device), dg = poisoned(adt, tok(L, L.HV, L.K), b.device);
      TestTensor db = poisoned(adt, {L.B, L.T, L.HV}, b.device), dh0 = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
      FusedRecurrentKdaBwdArgs ba{{q.view(), k.view(), v.view(), gv, bv, h0v, ix.cuv(), scale, dO.view(), dhtv,
                                   dq.view(), dk.view(), dv.view(), full ? dg.view() : TensorView(),
                                   full ? db.view() : TensorView(), dh0.view(), TensorView()}};
      // The checkpoint workspace (sm_90 past 16 tokens), NaN-filled: every state read from it was written.
      const int64_t ws_bytes = fused_recurrent_kda_bwd_workspace_size(ba);
      TestTensor ws = ws_bytes ? poisoned(DType::kFloat32, {ws_bytes / 4}, b.device) : TestTensor();
      if (ws_bytes) ba.workspace = ws.view();
      fused_recurrent_kda_bwd(b.ctx(), ba);
      const RecOut r64 = o_recurrent(x, L, scale, full, full, kExact), rb = o_recurrent(x, L, scale, full, full, Rd{dt});
      expect_close("o", o, rb.o, r64.o, dt);
      expect_close("ht", ht, rb.ht, r64.ht, adt);
      expect_close("dq", dq, rb.dq, r64.dq, dt);
      expect_close("dk", dk, rb.dk, r64.dk, dt);
      expect_close("dv", dv, rb.dv, r64.dv, dt);
      if (full) {
        expect_close("dg", dg, rb.dg, r64.dg, adt);
        expect_close("dbeta", db, rb.dbeta, r64.dbeta, adt);
      }
      expect_close("dh0", dh0, rb.dh0, r64.dh0, adt);
    }
  });
}

// The top-level forward of `in` on backend b by `fwd` (chunk_kda_fwd, or a composition of its
// steps; scale 0.5, initial state given; o, final state, g_cumsum, Aqk and Akk poisoned first),
// its tensors kept alive in the run.
struct KdaFwdRun {
  TestTensor q, k, v, g, beta, h0, o, ht, gc, Aqk, Akk, ws;
  ChunkKdaFwdArgs fa;
};
template <class Fwd = void (*)(const Context&, const ChunkKdaFwdArgs&)>
void run_kda_fwd(KdaFwdRun& r, const BackendCase& b, DType dt, const Layout& L, const Index& ix, const Inputs& in,
                 Fwd&& fwd = chunk_kda_fwd) {
  const DType adt = f32or(dt);
  auto T_ = [&](DType d, std::vector<int64_t> s, const Vec& v) { return tensor(d, s, v, b.device); };
  r.q = T_(dt, tok(L, L.H, L.K), in.q);
  r.k = T_(dt, tok(L, L.H, L.K), in.k);
  r.v = T_(dt, tok(L, L.HV, L.V), in.v);
  r.g = T_(adt, tok(L, L.HV, L.K), in.graw);
  r.beta = T_(adt, {L.B, L.T, L.HV}, in.beta);
  r.h0 = T_(adt, {L.N(), L.HV, L.K, L.V}, in.h0);
  r.o = poisoned(dt, tok(L, L.HV, L.V), b.device);
  r.ht = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
  r.gc = poisoned(gate_cumsum_dtype(b, adt), tok(L, L.HV, L.K), b.device);
  r.Aqk = poisoned(dt, tok(L, L.HV, L.BT), b.device);
  r.Akk = poisoned(dt, tok(L, L.HV, L.BT), b.device);
  ChunkKdaFwdArgs& fa = r.fa;
  fa.q = r.q.view(); fa.k = r.k.view(); fa.v = r.v.view(); fa.g = r.g.view(); fa.beta = r.beta.view();
  fa.initial_state = r.h0.view();
  fa.cu_seqlens = ix.cuv(); fa.chunk_indices = ix.civ(); fa.chunk_offsets = ix.cov();
  fa.scale = 0.5; fa.chunk_size = L.BT;
  fa.o = r.o.view(); fa.final_state = r.ht.view(); fa.g_cumsum = r.gc.view(); fa.Aqk = r.Aqk.view();
  fa.Akk = r.Akk.view();
  r.ws = TestTensor(DType::kUInt8, {chunk_kda_fwd_workspace_size(fa)}, b.device);
  fa.workspace = r.ws.view();
  fwd(b.ctx(), fa);
}

// The top-level backward of the forward run fa on backend b by `bwd` (chunk_kda_bwd, or a
// composition of its steps; dout and dht from `in`; outputs poisoned first).
struct KdaBwdRun {
  TestTensor dht, dO, dq, dk, dv, dg, db, dh0, ws;
  ChunkKdaBwdArgs ba;
};
template <class Bwd>
void run_kda_bwd(KdaBwdRun& r, const BackendCase& b, DType dt, const Layout& L, const Inputs& in,
                 const ChunkKdaFwdArgs& fa, Bwd&& bwd) {
  const DType adt = f32or(dt);
  r.dht = tensor(adt, {L.N(), L.HV, L.K, L.V}, in.dht, b.device);
  r.dO = tensor(dt, tok(L, L.HV, L.V), in.dO, b.device);
  ChunkKdaBwdArgs& ba = r.ba;
  ba.q = fa.q; ba.k = fa.k; ba.v = fa.v; ba.g = fa.g; ba.beta = fa.beta; ba.initial_state = fa.initial_state;
  ba.g_cumsum = fa.g_cumsum; ba.Aqk = fa.Aqk; ba.Akk = fa.Akk;
  ba.cu_seqlens = fa.cu_seqlens; ba.chunk_indices = fa.chunk_indices; ba.chunk_offsets = fa.chunk_offsets;
  ba.scale = fa.scale; ba.chunk_size = fa.chunk_size; ba.dout = r.dO.view(); ba.dht = r.dht.view();
  r.dq = poisoned(dt, tok(L, L.H, L.K), b.device);
  r.dk = poisoned(dt, tok(L, L.H, L.K), b.device);
  r.dv = poisoned(dt, tok(L, L.HV, L.V), b.device);
  r.dg = poisoned(adt, tok(L, L.HV, L.K), b.device);
  r.db = poisoned(adt, {L.B, L.T, L.HV}, b.device);
  r.dh0 = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
  ba.dq = r.dq.view(); ba.dk = r.dk.view(); ba.dv = r.dv.view(); ba.dg = r.dg.view(); ba.dbeta = r.db.view();
  ba.dh0 = r.dh0.view();
  r.ws = TestTensor(DType::kUInt8, {chunk_kda_bwd_workspace_size(ba)}, b.device);
  ba.workspace = r.ws.view();
  bwd(b.ctx(), ba);
}

// The top level: forward and backward against the recurrence oracle (base: the recurrence in dt).
TEST(KdaTop, ChunkKdaMatchesTheRecurrenceOracle) {
  for_each_case("chunk_kda", Direction::kBackward, [&](const BackendCase& b, DType dt, const Layout& L) {
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 15, dt);
    const DType adt = f32or(dt);
    KdaFwdRun run;
    run_kda_fwd(run, b, dt, L, ix, in);
    const TestTensor &o = run.o, &ht = run.ht;
    KdaBwdRun br;
    run_kda_bwd(br, b, dt, L, in, run.fa, chunk_kda_bwd);
    const TestTensor &dq = br.dq, &dk = br.dk, &dv = br.dv, &dg = br.dg, &db = br.db, &dh0 = br.dh0;
    const RecOut r64 = o_recurrent(in, L, 0.5, true, true, kExact), rb = o_recurrent(in, L, 0.5, true, true, Rd{dt});
    expect_close("o", o, rb.o, r64.o, dt);
    expect_close("ht", ht, rb.ht, r64.ht, adt);
    expect_close("dq", dq, rb.dq, r64.dq, dt);
    expect_close("dk", dk, rb.dk, r64.dk, dt);
    expect_close("dv", dv, rb.dv, r64.dv, dt);
    expect_close("dg", dg, rb.dg, r64.dg, adt);
    expect_close("dbeta", db, rb.dbeta, r64.dbeta, adt);
    expect_close("dh0", dh0, rb.dh0, r64.dh0, adt);
  });
}

// Per-channel log-gates of -1e4, -88 and -104 (exp underflows to 0 in fp32) on every seventh
// step or on all, and all-zero gates: o, final state and every gradient within 10x of the
// backend's error at ordinary gates against the float64 recurrence (an fp32 gate cumsum was 1e-3
// off at -1e4, 1e-5 at -88); the CUDA backends, whose cumsum is still fp32, within the ulp bound of
// extreme_gate_bound.
TEST(KdaTop, ExtremeGatesStayInTheOrdinaryErrorClass) {
  const char* names[] = {"o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
  int checked = 0;
  for_each_case("chunk_kda", Direction::kBackward, [&](const BackendCase& b, DType dt, const Layout& L) {
    if (dt != DType::kFloat32 && dt != DType::kBFloat16) return;
    const bool cuda = b.id.rfind("cuda", 0) == 0;  // fp32 gate cumsum (extreme_gate_bound)
    const Index ix = make_index(L, b.device);
    auto errors = [&](const Inputs& in) {
      KdaFwdRun run;
      run_kda_fwd(run, b, dt, L, ix, in);
      KdaBwdRun br;
      run_kda_bwd(br, b, dt, L, in, run.fa, chunk_kda_bwd);
      const RecOut r64 = o_recurrent(in, L, 0.5, true, true, kExact);
      return relative_errors({{&run.o, &r64.o}, {&run.ht, &r64.ht}, {&br.dq, &r64.dq}, {&br.dk, &r64.dk},
                              {&br.dv, &r64.dv}, {&br.dg, &r64.dg}, {&br.db, &r64.dbeta}, {&br.dh0, &r64.dh0}});
    };
    const Inputs in = make_inputs(L, 15, dt);
    const std::vector<double> base = errors(in);
    for (double value : {-1e4, -88.0, -104.0, 0.0})
      for (bool all : {false, true}) {
        if (value == 0.0 && !all) continue;
        SCOPED_TRACE("g=" + std::to_string(value) + (all ? " all" : " some"));
        Inputs x = in;
        const int64_t K = L.K;
        for (size_t t = 0; t < x.graw.size() / K; ++t)
          if (all || t % 7 == 3)
            for (int64_t c = 0; c < K; ++c) x.graw[t * K + c] = value;
        x.gk = o_cumsum(x.graw, L);
        const std::vector<double> e = errors(x);
        double M = 0;  // x.gk is the chunk-local cumsum
        for (double v : x.gk) M = std::max(M, std::abs(v));
        for (size_t i = 0; i < e.size(); ++i)
          EXPECT_LE(e[i], extreme_gate_bound(base[i], floor_for(dt), cuda, M))
              << names[i] << ": ordinary gates " << base[i] << ", largest chunk cumsum " << M;
        ++checked;
      }
  });
  EXPECT_GT(checked, 0);
}

// Every output of the top level, forward and backward, is bitwise that of kda::compose_fwd /
// compose_bwd without a backend's fused steps (each sub-operator its own launch on the same
// backend): the CUDA backend's fusions (cumsum into the intra kernels, state recurrence with the
// output) change no value.
// cuda_sm90 (whose sub-operators are cuda_sm80's) is composed of cuda_sm80's sub-operators, and
// its wgmma state-and-output kernel, when it takes the call (FUSEDOPS_GDN_FUSED_HO=1 at these
// shapes), holds o and the final state to them within rounding in 16 bits (as in the test below).
TEST(KdaTop, ForwardAndBackwardEqualTheirUnfusedCompositionBitwise) {
  for_each_case("chunk_kda", Direction::kBackward, [&](const BackendCase& b, DType dt, const Layout& L) {
    if (b.id == "ref") return;
    const bool sm90 = b.id == "cuda_sm90";
    auto sub = [](Context c) {
      if (c.backend == "cuda_sm90") c.backend = "cuda_sm80";
      return c;
    };
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 17, dt);
    KdaFwdRun fused, plain;
    run_kda_fwd(fused, b, dt, L, ix, in);
    run_kda_fwd(plain, b, dt, L, ix, in,
                [&](const Context& c, const ChunkKdaFwdArgs& a) { kda::compose_fwd(sub(c), a); });
    const bool within = sm90 && (dt == DType::kBFloat16 || dt == DType::kFloat16);
    for (auto [x, y] : {std::pair{&fused.o, &plain.o}, std::pair{&fused.ht, &plain.ht}}) {
      if (within) EXPECT_LT(rms_relative_error(x->to_double(), y->to_double()), dt == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048);
      else EXPECT_EQ(x->bytes(), y->bytes());
    }
    for (auto [x, y] : {std::pair{&fused.gc, &plain.gc}, std::pair{&fused.Aqk, &plain.Aqk}, std::pair{&fused.Akk, &plain.Akk}})
      EXPECT_EQ(x->bytes(), y->bytes());
    KdaBwdRun fb, pb;
    run_kda_bwd(fb, b, dt, L, in, fused.fa, chunk_kda_bwd);
    run_kda_bwd(pb, b, dt, L, in, fused.fa,
                [&](const Context& c, const ChunkKdaBwdArgs& a) { kda::compose_bwd(sub(c), a); });
    for (auto [x, y] : {std::pair{&fb.dq, &pb.dq}, std::pair{&fb.dk, &pb.dk}, std::pair{&fb.dv, &pb.dv},
                        std::pair{&fb.dg, &pb.dg}, std::pair{&fb.db, &pb.db}, std::pair{&fb.dh0, &pb.dh0}})
      EXPECT_EQ(x->bytes(), y->bytes());
  });
}

// The top level's saved g_cumsum, Aqk and Akk are bitwise those of chunk_local_cumsum and
// chunk_kda_fwd_intra, and its o and final state those of its state recurrence and output
// sub-operators (chunk_gated_delta_rule_fwd_h in the gk form, chunk_kda_fwd_o) run on the
// intermediates kda_recompute_w_u_fwd gives from its Akk and g_cumsum: a backend's fused kernels
// (CUDA's cumsum-and-intra and state-and-output, at K = V = 128 in 16 bits) must round as they do.
// cuda_sm90's state-and-output kernel (wgmma; its sub-operators are cuda_sm80's) rounds at the
// same points but its tensor cores may sum inside a product in another order: in 16 bits its o and
// final state are held to the sub-operators' within rounding (RMS-relative difference under 2^-8
// bf16 / 2^-11 fp16, where a misplaced tile or a missed term gives O(1)). The test shapes have few
// (sequence, head) pairs: FUSEDOPS_GDN_FUSED_HO=1 makes that kernel take them.
TEST(KdaTop, ForwardEqualsItsStateAndOutputSubOperatorsBitwise) {
  for_each_case("chunk_kda", Direction::kForward, [&](const BackendCase& b, DType dt, const Layout& L) {
    if (b.id == "ref") return;
    const bool sm90 = b.id == "cuda_sm90";
    Context sub = b.ctx();
    if (sm90) sub.backend = "cuda_sm80";
    const Index ix = make_index(L, b.device);
    const Inputs in = make_inputs(L, 16, dt);
    const DType adt = f32or(dt);
    KdaFwdRun run;
    run_kda_fwd(run, b, dt, L, ix, in);
    const ChunkKdaFwdArgs& fa = run.fa;
    const TestTensor &o = run.o, &ht = run.ht;
    TestTensor gc2 = poisoned(run.gc.dtype(), tok(L, L.HV, L.K), b.device);
    chunk_local_cumsum(sub, {fa.g, gc2.view(), fa.cu_seqlens, fa.chunk_indices, L.BT, false, 1.0});
    EXPECT_EQ(run.gc.bytes(), gc2.bytes());
    TestTensor Aqk2 = poisoned(dt, tok(L, L.HV, L.BT), b.device), Akk2 = poisoned(dt, tok(L, L.HV, L.BT), b.device);
    chunk_kda_fwd_intra(sub, {fa.q, fa.k, gc2.view(), fa.beta, Aqk2.view(), Akk2.view(), fa.cu_seqlens,
                                  fa.chunk_indices, fa.scale, L.BT});
    EXPECT_EQ(run.Aqk.bytes(), Aqk2.bytes());
    EXPECT_EQ(run.Akk.bytes(), Akk2.bytes());
    TestTensor w = poisoned(dt, tok(L, L.HV, L.K), b.device), u = poisoned(dt, tok(L, L.HV, L.V), b.device);
    TestTensor kg = poisoned(dt, tok(L, L.HV, L.K), b.device), qg = poisoned(dt, tok(L, L.HV, L.K), b.device);
    kda_recompute_w_u_fwd(sub, {fa.q, fa.k, fa.v, fa.beta, fa.Akk, fa.g_cumsum, w.view(), u.view(), kg.view(),
                                    qg.view(), fa.cu_seqlens, fa.chunk_indices});
    int64_t nt = (L.T + L.BT - 1) / L.BT;  // chunks per batch row, or in all (varlen; from the host copy)
    if (!L.cu.empty()) {
      nt = 0;
      for (size_t i = 0; i + 1 < L.cu.size(); ++i) nt += (L.cu[i + 1] - L.cu[i] + L.BT - 1) / L.BT;
    }
    TestTensor h = poisoned(dt, {L.cu.empty() ? L.B : 1, nt, L.HV, L.K, L.V}, b.device);
    TestTensor vn = poisoned(dt, tok(L, L.HV, L.V), b.device), o2 = poisoned(dt, tok(L, L.HV, L.V), b.device);
    TestTensor ht2 = poisoned(adt, {L.N(), L.HV, L.K, L.V}, b.device);
    chunk_gated_delta_rule_fwd_h(sub, {kg.view(), w.view(), u.view(), TensorView(), fa.g_cumsum, fa.initial_state,
                                           h.view(), vn.view(), ht2.view(), fa.cu_seqlens, fa.chunk_offsets, L.BT});
    chunk_kda_fwd_o(sub, {qg.view(), fa.Aqk, vn.view(), h.view(), o2.view(), fa.cu_seqlens, fa.chunk_indices,
                              fa.scale});
    if (sm90 && (dt == DType::kBFloat16 || dt == DType::kFloat16)) {
      const double bound = dt == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
      EXPECT_LT(rms_relative_error(o.to_double(), o2.to_double()), bound);
      EXPECT_LT(rms_relative_error(ht.to_double(), ht2.to_double()), bound);
    } else {
      EXPECT_EQ(o.bytes(), o2.bytes());
      EXPECT_EQ(ht.bytes(), ht2.bytes());
    }
  });
}

TEST(KdaSubops, RepeatedBackwardPiecesAreBitwiseEqual) {
  const Layout L{2, 96, 2, 4, 64, 64, 64, {}};
  for (const auto& b : runnable_backends("chunk_kda_bwd_intra", Direction::kBackward)) {
    SCOPED_TRACE(b.id);
    const DType dt = DType::kBFloat16;
    const Inputs in = make_inputs(L, 41, dt);
    std::mt19937_64 gen(9);
    const int64_t nk = L.B * L.T * L.H * L.K, ng = L.B * L.T * L.HV * L.K, nA = L.B * L.T * L.HV * L.BT;
    TestTensor q = tensor(dt, tok(L, L.H, L.K), in.q, b.device), k = tensor(dt, tok(L, L.H, L.K), in.k, b.device);
    TestTensor gk = tensor(DType::kFloat32, tok(L, L.HV, L.K), in.gk, b.device);
    TestTensor beta = tensor(DType::kFloat32, {L.B, L.T, L.HV}, in.beta, b.device);
    TestTensor dAq = tensor(DType::kFloat32, tok(L, L.HV, L.BT), normal(nA, gen), b.device);
    TestTensor dAk = tensor(DType::kFloat32, tok(L, L.HV, L.BT), normal(nA, gen), b.device);
    TestTensor pq = tensor(DType::kFloat32, tok(L, L.H, L.K), normal(nk, gen), b.device);
    TestTensor pk = tensor(DType::kFloat32, tok(L, L.H, L.K), normal(nk, gen), b.device);
    TestTensor pb = tensor(DType::kFloat32, {L.B, L.T, L.HV}, normal(L.B * L.T * L.HV, gen), b.device);
    TestTensor pg = tensor(DType::kFloat32, tok(L, L.HV, L.K), normal(ng, gen), b.device);
    std::vector<std::vector<uint8_t>> runs;
    for (int r = 0; r < 2; ++r) {
      TestTensor oq(dt, tok(L, L.H, L.K), b.device), ok(dt, tok(L, L.H, L.K), b.device);
      TestTensor ob(DType::kFloat32, {L.B, L.T, L.HV}, b.device), og(DType::kFloat32, tok(L, L.HV, L.K), b.device);
      chunk_kda_bwd_intra(b.ctx(), {q.view(), k.view(), gk.view(), beta.view(), dAq.view(), dAk.view(), pq.view(),
                                    pk.view(), pb.view(), pg.view(), oq.view(), ok.view(), ob.view(), og.view(), {}, {},
                                    L.BT});
      auto all = oq.bytes();
      for (const auto* t : {&ok, &ob, &og}) {
        auto x = t->bytes();
        all.insert(all.end(), x.begin(), x.end());
      }
      runs.push_back(all);
    }
    EXPECT_EQ(runs[0], runs[1]);
  }
}

TEST(KdaSubops, GatesOfMinus1000StayFinite) {
  // fp32 at K = 16, and bf16 q, k at K = 128 (the CUDA backend's 16-bit mma kernels, whose
  // reference-row split must keep every scaling factor <= 1 and no row past a sequence's end in play).
  struct Cfg {
    Layout L;
    DType dt;
    double tol;
  };
  for (const Cfg& cfg : {Cfg{{1, 130, 1, 2, 16, 16, 64, {0, 15, 100, 130}}, DType::kFloat32, 1e-5},
                         Cfg{{1, 150, 1, 2, 128, 128, 64, {0, 15, 100, 150}}, DType::kBFloat16, 1e-2}}) {
    const Layout& L = cfg.L;
    Inputs in = make_inputs(L, 16, cfg.dt);
    for (size_t i = 0; i < in.graw.size(); i += 3) in.graw[i] = -1000.0;
    in.gk = stored(o_cumsum(in.graw, L), DType::kFloat32);
    for (const auto& b : runnable_backends("chunk_kda_bwd_intra", Direction::kBackward)) {
      if (!backend_takes("chunk_kda_bwd_intra", Direction::kBackward, b.id, cfg.dt)) continue;
      SCOPED_TRACE(b.id + "/" + dtype_name(cfg.dt));
      const Index ix = make_index(L, b.device);
      TestTensor q = tensor(cfg.dt, tok(L, L.H, L.K), in.q, b.device);
      TestTensor k = tensor(cfg.dt, tok(L, L.H, L.K), in.k, b.device);
      TestTensor gk = tensor(DType::kFloat32, tok(L, L.HV, L.K), in.gk, b.device);
      TestTensor beta = tensor(DType::kFloat32, {L.B, L.T, L.HV}, in.beta, b.device);
      TestTensor Aqk = poisoned(DType::kFloat32, tok(L, L.HV, L.BT), b.device);
      TestTensor Akk = poisoned(DType::kFloat32, tok(L, L.HV, L.BT), b.device);
      chunk_kda_fwd_intra(b.ctx(), {q.view(), k.view(), gk.view(), beta.view(), Aqk.view(), Akk.view(), ix.cuv(),
                                    ix.civ(), 0.5, L.BT});
      for (double x : Aqk.to_double()) ASSERT_TRUE(std::isfinite(x));
      for (double x : Akk.to_double()) ASSERT_TRUE(std::isfinite(x));
      const auto r64 = o_intra(in, L, 0.5, kExact);
      EXPECT_LT(rms_relative_error(Aqk.to_double(), r64.first), cfg.tol);
      EXPECT_LT(rms_relative_error(Akk.to_double(), r64.second), cfg.tol);
      // The backward on these Aqk, Akk as dA (finite, large), against the float64 oracle.
      std::mt19937_64 gen(21);
      const int64_t nk = L.B * L.T * L.H * L.K, ng = L.B * L.T * L.HV * L.K;
      const IntraOut part{normal(nk, gen), normal(nk, gen), normal(L.B * L.T * L.HV, gen), normal(ng, gen)};
      TestTensor pq = tensor(DType::kFloat32, tok(L, L.H, L.K), part.dq, b.device);
      TestTensor pk = tensor(DType::kFloat32, tok(L, L.H, L.K), part.dk, b.device);
      TestTensor pb = tensor(DType::kFloat32, {L.B, L.T, L.HV}, part.dbeta, b.device);
      TestTensor pg = tensor(DType::kFloat32, tok(L, L.HV, L.K), part.dg, b.device);
      const Vec dAq = Aqk.to_double(), dAk = Akk.to_double();
      chunk_kda_bwd_intra(b.ctx(), {q.view(), k.view(), gk.view(), beta.view(), Aqk.view(), Akk.view(), pq.view(),
                                    pk.view(), pb.view(), pg.view(), pq.view(), pk.view(), pb.view(), pg.view(),
                                    ix.cuv(), ix.civ(), L.BT});
      const IntraOut i64 = o_bintra(in, dAq, dAk, part, L, kExact);
      const std::pair<const TestTensor*, const Vec*> outs[] = {{&pq, &i64.dq}, {&pk, &i64.dk}, {&pb, &i64.dbeta},
                                                              {&pg, &i64.dg}};
      for (const auto& [t, r] : outs) {
        const Vec got = t->to_double();
        for (double x : got) ASSERT_TRUE(std::isfinite(x));
        EXPECT_LT(rms_relative_error(got, *r), cfg.tol);
      }
    }
  }
}

TEST(KdaSubops, BadInputsRaiseClearErrors) {
  const Context ctx = Context::cpu();
  const int64_t B = 2, T = 8, H = 2, K = 4;
  TestTensor q(DType::kFloat32, {B, T, H, K}), gk(DType::kFloat32, {B, T, 3, K}), beta(DType::kFloat32, {B, T, 3});
  TestTensor A(DType::kFloat32, {B, T, 3, 64});
  expect_error([&] { chunk_kda_fwd_intra(ctx, {q.view(), q.view(), gk.view(), beta.view(), A.view(), A.view(), {}, {}, 1.0, 64}); },
               ErrorKind::kValue, "gk has HV=3 heads, which is not a multiple of the 2 heads of q and k");
  TestTensor gk2(DType::kFloat32, {B, T, H, K}), beta2(DType::kFloat32, {B, T, H}), A48(DType::kFloat32, {B, T, H, 48});
  expect_error([&] { chunk_kda_fwd_intra(ctx, {q.view(), q.view(), gk2.view(), beta2.view(), A48.view(), A48.view(), {}, {}, 1.0, 48}); },
               ErrorKind::kValue, "chunk_size must be 32 or 64");
  TestTensor g3(DType::kFloat32, {B, T, H});
  expect_error([&] { kda_gate_fwd(ctx, {gk2.view(), {}, {}, gk2.view(), false, 0.0}); }, ErrorKind::kValue,
               "A_log is required unless lower_bound is set");
  TestTensor bias(DType::kFloat32, {H});
  expect_error([&] { kda_gate_fwd(ctx, {gk2.view(), {}, bias.view(), gk2.view(), true, -1.0}); }, ErrorKind::kValue,
               "dt_bias must be a contiguous tensor of HV*K=8 elements");
  // chunk_kda: a bf16 initial state, chunk size 16, safe_gate without a valid lower bound.
  TestTensor v(DType::kFloat32, {B, T, H, K}), h0b(DType::kBFloat16, {B, H, K, K}), o(DType::kFloat32, {B, T, H, K});
  ChunkKdaFwdArgs fa;
  fa.q = q.view(); fa.k = q.view(); fa.v = v.view(); fa.g = gk2.view(); fa.beta = beta2.view();
  fa.initial_state = h0b.view(); fa.o = o.view();
  TestTensor gc(DType::kFloat32, {B, T, H, K}), Aq(DType::kFloat32, {B, T, H, 64});
  fa.g_cumsum = gc.view(); fa.Aqk = Aq.view(); fa.Akk = Aq.view();
  expect_error([&] { chunk_kda_fwd(ctx, fa); }, ErrorKind::kValue, "initial_state must be float32");
  fa.initial_state = TensorView();
  fa.chunk_size = 16;
  expect_error([&] { chunk_kda_fwd(ctx, fa); }, ErrorKind::kValue, "chunk_size must be 32 or 64, got 16");
  fa.chunk_size = 64;
  fa.use_gate_in_kernel = true;
  expect_error([&] { chunk_kda_fwd(ctx, fa); }, ErrorKind::kValue,
               "use_gate_in_kernel requires A_log unless lower_bound is set");
  fa.safe_gate = true;
  fa.has_lower_bound = true;
  fa.lower_bound = -6.0;
  expect_error([&] { chunk_kda_fwd(ctx, fa); }, ErrorKind::kValue,
               "safe_gate with use_gate_in_kernel requires lower_bound in [-5, 0)");
  fa.use_gate_in_kernel = false;
  fa.safe_gate = false;
  fa.g = g3.view();
  expect_error([&] { chunk_kda_fwd(ctx, fa); }, ErrorKind::kValue, "g must have shape");
  FusedRecurrentKdaFwdArgs ra;
  ra.q = q.view(); ra.k = q.view(); ra.v = v.view(); ra.g = g3.view(); ra.o = o.view();
  expect_error([&] { fused_recurrent_kda_fwd(ctx, ra); }, ErrorKind::kValue, "g must have shape");
}

}  // namespace
}  // namespace fusedops::testing
