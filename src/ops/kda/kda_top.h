// The backend-neutral composition of chunk_kda from its sub-operator entry points (section 9.4 /
// 9.5); every sub-operator call is dispatched with ctx, whose backend, when set, forces theirs.
#pragma once

#include "fusedops/core/context.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "fusedops/ops/kda.h"

namespace fusedops::kda {

// A backend's fused form of the forward's state recurrence and output (chunk_gated_delta_rule_fwd_h
// in its gk form, then chunk_kda_fwd_o): given both steps' arguments, with fwd_h's h and v_new
// undefined (the forward keeps neither), it writes o (and the final state) and returns true, or
// returns false without writing anything when it does not take them.
using FusedStateOutFwd = bool (*)(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& h_args,
                                  const ChunkKdaFwdOArgs& o_args);

void compose_fwd(const Context& ctx, const ChunkKdaFwdArgs& args, FusedStateOutFwd fused_state_out = nullptr);
void compose_bwd(const Context& ctx, const ChunkKdaBwdArgs& args);

}  // namespace fusedops::kda
