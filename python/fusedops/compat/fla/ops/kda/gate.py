"""``fla.ops.kda.gate``: the KDA per-channel decay gate."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from fusedops.ops import gated_delta_rule as _gdn
from fusedops.ops import kda as _kda

__all__ = ["fused_kda_gate", "kda_gate_fwd", "kda_gate_bwd", "kda_gate_chunk_cumsum"]


def _as4d(t: Tensor) -> Tensor:
    """``[..., H, K]`` as the ``[B, T, H, K]`` fusedops' gate takes (a view)."""
    return t if t.dim() == 4 else t.reshape(1, -1, *t.shape[-2:])


def fused_kda_gate(g: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                   lower_bound: Optional[float] = None,
                   output_dtype: torch.dtype = torch.float32) -> Tensor:
    """``-exp(A_log) softplus(g + dt_bias)`` over ``g [..., H, K]`` (``lower_bound *
    sigmoid(exp(A_log) (g + dt_bias))`` with ``lower_bound``); differentiable."""
    return _kda.fused_kda_gate(_as4d(g), A_log, dt_bias, lower_bound, output_dtype).reshape(g.shape)


def kda_gate_fwd(g: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                 lower_bound: Optional[float] = None,
                 output_dtype: torch.dtype = torch.float32) -> Tensor:
    """Launcher form of the gate forward."""
    return _kda.kda_gate_fwd(_as4d(g), A_log, dt_bias, lower_bound, output_dtype).reshape(g.shape)


def kda_gate_bwd(g: Tensor, A_log: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                 dyg: Optional[Tensor] = None, lower_bound: Optional[float] = None):
    """``(dg, dA_log or None, ddt_bias or None)`` in the dtypes of g, A_log and dt_bias."""
    dg, dA, db = _kda.kda_gate_bwd(_as4d(g), A_log, dt_bias, None if dyg is None else _as4d(dyg), lower_bound)
    return (dg.reshape(g.shape).to(g.dtype), None if dA is None else dA.to(A_log.dtype),
            None if db is None else db.to(dt_bias.dtype))


def kda_gate_chunk_cumsum(g: Tensor, A_log: Optional[Tensor], chunk_size: int, scale: float = None,
                          dt_bias: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                          output_dtype: Optional[torch.dtype] = torch.float,
                          chunk_indices: Optional[Tensor] = None,
                          lower_bound: Optional[float] = None, use_graph: bool = False,
                          **kwargs) -> Tensor:
    """The gate of ``g [B,T,H,K]``, then its chunk-local cumsum times ``scale``."""
    if g.dim() != 4:
        raise ValueError(f"fusedops.compat.fla: kda_gate_chunk_cumsum: g must be [B, T, H, K], "
                         f"got {list(g.shape)}")
    gate = _kda.kda_gate_fwd(g, A_log, dt_bias, lower_bound, None)
    return _gdn.chunk_local_cumsum(gate, chunk_size, scale=scale, cu_seqlens=cu_seqlens,
                                   output_dtype=output_dtype or g.dtype)
