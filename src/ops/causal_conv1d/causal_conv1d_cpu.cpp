// causal_conv1d, CPU backend: threads over (time chunk of one sequence, channel block) tasks,
// fp32 math over whole channel rows (loops the compiler vectorises), a ring of the last W input
// rows per task so that each x row is converted once. Weight and bias gradients are per-task
// fp32 partial rows, summed over tasks in task order: bitwise reproducible for any thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/causal_conv1d.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"
#include "src/ops/causal_conv1d/causal_conv1d_common.h"

namespace fusedops {
namespace {

using conv1d::Geometry;

constexpr int64_t kRows = 256;  // time steps per task
constexpr int64_t kCols = 512;  // channels per task (W rows of them stay in L1)

// silu and its gradient from src/cpu/simd.h (the CPU kernels' one exp): e = e^-|a| <= 1, so that
// no intermediate overflows or divides a denormal (stop 36: the former a / (1 + e^-a), with e^-a
// clamped at e^88, was vectorised with every lane also computing the clamped branch a / (1 + e^88),
// a subnormal; on Intel CPUs each such division takes a microcode assist: the forward with SiLU
// ran at 7.3 ms instead of ~1.5 on a 2-core Xeon. AMD serves subnormals at full speed.)
// silu(-inf) = -inf * 0 is NaN, as in the reference and torch.
using cpu::silu;

// a = silu(a) over a row.
void silu_row(float* __restrict a, int64_t nd) {
  for (int64_t d = 0; d < nd; ++d) a[d] = silu(a[d]);
}

// a = dy * silu'(a) over a row: silu'(a) = s (1 + a (1 - s)), s = sigmoid(a) (s and 1 - s from
// cpu::sigmoid_pair, without cancellation).
void silu_grad_row(const float* __restrict dy, float* __restrict a, int64_t nd) {
  for (int64_t d = 0; d < nd; ++d) {
    const float v = a[d];
    float s, sc;
    cpu::sigmoid_pair(v, s, sc);
    a[d] = dy[d] * s * (1.0f + v * sc);
  }
}

// One forward time step of a 16-bit x in one pass over the channels (the accumulator stays in a
// register): x_t is converted and kept in the ring for the next steps, the W - 1 earlier rows
// come from the ring (r[0] oldest), then bias + sum_k w_k x_k, the activation, and the rounding
// store of y. The same operations in the same order as preactivation + silu_row + store_float,
// so the results are bitwise those of the pass-per-stage loop; every row is a restrict
// parameter of its own so that GCC vectorises (stop 25: that loop did ~12 loads and stores per
// element through L1 for 4 arithmetic steps). `b` is never null (Problem::b holds zeros without
// a bias): a "b ? b[d] : 0" here became masked loads from address 0, which this AMD CPU serves
// through a slow assist (3x slower than the loop it replaced).
template <class T, int W, bool kSilu>
__attribute__((noinline)) void fused_step(const T* __restrict xt, float* __restrict ring_t,
                                          const float* __restrict r0, const float* __restrict r1,
                                          const float* __restrict r2, const float* __restrict w,
                                          int64_t D, const float* __restrict b, T* __restrict y,
                                          int64_t nd) {
  static_assert(W >= 2 && W <= 4, "fused_step serves W = 2..4");
  for (int64_t d = 0; d < nd; ++d) {
    const float x = to_float(xt[d]);
    ring_t[d] = x;
    float a = b[d];
    a += w[d] * r0[d];
    if constexpr (W >= 3) a += w[D + d] * r1[d];
    if constexpr (W >= 4) a += w[2 * D + d] * r2[d];
    a += w[(W - 1) * D + d] * x;
    if constexpr (kSilu) a = silu(a);
    y[d] = from_float<T>(a);
  }
}

float load_any(const TensorView& t, int64_t off) {
  return visit_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return to_float(t.data_as<const T>()[off]);
  });
}

void store_any(const TensorView& t, int64_t off, float v) {
  visit_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    t.data_as<T>()[off] = from_float<T>(v);
  });
}

// One time chunk [t0, t1) (local times) of sequence n.
struct Task {
  int64_t n, batch, begin, L, t0, t1;
};

