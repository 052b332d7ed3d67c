// KDA CPU backend: the kernels of kda_kernels.h in fp32 (fp32/bf16/fp16 storage; float64
// anywhere goes to the reference). The top level forces "cpu" on every sub-operator it calls.
#include "fusedops/core/registry.h"
#include "src/ops/linear_attention/la_check.h"
#include "src/ops/kda/kda_kernels.h"
#include "src/ops/kda/kda_top.h"

namespace fusedops {
namespace {

using la::no_float64;

template <class Args, void (*F)(const Args&)>
void run(const Context&, const Args& a) {
  F(a);
}

void top_fwd(const Context& ctx, const ChunkKdaFwdArgs& a) {
  kda::compose_fwd(with_backend(ctx, "cpu"), a);
}
void top_bwd(const Context& ctx, const ChunkKdaBwdArgs& a) {
  kda::compose_bwd(with_backend(ctx, "cpu"), a);
}

bool sup_intra(const ChunkKdaFwdIntraArgs& a) {
  return no_float64({&a.q, &a.k, &a.beta, &a.Aqk, &a.Akk});
}
bool sup_wu(const KdaRecomputeWUFwdArgs& a) {
  return no_float64({&a.q, &a.k, &a.v, &a.beta, &a.Akk, &a.w, &a.u, &a.kg, &a.qg});
}
bool sup_o(const ChunkKdaFwdOArgs& a) { return no_float64({&a.qg, &a.Aqk, &a.v, &a.h, &a.o}); }
bool sup_dav(const ChunkKdaBwdDAvArgs& a) { return no_float64({&a.Aqk, &a.v, &a.dout, &a.dAqk, &a.dv}); }
bool sup_wy(const ChunkKdaBwdWyDqkgArgs& a) {
  return no_float64({&a.q, &a.k, &a.v, &a.v_new, &a.beta, &a.Akk, &a.h, &a.dh, &a.dout,
                     &a.dvn, &a.dq, &a.dk, &a.dv, &a.dbeta, &a.dg, &a.dAkk});
}
bool sup_bintra(const ChunkKdaBwdIntraArgs& a) {
  return no_float64({&a.q, &a.k, &a.beta, &a.dAqk, &a.dAkk, &a.dq, &a.dk, &a.dbeta, &a.dg,
                     &a.dq_out, &a.dk_out, &a.dbeta_out, &a.dg_out});
}
bool sup_gate(const KdaGateFwdArgs& a) { return no_float64({&a.g, &a.A_log, &a.dt_bias, &a.y}); }
bool sup_gate_bwd(const KdaGateBwdArgs& a) {
  return no_float64({&a.g, &a.A_log, &a.dt_bias, &a.dy, &a.dg, &a.dA_log, &a.ddt_bias});
}
bool sup_rec(const FusedRecurrentKdaFwdArgs& a) {
  return la::no_float64(a);
}
bool sup_rec_bwd(const FusedRecurrentKdaBwdArgs& a) {
  return la::no_float64(a);
}
bool sup_top(const ChunkKdaFwdArgs& a) {
  return la::no_float64_but_gate_cumsum(a, {&a.Aqk, &a.Akk});
}
bool sup_top_bwd(const ChunkKdaBwdArgs& a) {
  return la::no_float64_but_gate_cumsum(a, {&a.Aqk, &a.Akk});
}

}  // namespace

void register_kda_cpu(Registry& r) {
  using namespace kda;
  BackendSpec spec{"cpu", DeviceKind::kCPU, 0, INT_MAX,
                   {DType::kFloat32, DType::kBFloat16, DType::kFloat16}, kPriorityCpu};
  const auto F = Direction::kForward, B = Direction::kBackward;
  r.add<ChunkKdaFwdIntraArgs>("chunk_kda_fwd_intra", F, spec, sup_intra,
                              run<ChunkKdaFwdIntraArgs, fwd_intra<float>>);
  r.add<KdaRecomputeWUFwdArgs>("kda_recompute_w_u", F, spec, sup_wu,
                               run<KdaRecomputeWUFwdArgs, recompute_wu<float>>);
  r.add<ChunkKdaFwdOArgs>("chunk_kda_fwd_o", F, spec, sup_o, run<ChunkKdaFwdOArgs, fwd_o<float>>);
  r.add<ChunkKdaBwdDAvArgs>("chunk_kda_bwd_dAv", B, spec, sup_dav,
                            run<ChunkKdaBwdDAvArgs, bwd_dAv<float>>);
  r.add<ChunkKdaBwdWyDqkgArgs>("chunk_kda_bwd_wy_dqkg_fused", B, spec, sup_wy,
                               run<ChunkKdaBwdWyDqkgArgs, bwd_wy_dqkg<float>>);
  r.add<ChunkKdaBwdIntraArgs>("chunk_kda_bwd_intra", B, spec, sup_bintra,
                              run<ChunkKdaBwdIntraArgs, bwd_intra<float>>);
  r.add<KdaGateFwdArgs>("kda_gate", F, spec, sup_gate, run<KdaGateFwdArgs, gate_fwd<float>>);
  r.add<KdaGateBwdArgs>("kda_gate", B, spec, sup_gate_bwd, run<KdaGateBwdArgs, gate_bwd<float>>);
  r.add<FusedRecurrentKdaFwdArgs>("fused_recurrent_kda", F, spec, sup_rec,
                                  run<FusedRecurrentKdaFwdArgs, recurrent_fwd<float>>);
  r.add<FusedRecurrentKdaBwdArgs>("fused_recurrent_kda", B, spec, sup_rec_bwd,
                                  run<FusedRecurrentKdaBwdArgs, recurrent_bwd<float>>);
  r.add<ChunkKdaFwdArgs>("chunk_kda", F, spec, sup_top, top_fwd);
  r.add<ChunkKdaBwdArgs>("chunk_kda", B, spec, sup_top_bwd, top_bwd);
}

}  // namespace fusedops
