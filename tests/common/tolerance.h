// The precision policy of docs/design.md section 6, shared by every C++ test.
//
//   pass  <=>  err(ours, ref64) <= 2 * err(base, ref64) + floor(dtype) * max(1, max|ref64|)
//
// err is the max-abs error; `base` is the plain composite computed in the input dtype (for C++
// tests: the same formula with every intermediate rounded to the dtype, as PyTorch eager does);
// floor(dtype) is two units in the last place at 1.0 (64 for float64: summation order only). NaN or Inf where the reference is finite
// always fails. The RMS-relative error ||a-b||/||b|| is reported alongside.
#pragma once

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "fusedops/core/dtype.h"
#include "src/core/half.h"

namespace fusedops::testing {

inline double floor_for(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return 64 * 2.220446049250313e-16;  // summation order only
    case DType::kFloat32: return 2 * 1.1920928955078125e-07;
    case DType::kFloat16: return 2 * 9.765625e-04;
    case DType::kBFloat16: return 2 * 7.8125e-03;
    default: return 0;
  }
}

// Rounds v to the nearest value representable in dtype (round to nearest even).
inline double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kBFloat16: return to_float(float_to_bf16(static_cast<float>(v)));
    case DType::kFloat16: return to_float(float_to_fp16(static_cast<float>(v)));
    default: return v;
  }
}

inline double max_abs_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    e = std::max(e, std::abs(a[i] - ref[i]));
  }
  return e;
}

inline double rms_relative_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Verdict {
  bool pass = false;
  double err = 0, base_err = 0, tol = 0, rms_rel = 0;
  std::string describe() const {
    std::ostringstream os;
    os << "max-abs err " << err << " vs tolerance " << tol << " (base err " << base_err
       << "), rms-rel " << rms_rel;
    return os.str();
  }
};

inline Verdict check_close(const std::vector<double>& ours, const std::vector<double>& base,
                           const std::vector<double>& ref, DType dtype) {
  Verdict v;
  if (ours.size() != ref.size() || base.size() != ref.size()) return v;
  double ref_max = 1;
  for (double r : ref) ref_max = std::max(ref_max, std::abs(r));
  v.err = max_abs_error(ours, ref);
  v.base_err = max_abs_error(base, ref);
  if (!std::isfinite(v.base_err)) v.base_err = 0;  // a base that overflows earns no slack
  v.tol = 2 * v.base_err + floor_for(dtype) * ref_max;
  v.rms_rel = rms_relative_error(ours, ref);
  v.pass = v.err <= v.tol;
  return v;
}

}  // namespace fusedops::testing
