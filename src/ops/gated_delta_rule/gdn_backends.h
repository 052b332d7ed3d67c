// Internal registration hooks and the top-level composition shared by the backends of the gated
// delta rule family.
#pragma once

#include "fusedops/core/registry.h"
#include "fusedops/ops/gated_delta_rule.h"
#include "src/ops/linear_attention/la_top.h"

namespace fusedops::gdn {

// The backward-direction halves of each backend (separate files past ~800 lines).
void register_ref_bwd(Registry& r);
void register_cpu_bwd(Registry& r);

// A backend's fused form of the forward steps F2-F4 (chunk_scaled_dot_kkt, solve_tril,
// recompute_w_u): given recompute_w_u's arguments with A as the output (solve_tril's, in its
// dtype) and the chunk size, it writes A, w and u and returns true, or returns false without
// writing anything when it does not take these arguments.
using FusedPrepareFwd = bool (*)(const Context& ctx, const RecomputeWUFwdArgs& args, int64_t chunk_size);

// A backend's fused form of the forward steps F5-F6 (chunk_gated_delta_rule_fwd_h, chunk_fwd_o):
// given both steps' arguments, where fwd_h's h and v_new may be undefined (then they are not
// written, and chunk_fwd_o's h and v are not read), it writes o (and ht, h, v_new when defined)
// and returns true, or returns false without writing anything when it does not take them.
using FusedStateOutFwd = la::FusedStateOut<ChunkFwdOArgs>;

// The top level composed of the sub-operator entry points (section 1.4 / 1.5) on the shared
// composition of la_top.h; every sub-operator
// call is dispatched with ctx (whose backend, when set, forces the sub-operators' backend). A
// backend's fused_prepare / fused_state_out, when given and taking the arguments, replace steps
// F2-F4 / F5-F6.
void compose_fwd(const Context& ctx, const ChunkGatedDeltaRuleFwdArgs& args, FusedPrepareFwd fused_prepare = nullptr,
                 FusedStateOutFwd fused_state_out = nullptr);
// A backend's kernels for the backward's state recurrences, given the sub-operator's arguments:
// B1 (recompute_w_u_fwd then chunk_gated_delta_rule_fwd_h: the hook runs both), and B2 + B3 (chunk_bwd_dv_local then
// chunk_gated_delta_rule_bwd_dhu: the hook gets dhu's arguments with dv undefined and computes the
// local dv itself). Each writes what its arguments name and returns true, or returns false
// without writing anything when it does not take them.
using StateFwdHook = la::StateFwdHook<RecomputeWUFwdArgs>;
using StateDhuHook = bool (*)(const Context& ctx, const ChunkGatedDeltaRuleBwdDhuArgs& args);
// And B4 (chunk_bwd_dqkwg) on a backend's own kernel: writes what the arguments name and returns
// true, or returns false without writing anything.
using DqkwgHook = bool (*)(const Context& ctx, const ChunkBwdDqkwgArgs& args);
void compose_bwd(const Context& ctx, const ChunkGatedDeltaRuleBwdArgs& args, StateFwdHook state_fwd = nullptr,
                 StateDhuHook state_dhu = nullptr, DqkwgHook dqkwg = nullptr);

namespace sm90 {
// cuda_sm90's chunk_bwd_dqkwg on wgmma (gated_delta_rule_bwd_dqkwg_sm90.cu), compose_bwd's dqkwg
// hook in its top-level backward.
bool dqkwg_wg(const Context& ctx, const ChunkBwdDqkwgArgs& a);
}  // namespace sm90

}  // namespace fusedops::gdn
