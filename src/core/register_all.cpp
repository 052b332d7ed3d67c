#include "src/core/register_all.h"

namespace fusedops {

void register_all_backends(Registry& r) {
  register_rmsnorm_without_weight_ref(r);
  register_rmsnorm_without_weight_cpu(r);
  register_l2norm_ref(r);
  register_l2norm_cpu(r);
  register_causal_conv1d_ref(r);
  register_causal_conv1d_cpu(r);
  register_sort_chunks_by_idx_ref(r);
  register_sort_chunks_by_idx_cpu(r);
  register_matmul_add_ref(r);
  register_matmul_add_cpu(r);
  register_linear_attention_ref(r);
  register_linear_attention_cpu(r);
  register_gated_delta_rule_ref(r);
  register_gated_delta_rule_cpu(r);
  register_clipped_swiglu_ref(r);
  register_clipped_swiglu_cpu(r);
  register_fused_cross_entropy_loss_ref(r);
  register_fused_cross_entropy_loss_cpu(r);
  register_chunk_loss_ref(r);
  register_chunk_loss_cpu(r);
  register_rmsnorm_gated_ref(r);
  register_rmsnorm_gated_cpu(r);
  register_sinkhorn_ref(r);
  register_sinkhorn_cpu(r);
  register_mhc_ref(r);
  register_mhc_cpu(r);
  register_kda_ref(r);
  register_kda_cpu(r);
  register_context_parallel_ref(r);
  register_context_parallel_cpu(r);
  register_cross_entropy_shard_ref(r);
  register_cross_entropy_shard_cpu(r);
#ifdef FUSEDOPS_WITH_CUDA
  register_rmsnorm_without_weight_cuda_sm80(r);
  register_l2norm_cuda_sm80(r);
  register_causal_conv1d_cuda_sm80(r);
  register_sort_chunks_by_idx_cuda_sm80(r);
  register_matmul_add_cuda_sm80(r);
  register_clipped_swiglu_cuda_sm80(r);
  register_fused_cross_entropy_loss_cuda_sm80(r);
  register_chunk_loss_cuda_sm80(r);
  register_rmsnorm_gated_cuda_sm80(r);
  register_sinkhorn_cuda_sm80(r);
  register_mhc_cuda_sm80(r);
  register_linear_attention_cuda_sm80(r);
  register_gated_delta_rule_cuda_sm80(r);
  register_kda_cuda_sm80(r);
  register_context_parallel_cuda_sm80(r);
  register_cross_entropy_shard_cuda_sm80(r);
#endif
#ifdef FUSEDOPS_WITH_SM90
  register_gated_delta_rule_cuda_sm90(r);
  register_kda_cuda_sm90(r);
  register_linear_attention_cuda_sm90(r);
#endif
}

}  // namespace fusedops
