// KDA, CUDA backend cuda_sm90 (sm_90a only): the top-level forward of cuda_sm80 with its state
// recurrence and output (chunk_gated_delta_rule_fwd_h in the gk form, then chunk_kda_fwd_o) on
// Hopper's warpgroup products: the shared fused kernel fwd_ho_wg_kernel in its KDA form
// (src/ops/linear_attention/linear_attention_sm90.cu). Where that kernel does not take the call (shapes, dtypes, too
// few (sequence, head) pairs), cuda_sm80's fused kernel runs. Every other step, the sub-operator
// entry points and the backward stay cuda_sm80's (the backward is registered under this name too,
// so that a caller who names the backend gets both directions).
#include "fusedops/core/registry.h"
#include "fusedops/ops/kda.h"
#include "src/ops/linear_attention/la_cuda.h"
#include "src/ops/kda/kda_sm80.cuh"
#include "src/ops/kda/kda_top.h"

namespace fusedops::kda::sm90 {
namespace {

bool state_out(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& h, const ChunkKdaFwdOArgs& o) {
  if (o.Aqk.defined() && la::sm90::state_out_fused(ctx, h, o.qg, o.Aqk, o.o, o.Aqk.size(3), o.scale)) return true;
  return sm80::fwd_fusions().state_out(ctx, h, o);
}

void top_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  FwdFusions f = sm80::fwd_fusions();
  f.state_out = state_out;
  compose_fwd(with_backend(ctx, "cuda_sm80"), a, f);  // the sub-operators are cuda_sm80's
}

}  // namespace
}  // namespace fusedops::kda::sm90

namespace fusedops {

// The top level, both directions (the backward is cuda_sm80's).
void register_kda_cuda_sm90(Registry& r) {
  const BackendSpec s{"cuda_sm90", DeviceKind::kCUDA, 90, 90,
                      {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCudaSm90};
  r.add<ChunkKdaFwdArgs>("chunk_kda", Direction::kForward, s, kda::sm80::top_fwd_supported, kda::sm90::top_fwd);
  r.add<ChunkKdaBwdArgs>("chunk_kda", Direction::kBackward, s, kda::sm80::top_bwd_supported,
                         kda::sm80::top_bwd_entry);
}

}  // namespace fusedops