std::vector<Task> time_tasks(const Geometry& g, const TensorView& cu) {
  std::vector<Task> out;
  for (int64_t n = 0; n < g.N; ++n) {
    const conv1d::Span s = conv1d::host_span(g, cu, n);
    const int64_t L = s.end - s.begin;
    for (int64_t t0 = 0; t0 < L; t0 += kRows)
      out.push_back({n, s.batch, s.begin, L, t0, std::min(L, t0 + kRows)});
  }
  return out;
}

// Everything a task reads, with the small tensors (weight, bias) converted to fp32 once.
struct Problem {
  Geometry g;
  bool silu = false;
  std::vector<float> w;  // [W][D]
  std::vector<float> b;  // [D]: the bias, or zeros without one
  TensorView h0;         // [N, D, W] or undefined
  TensorView dht;        // [N, D, W] or undefined
  const TensorView* cu = nullptr;

  Problem(const TensorView& x, const TensorView& weight, const TensorView& bias,
          const TensorView& initial_state, const TensorView& cu_seqlens,
          CausalConv1dActivation act)
      : g(conv1d::geometry(x, weight, cu_seqlens)), silu(act == CausalConv1dActivation::kSilu),
        h0(initial_state), cu(&cu_seqlens) {
    w.resize(g.W * g.D);
    for (int64_t k = 0; k < g.W; ++k)
      for (int64_t d = 0; d < g.D; ++d)
        w[k * g.D + d] = load_any(weight, k * weight.stride(0) + d * weight.stride(1));
    b.assign(g.D, 0.0f);
    if (bias.defined())
      for (int64_t d = 0; d < g.D; ++d) b[d] = load_any(bias, d * bias.stride(0));
  }
  int64_t slot(int64_t r) const { return ((r % g.W) + g.W) % g.W; }
};

// Row access to a [B, T, D] view with dense channels.
template <class T>
struct Rows {
  T* base = nullptr;
  int64_t sb = 0, st = 0;
  Rows() = default;
  explicit Rows(const TensorView& v)
      : base(v.defined() ? v.data_as<T>() : nullptr),
        sb(v.defined() ? conv1d::batch_stride(v) : 0),
        st(v.defined() ? conv1d::time_stride(v) : 0) {}
  T* row(int64_t batch, int64_t t) const { return base + batch * sb + t * st; }
};

// x~[tau] of the task's sequence, channels [d0, d0+nd), as floats (tau >= -W).
template <class T>
void extended_row(const Problem& p, const Rows<const T>& x, const Task& tk, int64_t tau,
                  int64_t d0, int64_t nd, float* out) {
  if (tau >= 0) {
    cpu::load_float(x.row(tk.batch, tk.begin + tau) + d0, out, nd);
  } else if (!p.h0.defined()) {
    std::fill(out, out + nd, 0.0f);
  } else {
    const int64_t W = p.g.W;
    for (int64_t d = 0; d < nd; ++d) out[d] = load_any(p.h0, (tk.n * p.g.D + d0 + d) * W + tau + W);
  }
}

// a[d] += w[d] * x[d]. A function of its own so that its restrict parameters hold: written
// inline over pointers from the row lambda, GCC kept the loop scalar (stop 24, perf of the bf16
// forward: ~25% of the time in a one-float-at-a-time loop).
__attribute__((noinline)) void fma_row(float* __restrict a, const float* __restrict w, const float* __restrict x,
                                       int64_t n) {
  for (int64_t d = 0; d < n; ++d) a[d] += w[d] * x[d];
}

// a = bias + sum_k w[k] * x~[t-W+1+k], row k of the window given by row_of(k) (channels
// d0..d0+nd).
template <class RowOf>
void preactivation_with(const Problem& p, RowOf row_of, int64_t d0, int64_t nd, float* __restrict a) {
  const int64_t D = p.g.D, W = p.g.W;
  std::memcpy(a, p.b.data() + d0, nd * sizeof(float));
  for (int64_t k = 0; k < W; ++k) fma_row(a, p.w.data() + k * D + d0, row_of(k), nd);
}

