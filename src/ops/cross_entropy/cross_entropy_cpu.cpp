// fused_cross_entropy_loss, CPU backend, and the CPU engine (ce_cpu.h) that chunk_loss shares:
// one pass per row over an fp32 copy of the row (max, exponentials, sums, gradient), threads
// over rows, vectorisable fp32 loops with lane-blocked (fixed-order) reductions.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define FUSEDOPS_CE_AVX512 1
#endif

#include "fusedops/core/registry.h"
#include "fusedops/ops/cross_entropy.h"
#include "src/core/visit.h"
#include "src/cpu/parallel.h"
#include "src/cpu/simd.h"
#include "src/ops/cross_entropy/ce_common.h"
#include "src/ops/cross_entropy/ce_cpu.h"

namespace fusedops::cpu::ce {
namespace {

// exp(x) of x = logit - max <= 0: src/cpu/simd.h's exp_nonpositive (the CPU kernels' one exp; 0
// below -87.3 and for masked -inf logits, NaN stays NaN), on a float or on an __m512 in the
// AVX-512 loops.
using cpu::exp_nonpositive;

// float -> T for a span, branch-free for bf16 (src/core/half.h's scalar conversion returns early
// for NaN, which keeps the loop scalar); the same rounding (nearest even, NaN stays NaN).
template <class T>
inline void store_span(const float* __restrict in, T* __restrict out, int64_t n) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(in[i]);
      const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      out[i].bits = static_cast<uint16_t>((nan & ((u >> 16) | 0x40u)) | (~nan & rounded));
    }
  } else {
    store_float(in, out, n);
  }
}

// The reductions below read float rows, or rows of any storage type T converted on the fly, in
// blocks of kLanes values: lane l of a block goes to accumulator l.
template <class T>
inline void block_floats(const T* __restrict a, float* __restrict f) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    uint32_t u[kLanes];  // the bits moved up as integers: GCC vectorises this, not to_float's
    for (int l = 0; l < kLanes; ++l) u[l] = static_cast<uint32_t>(a[l].bits) << 16;
    std::memcpy(f, u, sizeof(u));
  } else {
    for (int l = 0; l < kLanes; ++l) f[l] = to_float(a[l]);
  }
}

// acc = v > acc ? v : acc per lane on two 8-float vectors (lanes 0-7, 8-15). Written with vector
// extensions: GCC 12 leaves the same select on a float array as scalar compares and cmovs.
inline void max_block(v8f& acc0, v8f& acc1, const float* f) {
  const v8f v0 = load8(f), v1 = load8(f + 8);
  acc0 = v0 > acc0 ? v0 : acc0;
  acc1 = v1 > acc1 ? v1 : acc1;
}

// The lanes' maxima after the tail (values past the last full block, lane by lane) and the fixed
// tree over the lanes.
template <class T>
float max_finish(v8f acc0, v8f acc1, const T* tail, int64_t n_tail) {
  float acc[kLanes];
  store8(acc, acc0);
  store8(acc + 8, acc1);
  for (int l = 0; l < n_tail; ++l) {
    const float v = to_float(tail[l]);
    acc[l] = v > acc[l] ? v : acc[l];
  }
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
  return acc[0];
}

template <class T>
float max_lanes(const T* a, int64_t n) {
  static_assert(kLanes == 16, "two 8-float vectors");
  v8f acc0 = splat(-std::numeric_limits<float>::max()), acc1 = acc0;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    float f[kLanes];
    block_floats(a + i, f);
    max_block(acc0, acc1, f);
  }
  return max_finish(acc0, acc1, a + i, n - i);
}

template <class T>
float sum_lanes(const T* a, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    float f[kLanes];
    block_floats(a + i, f);
    for (int l = 0; l < kLanes; ++l) acc[l] += f[l];
  }
  for (int l = 0; i + l < n; ++l) acc[l] += to_float(a[i + l]);
  return reduce_lanes(acc);
}

#ifdef FUSEDOPS_CE_AVX512
// 16 values as floats in a register, converted in registers (the same values as block_floats).
// Stop 36: exp_sum went through block_floats' stack array, two 32-byte stores read back by one
// 64-byte load, which store forwarding does not serve on Intel CPUs: a stall per 16 logits
// (the loss-only forward took 29 ms instead of ~4 at [1024, 32000] fp32 on a 2-core Xeon).
template <class T>
inline __m512 load16(const T* a) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_loadu_ps(a);
  } else if constexpr (std::is_same_v<T, bf16_t>) {
    // The zero-masking forms: GCC 12's unmasked ones trip -Wmaybe-uninitialized (as above).
    const __m512i u = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, u, 16));
  } else {
    static_assert(std::is_same_v<T, fp16_t>, "logits are float, bf16 or fp16 here");
    return _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  }
}
#endif

