// Explicit registration of every backend (docs/design.md section 4).
#pragma once

#include "fusedops/core/registry.h"

namespace fusedops {

void register_all_backends(Registry& registry);

// One function per (op, backend); defined in src/ops/<family>/<family>_<backend>.{cpp,cu}.
void register_rmsnorm_without_weight_ref(Registry& r);
void register_rmsnorm_without_weight_cpu(Registry& r);
void register_rmsnorm_without_weight_cuda_sm80(Registry& r);
void register_l2norm_ref(Registry& r);
void register_l2norm_cpu(Registry& r);
void register_l2norm_cuda_sm80(Registry& r);
void register_causal_conv1d_ref(Registry& r);
void register_causal_conv1d_cpu(Registry& r);
void register_causal_conv1d_cuda_sm80(Registry& r);
void register_sort_chunks_by_idx_ref(Registry& r);
void register_sort_chunks_by_idx_cpu(Registry& r);
void register_sort_chunks_by_idx_cuda_sm80(Registry& r);
void register_matmul_add_ref(Registry& r);
void register_matmul_add_cpu(Registry& r);
void register_matmul_add_cuda_sm80(Registry& r);
void register_linear_attention_ref(Registry& r);
void register_linear_attention_cpu(Registry& r);
void register_linear_attention_cuda_sm80(Registry& r);
void register_gated_delta_rule_ref(Registry& r);
void register_gated_delta_rule_cpu(Registry& r);
void register_gated_delta_rule_cuda_sm80(Registry& r);
void register_gated_delta_rule_cuda_sm90(Registry& r);
void register_kda_cuda_sm90(Registry& r);
void register_linear_attention_cuda_sm90(Registry& r);
void register_clipped_swiglu_ref(Registry& r);
void register_clipped_swiglu_cpu(Registry& r);
void register_clipped_swiglu_cuda_sm80(Registry& r);

void register_fused_cross_entropy_loss_ref(Registry& r);
void register_fused_cross_entropy_loss_cpu(Registry& r);
void register_fused_cross_entropy_loss_cuda_sm80(Registry& r);
void register_chunk_loss_ref(Registry& r);
void register_chunk_loss_cpu(Registry& r);
void register_chunk_loss_cuda_sm80(Registry& r);
void register_rmsnorm_gated_ref(Registry& r);
void register_rmsnorm_gated_cpu(Registry& r);
void register_rmsnorm_gated_cuda_sm80(Registry& r);
void register_sinkhorn_ref(Registry& r);
void register_sinkhorn_cpu(Registry& r);
void register_sinkhorn_cuda_sm80(Registry& r);
void register_mhc_ref(Registry& r);
void register_mhc_cpu(Registry& r);
void register_mhc_cuda_sm80(Registry& r);
void register_kda_ref(Registry& r);
void register_kda_cpu(Registry& r);
void register_kda_cuda_sm80(Registry& r);
void register_context_parallel_ref(Registry& r);
void register_context_parallel_cpu(Registry& r);
void register_context_parallel_cuda_sm80(Registry& r);
void register_cross_entropy_shard_ref(Registry& r);
void register_cross_entropy_shard_cpu(Registry& r);
void register_cross_entropy_shard_cuda_sm80(Registry& r);

}  // namespace fusedops
