"""``mindspeed_ops.api.triton.chunk_loss``: the LM head and cross-entropy in chunks of tokens
(MindSpeed-MM's ChunkLoss with the fused cross-entropy): :func:`fusedops.chunk_loss`."""

from fusedops.ops.chunk_loss import chunk_loss

__all__ = ["chunk_loss"]
