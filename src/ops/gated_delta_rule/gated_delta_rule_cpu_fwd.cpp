// Gated delta rule, CPU backend: forward-direction operators (the shared ones, chunk_local_cumsum,
// the state recurrence and beta_sigmoid, are in src/ops/linear_attention/linear_attention_cpu.cpp).
// Chunk-parallel operators run one task per (chunk, q/k head) over the OpenMP threads and loop
// over the head's group of value heads inside (so Q K^T and K K^T are computed once per group);
// the per-token recurrence one task per (sequence, value head). Every chunk product is a
// register-blocked fp32 GEMM (la_cpu_kernels.h) on blocks converted per chunk from the storage
// dtype; fp32 inputs are read in place. Results do not depend on the number of threads.
#include <cmath>

#include "src/cpu/parallel.h"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/linear_attention/la_check.h"
#include "src/ops/gated_delta_rule/gdn_cpu.h"
#include "src/ops/linear_attention/la_cpu_kernels.h"

namespace fusedops::gdn::cpu {

void load_tril_block(const Tok& A, const Chunk& c, int64_t h, bool strict, float* out, int64_t ld) {
  // Only the m = i (+1) leading entries of row i are read (converted straight into out).
  for (int64_t i = 0; i < c.len; ++i) {
    float* o = out + i * ld;
    const int64_t m = strict ? i : i + 1;
    load_floats(A.ptr(c.b, c.t0 + i, h), A.dtype, o, m);
    std::fill(o + m, o + c.len, 0.0f);
  }
}

QkBlock qk_block(Scratch& s, const Tok& q, const Tok& k, const Chunk& c, int64_t h) {
  const int64_t n = c.len, K = q.D;
  const QkBlock b{view_rows(q, c, h, s.get(0, n * K)), view_rows(k, c, h, s.get(1, n * K)),
                  s.get(3, n * n)};
  gemm(n, n, K, 1.0f, b.q.p, b.q.ld, 1, b.k.p, b.k.ld, false, b.qk, n, Tri::kNone, true, nullptr, 0,
       true);
  return b;
}

void gated_scores(const Tok& g, const Chunk& c, int64_t hv, const float* qk, float scale,
                  double* gd, float* P) {
  const int64_t n = c.len;
  load_gates(g, c, hv, gd);
  decay_matrix(gd, n, false, P, n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) P[i * n + j] *= scale * qk[i * n + j];
}

void store_square_block(const float* in, int64_t ld, const Tok& A, const Chunk& c, int64_t h) {
  std::vector<float> row(A.D, 0.0f);
  for (int64_t i = 0; i < c.len; ++i) {
    std::copy(in + i * ld, in + i * ld + c.len, row.begin());
    store_floats(row.data(), A.ptr(c.b, c.t0 + i, h), A.dtype, A.D);
  }
}

namespace {

// ---------------------------------------------------------------------------------------------

void kkt(const Context&, const ChunkScaledDotKktArgs& a) {
  const Tok k(a.k), beta(a.beta), g(a.g), A(a.A);
  const int64_t H = k.H, HV = beta.H, G = HV / H, K = k.D;
  const auto chunks = chunks_of(a.k.size(0), a.k.size(1), a.cu_seqlens, a.chunk_size);
  for_each_chunk_head(
      chunks, H, G, [&](const Chunk& nx, int64_t nh) { prefetch_rows(k, nx, nh); },
      [&](const Chunk& nx, int64_t hv) { prefetch_rows(A, nx, hv, true); },
      [&](Scratch& s, const Chunk& c, int64_t h) {
        const int64_t n = c.len;
        double* gd = gate_buffer(n);
        const Rows kr = view_rows(k, c, h, s.get(0, n * K));
        float* kk = s.get(2, n * n);
        gemm(n, n, K, 1.0f, kr.p, kr.ld, 1, kr.p, kr.ld, false, kk, n, Tri::kNone, true, nullptr, 0,
             true);
        float* gam = s.get(3, n * n);
        float* bt = s.get(5, n);
        for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
          load_scalars(beta, c, hv, bt);
          if (g.defined()) {
            load_gates(g, c, hv, gd);
            decay_matrix(gd, n, true, gam, n);
          }
          const OutRows L = out_rows(A, c, hv, s.get(4, n * A.D));
          for (int64_t i = 0; i < n; ++i) {
            float* l = L.p + i * L.ld;
            const float* kki = kk + i * n;
            if (g.defined()) {
              const float* gi = gam + i * n;
              for (int64_t j = 0; j < i; ++j) l[j] = bt[i] * kki[j] * gi[j];
            } else {
              for (int64_t j = 0; j < i; ++j) l[j] = bt[i] * kki[j];
            }
            std::fill(l + i, l + A.D, 0.0f);
          }
          commit_rows(L, A, c, hv);
        }
      });
}

void solve(const Context&, const SolveTrilArgs& a) {
  const Tok A(a.A), Ai(a.Ai);
  const int64_t H = A.H;
  const auto chunks = chunks_of(a.A.size(0), a.A.size(1), a.cu_seqlens, A.D);
  fusedops::cpu::parallel_for(0, static_cast<int64_t>(chunks.size()) * H, 4, [&](int64_t b, int64_t e) {
    Scratch& s = thread_scratch();
    for (int64_t task = b; task < e; ++task) {
      const Chunk& c = chunks[task / H];
      const int64_t h = task % H, n = c.len;
      float* L = s.get(0, n * n);
      float* X = s.get(1, n * n);
      load_tril_block(A, c, h, true, L, n);
      unit_lower_inverse(L, n, X, n);
      store_square_block(X, n, Ai, c, h);
    }
  });
}

void wu_fwd(const Context&, const RecomputeWUFwdArgs& a) {
  // W = (A diag(beta e^g)) K and U = (A diag(beta)) V: the column scaling goes on the [C,C] block,
  // so K and V are read in place.
  const Tok k(a.k), v(a.v), beta(a.beta), A(a.A), g(a.g), w(a.w), u(a.u);
  const int64_t H = k.H, HV = v.H, G = HV / H, K = k.D, V = v.D, BT = A.D;
  const auto chunks = chunks_of(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for_each_chunk_head(
      chunks, H, G, [&](const Chunk& nx, int64_t nh) { prefetch_rows(k, nx, nh); },
      [&](const Chunk& nx, int64_t hv) {
        prefetch_rows(A, nx, hv);
        prefetch_rows(v, nx, hv);
        prefetch_rows(w, nx, hv, true);
        prefetch_rows(u, nx, hv, true);
      },
      [&](Scratch& s, const Chunk& c, int64_t h) {
        const int64_t n = c.len;
        double* gd = gate_buffer(n);
        const Rows kr = view_rows(k, c, h, s.get(0, n * K));
        float* Am = s.get(1, n * n);
        float* Aw = s.get(2, n * n);
        float* W = s.get(4, n * K);
        float* U = s.get(5, n * V);
        float* bt = s.get(6, n);
        float* eg = s.get(7, n);
        for (int64_t hv = h * G; hv < (h + 1) * G; ++hv) {
          load_tril_block(A, c, hv, false, Am, n);
          load_scalars(beta, c, hv, bt);
          load_gates(g, c, hv, gd);
          exp_from(gd, n, 0.0, eg);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t j = 0; j <= i; ++j) {
              Aw[i * n + j] = Am[i * n + j] * bt[j] * eg[j];
              Am[i * n + j] *= bt[j];
            }
            std::fill(Aw + i * n + i + 1, Aw + (i + 1) * n, 0.0f);
          }
          const Rows vr = view_rows(v, c, hv, s.get(3, n * V));
          const OutRows Wo = out_rows(w, c, hv, W), Uo = out_rows(u, c, hv, U);
          gemm(n, K, n, 1.0f, Aw, n, 1, kr.p, kr.ld, false, Wo.p, Wo.ld, Tri::kLower);
          gemm(n, V, n, 1.0f, Am, n, 1, vr.p, vr.ld, false, Uo.p, Uo.ld, Tri::kLower);
          commit_rows(Wo, w, c, hv);
          commit_rows(Uo, u, c, hv);
        }
      });
}