// The same from the ring holding rows t-W+1..t.
void preactivation(const Problem& p, const float* ring, int64_t t, int64_t d0, int64_t nd,
                   float* __restrict a) {
  preactivation_with(p, [&](int64_t k) { return ring + p.slot(t - p.g.W + 1 + k) * nd; }, d0, nd, a);
}

template <class T>
void fwd_task(const Problem& p, const CausalConv1dFwdArgs& args, const Task& tk, int64_t d0,
              int64_t nd, float* scratch) {
  const int64_t W = p.g.W;
  const Rows<const T> x(args.x), res(args.residual);
  T* y = args.y.data_as<T>();
  float* ring = scratch;           // W rows
  float* a = ring + W * nd;        // 1 row
  float* rbuf = a + nd;            // 1 row
  for (int64_t r = tk.t0 - W + 1; r < tk.t0; ++r)
    extended_row(p, x, tk, r, d0, nd, ring + p.slot(r) * nd);
  // 16-bit x, W = 2..4, no residual: one pass per step (fused_step).
  using Fused = void (*)(const T*, float*, const float*, const float*, const float*, const float*,
                         int64_t, const float*, T*, int64_t);
  Fused fused = nullptr;
  if constexpr (!std::is_same_v<T, float>) {
    if (!res.base) {
      if (W == 2) fused = p.silu ? fused_step<T, 2, true> : fused_step<T, 2, false>;
      if (W == 3) fused = p.silu ? fused_step<T, 3, true> : fused_step<T, 3, false>;
      if (W == 4) fused = p.silu ? fused_step<T, 4, true> : fused_step<T, 4, false>;
    }
  }
  // fp32 rows are read where they are (no copy into the ring); the halo rows before t0 come
  // from the ring either way.
  for (int64_t t = tk.t0; t < tk.t1; ++t) {
    if constexpr (std::is_same_v<T, float>) {
      preactivation_with(p, [&](int64_t k) {
        const int64_t r = t - W + 1 + k;
        return r >= tk.t0 ? x.row(tk.batch, tk.begin + r) + d0 : ring + p.slot(r) * nd;
      }, d0, nd, a);
    } else if (fused) {
      const float* r[3] = {};
      for (int64_t k = 0; k + 1 < W; ++k) r[k] = ring + p.slot(t - W + 1 + k) * nd;
      fused(x.row(tk.batch, tk.begin + t) + d0, ring + p.slot(t) * nd, r[0], r[1], r[2],
            p.w.data() + d0, p.g.D, p.b.data() + d0,
            y + (tk.batch * p.g.T + tk.begin + t) * p.g.D + d0, nd);
      continue;
    } else {
      cpu::load_float(x.row(tk.batch, tk.begin + t) + d0, ring + p.slot(t) * nd, nd);
      preactivation(p, ring, t, d0, nd, a);
    }
    if (p.silu) silu_row(a, nd);
    if (res.base) {
      cpu::load_float(res.row(tk.batch, tk.begin + t) + d0, rbuf, nd);
      for (int64_t d = 0; d < nd; ++d) a[d] += rbuf[d];
    }
    cpu::store_float(a, y + (tk.batch * p.g.T + tk.begin + t) * p.g.D + d0, nd);
  }
}

template <class T>
void fwd_typed(const CausalConv1dFwdArgs& args) {
  const Problem p(args.x, args.weight, args.bias, args.initial_state, args.cu_seqlens,
                  args.activation);
  const Geometry& g = p.g;
  const std::vector<Task> tasks = time_tasks(g, args.cu_seqlens);
  const int64_t cblocks = (g.D + kCols - 1) / kCols;
  cpu::parallel_for(0, static_cast<int64_t>(tasks.size()) * cblocks, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scratch((g.W + 2) * std::min(kCols, g.D));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t d0 = (i % cblocks) * kCols;
      fwd_task<T>(p, args, tasks[i / cblocks], d0, std::min(kCols, g.D - d0), scratch.data());
    }
  });
  if (!args.final_state.defined()) return;
  // final_state[n,d,j] = x~[L-W+j]
  const Rows<const T> x(args.x);
  cpu::parallel_for(0, g.N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<float> row(g.D);
    for (int64_t n = n0; n < n1; ++n) {
      const conv1d::Span s = conv1d::host_span(g, args.cu_seqlens, n);
      const Task tk{n, s.batch, s.begin, s.end - s.begin, 0, 0};
      for (int64_t j = 0; j < g.W; ++j) {
        extended_row(p, x, tk, tk.L - g.W + j, 0, g.D, row.data());
        for (int64_t d = 0; d < g.D; ++d) store_any(args.final_state, (n * g.D + d) * g.W + j, row[d]);
      }
    }
  });
}

