// The GDN CUDA kernels' view of the shared tile layer (src/ops/linear_attention/la_sm80.cuh,
// la_tc_sm80.cuh: written in its vocabulary, so its names are visible unqualified in gdn::sm80),
// and the declarations the GDN backend files take from each other.
#pragma once

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/linear_attention/la_sm80.cuh"
#include "src/ops/linear_attention/la_tc_sm80.cuh"

namespace fusedops::gdn::sm80 {

using namespace la::sm80;

// What the cuda_sm90 top level (gated_delta_rule_fwd_sm90.cu) takes from this backend: the fused
// prepare step (compose_fwd's hook) and the supports() predicates of both directions.
bool prepare_fused_fwd(const Context& ctx, const RecomputeWUFwdArgs& a, int64_t chunk_size);
bool top_fwd_supported(const ChunkGatedDeltaRuleFwdArgs& a);
bool top_bwd_supported(const ChunkGatedDeltaRuleBwdArgs& a);

}  // namespace fusedops::gdn::sm80

namespace fusedops::gdn {
// The backward half of the CUDA backend (gated_delta_rule_bwd_sm80.cu).
void register_cuda_sm80_bwd(Registry& r);
}  // namespace fusedops::gdn
