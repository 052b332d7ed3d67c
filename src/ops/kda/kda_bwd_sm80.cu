// KDA (Kimi delta attention), CUDA backend cuda_sm80: the backward-direction chunk operators and
// fused_recurrent_kda backward (see kda_sm80.cu for the conventions).
#include "fusedops/core/registry.h"
#include "fusedops/ops/kda.h"
#include "src/cuda/check.cuh"
#include "src/ops/gated_delta_rule/gdn_sm80.cuh"
#include "src/ops/kda/kda_sm80.cuh"
#include "src/ops/kda/kda_top.h"

namespace fusedops::kda::sm80 {

void register_bwd(Registry&) {}

}  // namespace fusedops::kda::sm80
