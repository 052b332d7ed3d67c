// rmsnorm_gated, CPU backend: threads over rows, each row converted to fp32 buffers and processed
// by loops the compiler vectorizes (lane-blocked sums from src/cpu/simd.h, a polynomial exp for
// the gate). The weight and bias gradients are summed per fixed chunk of rows (the chunking
// depends only on the shape), then over the chunks in order: bitwise identical for any thread
// count.
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/rmsnorm.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"
#include "src/ops/rmsnorm/rmsnorm_gated_common.h"

namespace fusedops {
namespace {

// a = act(z) and, when grad is given, act'(z); 1 - sigmoid from cpu::sigmoid_pair (no
// cancellation where sigmoid is close to 1).
void gate(GateActivation act, const float* __restrict z, float* __restrict a, float* __restrict grad,
          int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s, one_minus;
    cpu::sigmoid_pair(z[i], s, one_minus);
    if (act == GateActivation::kSilu) {
      a[i] = z[i] * s;
      if (grad) grad[i] = s * (1.0f + z[i] * one_minus);
    } else {
      a[i] = s;
      if (grad) grad[i] = s * one_minus;
    }
  }
}

template <class T>
void load_row(const void* base, DType dtype, int64_t row_stride, int64_t r, float* out, int64_t n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(out, static_cast<const float*>(base) + r * row_stride, n * sizeof(float));
  } else {
    cpu::load_float(static_cast<const T*>(base) + r * row_stride, out, n);
  }
}

template <class T>
void store_row(void* base, DType dtype, int64_t r, const float* in, int64_t n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(static_cast<float*>(base) + r * n, in, n * sizeof(float));
  } else {
    cpu::store_float(in, static_cast<T*>(base) + r * n, n);
  }
}

// weight / bias as fp32 (ones / zeros when absent).
template <class T>
std::vector<float> param(const TensorView& t, int64_t D, float fill) {
  std::vector<float> v(D, fill);
  if (t.defined()) load_row<T>(t.data(), t.dtype(), 0, 0, v.data(), D);
  return v;
}

int64_t row_grain(int64_t D) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1)); }

template <class T>
void fwd_typed(const RmsNormGatedFwdArgs& a) {
  const int64_t rows = a.x.rows(), D = a.x.size(-1);
  const int64_t g = rmsnorm_gated::group_cols(D, a.group_size), G = D / g;
  const std::vector<float> w = param<T>(a.weight, D, 1.0f), b = param<T>(a.bias, D, 0.0f);
  const bool has_z = a.z.defined(), has_res = a.residual.defined();
  const float inv_g = 1.0f / static_cast<float>(g), eps = static_cast<float>(a.eps);
  float* rstd_out = a.rstd.data_as<float>();
  // Strides once per call; fp32 rows are read and written in place (no staging copies) when the
  // row is not modified before the norm (no residual, gate after the norm).
  const int64_t x_st = a.x.row_stride(), z_st = has_z ? a.z.row_stride() : 0;
  const int64_t r_st = has_res ? a.residual.row_stride() : 0;
  const bool x_direct = a.x.dtype() == DType::kFloat32 && !has_res && !(has_z && !a.norm_before_gate);
  const bool z_direct = has_z && a.z.dtype() == DType::kFloat32;
  const bool y_direct = a.y.dtype() == DType::kFloat32;
  cpu::parallel_for(0, rows, row_grain(D), [&](int64_t r0, int64_t r1) {
    std::vector<float> xbuf(D), res(D), zbuf(D), act(D), ybuf(D);
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = xbuf.data();
      if (x_direct) {
        x = a.x.data_as<const float>() + r * x_st;
      } else {
        float* xm = xbuf.data();
        load_row<T>(a.x.data(), a.x.dtype(), x_st, r, xm, D);
        if (has_res) {
          load_row<T>(a.residual.data(), a.residual.dtype(), r_st, r, res.data(), D);
          for (int64_t d = 0; d < D; ++d) xm[d] += res[d];
          store_row<T>(a.residual_out.data(), a.residual_out.dtype(), r, xm, D);
          // Normalise what was stored (the backward recomputes from it), as x + residual in eager.
          if (a.residual_out.dtype() != DType::kFloat32)
            for (int64_t d = 0; d < D; ++d) xm[d] = to_float(from_float<T>(xm[d]));
        }
      }
      if (has_z) {
        const float* z = zbuf.data();
        if (z_direct) z = a.z.data_as<const float>() + r * z_st;
        else load_row<T>(a.z.data(), a.z.dtype(), z_st, r, zbuf.data(), D);
        gate(a.norm_before_gate ? a.activation : GateActivation::kSilu, z, act.data(), nullptr, D);
        if (!a.norm_before_gate)
          for (int64_t d = 0; d < D; ++d) xbuf[d] *= act[d];  // u = x * silu(z) (x is xbuf here)
      }
      float* y = y_direct ? a.y.data_as<float>() + r * D : ybuf.data();
      for (int64_t s = 0; s < G; ++s) {
        const int64_t d0 = s * g;
        const float rs = 1.0f / std::sqrt(cpu::sum_squares(x + d0, g) * inv_g + eps);
        rstd_out[r * G + s] = rs;
        for (int64_t d = d0; d < d0 + g; ++d) y[d] = x[d] * rs * w[d] + b[d];
      }
      if (has_z && a.norm_before_gate)
        for (int64_t d = 0; d < D; ++d) y[d] *= act[d];
      if (!y_direct) store_row<T>(a.y.data(), a.y.dtype(), r, y, D);
    }
  });
}