// a[i] = exp(a[i] - m); returns the lane-blocked sum of the results.
float exp_shift_sum(float* a, int64_t n, float m) {
  float acc[kLanes] = {};
  int64_t i = 0;
#ifdef FUSEDOPS_CE_AVX512
  static_assert(kLanes == 16, "one zmm of lanes");
  {
    __m512 vacc = _mm512_setzero_ps();
    const __m512 vm = _mm512_set1_ps(m);
    for (; i + kLanes <= n; i += kLanes) {
      const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(a + i), vm));
      _mm512_storeu_ps(a + i, e);
      vacc = _mm512_add_ps(vacc, e);
    }
    _mm512_storeu_ps(acc, vacc);
  }
#endif
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = exp_nonpositive(a[i + l] - m);
      a[i + l] = e;
      acc[l] += e;
    }
  for (int l = 0; i + l < n; ++l) {
    const float e = exp_nonpositive(a[i + l] - m);
    a[i + l] = e;
    acc[l] += e;
  }
  return reduce_lanes(acc);
}

int64_t label_of(const void* labels, bool int64, int64_t i) {
  return int64 ? static_cast<const int64_t*>(labels)[i] : static_cast<const int32_t*>(labels)[i];
}

// sum_i exp(a[i] - m), lane-blocked; a is left as it is.
template <class T>
float exp_sum(const T* a, int64_t n, float m) {
  float acc[kLanes] = {};
  int64_t i = 0;
#ifdef FUSEDOPS_CE_AVX512
  {
    __m512 vacc = _mm512_setzero_ps();
    const __m512 vm = _mm512_set1_ps(m);
    for (; i + kLanes <= n; i += kLanes)
      vacc = _mm512_add_ps(vacc, exp_nonpositive(_mm512_sub_ps(load16(a + i), vm)));
    _mm512_storeu_ps(acc, vacc);
  }
#endif
  for (; i + kLanes <= n; i += kLanes) {
    float f[kLanes];
    block_floats(a + i, f);
    for (int l = 0; l < kLanes; ++l) acc[l] += exp_nonpositive(f[l] - m);
  }
  for (int l = 0; i + l < n; ++l) acc[l] += exp_nonpositive(to_float(a[i + l]) - m);
  return reduce_lanes(acc);
}

// Branch-free float -> bf16 bits (round to nearest even, NaN stays NaN).
inline uint16_t bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  return static_cast<uint16_t>((nan & ((u >> 16) | 0x40u)) | (~nan & ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)));
}

template <class T>
inline void store_one(T* p, float v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    p->bits = bf16_bits(v);
  else
    *p = from_float<T>(v);
}

// z[v] = logit_scale * x[v] for a row, returning max_v z (lane-blocked, so it vectorises).
template <class TIn>
float scale_and_max(const TIn* __restrict x, float* __restrict z, int64_t n, float scale) {
  v8f acc0 = splat(-std::numeric_limits<float>::max()), acc1 = acc0;
  int64_t i = 0;
#ifdef FUSEDOPS_CE_AVX512
  // In registers, as exp_sum (the stack array of block_floats stalls store forwarding on Intel:
  // this pass was chunk_loss's largest non-GEMM cost on a Xeon). The same lanes and selects
  // (vmaxps returns its second operand, the accumulator, for a NaN), so the same maximum.
  {
    __m512 vacc = _mm512_set1_ps(-std::numeric_limits<float>::max());
    const __m512 vs = _mm512_set1_ps(scale);
    for (; i + kLanes <= n; i += kLanes) {
      const __m512 v = _mm512_mul_ps(load16(x + i), vs);
      _mm512_storeu_ps(z + i, v);
      vacc = _mm512_mask_max_ps(vacc, 0xFFFF, v, vacc);  // masked form: GCC 12's unmasked one trips -Wmaybe-uninitialized
    }
    float acc[kLanes];
    _mm512_storeu_ps(acc, vacc);
    acc0 = load8(acc);
    acc1 = load8(acc + 8);
  }
#endif
  for (; i + kLanes <= n; i += kLanes) {
    float f[kLanes];
    block_floats(x + i, f);
    for (int l = 0; l < kLanes; ++l) z[i + l] = f[l] * scale;
    max_block(acc0, acc1, z + i);
  }
  for (int64_t j = i; j < n; ++j) z[j] = to_float(x[j]) * scale;
  return max_finish(acc0, acc1, z + i, n - i);
}

