// The backend-neutral composition of chunk_kda from its sub-operator entry points (section 9.4 /
// 9.5); every sub-operator call is dispatched with ctx, whose backend, when set, forces theirs.
#pragma once

#include "fusedops/core/context.h"
#include "fusedops/ops/kda.h"

namespace fusedops::kda {

void compose_fwd(const Context& ctx, const ChunkKdaFwdArgs& args);
void compose_bwd(const Context& ctx, const ChunkKdaBwdArgs& args);

}  // namespace fusedops::kda
