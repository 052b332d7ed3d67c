// Helpers for the float64 reference backends: read and write rows of any floating dtype as
// double, with the row stride of a [..., D] view.
#pragma once

#include <cstdint>
#include <vector>

#include "fusedops/core/tensor.h"
#include "src/core/visit.h"

namespace fusedops::ref {

inline double to_double(float v) { return v; }
inline double to_double(double v) { return v; }
inline double to_double(bf16_t v) { return to_float(v); }
inline double to_double(fp16_t v) { return to_float(v); }

template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(v);
  } else {
    // Rounds double -> float -> 16 bits; the double rounding can differ from a direct rounding
    // only in the last bit of a tie, far below any test tolerance.
    return from_float<T>(static_cast<float>(v));
  }
}

// Element i of a contiguous tensor (or the flat index of a rows-addressable one when
// row_stride is given) as double.
inline double load(const TensorView& t, int64_t offset) {
  return visit_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return to_double(t.data_as<const T>()[offset]);
  });
}

inline void store(const TensorView& t, int64_t offset, double v) {
  visit_float(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    t.data_as<T>()[offset] = from_double<T>(v);
  });
}

// Row r of a rows-addressable [..., D] tensor as doubles.
inline std::vector<double> load_row(const TensorView& t, int64_t r) {
  const int64_t D = t.size(-1), stride = t.row_stride();
  std::vector<double> out(D);
  for (int64_t d = 0; d < D; ++d) out[d] = load(t, r * stride + d);
  return out;
}

inline void store_row(const TensorView& t, int64_t r, const std::vector<double>& v) {
  const int64_t stride = t.row_stride();
  for (size_t d = 0; d < v.size(); ++d) store(t, r * stride + static_cast<int64_t>(d), v[d]);
}

}  // namespace fusedops::ref