template <class T>
void bwd_typed(const RmsNormGatedBwdArgs& a) {
  const int64_t rows = a.x.rows(), D = a.x.size(-1);
  const int64_t g = rmsnorm_gated::group_cols(D, a.group_size), G = D / g;
  const std::vector<float> w = param<T>(a.weight, D, 1.0f), b = param<T>(a.bias, D, 0.0f);
  const bool has_z = a.z.defined(), nbg = a.norm_before_gate || !has_z;
  const bool want_w = a.dweight.defined(), want_b = a.dbias.defined();
  const float inv_g = 1.0f / static_cast<float>(g);
  const float* rstd_in = a.rstd.data_as<const float>();
  // Fixed chunks of rows for the parameter gradients (a function of the shape only).
  const int64_t chunk_rows = std::max<int64_t>({1, (rows + 1023) / 1024, 4096 / std::max<int64_t>(D, 1)});
  const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
  // Partial sums in double: a chunk holds many rows, and the fixed order then costs no accuracy.
  std::vector<double> part_w(want_w ? chunks * D : 0), part_b(want_b ? chunks * D : 0);
  const int64_t x_st = a.x.row_stride(), dy_st = a.dy.row_stride();
  const int64_t z_st = has_z ? a.z.row_stride() : 0;
  const int64_t dres_st = a.dresidual.defined() ? a.dresidual.row_stride() : 0;
  // fp32 rows that are only read are used in place (no staging copies).
  const bool x_direct = a.x.dtype() == DType::kFloat32 && nbg;
  const bool dy_direct = a.dy.dtype() == DType::kFloat32;
  const bool z_direct = has_z && a.z.dtype() == DType::kFloat32;
  cpu::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> xb(D), dyb(D), zb(D), act(D), dact(D), t(D), dx(D), dz(D), dres(D), xhb(D);
    for (int64_t c = c0; c < c1; ++c) {
      double* pw = want_w ? part_w.data() + c * D : nullptr;
      double* pb = want_b ? part_b.data() + c * D : nullptr;
      if (pw) std::fill(pw, pw + D, 0.0);
      if (pb) std::fill(pb, pb + D, 0.0);
      for (int64_t r = c * chunk_rows; r < std::min(rows, (c + 1) * chunk_rows); ++r) {
        const float* x = xb.data();
        if (x_direct) x = a.x.data_as<const float>() + r * x_st;
        else load_row<T>(a.x.data(), a.x.dtype(), x_st, r, xb.data(), D);
        const float* dy = dyb.data();
        if (dy_direct) dy = a.dy.data_as<const float>() + r * dy_st;
        else load_row<T>(a.dy.data(), a.dy.dtype(), dy_st, r, dyb.data(), D);
        if (has_z) {
          const float* z = zb.data();
          if (z_direct) z = a.z.data_as<const float>() + r * z_st;
          else load_row<T>(a.z.data(), a.z.dtype(), z_st, r, zb.data(), D);
          gate(nbg ? a.activation : GateActivation::kSilu, z, act.data(), dact.data(), D);
        }
        if (!nbg)
          for (int64_t d = 0; d < D; ++d) xb[d] *= act[d];  // u = x * silu(z) (x is xb here)
        // t = w * (upstream gradient of the normalised value): dh = dy*a (gate after) or dy.
        if (has_z && nbg) {
          for (int64_t d = 0; d < D; ++d) t[d] = dy[d] * act[d];
        } else {
          std::memcpy(t.data(), dy, D * sizeof(float));
        }
        for (int64_t s = 0; s < G; ++s) {
          const int64_t d0 = s * g;
          const float rs = rstd_in[r * G + s];
          for (int64_t d = d0; d < d0 + g; ++d) dx[d] = t[d] * w[d];
          const float mean = rs * cpu::dot(x + d0, dx.data() + d0, g) * inv_g;
          // One loop per output (each vectorises; the same operations per element as one loop).
          float* __restrict xh = xhb.data();
          const float* __restrict tt = t.data();
          for (int64_t d = d0; d < d0 + g; ++d) xh[d] = x[d] * rs;
          if (pw)
            for (int64_t d = d0; d < d0 + g; ++d) pw[d] += static_cast<double>(tt[d] * xh[d]);
          if (pb)
            for (int64_t d = d0; d < d0 + g; ++d) pb[d] += static_cast<double>(tt[d]);
          if (has_z && nbg) {
            float* __restrict dzp = dz.data();
            const float* __restrict da = dact.data();
            for (int64_t d = d0; d < d0 + g; ++d) dzp[d] = dy[d] * (xh[d] * w[d] + b[d]) * da[d];
          }
          float* __restrict dxp = dx.data();
          for (int64_t d = d0; d < d0 + g; ++d)
            dxp[d] = rs * (dxp[d] - xh[d] * mean);  // dh*w - x^*mean, scaled: the gradient of v
        }
        if (!nbg) {
          // dx currently holds du; x holds u = x*silu(z): recover x for dz = du*x*silu'(z).
          load_row<T>(a.x.data(), a.x.dtype(), x_st, r, t.data(), D);
          for (int64_t d = 0; d < D; ++d) {
            dz[d] = dx[d] * t[d] * dact[d];
            dx[d] *= act[d];
          }
        }
        if (a.dresidual.defined()) {
          load_row<T>(a.dresidual.data(), a.dresidual.dtype(), dres_st, r, dres.data(), D);
          for (int64_t d = 0; d < D; ++d) dx[d] += dres[d];
        }
        store_row<T>(a.dx.data(), a.dx.dtype(), r, dx.data(), D);
        if (a.dresidual_in.defined()) store_row<T>(a.dresidual_in.data(), a.dresidual_in.dtype(), r, dx.data(), D);
        if (has_z) store_row<T>(a.dz.data(), a.dz.dtype(), r, dz.data(), D);
      }
    }
  });
  for (auto [want, part, out] : {std::tuple{want_w, &part_w, a.dweight}, std::tuple{want_b, &part_b, a.dbias}}) {
    if (!want) continue;
    std::vector<double> sum(D, 0.0);
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t d = 0; d < D; ++d) sum[d] += (*part)[c * D + d];
    std::vector<float> sumf(sum.begin(), sum.end());
    store_row<T>(out.data(), out.dtype(), 0, sumf.data(), D);
  }
}

bool supports_fwd(const RmsNormGatedFwdArgs& a) { return a.rstd.dtype() == DType::kFloat32; }
bool supports_bwd(const RmsNormGatedBwdArgs& a) { return a.rstd.dtype() == DType::kFloat32; }

void fwd(const Context&, const RmsNormGatedFwdArgs& a) {
  visit_float(a.x.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, double>) fwd_typed<T>(a);
  });
}

void bwd(const Context&, const RmsNormGatedBwdArgs& a) {
  visit_float(a.dy.dtype(), [&](auto t) {
    using T = decltype(t);
    if constexpr (!std::is_same_v<T, double>) bwd_typed<T>(a);
  });
}

}  // namespace

void register_rmsnorm_gated_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<RmsNormGatedFwdArgs>("rmsnorm_gated", Direction::kForward, spec, supports_fwd, fwd);
  r.add<RmsNormGatedBwdArgs>("rmsnorm_gated", Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