void fwd_o(const Context&, const ChunkFwdOArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), o(a.o);
  const Mat h(a.h);
  const int64_t H = q.H, HV = v.H, G = HV / H, K = q.D, V = v.D;
  const float scale = static_cast<float>(a.scale);
  const auto chunks = chunks_of(a.q.size(0), a.q.size(1), a.cu_seqlens, a.chunk_size);
  for_each_chunk_head(
      chunks, H, G, prefetch_qk(q, k),
      [&](const Chunk& nx, int64_t hv) {
        prefetch_state(h, nx.index * HV + hv);
        prefetch_rows(v, nx, hv);
        prefetch_rows(o, nx, hv, true);
      },
      [&](Scratch& s, const Chunk& c, int64_t hh) {
        const int64_t n = c.len;
        double* gd = gate_buffer(n);
        const QkBlock b = qk_block(s, q, k, c, hh);
        const Rows& qr = b.q;
        const float* qk = b.qk;
        float* P = s.get(4, n * n);
        float* eg = s.get(6, n);
        float* O = s.get(7, n * V);
        for (int64_t hv = hh * G; hv < (hh + 1) * G; ++hv) {
          gated_scores(g, c, hv, qk, scale, gd, P);
          exp_from(gd, n, 0.0, eg);
          const float* S = view_state(h, c.index * HV + hv, s.get(8, K * V));
          const OutRows Oo = out_rows(o, c, hv, O);
          gemm(n, V, K, 1.0f, qr.p, qr.ld, 1, S, V, false, Oo.p, Oo.ld);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t x = 0; x < V; ++x) Oo.p[i * Oo.ld + x] *= scale * eg[i];
          const Rows vr = view_rows(v, c, hv, s.get(9, n * V));
          gemm(n, V, n, 1.0f, P, n, 1, vr.p, vr.ld, true, Oo.p, Oo.ld, Tri::kLower);
          commit_rows(Oo, o, c, hv);
        }
      });
}

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void gate_fwd(const Context&, const GdnGateFwdArgs& a) {
  const int64_t HV = a.g.size(-1), rows = a.g.rows(), rs = a.g.row_stride();
  std::vector<float> A(HV), bias(HV, 0.0f);
  load_floats(a.A_log.data(), a.A_log.dtype(), A.data(), HV);
  for (float& x : A) x = std::exp(x);
  if (a.dt_bias.defined()) load_floats(a.dt_bias.data(), a.dt_bias.dtype(), bias.data(), HV);
  const size_t gs = dtype_size(a.g.dtype()), ys = dtype_size(a.y.dtype());
  fusedops::cpu::parallel_for(0, rows, 256, [&](int64_t b, int64_t e) {
    std::vector<float> x(HV);
    for (int64_t r = b; r < e; ++r) {
      load_floats(static_cast<const char*>(a.g.data()) + gs * r * rs, a.g.dtype(), x.data(), HV);
      for (int64_t hv = 0; hv < HV; ++hv) x[hv] = -A[hv] * softplus(x[hv] + bias[hv]);
      store_floats(x.data(), static_cast<char*>(a.y.data()) + ys * r * HV, a.y.dtype(), HV);
    }
  });
}