// A row's loss and z-loss from its statistics: the maximum m of z, log_d = log sum exp(z - m), z at
// the label and sum z (label smoothing); row_z may be null. Returns lse = m + log_d. The one form
// of the formula for rows() and finish_block_stats().
inline float store_row_loss(float m, float log_d, float zy, float sz, float eps, float inv_v,
                            float lambda, float* row_loss, float* row_z) {
  const float lse = m + log_d;
  const float z_term = lambda * lse * lse;
  *row_loss = (1.0f - eps) * (m - zy) + eps * (m - sz * inv_v) + log_d + z_term;
  if (row_z) *row_z = z_term;
  return lse;
}

// One row per iteration: pass A transforms the row into an fp32 copy z and takes its max (and
// sum for label smoothing), pass B sums exp(z - m) (storing it when a gradient is wanted), pass
// C writes the gradient in the output dtype. The copy makes in-place gradients safe.
template <class TIn, class TOut>
void rows_typed(const RowsParams& p) {
  const int64_t V = p.vocab;
  const bool capped = p.softcap > 0.0f;
  const float inv_cap = capped ? 1.0f / p.softcap : 0.0f;
  const float eps = p.label_smoothing, lambda = p.lse_square_scale;
  const float inv_v = 1.0f / static_cast<float>(V);
  const int64_t grain = std::max<int64_t>(1, 16384 / V);
  parallel_for(0, p.rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> z(V), t(capped ? V : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t y = label_of(p.labels, p.labels_int64, r);
      TOut* g = p.grad ? static_cast<TOut*>(p.grad) + r * p.grad_row_stride : nullptr;
      if (y == p.ignore_index) {
        p.row_loss[r] = 0.0f;
        if (p.row_z) p.row_z[r] = 0.0f;
        if (g) std::fill(g, g + V, from_float<TOut>(0.0f));
        continue;
      }
      const TIn* x = static_cast<const TIn*>(p.logits) + r * p.logits_row_stride;
      if constexpr (!std::is_same_v<TIn, double>) {
        if (!g && !capped && p.logit_scale == 1.0f) {
          // Loss only, unscaled logits: the row is read as it is stored, converted on the fly,
          // with no fp32 copy (bitwise the same sums: the copy would equal to_float(x) exactly).
          const float m = max_lanes(x, V);
          const float zy = y >= 0 && y < V ? to_float(x[y]) : std::numeric_limits<float>::quiet_NaN();
          const float sz = eps > 0.0f ? sum_lanes(x, V) : 0.0f;
          store_row_loss(m, std::log(exp_sum(x, V, m)), zy, sz, eps, inv_v, lambda, p.row_loss + r,
                         p.row_z ? p.row_z + r : nullptr);
          continue;
        }
      }
      float m;
      if (capped) {
        for (int64_t v = 0; v < V; ++v) {
          t[v] = std::tanh(to_float(x[v]) * p.logit_scale * inv_cap);
          z[v] = p.softcap * t[v];
        }
        m = max_lanes(z.data(), V);
      } else {
        m = scale_and_max(x, z.data(), V, p.logit_scale);
      }
      const bool in_range = y >= 0 && y < V;
      const float zy = in_range ? z[y] : std::numeric_limits<float>::quiet_NaN();
      const float sz = eps > 0.0f ? sum_lanes(z.data(), V) : 0.0f;
      // With a gradient z now holds exp(z - m); without, it keeps z.
      const float d = g ? exp_shift_sum(z.data(), V, m) : exp_sum(z.data(), V, m);
      const float lse = store_row_loss(m, std::log(d), zy, sz, eps, inv_v, lambda, p.row_loss + r,
                                       p.row_z ? p.row_z + r : nullptr);
      if (!g) continue;
      const float c = p.row_scale[r];
      const float a = c * (1.0f + 2.0f * lambda * lse) * p.logit_scale / d;
      const float b = c * eps * inv_v * p.logit_scale;
      if (capped) {
        for (int64_t v = 0; v < V; ++v) store_one(g + v, (a * z[v] - b) * (1.0f - t[v] * t[v]));
      } else if constexpr (std::is_same_v<TOut, bf16_t>) {
        for (int64_t v = 0; v < V; ++v) g[v].bits = bf16_bits(a * z[v] - b);
      } else {
        for (int64_t v = 0; v < V; ++v) g[v] = from_float<TOut>(a * z[v] - b);
      }
      if (in_range) {
        // The target entry again in one fp32 expression (no cancellation after a rounding).
        const float cy = c * (1.0f - eps) * p.logit_scale;
        store_one(g + y, (a * z[y] - b - cy) * (capped ? 1.0f - t[y] * t[y] : 1.0f));
      }
    }
  });
}

