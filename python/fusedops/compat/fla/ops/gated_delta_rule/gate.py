"""``fla.ops.gated_delta_rule.gate``: the GDN decay gate ``-exp(A_log) softplus(g + dt_bias)``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn

__all__ = ["fused_gdn_gate", "gdn_gate_fwd", "gdn_gate_bwd", "gdn_gate_chunk_cumsum"]


def fused_gdn_gate(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor] = None,
                   output_dtype: torch.dtype = torch.float32) -> Tensor:
    """The gate over the last dimension HV, differentiable in g, A_log and dt_bias."""
    return _gdn.fused_gdn_gate(g, A_log, dt_bias).to(output_dtype)


def gdn_gate_fwd(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor] = None,
                 output_dtype: torch.dtype = torch.float32) -> Tensor:
    """Launcher form of the gate forward."""
    return _gdn.gdn_gate_fwd(g, A_log, dt_bias).to(output_dtype)


def gdn_gate_bwd(g: Tensor, A_log: Tensor, dt_bias: Optional[Tensor], dyg: Tensor):
    """``(dg, dA_log, ddt_bias or None)`` in the dtypes of g, A_log and dt_bias."""
    dg, dA, db = _gdn.gdn_gate_bwd(g, A_log, dt_bias, dyg)
    return dg.to(g.dtype), dA.to(A_log.dtype), (db.to(dt_bias.dtype) if db is not None else None)


def gdn_gate_chunk_cumsum(g: Tensor, A_log: Tensor, chunk_size: int, scale: float = None,
                          dt_bias: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                          chunk_indices: Optional[Tensor] = None,
                          output_dtype: Optional[torch.dtype] = torch.float) -> Tensor:
    """The gate, then its chunk-local cumsum times ``scale`` (FLA's pipelines pass
    ``scale=RCP_LN2`` for log2 units)."""
    gate = _gdn.gdn_gate_fwd(g, A_log, dt_bias)
    return _gdn.chunk_local_cumsum(gate, chunk_size, scale=scale, cu_seqlens=cu_seqlens,
                                   output_dtype=output_dtype or g.dtype)
