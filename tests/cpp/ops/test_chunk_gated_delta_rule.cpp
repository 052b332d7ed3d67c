// chunk_gated_delta_rule and fused_recurrent_gated_delta_rule (the top levels): every runnable
// backend, forward and every gradient (dq, dk, dv, dg, dbeta, dh0, dA_log, ddt_bias), against a
// float64 per-token recurrence written here (section 1.1) with its reverse-mode derivative worked
// out by hand; the base of the precision policy is the same recurrence rounding every intermediate
// to the input dtype. Options (l2norm, gate, beta sigmoid), varlen with an empty sequence, grouped
// value heads, extreme gates, empty inputs, determinism, errors.
#include <cmath>
#include <random>

#include "fusedops/ops/gated_delta_rule.h"
#include "tests/common/tolerance.h"
#include "tests/cpp/test_util.h"

namespace fusedops::testing {
namespace {

using Vec = std::vector<double>;

struct Rd {
  DType dt;
  double operator()(double x) const { return round_to(dt, x); }
};

struct Shape {
  int64_t B, T, H, HV, K, V;
  std::vector<int64_t> cu;  // empty: fixed length
  int64_t N() const { return cu.empty() ? B : static_cast<int64_t>(cu.size()) - 1; }
};

struct Opts {
  bool l2 = false, gate = false, sig = false, neg = false, h0 = true, dht = true;
  int64_t BT = 64;
  double gate_scale = 1.0;  // multiplies the per-step log decays
};

struct Data {
  Vec q, k, v, g, beta, h0, A_log, dt_bias, dO, dht;
};

struct Grads {
  Vec o, ht, dq, dk, dv, dg, dbeta, dh0, dA, dbias;
};

Vec normal(int64_t n, std::mt19937_64& gen, double mean = 0.0, double sd = 1.0) {
  std::normal_distribution<double> d(mean, sd);
  Vec x(n);
  for (double& e : x) e = d(gen);
  return x;
}

Vec stored(Vec x, DType dt) {
  for (double& e : x) e = round_to(dt, e);
  return x;
}

DType f32or(DType dt) { return dt == DType::kFloat64 ? dt : DType::kFloat32; }

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

Grads oracle(const Shape& s, const Opts& o, const Data& d, double scale, Rd rd) {
  const int64_t n = s.B * s.T, G = s.HV / s.H, K = s.K, V = s.V, KV = K * V;
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.T + t) * s.H + h) * K; };
  auto vi = [&](int64_t b, int64_t t, int64_t hv) { return ((b * s.T + t) * s.HV + hv) * V; };
  auto si = [&](int64_t b, int64_t t, int64_t hv) { return (b * s.T + t) * s.HV + hv; };
  // Pre-processing.
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
  // Chain rules of the pre-processing.
  r.dq = dqn;
  r.dk = dkn;
  if (o.l2)
    for (int64_t row = 0; row < n * s.H; ++row)
      for (auto [dy, y, rs, dx] : {std::tuple{&dqn, &qn, &rq, &r.dq}, std::tuple{&dkn, &kn, &rk, &r.dk}}) {
        double dot = 0;
        for (int64_t c = 0; c < K; ++c) dot = rd(dot + rd((*dy)[row * K + c] * (*y)[row * K + c]));
        for (int64_t c = 0; c < K; ++c)
          (*dx)[row * K + c] = rd((*rs)[row] * rd((*dy)[row * K + c] - rd(dot * (*y)[row * K + c])));
      }
  r.dbeta = dba;
  if (o.sig)
    for (int64_t i = 0; i < n * s.HV; ++i) {
      const double sg = rd(1.0 / (1.0 + std::exp(-d.beta[i])));
      r.dbeta[i] = rd(rd(dba[i] * cm) * rd(sg * rd(1.0 - sg)));
    }
  r.dg = dga;
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

// ---------------------------------------------------------------------------------------------
// Running the library.

TestTensor tensor(DType dt, std::vector<int64_t> shape, const Vec& values, Device dev) {
  TestTensor t(dt, shape);
  t.set(values);
  return t.to(dev);
}

TestTensor poisoned(DType dt, std::vector<int64_t> shape, Device dev) {
  TestTensor t(dt, shape, dev);
  t.fill_nan();
  return t;
}

struct Index {
  TestTensor cu, ci, co;
};

Index make_index(const Shape& s, int64_t BT) {
  Index ix;
  if (s.cu.empty()) return ix;
  const int64_t n = static_cast<int64_t>(s.cu.size());
  ix.cu = TestTensor(DType::kInt32, {n});
  for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(ix.cu.data())[i] = static_cast<int32_t>(s.cu[i]);
  ix.ci = TestTensor(DType::kInt32, {gdn_chunk_count(ix.cu.view(), BT), 2});
  ix.co = TestTensor(DType::kInt32, {n});
  prepare_chunk_indices(ix.cu.view(), BT, ix.ci.view());
  prepare_chunk_offsets(ix.cu.view(), BT, ix.co.view());
  return ix;
}

TensorView opt(const TestTensor& t) { return t.numel() || !t.shape().empty() ? t.view() : TensorView(); }

struct Result {
  TestTensor o, ht, dq, dk, dv, dg, dbeta, dh0, dA, dbias;
};