void store_any(void* base, DType dtype, int64_t i, double v) {
  visit_float(dtype, [&](auto tag) {
    using U = decltype(tag);
    if constexpr (std::is_same_v<U, double>)
      static_cast<double*>(base)[i] = v;
    else
      static_cast<U*>(base)[i] = from_float<U>(static_cast<float>(v));
  });
}

}  // namespace

void row_scales(const ScaleParams& p) {
  int64_t valid = 0;
  for (int64_t i = 0; i < p.rows; ++i) valid += label_of(p.labels, p.labels_int64, i) != p.ignore_index;
  const double mean_div = p.mean ? static_cast<double>(std::max<int64_t>(valid, 1)) : 1.0;
  for (int64_t i = 0; i < p.rows; ++i) {
    if (label_of(p.labels, p.labels_int64, i) == p.ignore_index) {
      p.row_scale[i] = p.row_norm[i] = 0.0f;
      continue;
    }
    const double alpha =
        p.alpha_per_sample ? static_cast<double>(p.alpha_per_sample[i / p.rows_per_sample]) : p.alpha;
    const double inv = 1.0 / (mean_div * alpha);
    double w = 1.0;
    if (p.loss_weight) {
      w = visit_float(p.loss_weight_dtype, [&](auto tag) {
        using U = decltype(tag);
        if constexpr (std::is_same_v<U, double>)
          return static_cast<const double*>(p.loss_weight)[i];
        else
          return static_cast<double>(to_float(static_cast<const U*>(p.loss_weight)[i]));
      });
    }
    p.row_norm[i] = static_cast<float>(inv);
    p.row_scale[i] = static_cast<float>(w * inv);
  }
}

void rows(const RowsParams& p) {
  if (p.rows <= 0) return;
  visit_float(p.logits_dtype, [&](auto in_tag) {
    using TIn = decltype(in_tag);
    if constexpr (std::is_same_v<TIn, double>) {
      FUSEDOPS_FAIL(kType, "fused_cross_entropy_loss", "the cpu backend does not take float64");
    } else {
      visit_float(p.grad ? p.grad_dtype : p.logits_dtype, [&](auto out_tag) {
        using TOut = decltype(out_tag);
        if constexpr (std::is_same_v<TOut, double>) {
          FUSEDOPS_FAIL(kType, "fused_cross_entropy_loss", "the cpu backend does not take float64");
        } else {
          rows_typed<TIn, TOut>(p);
        }
      });
    }
  });
}

namespace {
// rows()' logit transforms on a span of a block, in place: z = softcap tanh(z scale / softcap) or
// z scale (nothing for scale 1 without a cap).
void transform_span(float* z, int64_t n, float logit_scale, float softcap) {
  if (softcap > 0.0f) {
    const float inv_cap = 1.0f / softcap;
    for (int64_t i = 0; i < n; ++i) z[i] = softcap * std::tanh(z[i] * logit_scale * inv_cap);
  } else if (logit_scale != 1.0f) {
    for (int64_t i = 0; i < n; ++i) z[i] *= logit_scale;
  }
}
}  // namespace

void block_stats(const BlockStatsParams& p) {
  const int64_t n = p.cols;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t y = label_of(p.labels, p.labels_int64, r);
    BlockStat& st = p.out[r];
    if (y == p.ignore_index) {
      st = BlockStat{0.0f, 0.0f, 0.0f, 0.0f};
      continue;
    }
    float* z = p.logits + r * p.ld;
    // The same transforms and select-based maximum as rows(): a NaN never wins the maximum and
    // comes out through the sum of exponentials.
    transform_span(z, n, p.logit_scale, p.softcap);
    st.m = max_lanes(z, n);
    st.d = exp_sum(z, n, st.m);
    st.sz = p.label_smoothing > 0.0f ? sum_lanes(z, n) : 0.0f;
    st.zy = y >= p.v0 && y < p.v0 + n ? z[y - p.v0] : 0.0f;
  }
}

