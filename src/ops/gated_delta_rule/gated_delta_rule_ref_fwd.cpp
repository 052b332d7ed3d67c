// Gated delta rule, float64 reference: plain loops over chunks and value heads, the executable
// form of docs/specs/linear_attention.md. Forward-direction operators; the backward ones are in
// gated_delta_rule_ref_bwd.cpp, the shared sub-operators in linear_attention_ref.cpp.
#include <cmath>
#include <vector>

#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/linear_attention/la_common.h"
#include "src/ops/gated_delta_rule/gdn_ref.h"

namespace fusedops::gdn::ref {

std::vector<double> load_tril(const Tok& A, const Chunk& c, int64_t h, bool strict) {
  const std::vector<double> rows = load_block(A, c, h);  // [len, BT]
  std::vector<double> out(c.len * c.len, 0.0);
  for (int64_t i = 0; i < c.len; ++i)
    for (int64_t j = 0; j <= i; ++j)
      if (!(strict && j == i)) out[i * c.len + j] = rows[i * A.D + j];
  return out;
}

void store_square(const Tok& A, const Chunk& c, int64_t h, const std::vector<double>& m) {
  std::vector<double> rows(c.len * A.D, 0.0);
  for (int64_t i = 0; i < c.len; ++i)
    for (int64_t j = 0; j < c.len; ++j) rows[i * A.D + j] = m[i * c.len + j];
  store_block(A, c, h, rows);
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

double gamma_factor(const std::vector<double>& g, int64_t i, int64_t j) {
  return std::exp(g[i] - g[j]);
}

namespace {

// ---------------------------------------------------------------------------------------------

void kkt(const Context&, const ChunkScaledDotKktArgs& a) {
  const Tok k(a.k), beta(a.beta), g(a.g), A(a.A);
  const int64_t HV = a.beta.size(2), G = HV / k.H, K = k.D;
  const auto chunks = make_chunks(make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, a.chunk_size),
                                  a.chunk_size);
  for (const Chunk& c : chunks)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const auto kc = load_block(k, c, hv / G);
      const auto b = load_block(beta, c, hv);
      const auto gm = load_gate(g, c, hv);
      std::vector<double> L(c.len * c.len, 0.0);
      for (int64_t i = 0; i < c.len; ++i)
        for (int64_t j = 0; j < i; ++j)
          L[i * c.len + j] = b[i] * dot(&kc[i * K], &kc[j * K], K) * gamma_factor(gm, i, j);
      store_square(A, c, hv, L);
    }
}

void solve(const Context&, const SolveTrilArgs& a) {
  const Tok A(a.A), Ai(a.Ai);
  const auto chunks =
      make_chunks(make_seqs(a.A.size(0), a.A.size(1), a.cu_seqlens, A.D), A.D);
  for (const Chunk& c : chunks)
    for (int64_t h = 0; h < A.H; ++h) store_square(Ai, c, h, unit_lower_inverse(load_tril(A, c, h, true), c.len));
}

void wu_fwd(const Context&, const RecomputeWUFwdArgs& a) {
  const Tok k(a.k), v(a.v), beta(a.beta), A(a.A), g(a.g), w(a.w), u(a.u);
  const int64_t HV = v.H, G = HV / k.H, K = k.D, V = v.D, BT = A.D;
  const auto chunks = make_chunks(make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, BT), BT);
  for (const Chunk& c : chunks)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const auto kc = load_block(k, c, hv / G), vc = load_block(v, c, hv);
      const auto b = load_block(beta, c, hv), gm = load_gate(g, c, hv);
      const auto Am = load_tril(A, c, hv, false);
      std::vector<double> W(c.len * K, 0.0), U(c.len * V, 0.0);
      for (int64_t i = 0; i < c.len; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          const double aw = Am[i * c.len + j] * b[j] * std::exp(gm[j]);
          const double au = Am[i * c.len + j] * b[j];
          for (int64_t x = 0; x < K; ++x) W[i * K + x] += aw * kc[j * K + x];
          for (int64_t x = 0; x < V; ++x) U[i * V + x] += au * vc[j * V + x];
        }
      store_block(w, c, hv, W);
      store_block(u, c, hv, U);
    }
}

void fwd_o(const Context&, const ChunkFwdOArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), o(a.o);
  const Mat h(a.h);
  const int64_t HV = v.H, G = HV / q.H, K = q.D, V = v.D, BT = a.chunk_size;
  const auto chunks = make_chunks(make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, BT), BT);
  for (const Chunk& c : chunks)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const auto qc = load_block(q, c, hv / G), kc = load_block(k, c, hv / G);
      const auto vc = load_block(v, c, hv), gm = load_gate(g, c, hv);
      const auto S = load_mat(h, c.index * HV + hv);
      std::vector<double> O(c.len * V, 0.0);
      for (int64_t i = 0; i < c.len; ++i) {
        const double eg = std::exp(gm[i]);
        for (int64_t x = 0; x < V; ++x) {
          double s = 0;
          for (int64_t y = 0; y < K; ++y) s += qc[i * K + y] * S[y * V + x];
          O[i * V + x] = eg * s;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = dot(&qc[i * K], &kc[j * K], K) * gamma_factor(gm, i, j);
          for (int64_t x = 0; x < V; ++x) O[i * V + x] += p * vc[j * V + x];
        }
        for (int64_t x = 0; x < V; ++x) O[i * V + x] *= a.scale;
      }
      store_block(o, c, hv, O);
    }
}

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

