// Pieces shared by the rmsnorm_gated backends.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fusedops::rmsnorm_gated {

inline constexpr const char* kOp = "rmsnorm_gated";

// Upper bound on the per-block partial sums of dweight / dbias the CUDA backward writes (one
// [D] fp32 row per chunk of rows); the workspace holds this many rows for each.
inline constexpr int64_t kMaxPartials = 512;

inline int64_t max_partials(int64_t rows) {
  return std::min<int64_t>(kMaxPartials, std::max<int64_t>(rows, 1));
}

// Columns per group: group_size, or D when it is 0.
inline int64_t group_cols(int64_t D, int64_t group_size) { return group_size > 0 ? group_size : D; }

}  // namespace fusedops::rmsnorm_gated