void block_stats_vocab_major(const BlockStatsParams& p) {
  const int64_t n = p.cols, ld = p.ld;
  const bool smooth = p.label_smoothing > 0.0f;
  for (int64_t v = 0; v < n; ++v) transform_span(p.logits + v * ld, p.rows, p.logit_scale, p.softcap);
  float m[kLanes], d[kLanes], sz[kLanes];
  for (int64_t r0 = 0; r0 < p.rows; r0 += kLanes) {
    const int64_t nr = std::min<int64_t>(kLanes, p.rows - r0);
    const float* z = p.logits + r0;
#ifdef FUSEDOPS_CE_AVX512
    {
      static_assert(kLanes == 16, "one zmm of rows");
      const __mmask16 k = nr == 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << nr) - 1u);
      __m512 vm = _mm512_set1_ps(-std::numeric_limits<float>::max());
      // vmaxps returns its second operand, the running maximum, for a NaN: as v > m ? v : m.
      for (int64_t v = 0; v < n; ++v) vm = _mm512_mask_max_ps(vm, 0xFFFF, _mm512_maskz_loadu_ps(k, z + v * ld), vm);
      __m512 vd[4], vs[4];
      for (int j = 0; j < 4; ++j) vd[j] = vs[j] = _mm512_setzero_ps();
      for (int64_t v = 0; v < n; ++v) {
        const __m512 x = _mm512_maskz_loadu_ps(k, z + v * ld);
        vd[v & 3] = _mm512_add_ps(vd[v & 3], exp_nonpositive(_mm512_sub_ps(x, vm)));
        if (smooth) vs[v & 3] = _mm512_add_ps(vs[v & 3], x);
      }
      _mm512_storeu_ps(m, vm);
      _mm512_storeu_ps(d, _mm512_add_ps(_mm512_add_ps(vd[0], vd[1]), _mm512_add_ps(vd[2], vd[3])));
      _mm512_storeu_ps(sz, _mm512_add_ps(_mm512_add_ps(vs[0], vs[1]), _mm512_add_ps(vs[2], vs[3])));
    }
#else
    for (int64_t l = 0; l < nr; ++l) {
      float mx = -std::numeric_limits<float>::max();
      for (int64_t v = 0; v < n; ++v) {
        const float x = z[v * ld + l];
        mx = x > mx ? x : mx;
      }
      float pd[4] = {}, ps[4] = {};
      for (int64_t v = 0; v < n; ++v) {
        const float x = z[v * ld + l];
        pd[v & 3] += exp_nonpositive(x - mx);
        if (smooth) ps[v & 3] += x;
      }
      m[l] = mx;
      d[l] = (pd[0] + pd[1]) + (pd[2] + pd[3]);
      sz[l] = (ps[0] + ps[1]) + (ps[2] + ps[3]);
    }
#endif
    for (int64_t l = 0; l < nr; ++l) {
      const int64_t r = r0 + l, y = label_of(p.labels, p.labels_int64, r);
      BlockStat& st = p.out[r];
      if (y == p.ignore_index) {
        st = BlockStat{0.0f, 0.0f, 0.0f, 0.0f};
        continue;
      }
      st.m = m[l];
      st.d = d[l];
      st.sz = smooth ? sz[l] : 0.0f;
      st.zy = y >= p.v0 && y < p.v0 + n ? z[(y - p.v0) * ld + l] : 0.0f;
    }
  }
}

void finish_block_stats(const FinishBlockStatsParams& p) {
  const float eps = p.label_smoothing, lambda = p.lse_square_scale;
  const float inv_v = 1.0f / static_cast<float>(p.vocab);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t y = label_of(p.labels, p.labels_int64, r);
    if (y == p.ignore_index) {
      p.row_loss[r] = 0.0f;
      if (p.row_z) p.row_z[r] = 0.0f;
      continue;
    }
    float m = -std::numeric_limits<float>::max();
    for (int64_t b = 0; b < p.nblocks; ++b) {
      const float mb = p.stats[b * p.rows + r].m;
      m = mb > m ? mb : m;
    }
    float d = 0.0f, sz = 0.0f;
    for (int64_t b = 0; b < p.nblocks; ++b) {
      const BlockStat& st = p.stats[b * p.rows + r];
      d += st.d * exp_nonpositive(st.m - m);
      sz += st.sz;
    }
    const float zy = y >= 0 && y < p.vocab ? p.stats[(y / p.block_cols) * p.rows + r].zy
                                           : std::numeric_limits<float>::quiet_NaN();
    store_row_loss(m, std::log(d), zy, sz, eps, inv_v, lambda, p.row_loss + r,
                   p.row_z ? p.row_z + r : nullptr);
  }
}

