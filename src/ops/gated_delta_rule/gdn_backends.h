// Internal registration hooks and the top-level composition shared by the backends of the gated
// delta rule family.
#pragma once

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"

namespace fusedops::gdn {

// The backward-direction halves of each backend (separate files past ~800 lines).
void register_ref_bwd(Registry& r);
void register_cpu_bwd(Registry& r);

// The top level composed of the sub-operator entry points (section 1.4 / 1.5); every sub-operator
// call is dispatched with ctx (whose backend, when set, forces the sub-operators' backend).
void compose_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& args);
void compose_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& args);

}  // namespace fusedops::gdn
