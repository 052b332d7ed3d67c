"""``fla.ops.gated_delta_rule.gate``: the GDN decay gate ``-exp(A_log) softplus(g + dt_bias)``:
the native functions, whose signatures are FLA 0.6.0's, and ``gdn_gate_chunk_cumsum``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn
from fusedops.ops.gated_delta_rule import fused_gdn_gate, gdn_gate_bwd, gdn_gate_fwd

__all__ = ["fused_gdn_gate", "gdn_gate_fwd", "gdn_gate_bwd", "gdn_gate_chunk_cumsum"]


def gdn_gate_chunk_cumsum(g: Tensor, A_log: Tensor, chunk_size: int, scale: float = None,
                          dt_bias: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                          chunk_indices: Optional[Tensor] = None,
                          output_dtype: Optional[torch.dtype] = torch.float) -> Tensor:
    """The gate, then its chunk-local cumsum times ``scale`` (FLA's pipelines pass
    ``scale=RCP_LN2`` for log2 units)."""
    gate = _gdn.gdn_gate_fwd(g, A_log, dt_bias, output_dtype=None)
    return _gdn.chunk_local_cumsum(gate, chunk_size, scale=scale, cu_seqlens=cu_seqlens,
                                   output_dtype=output_dtype or g.dtype, chunk_indices=chunk_indices)
