// The backend-neutral composition of chunk_kda from its sub-operator entry points (section 9.4 /
// 9.5) on the shared composition of la_top.h; every sub-operator call is dispatched with ctx,
// whose backend, when set, forces theirs.
#pragma once

#include "fusedops/core/context.h"
#include "fusedops/ops/kda.h"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops::kda {

// A backend's fused form of the forward's state recurrence and output (chunk_gated_delta_rule_fwd_h
// in its gk form, then chunk_kda_fwd_o): given both steps' arguments, with fwd_h's h and v_new
// undefined (the forward keeps neither), it writes o (and the final state) and returns true, or
// returns false without writing anything when it does not take them.
using FusedStateOutFwd = la::FusedStateOut<ChunkKdaFwdOArgs>;

// A backend's fused form of the forward's chunk-local gate cumsum and intra-chunk step
// (chunk_local_cumsum from g into g_cumsum, then chunk_kda_fwd_intra reading g_cumsum): it writes
// the cumsum's out and intra's outputs, the same values as the two steps, and returns true, or
// returns false without writing anything when it does not take them.
using FusedCumsumIntraFwd = bool (*)(const Context& ctx, const ChunkLocalCumsumArgs& cumsum_args,
                                     const ChunkKdaFwdIntraArgs& intra_args);
// The same with kda_recompute_w_u (wu_args, reading intra's Akk and the cumsum's out) behind: all
// three steps' outputs written and true, or nothing written and false.
using FusedCumsumIntraWUFwd = bool (*)(const Context& ctx, const ChunkLocalCumsumArgs& cumsum_args,
                                       const ChunkKdaFwdIntraArgs& intra_args, const KdaRecomputeWUFwdArgs& wu_args);
// The backward's counterpart: chunk_kda_bwd_intra, then the reverse chunk-local cumsum of its
// dg_out into cumsum_args.out. Written: intra's outputs but dg_out, and cumsum_args.out (dg_out,
// a workspace, may be left unwritten).
using FusedIntraCumsumBwd = bool (*)(const Context& ctx, const ChunkKdaBwdIntraArgs& intra_args,
                                     const ChunkLocalCumsumArgs& cumsum_args);

struct FwdFusions {
  FusedStateOutFwd state_out = nullptr;
  FusedCumsumIntraFwd cumsum_intra = nullptr;
  FusedCumsumIntraWUFwd cumsum_intra_wu = nullptr;
};

void compose_fwd(const Context& ctx, const ChunkKdaFwdArgs& args, FwdFusions fusions = {});
void compose_bwd(const Context& ctx, const ChunkKdaBwdArgs& args, FusedIntraCumsumBwd intra_cumsum = nullptr);

}  // namespace fusedops::kda
