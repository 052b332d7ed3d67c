// Gated delta rule, CUDA backend cuda_sm90 (sm_90a only): the top level. Forward: cuda_sm80's
// composition with its state recurrence and output on Hopper's warpgroup products (the shared
// fused kernel of linear_attention_sm90.cu, cuda_sm80's fused kernel where that one does not
// apply). Backward: gated_delta_rule_bwd_sm90.cu. The sub-operator entry points stay cuda_sm80's.
#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/gated_delta_rule/gdn_backends.h"
#include "src/ops/gated_delta_rule/gdn_cuda.cuh"
#include "src/ops/linear_attention/la_cuda.h"

namespace fusedops::gdn::sm90 {

// The top-level backward (gated_delta_rule_bwd_sm90.cu).
void top_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& a);

namespace {

// compose_fwd's fused state-and-output hook: the wgmma kernel where it applies, else cuda_sm80's.
bool state_out(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const ChunkFwdOArgs& b) {
  return la::sm90::state_out_fused(ctx, a, b.q, TensorView(), b.o, b.chunk_size, b.scale) ||
         la::sm80::state_out_fused(ctx, a, b.q, TensorView(), b.o, b.chunk_size, b.scale);
}

void top_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& a) {
  // The sub-operators are cuda_sm80's.
  compose_fwd(with_backend(ctx, "cuda_sm80"), a, sm80::prepare_fused_fwd, state_out);
}

bool sup_fwd(const ChunkGatedDeltaRuleFwdArgs& a) { return sm80::top_fwd_supported(a); }
bool sup_bwd(const ChunkGatedDeltaRuleBwdArgs& a) { return sm80::top_bwd_supported(a); }

}  // namespace
}  // namespace fusedops::gdn::sm90

namespace fusedops {

// The top level only, both directions (the backward's state recurrences on wgmma, its other steps
// cuda_sm80's).
void register_gated_delta_rule_cuda_sm90(Registry& r) {
  const BackendSpec s{"cuda_sm90", DeviceKind::kCUDA, 90, 90,
                      {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm90};
  r.add<ChunkGatedDeltaRuleFwdArgs>("chunk_gated_delta_rule", Direction::kForward, s, gdn::sm90::sup_fwd,
                                    gdn::sm90::top_fwd);
  r.add<ChunkGatedDeltaRuleBwdArgs>("chunk_gated_delta_rule", Direction::kBackward, s, gdn::sm90::sup_bwd,
                                    gdn::sm90::top_bwd);
}

}  // namespace fusedops