// g = dy * act'(a), in place in a (dyrow holds dy).
void activation_grad(const Problem& p, const float* __restrict dyrow, float* __restrict a,
                     int64_t nd) {
  if (p.silu) {
    silu_grad_row(dyrow, a, nd);
  } else {
    std::memcpy(a, dyrow, nd * sizeof(float));
  }
}

// dx rows [t0, t1) and this task's partial sums of dweight (rows 0..W-1) and dbias (row W) into
// partial (rows of D floats).
template <class T>
void bwd_task(const Problem& p, const CausalConv1dBwdArgs& args, const Task& tk, int64_t d0,
              int64_t nd, float* partial, float* scratch) {
  const int64_t W = p.g.W, D = p.g.D;
  const Rows<const T> x(args.x), dy(args.dy);
  T* dx = args.dx.data_as<T>();
  float* xring = scratch;
  float* gring = xring + W * nd;
  float* dyrow = gring + W * nd;
  float* out = dyrow + nd;
  float* dw = partial + d0;  // row k at dw + k*D; dbias at row W
  float* db = partial + W * D + d0;
  for (int64_t r = tk.t0 - W + 1; r < tk.t0; ++r)
    extended_row(p, x, tk, r, d0, nd, xring + p.slot(r) * nd);
  const int64_t look_end = std::min(tk.L, tk.t1 + W - 1);
  for (int64_t u = tk.t0; u < tk.t1 + W - 1; ++u) {
    float* __restrict gu = gring + p.slot(u) * nd;
    if (u < look_end) {
      cpu::load_float(x.row(tk.batch, tk.begin + u) + d0, xring + p.slot(u) * nd, nd);
      preactivation(p, xring, u, d0, nd, gu);
      cpu::load_float(dy.row(tk.batch, tk.begin + u) + d0, dyrow, nd);
      activation_grad(p, dyrow, gu, nd);
      if (u < tk.t1) {
        for (int64_t d = 0; d < nd; ++d) db[d] += gu[d];
        for (int64_t k = 0; k < W; ++k) {
          const float* __restrict row = xring + p.slot(u - W + 1 + k) * nd;
          fma_row(dw + k * D, gu, row, nd);
        }
      }
    } else {
      std::fill(gu, gu + nd, 0.0f);  // past the end of the sequence
    }
    const int64_t tau = u - W + 1;
    if (tau < tk.t0) continue;
    std::fill(out, out + nd, 0.0f);
    for (int64_t j = 0; j < W; ++j) {
      const float* __restrict gr = gring + p.slot(tau + j) * nd;
      const float* __restrict wk = p.w.data() + (W - 1 - j) * D + d0;
      for (int64_t d = 0; d < nd; ++d) out[d] += wk[d] * gr[d];
    }
    if (p.dht.defined() && tau >= tk.L - W)
      for (int64_t d = 0; d < nd; ++d)
        out[d] += load_any(p.dht, (tk.n * D + d0 + d) * W + tau - tk.L + W);
    cpu::store_float(out, dx + (tk.batch * p.g.T + tk.begin + tau) * D + d0, nd);
  }
}

