// The shared sub-operators of linear_attention.h in the float64 reference backend: plain loops
// over chunks, sequences and value heads (any storage dtype); and the row / state loads both
// families' reference kernels use (la_ref.h).
#include <climits>
#include <cmath>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/linear_attention.h"
#include "src/ops/linear_attention/la_ref.h"

namespace fusedops::la::ref {

std::vector<double> load_block(const Tok& t, const Chunk& c, int64_t h) {
  std::vector<double> out(c.len * t.D);
  for (int64_t i = 0; i < c.len; ++i) load_doubles(t.ptr(c.b, c.t0 + i, h), t.dtype, &out[i * t.D], t.D);
  return out;
}

void store_block(const Tok& t, const Chunk& c, int64_t h, const std::vector<double>& v) {
  for (int64_t i = 0; i < c.len; ++i) store_doubles(&v[i * t.D], t.ptr(c.b, c.t0 + i, h), t.dtype, t.D);
}

std::vector<double> load_gate(const Tok& g, const Chunk& c, int64_t h) {
  std::vector<double> out(c.len, 0.0);
  if (g.defined()) out = load_block(g, c, h);
  return out;
}

std::vector<double> load_mat(const Mat& m, int64_t index) {
  std::vector<double> out(m.rows * m.cols);
  load_doubles(m.ptr(index), m.dtype, out.data(), m.rows * m.cols);
  return out;
}

void store_mat(const Mat& m, int64_t index, const std::vector<double>& v) {
  store_doubles(v.data(), m.ptr(index), m.dtype, m.rows * m.cols);
}

namespace {

void cumsum(const Context&, const ChunkLocalCumsumArgs& a) {
  const Tok g(a.g), out(a.out);
  const auto chunks = make_chunks(make_seqs(a.g.size(0), a.g.size(1), a.cu_seqlens, a.chunk_size),
                                  a.chunk_size);
  for (const Chunk& c : chunks)
    for (int64_t h = 0; h < g.H; ++h) {
      const std::vector<double> x = load_block(g, c, h);
      std::vector<double> y(x.size());
      for (int64_t s = 0; s < g.D; ++s) {
        double acc = 0;
        if (a.reverse) {
          for (int64_t i = c.len - 1; i >= 0; --i) y[i * g.D + s] = (acc += x[i * g.D + s]);
        } else {
          for (int64_t i = 0; i < c.len; ++i) y[i * g.D + s] = (acc += x[i * g.D + s]);
        }
      }
      for (double& v : y) v *= a.scale;
      store_block(out, c, h, y);
    }
}

void fwd_h(const Context&, const ChunkGatedDeltaRuleFwdHArgs& a) {
  const Tok k(a.k), w(a.w), u(a.u), g(a.g), gk(a.gk), vn(a.v_new);
  const Mat h(a.h), h0(a.h0), ht(a.ht);
  const int64_t HV = u.H, G = HV / k.H, K = k.D, V = u.D, BT = a.chunk_size;
  const auto seqs = make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for (size_t n = 0; n < seqs.size(); ++n) {
    const auto chunks = make_chunks({seqs[n]}, BT);
    for (int64_t hv = 0; hv < HV; ++hv) {
      std::vector<double> X(K * V, 0.0);
      if (h0.defined()) X = load_mat(h0, n * HV + hv);
      for (const Chunk& c : chunks) {
        store_mat(h, c.index * HV + hv, X);
        const auto kc = load_block(k, c, hv / G), wc = load_block(w, c, hv), uc = load_block(u, c, hv);
        std::vector<double> Vn(c.len * V);
        for (int64_t i = 0; i < c.len; ++i)
          for (int64_t x = 0; x < V; ++x) {
            double s = uc[i * V + x];
            for (int64_t y = 0; y < K; ++y) s -= wc[i * K + y] * X[y * V + x];
            Vn[i * V + x] = s;
          }
        if (vn.defined()) store_block(vn, c, hv, Vn);
        const int64_t last = c.len - 1;
        if (g.defined()) {
          const auto gm = load_block(g, c, hv);
          for (int64_t i = 0; i < c.len; ++i)
            for (int64_t x = 0; x < V; ++x) Vn[i * V + x] *= std::exp(gm[last] - gm[i]);
          for (double& s : X) s *= std::exp(gm[last]);
        } else if (gk.defined()) {
          const auto gm = load_block(gk, c, hv);
          for (int64_t y = 0; y < K; ++y)
            for (int64_t x = 0; x < V; ++x) X[y * V + x] *= std::exp(gm[last * K + y]);
        }
        for (int64_t i = 0; i < c.len; ++i)
          for (int64_t y = 0; y < K; ++y)
            for (int64_t x = 0; x < V; ++x) X[y * V + x] += kc[i * K + y] * Vn[i * V + x];
      }
      if (ht.defined()) store_mat(ht, n * HV + hv, X);
    }
  }
}

void sigmoid_fwd(const Context&, const BetaSigmoidFwdArgs& a) {
  const int64_t D = a.x.size(-1), rows = a.x.rows(), rs = a.x.row_stride();
  const double c = a.allow_neg_eigval ? 2.0 : 1.0;
  const size_t xs = dtype_size(a.x.dtype()), ys = dtype_size(a.y.dtype());
  std::vector<double> x(D);
  for (int64_t r = 0; r < rows; ++r) {
    load_doubles(static_cast<const char*>(a.x.data()) + xs * r * rs, a.x.dtype(), x.data(), D);
    for (double& e : x) e = c / (1.0 + std::exp(-e));
    store_doubles(x.data(), static_cast<char*>(a.y.data()) + ys * r * D, a.y.dtype(), D);
  }
}

// B3: the reverse state-gradient recurrence.
void bwd_dhu(const Context&, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  const Tok q(a.q), k(a.k), w(a.w), dO(a.dout), dvl(a.dv), g(a.g), gk(a.gk), dv2(a.dv2);
  const Mat dh(a.dh), dht(a.dht), dh0(a.dh0);
  const int64_t HV = dO.H, G = HV / k.H, K = k.D, V = dO.D, BT = a.chunk_size;
  const auto seqs = make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for (size_t n = 0; n < seqs.size(); ++n) {
    const auto chunks = make_chunks({seqs[n]}, BT);
    for (int64_t hv = 0; hv < HV; ++hv) {
      std::vector<double> X(K * V, 0.0);
      if (dht.defined()) X = load_mat(dht, n * HV + hv);
      for (auto it = chunks.rbegin(); it != chunks.rend(); ++it) {
        const Chunk& c = *it;
        const int64_t len = c.len, last = len - 1;
        store_mat(dh, c.index * HV + hv, X);
        const auto qc = load_block(q, c, hv / G), kc = load_block(k, c, hv / G);
        const auto wc = load_block(w, c, hv), doc = load_block(dO, c, hv);
        auto D2 = load_block(dvl, c, hv);
        std::vector<double> gm(len, 0.0), gkm;
        if (g.defined()) gm = load_block(g, c, hv);
        if (gk.defined()) gkm = load_block(gk, c, hv);
        for (int64_t i = 0; i < len; ++i) {
          const double f = g.defined() ? std::exp(gm[last] - gm[i]) : 1.0;
          for (int64_t x = 0; x < V; ++x) {
            double s = 0;
            for (int64_t y = 0; y < K; ++y) s += kc[i * K + y] * X[y * V + x];
            D2[i * V + x] += f * s;
          }
        }
        store_block(dv2, c, hv, D2);
        for (int64_t y = 0; y < K; ++y) {
          const double decay = g.defined() ? std::exp(gm[last])
                               : gk.defined() ? std::exp(gkm[last * K + y]) : 1.0;
          for (int64_t x = 0; x < V; ++x) {
            double s = decay * X[y * V + x];
            for (int64_t i = 0; i < len; ++i) {
              const double qg = g.defined() ? std::exp(gm[i]) * qc[i * K + y] : qc[i * K + y];
              s += a.scale * qg * doc[i * V + x] - wc[i * K + y] * D2[i * V + x];
            }
            X[y * V + x] = s;
          }
        }
      }
      if (dh0.defined()) store_mat(dh0, n * HV + hv, X);
    }
  }
}

void sigmoid_bwd(const Context&, const BetaSigmoidBwdArgs& a) {
  const int64_t D = a.x.size(-1), rows = a.x.rows(), rs = a.x.row_stride(), drs = a.dy.row_stride();
  const double cm = a.allow_neg_eigval ? 2.0 : 1.0;
  const size_t xs = dtype_size(a.x.dtype()), ys = dtype_size(a.dy.dtype()), os = dtype_size(a.dx.dtype());
  std::vector<double> x(D), dy(D);
  for (int64_t r = 0; r < rows; ++r) {
    load_doubles(static_cast<const char*>(a.x.data()) + xs * r * rs, a.x.dtype(), x.data(), D);
    load_doubles(static_cast<const char*>(a.dy.data()) + ys * r * drs, a.dy.dtype(), dy.data(), D);
    for (int64_t d = 0; d < D; ++d) {
      const double s = 1.0 / (1.0 + std::exp(-x[d]));
      x[d] = dy[d] * cm * s * (1.0 - s);
    }
    store_doubles(x.data(), static_cast<char*>(a.dx.data()) + os * r * D, a.dx.dtype(), D);
  }
}

}  // namespace

}  // namespace fusedops::la::ref

namespace fusedops {

void register_linear_attention_ref(Registry& r) {
  using namespace la::ref;
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}, kPriorityRef};
  const auto F = Direction::kForward, B = Direction::kBackward;
  r.add<ChunkLocalCumsumArgs>("chunk_local_cumsum", F, spec, nullptr, cumsum);
  r.add<ChunkGatedDeltaRuleFwdHArgs>("chunk_gated_delta_rule_fwd_h", F, spec, nullptr, fwd_h);
  r.add<ChunkGatedDeltaRuleBwdDhuArgs>("chunk_gated_delta_rule_bwd_dhu", B, spec, nullptr, bwd_dhu);
  r.add<BetaSigmoidFwdArgs>("beta_sigmoid", F, spec, nullptr, sigmoid_fwd);
  r.add<BetaSigmoidBwdArgs>("beta_sigmoid", B, spec, nullptr, sigmoid_bwd);
}

}  // namespace fusedops
