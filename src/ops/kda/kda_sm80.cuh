// Private pieces of the KDA CUDA backend (cuda_sm80) shared by kda_sm80.cu (forward, registration)
// and kda_bwd_sm80.cu (backward).
#pragma once

#include "fusedops/core/registry.h"

namespace fusedops::kda::sm80 {

constexpr int kRecRows = 32;            // state rows per thread of the recurrent kernels
constexpr int kRecK = 8 * kRecRows;     // K <= 256 for the recurrent kernels

// Registers the backward-direction kernels of kda_bwd_sm80.cu.
void register_bwd(Registry& r);

}  // namespace fusedops::kda::sm80