void recurrent_fwd(const Context&, const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  const Tok q(a.q), k(a.k), v(a.v), g(a.g), beta(a.beta), o(a.o);
  const Mat h0(a.initial_state), ht(a.final_state);
  const int64_t HV = v.H, G = HV / q.H, K = q.D, V = v.D;
  const float scale = static_cast<float>(a.scale);
  const auto seqs = make_seqs(a.q.size(0), a.q.size(1), a.cu_seqlens, 1);
  const int64_t N = static_cast<int64_t>(seqs.size());
  fusedops::cpu::parallel_for(0, N * HV, 1, [&](int64_t b, int64_t e) {
    Scratch s;
    for (int64_t task = b; task < e; ++task) {
      const int64_t n = task / HV, hv = task % HV;
      float* S = s.get(0, K * V);
      if (h0.defined()) load_state_tile(h0, n * HV + hv, 0, V, S);
      else std::fill(S, S + K * V, 0.0f);
      float* qt = s.get(1, K);
      float* kt = s.get(2, K);
      float* vt = s.get(3, V);
      float* ot = s.get(4, V);
      for (int64_t t = seqs[n].t0; t < seqs[n].t0 + seqs[n].len; ++t) {
        const int64_t bb = seqs[n].b;
        load_floats(q.ptr(bb, t, hv / G), q.dtype, qt, K);
        load_floats(k.ptr(bb, t, hv / G), k.dtype, kt, K);
        load_floats(v.ptr(bb, t, hv), v.dtype, vt, V);
        float gt = 0.0f, bt = 1.0f;
        if (g.defined()) load_floats(g.ptr(bb, t, hv), g.dtype, &gt, 1);
        if (beta.defined()) load_floats(beta.ptr(bb, t, hv), beta.dtype, &bt, 1);
        recurrent_step(S, qt, kt, vt, std::exp(gt), bt, scale, K, V, ot, s.get(5, V), s.get(6, V));
        store_floats(ot, o.ptr(bb, t, hv), o.dtype, V);
      }
      if (ht.defined()) store_state_tile(S, ht, n * HV + hv, 0, V);
    }
  });
}