void gate_fwd(const Context&, const GdnGateFwdArgs& a) {
  const int64_t HV = a.g.size(-1), rows = a.g.rows(), rs = a.g.row_stride();
  std::vector<double> A(HV), bias(HV, 0.0);
  load_doubles(a.A_log.data(), a.A_log.dtype(), A.data(), HV);
  if (a.dt_bias.defined()) load_doubles(a.dt_bias.data(), a.dt_bias.dtype(), bias.data(), HV);
  const size_t gs = dtype_size(a.g.dtype()), ys = dtype_size(a.y.dtype());
  std::vector<double> x(HV);
  for (int64_t r = 0; r < rows; ++r) {
    load_doubles(static_cast<const char*>(a.g.data()) + gs * r * rs, a.g.dtype(), x.data(), HV);
    for (int64_t h = 0; h < HV; ++h) x[h] = -std::exp(A[h]) * softplus(x[h] + bias[h]);
    store_doubles(x.data(), static_cast<char*>(a.y.data()) + ys * r * HV, a.y.dtype(), HV);
  }
}

void recurrent_fwd(const Context&, const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), beta(a.beta), o(a.o);
  const Mat h0(a.initial_state), ht(a.final_state);
  const int64_t HV = v.H, G = HV / q.H, K = q.D, V = v.D;
  const auto seqs = make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, 1);
  std::vector<double> qt(K), kt(K), vt(V), ot(V);
  for (size_t n = 0; n < seqs.size(); ++n)
    for (int64_t hv = 0; hv < HV; ++hv) {
      std::vector<double> S(K * V, 0.0);
      if (h0.defined()) S = load_mat(h0, n * HV + hv);
      for (int64_t t = seqs[n].t0; t < seqs[n].t0 + seqs[n].len; ++t) {
        const int64_t b = seqs[n].b;
        load_doubles(q.ptr(b, t, hv / G), q.dtype, qt.data(), K);
        load_doubles(k.ptr(b, t, hv / G), k.dtype, kt.data(), K);
        load_doubles(v.ptr(b, t, hv), v.dtype, vt.data(), V);
        double gt = 0, bt = 1;
        if (g.defined()) load_doubles(g.ptr(b, t, hv), g.dtype, &gt, 1);
        if (beta.defined()) load_doubles(beta.ptr(b, t, hv), beta.dtype, &bt, 1);
        recurrent_step(S, qt.data(), kt.data(), vt.data(), gt, bt, a.scale, K, V, ot.data(), nullptr);
        store_doubles(ot.data(), o.ptr(b, t, hv), o.dtype, V);
      }
      if (ht.defined()) store_mat(ht, n * HV + hv, S);
    }
}

}  // namespace

std::vector<double> unit_lower_inverse(const std::vector<double>& L, int64_t n) {
  // X = (I + L)^{-1} by forward substitution: X_i = e_i - sum_{m<i} L_im X_m.
  std::vector<double> X(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    X[i * n + i] = 1.0;
    for (int64_t m = 0; m < i; ++m) {
      const double l = L[i * n + m];
      if (l == 0) continue;
      for (int64_t j = 0; j <= m; ++j) X[i * n + j] -= l * X[m * n + j];
    }
  }
  return X;
}

void recurrent_step(std::vector<double>& S, const double* q, const double* k, const double* v,
                    double g, double beta, double scale, int64_t K, int64_t V, double* o,
                    double* delta_out) {
  const double decay = std::exp(g);
  for (double& s : S) s *= decay;
  std::vector<double> delta(V);
  for (int64_t x = 0; x < V; ++x) {
    double p = 0;
    for (int64_t y = 0; y < K; ++y) p += S[y * V + x] * k[y];
    delta[x] = beta * (v[x] - p);
  }
  for (int64_t y = 0; y < K; ++y)
    for (int64_t x = 0; x < V; ++x) S[y * V + x] += k[y] * delta[x];
  if (o)
    for (int64_t x = 0; x < V; ++x) {
      double s = 0;
      for (int64_t y = 0; y < K; ++y) s += S[y * V + x] * q[y];
      o[x] = scale * s;
    }
  if (delta_out)
    for (int64_t x = 0; x < V; ++x) delta_out[x] = delta[x];
}

void top_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  compose_fwd(with_backend(ctx, "ref"), a);
}

}  // namespace fusedops::gdn::ref

namespace fusedops {

void register_gated_delta_rule_ref(Registry& r) {
  using namespace gdn::ref;
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64},
                   kPriorityRef};
  r.add<ChunkScaledDotKktArgs>("chunk_scaled_dot_kkt", Direction::kForward, spec, nullptr, kkt);
  r.add<SolveTrilArgs>("solve_tril", Direction::kForward, spec, nullptr, solve);
  r.add<RecomputeWUFwdArgs>("recompute_w_u", Direction::kForward, spec, nullptr, wu_fwd);
  r.add<ChunkFwdOArgs>("chunk_fwd_o", Direction::kForward, spec, nullptr, fwd_o);
  r.add<GdnGateFwdArgs>("gdn_gate", Direction::kForward, spec, nullptr, gate_fwd);
  r.add<FusedRecurrentGatedDeltaRuleFwdArgs>("fused_recurrent_gated_delta_rule", Direction::kForward,
                                             spec, nullptr, recurrent_fwd);
  r.add<ChunkGatedDeltaRuleFwdArgs>("chunk_gated_delta_rule", Direction::kForward, spec, nullptr,
                                    top_fwd);
  gdn::register_ref_bwd(r);
}

}  // namespace fusedops
