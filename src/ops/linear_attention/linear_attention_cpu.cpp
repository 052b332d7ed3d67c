// The shared sub-operators of linear_attention.h on the CPU backend (fp32 math, fp32/bf16/fp16
// storage; float64 anywhere goes to the reference): chunk_local_cumsum (one task per chunk and
// channel group, running sums in double), the state recurrence and its backward (one task per
// sequence, value head and V tile, products on the register-blocked GEMM of la_cpu_kernels.h,
// fp32 rows read and written in place, the snapshots stored around the caches) and the beta
// sigmoid; and the state-tile helpers both families' CPU kernels use (la_cpu.h).
#include <algorithm>
#include <climits>
#include <cmath>

#include "fusedops/core/registry.h"
#include "fusedops/ops/linear_attention.h"
#include "src/cpu/parallel.h"
#include "src/ops/linear_attention/la_check.h"
#include "src/ops/linear_attention/la_cpu.h"

namespace fusedops::la::cpu {

std::vector<Chunk> chunks_of(int64_t B, int64_t T, const TensorView& cu, int64_t BT) {
  return make_chunks(make_seqs(B, T, cu, BT), BT);
}

int64_t v_tile(int64_t tasks, int64_t V) {
  // Split V when there are fewer (sequence, head) tasks than threads; tiles stay multiples of 16.
  const int64_t threads = fusedops::cpu::max_threads();
  if (tasks >= threads || V <= 32) return V;
  const int64_t want = std::max<int64_t>(1, (threads + tasks - 1) / tasks);
  int64_t vt = (V + want - 1) / want;
  vt = std::max<int64_t>(32, (vt + 15) / 16 * 16);
  return std::min(vt, V);
}

void load_state_tile(const Mat& m, int64_t index, int64_t v0, int64_t vt, float* X) {
  const int64_t K = m.rows, V = m.cols;
  for (int64_t y = 0; y < K; ++y)
    load_floats(m.ptr(index) + static_cast<int64_t>(m.esize) * (y * V + v0), m.dtype, X + y * vt, vt);
}

void store_state_tile(const float* X, const Mat& m, int64_t index, int64_t v0, int64_t vt) {
  const int64_t K = m.rows, V = m.cols;
  for (int64_t y = 0; y < K; ++y)
    store_floats(X + y * vt, m.ptr(index) + static_cast<int64_t>(m.esize) * (y * V + v0), m.dtype, vt);
}

void store_state_tile_nt(const float* X, const Mat& m, int64_t index, int64_t v0, int64_t vt) {
#ifdef __AVX__
  // Streaming stores: the snapshot is read only by later operators, so it bypasses the caches
  // instead of evicting this chain's operands (and skips the read-for-ownership of its lines).
  const int64_t K = m.rows, V = m.cols;
  float* base = reinterpret_cast<float*>(m.ptr(index)) + v0;
  if (m.dtype == DType::kFloat32 && vt % 8 == 0 && (reinterpret_cast<uintptr_t>(base) % 32) == 0 &&
      V % 8 == 0) {
    for (int64_t y = 0; y < K; ++y)
      for (int64_t x = 0; x < vt; x += 8)
        _mm256_stream_ps(base + y * V + x, _mm256_loadu_ps(X + y * vt + x));
    return;
  }
#endif
  store_state_tile(X, m, index, v0, vt);
}

const float* view_state(const Mat& m, int64_t index, float* buf) {
  if (m.dtype == DType::kFloat32) return reinterpret_cast<const float*>(m.ptr(index));
  load_floats(m.ptr(index), m.dtype, buf, m.rows * m.cols);
  return buf;
}

namespace {

void cumsum(const Context&, const ChunkLocalCumsumArgs& a) {
  // The running sums are kept in double and rounded once per output: the stored cumsum is then
  // correctly rounded, which matters because the kernels exponentiate differences of it.
  const Tok g(a.g), out(a.out);
  const auto chunks = chunks_of(a.g.size(0), a.g.size(1), a.cu_seqlens, a.chunk_size);
  const int64_t H = g.H, D = g.D;
  fusedops::cpu::parallel_for(0, static_cast<int64_t>(chunks.size()) * H, 16, [&](int64_t b, int64_t e) {
    std::vector<double> acc(D);
    std::vector<float> x(D);
    for (int64_t task = b; task < e; ++task) {
      const Chunk& c = chunks[task / H];
      const int64_t h = task % H;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t s = 0; s < c.len; ++s) {
        const int64_t i = a.reverse ? c.len - 1 - s : s;
        load_floats(g.ptr(c.b, c.t0 + i, h), g.dtype, x.data(), D);
        for (int64_t d = 0; d < D; ++d) acc[d] += x[d];
        if (out.dtype == DType::kFloat64) {  // exact sums of the fp32 steps (see load_gates)
          double* o = reinterpret_cast<double*>(out.ptr(c.b, c.t0 + i, h));
          for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * a.scale;
          continue;
        }
        for (int64_t d = 0; d < D; ++d) x[d] = static_cast<float>(acc[d] * a.scale);
        store_floats(x.data(), out.ptr(c.b, c.t0 + i, h), out.dtype, D);
      }
    }
  });
}

// The task loop of the two state recurrences: one task per (sequence, value head, V tile),
// handed to the threads one at a time. A task's K x vt tile X (the thread's arena s, slot 0; the
// step takes the other slots) starts from its tile of `init` (zeros when undefined);
// step(s, X, c, next, hv, v0, vt, gd) runs for each of the sequence's chunks in order (backwards
// with `reverse`), `next` the chunk after c in that order (nullptr after the last) and gd the
// thread's chunk_size gate values; then X goes to `final` when defined, and the task's
// non-temporal snapshot stores are fenced.
template <class Step>
void for_each_state_tile(const std::vector<Seq>& seqs, int64_t HV, int64_t K, int64_t V, int64_t BT,
                         bool reverse, const Mat& init, const Mat& final, Step&& step) {
  const int64_t N = static_cast<int64_t>(seqs.size());
  const int64_t vt_max = v_tile(N * HV, V), nvt = ceil_div(V, vt_max);
  fusedops::cpu::parallel_for_dynamic(0, N * HV * nvt, 1, [&](int64_t b, int64_t e) {
    Scratch& s = thread_scratch();
    double* gd = gate_buffer(BT);
    for (int64_t task = b; task < e; ++task) {
      const int64_t n = task / (HV * nvt), hv = (task / nvt) % HV, v0 = (task % nvt) * vt_max;
      const int64_t vt = std::min(vt_max, V - v0);
      float* X = s.get(0, K * vt);
      if (init.defined()) load_state_tile(init, n * HV + hv, v0, vt, X);
      else std::fill(X, X + K * vt, 0.0f);
      auto chunks = make_chunks({seqs[n]}, BT);
      if (reverse) std::reverse(chunks.begin(), chunks.end());
      for (size_t ci = 0; ci < chunks.size(); ++ci)
        step(s, X, chunks[ci], ci + 1 < chunks.size() ? &chunks[ci + 1] : nullptr, hv, v0, vt, gd);
      if (final.defined()) store_state_tile(X, final, n * HV + hv, v0, vt);
#ifdef __AVX__
      _mm_sfence();  // the non-temporal snapshot stores
#endif
    }
  });
}

void fwd_h(const Context&, const ChunkGatedDeltaRuleFwdHArgs& a) {
  const Tok k(a.k), w(a.w), u(a.u), g(a.g), gk(a.gk), vn(a.v_new);
  const Mat h(a.h), h0(a.h0), ht(a.ht);
  const int64_t HV = u.H, G = HV / k.H, K = k.D, V = u.D, BT = a.chunk_size;
  const auto seqs = make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for_each_state_tile(
      seqs, HV, K, V, BT, false, h0, ht,
      [&](Scratch& s, float* X, const Chunk& c, const Chunk* next, int64_t hv, int64_t v0,
          int64_t vt, double* gd) {
        const int64_t len = c.len, last = len - 1;
        if (next) {  // the next chunk's operands, while this one computes
          const Chunk& nx = *next;
          prefetch_rows(k, nx, hv / G);
          prefetch_rows(w, nx, hv);
          prefetch_rows(u, nx, hv);
          if (vn.defined()) prefetch_rows(vn, nx, hv, true);
          // (fp32 snapshots are stored around the caches: nothing to prefetch)
          if (vt == V && h.dtype != DType::kFloat32) prefetch_state(h, nx.index * HV + hv, true);
        }
        store_state_tile_nt(X, h, c.index * HV + hv, v0, vt);
        const Rows kr = view_rows(k, c, hv / G, s.get(1, len * K));
        const Rows wr = view_rows(w, c, hv, s.get(2, len * K));
        // Vn = U - W X, written straight into v_new when it is an fp32 row view of the tile.
        const bool whole = vt == V;
        const bool direct_out = vn.defined() && whole && vn.dtype == DType::kFloat32;
        float* Vn = direct_out ? reinterpret_cast<float*>(vn.ptr(c.b, c.t0, hv)) : s.get(3, len * vt);
        const int64_t ldn = direct_out ? vn.st : vt;
        const float* U;
        int64_t ldu;
        if (whole && u.dtype == DType::kFloat32) {
          U = reinterpret_cast<const float*>(u.ptr(c.b, c.t0, hv));
          ldu = u.st;
        } else {
          float* ub = s.get(5, len * vt);
          for (int64_t i = 0; i < len; ++i)
            load_floats(col_ptr(u, c.b, c.t0 + i, hv, v0), u.dtype, ub + i * vt, vt);
          U = ub;
          ldu = vt;
        }
        gemm(len, vt, K, -1.0f, wr.p, wr.ld, 1, X, vt, false, Vn, ldn, Tri::kNone, false, U, ldu);
        if (vn.defined() && !direct_out)
          for (int64_t i = 0; i < len; ++i)
            store_floats(Vn + i * vt, col_ptr(vn, c.b, c.t0 + i, hv, v0), vn.dtype, vt);
        // Vg = diag(exp(g_last - g)) Vn (or Vn itself without a scalar gate).
        float* Vg = s.get(6, len * vt);
        if (g.defined()) {
          float* gm = s.get(4, len);
          load_gates(g, c, hv, gd);
          const double gl = gd[last];
          for (int64_t i = 0; i < len; ++i) gm[i] = static_cast<float>(gl - gd[i]);
          exp_inplace(gm, len);
          for (int64_t i = 0; i < len; ++i) {
            const float f = gm[i];
            const float* __restrict src = Vn + i * ldn;
            float* __restrict dst = Vg + i * vt;
            for (int64_t x = 0; x < vt; ++x) dst[x] = src[x] * f;
          }
          const float d = std::exp(static_cast<float>(gl));
          for (int64_t e2 = 0; e2 < K * vt; ++e2) X[e2] *= d;
        } else {
          for (int64_t i = 0; i < len; ++i) std::copy(Vn + i * ldn, Vn + i * ldn + vt, Vg + i * vt);
        }
        if (!g.defined() && gk.defined()) {
          float* gl = s.get(4, K);
          load_floats(gk.ptr(c.b, c.t0 + last, hv), gk.dtype, gl, K);
          exp_inplace(gl, K);
          for (int64_t y = 0; y < K; ++y)
            for (int64_t x = 0; x < vt; ++x) X[y * vt + x] *= gl[y];
        }
        gemm(K, vt, len, 1.0f, kr.p, 1, kr.ld, Vg, vt, true, X, vt);
      });
}

void sigmoid_fwd(const Context&, const BetaSigmoidFwdArgs& a) {
  const int64_t D = a.x.size(-1), rows = a.x.rows(), rs = a.x.row_stride();
  const float cm = a.allow_neg_eigval ? 2.0f : 1.0f;
  const size_t xs = dtype_size(a.x.dtype()), ys = dtype_size(a.y.dtype());
  fusedops::cpu::parallel_for(0, rows, 256, [&](int64_t b, int64_t e) {
    std::vector<float> x(D);
    for (int64_t r = b; r < e; ++r) {
      load_floats(static_cast<const char*>(a.x.data()) + xs * r * rs, a.x.dtype(), x.data(), D);
      for (float& v : x) v = cm / (1.0f + std::exp(-v));
      store_floats(x.data(), static_cast<char*>(a.y.data()) + ys * r * D, a.y.dtype(), D);
    }
  });
}

// B3: reverse state-gradient recurrence.
void bwd_dhu(const Context&, const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  const Tok q(a.q), k(a.k), w(a.w), dO(a.dout), dvl(a.dv), g(a.g), gk(a.gk), dv2(a.dv2);
  const Mat dh(a.dh), dht(a.dht), dh0(a.dh0);
  const int64_t HV = dO.H, G = HV / k.H, K = k.D, V = dO.D, BT = a.chunk_size;
  const float scale = static_cast<float>(a.scale);
  const auto seqs = make_seqs(a.k.size(0), a.k.size(1), a.cu_seqlens, BT);
  for_each_state_tile(
      seqs, HV, K, V, BT, true, dht, dh0,
      [&](Scratch& s, float* X, const Chunk& c, const Chunk* next, int64_t hv, int64_t v0,
          int64_t vt, double* gd) {
        const int64_t len = c.len, last = len - 1;
        if (next) {  // the next chunk's operands, while this one computes
          const Chunk& nx = *next;
          prefetch_rows(q, nx, hv / G);
          prefetch_rows(k, nx, hv / G);
          prefetch_rows(w, nx, hv);
          prefetch_rows(dO, nx, hv);
          prefetch_rows(dvl, nx, hv);
          prefetch_rows(dv2, nx, hv, true);
          // (fp32 snapshots are stored around the caches: nothing to prefetch)
          if (vt == V && dh.dtype != DType::kFloat32) prefetch_state(dh, nx.index * HV + hv, true);
        }
        store_state_tile_nt(X, dh, c.index * HV + hv, v0, vt);
        const Rows kr = view_rows(k, c, hv / G, s.get(1, len * K));
        const Rows wr = view_rows(w, c, hv, s.get(2, len * K));
        // fp32 rows of whole-V tiles are read and written in place.
        const bool whole = vt == V;
        auto in_rows = [&](const Tok& t, float* buf, int64_t& ld) -> const float* {
          if (whole && t.dtype == DType::kFloat32) {
            ld = t.st;
            return reinterpret_cast<const float*>(t.ptr(c.b, c.t0, hv));
          }
          for (int64_t i = 0; i < len; ++i)
            load_floats(col_ptr(t, c.b, c.t0 + i, hv, v0), t.dtype, buf + i * vt, vt);
          ld = vt;
          return buf;
        };
        int64_t ldl, ldo;
        const float* Dl = in_rows(dvl, s.get(3, len * vt), ldl);
        const float* dOt = in_rows(dO, s.get(5, len * vt), ldo);
        const bool direct_out = whole && dv2.dtype == DType::kFloat32;
        float* D2 = direct_out ? reinterpret_cast<float*>(dv2.ptr(c.b, c.t0, hv)) : s.get(8, len * vt);
        const int64_t ld2 = direct_out ? dv2.st : vt;
        float* tmp = s.get(4, len * vt);
        float* qg = s.get(6, len * K);
        float* gm = s.get(7, std::max(len, K));
        const Rows qr = view_rows(q, c, hv / G, s.get(9, len * K));
        gemm(len, vt, K, 1.0f, kr.p, kr.ld, 1, X, vt, false, tmp, vt);
        if (g.defined()) {
          load_gates(g, c, hv, gd);
          const double gl = gd[last];
          for (int64_t i = 0; i < len; ++i) {
            const float f = std::exp(static_cast<float>(gl - gd[i]));
            const float fq = scale * std::exp(static_cast<float>(gd[i]));
            for (int64_t x = 0; x < vt; ++x) D2[i * ld2 + x] = Dl[i * ldl + x] + f * tmp[i * vt + x];
            for (int64_t y = 0; y < K; ++y) qg[i * K + y] = fq * qr.p[i * qr.ld + y];
          }
          const float d = std::exp(static_cast<float>(gl));
          for (int64_t e2 = 0; e2 < K * vt; ++e2) X[e2] *= d;
        } else {
          for (int64_t i = 0; i < len; ++i) {
            for (int64_t x = 0; x < vt; ++x) D2[i * ld2 + x] = Dl[i * ldl + x] + tmp[i * vt + x];
            for (int64_t y = 0; y < K; ++y) qg[i * K + y] = scale * qr.p[i * qr.ld + y];
          }
          if (gk.defined()) {
            load_floats(gk.ptr(c.b, c.t0 + last, hv), gk.dtype, gm, K);
            exp_inplace(gm, K);
            for (int64_t y = 0; y < K; ++y)
              for (int64_t x = 0; x < vt; ++x) X[y * vt + x] *= gm[y];
          }
        }
        if (!direct_out)
          for (int64_t i = 0; i < len; ++i)
            store_floats(D2 + i * vt, col_ptr(dv2, c.b, c.t0 + i, hv, v0), dv2.dtype, vt);
        gemm(K, vt, len, 1.0f, qg, 1, K, dOt, ldo, true, X, vt);
        gemm(K, vt, len, -1.0f, wr.p, 1, wr.ld, D2, ld2, true, X, vt);
      });
}

void sigmoid_bwd(const Context&, const BetaSigmoidBwdArgs& a) {
  const int64_t D = a.x.size(-1), rows = a.x.rows(), rs = a.x.row_stride(), drs = a.dy.row_stride();
  const float cm = a.allow_neg_eigval ? 2.0f : 1.0f;
  const size_t xs = dtype_size(a.x.dtype()), ys = dtype_size(a.dy.dtype()), os = dtype_size(a.dx.dtype());
  fusedops::cpu::parallel_for(0, rows, 256, [&](int64_t b, int64_t e) {
    std::vector<float> x(D), dy(D);
    for (int64_t r = b; r < e; ++r) {
      load_floats(static_cast<const char*>(a.x.data()) + xs * r * rs, a.x.dtype(), x.data(), D);
      load_floats(static_cast<const char*>(a.dy.data()) + ys * r * drs, a.dy.dtype(), dy.data(), D);
      for (int64_t d = 0; d < D; ++d) {
        const float sg = 1.0f / (1.0f + std::exp(-x[d]));
        x[d] = dy[d] * cm * sg * (1.0f - sg);
      }
      store_floats(x.data(), static_cast<char*>(a.dx.data()) + os * r * D, a.dx.dtype(), D);
    }
  });
}

// A float64 out is the exact cumsum of fp32/bf16/fp16 steps (the torch layer's g_cumsum on the CPU).
bool sup_cumsum(const ChunkLocalCumsumArgs& a) { return no_float64({&a.g}); }
bool sup_fwd_h(const ChunkGatedDeltaRuleFwdHArgs& a) {
  return no_float64({&a.k, &a.w, &a.u, &a.h0, &a.h, &a.v_new, &a.ht});
}
bool sup_sigmoid(const BetaSigmoidFwdArgs& a) { return no_float64({&a.x, &a.y}); }
bool sup_dhu(const ChunkGatedDeltaRuleBwdDhuArgs& a) {
  return no_float64({&a.q, &a.k, &a.w, &a.dout, &a.dv, &a.dht, &a.dh, &a.dh0, &a.dv2});
}
bool sup_sigmoid_bwd(const BetaSigmoidBwdArgs& a) { return no_float64({&a.x, &a.dy, &a.dx}); }

}  // namespace

}  // namespace fusedops::la::cpu

namespace fusedops {

void register_linear_attention_cpu(Registry& r) {
  using namespace la::cpu;
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  const auto F = Direction::kForward, B = Direction::kBackward;
  r.add<ChunkLocalCumsumArgs>("chunk_local_cumsum", F, spec, sup_cumsum, cumsum);
  r.add<ChunkGatedDeltaRuleFwdHArgs>("chunk_gated_delta_rule_fwd_h", F, spec, sup_fwd_h, fwd_h);
  r.add<ChunkGatedDeltaRuleBwdDhuArgs>("chunk_gated_delta_rule_bwd_dhu", B, spec, sup_dhu, bwd_dhu);
  r.add<BetaSigmoidFwdArgs>("beta_sigmoid", F, spec, sup_sigmoid, sigmoid_fwd);
  r.add<BetaSigmoidBwdArgs>("beta_sigmoid", B, spec, sup_sigmoid_bwd, sigmoid_bwd);
}

}  // namespace fusedops