void top_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  compose_fwd(with_backend(ctx, "cpu"), a);
}

// ---------------------------------------------------------------------------------------------
// The fp32 backend takes fp32/bf16/fp16 storage; float64 anywhere goes to the reference, except a
// float64 gate cumsum (g / g_cumsum), whose in-chunk differences the kernels take in double.

bool sup_kkt(const ChunkScaledDotKktArgs& a) { return no_float64({&a.k, &a.beta, &a.A}); }
bool sup_solve(const SolveTrilArgs& a) { return no_float64({&a.A, &a.Ai}); }
bool sup_wu(const RecomputeWUFwdArgs& a) {
  return no_float64({&a.k, &a.v, &a.beta, &a.A, &a.w, &a.u});
}
bool sup_fwd_o(const ChunkFwdOArgs& a) { return no_float64({&a.q, &a.k, &a.v, &a.h, &a.o}); }
bool sup_gate(const GdnGateFwdArgs& a) { return no_float64({&a.g, &a.A_log, &a.dt_bias, &a.y}); }
bool sup_recurrent(const FusedRecurrentGatedDeltaRuleFwdArgs& a) {
  return la::no_float64(a);
}
bool sup_top(const ChunkGatedDeltaRuleFwdArgs& a) {
  return la::no_float64_but_gate_cumsum(a, {&a.A});
}

}  // namespace

void unit_lower_inverse(const float* L, int64_t n, float* X, int64_t ld) {
  // X = (I + L)^{-1} by forward substitution in fp32: X_i = e_i - sum_{m<i} L_im X_m (row m of X
  // is zero beyond column m).
  for (int64_t i = 0; i < n; ++i) {
    float* xi = X + i * ld;
    std::fill(xi, xi + n, 0.0f);
    xi[i] = 1.0f;
    for (int64_t m = 0; m < i; ++m) {
      const float l = L[i * n + m];
      const float* xm = X + m * ld;
      for (int64_t j = 0; j <= m; ++j) xi[j] -= l * xm[j];
    }
  }
}

void recurrent_step(float* S, const float* q, const float* k, const float* v, float decay,
                    float beta, float scale, int64_t K, int64_t V, float* o, float* delta,
                    float* p) {
  // p = (decay S)^T k; delta = beta (v - p); S = decay S + k delta^T; o = scale S^T q.
  std::fill(p, p + V, 0.0f);
  for (int64_t y = 0; y < K; ++y) {
    const float ky = k[y];
    const float* srow = S + y * V;
    for (int64_t x = 0; x < V; ++x) p[x] += ky * srow[x];
  }
  for (int64_t x = 0; x < V; ++x) {
    p[x] *= decay;
    delta[x] = beta * (v[x] - p[x]);
  }
  if (o) std::fill(o, o + V, 0.0f);
  for (int64_t y = 0; y < K; ++y) {
    const float ky = k[y];
    float* srow = S + y * V;
    for (int64_t x = 0; x < V; ++x) srow[x] = decay * srow[x] + ky * delta[x];
    if (o) {
      const float qy = q[y];
      for (int64_t x = 0; x < V; ++x) o[x] += qy * srow[x];
    }
  }
  if (o)
    for (int64_t x = 0; x < V; ++x) o[x] *= scale;
}

}  // namespace fusedops::gdn::cpu

namespace fusedops {

void register_gated_delta_rule_cpu(Registry& r) {
  using namespace gdn::cpu;
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<ChunkScaledDotKktArgs>("chunk_scaled_dot_kkt", Direction::kForward, spec, sup_kkt, kkt);
  r.add<SolveTrilArgs>("solve_tril", Direction::kForward, spec, sup_solve, solve);
  r.add<RecomputeWUFwdArgs>("recompute_w_u", Direction::kForward, spec, sup_wu, wu_fwd);
  r.add<ChunkFwdOArgs>("chunk_fwd_o", Direction::kForward, spec, sup_fwd_o, fwd_o);
  r.add<GdnGateFwdArgs>("gdn_gate", Direction::kForward, spec, sup_gate, gate_fwd);
  r.add<FusedRecurrentGatedDeltaRuleFwdArgs>("fused_recurrent_gated_delta_rule", Direction::kForward,
                                             spec, sup_recurrent, recurrent_fwd);
  r.add<ChunkGatedDeltaRuleFwdArgs>("chunk_gated_delta_rule", Direction::kForward, spec, sup_top,
                                    top_fwd);
  gdn::register_cpu_bwd(r);
}

}  // namespace fusedops