void finalize(const FinalizeParams& p) {
  // Ignored rows have row_loss = row_z = 0 and row_scale = row_norm = 0, so they add 0; a row
  // with a NaN loss (an out-of-range label) stays NaN even with a weight of 0, as in the
  // reference.
  double loss = 0, z = 0;
  for (int64_t i = 0; i < p.rows; ++i) {
    const double li = static_cast<double>(p.row_scale[i]) * p.row_loss[i];
    const double zi = p.row_z ? static_cast<double>(p.row_norm[i]) * p.row_z[i] : 0.0;
    if (p.per_row) {
      store_any(p.loss, p.loss_dtype, i, li);
      if (p.z_loss) store_any(p.z_loss, p.z_loss_dtype, i, zi);
    } else {
      loss += li;
      z += zi;
    }
    if (p.grad_loss_weight)
      store_any(p.grad_loss_weight, p.grad_loss_weight_dtype, i,
                static_cast<double>(p.row_norm[i]) * p.row_loss[i]);
  }
  if (!p.per_row) {
    store_any(p.loss, p.loss_dtype, 0, loss);
    if (p.z_loss) store_any(p.z_loss, p.z_loss_dtype, 0, z);
  }
}

void scale_rows(const ScaleRowsParams& p) {
  // Scaling in place by 1 (the upstream gradient of a loss that is the last step) touches nothing:
  // return before the parallel region, whose start alone costs a thread wake-up.
  if (p.in == p.out && !p.per_row && p.g[0] == 1.0f) return;
  visit_float(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const bool in_place = p.in == p.out;
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(p.cols, 1));
    parallel_for(0, p.rows, grain, [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(std::is_same_v<T, float> ? 0 : p.cols);
      for (int64_t r = r0; r < r1; ++r) {
        const float f = p.g[p.per_row ? r : 0];
        const T* in = static_cast<const T*>(p.in) + r * p.cols;
        T* out = static_cast<T*>(p.out) + r * p.cols;
        if (in_place && f == 1.0f) continue;
        if constexpr (std::is_same_v<T, double>) {
          for (int64_t c = 0; c < p.cols; ++c) out[c] = in[c] * f;
        } else if constexpr (std::is_same_v<T, float>) {
          for (int64_t c = 0; c < p.cols; ++c) out[c] = in[c] * f;
        } else {
          load_float(in, buf.data(), p.cols);
          for (int64_t c = 0; c < p.cols; ++c) buf[c] *= f;
          store_span(buf.data(), out, p.cols);
        }
      }
    });
  });
}

void set_options(RowsParams& p, const CrossEntropyOptions& o) {
  p.ignore_index = o.ignore_index;
  p.logit_scale = static_cast<float>(o.logit_scale);
  p.softcap = o.logit_softcapping ? static_cast<float>(*o.logit_softcapping) : 0.0f;
  p.label_smoothing = static_cast<float>(o.label_smoothing);
  p.lse_square_scale = static_cast<float>(o.lse_square_scale);
}

void finalize_outputs(const RowBuffers& b, bool per_row, const TensorView& loss,
                      const TensorView& z_loss, const TensorView& grad_loss_weight) {
  FinalizeParams fp{};
  fp.row_scale = b.scale.data();
  fp.row_norm = b.norm.data();
  fp.row_loss = b.loss.data();
  fp.row_z = b.z.data();
  fp.rows = static_cast<int64_t>(b.loss.size());
  fp.per_row = per_row;
  fp.loss = loss.data();
  fp.loss_dtype = loss.dtype();
  fp.z_loss = z_loss.defined() ? z_loss.data() : nullptr;
  fp.z_loss_dtype = z_loss.defined() ? z_loss.dtype() : DType::kFloat32;
  fp.grad_loss_weight = grad_loss_weight.defined() ? grad_loss_weight.data() : nullptr;
  fp.grad_loss_weight_dtype = grad_loss_weight.defined() ? grad_loss_weight.dtype() : DType::kFloat32;
  finalize(fp);
}

