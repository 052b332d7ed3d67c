// Turns a runtime DType into a compile-time storage type for CPU code:
//   visit_float(dtype, [&](auto tag) { using T = decltype(tag); ... });
#pragma once

#include "fusedops/core/dtype.h"
#include "fusedops/core/error.h"
#include "src/core/half.h"

namespace fusedops {

template <class Fn>
decltype(auto) visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kBFloat16: return fn(bf16_t{});
    case DType::kFloat16: return fn(fp16_t{});
    case DType::kFloat64: return fn(double{});
    default: break;
  }
  FUSEDOPS_FAIL(kType, "", "expected a floating dtype, got ", dtype_name(dtype));
}

}  // namespace fusedops