Result run_chunk(const BackendCase& b, DType dt, const Shape& s, const Opts& o, const Data& d, double scale) {
  const Device dev = b.device;
  const DType f32 = f32or(dt);
  const Index ix = make_index(s, o.BT);
  const int64_t n = s.B * s.T;
  TestTensor q = tensor(dt, {s.B, s.T, s.H, s.K}, d.q, dev), k = tensor(dt, {s.B, s.T, s.H, s.K}, d.k, dev);
  TestTensor v = tensor(dt, {s.B, s.T, s.HV, s.V}, d.v, dev);
  TestTensor g = tensor(f32, {s.B, s.T, s.HV}, d.g, dev), beta = tensor(f32, {s.B, s.T, s.HV}, d.beta, dev);
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
  TestTensor gc = poisoned(f32, {s.B, s.T, s.HV}, dev), A = poisoned(dt, {s.B, s.T, s.HV, o.BT}, dev);
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
  r.dbeta = poisoned(f32, {s.B, s.T, s.HV}, dev);
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
  const Index ix = make_index(s, 64);
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
  fused_recurrent_gated_delta_rule_bwd(
      b.ctx(), {q.view(), k.view(), v.view(), g.view(), beta.view(), h0v, cu, scale, dO.view(),
                o.dht ? dht.view() : TensorView(), r.dq.view(), r.dk.view(), r.dv.view(), r.dg.view(),
                r.dbeta.view(), o.h0 ? r.dh0.view() : TensorView()});
  return r;
}

void expect_close(const char* what, const TestTensor& ours, Vec base, const Vec& ref, DType dt) {
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
  expect_close("o", r.o, base.o, ref.o, dt);
  expect_close("final_state", r.ht, base.ht, ref.ht, dt);
  expect_close("dq", r.dq, base.dq, ref.dq, dt);
  expect_close("dk", r.dk, base.dk, ref.dk, dt);
  expect_close("dv", r.dv, base.dv, ref.dv, dt);
  expect_close("dg", r.dg, base.dg, ref.dg, dt);
  expect_close("dbeta", r.dbeta, base.dbeta, ref.dbeta, dt);
  if (o.h0) expect_close("dh0", r.dh0, base.dh0, ref.dh0, dt);
  if (chunk && o.gate) {
    expect_close("dA_log", r.dA, base.dA, ref.dA, dt);
    expect_close("ddt_bias", r.dbias, base.dbias, ref.dbias, dt);
  }
}

struct TopCase {
  Shape s;
  Opts o;
  std::string name;
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
  return {
      {{2, 70, 1, 2, 32, 24, {}}, plain, "B2 T70 GVA2 K32 V24 BT64"},
      {{1, 75, 2, 2, 20, 36, {0, 20, 20, 75}}, bt16, "varlen [0,20,20,75] BT16"},
      {{1, 45, 2, 4, 16, 16, {}}, all, "l2norm+gate+sigmoid(neg) GVA2 BT32"},
      {{1, 33, 1, 1, 16, 16, {}}, bare, "no h0, no dht"},
  };
}

const DType kDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};

TEST(ChunkGatedDeltaRule, MatchesTheFloat64RecurrenceOnEveryBackend) {
  int checked = 0;
  for (const auto& b : runnable_backends("chunk_gated_delta_rule", Direction::kForward))
    for (DType dt : kDtypes) {
      if (!backend_takes("chunk_gated_delta_rule", Direction::kForward, b.id, dt)) continue;
      const auto cases = top_cases();
      const size_t nc = (dt == DType::kBFloat16 || dt == DType::kFloat16) ? 2 : cases.size();
      for (size_t i = 0; i < nc; ++i) {
        const TopCase& c = cases[i];
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/" + c.name);
        const Data d = make_data(c.s, c.o, 100 + i, dt);
        const double scale = 1.0 / std::sqrt(static_cast<double>(c.s.K));
        const Result r = run_chunk(b, dt, c.s, c.o, d, scale);
        compare(r, oracle(c.s, c.o, d, scale, Rd{dt}), oracle(c.s, c.o, d, scale, Rd{DType::kFloat64}), dt, c.o, true);
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
      const auto cases = top_cases();
      for (size_t i : {size_t{0}, size_t{1}, size_t{3}}) {
        const TopCase& c = cases[i];
        SCOPED_TRACE(b.id + "/" + dtype_name(dt) + "/" + c.name);
        const Data d = make_data(c.s, c.o, 200 + i, dt);
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
    // dg/dbeta 0.02). The max-abs policy cannot apply: the stored chunk-local cumsum is fp32, so
    // after a -1000 step its ulp is 6e-5 and exp(g_i - g_j) carries that relative error (the same
    // holds for flash-linear-attention).
    const Grads ref = oracle(s, o, d, 0.25, Rd{DType::kFloat64});
    const std::pair<const TestTensor*, const Vec*> outs[] = {
        {&r.o, &ref.o}, {&r.ht, &ref.ht}, {&r.dq, &ref.dq}, {&r.dk, &ref.dk}, {&r.dv, &ref.dv},
        {&r.dg, &ref.dg}, {&r.dbeta, &ref.dbeta}, {&r.dh0, &ref.dh0}};
    for (const auto& [t, want] : outs) EXPECT_LT(rms_relative_error(t->to_double(), *want), 5e-3);
  }
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

}  // namespace
}  // namespace fusedops::testing