template <class T>
void bwd_typed(const CausalConv1dBwdArgs& args) {
  Problem p(args.x, args.weight, args.bias, args.initial_state, args.cu_seqlens, args.activation);
  p.dht = args.d_final_state;
  const Geometry& g = p.g;
  const std::vector<Task> tasks = time_tasks(g, args.cu_seqlens);
  const int64_t ntasks = static_cast<int64_t>(tasks.size());
  const int64_t cblocks = (g.D + kCols - 1) / kCols;
  const bool want_params = args.dweight.defined() || args.dbias.defined();
  // Per-task partial rows: W of dweight, 1 of dbias. Tasks that want no parameter gradient
  // accumulate into one throw-away row block per thread chunk instead.
  const int64_t prows = g.W + 1;
  std::vector<float> partials(want_params ? ntasks * prows * g.D : 0, 0.0f);
  cpu::parallel_for(0, ntasks * cblocks, 1, [&](int64_t i0, int64_t i1) {
    const int64_t cols = std::min(kCols, g.D);
    std::vector<float> scratch((2 * g.W + 2) * cols);
    std::vector<float> sink(want_params ? 0 : prows * g.D);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t tt = i / cblocks, d0 = (i % cblocks) * kCols;
      float* part = want_params ? partials.data() + tt * prows * g.D : sink.data();
      bwd_task<T>(p, args, tasks[tt], d0, std::min(kCols, g.D - d0), part, scratch.data());
    }
  });
  if (want_params) {
    cpu::parallel_for(0, g.D, 1024, [&](int64_t c0, int64_t c1) {
      std::vector<float> acc(c1 - c0);
      for (int64_t k = 0; k < prows; ++k) {
        const TensorView& dst = k < g.W ? args.dweight : args.dbias;
        if (!dst.defined()) continue;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t tt = 0; tt < ntasks; ++tt) {
          const float* src = partials.data() + (tt * prows + k) * g.D + c0;
          for (int64_t d = 0; d < c1 - c0; ++d) acc[d] += src[d];
        }
        const int64_t base = k < g.W ? k * g.D : 0;
        for (int64_t d = c0; d < c1; ++d) store_any(dst, base + d, acc[d - c0]);
      }
    });
  }
  if (!args.d_initial_state.defined()) return;
  // dh0[n,d,s] = sum_{t < min(s,L)} w[s-1-t] g[t] + dht[n,d,s-L] (s >= L): g of the first W-1
  // tokens, recomputed.
  const Rows<const T> x(args.x), dy(args.dy);
  cpu::parallel_for(0, g.N, 1, [&](int64_t n0, int64_t n1) {
    std::vector<float> ring(g.W * g.D), grows(std::max<int64_t>(g.W - 1, 1) * g.D), dyrow(g.D);
    for (int64_t n = n0; n < n1; ++n) {
      const conv1d::Span s = conv1d::host_span(g, args.cu_seqlens, n);
      const Task tk{n, s.batch, s.begin, s.end - s.begin, 0, 0};
      const int64_t head = std::min(g.W - 1, tk.L);
      for (int64_t t = 0; t < head; ++t) {
        for (int64_t r = t - g.W + 1; r <= t; ++r)
          extended_row(p, x, tk, r, 0, g.D, ring.data() + p.slot(r) * g.D);
        float* gt = grows.data() + t * g.D;
        preactivation(p, ring.data(), t, 0, g.D, gt);
        cpu::load_float(dy.row(tk.batch, tk.begin + t), dyrow.data(), g.D);
        activation_grad(p, dyrow.data(), gt, g.D);
      }
      for (int64_t d = 0; d < g.D; ++d) {
        for (int64_t sl = 0; sl < g.W; ++sl) {
          float v = 0.0f;
          for (int64_t t = 0; t < std::min(sl, tk.L); ++t)
            v += p.w[(sl - 1 - t) * g.D + d] * grows[t * g.D + d];
          if (sl >= tk.L && p.dht.defined()) v += load_any(p.dht, (n * g.D + d) * g.W + sl - tk.L);
          store_any(args.d_initial_state, (n * g.D + d) * g.W + sl, v);
        }
      }
    }
  });
}

bool lowp_or_f32(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}
bool supports_fwd(const CausalConv1dFwdArgs& a) { return lowp_or_f32(a.x.dtype()); }
bool supports_bwd(const CausalConv1dBwdArgs& a) { return lowp_or_f32(a.x.dtype()); }

void fwd(const Context&, const CausalConv1dFwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto tag) { fwd_typed<decltype(tag)>(a); });
}
void bwd(const Context&, const CausalConv1dBwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto tag) { bwd_typed<decltype(tag)>(a); });
}

}  // namespace

void register_causal_conv1d_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<CausalConv1dFwdArgs>("causal_conv1d", Direction::kForward, spec, supports_fwd, fwd);
  r.add<CausalConv1dBwdArgs>("causal_conv1d", Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
