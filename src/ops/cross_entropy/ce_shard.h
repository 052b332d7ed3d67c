// Host-side helpers of the vocabulary-parallel cross-entropy backends (ref and cpu).
#pragma once

#include <cstdint>

#include "fusedops/core/tensor.h"

namespace fusedops::ce {

// Label i of an int32 / int64 labels tensor in host memory.
inline int64_t shard_label(const TensorView& labels, int64_t i) {
  return labels.dtype() == DType::kInt64 ? labels.data_as<const int64_t>()[i]
                                         : labels.data_as<const int32_t>()[i];
}

}  // namespace fusedops::ce
