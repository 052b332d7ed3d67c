// The vocabulary-parallel cross-entropy pieces, CPU backend: one row per task, fp32 math on a
// converted copy of the row (include/fusedops/ops/cross_entropy.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"
#include "src/ops/cross_entropy/ce_shard.h"

namespace fusedops {
namespace {

using ce::Cap;
using ce::cap_of;

// z (and, when given, dz/dx) of row r into z[0, Vs).
template <class T>
void load_z(const TensorView& logits, int64_t r, const Cap& c, float* z, float* dzdx) {
  const int64_t Vs = logits.size(-1);
  cpu::load_float(logits.data_as<const T>() + r * logits.row_stride(), z, Vs);
  for (int64_t v = 0; v < Vs; ++v) {
    float x = z[v] * c.scale, d = c.scale;
    if (c.capped) {
      const float t = std::tanh(x / c.cap);
      x = c.cap * t;
      d *= 1.0f - t * t;
    }
    z[v] = x;
    if (dzdx) dzdx[v] = d;
  }
}

void stats(const Context&, const CrossEntropyShardStatsArgs& a) {
  const int64_t N = a.logits.rows(), Vs = a.logits.size(-1);
  const Cap c = cap_of(a.options);
  float* out = a.stats.data_as<float>();
  visit_float(a.logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::parallel_for(0, N, 8, [&](int64_t r0, int64_t r1) {
      std::vector<float> z(Vs), e(Vs);
      for (int64_t r = r0; r < r1; ++r) {
        float* o = out + r * 4;
        const int64_t y = ce::shard_label(a.labels, r);
        std::fill(o, o + 4, 0.0f);
        if (y == a.options.ignore_index) continue;
        load_z<T>(a.logits, r, c, z.data(), nullptr);
        // Lane-blocked sums (kLanes partial sums, then a fixed tree): a long row's rounding error
        // grows as for a pairwise sum, not as for one running sum.
        float lm[cpu::kLanes], ls[cpu::kLanes] = {}, le[cpu::kLanes] = {};
        std::fill(lm, lm + cpu::kLanes, -std::numeric_limits<float>::infinity());
        for (int64_t v = 0; v < Vs; ++v) {
          lm[v % cpu::kLanes] = std::max(lm[v % cpu::kLanes], z[v]);
          ls[v % cpu::kLanes] += z[v];
        }
        const float m = *std::max_element(lm, lm + cpu::kLanes), sz = cpu::reduce_lanes(ls);
        for (int64_t v = 0; v < Vs; ++v) e[v] = z[v] - m;
        cpu::exp_inplace(e.data(), Vs);  // the library's one vectorised exp (src/cpu/simd.h)
        for (int64_t v = 0; v < Vs; ++v) le[v % cpu::kLanes] += e[v];
        const float se = cpu::reduce_lanes(le);
        const int64_t local = y - a.vocab_start;
        o[0] = m;
        o[1] = se;
        o[2] = local >= 0 && local < Vs ? z[local] : 0.0f;
        o[3] = sz;
      }
    });
  });
}

void bwd(const Context&, const CrossEntropyShardBwdArgs& a) {
  const int64_t N = a.logits.rows(), Vs = a.logits.size(-1);
  const Cap c = cap_of(a.options);
  const float* rg = a.row_grads.data_as<const float>();
  visit_float(a.logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out = a.grad_logits.data_as<T>();
    cpu::parallel_for(0, N, 8, [&](int64_t r0, int64_t r1) {
      std::vector<float> z(Vs), d(Vs);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t y = ce::shard_label(a.labels, r);
        if (y == a.options.ignore_index) {
          std::fill(z.begin(), z.end(), 0.0f);
        } else {
          load_z<T>(a.logits, r, c, z.data(), d.data());
          const float lse = rg[r * 4], dl = rg[r * 4 + 1], dy = rg[r * 4 + 2], ds = rg[r * 4 + 3];
          for (int64_t v = 0; v < Vs; ++v) z[v] -= lse;
          cpu::exp_inplace(z.data(), Vs);
          for (int64_t v = 0; v < Vs; ++v) z[v] = d[v] * (dl * z[v] + ds);
          const int64_t local = y - a.vocab_start;
          if (local >= 0 && local < Vs) z[local] += d[local] * dy;
        }
        cpu::store_float(z.data(), out + r * Vs, Vs);  // the row was read before (in place)
      }
    });
  });
}

bool f32_rows(const TensorView& t) { return t.dtype() == DType::kFloat32; }
bool sup_stats(const CrossEntropyShardStatsArgs& a) { return f32_rows(a.stats); }
bool sup_bwd(const CrossEntropyShardBwdArgs& a) { return f32_rows(a.row_grads); }

}  // namespace

void register_cross_entropy_shard_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX, {DType::kFloat32, DType::kBFloat16, DType::kFloat16},
                   kPriorityCpu};
  r.add<CrossEntropyShardStatsArgs>("cross_entropy_shard", Direction::kForward, spec, sup_stats, stats);
  r.add<CrossEntropyShardBwdArgs>("cross_entropy_shard", Direction::kBackward, spec, sup_bwd, bwd);
}

}  // namespace fusedops
