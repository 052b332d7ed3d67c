"""fusedops.distributed: context parallelism (CP) for the linear-attention operators and the
short convolution, and vocabulary parallelism (TP) for the fused losses, over torch.distributed
(NCCL on GPUs, gloo on CPUs). See docs/distributed.md.

* ``plan = context_parallel(cu_seqlens, group, split=None, conv_width=W)``: once per packed batch;
  then ``chunk_gated_delta_rule(..., cp=plan)``, ``chunk_kda(..., cp=plan)`` and
  ``causal_conv1d(..., cp=plan)`` on this rank's tokens give exactly the single-process results
  for them (and their gradients).
* ``fused_cross_entropy_loss(logits_shard, labels, ..., process_group=tp, vocab_start=...)`` and
  ``chunk_loss(hidden, weight_shard, labels, ..., process_group=tp)``: the loss over a vocabulary
  sharded along V, the same on every rank.
"""

from ._plan import ContextParallel, HaloPiece, context_parallel

__all__ = ["ContextParallel", "HaloPiece", "context_parallel"]
