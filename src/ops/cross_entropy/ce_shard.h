// Helpers of the vocabulary-parallel cross-entropy backends (host code of ref, cpu and cuda).
#pragma once

#include <cstdint>

#include "fusedops/core/tensor.h"
#include "fusedops/ops/cross_entropy.h"

namespace fusedops::ce {

// The logit transform's parameters as the kernels take them: z = cap * tanh(scale x / cap) with
// soft-capping, else scale x.
struct Cap {
  float scale, cap;
  bool capped;
};

inline Cap cap_of(const CrossEntropyOptions& o) {
  return {static_cast<float>(o.logit_scale),
          o.logit_softcapping ? static_cast<float>(*o.logit_softcapping) : 1.0f, o.logit_softcapping.has_value()};
}

// Label i of an int32 / int64 labels tensor in host memory.
inline int64_t shard_label(const TensorView& labels, int64_t i) {
  return labels.dtype() == DType::kInt64 ? labels.data_as<const int64_t>()[i]
                                         : labels.data_as<const int32_t>()[i];
}

}  // namespace fusedops::ce
