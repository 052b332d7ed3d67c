#include "src/cpu/rownorm.h"

#include <cmath>
#include <vector>

#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"

namespace fusedops::cpu {
namespace {

// Rows per task: enough work (~32K elements) that threading pays for itself.
int64_t row_grain(int64_t D) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(D, 1)); }

template <class TX, class TY>
void fwd_typed(const RowNormFwdParams& p) {
  parallel_for(0, p.rows, row_grain(p.D), [&](int64_t r0, int64_t r1) {
    std::vector<float> xbuf(p.D), ybuf(p.D);
    for (int64_t r = r0; r < r1; ++r) {
      const TX* xr = static_cast<const TX*>(p.x) + r * p.x_row_stride;
      const float* xf = as_float(xr, xbuf.data(), p.D);
      // In double: the stored rstd is the correctly rounded 1/sqrt of the fp32 mean square
      // (1.0f / sqrtf rounds twice; the backward amplifies that error when eps = 0).
      const double ms = static_cast<double>(sum_squares(xf, p.D) * p.scale + p.eps);
      const float rstd = static_cast<float>(1.0 / std::sqrt(ms));
      p.rstd[r] = rstd;
      if (!p.y) continue;
      TY* yr = static_cast<TY*>(p.y) + r * p.D;
      if constexpr (std::is_same_v<TY, float>) {
        for (int64_t d = 0; d < p.D; ++d) yr[d] = xf[d] * rstd;
      } else {
        for (int64_t d = 0; d < p.D; ++d) ybuf[d] = xf[d] * rstd;
        store_float(ybuf.data(), yr, p.D);
      }
    }
  });
}

template <class TU, class TX>
void bwd_typed(const RowNormBwdParams& p) {
  const float inv_d = p.D > 0 ? 1.0f / static_cast<float>(p.D) : 0.0f;
  parallel_for(0, p.rows, row_grain(p.D), [&](int64_t r0, int64_t r1) {
    std::vector<float> ubuf(p.D), dybuf(p.D), dxbuf(p.D);
    for (int64_t r = r0; r < r1; ++r) {
      const float rstd = p.rstd[r];
      const float* uf = as_float(static_cast<const TU*>(p.u) + r * p.u_row_stride, ubuf.data(), p.D);
      const float* dyf = nullptr;
      float dot_dy_u = 0.0f;
      if (p.dy) {
        dyf = as_float(static_cast<const TU*>(p.dy) + r * p.dy_row_stride, dybuf.data(), p.D);
        dot_dy_u = dot(dyf, uf, p.D);
      }
      float coef;
      if (p.mode == RowNormBwdMode::kRmsFromX) {
        const float g = p.drstd ? p.drstd[r] : 0.0f;
        coef = rstd * rstd * rstd * (dot_dy_u + g) * inv_d;
      } else {
        coef = rstd * dot_dy_u;
      }
      TX* dxr = static_cast<TX*>(p.dx) + r * p.D;
      float* out = std::is_same_v<TX, float> ? reinterpret_cast<float*>(dxr) : dxbuf.data();
      if (dyf) {
        for (int64_t d = 0; d < p.D; ++d) out[d] = rstd * dyf[d] - coef * uf[d];
      } else {
        for (int64_t d = 0; d < p.D; ++d) out[d] = -coef * uf[d];
      }
      if constexpr (!std::is_same_v<TX, float>) store_float(out, dxr, p.D);
    }
  });
}

}  // namespace

void rownorm_fwd(const RowNormFwdParams& p) {
  visit_float(p.x_dtype, [&](auto xt) {
    visit_float(p.y ? p.y_dtype : p.x_dtype, [&](auto yt) {
      fwd_typed<decltype(xt), decltype(yt)>(p);
    });
  });
}

void rownorm_bwd(const RowNormBwdParams& p) {
  visit_float(p.u_dtype, [&](auto ut) {
    visit_float(p.dx_dtype, [&](auto xt) { bwd_typed<decltype(ut), decltype(xt)>(p); });
  });
}

}  // namespace fusedops::cpu
