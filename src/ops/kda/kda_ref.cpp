// KDA reference backend: the kernels of kda_kernels.h in float64 (any storage dtype). The top
// level forces "ref" on every sub-operator it calls.
#include "fusedops/core/registry.h"
#include "src/ops/kda/kda_kernels.h"
#include "src/ops/kda/kda_top.h"

namespace fusedops {
namespace {

template <class Args, void (*F)(const Args&)>
void run(const Context&, const Args& a) {
  F(a);
}

void top_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  kda::compose_fwd(with_backend(ctx, "ref"), a);
}
void top_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  kda::compose_bwd(with_backend(ctx, "ref"), a);
}

}  // namespace

void register_kda_ref(Registry& r) {
  using namespace kda;
  BackendSpec spec{"ref", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64},
                   kPriorityRef};
  const auto F = Direction::kForward, B = Direction::kBackward;
  r.add<ChunkKdaFwdIntraArgs>("chunk_kda_fwd_intra", F, spec, nullptr,
                              run<ChunkKdaFwdIntraArgs, fwd_intra<double>>);
  r.add<KdaRecomputeWUFwdArgs>("kda_recompute_w_u", F, spec, nullptr,
                               run<KdaRecomputeWUFwdArgs, recompute_wu<double>>);
  r.add<ChunkKdaFwdOArgs>("chunk_kda_fwd_o", F, spec, nullptr, run<ChunkKdaFwdOArgs, fwd_o<double>>);
  r.add<ChunkKdaBwdDAvArgs>("chunk_kda_bwd_dAv", B, spec, nullptr,
                            run<ChunkKdaBwdDAvArgs, bwd_dAv<double>>);
  r.add<ChunkKdaBwdWyDqkgArgs>("chunk_kda_bwd_wy_dqkg_fused", B, spec, nullptr,
                               run<ChunkKdaBwdWyDqkgArgs, bwd_wy_dqkg<double>>);
  r.add<ChunkKdaBwdIntraArgs>("chunk_kda_bwd_intra", B, spec, nullptr,
                              run<ChunkKdaBwdIntraArgs, bwd_intra<double>>);
  r.add<KdaGateFwdArgs>("kda_gate", F, spec, nullptr, run<KdaGateFwdArgs, gate_fwd<double>>);
  r.add<KdaGateBwdArgs>("kda_gate", B, spec, nullptr, run<KdaGateBwdArgs, gate_bwd<double>>);
  r.add<FusedRecurrentKdaFwdArgs>("fused_recurrent_kda", F, spec, nullptr,
                                  run<FusedRecurrentKdaFwdArgs, recurrent_fwd<double>>);
  r.add<FusedRecurrentKdaBwdArgs>("fused_recurrent_kda", B, spec, nullptr,
                                  run<FusedRecurrentKdaBwdArgs, recurrent_bwd<double>>);
  r.add<ChunkKdaFwdArgs>("chunk_kda", F, spec, nullptr, top_fwd);
  r.add<ChunkKdaBwdArgs>("chunk_kda", B, spec, nullptr, top_bwd);
}

}  // namespace fusedops