void scale_loss_weight_grad(const TensorView& saved, const TensorView& out, const float* g,
                            bool per_row) {
  if (!saved.defined()) return;
  const float* in = saved.data_as<const float>();
  const int64_t n = saved.numel();
  visit_float(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data_as<T>();
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[per_row ? i : 0];
      if constexpr (std::is_same_v<T, double>)
        o[i] = static_cast<double>(gi) * in[i];
      else
        o[i] = from_float<T>(gi * in[i]);
    }
  });
}

}  // namespace fusedops::cpu::ce

namespace fusedops {
namespace {

constexpr const char* kOp = "fused_cross_entropy_loss";

bool supports_fwd(const CrossEntropyFwdArgs& a) {
  return a.loss.dtype() == DType::kFloat32 &&
         (!a.grad_loss_weight.defined() || a.grad_loss_weight.dtype() == DType::kFloat32);
}

bool supports_bwd(const CrossEntropyBwdArgs& a) {
  return a.grad_loss.dtype() == DType::kFloat32 &&
         (!a.saved_grad_loss_weight.defined() || a.saved_grad_loss_weight.dtype() == DType::kFloat32);
}

void fwd(const Context& ctx, const CrossEntropyFwdArgs& a) {
  const CrossEntropyOptions& o = a.options;
  const int64_t N = a.logits.rows(), V = a.logits.size(-1);
  const bool int64 = a.labels.dtype() == DType::kInt64;
  cpu::ce::RowBuffers rb(N);
  cpu::ce::ScaleParams sp{};
  sp.labels = a.labels.data();
  sp.labels_int64 = int64;
  sp.loss_weight = a.loss_weight.defined() ? a.loss_weight.data() : nullptr;
  sp.loss_weight_dtype = a.loss_weight.defined() ? a.loss_weight.dtype() : DType::kFloat32;
  sp.alpha_per_sample = nullptr;
  sp.rows_per_sample = 1;
  sp.alpha = 1.0;
  sp.rows = N;
  sp.ignore_index = o.ignore_index;
  sp.mean = o.reduction == LossReduction::kMean;
  sp.row_scale = rb.scale.data();
  sp.row_norm = rb.norm.data();
  cpu::ce::row_scales(sp);

  cpu::ce::RowsParams rp{};
  rp.logits = a.logits.data();
  rp.logits_dtype = a.logits.dtype();
  rp.logits_row_stride = a.logits.row_stride();
  rp.grad = a.grad_logits.defined() ? a.grad_logits.data() : nullptr;
  rp.grad_dtype = a.logits.dtype();
  rp.grad_row_stride = V;
  rp.labels = a.labels.data();
  rp.labels_int64 = int64;
  rp.row_scale = rb.scale.data();
  rp.row_loss = rb.loss.data();
  rp.row_z = rb.z.data();
  rp.rows = N;
  rp.vocab = V;
  cpu::ce::set_options(rp, o);
  cpu::ce::rows(rp);

  cpu::ce::finalize_outputs(rb, o.reduction == LossReduction::kNone, a.loss, a.z_loss,
                            a.grad_loss_weight);
}

void bwd(const Context&, const CrossEntropyBwdArgs& a) {
  const bool per_row = a.reduction == LossReduction::kNone;
  const float* g = a.grad_loss.data_as<const float>();
  if (a.saved_grad_logits.defined() && a.saved_grad_logits.numel() > 0) {
    cpu::ce::ScaleRowsParams p{};
    p.in = a.saved_grad_logits.data();
    p.out = a.grad_logits.data();
    p.dtype = a.saved_grad_logits.dtype();
    p.rows = a.saved_grad_logits.rows();
    p.cols = a.saved_grad_logits.size(-1);
    p.g = g;
    p.per_row = per_row;
    cpu::ce::scale_rows(p);
  }
  cpu::ce::scale_loss_weight_grad(a.saved_grad_loss_weight, a.grad_loss_weight, g, per_row);
}

}  // namespace

void register_fused_cross_entropy_loss_cpu(Registry& r) {
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  r.add<CrossEntropyFwdArgs>(kOp, Direction::kForward, spec, supports_fwd, fwd);
  r.add<CrossEntropyBwdArgs>(kOp, Direction::kBackward, spec, supports_bwd, bwd);
}

}  // namespace fusedops
