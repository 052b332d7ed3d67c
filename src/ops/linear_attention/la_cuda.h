// What the families' CUDA backends take from the shared sub-operators' CUDA files
// (linear_attention_{fwd,bwd}_sm80.cu, registered by register_linear_attention_cuda_sm80) beyond
// the registered entry points. Host declarations only.
#pragma once

#include <cstdint>

#include "fusedops/core/registry.h"
#include "fusedops/ops/linear_attention.h"

namespace fusedops::la::sm80 {

// The top levels' fused state-and-output kernel (cuda_sm80, 16-bit tensor cores): the state
// recurrence chunk_gated_delta_rule_fwd_h with a's gate (GDN: the scalar g; KDA: the per-channel
// gk with a.k = kg) and the family's output step in one kernel, one CTA per (sequence, value
// head). q is the output step's q (KDA: qg); aqk is KDA's Aqk (undefined for GDN: then
// o = scale [diag(e^g) q S + (M>= . Gamma . q k^T) Vnew], else o = scale qg S + (M>= . Aqk) Vnew);
// o_chunk the output step's chunk size. a.h and a.v_new are written when defined. Returns false
// without writing anything when the kernel does not take the arguments (K = V = 128, chunk 64,
// 16-bit rows, enough (sequence, value head) pairs to fill the GPU; FUSEDOPS_GDN_FUSED_HO forces
// the choice, test-only).
bool state_out_fused(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q,
                     const TensorView& aqk, const TensorView& o, int64_t o_chunk, double scale);

// The fused recurrent forward of both families (fused_recurrent_gated_delta_rule and
// fused_recurrent_kda, one kernel): kda selects KDA's per-key-channel gate g [B,T,HV,K] over GDN's
// scalar g [B,T,HV]. recurrent_fwd_supported is its supports(): no float64, K <= kRecMaxK (the
// state rows the kernel's largest CTA, eight warps, keeps in registers).
constexpr int64_t kRecMaxK = 256;
void recurrent_fwd(const Context& ctx, const LinearAttentionRecurrentFwdArgs& a, bool kda);
bool recurrent_fwd_supported(const LinearAttentionRecurrentFwdArgs& a);

// The backward half of the registration (linear_attention_bwd_sm80.cu).
void register_bwd(Registry& r);

}  // namespace fusedops::la::sm80

namespace fusedops::la::sm90 {

// The same fused step on Hopper's warpgroup products (cuda_sm90, linear_attention_sm90.cu; sm_90a
// builds only): same arguments and contract as sm80::state_out_fused, with a.h and a.v_new
// undefined for KDA's form, the gate rows 16-byte aligned fp32. Returns false without writing
// anything where it does not take the arguments; the caller then runs cuda_sm80's.
bool state_out_fused(const Context& ctx, const ChunkGatedDeltaRuleFwdHArgs& a, const TensorView& q,
                     const TensorView& aqk, const TensorView& o, int64_t o_chunk, double scale);

}  // namespace fusedops::la::sm90
